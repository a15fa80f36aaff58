//! The condition writer against the stand-in API server (`crate::fake_api`), which applies a
//! status patch as the real one does: a strategic merge merges conditions by type, a plain merge
//! patch would replace the list (and so lose the kubelet's `Ready`).

use std::net::SocketAddr;

use serde_json::{Value, json};
use tokio::time::{sleep, timeout};

use super::*;
use crate::{
    fake_api::{ApiServer, ApiState, until},
    incidents::{
        Settings as IncidentSettings, Severity,
        engine::Engine,
        signatures::tests::{SEC, hung, nfs, node, pod, stuck},
    },
    probes::{nfs::What, wait::WaitClass},
    stuck::TaskState,
};

/// node-a as the kubelet keeps it, with a condition of another owner's next to `Ready`.
fn node_a() -> Value {
    json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": "node-a", "uid": "0b7f3c1e-node"},
        "status": {"conditions": [
            {"type": "Ready", "status": "True", "reason": "KubeletReady",
             "message": "kubelet is posting ready status", "lastHeartbeatTime": "2026-12-01T00:00:00Z",
             "lastTransitionTime": "2026-11-01T00:00:00Z"},
            {"type": "KernelDeadlock", "status": "False", "reason": "KernelHasNoDeadlock",
             "message": "kernel has no deadlock", "lastHeartbeatTime": "2026-12-01T00:00:00Z",
             "lastTransitionTime": "2026-11-01T00:00:00Z"},
        ]}
    })
}

struct Running {
    wanted: watch::Sender<Wanted>,
    metrics: Arc<Metrics>,
    stop: CancellationToken,
    task: tokio::task::JoinHandle<()>,
    _kubeconfig: tempfile::NamedTempFile,
}

impl Running {
    async fn start(addr: SocketAddr, enabled: &[Condition]) -> Self {
        let kubeconfig = crate::fake_api::kubeconfig(addr);
        let client = crate::attribution::pods::api::client(Some(kubeconfig.path())).await.unwrap();
        let (wanted, receiver) = watch::channel(super::wanted(enabled, std::iter::empty()));
        let metrics = Arc::new(Metrics::new(Default::default(), Default::default()));
        let stop = CancellationToken::new();
        let settings = Settings { heartbeat: Duration::from_secs(3600), retry: Duration::from_millis(200) };
        let task =
            tokio::spawn(run(client, "node-a".into(), settings, receiver, metrics.clone(), stop.clone()));
        Self { wanted, metrics, stop, task, _kubeconfig: kubeconfig }
    }

    fn writes(&self, result: &str) -> u64 {
        let series =
            format!("kstall_kubernetes_writes_total{{kind=\"node_condition\",result=\"{result}\"}} ");
        let text = self.metrics.render();
        text.lines().find_map(|l| l.strip_prefix(series.as_str())?.parse().ok()).unwrap_or(0)
    }

    async fn stop(self) {
        self.stop.cancel();
        timeout(Duration::from_secs(1), self.task).await.expect("the writer did not stop").unwrap();
    }
}

/// The condition of `type_` on the stored node-a.
fn condition(server: &ApiServer, type_: &str) -> Option<Value> {
    let node = server.node("node-a")?;
    node["status"]["conditions"].as_array()?.iter().find(|c| c["type"] == type_).cloned()
}

async fn server() -> ApiServer {
    let state = ApiState { nodes: [("node-a".to_string(), node_a())].into(), ..ApiState::default() };
    ApiServer::start(SocketAddr::from(([127, 0, 0, 1], 0)), state).await
}

#[tokio::test]
async fn a_node_wide_stall_sets_nfs_client_stalled_and_its_end_clears_it() {
    let server = server().await;
    let writer = Running::start(server.addr, &[Condition::NfsClientStalled]).await;
    // At start it is there, False, before anything fires.
    let healthy = until("NFSClientStalled False", || condition(&server, "NFSClientStalled")).await;
    assert_eq!((&healthy["status"], &healthy["reason"]), (&json!("False"), &json!("NoNFSClientStall")));

    // Incident 3: two pods' writers stuck in NFS on one server, as the engine finds them.
    let mut engine = Engine::new("node-a".into(), &IncidentSettings::default());
    let (a, b) = (pod("u1", "web-1"), pod("u2", "db-0"));
    engine.observe(&nfs(SEC, What::Timeout, &a));
    let mut stuck =
        stuck(&[hung(2 * SEC, 10, WaitClass::Nfs, 120, &a), hung(3 * SEC, 21, WaitClass::Nfs, 120, &b)]);
    engine.evaluate(4 * SEC, &node(&stuck));
    writer.wanted.send_replace(wanted(&[Condition::NfsClientStalled], engine.firing()));
    let stalled = until("NFSClientStalled True", || {
        condition(&server, "NFSClientStalled").filter(|c| c["status"] == "True")
    })
    .await;
    assert_eq!(stalled["reason"], "NFSNodeWideStall");
    let message = stalled["message"].as_str().unwrap();
    assert!(message.contains("runbook docs/runbooks/nfs-node-wide-stall.md"), "{message}");
    assert!(message.contains("kstall incident nfs-node-wide-stall/node-a/"), "{message}");
    assert_eq!(
        stalled["lastTransitionTime"], stalled["lastHeartbeatTime"],
        "it changed status in that write"
    );

    // The writers finish: the incident resolves, the condition goes back to False.
    stuck.clear(&[((10, 10), TaskState::Other), ((21, 21), TaskState::Other)], 5 * SEC);
    let changes = engine.evaluate(6 * SEC, &node(&stuck));
    assert_eq!(changes.resolved.len(), 1, "{changes:?}");
    writer.wanted.send_replace(wanted(&[Condition::NfsClientStalled], engine.firing()));
    let cleared = until("NFSClientStalled False again", || {
        condition(&server, "NFSClientStalled").filter(|c| c["status"] == "False")
    })
    .await;
    assert_eq!(cleared["reason"], "NoNFSClientStall");

    // Nothing kstall does not own was touched, and only the enabled condition was written.
    let original = node_a();
    for owned_by_others in ["Ready", "KernelDeadlock"] {
        let before = original["status"]["conditions"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["type"] == owned_by_others);
        assert_eq!(condition(&server, owned_by_others).as_ref(), before, "{owned_by_others}");
    }
    assert!(
        condition(&server, "KernelSystemOOM").is_none() && condition(&server, "KubeletDegraded").is_none()
    );
    let writes = server.writes();
    assert!(
        writes.iter().all(|w| w.path == "/api/v1/nodes/node-a/status"
            && w.content_type == "application/strategic-merge-patch+json"),
        "{writes:?}"
    );
    let all = writes.len() as u64;
    until("every write counted", || (writer.writes("patched") == all).then_some(())).await;
    writer.stop().await;
}

