//! A stand-in Kubernetes API server for the watcher's tests: it speaks the list/watch wire format
//! of `GET /api/v1/pods` over plain HTTP/1.1, on raw TCP so that stopping it drops every
//! connection the way a dead API server does, and it can expire watches, fail requests and end
//! streams on demand.

use std::{
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
pub(super) struct ApiState {
    /// The pods a list returns.
    pub(super) pods: Vec<Value>,
    pub(super) resource_version: u64,
    /// Watches from an older resource version are expired, as after an etcd compaction.
    pub(super) oldest_version: u64,
    /// Expire a watch by answering the request with HTTP 410, rather than with an ERROR event
    /// in a 200 stream (what API servers do).
    pub(super) expire_with_http: bool,
    /// Answer every request with this status (an API server in trouble).
    pub(super) fail_with: Option<u16>,
    /// The request targets (path and query), with when they came.
    pub(super) requests: Vec<(String, Instant)>,
    /// The open watch streams: each line sent is written to the client as one chunk.
    pub(super) watches: Vec<mpsc::UnboundedSender<String>>,
}

/// Speaks the Kubernetes list/watch wire format for `GET /api/v1/pods` over plain HTTP/1.1,
/// on raw TCP so that stopping it drops every connection the way a dead API server does.
pub(super) struct ApiServer {
    pub(super) addr: SocketAddr,
    state: Arc<Mutex<ApiState>>,
    accept: JoinHandle<()>,
}

impl ApiServer {
    pub(super) async fn start(addr: SocketAddr, state: ApiState) -> Self {
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

    pub(super) fn with<R>(&self, f: impl FnOnce(&mut ApiState) -> R) -> R {
        f(&mut self.state.lock().unwrap())
    }

    pub(super) fn requests(&self) -> Vec<String> {
        self.with(|s| s.requests.iter().map(|(r, _)| r.clone()).collect())
    }

    /// Sends a watch event to the open watches, with a new resource version.
    pub(super) fn event(&self, kind: &str, mut object: Value) {
        let line = self.with(|s| {
            s.resource_version += 1;
            object["metadata"]["resourceVersion"] = s.resource_version.to_string().into();
            json!({"type": kind, "object": object}).to_string()
        });
        self.send_line(line);
    }

    pub(super) fn send_line(&self, line: String) {
        self.with(|s| s.watches.retain(|w| w.send(line.clone()).is_ok()));
    }

    /// Ends the open watches cleanly, as the API server does at the watch timeout.
    pub(super) fn end_watches(&self) {
        self.with(|s| s.watches.clear());
    }

    pub(super) async fn wait_for_watch(&self) {
        let open = || self.with(|s| s.watches.iter().any(|w| !w.is_closed()));
        timeout(Duration::from_secs(10), async {
            while !open() {
                sleep(Duration::from_millis(10)).await;
            }
        })
        .await
        .expect("no watch request within 10 s");
    }

    pub(super) fn stop(self) -> SocketAddr {
        self.accept.abort();
        self.addr
    }
}

pub(super) fn status(code: u16, reason: &str, message: &str) -> Value {
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
