//! A stand-in Kubernetes API server for tests: it speaks the list/watch wire format of
//! `GET /api/v1/pods` and takes the writes of `events.k8s.io/v1` Events (create, merge patch)
//! and of Node status (strategic merge patch: conditions merged by type, as the real one does),
//! over plain HTTP/1.1, on raw TCP so that stopping it drops every connection the way a dead API
//! server does; it can expire watches, fail requests and end streams on demand, and records what
//! was written.

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
    sync::mpsc,
    task::{JoinHandle, JoinSet},
    time::{sleep, timeout},
};

/// What the fake API server answers; tests change it as they go.
#[derive(Default)]
pub(crate) struct ApiState {
    /// The pods a list returns.
    pub(crate) pods: Vec<Value>,
    pub(crate) resource_version: u64,
    /// Watches from an older resource version are expired, as after an etcd compaction.
    pub(crate) oldest_version: u64,
    /// Expire a watch by answering the request with HTTP 410, rather than with an ERROR event
    /// in a 200 stream (what API servers do).
    pub(crate) expire_with_http: bool,
    /// Answer every request with this status (an API server in trouble).
    pub(crate) fail_with: Option<u16>,
    /// The request targets (path and query), with when they came.
    pub(crate) requests: Vec<(String, Instant)>,
    /// The open watch streams: each line sent is written to the client as one chunk.
    pub(crate) watches: Vec<mpsc::UnboundedSender<String>>,
    /// Answer writes (POST, PATCH) with this status, reads as usual.
    pub(crate) fail_writes_with: Option<u16>,
    /// The writes, in order: method, path and body.
    pub(crate) writes: Vec<Write>,
    /// The Events as stored: the created object with every merge patch applied, by path.
    pub(crate) events: std::collections::BTreeMap<String, Value>,
    /// The Nodes, by name: a status patch applies to the one named.
    pub(crate) nodes: std::collections::BTreeMap<String, Value>,
    /// Which API server's validation of `events.k8s.io/v1` writes this one applies.
    pub(crate) event_rules: EventRules,
}

/// The validation of `events.k8s.io/v1` Events (`pkg/apis/core/validation/events.go`), which
/// changed once in a way kstall meets: where an Event about a cluster-scoped object may live.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) enum EventRules {
    /// 1.20 (what the real cluster of tests/tests/cluster.rs runs): only `kube-system`.
    #[default]
    V1_20,
    /// Later versions: `default` or `kube-system`.
    Current,
}

#[derive(Debug, Clone)]
pub(crate) struct Write {
    pub(crate) method: String,
    pub(crate) path: String,
    pub(crate) body: Value,
    pub(crate) content_type: String,
    pub(crate) at: Instant,
}

/// Speaks the Kubernetes list/watch wire format for `GET /api/v1/pods` over plain HTTP/1.1,
/// on raw TCP so that stopping it drops every connection the way a dead API server does.
pub(crate) struct ApiServer {
    pub(crate) addr: SocketAddr,
    state: Arc<Mutex<ApiState>>,
    accept: JoinHandle<()>,
}

