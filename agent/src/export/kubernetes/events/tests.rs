//! The Event writer against the stand-in API server (`crate::fake_api`), which stores what the
//! real one would: the Events as created and merge-patched.

use std::net::SocketAddr;

use serde_json::json;
use tokio::time::timeout;

use super::*;
use crate::fake_api::{ApiServer, ApiState, EventRules, until};

const POD_UID: &str = "3f6c1e2a-9b4d-4c8e-a1f7-5d2b8e0c6a91";

fn pod_incident() -> Incident {
    let mut incident = crate::incidents::tests::incident(None);
    incident.pod = "tenant-api-5d8c7b9f4-q7x2m".into();
    incident.pod_uid = Some(POD_UID.into());
    incident.summary = "NFS to 10.55.0.1:2049 is redirected to 15001 and reset".into();
    incident
}

/// The writer for node-a against `server`, through a kubeconfig as `--kubeconfig` gives, with a
/// short series interval.
struct Running {
    queue: mpsc::Sender<Vec<Incident>>,
    metrics: Arc<Metrics>,
    stop: CancellationToken,
    task: tokio::task::JoinHandle<()>,
    _kubeconfig: tempfile::NamedTempFile,
}

const SERIES_INTERVAL: Duration = Duration::from_millis(500);

impl Running {
    async fn start(addr: SocketAddr) -> Self {
        let kubeconfig = crate::fake_api::kubeconfig(addr);
        let client = crate::attribution::pods::api::client(Some(kubeconfig.path())).await.unwrap();
        let (queue, fired) = mpsc::channel(QUEUE);
        let metrics = Arc::new(Metrics::new(Default::default(), Default::default()));
        let stop = CancellationToken::new();
        let settings = Settings { series_interval: SERIES_INTERVAL, forget_after: Duration::from_secs(600) };
        let task = tokio::spawn(run(client, "node-a".into(), settings, fired, metrics.clone(), stop.clone()));
        Self { queue, metrics, stop, task, _kubeconfig: kubeconfig }
    }

    async fn fire(&self, incidents: Vec<Incident>) {
        self.queue.send(incidents).await.unwrap();
    }

    fn writes(&self, result: &str) -> u64 {
        written(&self.metrics, result)
    }

    async fn stop(self) {
        self.stop.cancel();
        timeout(Duration::from_secs(1), self.task).await.expect("the writer did not stop").unwrap();
    }
}

/// `kstall_kubernetes_writes_total{kind="event",result}` as scraped.
fn written(metrics: &Metrics, result: &str) -> u64 {
    let series = format!("kstall_kubernetes_writes_total{{kind=\"event\",result=\"{result}\"}} ");
    let text = metrics.render();
    text.lines().find_map(|l| l.strip_prefix(series.as_str())?.parse().ok()).unwrap_or(0)
}

async fn server(state: ApiState) -> ApiServer {
    ApiServer::start(SocketAddr::from(([127, 0, 0, 1], 0)), state).await
}

#[test]
fn reasons_are_upper_camel_case_with_acronyms() {
    assert_eq!(reason("nfs-sidecar-redirect"), "NFSSidecarRedirect");
    assert_eq!(reason("pod-termination-blocked"), "PodTerminationBlocked");
    assert_eq!(reason("system-oom"), "SystemOOM");
    assert_eq!(reason("cpu-soft-lockup"), "CPUSoftLockup");
    assert_eq!(reason("nfs-node-wide-stall"), "NFSNodeWideStall");
    assert_eq!(reason("network-policy-drops"), "NetworkPolicyDrops");
    assert_eq!(reason("conntrack-table-full"), "ConntrackTableFull");
    assert_eq!(reason("memory-pressure"), "MemoryPressure");
}

#[test]
fn a_long_note_is_cut_to_the_apis_limit_on_a_character() {
    let mut incident = pod_incident();
    incident.summary = "é".repeat(2000);
    let note = notice(&incident, "node-a").unwrap().note;
    assert!(note.len() <= NOTE_BYTES, "{} bytes", note.len());
    assert!(note.contains("é… (kstall incident "), "the summary is cut, not where to look next: {note}");
    assert!(note.ends_with("; runbook docs/runbooks/nfs-sidecar-redirect.md)"), "{note}");
    // A pod kstall cannot name (no UID) gets no Event.
    incident.pod_uid = None;
    assert_eq!(notice(&incident, "node-a"), None);
}

