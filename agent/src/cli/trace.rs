//! `kstall trace`: a live, filtered, bounded capture from the running agent. The agent filters;
//! this end formats (one aligned human line per event, or the agent's JSON as is), stops after
//! `--duration` (30 s unless given) or `--count` events, or on Ctrl-C.

use std::{
    io::{IsTerminal as _, Write},
    path::PathBuf,
    process::ExitCode,
    time::{Duration, Instant},
};

use serde::Deserialize as _;
use serde_json::Value;
use tokio::io::{AsyncBufReadExt as _, AsyncWriteExt as _, BufReader};

use super::{EXIT_RUNTIME, EXIT_USAGE};
use crate::{
    api::{Request, StreamStarted, filter::TraceFilter},
    config::DEFAULT_API_SOCKET,
    probes,
    setting::parse_duration,
};

const DEFAULT_DURATION: Duration = Duration::from_secs(30);

#[derive(Debug, clap::Args)]
pub struct TraceArgs {
    /// Probes to capture, comma-separated: tcp-reset, hung-task, oom, nfs [default: all].
    #[arg(long, value_delimiter = ',', value_name = "LIST")]
    pub probe: Vec<String>,
    /// Only events of pods in this namespace.
    #[arg(long, short = 'n')]
    pub namespace: Option<String>,
    /// Only events of this pod (name or UID).
    #[arg(long)]
    pub pod: Option<String>,
    /// Only events of this container (name or runtime id).
    #[arg(long)]
    pub container: Option<String>,
    /// Only events of this process or thread.
    #[arg(long)]
    pub pid: Option<u32>,
    /// Only resets with this local, remote or original port, and NFS events of a server on it.
    #[arg(long)]
    pub port: Option<u16>,
    /// Only events of this NFS server (or reset peer) address.
    #[arg(long)]
    pub server: Option<String>,
    /// Stop after this long: 5s, 2m [default: 30s, also with --count].
    #[arg(long, value_name = "DURATION")]
    pub duration: Option<String>,
    /// Stop after this many events.
    #[arg(long)]
    pub count: Option<u64>,
    /// text (one line per event) or json (the agent's JSON, one object per line).
    #[arg(long, default_value = "text", value_parser = ["text", "json"])]
    pub output: String,
    /// Write the events here instead of standard output.
    #[arg(long, value_name = "FILE")]
    pub output_file: Option<PathBuf>,
    /// Load the probes for this capture only (root), even if an agent runs; without an agent
    /// at --api-socket this is what happens anyway.
    #[arg(long)]
    pub standalone: bool,
    /// The agent's API socket.
    #[arg(long, env = "KSTALL_API_SOCKET", default_value = DEFAULT_API_SOCKET, value_name = "PATH")]
    pub api_socket: PathBuf,
}

pub fn run(args: TraceArgs) -> ExitCode {
    let (filter, duration) = match validate(&args) {
        Ok(v) => v,
        Err(e) => {
            eprintln!("kstall: {e}");
            return ExitCode::from(EXIT_USAGE);
        }
    };
    let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("kstall: cannot start the runtime: {e}");
            return ExitCode::from(EXIT_RUNTIME);
        }
    };
    // No agent to ask (or asked not to): run one for this capture, and stop it after.
    let agent_running = std::os::unix::net::UnixStream::connect(&args.api_socket).is_ok();
    let standalone = match (args.standalone, agent_running) {
        (false, true) => None,
        _ => match StandaloneAgent::start(&filter) {
            Ok(agent) => Some(agent),
            Err(e) => {
                eprintln!("kstall: {e}");
                return ExitCode::from(EXIT_RUNTIME);
            }
        },
    };
    let socket = standalone.as_ref().map_or(args.api_socket.clone(), |a| a.socket.clone());
    let result = runtime.block_on(capture(&args, &socket, filter, duration));
    drop(standalone);
    match result {
        Ok(_) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("kstall: {e}");
            ExitCode::from(EXIT_RUNTIME)
        }
    }
}

