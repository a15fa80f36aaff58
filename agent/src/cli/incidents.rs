//! `kstall incidents`: what fires now (and with `--all`, what resolved recently), with the
//! evidence and the way out, from the running agent.

use std::{path::PathBuf, process::ExitCode};

use super::{EXIT_RUNTIME, status::request};
use crate::{
    api::{IncidentsReport, Request},
    config::DEFAULT_API_SOCKET,
    incidents::{Incident, State, engine::CAPTURE},
};

#[derive(Debug, clap::Args)]
pub struct IncidentsArgs {
    /// Also the incidents that resolved recently.
    #[arg(long)]
    pub all: bool,
    /// text or json.
    #[arg(long, default_value = "text", value_parser = ["text", "json"])]
    pub output: String,
    /// The agent's API socket.
    #[arg(long, env = "KSTALL_API_SOCKET", default_value = DEFAULT_API_SOCKET, value_name = "PATH")]
    pub api_socket: PathBuf,
}

pub fn run(args: IncidentsArgs) -> ExitCode {
    let report: IncidentsReport = match request(&args.api_socket, &Request::Incidents) {
        Ok(report) => report,
        Err(e) => {
            eprintln!("kstall: {e}");
            return ExitCode::from(EXIT_RUNTIME);
        }
    };
    let now = crate::kernel::unix_now_ns();
    let shown: Vec<&Incident> =
        report.incidents.iter().filter(|i| args.all || i.state == State::Firing).collect();
    if args.output == "json" {
        println!("{}", serde_json::to_string_pretty(&shown).expect("serializable"));
    } else {
        print!("{}", render(&shown, report.incidents.len() - shown.len(), now));
    }
    ExitCode::SUCCESS
}

fn time(unix_ns: u64) -> String {
    jiff::Timestamp::from_nanosecond(i128::from(unix_ns))
        .map(|t| t.strftime("%Y-%m-%d %H:%M:%S UTC").to_string())
        .unwrap_or_default()
}

fn ago(now: u64, then: u64) -> String {
    crate::incidents::signatures::human_secs(now.saturating_sub(then) / 1_000_000_000)
}

pub fn render(incidents: &[&Incident], hidden: usize, now: u64) -> String {
    if incidents.is_empty() {
        return match hidden {
            0 => "No incident.\n".to_string(),
            n => format!("No incident firing ({n} resolved recently: kstall incidents --all).\n"),
        };
    }
    let mut out = String::new();
    for i in incidents {
        let who = match (i.pod.is_empty(), i.workload.is_empty()) {
            (true, _) => "node".to_string(),
            (false, true) => format!("{}/{}", i.namespace, i.pod),
            (false, false) => format!("{}/{} ({})", i.namespace, i.pod, i.workload),
        };
        let state = match (i.state, i.resolved_unix_ns) {
            (State::Resolved, Some(at)) => format!("RESOLVED {} ago", ago(now, at)),
            _ => "FIRING".to_string(),
        };
        out.push_str(&format!(
            "{state}  {}  {}  {who}  on {}\n  since {} ({} ago)\n",
            i.severity.as_str().to_uppercase(),
            i.signature,
            i.node,
            time(i.first_seen_unix_ns),
            ago(now, i.first_seen_unix_ns)
        ));
        out.push_str(&wrap(&i.summary, "  "));
        out.push_str(&evidence(&i.evidence));
        out.push_str(&capture(&i.evidence[CAPTURE], &i.node));
        if !i.related.is_empty() {
            out.push_str(&format!("  explained by: {}\n", i.related.join(", ")));
        }
        for fix in &i.remediation.permanent {
            out.push_str(&wrap(&format!("fix: {fix}"), "  "));
        }
        if !i.remediation.break_glass.is_empty() {
            out.push_str("  break glass:\n");
            for (n, step) in i.remediation.break_glass.iter().enumerate() {
                out.push_str(&wrap(&format!("{}. {}", n + 1, step.description), "    "));
                if let Some(command) = &step.command {
                    out.push_str(&format!("       $ {command}\n"));
                }
            }
        }
        out.push_str(&format!("  id: {}\n\n", i.id));
    }
    out
}