#[test]
fn a_captured_incident_says_where_its_bundle_is_and_how_to_get_it() {
    let mut incident = pod_incident();
    incident.evidence["capture"] = json!({
        "id": "20261207T031500Z-shop-tenant-api-5d8c-1a2b",
        "path": "/var/lib/kstall/captures/20261207T031500Z-shop-tenant-api-5d8c-1a2b.tar.gz",
        "state": "capturing",
    });
    let note = notice(&incident, "node-a").unwrap().note;
    assert!(
        note.contains(
            "; capture /var/lib/kstall/captures/20261207T031500Z-shop-tenant-api-5d8c-1a2b.tar.gz: \
             kubectl kstall capture get 20261207T031500Z-shop-tenant-api-5d8c-1a2b --node node-a; runbook "
        ),
        "{note}"
    );
    // Skipped: nothing to get.
    incident.evidence["capture"] = json!({"skipped": "capture refused: 2 captures are running on this node"});
    assert!(!notice(&incident, "node-a").unwrap().note.contains("capture"));
}

#[tokio::test]
async fn an_incident_posts_one_event_on_its_pod() {
    let server = server(ApiState::default()).await;
    let writer = Running::start(server.addr).await;
    writer.fire(vec![pod_incident()]).await;
    let event = until("an Event", || server.events().into_iter().next()).await;
    let writes = server.writes();
    assert_eq!(writes.len(), 1, "{writes:?}");
    assert_eq!(
        (writes[0].method.as_str(), writes[0].path.as_str()),
        ("POST", "/apis/events.k8s.io/v1/namespaces/shop/events")
    );
    assert_eq!(
        event["regarding"],
        json!({"apiVersion": "v1", "kind": "Pod", "namespace": "shop", "name": "tenant-api-5d8c7b9f4-q7x2m", "uid": POD_UID})
    );
    assert_eq!(
        (&event["type"], &event["reason"], &event["action"]),
        (&json!("Warning"), &json!("NFSSidecarRedirect"), &json!("Detected"))
    );
    assert_eq!(
        (&event["reportingController"], &event["reportingInstance"]),
        (&json!("kstall"), &json!("kstall-node-a"))
    );
    // Validation of events.k8s.io/v1 on create refuses a set deprecatedSource.
    assert!(event.get("deprecatedSource").is_none(), "{event}");
    let note = event["note"].as_str().unwrap();
    assert!(note.starts_with("NFS to 10.55.0.1:2049 is redirected to 15001 and reset"), "{note}");
    assert!(note.contains("runbook docs/runbooks/nfs-sidecar-redirect.md"), "{note}");
    assert!(event["eventTime"].is_string() && event.get("series").is_none(), "{event}");
    assert_eq!(writer.writes("created"), 1);
    writer.stop().await;
}

#[tokio::test]
async fn fifty_repeats_are_one_event_with_a_count() {
    let server = server(ApiState::default()).await;
    let writer = Running::start(server.addr).await;
    for _ in 0..50 {
        writer.fire(vec![pod_incident()]).await;
    }
    let event =
        until("series.count 50", || server.events().into_iter().find(|e| e["series"]["count"] == 50)).await;
    assert_eq!(server.events().len(), 1, "one Event");
    let writes = server.writes();
    let posts = writes.iter().filter(|w| w.method == "POST").count();
    let patches: Vec<_> = writes.iter().filter(|w| w.method == "PATCH").collect();
    assert_eq!(posts, 1, "{writes:?}");
    assert!(!patches.is_empty() && patches.iter().all(|p| p.body["series"]["lastObservedTime"].is_string()));
    // Rate-limited: a count is patched at most once per series interval, however fast the
    // repeats come (here all 49 within milliseconds).
    for pair in patches.windows(2) {
        assert!(pair[1].at.duration_since(pair[0].at) >= SERIES_INTERVAL, "{patches:?}");
    }
    assert_eq!(event["reason"], "NFSSidecarRedirect");
    writer.stop().await;
}

#[tokio::test]
async fn a_node_wide_incident_posts_on_the_node() {
    let server = server(ApiState::default()).await;
    let writer = Running::start(server.addr).await;
    let mut stall = crate::incidents::tests::incident(None);
    stall.signature = "nfs-node-wide-stall".into();
    (stall.namespace, stall.pod) = (String::new(), String::new());
    writer.fire(vec![stall]).await;
    let event = until("an Event", || server.events().into_iter().next()).await;
    assert_eq!(server.writes()[0].path, "/apis/events.k8s.io/v1/namespaces/kube-system/events");
    assert_eq!(
        event["regarding"],
        json!({"apiVersion": "v1", "kind": "Node", "name": "node-a", "uid": "node-a"})
    );
    assert_eq!(event["reason"], "NFSNodeWideStall");
    writer.stop().await;
}