impl ApiServer {
    pub(crate) async fn start(addr: SocketAddr, state: ApiState) -> Self {
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

    pub(crate) fn with<R>(&self, f: impl FnOnce(&mut ApiState) -> R) -> R {
        f(&mut self.state.lock().unwrap())
    }

    pub(crate) fn writes(&self) -> Vec<Write> {
        self.with(|s| s.writes.clone())
    }

    /// The Node named `name` as stored.
    pub(crate) fn node(&self, name: &str) -> Option<Value> {
        self.with(|s| s.nodes.get(name).cloned())
    }

    /// The stored Events.
    pub(crate) fn events(&self) -> Vec<Value> {
        self.with(|s| s.events.values().cloned().collect())
    }

    pub(crate) fn requests(&self) -> Vec<String> {
        self.with(|s| s.requests.iter().map(|(r, _)| r.clone()).collect())
    }

    /// Sends a watch event to the open watches, with a new resource version.
    pub(crate) fn event(&self, kind: &str, mut object: Value) {
        let line = self.with(|s| {
            s.resource_version += 1;
            object["metadata"]["resourceVersion"] = s.resource_version.to_string().into();
            json!({"type": kind, "object": object}).to_string()
        });
        self.send_line(line);
    }

    pub(crate) fn send_line(&self, line: String) {
        self.with(|s| s.watches.retain(|w| w.send(line.clone()).is_ok()));
    }

    /// Ends the open watches cleanly, as the API server does at the watch timeout.
    pub(crate) fn end_watches(&self) {
        self.with(|s| s.watches.clear());
    }

    pub(crate) async fn wait_for_watch(&self) {
        let open = || self.with(|s| s.watches.iter().any(|w| !w.is_closed()));
        timeout(Duration::from_secs(10), async {
            while !open() {
                sleep(Duration::from_millis(10)).await;
            }
        })
        .await
        .expect("no watch request within 10 s");
    }

    pub(crate) fn stop(self) -> SocketAddr {
        self.accept.abort();
        self.addr
    }
}

/// Awaits `f` for up to 10 s: what a test waits for the server to have been told.
pub(crate) async fn until<T>(what: &str, mut f: impl FnMut() -> Option<T>) -> T {
    timeout(Duration::from_secs(10), async {
        loop {
            if let Some(v) = f() {
                return v;
            }
            sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("{what} within 10 s"))
}

/// A kubeconfig for the server at `addr`, as `--kubeconfig` gives one.
pub(crate) fn kubeconfig(addr: SocketAddr) -> tempfile::NamedTempFile {
    let mut kubeconfig = tempfile::NamedTempFile::new().unwrap();
    write!(
        kubeconfig,
        "apiVersion: v1\nkind: Config\ncurrent-context: test\n\
         clusters: [{{name: test, cluster: {{server: 'http://{addr}'}}}}]\n\
         contexts: [{{name: test, context: {{cluster: test, user: test}}}}]\n\
         users: [{{name: test, user: {{}}}}]\n"
    )
    .unwrap();
    kubeconfig
}

pub(crate) fn status(code: u16, reason: &str, message: &str) -> Value {
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
    let end = head.windows(4).position(|w| w == b"\r\n\r\n").unwrap() + 4;
    let mut body = head.split_off(end);
    let header = |name: &str| {
        String::from_utf8_lossy(&head)
            .lines()
            .find_map(|l| Some(l.to_ascii_lowercase().strip_prefix(name)?.trim().to_string()))
            .unwrap_or_default()
    };
    let length = header("content-length:").parse::<usize>().unwrap_or(0);
    let content_type = header("content-type:");
    while body.len() < length {
        let n = socket.read(&mut buf).await?;
        if n == 0 {
            return Ok(());
        }
        body.extend_from_slice(&buf[..n]);
    }
    let head = String::from_utf8_lossy(&head);
    let method = head.split(' ').next().unwrap_or_default().to_string();
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
        if method == "POST" || method == "PATCH" {
            let body: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
            let at = Instant::now();
            let write_ = Write {
                method: method.clone(),
                path: path.to_string(),
                body: body.clone(),
                content_type: content_type.clone(),
                at,
            };
            s.writes.push(write_);
            let (code, object) = write(&mut s, &method, path, &content_type, body);
            Answer::Json(code, object)
        } else if let Some(code) = s.fail_with {
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
            let gone =
                status(410, "Expired", &format!("too old resource version: {since} ({})", s.oldest_version));
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

/// A write to `events.k8s.io/v1` Events or a Node's status: the status and the object answered.
fn write(s: &mut ApiState, method: &str, path: &str, content_type: &str, body: Value) -> (u16, Value) {
    const EVENTS: &str = "/apis/events.k8s.io/v1/namespaces/";
    let node = path.strip_prefix("/api/v1/nodes/").and_then(|rest| rest.strip_suffix("/status"));
    if path.strip_prefix(EVENTS).is_none() && node.is_none() {
        return (404, status(404, "NotFound", "the server could not find the requested resource"));
    }
    if let Some(code) = s.fail_writes_with {
        let reason = match code {
            403 => "Forbidden",
            409 => "Conflict",
            _ => "InternalError",
        };
        return (code, status(code, reason, &format!("{method} {path} refused by the test")));
    }
    if let Some(name) = node {
        let Some(stored) = s.nodes.get_mut(name) else {
            return (404, status(404, "NotFound", &format!("nodes \"{name}\" not found")));
        };
        return match (method, content_type) {
            ("PATCH", "application/strategic-merge-patch+json") => {
                strategic_merge_status(stored, &body);
                (200, stored.clone())
            }
            ("PATCH", "application/merge-patch+json") => {
                merge(stored, &body);
                (200, stored.clone())
            }
            _ => (415, status(415, "UnsupportedMediaType", &format!("{method} {content_type}"))),
        };
    }
    let rest = path.strip_prefix(EVENTS).unwrap_or_default();
    let parts: Vec<&str> = rest.split('/').collect();
    match (method, parts.as_slice()) {
        ("POST", &[namespace, "events"]) => {
            let causes = event_create_errors(s.event_rules, namespace, &body);
            if !causes.is_empty() {
                return (422, invalid(&body, &causes));
            }
            let name = body["metadata"]["name"].as_str().unwrap_or_default();
            let key = format!("{path}/{name}");
            if s.events.contains_key(&key) {
                return (409, status(409, "AlreadyExists", &format!("events \"{name}\" already exists")));
            }
            s.events.insert(key, body.clone());
            (201, body)
        }
        ("PATCH", &[_, "events", _]) => match s.events.get_mut(path) {
            Some(event) => {
                let mut patched = event.clone();
                merge(&mut patched, &body);
                let causes = event_update_errors(event, &patched);
                if !causes.is_empty() {
                    return (422, invalid(&patched, &causes));
                }
                *event = patched;
                (200, event.clone())
            }
            None => (404, status(404, "NotFound", "events not found")),
        },
        _ => (405, status(405, "MethodNotAllowed", "not supported by the fake")),
    }
}

/// Why the API server refuses to create `event` in `namespace` (none: it is created): the
/// checks of `ValidateEventCreate` for an `events.k8s.io/v1` request that kstall's Events meet.
pub(crate) fn event_create_errors(rules: EventRules, namespace: &str, event: &Value) -> Vec<String> {
    let mut causes = Vec::new();
    let text = |field: &str| event[field].as_str().unwrap_or_default();
    let cluster_scoped = event["regarding"]["namespace"].as_str().unwrap_or_default().is_empty();
    let allowed: &[&str] = match rules {
        EventRules::V1_20 => &["kube-system"],
        EventRules::Current => &["default", "kube-system"],
    };
    if cluster_scoped && !allowed.contains(&namespace) {
        causes.push("regarding.namespace: Invalid value: \"\": does not match event.namespace".into());
    }
    if event["metadata"]["namespace"].as_str().is_some_and(|n| n != namespace) {
        causes.push("metadata.namespace: Invalid value: does not match the namespace of the request".into());
    }
    let name = event["metadata"]["name"].as_str().unwrap_or_default();
    if name.is_empty()
        || name.len() > 253
        || !name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'.' || b == b'-')
    {
        causes.push(format!("metadata.name: Invalid value: {name:?}: a DNS-1123 subdomain"));
    }
    for (field, limit) in
        [("reportingController", 253), ("reportingInstance", 128), ("action", 128), ("reason", 128)]
    {
        match text(field).len() {
            0 => causes.push(format!("{field}: Required value")),
            n if n > limit => {
                causes.push(format!("{field}: Invalid value: can have at most {limit} characters"))
            }
            _ => {}
        }
    }
    if text("note").len() > 1024 {
        causes.push("note: Invalid value: can have at most 1024 characters".into());
    }
    if text("eventTime").is_empty() {
        causes.push("eventTime: Required value".into());
    }
    if !matches!(text("type"), "Normal" | "Warning") {
        causes.push(format!("type: Invalid value: has invalid value: {}", text("type")));
    }
    for field in ["deprecatedFirstTimestamp", "deprecatedLastTimestamp", "deprecatedCount"] {
        if !event[field].is_null() {
            causes.push(format!("{field}: Invalid value: needs to be unset"));
        }
    }
    let source = &event["deprecatedSource"];
    if ["component", "host"].iter().any(|k| source[k].as_str().is_some_and(|v| !v.is_empty())) {
        causes.push("source: Invalid value: \"\": needs to be unset".into());
    }
    causes.extend(series_errors(event));
    causes
}

/// Why an update from `old` to `new` is refused: a changed series must count at least 2 and say
/// when it was last seen; what the Event is about and says cannot change.
fn event_update_errors(old: &Value, new: &Value) -> Vec<String> {
    let mut causes = Vec::new();
    if old["series"] != new["series"] {
        causes.extend(series_errors(new));
    }
    for field in [
        "regarding",
        "reason",
        "note",
        "type",
        "action",
        "reportingController",
        "reportingInstance",
        "eventTime",
    ] {
        if old[field] != new[field] {
            causes.push(format!("{field}: Invalid value: field is immutable"));
        }
    }
    causes
}

fn series_errors(event: &Value) -> Vec<String> {
    let series = &event["series"];
    let mut causes = Vec::new();
    if !series.is_null() {
        if series["count"].as_i64().unwrap_or(0) < 2 {
            causes.push("series.count: Invalid value: should be at least 2".into());
        }
        if series["lastObservedTime"].as_str().unwrap_or_default().is_empty() {
            causes.push("series.lastObservedTime: Required value".into());
        }
    }
    causes
}

/// The API server's 422: a Status naming every cause.
fn invalid(event: &Value, causes: &[String]) -> Value {
    let name = event["metadata"]["name"].as_str().unwrap_or_default();
    status(422, "Invalid", &format!("Event {name:?} is invalid: [{}]", causes.join(", ")))
}

/// A JSON merge patch (RFC 7386), as the API server applies `application/merge-patch+json`.
fn merge(target: &mut Value, patch: &Value) {
    match (target.as_object_mut(), patch.as_object()) {
        (Some(target), Some(patch)) => {
            for (k, v) in patch {
                if v.is_null() {
                    target.remove(k);
                } else {
                    merge(target.entry(k.clone()).or_insert(Value::Null), v);
                }
            }
        }
        _ => *target = patch.clone(),
    }
}

/// A strategic merge patch of a Node's status as the API server applies it: `conditions` is a
/// list merged by `type` (a condition the patch does not name is kept), the rest merge-patched.
fn strategic_merge_status(node: &mut Value, patch: &Value) {
    let mut patch = patch.clone();
    let conditions = patch["status"].as_object_mut().and_then(|s| s.remove("conditions"));
    merge(node, &patch);
    for condition in conditions.as_ref().and_then(Value::as_array).into_iter().flatten() {
        let list = node["status"]["conditions"].as_array_mut();
        let list = match list {
            Some(list) => list,
            None => {
                node["status"]["conditions"] = json!([]);
                node["status"]["conditions"].as_array_mut().unwrap()
            }
        };
        match list.iter_mut().find(|c| c["type"] == condition["type"]) {
            Some(existing) => merge(existing, condition),
            None => list.push(condition.clone()),
        }
    }
}