/// The incident's capture (`--capture-on`) on a line of its own: where its bundle is and how to
/// fetch it, or why there is none.
fn capture(c: &serde_json::Value, node: &str) -> String {
    if let Some(why) = c["skipped"].as_str() {
        return wrap(&format!("capture: none ({why})"), "  ");
    }
    let (Some(id), Some(state)) = (c["id"].as_str(), c["state"].as_str()) else { return String::new() };
    let path = c["path"].as_str().unwrap_or(id);
    let how = match state {
        "capturing" => match c["until_unix_ns"].as_u64() {
            Some(until) => format!("capturing until {}", &time(until)[11..]),
            None => "capturing".into(),
        },
        "complete" => {
            let mut how = format!(
                "complete, {}, {} packets",
                crate::capture::packets::size(c["bytes"].as_u64().unwrap_or(0)),
                c["packets"].as_u64().unwrap_or(0)
            );
            for cut in c["cut"].as_array().into_iter().flatten().filter_map(|c| c.as_str()) {
                how.push_str(&format!("; {cut}"));
            }
            how
        }
        "failed" => {
            return wrap(&format!("capture: {id} failed: {}", c["error"].as_str().unwrap_or("?")), "  ");
        }
        other => other.to_string(),
    };
    wrap(&format!("capture: {path} ({how})"), "  ")
        + &format!("    $ kubectl kstall capture get {id} --node {node}\n")
}

