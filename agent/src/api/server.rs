//! Serves the API socket. A slow client never slows the agent: events reach each client through a
//! bounded broadcast, and a client that falls behind loses events (counted), not the agent.

use std::{
    io,
    os::unix::fs::PermissionsExt as _,
    path::{Path, PathBuf},
    sync::Arc,
    time::Duration,
};

use tokio::{
    io::{AsyncBufReadExt as _, AsyncReadExt as _, AsyncWriteExt as _, BufReader},
    net::{UnixListener, UnixStream},
    sync::broadcast,
};
use tokio_util::sync::CancellationToken;

use super::{
    AttributionReport, ErrorReply, IncidentsReport, ProbeReport, Request, StatusReport, StreamStarted,
    captures, explain, filter::TraceFilter,
};
use crate::state::{AgentState, lock};

/// A request line longer than this is refused (the longest real one, a trace filter, is tiny).
const MAX_REQUEST_BYTES: usize = 64 * 1024;

/// A client whose event stream cannot be written for this long is disconnected.
const STALLED_CLIENT: Duration = Duration::from_secs(5);

pub fn status(state: &AgentState) -> StatusReport {
    StatusReport {
        version: env!("CARGO_PKG_VERSION").to_string(),
        kernel: state.kernel.clone(),
        uptime_secs: state.started.elapsed().as_secs(),
        probes: lock(&state.probes)
            .iter()
            .map(|s| {
                let (events, lost) = state.counts.of(&s.name);
                ProbeReport {
                    status: s.clone(),
                    events,
                    lost,
                    suppressed: state.counts.suppressed_of(&s.name),
                }
            })
            .collect(),
        attribution: {
            let index = state.attribution.borrow();
            AttributionReport {
                source: state.pod_source.get(),
                pods: index.pods,
                deleted_pods: index.deleted_pods,
                retention_secs: state.retention.as_secs(),
                cgroups: index.by_cgroup.len(),
                pod_namespaces: index.by_netns.values().filter(|a| a.pod_uid.is_some()).count(),
                v1_pod_processes: index.by_process.len(),
            }
        },
        series: state.metrics.families(),
        kubelet: state.kubelet.borrow().clone(),
        node: super::NodeSignals::of(&state.conntrack.borrow(), &state.pressure.borrow()),
        cost: super::AgentCost::of(&state.counts),
    }
}

/// Firing incidents, then recently resolved ones.
pub fn incidents(state: &AgentState) -> IncidentsReport {
    IncidentsReport { incidents: lock(&state.incidents).incidents() }
}

/// Binds the socket: creates its directory, replaces a stale socket, refuses to steal a live one.
pub async fn bind(path: &Path) -> io::Result<UnixListener> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    if path.exists() {
        let alive = tokio::time::timeout(Duration::from_secs(1), UnixStream::connect(path)).await;
        if matches!(alive, Ok(Ok(_))) {
            return Err(io::Error::new(
                io::ErrorKind::AddrInUse,
                format!("another kstall agent is serving {}", path.display()),
            ));
        }
        std::fs::remove_file(path)?;
    }
    let listener = UnixListener::bind(path)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
    Ok(listener)
}

pub async fn serve(
    listener: UnixListener,
    path: PathBuf,
    state: Arc<AgentState>,
    shutdown: CancellationToken,
) {
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => break,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    tokio::spawn(handle(stream, state.clone(), shutdown.clone()));
                }
                Err(e) => tracing::warn!(error = %e, "API accept failed"),
            },
        }
    }
    let _ = std::fs::remove_file(&path);
}

