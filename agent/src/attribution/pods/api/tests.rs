//! The watcher against a stand-in API server (`crate::fake_api`): lists, watch events, expiry,
//! restarts, failures with backoff, and a missing kubeconfig.

use std::{
    net::SocketAddr,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use serde_json::{Value, json};
use tokio::{
    task::JoinHandle,
    time::{sleep, timeout},
};

use super::*;
use crate::{
    attribution::pods::tests::pod_json,
    fake_api::{ApiServer, ApiState, status},
};

const UID_A: &str = "3f6c1e2a-9b4d-4c8e-a1f7-5d2b8e0c6a91";
const UID_B: &str = "8a2d4f6b-1c3e-4e5a-9b7d-0f2e4c6a8b13";
const UID_C: &str = "c5e7a9b1-3d5f-4a7c-8e9a-b1c3d5e7f902";
const UID_D: &str = "e1f3a5c7-9b2d-4f6e-8a0c-2e4a6c8e0b24";

fn labels() -> Vec<String> {
    vec!["app".into(), "team".into()]
}

/// A pod of node-a with one container whose id is 64 hex digits, as containerd's are.
fn pod(uid: &str, name: &str) -> Value {
    let hex = uid.replace('-', "");
    pod_json(uid, name, &format!("{hex}{hex}"))
}

fn meta(pod: &Value) -> PodMeta {
    PodMeta::from_pod(&serde_json::from_value(pod.clone()).unwrap(), &labels()).unwrap()
}

fn snapshot(pods: &[&Value]) -> PodUpdate {
    PodUpdate::Snapshot(pods.iter().map(|p| meta(p)).collect())
}

/// The tracing output, to count warnings.
#[derive(Clone, Default)]
struct Logs(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Logs {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Logs {
    /// Captures this thread's INFO and above; the tests run on a current-thread runtime.
    fn capture() -> (Self, tracing::subscriber::DefaultGuard) {
        let logs = Logs::default();
        let writer = logs.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(move || writer.clone())
            .with_ansi(false)
            .with_max_level(tracing::Level::INFO)
            .finish();
        (logs, tracing::subscriber::set_default(subscriber))
    }

    /// Our lines (kube logs too) at `level`.
    fn ours(&self, level: &str) -> Vec<String> {
        let text = String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned();
        let prefix = format!("{level} {}:", module_path!().trim_end_matches("::tests"));
        text.lines().filter(|l| l.contains(&prefix)).map(str::to_string).collect()
    }
}

/// `watch_pods` for node-a against `server`, through a kubeconfig file as `--kubeconfig` gives.
struct Agent {
    updates: mpsc::Receiver<PodUpdate>,
    stop: CancellationToken,
    task: JoinHandle<()>,
    _kubeconfig: tempfile::NamedTempFile,
}

impl Agent {
    async fn start(addr: SocketAddr) -> Self {
        let kubeconfig = crate::fake_api::kubeconfig(addr);
        let client = client(Some(kubeconfig.path())).await.unwrap();
        let (tx, updates) = mpsc::channel(16);
        let stop = CancellationToken::new();
        let health = Health::new("api".into(), false);
        let task = tokio::spawn(watch_pods(client, "node-a".into(), labels(), tx, health, stop.clone()));
        Self { updates, stop, task, _kubeconfig: kubeconfig }
    }

    async fn next(&mut self, within: Duration) -> PodUpdate {
        timeout(within, self.updates.recv())
            .await
            .unwrap_or_else(|_| panic!("no pod update within {within:?}"))
            .expect("watch_pods ended")
    }

    /// Stops it and checks that it returns promptly.
    async fn stop(self) {
        self.stop.cancel();
        timeout(Duration::from_secs(1), self.task).await.expect("watch_pods did not stop").unwrap();
    }
}

const SOON: Duration = Duration::from_secs(10);

async fn server(pods: Vec<Value>, resource_version: u64) -> ApiServer {
    let addr = SocketAddr::from(([127, 0, 0, 1], 0));
    ApiServer::start(addr, ApiState { pods, resource_version, ..Default::default() }).await
}

#[tokio::test]
async fn the_list_is_one_snapshot_of_the_node_pods() {
    let (a, b) = (pod(UID_A, "web-5d8c7b9f4-x2x9z"), pod(UID_B, "web-5d8c7b9f4-k7q2m"));
    let mut no_uid = pod(UID_C, "ghost");
    no_uid["metadata"].as_object_mut().unwrap().remove("uid");
    let server = server(vec![a.clone(), no_uid, b.clone()], 10).await;
    let mut agent = Agent::start(server.addr).await;

    let update = agent.next(SOON).await;
    assert_eq!(update, snapshot(&[&a, &b]));
    let PodUpdate::Snapshot(pods) = update else { unreachable!() };
    assert_eq!(pods[0].workload, "Deployment/web");
    assert_eq!(pods[0].labels.get("team").map(String::as_str), Some("storage"));
    let id = format!("{0}{0}", UID_A.replace('-', ""));
    assert_eq!(pods[0].containers.get(&id).map(String::as_str), Some("app"));

    server.wait_for_watch().await;
    let requests = server.requests();
    let selector = "fieldSelector=spec.nodeName%3Dnode-a";
    assert!(requests[0].starts_with("/api/v1/pods?") && !requests[0].contains("watch="), "{requests:?}");
    assert!(requests[0].contains(selector), "{requests:?}");
    let watch = requests.iter().find(|r| r.contains("watch=true")).expect("a watch request");
    assert!(watch.contains(selector) && watch.contains("resourceVersion=10"), "{watch}");
    agent.stop().await;
}

#[tokio::test]
async fn watch_events_become_upserts_and_deletes() {
    let (a, c) = (pod(UID_A, "web-5d8c7b9f4-x2x9z"), pod(UID_C, "web-5d8c7b9f4-p4n8w"));
    let server = server(vec![a.clone()], 10).await;
    let mut agent = Agent::start(server.addr).await;
    assert_eq!(agent.next(SOON).await, snapshot(&[&a]));
    server.wait_for_watch().await;

    // Neither a bookmark nor a pod without a UID is an update.
    server.event("BOOKMARK", json!({"kind": "Pod", "apiVersion": "v1", "metadata": {}}));
    let mut no_uid = pod(UID_D, "ghost");
    no_uid["metadata"].as_object_mut().unwrap().remove("uid");
    server.event("ADDED", no_uid);
    server.event("ADDED", c.clone());
    assert_eq!(agent.next(SOON).await, PodUpdate::Upsert(Box::new(meta(&c))));

    let mut terminating = a.clone();
    terminating["metadata"]["deletionTimestamp"] = "2025-01-07T10:00:00Z".into();
    server.event("MODIFIED", terminating.clone());
    let PodUpdate::Upsert(modified) = agent.next(SOON).await else { panic!("not an upsert") };
    assert!(modified.terminating() && modified.uid == UID_A);
    assert_eq!(*modified, meta(&terminating));

    server.event("DELETED", c);
    assert_eq!(agent.next(SOON).await, PodUpdate::Delete { uid: UID_C.into() });

    // Nobody listens any more: the next update ends it.
    let Agent { updates, task, .. } = agent;
    drop(updates);
    server.event("ADDED", pod(UID_D, "web-5d8c7b9f4-z9z9z"));
    timeout(SOON, task).await.expect("watch_pods kept running without a receiver").unwrap();
}

#[tokio::test]
async fn an_expired_watch_lists_again() {
    let (a, b, c, d) = (
        pod(UID_A, "web-5d8c7b9f4-x2x9z"),
        pod(UID_B, "web-5d8c7b9f4-k7q2m"),
        pod(UID_C, "web-5d8c7b9f4-p4n8w"),
        pod(UID_D, "web-5d8c7b9f4-z9z9z"),
    );
    let server = server(vec![a.clone(), b.clone()], 10).await;
    let mut agent = Agent::start(server.addr).await;
    assert_eq!(agent.next(SOON).await, snapshot(&[&a, &b]));
    server.wait_for_watch().await;

    // The API server's way: an ERROR event in the watch stream; "a" went while we missed it.
    server.with(|s| {
        (s.pods, s.resource_version, s.oldest_version) = (vec![b.clone(), c.clone()], 20, 20);
    });
    let gone = status(410, "Expired", "too old resource version: 10 (20)");
    server.send_line(json!({"type": "ERROR", "object": gone}).to_string());
    assert_eq!(agent.next(SOON).await, snapshot(&[&b, &c]));
    server.wait_for_watch().await;

    // A watch request answered with HTTP 410 after the stream ended.
    server.with(|s| {
        (s.pods, s.resource_version, s.oldest_version) = (vec![c.clone(), d.clone()], 30, 30);
        s.expire_with_http = true;
    });
    server.end_watches();
    assert_eq!(agent.next(SOON).await, snapshot(&[&c, &d]));
    let requests = server.requests();
    let lists = requests.iter().filter(|r| !r.contains("watch=")).count();
    assert_eq!(lists, 3, "{requests:?}");
    assert!(requests.iter().any(|r| r.contains("watch=true") && r.contains("resourceVersion=20")));
    agent.stop().await;
}

#[tokio::test]
async fn a_restarted_api_server_is_listed_again() {
    let (logs, _guard) = Logs::capture();
    let (a, b, c) = (
        pod(UID_A, "web-5d8c7b9f4-x2x9z"),
        pod(UID_B, "web-5d8c7b9f4-k7q2m"),
        pod(UID_C, "web-5d8c7b9f4-p4n8w"),
    );
    let server = server(vec![a.clone()], 10).await;
    let mut agent = Agent::start(server.addr).await;
    assert_eq!(agent.next(SOON).await, snapshot(&[&a]));
    server.wait_for_watch().await;

    let addr = server.stop();
    sleep(Duration::from_secs(2)).await;
    assert!(agent.updates.try_recv().is_err(), "an update while the API server was gone");
    assert!(!agent.task.is_finished());

    // It comes back without the history the watch would resume from.
    let state =
        ApiState { pods: vec![b.clone()], resource_version: 100, oldest_version: 100, ..Default::default() };
    let server = ApiServer::start(addr, state).await;
    assert_eq!(agent.next(Duration::from_secs(30)).await, snapshot(&[&b]));
    server.wait_for_watch().await;
    server.event("ADDED", c.clone());
    assert_eq!(agent.next(SOON).await, PodUpdate::Upsert(Box::new(meta(&c))));

    assert_eq!(logs.ours("WARN").len(), 1, "{:?}", logs.ours("WARN"));
    assert_eq!(logs.ours("INFO").len(), 1, "{:?}", logs.ours("INFO"));
    assert!(logs.ours("INFO")[0].contains("reconnected"));
    agent.stop().await;
}

#[tokio::test]
async fn a_failing_api_is_retried_with_growing_backoff_and_warned_about_once() {
    let (logs, _guard) = Logs::capture();
    let server = server(vec![pod(UID_A, "web-5d8c7b9f4-x2x9z")], 10).await;
    server.with(|s| s.fail_with = Some(500));
    let mut agent = Agent::start(server.addr).await;

    let retried = async {
        while server.with(|s| s.requests.len()) < 3 {
            sleep(Duration::from_millis(20)).await;
        }
    };
    timeout(SOON, retried).await.expect("not retried");
    let at: Vec<Instant> = server.with(|s| s.requests.iter().map(|(_, at)| *at).collect());
    // kube's default backoff: 0.8 s then 1.6 s, each plus up to 100 % jitter.
    assert!(at[2] - at[1] >= Duration::from_millis(1600), "{:?}", [at[1] - at[0], at[2] - at[1]]);
    assert!(agent.updates.try_recv().is_err());
    let warnings = logs.ours("WARN");
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    assert!(warnings[0].contains("etcdserver: request timed out"), "{warnings:?}");

    // Stopping does not wait for the backoff.
    agent.stop().await;
}

#[tokio::test]
async fn a_missing_kubeconfig_is_a_clear_error() {
    let Err(error) = client(Some(Path::new("/nonexistent/kubeconfig"))).await else {
        panic!("a client from a missing kubeconfig")
    };
    assert!(format!("{error:#}").contains("/nonexistent/kubeconfig"), "{error:#}");
}