fn validate(args: &TraceArgs) -> Result<(TraceFilter, Duration), String> {
    let probes: Vec<String> =
        args.probe.iter().map(|p| p.trim().to_string()).filter(|p| !p.is_empty()).collect();
    if let Some(unknown) = probes.iter().find(|p| !probes::names().any(|n| n == p.as_str())) {
        return Err(format!(
            "unknown probe {unknown:?} (valid: {})",
            probes::names().collect::<Vec<_>>().join(", ")
        ));
    }
    let duration = match &args.duration {
        Some(text) => parse_duration(text)
            .filter(|d| !d.is_zero())
            .ok_or_else(|| format!("--duration {text:?} is not a duration like 5s, 2m"))?,
        None => DEFAULT_DURATION,
    };
    if args.count == Some(0) {
        return Err("--count must be at least 1".into());
    }
    let filter = TraceFilter {
        probes,
        namespace: args.namespace.clone(),
        pod: args.pod.clone(),
        container: args.container.clone(),
        pid: args.pid,
        port: args.port,
        server: args.server.clone(),
    };
    Ok((filter, duration))
}

async fn capture(
    args: &TraceArgs,
    socket: &std::path::Path,
    filter: TraceFilter,
    duration: Duration,
) -> Result<u64, String> {
    let unreachable = |e| super::status::unreachable(socket, e);
    let stream = tokio::net::UnixStream::connect(socket).await.map_err(unreachable)?;
    let (read, mut write) = stream.into_split();
    let mut request = serde_json::to_vec(&Request::Trace { filter: filter.clone() }).expect("serializable");
    request.push(b'\n');
    write.write_all(&request).await.map_err(unreachable)?;
    let mut out: Box<dyn Write> = match &args.output_file {
        Some(path) => Box::new(std::io::BufWriter::new(
            std::fs::File::create(path).map_err(|e| format!("cannot write {}: {e}", path.display()))?,
        )),
        None => Box::new(std::io::LineWriter::new(std::io::stdout())),
    };
    let json = args.output == "json";
    let progress =
        std::io::stderr().is_terminal() && (args.output_file.is_some() || !std::io::stdout().is_terminal());
    let started = Instant::now();
    let deadline = tokio::time::sleep(duration);
    tokio::pin!(deadline);
    let mut ticker = tokio::time::interval(Duration::from_secs(1));
    let mut lines = BufReader::new(read).lines();
    let mut n = 0u64;
    loop {
        tokio::select! {
            _ = &mut deadline => break,
            _ = tokio::signal::ctrl_c() => break,
            _ = ticker.tick(), if progress => {
                eprint!("\r{n} events, {}s", started.elapsed().as_secs());
            }
            line = lines.next_line() => {
                let line = match line {
                    Ok(Some(line)) => line,
                    Ok(None) => return Err("the agent closed the capture (stopped?)".into()),
                    Err(e) => return Err(format!("reading from the agent: {e}")),
                };
                let event: Value = serde_json::from_str(&line).map_err(|e| format!("unexpected answer from the agent: {e}"))?;
                if let Some(error) = event.get("error").and_then(Value::as_str) {
                    return Err(format!("the agent refused the capture: {error}"));
                }
                if StreamStarted::deserialize(&event).is_ok() {
                    // As tcpdump's "listening on": from here on nothing is missed.
                    eprintln!("kstall: capturing {}", describe(&filter, duration, args.count));
                    continue;
                }
                let text = if json { line } else { render(&event) };
                writeln!(out, "{text}").map_err(|e| format!("writing the capture: {e}"))?;
                n += 1;
                if args.count.is_some_and(|c| n >= c) {
                    break;
                }
            }
        }
    }
    out.flush().map_err(|e| format!("writing the capture: {e}"))?;
    if progress {
        eprintln!("\r{n} events, {}s", started.elapsed().as_secs());
    }
    Ok(n)
}