async fn handle(stream: UnixStream, state: Arc<AgentState>, shutdown: CancellationToken) {
    let (read, mut write) = stream.into_split();
    let mut line = Vec::new();
    // A client that connects and says nothing must not hold a task forever, nor one that never
    // ends its line fill the agent's memory.
    let mut reader = BufReader::new(read).take(MAX_REQUEST_BYTES as u64 + 1);
    let request = tokio::time::timeout(Duration::from_secs(5), reader.read_until(b'\n', &mut line)).await;
    let request = match request {
        Ok(Ok(0)) | Ok(Err(_)) | Err(_) => return,
        Ok(Ok(_)) if line.len() > MAX_REQUEST_BYTES => Err(format!("longer than {MAX_REQUEST_BYTES} bytes")),
        Ok(Ok(_)) => match std::str::from_utf8(&line) {
            Ok(text) => parse_request(text).map_err(|e| e.to_string()),
            Err(_) => Err("not UTF-8".to_string()),
        },
    };
    let result = match request {
        Ok(Request::Status) => write_json(&mut write, &status(&state)).await,
        Ok(Request::Events) => stream_events(&mut write, &state, &TraceFilter::default(), &shutdown).await,
        Ok(Request::Trace { filter }) => stream_events(&mut write, &state, &filter, &shutdown).await,
        Ok(Request::Incidents) => write_json(&mut write, &incidents(&state)).await,
        Ok(Request::ExplainPod { pod, namespace }) => {
            match explain::pod(&state, &pod, namespace.as_deref()).await {
                Ok(explanation) => write_json(&mut write, &explanation).await,
                Err(error) => write_json(&mut write, &ErrorReply { error }).await,
            }
        }
        Ok(Request::CaptureStart {
            pod,
            namespace,
            netns,
            incident,
            filter,
            duration_secs,
            max_bytes,
            max_packets,
            snaplen,
            wait,
        }) => {
            let ask = crate::capture::service::Ask { filter, duration_secs, max_bytes, max_packets, snaplen };
            let what = match (pod, netns, incident) {
                (Some(pod), None, None) => Ok(captures::What::Pod { pod, namespace }),
                (None, Some(netns), None) => Ok(captures::What::Netns(netns)),
                (None, None, Some(id)) => Ok(captures::What::Incident(id)),
                _ => Err(captures::SAY_WHAT.to_string()),
            };
            match what {
                Ok(what) => capture_start(&mut write, &state, what, &ask, wait, &shutdown).await,
                Err(error) => write_json(&mut write, &ErrorReply { error }).await,
            }
        }
        Ok(Request::Captures) => match &state.captures {
            Ok(c) => write_json(&mut write, &captures::CapturesReply { captures: c.list() }).await,
            Err(error) => write_json(&mut write, &ErrorReply { error: error.clone() }).await,
        },
        Ok(Request::CaptureStop { id }) => {
            let stopped = state.captures.as_ref().map_err(Clone::clone).and_then(|c| c.stop(&id));
            match stopped {
                Ok(capture) => write_json(&mut write, &captures::CaptureReply { capture }).await,
                Err(error) => write_json(&mut write, &ErrorReply { error }).await,
            }
        }
        Ok(Request::CaptureGet { id }) => capture_get(&mut write, &state, &id).await,
        Err(e) => {
            let replied = write_json(&mut write, &ErrorReply { error: format!("bad request: {e}") }).await;
            // What the client still sends is read and dropped for a moment: closing on unread
            // bytes would reset the connection, and the client could lose the reply.
            let _ = write.shutdown().await;
            let (mut rest, mut sink) = (reader.into_inner().take(1 << 20), tokio::io::sink());
            let _ = tokio::time::timeout(Duration::from_secs(1), tokio::io::copy(&mut rest, &mut sink)).await;
            replied
        }
    };
    if let Err(e) = result {
        tracing::debug!(error = %e, "API client gone");
    }
}

