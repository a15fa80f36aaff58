//! `kstall explain pod <name|uid>`: everything the agent knows about one pod now, and the next
//! step.

use std::{path::PathBuf, process::ExitCode};

use super::{EXIT_RUNTIME, status::request};
use crate::{
    api::{Request, explain::PodExplanation, nfs_mesh::NfsThroughMesh},
    config::DEFAULT_API_SOCKET,
    incidents::signatures::human_secs,
};

#[derive(Debug, clap::Args)]
pub struct ExplainArgs {
    #[command(subcommand)]
    pub what: What,
}

#[derive(Debug, clap::Subcommand)]
pub enum What {
    /// Its cgroups and network namespaces, stuck tasks and their stacks, resets, NFS servers,
    /// OOM kills, incidents, whether its mesh's NAT rules redirect its NFS connections (read from
    /// the pod's network namespace), and what to do next.
    Pod {
        /// The pod's name or UID.
        pod: String,
        #[arg(long, short = 'n')]
        namespace: Option<String>,
        /// text or json.
        #[arg(long, default_value = "text", value_parser = ["text", "json"])]
        output: String,
        /// The agent's API socket.
        #[arg(long, env = "KSTALL_API_SOCKET", default_value = DEFAULT_API_SOCKET, value_name = "PATH")]
        api_socket: PathBuf,
    },
}

pub fn run(args: ExplainArgs) -> ExitCode {
    let What::Pod { pod, namespace, output, api_socket } = args.what;
    let explanation: PodExplanation = match request(&api_socket, &Request::ExplainPod { pod, namespace }) {
        Ok(x) => x,
        Err(e) => {
            eprintln!("kstall: {e}");
            return ExitCode::from(EXIT_RUNTIME);
        }
    };
    if output == "json" {
        println!("{}", serde_json::to_string_pretty(&explanation).expect("serializable"));
    } else {
        print!("{}", render(&explanation));
    }
    ExitCode::SUCCESS
}

pub fn render(x: &PodExplanation) -> String {
    let mut out = format!("POD {}/{}  uid {}", x.namespace, x.pod, x.pod_uid);
    for extra in [Some(x.workload.as_str()).filter(|w| !w.is_empty()), x.qos.as_deref(), x.phase.as_deref()]
        .into_iter()
        .flatten()
    {
        out.push_str(&format!("  {extra}"));
    }
    out.push('\n');
    for (name, id) in &x.containers {
        let name = if name.is_empty() { "?" } else { name };
        out.push_str(&format!("  container {name}  {}\n", &id[..id.len().min(12)]));
    }
    let ids: Vec<String> = x.cgroup_ids.iter().map(u64::to_string).collect();
    let netns: Vec<String> = x.netns.iter().map(u32::to_string).collect();
    out.push_str(&format!(
        "  cgroups {}  netns {}\n",
        ids.join(" "),
        if netns.is_empty() { "-".into() } else { netns.join(" ") }
    ));
    if x.stuck_tasks.is_empty() {
        out.push_str("STUCK TASKS  none\n");
    } else {
        out.push_str("STUCK TASKS\n");
        for t in &x.stuck_tasks {
            let blocked = t.blocked_secs.map(human_secs).unwrap_or_else(|| "?".into());
            let killable = if t.wait_kind == "killable" { " (killable)" } else { "" };
            out.push_str(&format!(
                "  {} pid {} tid {}  {blocked} in {}{killable}\n",
                t.comm, t.pid, t.tid, t.wait
            ));
            for frame in &t.stack {
                out.push_str(&format!("      {frame}\n"));
            }
        }
    }
    out.push_str(if x.activity.is_empty() { "ACTIVITY  none\n" } else { "ACTIVITY\n" });
    for line in &x.activity {
        out.push_str(&format!("  {line}\n"));
    }
    out.push_str(if x.incidents.is_empty() { "INCIDENTS  none\n" } else { "INCIDENTS\n" });
    for i in &x.incidents {
        let state = if i.state == crate::incidents::State::Firing { "FIRING" } else { "resolved" };
        out.push_str(&format!("  {state}  {}  {}  {}\n", i.severity.as_str(), i.signature, i.id));
    }
    if let Some(mesh) = x.nfs_through_mesh.as_ref().filter(|m| !m.mesh.is_empty()) {
        out.push_str(&render_mesh(mesh));
    }
    out.push_str(&format!("NEXT  {}\n", x.next_step));
    out
}

