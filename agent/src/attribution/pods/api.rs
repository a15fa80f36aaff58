//! Pod metadata from the Kubernetes API: a list/watch of this node's pods.

use std::{path::Path, pin::pin};

use anyhow::Context;
use futures::{Stream, StreamExt, stream::BoxStream};
use k8s_openapi::api::core::v1::Pod;
use kube::{
    Api, Client, Config,
    config::{KubeConfigOptions, Kubeconfig},
    runtime::{
        WatchStreamExt,
        watcher::{self, Event, watcher},
    },
};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use super::{Health, PodMeta, PodUpdate};

/// A client from `kubeconfig` when given; else the pod's service account (in-cluster), which is
/// how the agent runs as a DaemonSet; else the default kubeconfig (`$KUBECONFIG`,
/// `~/.kube/config`), for running it by hand.
pub async fn client(kubeconfig: Option<&Path>) -> anyhow::Result<Client> {
    let config = match kubeconfig {
        Some(path) => {
            let file = Kubeconfig::read_from(path)
                .with_context(|| format!("reading the kubeconfig {}", path.display()))?;
            Config::from_custom_kubeconfig(file, &KubeConfigOptions::default())
                .await
                .with_context(|| format!("using the kubeconfig {}", path.display()))?
        }
        None => match Config::incluster() {
            Ok(config) => config,
            Err(in_cluster) => {
                Config::from_kubeconfig(&KubeConfigOptions::default()).await.map_err(|kubeconfig| {
                    anyhow::anyhow!(
                        "no Kubernetes API credentials: not running in a pod with a service account \
                         ({in_cluster}), and no usable default kubeconfig ({kubeconfig})"
                    )
                })?
            }
        },
    };
    Client::try_from(config).context("building the Kubernetes API client")
}

/// Watches the pods of `node` until `stop`. The initial list and every relist become one
/// [`PodUpdate::Snapshot`], so the store learns which pods went away while the watch was broken.
/// While the API is unreachable nothing is sent and the store keeps what it has; the watch is
/// retried with kube's backoff forever. Returns when `stop` is cancelled or `updates` is closed.
pub async fn watch_pods(
    client: Client,
    node: String,
    selected_labels: Vec<String>,
    updates: mpsc::Sender<PodUpdate>,
    health: Health,
    stop: CancellationToken,
) {
    let config = watcher::Config::default().fields(&format!("spec.nodeName={node}"));
    let mut events = pin!(pod_events(Api::all(client), config).default_backoff());
    // The pods of the list in progress.
    let mut listing = Vec::new();
    let mut down = false;
    loop {
        let event = tokio::select! {
            biased;
            () = stop.cancelled() => return,
            event = events.next() => event,
        };
        let event = match event {
            Some(Ok(event)) => event,
            Some(Err(error)) => {
                // A list that fails after some pages starts over, with a new list.
                listing.clear();
                if expired(&error) {
                    debug!(%error, "pod watch expired, listing the pods again");
                } else if !down {
                    down = true;
                    health.set(false, Some(ErrorChain(&error).to_string()));
                    warn!(
                        error = %ErrorChain(&error),
                        "cannot watch pods on the Kubernetes API, keeping the pod metadata we have; retrying"
                    );
                } else {
                    debug!(error = %ErrorChain(&error), "still cannot watch pods on the Kubernetes API");
                }
                continue;
            }
            // The watcher retries forever: it does not end.
            None => return,
        };
        if down {
            down = false;
            info!("reconnected to the Kubernetes API, watching pods again");
        }
        if matches!(event, Event::InitDone) || !health.get().up {
            health.set(true, None);
        }
        let update = match event {
            Event::InitApply(pod) => {
                listing.extend(PodMeta::from_pod(&pod, &selected_labels));
                continue;
            }
            Event::InitDone => PodUpdate::Snapshot(std::mem::take(&mut listing)),
            Event::Apply(pod) => match PodMeta::from_pod(&pod, &selected_labels) {
                Some(meta) => PodUpdate::Upsert(meta),
                None => continue,
            },
            Event::Delete(pod) => match pod.metadata.uid {
                Some(uid) => PodUpdate::Delete { uid },
                None => continue,
            },
            // Dropped by `pod_events`.
            Event::Init => continue,
        };
        tokio::select! {
            biased;
            () = stop.cancelled() => return,
            sent = updates.send(update) => if sent.is_err() { return },
        }
    }
}

/// kube's pod watcher with two changes, made before the backoff sees the events:
/// - `Init` is dropped: kube emits it before the list request, so it would reset the backoff
///   after every failed list and an API outage would be retried every second from every node;
/// - a watch refused with HTTP 410 starts a new watcher, which lists again: kube's would retry
///   the expired resource version forever (API servers send 410 inside a watch, which kube
///   handles, but a proxy may answer the request with it).
fn pod_events(
    api: Api<Pod>,
    config: watcher::Config,
) -> impl Stream<Item = watcher::Result<Event<Pod>>> + Send {
    futures::stream::unfold(None, move |current: Option<BoxStream<'static, _>>| {
        let mut events = current.unwrap_or_else(|| watcher(api.clone(), config.clone()).boxed());
        async move {
            loop {
                match events.next().await? {
                    Ok(Event::Init) => {}
                    Err(error @ watcher::Error::WatchStartFailed(_)) if expired(&error) => {
                        return Some((Err(error), None));
                    }
                    event => return Some((event, Some(events))),
                }
            }
        }
    })
}

