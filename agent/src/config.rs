//! The agent's configuration: flags, `KSTALL_*` environment variables and an optional TOML file
//! (flags and env win over the file), validated in one place before anything touches the kernel.
//! A bad value is one line naming the field; the caller exits 64.

use std::{net::SocketAddr, path::PathBuf, time::Duration};

use serde::Deserialize;

use crate::{attribution::flags::PodMetadata, kubelet, probes, setting};

pub const DEFAULT_LISTEN: &str = "127.0.0.1:9700";
pub const DEFAULT_API_SOCKET: &str = "/run/kstall/kstall.sock";
pub const DEFAULT_STATE_DIR: &str = "/var/lib/kstall";

/// Every setting, declared once: its flag, its `KSTALL_*` variable and its key in the file (the
/// flag's name in snake_case, in its native TOML type).
#[derive(Debug, Default, clap::Args, serde::Serialize, Deserialize)]
#[serde(default)]
pub struct AgentArgs {
    /// TOML file with any of the settings below (snake_case keys); flags and env win over it.
    #[arg(long, env = "KSTALL_CONFIG", value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Address for /metrics and /healthz [default: 127.0.0.1:9700].
    #[arg(long, env = "KSTALL_LISTEN", value_name = "ADDR")]
    pub listen: Option<String>,
    /// The exporter toolkit's web configuration for /metrics (node_exporter's --web.config.file
    /// YAML): TLS certificate and key, client CA, basic-auth users with bcrypt hashes.
    #[arg(long, env = "KSTALL_WEB_CONFIG_FILE", value_name = "FILE")]
    pub web_config_file: Option<PathBuf>,
    /// Unix socket of the agent's API (`kstall status`) [default: /run/kstall/kstall.sock].
    #[arg(long, env = "KSTALL_API_SOCKET", value_name = "PATH")]
    pub api_socket: Option<PathBuf>,
    /// Directory where the incident history is kept across restarts, or `none` to keep it in
    /// memory only [default: /var/lib/kstall].
    #[arg(long, env = "KSTALL_STATE_DIR", value_name = "DIR")]
    pub state_dir: Option<PathBuf>,
    #[command(flatten)]
    #[serde(flatten)]
    pub probes: probes::flags::Flags,
    /// Log format: auto (text on a terminal, JSON otherwise), text or json [default: auto].
    #[arg(long, env = "KSTALL_LOG_FORMAT", value_name = "FORMAT")]
    pub log_format: Option<String>,
    /// Log filter in tracing's env-filter syntax, e.g. `info` or `kstall=debug` [default: info].
    #[arg(long, env = "KSTALL_LOG_LEVEL", value_name = "FILTER")]
    pub log_level: Option<String>,
    #[command(flatten)]
    #[serde(flatten)]
    pub series: crate::export::series::Flags,
    /// Append every raw kernel record to FILE, one `<kind> <hex>` line each: for bug reports,
    /// and how the decoders' test samples are recorded on real kernels.
    #[arg(long, env = "KSTALL_RECORD_RAW", value_name = "FILE")]
    pub record_raw: Option<PathBuf>,
    #[command(flatten)]
    #[serde(flatten)]
    pub attribution: crate::attribution::flags::Flags,
    #[command(flatten)]
    #[serde(flatten)]
    pub incidents: crate::incidents::flags::Flags,
    #[command(flatten)]
    #[serde(flatten)]
    pub kubernetes: crate::export::kubernetes::flags::Flags,
    #[command(flatten)]
    #[serde(flatten)]
    pub kubelet: kubelet::Flags,
    #[command(flatten)]
    #[serde(flatten)]
    pub alertmanager: crate::export::alertmanager::Flags,
    #[command(flatten)]
    #[serde(flatten)]
    pub export_events: crate::export::json_lines::Flags,
    #[command(flatten)]
    #[serde(flatten)]
    pub export_otlp: crate::export::otlp::Flags,
    #[command(flatten)]
    #[serde(flatten)]
    pub captures: crate::capture::flags::Flags,
    /// For an agent run by `kstall trace --standalone`: keep only this process's events, in the
    /// kernel (the node agent must see every event).
    #[arg(long, hide = true, value_name = "PID")]
    pub capture_pid: Option<u32>,
    /// For an agent run by `kstall trace --standalone`: keep only events with this port.
    #[arg(long, hide = true, value_name = "PORT")]
    pub capture_port: Option<u16>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogFormat {
    Auto,
    Text,
    Json,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    pub listen: SocketAddr,
    /// TLS and basic auth for /metrics, checked here, read again by the server.
    pub web_config_file: Option<PathBuf>,
    pub api_socket: PathBuf,
    /// Where the incident history is written; `None`: memory only.
    pub state_dir: Option<PathBuf>,
    pub probes: probes::Settings,
    pub log_format: LogFormat,
    pub log_level: String,
    pub record_raw: Option<PathBuf>,
    pub pod_metadata: PodMetadata,
    pub node_name: String,
    pub pod_labels: Vec<String>,
    pub pod_retention: Duration,
    pub incidents: crate::incidents::Settings,
    pub metrics: crate::export::series::Settings,
    pub alertmanager: crate::export::alertmanager::Settings,
    /// Every event and incident as JSON lines, when on.
    pub export_events: Option<crate::export::json_lines::Settings>,
    /// Every event and incident as OTLP log records, when on.
    pub export_otlp: Option<crate::export::otlp::Settings>,
    /// What kstall writes to the Kubernetes API (needs the API pod source).
    pub kubernetes: crate::export::kubernetes::flags::Settings,
    /// The kubelet's health checks, when on.
    pub kubelet: Option<kubelet::Settings>,
    /// What the agent's captures may do (none run without a state dir).
    pub captures: crate::capture::flags::Settings,
}

#[derive(Debug, PartialEq, Eq, thiserror::Error)]
#[error("invalid configuration: {origin}: {message}")]
pub struct ConfigError {
    pub field: &'static str,
    /// Where the bad value came from: its flag (`--oom-loop-count`), its variable
    /// (`KSTALL_OOM_LOOP_COUNT`), or the file's key and line (`/etc/kstall.toml line 3,
    /// oom_loop_count`).
    pub origin: String,
    pub message: String,
}

fn invalid(field: &'static str, message: impl Into<String>) -> ConfigError {
    ConfigError { field, origin: field.to_string(), message: one_line(&message.into()) }
}

/// A subsystem's bad value; where it came from is added by [`Config::resolve`].
impl From<setting::Invalid> for ConfigError {
    fn from((field, message): setting::Invalid) -> Self {
        invalid(field, message)
    }
}

/// One line, always: errors from parsers (TOML) can span several, and a path or a key the user
/// wrote may hold a line break.
fn one_line(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// A setting as the file names it: its key (the flag's name in snake_case, clap's id for it) and
/// whether it takes a list (its flag is comma-separated).
struct Key {
    name: String,
    list: bool,
}

/// Every setting the file may hold, read off the flags' own declaration: a flag is its setting's
/// one declaration. `config` and the hidden flags of `kstall trace --standalone` are no keys.
static KEYS: std::sync::LazyLock<Vec<Key>> = std::sync::LazyLock::new(|| {
    let flags = <AgentArgs as clap::Args>::augment_args(clap::Command::new("kstall"));
    flags
        .get_arguments()
        .filter(|a| !a.is_hide_set() && a.get_id() != "config")
        .map(|a| Key { name: a.get_id().to_string(), list: a.get_value_delimiter().is_some() })
        .collect()
});

/// The file's settings as their flags carry them: a value as text (a string, number or boolean in
/// its native TOML type), a list's values each as text. An unknown key, or a value of no
/// setting's shape, is an error naming its line.
fn file_layer(
    path: &std::path::Path,
    text: &str,
) -> Result<serde_json::Map<String, serde_json::Value>, ConfigError> {
    let table: toml::Table = toml::from_str(text).map_err(|e| file_error(path, text, &e))?;
    let as_text = |v: &toml::Value| match v {
        toml::Value::String(s) => Some(s.clone()),
        toml::Value::Integer(n) => Some(n.to_string()),
        toml::Value::Float(f) => Some(f.to_string()),
        toml::Value::Boolean(b) => Some(b.to_string()),
        _ => None,
    };
    let mut layer = serde_json::Map::new();
    for (name, value) in table {
        let at = |field: &'static str, message: String| ConfigError {
            origin: origin_of(&name, &serde_json::Value::Null, Some((path, text))),
            ..invalid(field, message)
        };
        let Some(key) = KEYS.iter().find(|k| k.name == name) else {
            return Err(at("config", format!("{name:?} is not a setting (see kstall agent --help)")));
        };
        let setting = if key.list {
            let items = match &value {
                toml::Value::Array(items) => items.iter().map(as_text).collect::<Option<Vec<_>>>(),
                one => as_text(one).map(|t| vec![t]),
            };
            items.map(serde_json::Value::from)
        } else {
            as_text(&value).map(serde_json::Value::String)
        };
        let expected = if key.list { "a list of strings or numbers" } else { "a string, number or boolean" };
        let setting = setting
            .ok_or_else(|| at(&key.name, format!("{} is not {expected}", one_line(&value.to_string()))))?;
        layer.insert(name, setting);
    }
    Ok(layer)
}

/// The config file's error, one line: its path, the line and the key.
fn file_error(path: &std::path::Path, text: &str, e: &toml::de::Error) -> ConfigError {
    let Some(span) = e.span() else {
        return invalid("config", format!("{}: {}", path.display(), e.message()));
    };
    let line = text[..span.start.min(text.len())].matches('\n').count() + 1;
    // The key when the line starts with one (a bare key: what every setting's name is).
    let key = text.lines().nth(line - 1).and_then(|l| l.split_once('=')).map(|(key, _)| key.trim());
    let bare = |key: &str| {
        !key.is_empty() && key.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
    };
    let at = match key {
        Some(key) if bare(key) => format!("line {line}, {key}"),
        _ => format!("line {line}"),
    };
    ConfigError { origin: one_line(&format!("{} {at}", path.display())), ..invalid("config", e.message()) }
}

/// Where `field`'s value came from: a flag or variable when the command line or environment set
/// it (they win over the file), else the file's line with the key.
fn origin_of(field: &str, given: &serde_json::Value, file: Option<(&std::path::Path, &str)>) -> String {
    let set = |v: &serde_json::Value| !v.is_null() && *v != serde_json::Value::Bool(false);
    if given.get(field).is_some_and(set) {
        let flag = format!("--{}", field.replace('_', "-"));
        let variable = format!("KSTALL_{}", field.to_uppercase());
        let on_command_line = std::env::args()
            .any(|a| a == flag || a.strip_prefix(&flag).is_some_and(|rest| rest.starts_with('=')));
        return if !on_command_line && std::env::var_os(&variable).is_some() { variable } else { flag };
    }
    let line = file.and_then(|(path, text)| {
        let n = text.lines().position(|l| {
            l.trim_start().strip_prefix(field).is_some_and(|rest| rest.trim_start().starts_with('='))
        })?;
        Some(one_line(&format!("{} line {}, {field}", path.display(), n + 1)))
    });
    line.unwrap_or_else(|| field.to_string())
}

impl Config {
    /// The configuration from the flags and variables in `args` over the file they name; a bad
    /// value is an error naming where it came from.
    pub fn resolve(args: AgentArgs) -> Result<Self, ConfigError> {
        let given = serde_json::to_value(&args).unwrap_or_default();
        let Some(path) = args.config.clone() else {
            return Self::from_settings(args).map_err(|mut e| {
                e.origin = origin_of(e.field, &given, None);
                e
            });
        };
        let text = crate::named_file::read_text(&path, crate::named_file::CONFIG_MAX_BYTES)
            .map_err(|e| ConfigError { origin: origin_of("config", &given, None), ..invalid("config", e) })?;
        // Flags and variables win: the file fills only what they left unset.
        let mut merged = given.clone();
        if let Some(merged) = merged.as_object_mut() {
            for (key, value) in file_layer(&path, &text)? {
                if merged.get(&key).is_none_or(serde_json::Value::is_null) {
                    merged.insert(key, value);
                }
            }
        }
        // Every value is text or a list of texts, as the flags take them: this cannot fail.
        let args = serde_json::from_value(merged).map_err(|e| invalid("config", e.to_string()))?;
        Self::from_settings(args).map_err(|mut e| {
            if e.field != "config" {
                e.origin = origin_of(e.field, &given, Some((&path, &text)));
            }
            e
        })
    }