/// Starts a capture; with `wait`, polls until it has ended (the capture runs on its own thread).
async fn capture_start(
    write: &mut tokio::net::unix::OwnedWriteHalf,
    state: &AgentState,
    what: captures::What,
    ask: &crate::capture::service::Ask,
    wait: bool,
    shutdown: &CancellationToken,
) -> io::Result<()> {
    let service = match &state.captures {
        Ok(service) => service.clone(),
        Err(error) => return write_json(write, &ErrorReply { error: error.clone() }).await,
    };
    let index = state.attribution.borrow().clone();
    let engine = state.incidents.clone();
    // Opens /proc files and spawns the capture's thread: short, but off the runtime's workers.
    let ask = ask.clone();
    let started = tokio::task::spawn_blocking(move || {
        captures::start(&service, &index, &engine, what, &ask, std::path::Path::new("/proc"))
    })
    .await
    .unwrap_or_else(|e| Err(format!("capture refused: {e}")));
    let info = match started {
        Ok(info) => info,
        Err(error) => return write_json(write, &ErrorReply { error }).await,
    };
    let id = info.id.clone();
    write_json(write, &captures::CaptureReply { capture: info }).await?;
    if !wait {
        return Ok(());
    }
    let Ok(service) = &state.captures else { return Ok(()) };
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return Ok(()),
            _ = tokio::time::sleep(captures::POLL) => {}
        }
        match service.info(&id) {
            Ok(info) if info.state == "running" => continue,
            Ok(capture) => return write_json(write, &captures::CaptureReply { capture }).await,
            Err(error) => return write_json(write, &ErrorReply { error }).await,
        }
    }
}

/// One line with the capture's summary, then exactly its bundle's bytes.
async fn capture_get(
    write: &mut tokio::net::unix::OwnedWriteHalf,
    state: &AgentState,
    id: &str,
) -> io::Result<()> {
    let opened = state.captures.as_ref().map_err(Clone::clone).and_then(|c| {
        let info = c.info(id)?;
        c.open_bundle(id).map(|(file, summary)| (file, summary, info))
    });
    let (file, summary, capture) = match opened {
        Ok(opened) => opened,
        Err(error) => return write_json(write, &ErrorReply { error }).await,
    };
    write_json(write, &captures::CaptureReply { capture }).await?;
    let mut bundle = tokio::fs::File::from_std(file).take(summary.bytes);
    let copied = tokio::io::copy(&mut bundle, write).await?;
    if copied != summary.bytes {
        return Err(io::Error::other(format!("{id}: {copied} of {} bytes read", summary.bytes)));
    }
    write.flush().await
}

/// A client's request line (its newline included or not).
pub fn parse_request(line: &str) -> serde_json::Result<Request> {
    serde_json::from_str(line.trim())
}

/// Streams the events that match `filter`. A client that falls behind loses events (counted);
/// one that stops reading altogether is cut off after `STALLED_CLIENT`.
async fn stream_events(
    write: &mut tokio::net::unix::OwnedWriteHalf,
    state: &AgentState,
    filter: &TraceFilter,
    shutdown: &CancellationToken,
) -> io::Result<()> {
    let mut events = state.events.subscribe();
    write_json(write, &StreamStarted { subscribed: true }).await?;
    loop {
        let event = tokio::select! {
            _ = shutdown.cancelled() => return Ok(()),
            event = events.recv() => event,
        };
        match event {
            Ok(event) if filter.matches(&event) => {
                match tokio::time::timeout(STALLED_CLIENT, write_json(write, &*event)).await {
                    Ok(written) => written?,
                    Err(_) => {
                        state.metrics.subscriber_dropped("events", 1);
                        tracing::info!("API client stopped reading its event stream; cut off");
                        return Ok(());
                    }
                }
            }
            Ok(_) => {}
            Err(broadcast::error::RecvError::Lagged(n)) => state.metrics.subscriber_dropped("events", n),
            Err(broadcast::error::RecvError::Closed) => return Ok(()),
        }
    }
}

async fn write_json<T: serde::Serialize>(
    write: &mut tokio::net::unix::OwnedWriteHalf,
    value: &T,
) -> io::Result<()> {
    let mut line = serde_json::to_vec(value).map_err(io::Error::other)?;
    line.push(b'\n');
    write.write_all(&line).await
}
