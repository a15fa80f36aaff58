//! The probes' settings as users give them: one declaration each, at once the flag, the
//! `KSTALL_*` variable and the file's key (`config.rs` merges the layers), read into
//! [`Settings`] with the probes' own rules.

use kstall_common::capture::CaptureFilter;

use super::settings::{DEFAULT_CRITICAL_COMMS, Hook, Settings, StuckTask};
use crate::setting::{Invalid, parse_duration};

#[derive(Debug, Default, clap::Args, serde::Serialize, serde::Deserialize)]
#[serde(default)]
// A group id of its own: clap names a flattened struct's group after the type.
#[group(id = "probe_settings")]
pub struct Flags {
    /// Probes to load, comma-separated [default: all].
    #[arg(long, env = "KSTALL_PROBES", value_name = "LIST", value_delimiter = ',')]
    pub probes: Option<Vec<String>>,
    /// Size of the kernel-to-agent event ring buffer: a power of two, at least 4096; K/M/G suffixes
    /// allowed [default: 1M].
    #[arg(long, env = "KSTALL_RING_BUFFER_BYTES", value_name = "BYTES")]
    pub ring_buffer_bytes: Option<String>,
    /// Events of one series sent in full per CPU per second (the first ones); the rest are
    /// counted exactly and reported as suppressed. `all`: every event [default: 32].
    #[arg(long, env = "KSTALL_SAMPLE_EVENTS", value_name = "N")]
    pub sample_events: Option<String>,
    /// Hook for resets sent without a socket: auto, tcp-send-reset (>= 6.10), kfree-skb (the
    /// 5.17-6.9 fallback) or send-reset-function (fentry on tcp_v4/v6_send_reset, the fallback
    /// where kfree_skb has no drop reason) [default: auto].
    #[arg(long, env = "KSTALL_TCP_RESET_HOOK", value_name = "HOOK")]
    pub tcp_reset_hook: Option<String>,
    /// How often the stuck-task sampler walks every task: 1s to 1h [default: 5s].
    #[arg(long, env = "KSTALL_STUCK_TASK_INTERVAL", value_name = "DURATION")]
    pub stuck_task_interval: Option<String>,
    /// How long a task asleep uninterruptibly (plain or killable) must not have run before the
    /// sampler reports it [default: 30s].
    #[arg(long, env = "KSTALL_STUCK_TASK_THRESHOLD", value_name = "DURATION")]
    pub stuck_task_threshold: Option<String>,
    /// Stuck tasks one sweep reports at most; the rest are counted and reported by later sweeps
    /// [default: 1000].
    #[arg(long, env = "KSTALL_STUCK_TASK_MAX_REPORTS", value_name = "N")]
    pub stuck_task_max_reports: Option<String>,
    /// Set kernel.hung_task_timeout_secs to this many seconds while the agent runs (restored at
    /// exit). Unset: the agent leaves the sysctl alone.
    #[arg(long, env = "KSTALL_HUNG_TASK_TIMEOUT_SECS", value_name = "SECS")]
    pub hung_task_timeout_secs: Option<String>,
    /// Process names (comm) whose OOM kill is flagged critical, comma-separated; replaces the
    /// default list [default: kubelet,containerd,crio,dockerd,systemd,sshd,node_exporter,alloy,kstall].
    #[arg(long, env = "KSTALL_CRITICAL_COMMS", value_name = "LIST", value_delimiter = ',')]
    pub critical_comms: Option<Vec<String>>,
    /// Ports counted by number in kstall_tcp_resets_total and kstall_packet_drops_total besides the
    /// well-known ones (system ports, NFS, the Kubernetes and mesh ports: see the README),
    /// comma-separated ports and ranges, e.g. 8081,30000-30100; any other port is counted as
    /// `ephemeral` or `other`.
    #[arg(long, env = "KSTALL_METRIC_PORTS", value_name = "LIST", value_delimiter = ',')]
    pub metric_ports: Option<Vec<String>>,
    /// `on`: have the kernel count the programs' runs and run time while the agent runs
    /// (BPF_ENABLE_STATS; ~20 ns a run), for kstall_program_runs_total and
    /// kstall_program_run_seconds_total. `off` leaves kernel.bpf_stats_enabled to the node [default: off].
    #[arg(long, env = "KSTALL_PROGRAM_STATS", value_name = "on|off")]
    pub program_stats: Option<String>,
}