    fn from_settings(args: AgentArgs) -> Result<Self, ConfigError> {
        let listen = args.listen.unwrap_or_else(|| DEFAULT_LISTEN.into());
        let listen = listen
            .parse::<SocketAddr>()
            .map_err(|_| invalid("listen", format!("{listen:?} is not an address like 127.0.0.1:9700")))?;

        let web_config_file = args.web_config_file;
        if let Some(path) = &web_config_file {
            crate::web_config::load(path).map_err(|e| invalid("web_config_file", e))?;
        }
        let state_dir = match args.state_dir {
            Some(dir) if dir.as_os_str() == "none" => None,
            Some(dir) if !dir.is_absolute() => {
                return Err(invalid(
                    "state_dir",
                    format!("{} is not an absolute path (or none)", dir.display()),
                ));
            }
            Some(dir) => Some(dir),
            None => Some(DEFAULT_STATE_DIR.into()),
        };
        let api_socket = args.api_socket.unwrap_or_else(|| DEFAULT_API_SOCKET.into());
        if !api_socket.is_absolute() {
            return Err(invalid("api_socket", format!("{} is not an absolute path", api_socket.display())));
        }

        let log_format = match args.log_format.as_deref() {
            None | Some("auto") => LogFormat::Auto,
            Some("text") => LogFormat::Text,
            Some("json") => LogFormat::Json,
            Some(other) => {
                return Err(invalid("log_format", format!("{other:?} is not one of auto, text, json")));
            }
        };

        let log_level = args.log_level.unwrap_or_else(|| "info".into());
        tracing_subscriber::EnvFilter::try_new(&log_level)
            .map_err(|e| invalid("log_level", format!("{log_level:?}: {e}")))?;

        let capture = kstall_common::capture::CaptureFilter {
            pid: args.capture_pid.unwrap_or(0),
            port: args.capture_port.unwrap_or(0),
            _pad: 0,
        };
        let mut probes = args.probes.settings(capture)?;
        let metrics = args.series.settings()?;

        let crate::attribution::flags::Attribution { pod_metadata, node_name, pod_labels, pod_retention } =
            args.attribution.settings()?;

        let incidents = args.incidents.settings()?;

        // The signatures match redirected resets by their original port: it must keep its number.
        probes.kept_ports.extend(incidents.nfs_ports.iter().map(|&port| port..=port));

        let alertmanager = args.alertmanager.settings()?;
        let export_events = args.export_events.settings()?;
        let export_otlp = args.export_otlp.settings()?;

        let api = matches!(pod_metadata, PodMetadata::Api { .. });
        let kubernetes = args.kubernetes.settings(api)?;
        let kubelet = args.kubelet.settings(api)?;
        let captures = args.captures.settings()?;
        if state_dir.is_none() && !captures.on.is_empty() {
            return Err(invalid("capture_on", crate::capture::service::OFF.to_string()));
        }

        Ok(Config {
            captures,
            probes,
            metrics,
            alertmanager,
            export_events,
            export_otlp,
            kubernetes,
            kubelet,
            incidents,
            pod_metadata,
            node_name,
            pod_labels,
            pod_retention,
            record_raw: args.record_raw,
            listen,
            web_config_file,
            api_socket,
            state_dir,
            log_format,
            log_level,
        })
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write as _;

    use super::*;
    use crate::{
        attribution::flags::Flags as AttributionFlags,
        export::{
            alertmanager::Flags as AlertmanagerFlags, kubernetes::conditions::Condition,
            kubernetes::flags::Flags as KubernetesFlags, series::Flags as SeriesFlags,
        },
        incidents::flags::Flags as IncidentFlags,
        kubelet::Flags as KubeletFlags,
        probes::flags::Flags as ProbeFlags,
    };

    fn resolve(args: AgentArgs) -> Result<Config, ConfigError> {
        Config::resolve(args)
    }

    #[test]
    fn defaults_need_nothing() {
        let c = resolve(AgentArgs::default()).unwrap();
        assert_eq!(c.listen, "127.0.0.1:9700".parse().unwrap());
        assert_eq!(c.api_socket, PathBuf::from("/run/kstall/kstall.sock"));
        assert_eq!(c.state_dir, Some(PathBuf::from("/var/lib/kstall")));
        let memory_only = resolve(AgentArgs { state_dir: Some("none".into()), ..Default::default() });
        assert_eq!(memory_only.unwrap().state_dir, None);
        let mut capturing = AgentArgs { state_dir: Some("none".into()), ..Default::default() };
        capturing.captures.capture_on = Some(vec!["nfs-sidecar-redirect".into()]);
        let e = resolve(capturing).unwrap_err();
        assert_eq!((e.field, e.message.as_str()), ("capture_on", crate::capture::service::OFF));
        assert_eq!(
            c.probes.enabled,
            vec!["tcp-reset", "hung-task", "oom", "nfs", "stuck-task", "cpu-lockup", "packet-drop"]
        );
        assert_eq!(c.probes.stuck_task, probes::stuck_task::Settings::default());
        assert_eq!(c.probes.stuck_task.interval, Duration::from_secs(5));
        assert!(c.probes.critical_comms.iter().any(|c| c == "kubelet"));
        assert_eq!(c.probes.hung_task_timeout_secs, None, "the sysctl is left alone unless asked");
        assert_eq!(c.probes.ring_buffer_bytes, 1 << 20);
        assert_eq!(c.probes.tcp_reset_hook, probes::tcp_reset::Hook::Auto);
    }

    #[test]
    fn each_bad_value_names_its_field() {
        let cases: Vec<(AgentArgs, &str)> = vec![
            (AgentArgs { listen: Some("localhost".into()), ..Default::default() }, "listen"),
            (AgentArgs { api_socket: Some("rel/sock".into()), ..Default::default() }, "api_socket"),
            (AgentArgs { state_dir: Some("var/lib/kstall".into()), ..Default::default() }, "state_dir"),
            (
                AgentArgs { web_config_file: Some("/nonexistent/web.yml".into()), ..Default::default() },
                "web_config_file",
            ),
            (
                AgentArgs {
                    alertmanager: AlertmanagerFlags {
                        alertmanager_url: Some(vec!["ftp://am".into()]),
                        ..Default::default()
                    },
                    ..Default::default()
                },
                "alertmanager_url",
            ),
            (
                AgentArgs {
                    alertmanager: AlertmanagerFlags {
                        alertmanager_ca_file: Some("/nonexistent/ca.crt".into()),
                        ..Default::default()
                    },
                    ..Default::default()
                },
                "alertmanager_ca_file",
            ),
            (
                AgentArgs {
                    alertmanager: AlertmanagerFlags {
                        alertmanager_basic_auth_user: Some("kstall".into()),
                        ..Default::default()
                    },
                    ..Default::default()
                },
                "alertmanager_basic_auth_password_file",
            ),
            (
                AgentArgs {
                    alertmanager: AlertmanagerFlags {
                        alertmanager_bearer_token_file: Some("/etc/hostname".into()),
                        alertmanager_basic_auth_user: Some("kstall".into()),
                        ..Default::default()
                    },
                    ..Default::default()
                },
                "alertmanager_bearer_token_file",
            ),
            (
                AgentArgs {
                    probes: ProbeFlags {
                        probes: Some(vec!["tcp-reset".into(), "nope".into()]),
                        ..Default::default()
                    },
                    ..Default::default()
                },
                "probes",
            ),
            (
                AgentArgs {
                    probes: ProbeFlags { probes: Some(vec![" ".into()]), ..Default::default() },
                    ..Default::default()
                },
                "probes",
            ),
            (
                AgentArgs {
                    probes: ProbeFlags { ring_buffer_bytes: Some("3000".into()), ..Default::default() },
                    ..Default::default()
                },
                "ring_buffer_bytes",
            ),
            (
                AgentArgs {
                    probes: ProbeFlags { ring_buffer_bytes: Some("2K".into()), ..Default::default() },
                    ..Default::default()
                },
                "ring_buffer_bytes",
            ),
            (
                AgentArgs {
                    probes: ProbeFlags { ring_buffer_bytes: Some("1X".into()), ..Default::default() },
                    ..Default::default()
                },
                "ring_buffer_bytes",
            ),
            (
                AgentArgs {
                    probes: ProbeFlags {
                        ring_buffer_bytes: Some("99999999999999999999".into()),
                        ..Default::default()
                    },
                    ..Default::default()
                },
                "ring_buffer_bytes",
            ),
            (AgentArgs { log_format: Some("xml".into()), ..Default::default() }, "log_format"),
            (AgentArgs { log_level: Some("kstall=loud".into()), ..Default::default() }, "log_level"),
            (
                AgentArgs {
                    probes: ProbeFlags { tcp_reset_hook: Some("kprobe".into()), ..Default::default() },
                    ..Default::default()
                },
                "tcp_reset_hook",
            ),
            (AgentArgs { config: Some("/nonexistent/kstall.toml".into()), ..Default::default() }, "config"),
            (
                AgentArgs {
                    probes: ProbeFlags { hung_task_timeout_secs: Some("0".into()), ..Default::default() },
                    ..Default::default()
                },
                "hung_task_timeout_secs",
            ),
            (
                AgentArgs {
                    probes: ProbeFlags { hung_task_timeout_secs: Some("3s".into()), ..Default::default() },
                    ..Default::default()
                },
                "hung_task_timeout_secs",
            ),
            (
                AgentArgs {
                    probes: ProbeFlags { stuck_task_interval: Some("0s".into()), ..Default::default() },
                    ..Default::default()
                },
                "stuck_task_interval",
            ),
            (
                AgentArgs {
                    probes: ProbeFlags { stuck_task_interval: Some("2h".into()), ..Default::default() },
                    ..Default::default()
                },
                "stuck_task_interval",
            ),
            (
                AgentArgs {
                    probes: ProbeFlags { stuck_task_threshold: Some("soon".into()), ..Default::default() },
                    ..Default::default()
                },
                "stuck_task_threshold",
            ),
            (
                AgentArgs {
                    probes: ProbeFlags { stuck_task_threshold: Some("0".into()), ..Default::default() },
                    ..Default::default()
                },
                "stuck_task_threshold",
            ),
            (
                AgentArgs {
                    probes: ProbeFlags { stuck_task_max_reports: Some("0".into()), ..Default::default() },
                    ..Default::default()
                },
                "stuck_task_max_reports",
            ),
            (
                AgentArgs {
                    probes: ProbeFlags { stuck_task_max_reports: Some("-3".into()), ..Default::default() },
                    ..Default::default()
                },
                "stuck_task_max_reports",
            ),
            (
                AgentArgs {
                    attribution: AttributionFlags { pod_metadata: Some("etcd".into()), ..Default::default() },
                    ..Default::default()
                },
                "pod_metadata",
            ),
            (
                AgentArgs {
                    attribution: AttributionFlags { pod_metadata: Some("file".into()), ..Default::default() },
                    ..Default::default()
                },
                "pod_metadata",
            ),
            (
                AgentArgs {
                    attribution: AttributionFlags {
                        pods_file: Some("/nonexistent/pods.json".into()),
                        ..Default::default()
                    },
                    ..Default::default()
                },
                "pods_file",
            ),
            (
                AgentArgs {
                    attribution: AttributionFlags {
                        pod_retention: Some("1 hour".into()),
                        ..Default::default()
                    },
                    ..Default::default()
                },
                "pod_retention",
            ),
            (
                AgentArgs {
                    attribution: AttributionFlags { pod_retention: Some("0s".into()), ..Default::default() },
                    ..Default::default()
                },
                "pod_retention",
            ),
            (
                AgentArgs {
                    attribution: AttributionFlags {
                        pod_labels: Some(vec!["app".into(), "bad key".into()]),
                        ..Default::default()
                    },
                    ..Default::default()
                },
                "pod_labels",
            ),
            (
                AgentArgs {
                    attribution: AttributionFlags { node_name: Some(" ".into()), ..Default::default() },
                    ..Default::default()
                },
                "node_name",
            ),
            (
                AgentArgs {
                    incidents: IncidentFlags {
                        nfs_ports: Some(vec!["2049".into(), "70000".into()]),
                        ..Default::default()
                    },
                    ..Default::default()
                },
                "nfs_ports",
            ),
            (
                AgentArgs {
                    incidents: IncidentFlags { redirect_min_resets: Some("0".into()), ..Default::default() },
                    ..Default::default()
                },
                "redirect_min_resets",
            ),
            (
                AgentArgs {
                    incidents: IncidentFlags { quiet_window: Some("soon".into()), ..Default::default() },
                    ..Default::default()
                },
                "quiet_window",
            ),
            (
                AgentArgs {
                    incidents: IncidentFlags { oom_loop_count: Some("1".into()), ..Default::default() },
                    ..Default::default()
                },
                "oom_loop_count",
            ),
            (
                AgentArgs {
                    probes: ProbeFlags {
                        metric_ports: Some(vec!["8080".into(), "http".into()]),
                        ..Default::default()
                    },
                    ..Default::default()
                },
                "metric_ports",
            ),
            (
                AgentArgs {
                    probes: ProbeFlags { metric_ports: Some(vec!["0".into()]), ..Default::default() },
                    ..Default::default()
                },
                "metric_ports",
            ),
            (
                AgentArgs {
                    probes: ProbeFlags { metric_ports: Some(vec!["9010-9000".into()]), ..Default::default() },
                    ..Default::default()
                },
                "metric_ports",
            ),
            (
                AgentArgs {
                    probes: ProbeFlags { metric_ports: Some(vec!["1-70000".into()]), ..Default::default() },
                    ..Default::default()
                },
                "metric_ports",
            ),
            (
                AgentArgs {
                    series: SeriesFlags { max_series_per_metric: Some("0".into()) },
                    ..Default::default()
                },
                "max_series_per_metric",
            ),
            (
                AgentArgs {
                    series: SeriesFlags { max_series_per_metric: Some("lots".into()) },
                    ..Default::default()
                },
                "max_series_per_metric",
            ),
            (
                AgentArgs {
                    incidents: IncidentFlags {
                        termination_blocked_after: Some("0s".into()),
                        ..Default::default()
                    },
                    ..Default::default()
                },
                "termination_blocked_after",
            ),
        ];
        for (args, field) in cases {
            let err = resolve(args).expect_err(field);
            assert_eq!(err.field, field, "{err}");
            assert!(!err.to_string().contains('\n'), "one line: {err}");
        }
    }

    #[test]
    fn unknown_probe_lists_the_valid_ones() {
        let err = resolve(AgentArgs {
            probes: ProbeFlags { probes: Some(vec!["oom-kil".into()]), ..Default::default() },
            ..Default::default()
        })
        .unwrap_err();
        assert!(err.message.contains("tcp-reset"), "{err}");
    }

    #[test]
    fn node_conditions_are_opt_in_by_name_and_need_the_api() {
        let api = || AgentArgs {
            attribution: AttributionFlags { kubeconfig: Some("/k".into()), ..Default::default() },
            ..Default::default()
        };
        assert!(resolve(api()).unwrap().kubernetes.node_conditions.is_empty(), "none by default");
        let some = |list: &[&str]| AgentArgs {
            kubernetes: KubernetesFlags {
                node_conditions: Some(list.iter().map(|s| s.to_string()).collect()),
                ..Default::default()
            },
            ..api()
        };
        assert_eq!(
            resolve(some(&["KubeletDegraded", " NFSClientStalled", "KubeletDegraded"]))
                .unwrap()
                .kubernetes
                .node_conditions,
            [Condition::KubeletDegraded, Condition::NfsClientStalled]
        );
        assert!(resolve(some(&["none"])).unwrap().kubernetes.node_conditions.is_empty());
        let err = resolve(some(&["NFSClientStalled", "Ready"])).unwrap_err();
        assert_eq!(
            err.to_string(),
            "invalid configuration: --node-conditions: \"Ready\" is not one of NFSClientStalled, KernelSystemOOM, KubeletDegraded, CPUSoftLockup, ConntrackTableFull, none"
        );
        let without_api = AgentArgs {
            attribution: AttributionFlags { pod_metadata: Some("none".into()), ..Default::default() },
            ..some(&["KernelSystemOOM"])
        };
        assert_eq!(resolve(without_api).unwrap_err().field, "node_conditions");
    }

    #[test]
    fn kubelet_checks_follow_the_api_source_and_take_their_addresses() {
        let api = || AgentArgs {
            attribution: AttributionFlags { kubeconfig: Some("/k".into()), ..Default::default() },
            ..Default::default()
        };
        assert_eq!(resolve(api()).unwrap().kubelet, Some(kubelet::Settings::default()), "on with the API");
        let none = AgentArgs {
            attribution: AttributionFlags { pod_metadata: Some("none".into()), ..Default::default() },
            ..Default::default()
        };
        assert_eq!(resolve(none).unwrap().kubelet, None, "a node without a kubelet to ask");
        let off = AgentArgs {
            kubelet: KubeletFlags { kubelet_checks: Some("off".into()), ..Default::default() },
            ..api()
        };
        assert_eq!(resolve(off).unwrap().kubelet, None);
        let moved = AgentArgs {
            kubelet: KubeletFlags {
                kubelet_healthz: Some("http://10.0.0.7:10248/healthz".into()),
                kubelet_server: Some("10.0.0.7:10250".into()),
                ..Default::default()
            },
            ..api()
        };
        let settings = resolve(moved).unwrap().kubelet.unwrap();
        assert_eq!(
            (settings.healthz.to_string(), settings.server.as_str()),
            ("http://10.0.0.7:10248/healthz".into(), "10.0.0.7:10250")
        );
        // Where Kubernetes says the node is (the DaemonSet's status.hostIP); the flag overrides it.
        let advertised = AgentArgs {
            kubelet: KubeletFlags { node_ip: Some("198.51.100.10".into()), ..Default::default() },
            ..api()
        };
        let settings = resolve(advertised).unwrap().kubelet.unwrap();
        assert_eq!(settings.server, "198.51.100.10:10250");
        assert_eq!(settings.advertised, Some("198.51.100.10".parse().unwrap()));
        let v6 = AgentArgs {
            kubelet: KubeletFlags { node_ip: Some("fd00::7".into()), ..Default::default() },
            ..api()
        };
        assert_eq!(resolve(v6).unwrap().kubelet.unwrap().server, "[fd00::7]:10250");
        let both = AgentArgs {
            kubelet: KubeletFlags {
                node_ip: Some("198.51.100.10".into()),
                kubelet_server: Some("127.0.0.1:10250".into()),
                ..Default::default()
            },
            ..api()
        };
        assert_eq!(resolve(both).unwrap().kubelet.unwrap().server, "127.0.0.1:10250");
        for (args, field) in [
            (
                AgentArgs {
                    kubelet: KubeletFlags {
                        kubelet_healthz: Some("https://127.0.0.1:10248/healthz".into()),
                        ..Default::default()
                    },
                    ..api()
                },
                "kubelet_healthz",
            ),
            (
                AgentArgs {
                    kubelet: KubeletFlags { kubelet_server: Some("127.0.0.1".into()), ..Default::default() },
                    ..api()
                },
                "kubelet_server",
            ),
            (
                AgentArgs {
                    kubelet: KubeletFlags { node_ip: Some("node1".into()), ..Default::default() },
                    ..api()
                },
                "node_ip",
            ),
            (
                AgentArgs {
                    kubelet: KubeletFlags { kubelet_checks: Some("maybe".into()), ..Default::default() },
                    ..api()
                },
                "kubelet_checks",
            ),
            (
                AgentArgs {
                    incidents: IncidentFlags {
                        kubelet_image_pull_pods: Some("1".into()),
                        ..Default::default()
                    },
                    ..api()
                },
                "kubelet_image_pull_pods",
            ),
            (
                AgentArgs {
                    incidents: IncidentFlags {
                        kubelet_stuck_terminating_pods: Some("0".into()),
                        ..Default::default()
                    },
                    ..api()
                },
                "kubelet_stuck_terminating_pods",
            ),
            (
                AgentArgs {
                    incidents: IncidentFlags {
                        kubelet_termination_overdue: Some("soon".into()),
                        ..Default::default()
                    },
                    ..api()
                },
                "kubelet_termination_overdue",
            ),
            (
                AgentArgs {
                    incidents: IncidentFlags {
                        kubelet_unhealthy_after: Some("0s".into()),
                        ..Default::default()
                    },
                    ..api()
                },
                "kubelet_unhealthy_after",
            ),
        ] {
            assert_eq!(resolve(args).unwrap_err().field, field);
        }
        let tuned = AgentArgs {
            incidents: IncidentFlags {
                kubelet_image_pull_pods: Some("100".into()),
                kubelet_termination_overdue: Some("10m".into()),
                ..Default::default()
            },
            ..api()
        };
        let incidents = resolve(tuned).unwrap().incidents;
        assert_eq!(
            (incidents.kubelet_image_pull_pods, incidents.kubelet_termination_overdue),
            (100, Duration::from_secs(600))
        );
    }

    #[test]
    fn kubernetes_events_follow_the_api_source() {
        let api = || AgentArgs {
            attribution: AttributionFlags { kubeconfig: Some("/k".into()), ..Default::default() },
            ..Default::default()
        };
        assert!(resolve(api()).unwrap().kubernetes.events, "on with the API by default");
        let kubernetes = KubernetesFlags { kubernetes_events: Some("off".into()), ..Default::default() };
        let off = resolve(AgentArgs { kubernetes, ..api() }).unwrap();
        assert!(!off.kubernetes.events);
        let none = AgentArgs {
            attribution: AttributionFlags { pod_metadata: Some("none".into()), ..Default::default() },
            ..Default::default()
        };
        assert!(!resolve(none).unwrap().kubernetes.events, "off without the API");
        for (value, says) in [("on", "needs the Kubernetes API"), ("yes", "\"yes\" is not on or off")] {
            let args = AgentArgs {
                attribution: AttributionFlags { pod_metadata: Some("none".into()), ..Default::default() },
                kubernetes: KubernetesFlags { kubernetes_events: Some(value.into()), ..Default::default() },
                ..Default::default()
            };
            let err = resolve(args).unwrap_err();
            assert_eq!(err.field, "kubernetes_events");
            assert!(err.message.contains(says), "{err}");
        }
    }

    #[test]
    fn pod_metadata_sources() {
        let pods = file(r#"{"apiVersion": "v1", "kind": "List", "items": []}"#);
        let c = resolve(AgentArgs {
            attribution: AttributionFlags { pods_file: Some(pods.path().into()), ..Default::default() },
            ..Default::default()
        })
        .unwrap();
        assert_eq!(c.pod_metadata, PodMetadata::File(pods.path().into()));
        let c = resolve(AgentArgs {
            attribution: AttributionFlags { kubeconfig: Some("/k".into()), ..Default::default() },
            ..Default::default()
        })
        .unwrap();
        assert_eq!(c.pod_metadata, PodMetadata::Api { kubeconfig: Some("/k".into()) });
        let c = resolve(AgentArgs {
            attribution: AttributionFlags { pod_metadata: Some("none".into()), ..Default::default() },
            ..Default::default()
        })
        .unwrap();
        assert_eq!(c.pod_metadata, PodMetadata::None);
        assert_eq!(c.pod_retention, Duration::from_secs(3600));
        let bad = file("{ nope");
        let err = resolve(AgentArgs {
            attribution: AttributionFlags { pods_file: Some(bad.path().into()), ..Default::default() },
            ..Default::default()
        })
        .unwrap_err();
        assert_eq!(err.field, "pods_file");
        assert!(!err.to_string().contains('\n'), "{err}");
    }

    #[test]
    fn incident_thresholds() {
        let c = resolve(AgentArgs {
            incidents: IncidentFlags {
                nfs_ports: Some(vec!["2049".into(), " 20048".into()]),
                termination_blocked_after: Some("5s".into()),
                oom_loop_count: Some("4".into()),
                ..Default::default()
            },
            ..Default::default()
        })
        .unwrap();
        assert_eq!(c.incidents.nfs_ports, [2049, 20048]);
        assert_eq!(c.incidents.termination_blocked_after, Duration::from_secs(5));
        assert_eq!(c.incidents.oom_loop_count, 4);
        assert_eq!(c.incidents.quiet_window, Duration::from_secs(60));
    }

    #[test]
    fn metric_ports_add_to_the_nfs_ports_and_the_series_cap_is_set() {
        let c = resolve(AgentArgs {
            probes: ProbeFlags {
                metric_ports: Some(vec!["8081".into(), " 30000-30100".into(), "".into()]),
                ..Default::default()
            },
            incidents: IncidentFlags { nfs_ports: Some(vec!["2050".into()]), ..Default::default() },
            series: SeriesFlags { max_series_per_metric: Some("200".into()) },
            ..Default::default()
        })
        .unwrap();
        assert_eq!(c.probes.kept_ports, [8081..=8081, 30000..=30100, 2050..=2050]);
        assert_eq!(c.metrics.max_series_per_metric, 200);
        let defaults = resolve(AgentArgs::default()).unwrap();
        assert_eq!(defaults.metrics.max_series_per_metric, 5000);
        assert_eq!(defaults.probes.kept_ports, [2049..=2049, 111..=111, 20048..=20048]);
    }

    fn file(contents: &str) -> tempfile::NamedTempFile {
        let mut f = tempfile::NamedTempFile::new().unwrap();
        f.write_all(contents.as_bytes()).unwrap();
        f
    }

    /// Every setting with a good value in its native TOML type (and its flag's text), beside what
    /// it needs to be valid (`NEEDS`). A new setting fails `every_setting_...` until it is here.
    fn samples(dir: &std::path::Path) -> Vec<(&'static str, String, Vec<String>)> {
        let write = |name: &str, contents: &str| {
            let path = dir.join(name);
            std::fs::write(&path, contents).unwrap();
            path.display().to_string()
        };
        let pods = write("pods.json", r#"{"items": []}"#);
        let kubeconfig = write("kubeconfig", "apiVersion: v1\nkind: Config\n");
        let web = write("web.yml", "{}\n");
        let secret = write("secret", "s3cret\n");
        // Any CA will do: the system's (ca-certificates).
        let ca = write("ca.crt", &std::fs::read_to_string("/etc/ssl/certs/ca-certificates.crt").unwrap());
        let events = format!("file:{}", dir.join("events.jsonl").display());
        let s = |v: &str| format!("{v:?}");
        let one = |v: &str| vec![v.to_string()];
        vec![
            ("listen", s("127.0.0.1:9799"), one("127.0.0.1:9799")),
            ("web_config_file", s(&web), one(&web)),
            ("api_socket", s("/run/kstall/other.sock"), one("/run/kstall/other.sock")),
            ("state_dir", s("/var/lib/kstall-sample"), one("/var/lib/kstall-sample")),
            ("probes", r#"["oom", "tcp-reset"]"#.into(), one("oom,tcp-reset")),
            ("ring_buffer_bytes", "2097152".into(), one("2M")),
            ("sample_events", "8".into(), one("8")),
            ("log_format", s("json"), one("json")),
            ("log_level", s("debug"), one("debug")),
            ("tcp_reset_hook", s("tcp-send-reset"), one("tcp-send-reset")),
            ("hung_task_timeout_secs", "120".into(), one("120")),
            ("stuck_task_interval", "10".into(), one("10s")),
            ("stuck_task_threshold", "60".into(), one("1m")),
            ("stuck_task_max_reports", "100".into(), one("100")),
            ("critical_comms", r#"["kubelet", "etcd"]"#.into(), one("kubelet,etcd")),
            ("metric_ports", r#"[8080, "9000-9010"]"#.into(), one("8080,9000-9010")),
            ("max_series_per_metric", "1000".into(), one("1000")),
            ("record_raw", s("/tmp/kstall-raw.txt"), one("/tmp/kstall-raw.txt")),
            ("pod_metadata", s("api"), one("api")),
            ("pods_file", s(&pods), one(&pods)),
            ("kubeconfig", s(&kubeconfig), one(&kubeconfig)),
            ("node_name", s("node-a"), one("node-a")),
            ("pod_labels", r#"["app", "team"]"#.into(), one("app,team")),
            ("pod_retention", "600".into(), one("10m")),
            ("nfs_ports", "[2049, 20049]".into(), one("2049,20049")),
            ("redirect_min_resets", "5".into(), one("5")),
            ("redirect_window", "60".into(), one("1m")),
            ("quiet_window", "30".into(), one("30s")),
            ("termination_blocked_after", "120".into(), one("2m")),
            ("oom_loop_count", "3".into(), one("3")),
            ("oom_loop_window", "3600".into(), one("1h")),
            ("system_oom_hold", "600".into(), one("10m")),
            ("node_wide_min_pods", "2".into(), one("2")),
            ("alertmanager_url", r#"["https://127.0.0.1:9093"]"#.into(), one("https://127.0.0.1:9093")),
            ("alertmanager_ca_file", s(&ca), one(&ca)),
            ("alertmanager_bearer_token_file", s(&secret), one(&secret)),
            ("alertmanager_basic_auth_user", s("kstall"), one("kstall")),
            ("alertmanager_basic_auth_password_file", s(&secret), one(&secret)),
            ("kubernetes_events", "false".into(), one("off")),
            ("node_conditions", r#"["KubeletDegraded"]"#.into(), one("KubeletDegraded")),
            ("node_taints", r#"["NFSClientStalled"]"#.into(), one("NFSClientStalled")),
            ("node_taint_after", "300".into(), one("5m")),
            ("node_taint_clear_after", "600".into(), one("10m")),
            ("kubelet_checks", "true".into(), one("on")),
            ("kubelet_healthz", s("http://127.0.0.1:10248/healthz"), one("http://127.0.0.1:10248/healthz")),
            ("kubelet_server", s("127.0.0.1:10250"), one("127.0.0.1:10250")),
            ("node_ip", s("198.51.100.10"), one("198.51.100.10")),
            ("kubelet_image_pull_pods", "20".into(), one("20")),
            ("kubelet_termination_overdue", "300".into(), one("5m")),
            ("kubelet_stuck_terminating_pods", "3".into(), one("3")),
            ("kubelet_unhealthy_after", "30".into(), one("30s")),
            ("nfs_slow_threshold", s("750ms"), one("750ms")),
            ("nfs_slow_for", "90".into(), one("90s")),
            ("cpu_lockup_hold", "900".into(), one("15m")),
            ("policy_drops_min", "10".into(), one("10")),
            ("policy_drops_window", "120".into(), one("2m")),
            ("memory_pressure_some", "30".into(), one("30")),
            ("memory_pressure_for", "120".into(), one("2m")),
            ("program_stats", "true".into(), one("on")),
            ("export_events", s(&events), one(&events)),
            ("export_events_max_bytes", "1048576".into(), one("1M")),
            ("export_events_max_files", "3".into(), one("3")),
            ("export_otlp", "false".into(), one("off")),
            ("capture_duration", "30".into(), one("30s")),
            ("capture_max_bytes", s("32M"), one("32M")),
            ("capture_max_packets", "100000".into(), one("100000")),
            ("capture_keep", "10".into(), one("10")),
            ("capture_disk", s("1G"), one("1G")),
            ("capture_running", "1".into(), one("1")),
            (
                "capture_on",
                r#"["nfs-sidecar-redirect", "pod-termination-blocked"]"#.into(),
                one("nfs-sidecar-redirect,pod-termination-blocked"),
            ),
            ("capture_per_hour", "3".into(), one("3")),
        ]
    }

    /// What every sample needs beside it: the API source (node conditions, Events, the kubelet
    /// checks) and Alertmanager (its credentials).
    const NEEDS: &[&str] = &["pod_metadata", "kubeconfig", "node_name", "alertmanager_url"];

    #[derive(clap::Parser)]
    struct AgentCommand {
        #[command(flatten)]
        agent: AgentArgs,
    }

    #[test]
    fn every_setting_is_taken_in_its_native_toml_type_and_as_a_flag_and_a_bad_one_names_its_line() {
        let dir = tempfile::tempdir().unwrap();
        let samples = samples(dir.path());
        let mut listed: Vec<&str> = samples.iter().map(|(k, _, _)| *k).collect();
        listed.sort_unstable();
        let mut keys: Vec<&str> = KEYS.iter().map(|k| k.name.as_str()).collect();
        keys.sort_unstable();
        assert_eq!(listed, keys, "every setting has a sample here");
        // What a key needs in the file beside it: the common needs, and basic auth's other half.
        let needs = |key: &str| -> String {
            let partner = match key {
                "alertmanager_basic_auth_user" => "alertmanager_basic_auth_password_file",
                "alertmanager_basic_auth_password_file" => "alertmanager_basic_auth_user",
                _ => "",
            };
            samples
                .iter()
                .filter(|(k, _, _)| NEEDS.contains(k) || *k == partner)
                .map(|(k, v, _)| format!("{k} = {v}\n"))
                .collect()
        };
        // All at once, natively typed (the bearer token apart: it excludes basic auth).
        let all: String = samples
            .iter()
            .filter(|(k, _, _)| *k != "alertmanager_bearer_token_file")
            .map(|(k, v, _)| format!("{k} = {v}\n"))
            .collect();
        let f = file(&all);
        resolve(AgentArgs { config: Some(f.path().into()), ..Default::default() })
            .unwrap_or_else(|e| panic!("{e}"));
        use clap::Parser as _;
        for (key, _, flag_values) in &samples {
            // As a flag, over a file with what it needs.
            let f = file(&needs(key));
            let flag = format!("--{}", key.replace('_', "-"));
            let mut argv = vec!["kstall".to_string(), "--config".into(), f.path().display().to_string()];
            for v in flag_values {
                argv.extend([flag.clone(), v.clone()]);
            }
            let args = AgentCommand::try_parse_from(&argv).unwrap_or_else(|e| panic!("{argv:?}: {e}")).agent;
            resolve(args).unwrap_or_else(|e| panic!("{argv:?}: {e}"));
            // A value of no setting's type, on line 2 of the file: one line naming both.
            let f = file(&format!("# kstall\n{key} = {{ nested = 1 }}\n"));
            let e =
                resolve(AgentArgs { config: Some(f.path().into()), ..Default::default() }).expect_err(key);
            let message = e.to_string();
            assert!(message.contains(&format!("{} line 2, {key}: ", f.path().display())), "{message}");
            assert!(!message.contains('\n'), "{message}");
        }
    }

    #[test]
    fn every_setting_is_one_flag_one_variable_and_one_key() {
        let flags = <AgentArgs as clap::Args>::augment_args(clap::Command::new("kstall"));
        for arg in flags.get_arguments().filter(|a| !a.is_hide_set()) {
            let key = arg.get_id().as_str();
            assert_eq!(arg.get_long(), Some(key.replace('_', "-").as_str()), "{key}'s flag");
            let variable = arg.get_env().and_then(|v| v.to_str());
            assert_eq!(variable, Some(format!("KSTALL_{}", key.to_uppercase()).as_str()), "{key}'s variable");
        }
    }

    /// Run again as a child process with every setting's variable set: variables are the
    /// process's own, and other tests read them (a bad value names its variable when one is set).
    #[test]
    fn every_setting_is_taken_from_its_variable_and_a_bad_one_names_it() {
        const CHILD: &str = "KSTALL_TEST_SETTINGS_FROM_VARIABLES";
        use clap::Parser as _;
        if std::env::var_os(CHILD).is_some() {
            let args = AgentCommand::try_parse_from(["kstall"]).unwrap_or_else(|e| panic!("{e}")).agent;
            let given = serde_json::to_value(&args).unwrap();
            for key in KEYS.iter().map(|k| k.name.as_str()).filter(|k| *k != "alertmanager_bearer_token_file")
            {
                assert!(!given[key].is_null(), "{key} was not taken from its variable");
            }
            let mut bad = AgentCommand::parse_from(["kstall"]).agent;
            bad.incidents.oom_loop_count = Some("1".into());
            resolve(args).unwrap_or_else(|e| panic!("{e}"));
            let e = resolve(bad).unwrap_err();
            assert_eq!(e.origin, "KSTALL_OOM_LOOP_COUNT", "{e}");
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let mut child = std::process::Command::new(std::env::current_exe().unwrap());
        child.args([
            "--exact",
            "config::tests::every_setting_is_taken_from_its_variable_and_a_bad_one_names_it",
        ]);
        child.env(CHILD, "1");
        for (key, _, values) in samples(dir.path()) {
            // A bearer token excludes basic auth.
            if key != "alertmanager_bearer_token_file" {
                child.env(format!("KSTALL_{}", key.to_uppercase()), values.join(","));
            }
        }
        let out = child.output().unwrap();
        let report = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{report}{}", String::from_utf8_lossy(&out.stderr));
        assert!(report.contains("1 passed"), "the child ran the test: {report}");
    }

    #[test]
    fn a_value_of_no_settings_shape_or_an_unknown_key_names_its_line() {
        let f = file("listen = \"127.0.0.1:9800\"\nlisen = \"127.0.0.1:9801\"\n");
        let e = resolve(AgentArgs { config: Some(f.path().into()), ..Default::default() }).unwrap_err();
        assert_eq!(
            e.to_string(),
            format!(
                "invalid configuration: {} line 2, lisen: \"lisen\" is not a setting (see kstall agent --help)",
                f.path().display()
            )
        );
        let f = file("probes = [[\"oom\"]]\n");
        let e = resolve(AgentArgs { config: Some(f.path().into()), ..Default::default() }).unwrap_err();
        assert_eq!(e.field, "probes");
        assert!(
            e.to_string().ends_with("line 1, probes: [[\"oom\"]] is not a list of strings or numbers"),
            "{e}"
        );
        // One value where a list is taken is a list of one.
        let f = file("probes = \"oom\"\nkubernetes_events = false\n");
        let c = resolve(AgentArgs { config: Some(f.path().into()), ..Default::default() }).unwrap();
        assert_eq!((c.probes.enabled, c.kubernetes.events), (vec!["oom".to_string()], false));
    }

    #[test]
    fn a_line_that_is_no_key_is_named_by_its_number_alone() {
        // Found by the config_file fuzz target: a carriage return in what looked like a key.
        let f = file("pod_..r\0st\ra..metadata = \"file\"\n");
        let e = resolve(AgentArgs { config: Some(f.path().into()), ..Default::default() }).unwrap_err();
        let message = e.to_string();
        assert!(!message.contains(['\n', '\r']), "{message:?}");
        assert!(
            message.starts_with(&format!("invalid configuration: {} line 1: ", f.path().display())),
            "{message:?}"
        );
    }

    #[test]
    fn a_bad_value_names_its_flag_or_its_line_in_the_file() {
        let f = file("listen = \"127.0.0.1:9800\"\n\noom_loop_count = 0\n");
        let from_file =
            resolve(AgentArgs { config: Some(f.path().into()), ..Default::default() }).unwrap_err();
        assert_eq!(from_file.field, "oom_loop_count");
        assert_eq!(from_file.origin, format!("{} line 3, oom_loop_count", f.path().display()));
        let from_flag = resolve(AgentArgs {
            config: Some(f.path().into()),
            incidents: IncidentFlags { oom_loop_count: Some("1".into()), ..Default::default() },
            ..Default::default()
        })
        .unwrap_err();
        assert_eq!(
            from_flag.origin, "--oom-loop-count",
            "the flag wins over the file: its value is the bad one"
        );
    }

    #[test]
    fn file_values_apply_and_flags_win() {
        let f = file("listen = \"127.0.0.1:9800\"\nring_buffer_bytes = 262144\nprobes = [\"tcp-reset\"]\n");
        let c = resolve(AgentArgs { config: Some(f.path().into()), ..Default::default() }).unwrap();
        assert_eq!(c.listen.port(), 9800);
        assert_eq!(c.probes.ring_buffer_bytes, 262144);
        let c = resolve(AgentArgs {
            config: Some(f.path().into()),
            listen: Some("127.0.0.1:9900".into()),
            ..Default::default()
        })
        .unwrap();
        assert_eq!(c.listen.port(), 9900);
    }

    #[test]
    fn bad_files_are_one_line_config_errors() {
        for contents in ["listen = ", "lisen = \"127.0.0.1:1\"", "ring_buffer_bytes = true", "[[[["] {
            let f = file(contents);
            let err = resolve(AgentArgs { config: Some(f.path().into()), ..Default::default() })
                .expect_err(contents);
            assert!(matches!(err.field, "config" | "ring_buffer_bytes"), "{contents}: {err}");
            assert!(!err.to_string().contains('\n'), "{err}");
        }
        let f = file("ring_buffer_bytes = \"3K\"");
        let err = resolve(AgentArgs { config: Some(f.path().into()), ..Default::default() }).unwrap_err();
        assert_eq!(err.field, "ring_buffer_bytes");
    }
}