/// What the pod's rules do to its NFS connections; the notes only when it matters that
/// something was not looked at (nothing is redirected, or kstall cannot tell).
fn render_mesh(m: &NfsThroughMesh) -> String {
    let mut out = format!("MESH  {}\n  NFS through the mesh: {}\n", m.mesh.join(" + "), m.summary);
    let mut read = Vec::new();
    if !m.rules_from.is_empty() {
        read.push(format!("nat rules from {}", m.rules_from.join(", ")));
    }
    if !m.servers.is_empty() {
        read.push(format!("NFS servers {} (the pod's mounts)", m.servers.join(", ")));
    }
    if !read.is_empty() {
        out.push_str(&format!("  {}\n", read.join("; ")));
    }
    if m.redirected != Some(true) {
        for note in &m.notes {
            out.push_str(&format!("  note: {note}\n"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::explain::StuckTaskNow;

    #[test]
    fn one_screen_per_pod() {
        let x = PodExplanation {
            namespace: "shop".into(),
            pod: "web-1".into(),
            pod_uid: "0c2a5b1e-7f3d-4c1a-9e8b-1234567890ab".into(),
            workload: "Deployment/web".into(),
            qos: Some("burstable".into()),
            phase: Some("terminating".into()),
            containers: vec![("app".into(), "4f1a2b3c4d5e6f708192a3b4c5d6e7f8".into())],
            cgroup_ids: vec![7001, 7002],
            netns: vec![4026532999],
            stuck_tasks: vec![StuckTaskNow {
                pid: 4242,
                tid: 4243,
                comm: "java".into(),
                wait: "nfs".into(),
                wait_kind: "uninterruptible".into(),
                sources: vec!["stuck-task".into(), "hung-task".into()],
                blocked_secs: Some(1200),
                blocked_since_unix_ns: 1_796_000_000_000_000_000,
                stack: vec!["folio_wait_bit+0xd6".into(), "nfs_wb_all+0x5b".into()],
            }],
            activity: vec![r#"kstall_tcp_resets_total{direction="sent",original_port="2049",port="15001",reason="NO_SOCKET"} 12"#.into()],
            incidents: vec![],
            next_step: "Task java (pid 4242 tid 4243) is stuck in nfs: read its stack below; it cannot be killed, only unblocked.".into(),
            nfs_through_mesh: Some(NfsThroughMesh::no_mesh()),
        };
        let expected = "\
POD shop/web-1  uid 0c2a5b1e-7f3d-4c1a-9e8b-1234567890ab  Deployment/web  burstable  terminating
  container app  4f1a2b3c4d5e
  cgroups 7001 7002  netns 4026532999
STUCK TASKS
  java pid 4242 tid 4243  20 min in nfs
      folio_wait_bit+0xd6
      nfs_wb_all+0x5b
ACTIVITY
  kstall_tcp_resets_total{direction=\"sent\",original_port=\"2049\",port=\"15001\",reason=\"NO_SOCKET\"} 12
INCIDENTS  none
NEXT  Task java (pid 4242 tid 4243) is stuck in nfs: read its stack below; it cannot be killed, only unblocked.
";
        assert_eq!(render(&x), expected);
    }

    /// A meshed pod's line says what its rules do to NFS; the notes only when nothing is said to
    /// be redirected (then what was not looked at matters).
    #[test]
    fn a_meshed_pod_gets_its_nfs_line() {
        let mut mesh = NfsThroughMesh {
            mesh: vec!["linkerd".into()],
            redirected: Some(false),
            summary: "not redirected — 2049 excluded by -A PROXY_INIT_OUTPUT … -j RETURN".into(),
            rules_from: vec!["iptables-nft".into()],
            servers: vec!["10.55.0.1".into()],
            notes: vec!["nft is not installed where the agent runs".into()],
            ..Default::default()
        };
        assert_eq!(
            render_mesh(&mesh),
            "MESH  linkerd\n  NFS through the mesh: not redirected — 2049 excluded by -A PROXY_INIT_OUTPUT … -j \
             RETURN\n  nat rules from iptables-nft; NFS servers 10.55.0.1 (the pod's mounts)\n  note: nft is not \
             installed where the agent runs\n"
        );
        mesh.redirected = Some(true);
        assert!(!render_mesh(&mesh).contains("note:"));
        let x = PodExplanation { nfs_through_mesh: Some(mesh), ..Default::default() };
        assert!(render(&x).contains("INCIDENTS  none\nMESH  linkerd\n"), "{}", render(&x));
        let x = PodExplanation { nfs_through_mesh: Some(NfsThroughMesh::no_mesh()), ..Default::default() };
        assert!(!render(&x).contains("MESH"));
    }
}