impl Flags {
    /// The settings, each unset one at its default, with the capture filter of a standalone
    /// `kstall trace` (hidden flags, no setting of a node's agent); a bad value names its key.
    pub fn settings(self, capture: CaptureFilter) -> Result<Settings, Invalid> {
        let enabled = match self.probes {
            None => super::names().map(String::from).collect(),
            Some(list) => super::probe_names(list).map_err(|e| ("probes", e))?,
        };
        let ring_buffer_bytes = match self.ring_buffer_bytes {
            Some(text) => ring_buffer_bytes(&text)?,
            None => Settings::DEFAULT_RING_BUFFER_BYTES,
        };
        let sample_events = match self.sample_events {
            Some(text) => Settings::sample_events(&text).map_err(|e| ("sample_events", e))?,
            None => kstall_common::counter::DEFAULT_SAMPLE_EVENTS,
        };
        let tcp_reset_hook = match self.tcp_reset_hook.as_deref().map(str::trim) {
            None | Some("auto") => Hook::Auto,
            Some("tcp-send-reset") => Hook::TcpSendReset,
            Some("kfree-skb") => Hook::KfreeSkb,
            Some("send-reset-function") => Hook::SendResetFunction,
            Some(other) => {
                let why =
                    format!("{other:?} is not one of auto, tcp-send-reset, kfree-skb, send-reset-function");
                return Err(("tcp_reset_hook", why));
            }
        };
        let critical_comms = match self.critical_comms {
            None => DEFAULT_CRITICAL_COMMS.iter().map(|s| s.to_string()).collect(),
            Some(list) => Settings::critical_comms(list).map_err(|e| ("critical_comms", e))?,
        };
        let kept_ports =
            Settings::metric_ports(self.metric_ports.unwrap_or_default()).map_err(|e| ("metric_ports", e))?;
        let stuck_task =
            stuck_task(self.stuck_task_interval, self.stuck_task_threshold, self.stuck_task_max_reports)?;
        let hung_task_timeout_secs =
            self.hung_task_timeout_secs.map(|text| hung_task_timeout(&text)).transpose()?;
        let program_stats = crate::setting::on_off("program_stats", self.program_stats)?.unwrap_or(false);
        Ok(Settings {
            enabled,
            ring_buffer_bytes,
            sample_events,
            tcp_reset_hook,
            critical_comms,
            kept_ports,
            stuck_task,
            hung_task_timeout_secs,
            program_stats,
            capture,
        })
    }
}

fn stuck_task(
    interval: Option<String>,
    threshold: Option<String>,
    max_reports: Option<String>,
) -> Result<StuckTask, Invalid> {
    let mut s = StuckTask::default();
    let duration = |key: &'static str, text: &str| {
        parse_duration(text).ok_or_else(|| (key, format!("{text:?} is not a duration like 5s, 1m")))
    };
    if let Some(text) = interval {
        s.interval = StuckTask::interval(duration("stuck_task_interval", &text)?, &text)
            .map_err(|e| ("stuck_task_interval", e))?;
    }
    if let Some(text) = threshold {
        s.threshold = StuckTask::threshold(duration("stuck_task_threshold", &text)?, &text)
            .map_err(|e| ("stuck_task_threshold", e))?;
    }
    if let Some(text) = max_reports {
        s.max_reports = StuckTask::max_reports(text.trim().parse().ok(), &text)
            .map_err(|e| ("stuck_task_max_reports", e))?;
    }
    Ok(s)
}

/// 0 would disable the detector: that is not what a user of this flag wants.
fn hung_task_timeout(text: &str) -> Result<u64, Invalid> {
    match text.trim().parse() {
        Ok(secs @ 1..=86_400) => Ok(secs),
        _ => Err(("hung_task_timeout_secs", format!("{text} is not a number of seconds from 1 to 86400"))),
    }
}

/// A size the kernel takes for the ring buffer.
fn ring_buffer_bytes(text: &str) -> Result<u32, Invalid> {
    let n = crate::setting::bytes("ring_buffer_bytes", text)?;
    Settings::ring_buffer_bytes(n, text).map_err(|e| ("ring_buffer_bytes", e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(ring_buffer_bytes("4096").unwrap(), 4096);
        assert_eq!(ring_buffer_bytes("256K").unwrap(), 256 << 10);
        assert_eq!(ring_buffer_bytes("1M").unwrap(), 1 << 20);
        assert_eq!(ring_buffer_bytes("1g").unwrap(), 1 << 30);
        assert!(ring_buffer_bytes("2G").is_err());
        assert!(ring_buffer_bytes("").is_err());
    }
}
