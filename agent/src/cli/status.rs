//! `kstall status`: every probe, loaded or not and why, from the running agent.

use std::{
    io::{BufRead as _, BufReader, Write as _},
    os::unix::net::UnixStream,
    path::PathBuf,
    process::ExitCode,
    time::Duration,
};

use super::EXIT_RUNTIME;
use crate::{
    api::{ErrorReply, Request, StatusReport},
    config::DEFAULT_API_SOCKET,
};

#[derive(Debug, clap::Args)]
pub struct StatusArgs {
    /// The agent's API socket.
    #[arg(long, env = "KSTALL_API_SOCKET", default_value = DEFAULT_API_SOCKET, value_name = "PATH")]
    pub api_socket: PathBuf,
    /// text or json.
    #[arg(long, default_value = "text", value_parser = ["text", "json"])]
    pub output: String,
}

pub fn run(args: StatusArgs) -> ExitCode {
    match fetch(&args.api_socket) {
        Ok(report) => {
            if args.output == "json" {
                println!("{}", serde_json::to_string_pretty(&report).expect("serializable"));
            } else {
                print!("{}", render(&report));
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("kstall: {e}");
            ExitCode::from(EXIT_RUNTIME)
        }
    }
}

fn fetch(socket: &PathBuf) -> Result<StatusReport, String> {
    request(socket, &Request::Status)
}

/// The one line for an agent that cannot be reached, saying how to start one.
pub fn unreachable(socket: &std::path::Path, e: std::io::Error) -> String {
    format!(
        "cannot reach the agent at {} ({e}); start it with `kstall agent` (or `cargo xtask run`)",
        socket.display()
    )
}

/// One request to the agent and its one-document answer.
pub fn request<T: serde::de::DeserializeOwned>(socket: &PathBuf, what: &Request) -> Result<T, String> {
    let unreachable = |e| unreachable(socket, e);
    let mut stream = UnixStream::connect(socket).map_err(unreachable)?;
    stream.set_read_timeout(Some(Duration::from_secs(5))).map_err(unreachable)?;
    let mut line = serde_json::to_vec(what).expect("serializable");
    line.push(b'\n');
    stream.write_all(&line).map_err(unreachable)?;
    let mut line = String::new();
    BufReader::new(stream).read_line(&mut line).map_err(|e| match e.kind() {
        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut => format!(
            "the agent at {} did not answer within 5 s (still starting? see its log)",
            socket.display()
        ),
        _ => unreachable(e),
    })?;
    if let Ok(err) = serde_json::from_str::<ErrorReply>(&line) {
        return Err(format!("the agent refused the request: {}", err.error));
    }
    serde_json::from_str(&line).map_err(|e| format!("unexpected answer from the agent: {e}"))
}

fn render(report: &StatusReport) -> String {
    let mut out = format!(
        "kstall {} · kernel {} · up {}s\n\n{:<12} {:<6} {:>10} {:>8} {:>10}  HOOK / REASON\n",
        report.version, report.kernel, report.uptime_secs, "PROBE", "STATE", "EVENTS", "LOST", "SUPPRESSED"
    );
    for p in &report.probes {
        let s = &p.status;
        let (state, detail) = if s.up {
            ("up", s.hook.clone().unwrap_or_default())
        } else {
            ("down", s.reason.clone().unwrap_or_default())
        };
        out.push_str(&format!(
            "{:<12} {:<6} {:>10} {:>8} {:>10}  {detail}\n",
            s.name, state, p.events, p.lost, p.suppressed
        ));
        for note in &s.notes {
            out.push_str(&format!("{:<12} {:<6} {:>10} {:>8} {:>10}  {note}\n", "", "", "", "", ""));
        }
        for missing in &s.unavailable {
            out.push_str(&format!(
                "{:<12} {:<6} {:>10} {:>8} {:>10}  unavailable: {} ({})\n",
                "", "", "", "", "", missing.field, missing.why
            ));
        }
    }
    let a = &report.attribution;
    let state = match (&a.source.error, a.source.up) {
        (Some(error), _) => format!("down: {error}"),
        (None, true) => "up".to_string(),
        (None, false) => "starting".to_string(),
    };
    out.push_str(&format!(
        "\nPODS  source {} ({state})\n      {} pods known, {} deleted kept for {}s · {} cgroups · {} pod network namespaces",
        a.source.source, a.pods, a.deleted_pods, a.retention_secs, a.cgroups, a.pod_namespaces
    ));
    if a.v1_pod_processes > 0 {
        out.push_str(&format!(" · {} processes in v1 pod cgroups", a.v1_pod_processes));
    }
    out.push('\n');
    let node = &report.node;
    if !node.conntrack.is_empty() {
        out.push_str(&format!("\nNODE  conntrack  {}\n      pressure   {}\n", node.conntrack, node.pressure));
    }
    if !report.cost.programs.is_empty() {
        let cost = &report.cost;
        out.push_str(&format!(
            "\nCOST  programs     {}\n      ring buffer  {}\n",
            cost.programs, cost.ring_buffer
        ));
    }
    let checks = [
        ("healthz", &report.kubelet.healthz, "--kubelet-healthz"),
        ("tls", &report.kubelet.tls, "--kubelet-server"),
    ];
    if checks.iter().any(|(_, c, _)| c.is_some()) {
        out.push_str("\nKUBELET\n");
    }
    for (name, check, flag) in checks {
        let Some(check) = check else { continue };
        let result = match (&check.error, check.passed_once) {
            (None, _) => "ok".to_string(),
            (Some(e), true) => format!("failing: {e}"),
            (Some(e), false) => format!("never passed since start (a wrong address? {flag}): {e}"),
        };
        out.push_str(&format!("      {name:<8} {}  {result}\n", check.target));
    }
    if !report.series.is_empty() {
        out.push_str(&format!("\n{:<42} {:>8} {:>8} {:>10}\n", "SERIES", "NOW", "MAX", "DROPPED"));
        for f in &report.series {
            out.push_str(&format!("{:<42} {:>8} {:>8} {:>10}\n", f.metric, f.series, f.max, f.dropped));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        api::ProbeReport,
        probes::plan::{ProbeStatus, Unavailable},
    };

    #[test]
    fn lists_up_and_down_probes_with_hook_or_reason() {
        let report = StatusReport {
            version: "0.1.0".into(),
            kernel: "6.18.44".into(),
            uptime_secs: 3,
            probes: vec![
                ProbeReport {
                    status: ProbeStatus {
                        name: "tcp-reset".into(),
                        up: true,
                        hook: Some("tp_btf/tcp_send_reset".into()),
                        reason: None,
                        notes: vec!["original destination: conntrack (vmlinux BTF)".into()],
                        unavailable: vec![Unavailable::new("reason", "no reason before 6.10")],
                    },
                    events: 12,
                    lost: 0,
                    suppressed: 3400,
                },
                ProbeReport {
                    status: ProbeStatus {
                        name: "other".into(),
                        up: false,
                        hook: None,
                        reason: Some("BTF has no tracepoint x".into()),
                        notes: vec![],
                        unavailable: vec![],
                    },
                    events: 0,
                    lost: 0,
                    suppressed: 0,
                },
            ],
            attribution: crate::api::AttributionReport {
                source: crate::attribution::pods::SourceHealth {
                    source: "api (node node-a)".into(),
                    up: false,
                    error: Some("tcp connect error: Connection refused".into()),
                },
                pods: 31,
                deleted_pods: 2,
                retention_secs: 3600,
                cgroups: 412,
                pod_namespaces: 29,
                v1_pod_processes: 0,
            },
            series: vec![crate::export::series::FamilySeries {
                metric: "kstall_tcp_resets_total".into(),
                series: 5000,
                max: 5000,
                dropped: 1042,
            }],
            kubelet: crate::kubelet::Health {
                healthz: Some(check("http://127.0.0.1:10248/healthz", None, true)),
                tls: Some(check("198.51.100.10:10250", Some("connection refused"), false)),
            },
            node: crate::api::NodeSignals {
                conntrack: "nf_conntrack_max 262144; 3 tables read (the node's and 2 pods')".into(),
                pressure: "the node's; pods' unavailable: no cgroup v2 hierarchy (PSI is kept per cgroup v2)"
                    .into(),
            },
            cost: crate::api::AgentCost {
                programs: "not counted: kernel.bpf_stats_enabled=0".into(),
                ring_buffer: "0.0 KiB of 1024 KiB unread".into(),
            },
        };
        let text = render(&report);
        assert!(
            text.contains("\nCOST  programs     not counted: kernel.bpf_stats_enabled=0\n      ring buffer  0.0 KiB of 1024 KiB unread\n"),
            "{text}"
        );
        assert!(
            text.contains("\nNODE  conntrack  nf_conntrack_max 262144; 3 tables read (the node's and 2 pods')\n      pressure   the node's; pods' unavailable: no cgroup v2 hierarchy"),
            "{text}"
        );
        assert!(
            text.contains("tcp-reset    up             12        0       3400  tp_btf/tcp_send_reset"),
            "{text}"
        );
        assert!(text.contains("original destination: conntrack"), "{text}");
        assert!(text.contains("  unavailable: reason (no reason before 6.10)\n"), "{text}");
        assert!(
            text.contains("other        down            0        0          0  BTF has no tracepoint x"),
            "{text}"
        );
        assert!(
            text.contains("source api (node node-a) (down: tcp connect error: Connection refused)"),
            "{text}"
        );
        assert!(text.contains("31 pods known, 2 deleted kept for 3600s"), "{text}");
        assert!(
            text.contains("kstall_tcp_resets_total                        5000     5000       1042\n"),
            "{text}"
        );
        assert!(text.contains("\nKUBELET\n      healthz  http://127.0.0.1:10248/healthz  ok\n"), "{text}");
        assert!(
            text.contains("      tls      198.51.100.10:10250  never passed since start (a wrong address? --kubelet-server): connection refused\n"),
            "{text}"
        );
    }

    fn check(target: &str, error: Option<&str>, passed_once: bool) -> crate::kubelet::Check {
        serde_json::from_value(serde_json::json!({
            "target": target, "error": error, "checked_unix_ns": 1, "passed_once": passed_once,
        }))
        .unwrap()
    }

    #[test]
    fn unreachable_socket_says_how_to_start_the_agent() {
        let err = fetch(&PathBuf::from("/nonexistent/kstall.sock")).unwrap_err();
        assert!(err.contains("kstall agent"), "{err}");
        assert!(!err.contains('\n'));
    }
}