#[tokio::test]
async fn a_message_alone_waits_for_the_heartbeat() {
    let server = server().await;
    let writer = Running::start(server.addr, &[Condition::KernelSystemOom]).await;
    until("KernelSystemOOM written", || condition(&server, "KernelSystemOOM")).await;
    let mut oom = crate::incidents::tests::incident(None);
    (oom.signature, oom.id, oom.summary) =
        ("system-oom".into(), "system-oom/node-a/node".into(), "1 system OOM".into());
    writer.wanted.send_replace(wanted(&[Condition::KernelSystemOom], std::iter::once(&oom)));
    until("KernelSystemOOM True", || condition(&server, "KernelSystemOOM").filter(|c| c["status"] == "True"))
        .await;
    let written = server.writes().len();
    // Only the count in the summary changes: no write before the heartbeat (an hour here).
    oom.summary = "2 system OOMs".into();
    writer.wanted.send_replace(wanted(&[Condition::KernelSystemOom], std::iter::once(&oom)));
    sleep(Duration::from_millis(1500)).await;
    assert_eq!(server.writes().len(), written);
    assert_eq!(condition(&server, "KernelSystemOOM").unwrap()["reason"], "SystemOOM");
    writer.stop().await;
}

#[tokio::test]
async fn refused_status_patches_are_counted_and_tried_again() {
    let server = server().await;
    server.with(|s| s.fail_writes_with = Some(403));
    let writer = Running::start(server.addr, &Condition::ALL).await;
    until("a forbidden write counted", || (writer.writes("forbidden") >= 1).then_some(())).await;
    server.with(|s| s.fail_writes_with = Some(409));
    until("a conflict counted", || (writer.writes("conflict") >= 1).then_some(())).await;
    assert!(condition(&server, "KubeletDegraded").is_none());
    server.with(|s| s.fail_writes_with = None);
    let degraded = until("KubeletDegraded written", || condition(&server, "KubeletDegraded")).await;
    assert_eq!((&degraded["status"], &degraded["reason"]), (&json!("False"), &json!("KubeletHealthy")));
    assert!(
        condition(&server, "NFSClientStalled").is_some() && condition(&server, "KernelSystemOOM").is_some()
    );
    until("the write counted", || (writer.writes("patched") == 1).then_some(())).await;
    writer.stop().await;
}

#[test]
fn the_most_severe_incident_of_a_signature_sets_its_condition() {
    let mut warning = crate::incidents::tests::incident(None);
    (warning.signature, warning.id, warning.severity, warning.summary) =
        ("system-oom".into(), "system-oom/node-a/node".into(), Severity::Warning, "a worker".into());
    let mut critical = warning.clone();
    (critical.severity, critical.summary, critical.first_seen_unix_ns) =
        (Severity::Critical, "the kubelet".into(), warning.first_seen_unix_ns + 1);
    let redirect = crate::incidents::tests::incident(None);
    let w = wanted(
        &[Condition::KernelSystemOom, Condition::NfsClientStalled],
        [&warning, &critical, &redirect].into_iter(),
    );
    let cause = w.0[&Condition::KernelSystemOom].as_ref().unwrap();
    assert_eq!(cause.reason, "SystemOOM");
    assert!(
        cause.message.starts_with("the kubelet (kstall incident system-oom/node-a/node; "),
        "{}",
        cause.message
    );
    assert_eq!(w.0[&Condition::NfsClientStalled], None, "a redirect is not a node-wide stall");
    assert_eq!(w.0.len(), 2, "only the enabled conditions");
    assert_eq!(Condition::parse("KubeletDegraded"), Some(Condition::KubeletDegraded));
    assert_eq!(Condition::parse("kubeletdegraded"), None);
}