#[tokio::test]
async fn refused_writes_are_counted_and_the_writer_goes_on() {
    let server = server(ApiState { fail_writes_with: Some(403), ..ApiState::default() }).await;
    let writer = Running::start(server.addr).await;
    writer.fire(vec![pod_incident()]).await;
    until("a forbidden write counted", || (writer.writes("forbidden") == 1).then_some(())).await;
    server.with(|s| s.fail_writes_with = Some(409));
    writer.fire(vec![pod_incident()]).await;
    until("a conflict counted", || (writer.writes("conflict") == 1).then_some(())).await;
    assert!(server.events().is_empty());
    // The API takes writes again: the next occurrence is created.
    server.with(|s| s.fail_writes_with = None);
    writer.fire(vec![pod_incident()]).await;
    until("an Event", || server.events().into_iter().next()).await;
    assert_eq!(writer.writes("created"), 1);
    writer.stop().await;
}

#[tokio::test]
async fn a_full_queue_drops_and_counts() {
    let metrics = Metrics::new(Default::default(), Default::default());
    let (queue, _fired) = mpsc::channel(1);
    offer(&queue, &[pod_incident()], &metrics);
    offer(&queue, &[pod_incident(), pod_incident()], &metrics);
    assert_eq!(written(&metrics, "dropped"), 2);
}

/// Every rule set the API servers apply: the pod's and the node's Events are created, then their
/// series counted, with no write refused.
#[tokio::test]
async fn pod_and_node_events_pass_the_validation_of_1_20_and_of_later_versions() {
    for rules in [EventRules::V1_20, EventRules::Current] {
        let server = server(ApiState { event_rules: rules, ..ApiState::default() }).await;
        let writer = Running::start(server.addr).await;
        let mut stall = crate::incidents::tests::incident(None);
        stall.signature = "nfs-node-wide-stall".into();
        (stall.namespace, stall.pod) = (String::new(), String::new());
        for _ in 0..3 {
            writer.fire(vec![pod_incident(), stall.clone()]).await;
        }
        until("both series at 3", || {
            (server.events().iter().filter(|e| e["series"]["count"] == 3).count() == 2).then_some(())
        })
        .await;
        assert_eq!((writer.writes("created"), writer.writes("rejected")), (2, 0), "{rules:?}");
        writer.stop().await;
    }
}

/// The stand-in refuses what a real 1.20 API server refused of kstall's Events before (HTTP 422,
/// seen on a real cluster): a set deprecatedSource, and an Event about the Node in `default`.
#[test]
fn the_stand_in_refuses_what_a_real_api_server_refused() {
    let event = |namespace: &str, source: bool| {
        let mut event = json!({
            "metadata": {"name": "node-a.1873ab", "namespace": namespace},
            "eventTime": "2026-12-04T12:00:00.000000Z", "type": "Warning", "reason": "NFSNodeWideStall",
            "action": "Detected", "note": "x", "reportingController": "kstall", "reportingInstance": "kstall-node-a",
            "regarding": {"apiVersion": "v1", "kind": "Node", "name": "node-a", "uid": "node-a"},
        });
        if source {
            event["deprecatedSource"] = json!({"component": "kstall", "host": "node-a"});
        }
        event
    };
    let refused = |rules, namespace: &str, source| {
        crate::fake_api::event_create_errors(rules, namespace, &event(namespace, source))
    };
    assert_eq!(refused(EventRules::V1_20, "default", true).len(), 2);
    assert_eq!(refused(EventRules::V1_20, "default", false).len(), 1);
    assert!(refused(EventRules::V1_20, "kube-system", false).is_empty());
    assert!(refused(EventRules::Current, "default", false).is_empty());
    assert_eq!(
        refused(EventRules::Current, "kube-system", true),
        ["source: Invalid value: \"\": needs to be unset"]
    );
}

#[test]
fn names_and_instances_fit_the_apis_limits() {
    let long = "a".repeat(253);
    let name = event_name(&long, Timestamp::now());
    assert!(name.len() <= 253 && name.starts_with("aaa"), "{name}");
    assert_eq!(reporting_instance(&long).len(), 128);
    assert_eq!(reporting_instance("node-a"), "kstall-node-a");
}