/// The resource version the watch resumes from is no longer in the API server's history: only a
/// new list catches up. Routine, not an outage.
fn expired(error: &watcher::Error) -> bool {
    match error {
        watcher::Error::WatchError(status) => status.code == 410,
        watcher::Error::WatchStartFailed(kube::Error::Api(status)) => status.code == 410,
        _ => false,
    }
}

/// An error with its causes: kube's own messages stop at "client error (Connect)", the cause
/// ("Connection refused", a TLS failure) is further down.
struct ErrorChain<'a>(&'a (dyn std::error::Error + 'static));

impl std::fmt::Display for ErrorChain<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut shown = self.0.to_string();
        let mut source = self.0.source();
        while let Some(cause) = source {
            let message = cause.to_string();
            // kube's errors often repeat their cause's message in their own.
            if !shown.contains(&message) {
                shown = format!("{shown}: {message}");
            }
            source = cause.source();
        }
        f.write_str(&shown)
    }
}

#[cfg(test)]
mod tests {
    use std::{
        io::Write as _,
        net::SocketAddr,
        sync::{Arc, Mutex},
        time::{Duration, Instant},
    };

    use serde_json::{Value, json};
    use tokio::{
        io::{AsyncReadExt, AsyncWriteExt},
        net::{TcpSocket, TcpStream},
        task::{JoinHandle, JoinSet},
        time::{sleep, timeout},
    };

    use super::*;
    use crate::attribution::pods::tests::pod_json;

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

    /// What the fake API server answers; tests change it as they go.
    #[derive(Default)]
    struct ApiState {
        /// The pods a list returns.
        pods: Vec<Value>,
        resource_version: u64,
        /// Watches from an older resource version are expired, as after an etcd compaction.
        oldest_version: u64,
        /// Expire a watch by answering the request with HTTP 410, rather than with an ERROR event
        /// in a 200 stream (what API servers do).
        expire_with_http: bool,
        /// Answer every request with this status (an API server in trouble).
        fail_with: Option<u16>,
        /// The request targets (path and query), with when they came.
        requests: Vec<(String, Instant)>,
        /// The open watch streams: each line sent is written to the client as one chunk.
        watches: Vec<mpsc::UnboundedSender<String>>,
    }

    /// Speaks the Kubernetes list/watch wire format for `GET /api/v1/pods` over plain HTTP/1.1,
    /// on raw TCP so that stopping it drops every connection the way a dead API server does.
    struct ApiServer {
        addr: SocketAddr,
        state: Arc<Mutex<ApiState>>,
        accept: JoinHandle<()>,
    }

    impl ApiServer {
        async fn start(addr: SocketAddr, state: ApiState) -> Self {
            let socket = TcpSocket::new_v4().unwrap();
            // The previous server on this port left connections in TIME_WAIT.
            socket.set_reuseaddr(true).unwrap();
            socket.bind(addr).unwrap();
            let listener = socket.listen(64).unwrap();
            let addr = listener.local_addr().unwrap();
            let state = Arc::new(Mutex::new(state));
            let shared = state.clone();
            let accept = tokio::spawn(async move {
                // Owned here, so aborting this task drops every connection.
                let mut connections = JoinSet::new();
                while let Ok((socket, _)) = listener.accept().await {
                    while connections.try_join_next().is_some() {}
                    connections.spawn(serve(socket, shared.clone()));
                }
            });
            Self { addr, state, accept }
        }

        fn with<R>(&self, f: impl FnOnce(&mut ApiState) -> R) -> R {
            f(&mut self.state.lock().unwrap())
        }

        fn requests(&self) -> Vec<String> {
            self.with(|s| s.requests.iter().map(|(r, _)| r.clone()).collect())
        }

        /// Sends a watch event to the open watches, with a new resource version.
        fn event(&self, kind: &str, mut object: Value) {
            let line = self.with(|s| {
                s.resource_version += 1;
                object["metadata"]["resourceVersion"] = s.resource_version.to_string().into();
                json!({"type": kind, "object": object}).to_string()
            });
            self.send_line(line);
        }

        fn send_line(&self, line: String) {
            self.with(|s| s.watches.retain(|w| w.send(line.clone()).is_ok()));
        }

        /// Ends the open watches cleanly, as the API server does at the watch timeout.
        fn end_watches(&self) {
            self.with(|s| s.watches.clear());
        }