/// What a capture takes, for the line that says it has started: `tcp-reset events of pod web-1 on
/// port 2049 for 5s`.
fn describe(filter: &TraceFilter, duration: Duration, count: Option<u64>) -> String {
    let probes = if filter.probes.is_empty() { "all".to_string() } else { filter.probes.join(", ") };
    let mut text = format!("{probes} events");
    let conditions = [
        ("of namespace", filter.namespace.clone()),
        ("of pod", filter.pod.clone()),
        ("of container", filter.container.clone()),
        ("of pid", filter.pid.map(|p| p.to_string())),
        ("on port", filter.port.map(|p| p.to_string())),
        ("of server", filter.server.clone()),
    ];
    for (what, value) in conditions {
        if let Some(value) = value {
            text.push_str(&format!(" {what} {value}"));
        }
    }
    text.push_str(&format!(" for {}s", duration.as_secs()));
    if let Some(count) = count {
        text.push_str(&format!(" or {count} events"));
    }
    text + " (Ctrl-C stops)"
}

/// `kstall agent` run for one capture: its own socket, no metrics port to speak of, stopped with
/// SIGTERM on drop — which detaches every program, so nothing stays attached after the capture.
struct StandaloneAgent {
    child: std::process::Child,
    socket: PathBuf,
    dir: PathBuf,
}