/// The evidence's scalar facts on one line, then one line per stuck task.
fn evidence(e: &serde_json::Value) -> String {
    let Some(map) = e.as_object() else { return String::new() };
    let mut facts = Vec::new();
    let mut out = String::new();
    for (k, v) in map {
        match v {
            serde_json::Value::Null => {}
            _ if k == CAPTURE => {}
            serde_json::Value::Array(items) if k == "stuck_tasks" => {
                for t in items {
                    let stack: Vec<&str> = t["stack"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .filter_map(|f| f.as_str())
                        .take(4)
                        .collect();
                    out.push_str(&format!(
                        "  stuck: {} pid {} tid {}, {} in {}: {}\n",
                        t["comm"].as_str().unwrap_or("?"),
                        t["pid"],
                        t["tid"],
                        crate::incidents::signatures::human_secs(t["blocked_secs"].as_u64().unwrap_or(0)),
                        t["wait"].as_str().unwrap_or("?"),
                        stack.join(" < ")
                    ));
                }
            }
            serde_json::Value::Array(items) if items.iter().all(|x| !x.is_object()) => {
                let list: Vec<String> =
                    items.iter().map(|x| x.as_str().map_or_else(|| x.to_string(), String::from)).collect();
                facts.push(format!("{k}: {}", list.join(", ")));
            }
            serde_json::Value::Array(items) => facts.push(format!("{k}: {}", items.len())),
            serde_json::Value::Object(_) => facts.push(format!("{k}: {v}")),
            serde_json::Value::String(s) => facts.push(format!("{k}: {s}")),
            other => facts.push(format!("{k}: {other}")),
        }
    }
    let mut line = String::new();
    if !facts.is_empty() {
        line = wrap(&format!("evidence: {}", facts.join(" · ")), "  ");
    }
    line + &out
}

/// Wraps at 100 columns with `indent`.
fn wrap(text: &str, indent: &str) -> String {
    let mut out = String::new();
    let mut line = String::from(indent);
    for word in text.split_whitespace() {
        if line.len() + word.len() + 1 > 100 && !line.trim().is_empty() {
            out.push_str(line.trim_end());
            out.push('\n');
            line = format!("{indent}  ");
        }
        line.push_str(word);
        line.push(' ');
    }
    out.push_str(line.trim_end());
    out.push('\n');
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::incidents::{Remediation, Severity, Step};

    #[test]
    fn readable_at_3am() {
        let now = 1_796_013_722_000_000_000;
        let incident = Incident {
            id: "nfs-sidecar-redirect/node-a/netns-4026532177".into(),
            signature: "nfs-sidecar-redirect".into(),
            severity: Severity::Critical,
            state: State::Firing,
            first_seen_unix_ns: now - 600_000_000_000,
            fired_unix_ns: Some(now - 588_000_000_000),
            last_seen_unix_ns: now,
            resolved_unix_ns: None,
            node: "node-a".into(),
            namespace: "shop".into(),
            pod: "web-1".into(),
            container: String::new(),
            workload: "Deployment/web".into(),
            pod_uid: Some("u-1".into()),
            summary: "Connections from shop/web-1 to NFS server 10.55.0.1:2049 are redirected to local port 15001 where nothing listens, and reset.".into(),
            evidence: serde_json::json!({"server": "10.55.0.1", "nfs_port": 2049, "redirect_ports": [15001], "resets_total": 12,
                "stuck_tasks": [{"comm": "java", "pid": 4242, "tid": 4243, "blocked_secs": 1200, "wait": "nfs",
                                 "stack": ["folio_wait_bit+0xd6", "folio_wait_writeback+0x2a", "nfs_wb_all+0x5b", "nfs4_file_flush+0x6e", "filp_close+0x2f"]}]}),
            remediation: Remediation {
                permanent: vec!["Keep NFS out of the sidecar: traffic.sidecar.istio.io/excludeOutboundPorts: \"2049\".".into()],
                break_glass: vec![Step::new("Check 3: exactly one REDIRECT jump. Must print 1.", Some("nsenter --net=/proc/4242/task/4243/ns/net iptables -t nat -S ISTIO_OUTPUT | grep -c -- '-j ISTIO_REDIRECT'".into()))],
            },
            related: vec![],
        };
        let text = render(&[&incident], 0, now);
        let expected = "\
FIRING  CRITICAL  nfs-sidecar-redirect  shop/web-1 (Deployment/web)  on node-a
  since 2026-11-30 04:32:02 UTC (10 min ago)
  Connections from shop/web-1 to NFS server 10.55.0.1:2049 are redirected to local port 15001 where
    nothing listens, and reset.
  evidence: nfs_port: 2049 · redirect_ports: 15001 · resets_total: 12 · server: 10.55.0.1
  stuck: java pid 4242 tid 4243, 20 min in nfs: folio_wait_bit+0xd6 < folio_wait_writeback+0x2a < nfs_wb_all+0x5b < nfs4_file_flush+0x6e
  fix: Keep NFS out of the sidecar: traffic.sidecar.istio.io/excludeOutboundPorts: \"2049\".
  break glass:
    1. Check 3: exactly one REDIRECT jump. Must print 1.
       $ nsenter --net=/proc/4242/task/4243/ns/net iptables -t nat -S ISTIO_OUTPUT | grep -c -- '-j ISTIO_REDIRECT'
  id: nfs-sidecar-redirect/node-a/netns-4026532177

";
        assert_eq!(text, expected);

        let mut captured = incident.clone();
        let id = "20261130T043214Z-shop-web-1-4026532177-7f3a";
        let path = format!("/var/lib/kstall/captures/{id}.tar.gz");
        captured.evidence["capture"] = serde_json::json!({"id": id, "path": path, "state": "capturing",
            "until_unix_ns": now + 50_000_000_000u64, "filter": "tcp and (host 10.55.0.1 or port 2049)"});
        let text = render(&[&captured], 0, now);
        let lines = format!(
            "nfs4_file_flush+0x6e\n  capture: {path} (capturing\n    until 04:42:52 UTC)\n    $ kubectl kstall capture get {id} --node node-a\n  fix: "
        );
        assert!(text.contains(&lines), "{text}");
        assert!(!text.contains("evidence: capture"), "{text}");
        captured.evidence["capture"] = serde_json::json!({"id": id, "path": path, "state": "complete",
            "bytes": 1_258_291, "packets": 340, "cut": ["packets: the byte cap (1 MiB) was reached"]});
        let text = render(&[&captured], 0, now);
        assert!(
            text.contains(
                "(complete,\n    1.2 MiB, 340 packets; packets: the byte cap (1 MiB) was reached)\n"
            ),
            "{text}"
        );
        captured.evidence["capture"] = serde_json::json!({"skipped": "capture refused: 2 captures are running on this node (--capture-running 2)"});
        let text = render(&[&captured], 0, now);
        assert!(
            text.contains("\n  capture: none (capture refused: 2 captures are running on this node (--capture-running 2))\n"),
            "{text}"
        );

        assert_eq!(
            render(&[], 2, now),
            "No incident firing (2 resolved recently: kstall incidents --all).\n"
        );
    }
}