        async fn wait_for_watch(&self) {
            let open = || self.with(|s| s.watches.iter().any(|w| !w.is_closed()));
            timeout(Duration::from_secs(10), async {
                while !open() {
                    sleep(Duration::from_millis(10)).await;
                }
            })
            .await
            .expect("no watch request within 10 s");
        }

        fn stop(self) -> SocketAddr {
            self.accept.abort();
            self.addr
        }
    }

    fn status(code: u16, reason: &str, message: &str) -> Value {
        json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
               "reason": reason, "code": code, "message": message})
    }

    async fn serve(mut socket: TcpStream, state: Arc<Mutex<ApiState>>) -> std::io::Result<()> {
        let mut head = Vec::new();
        let mut buf = [0; 4096];
        while !head.windows(4).any(|w| w == b"\r\n\r\n") {
            let n = socket.read(&mut buf).await?;
            if n == 0 {
                return Ok(());
            }
            head.extend_from_slice(&buf[..n]);
        }
        let head = String::from_utf8_lossy(&head);
        let target = head.split(' ').nth(1).unwrap_or_default().to_string();
        let (path, query) = target.split_once('?').unwrap_or((&target, ""));
        let param = |name: &str| {
            query.split('&').find_map(|kv| kv.strip_prefix(name)?.strip_prefix('=')).unwrap_or_default()
        };
        let watch = matches!(param("watch"), "true" | "1");
        let since: u64 = param("resourceVersion").parse().unwrap_or(0);

        enum Answer {
            Json(u16, Value),
            Watch(mpsc::UnboundedReceiver<String>),
        }
        let answer = {
            let mut s = state.lock().unwrap();
            s.requests.push((target.clone(), Instant::now()));
            if let Some(code) = s.fail_with {
                Answer::Json(code, status(code, "InternalError", "etcdserver: request timed out"))
            } else if path != "/api/v1/pods" {
                Answer::Json(404, status(404, "NotFound", "the server could not find the requested resource"))
            } else if !watch {
                let list = json!({"kind": "PodList", "apiVersion": "v1",
                                  "metadata": {"resourceVersion": s.resource_version.to_string()},
                                  "items": s.pods});
                Answer::Json(200, list)
            } else {
                let expired = since < s.oldest_version;
                let gone = status(
                    410,
                    "Expired",
                    &format!("too old resource version: {since} ({})", s.oldest_version),
                );
                if expired && s.expire_with_http {
                    Answer::Json(410, gone)
                } else {
                    let (tx, rx) = mpsc::unbounded_channel();
                    if expired {
                        // The stream ends after the error, as the API server's does.
                        let _ = tx.send(json!({"type": "ERROR", "object": gone}).to_string());
                    } else {
                        s.watches.push(tx);
                    }
                    Answer::Watch(rx)
                }
            }
        };
        match answer {
            Answer::Json(code, body) => {
                let body = body.to_string();
                let head = format!(
                    "HTTP/1.1 {code} X\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\
                     connection: close\r\n\r\n",
                    body.len()
                );
                socket.write_all(format!("{head}{body}").as_bytes()).await
            }
            Answer::Watch(mut lines) => {
                socket
                    .write_all(
                        b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ntransfer-encoding: chunked\r\n\
                          connection: close\r\n\r\n",
                    )
                    .await?;
                while let Some(line) = lines.recv().await {
                    let chunk = format!("{line}\n");
                    socket.write_all(format!("{:x}\r\n{chunk}\r\n", chunk.len()).as_bytes()).await?;
                }
                socket.write_all(b"0\r\n\r\n").await
            }
        }
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
            let mut kubeconfig = tempfile::NamedTempFile::new().unwrap();
            write!(
                kubeconfig,
                "apiVersion: v1\nkind: Config\ncurrent-context: test\n\
                 clusters: [{{name: test, cluster: {{server: 'http://{addr}'}}}}]\n\
                 contexts: [{{name: test, context: {{cluster: test, user: test}}}}]\n\
                 users: [{{name: test, user: {{}}}}]\n"
            )
            .unwrap();
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
        assert_eq!(agent.next(SOON).await, PodUpdate::Upsert(meta(&c)));

        let mut terminating = a.clone();
        terminating["metadata"]["deletionTimestamp"] = "2025-01-07T10:00:00Z".into();
        server.event("MODIFIED", terminating.clone());
        let PodUpdate::Upsert(modified) = agent.next(SOON).await else { panic!("not an upsert") };
        assert!(modified.terminating && modified.uid == UID_A);
        assert_eq!(modified, meta(&terminating));

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
        let state = ApiState {
            pods: vec![b.clone()],
            resource_version: 100,
            oldest_version: 100,
            ..Default::default()
        };
        let server = ApiServer::start(addr, state).await;
        assert_eq!(agent.next(Duration::from_secs(30)).await, snapshot(&[&b]));
        server.wait_for_watch().await;
        server.event("ADDED", c.clone());
        assert_eq!(agent.next(SOON).await, PodUpdate::Upsert(meta(&c)));

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
}