impl StandaloneAgent {
    /// Loads only the probes `filter` asks for, and drops other pids and ports in the kernel.
    fn start(filter: &TraceFilter) -> Result<Self, String> {
        let dir = std::env::temp_dir().join(format!("kstall-trace-{}", std::process::id()));
        std::fs::create_dir_all(&dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
        let socket = dir.join("kstall.sock");
        let log = std::fs::File::create(dir.join("agent.log"))
            .map_err(|e| format!("cannot write the agent's log: {e}"))?;
        let exe = std::env::current_exe().map_err(|e| format!("cannot find the kstall binary: {e}"))?;
        let mut command = std::process::Command::new(exe);
        command
            .args(["agent", "--listen", "127.0.0.1:0", "--log-format", "json", "--api-socket"])
            .arg(&socket);
        if !filter.probes.is_empty() {
            command.arg("--probes").arg(filter.probes.join(","));
        }
        // A capture shows every event; it exports no counters, and keeps no incident history.
        command.args(["--sample-events", "all", "--state-dir", "none"]);
        if let Some(pid) = filter.pid {
            command.arg("--capture-pid").arg(pid.to_string());
        }
        if let Some(port) = filter.port {
            command.arg("--capture-port").arg(port.to_string());
        }
        let child = command
            .stdout(std::process::Stdio::null())
            .stderr(log)
            .spawn()
            .map_err(|e| format!("cannot start a standalone agent: {e}"))?;
        let mut agent = StandaloneAgent { child, socket, dir };
        // The agent answers `status` only once its probes are loaded.
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Ok(Some(status)) = agent.child.try_wait() {
                return Err(format!("the standalone agent exited ({status}): {}", agent.last_log_line()));
            }
            if super::status::request::<crate::api::StatusReport>(&agent.socket, &Request::Status).is_ok() {
                return Ok(agent);
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "the standalone agent did not start within 60 s: {}",
                    agent.last_log_line()
                ));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn last_log_line(&self) -> String {
        let log = std::fs::read_to_string(self.dir.join("agent.log")).unwrap_or_default();
        let line = log.lines().last().unwrap_or("no log");
        serde_json::from_str::<Value>(line)
            .ok()
            .and_then(|v| v["fields"]["message"].as_str().map(String::from))
            .unwrap_or_else(|| line.to_string())
    }
}

impl Drop for StandaloneAgent {
    fn drop(&mut self) {
        // SAFETY: signalling our own child.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let deadline = Instant::now() + Duration::from_secs(15);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                let _ = std::fs::remove_dir_all(&self.dir);
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// One aligned line: time (UTC), who, probe, what happened.
pub fn render(e: &Value) -> String {
    let time = e["time_unix_ns"]
        .as_u64()
        .and_then(|t| jiff::Timestamp::from_nanosecond(i128::from(t)).ok())
        .map(|t| t.strftime("%H:%M:%S%.3f").to_string())
        .unwrap_or_default();
    format!("{time:<12}  {:<36}  {:<9}  {}", who(e), e["probe"].as_str().unwrap_or(""), what(e))
}

/// `namespace/pod[/container]`, `host (<unit>)`, `host network`, or the pod UID without metadata.
pub fn who(e: &Value) -> String {
    let s = |k: &str| e[k].as_str().unwrap_or("");
    if !s("pod").is_empty() {
        let container =
            if s("container").is_empty() { String::new() } else { format!("/{}", s("container")) };
        format!("{}/{}{container}", s("namespace"), s("pod"))
    } else if e["host_network"] == true {
        "host network".into()
    } else if e["host"] == true {
        match e["unit"].as_str() {
            Some(unit) => format!("host ({unit})"),
            None => "host".into(),
        }
    } else if let Some(uid) = e["pod_uid"].as_str() {
        format!("pod {uid}")
    } else {
        "-".into()
    }
}

/// The event's own text, as its probe writes it.
fn what(e: &Value) -> String {
    match e["kind"].as_str().and_then(probes::event_kind) {
        Some(kind) => (kind.text)(&probes::kind::Fields(e)),
        // From an agent newer than this kstall: its JSON (`--output json`) has it all.
        None => format!(
            "{} event (no text for it in this kstall version: --output json)",
            e["kind"].as_str().unwrap_or("unknown")
        ),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    const T: u64 = 1_796_013_722_123_000_000;

    /// Golden lines, one per probe: what a person reads at 3 am.
    #[test]
    fn one_line_per_event() {
        let reset = json!({"probe": "tcp-reset", "time_unix_ns": T, "tgid": 0, "pid": 0, "comm": "swapper/1",
            "kind": "tcp_reset", "direction": "sent", "local_addr": "10.55.0.1", "local_port": 15001,
            "remote_addr": "10.0.0.7", "remote_port": 871, "original_dst_addr": "10.55.0.1", "original_dst_port": 2049,
            "reason": "NO_SOCKET", "namespace": "shop", "pod": "web-1", "container": "", "host": false});
        assert_eq!(
            render(&reset),
            "04:42:02.123  shop/web-1                            tcp-reset  sent RST 10.55.0.1:15001 -> 10.0.0.7:871 (dialled 10.55.0.1:2049, redirected) NO_SOCKET"
        );
        // What sampling left out of the stream, said once per series and second.
        let count = json!({"probe": "tcp-reset", "time_unix_ns": T, "tgid": 0, "pid": 0, "comm": "",
            "kind": "tcp_reset_count", "direction": "sent", "port": "15001", "original_port": "2049",
            "reason": "NO_SOCKET", "resets": 5000, "suppressed": 4968, "namespace": "shop", "pod": "web-1",
            "container": "", "host": false});
        assert_eq!(
            render(&count),
            "04:42:02.123  shop/web-1                            tcp-reset  4968 more sent RSTs not shown (5000 counted in 1 s): port 15001 (dialled port 2049, redirected) NO_SOCKET"
        );
        let hung = json!({"probe": "hung-task", "time_unix_ns": T, "tgid": 4242, "pid": 4243, "comm": "java",
            "kind": "hung_task", "blocked_secs": 122, "wait": "nfs", "stack": ["folio_wait_bit+0xd6", "nfs_wb_all+0x2a"],
            "namespace": "shop", "pod": "web-1", "container": "app", "host": false});
        assert_eq!(
            render(&hung),
            "04:42:02.123  shop/web-1/app                        hung-task  hung 122s in nfs 4242/4243 java at folio_wait_bit+0xd6"
        );
        let stuck = json!({"probe": "stuck-task", "time_unix_ns": T, "tgid": 355, "pid": 355, "comm": "python3",
            "kind": "stuck_task", "blocked_secs": 45, "wakeups": 0, "wait": "nfs", "wait_kind": "killable",
            "stack": ["nfs_wb_all+0x25", "do_exit+0x2b1"], "exiting": true,
            "namespace": "shop", "pod": "web-1", "container": "app", "host": false});
        assert_eq!(
            render(&stuck),
            "04:42:02.123  shop/web-1/app                        stuck-task  stuck 45s (killable, 0 wakeups) in nfs 355/355 python3 at nfs_wb_all+0x25 while exiting"
        );
        let newer = json!({"probe": "x", "time_unix_ns": T, "kind": "softirq_stall", "host": true});
        assert!(
            render(&newer)
                .ends_with("softirq_stall event (no text for it in this kstall version: --output json)")
        );
        let cleared = json!({"probe": "hung-task", "time_unix_ns": T, "tgid": 4242, "pid": 4243, "comm": "java",
            "kind": "hung_task_cleared", "why": "exited", "namespace": "", "pod": "", "host": false, "pod_uid": "u-1"});
        assert_eq!(
            render(&cleared),
            "04:42:02.123  pod u-1                               hung-task  no longer hung (exited) 4242/4243 java"
        );
        let oom = json!({"probe": "oom", "time_unix_ns": T, "tgid": 812, "pid": 812, "comm": "kubelet",
            "kind": "oom_kill", "scope": "global", "critical": true, "anon_rss_bytes": 104857600,
            "pod": "", "host": true, "unit": "kubelet.service"});
        assert_eq!(
            render(&oom),
            "04:42:02.123  host (kubelet.service)                oom        OOM kill (global) of 812/812 kubelet rss 100 MiB CRITICAL"
        );
        let kills = json!({"probe": "oom", "time_unix_ns": T, "tgid": 0, "pid": 0, "comm": "python3",
            "kind": "oom_kill_count", "scope": "memcg", "critical": false, "kills": 40,
            "suppressed": 8, "namespace": "batch", "pod": "report-1", "host": false});
        assert_eq!(
            render(&kills),
            "04:42:02.123  batch/report-1                        oom        8 more OOM kills (memcg) of python3 not shown (40 counted in 1 s)"
        );
        let nfs = json!({"probe": "nfs", "time_unix_ns": T, "tgid": 77, "pid": 77, "comm": "kworker/u4:1",
            "kind": "nfs", "what": "socket_connect", "server_addr": "10.55.0.1", "server_port": 2049,
            "error_name": "ECONNREFUSED", "pod": "", "host": true, "host_network": true});
        assert_eq!(
            render(&nfs),
            "04:42:02.123  host network                          nfs        socket_connect server 10.55.0.1:2049 ECONNREFUSED"
        );
        let counted = json!({"probe": "nfs", "time_unix_ns": T, "tgid": 0, "pid": 0, "comm": "",
            "kind": "nfs_count", "what": "socket_connect", "server_addr": "10.55.0.1", "error_name": "ECONNREFUSED",
            "events": 300, "suppressed": 236, "namespace": "shop", "pod": "web-1", "host": false});
        assert_eq!(
            render(&counted),
            "04:42:02.123  shop/web-1                            nfs        236 more socket_connect not shown (300 counted in 1 s): server 10.55.0.1 ECONNREFUSED"
        );
    }

    fn args(extra: &[&str]) -> TraceArgs {
        use clap::Parser as _;
        #[derive(clap::Parser)]
        struct Cli {
            #[command(flatten)]
            trace: TraceArgs,
        }
        Cli::try_parse_from(std::iter::once("trace").chain(extra.iter().copied())).unwrap().trace
    }

    #[test]
    fn the_started_line_says_what_is_captured() {
        let (filter, duration) =
            validate(&args(&["--probe", "tcp-reset", "--pod", "web-1", "--port", "2049", "--count", "3"]))
                .unwrap();
        assert_eq!(
            describe(&filter, duration, Some(3)),
            "tcp-reset events of pod web-1 on port 2049 for 30s or 3 events (Ctrl-C stops)"
        );
        assert_eq!(
            describe(&TraceFilter::default(), Duration::from_secs(5), None),
            "all events for 5s (Ctrl-C stops)"
        );
    }

    #[test]
    fn bad_input_is_one_clear_line() {
        let e = validate(&args(&["--probe", "tcp-reset,oom-kil"])).unwrap_err();
        assert!(e.contains("oom-kil") && e.contains("valid: tcp-reset, hung-task, oom, nfs"), "{e}");
        assert!(validate(&args(&["--duration", "soon"])).unwrap_err().contains("--duration"));
        assert!(validate(&args(&["--count", "0"])).is_err());
        let (filter, duration) =
            validate(&args(&["--port", "2049", "--duration", "5s", "-n", "shop"])).unwrap();
        assert_eq!(
            (filter.port, filter.namespace.as_deref(), duration),
            (Some(2049), Some("shop"), Duration::from_secs(5))
        );
    }
}
