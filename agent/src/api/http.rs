//! `/metrics` (Prometheus text format), `/healthz`, and `/api/v1/incidents` (JSON, or rows of
//! tab-separated values for a table across nodes), over plain
//! HTTP or, with `--web-config-file`, TLS and basic auth as the exporter toolkit does them. Each
//! connection is its own task: a slow or idle client delays no scrape, a TLS handshake or a
//! request head that does not come in time is dropped, and a head over [`MAX_HEAD_BYTES`] gets
//! 431.

use std::{
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use axum::{
    Router,
    extract::{Request, State},
    http::{HeaderName, HeaderValue, StatusCode, header},
    middleware::{self, Next},
    response::{IntoResponse, Response},
    routing::get,
};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use super::server;
use crate::{state::AgentState, web_config::WebConfig};

/// A request head (request line and headers) larger than this is answered 431.
pub const MAX_HEAD_BYTES: usize = 16 * 1024;
/// A client has this long for its TLS handshake, and for each request head.
const HANDSHAKE_WITHIN: Duration = Duration::from_secs(10);
/// How often the web configuration's files are checked for a change (a renewed certificate).
const RELOAD_CHECK_EVERY: Duration = Duration::from_secs(10);

pub async fn serve(
    listener: TcpListener,
    state: Arc<AgentState>,
    web: Option<(std::path::PathBuf, WebConfig)>,
    shutdown: CancellationToken,
) {
    let web = web.map(|(path, config)| Arc::new(Current::new(path, config)));
    let app = Router::new()
        .route("/metrics", get(metrics_handler))
        .route("/api/v1/incidents", get(incidents_handler))
        .route("/api/v1/captures", get(captures_refused))
        .route("/api/v1/captures/{id}", get(captures_refused))
        .layer(middleware::from_fn_with_state(web.clone(), authenticate))
        // The readiness probe's: it tells nothing, and a kubelet probe carries no credentials.
        .route("/healthz", get(|| async { "ok\n" }))
        .layer(middleware::from_fn_with_state(web.clone(), add_headers))
        .with_state(state);
    loop {
        let (stream, _) = tokio::select! {
            _ = shutdown.cancelled() => return,
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(e) => {
                    // Out of file descriptors, say: the next accept may work.
                    tracing::warn!(error = %e, "metrics server: accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
        };
        let tls = web.as_ref().and_then(|w| w.get().tls.clone());
        let (app, shutdown) = (app.clone(), shutdown.clone());
        tokio::spawn(async move {
            match tls {
                None => serve_connection(stream, app, shutdown).await,
                Some(tls) => {
                    let accept = tokio_rustls::TlsAcceptor::from(tls).accept(stream);
                    // A failed handshake (no client certificate, plain HTTP) is the client's problem.
                    if let Ok(Ok(stream)) = tokio::time::timeout(HANDSHAKE_WITHIN, accept).await {
                        serve_connection(stream, app, shutdown).await;
                    }
                }
            }
        });
    }
}

async fn serve_connection<S>(stream: S, app: Router, shutdown: CancellationToken)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let service = hyper::service::service_fn(move |request: hyper::Request<hyper::body::Incoming>| {
        tower_service::Service::call(&mut app.clone(), request)
    });
    let connection = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(HANDSHAKE_WITHIN)
        .max_buf_size(MAX_HEAD_BYTES)
        .serve_connection(TokioIo::new(stream), service);
    tokio::pin!(connection);
    tokio::select! {
        _ = connection.as_mut() => {}
        _ = shutdown.cancelled() => {
            connection.as_mut().graceful_shutdown();
            let _ = tokio::time::timeout(Duration::from_secs(5), connection).await;
        }
    }
}

/// The web configuration in use, read again when its files change; a bad new one is refused
/// (once in the log) and the last good one kept.
struct Current {
    path: std::path::PathBuf,
    /// Shared, not copied, by each request's layers.
    config: Mutex<(Arc<WebConfig>, Instant)>,
    /// Recently accepted `Authorization` headers: bcrypt is slow by design, a scrape every few
    /// seconds must not pay it each time.
    accepted: Mutex<std::collections::HashSet<String>>,
}

impl Current {
    fn new(path: std::path::PathBuf, config: WebConfig) -> Self {
        Self { path, config: Mutex::new((Arc::new(config), Instant::now())), accepted: Mutex::default() }
    }

    fn get(&self) -> Arc<WebConfig> {
        let mut current = self.config.lock().expect("web config");
        let (config, checked) = &mut *current;
        if checked.elapsed() >= RELOAD_CHECK_EVERY {
            *checked = Instant::now();
            if config.changed_on_disk() {
                match crate::web_config::load(&self.path) {
                    Ok(new) => {
                        tracing::info!(file = %self.path.display(), "web configuration read again");
                        *config = Arc::new(new);
                        self.accepted.lock().expect("accepted").clear();
                    }
                    Err(e) => {
                        tracing::warn!(file = %self.path.display(), error = %e,
                            "web configuration changed but is invalid: the previous one stays");
                        // Not again until the files change again.
                        Arc::make_mut(config).sources.iter_mut().for_each(|(p, seen)| {
                            *seen = std::fs::metadata(p.as_path()).and_then(|m| m.modified()).ok()
                        });
                    }
                }
            }
        }
        Arc::clone(config)
    }
}

const REMEMBERED_CREDENTIALS: usize = 64;

async fn authenticate(State(web): State<Option<Arc<Current>>>, request: Request, next: Next) -> Response {
    let Some(web) = web else { return next.run(request).await };
    let users = web.get().users.clone();
    if users.is_empty() {
        return next.run(request).await;
    }
    let given =
        request.headers().get(header::AUTHORIZATION).and_then(|v| v.to_str().ok()).map(str::to_string);
    let known = given.as_ref().is_some_and(|g| web.accepted.lock().expect("accepted").contains(g));
    let ok = known || {
        let given = given.clone();
        tokio::task::spawn_blocking(move || crate::web_config::authorized(&users, given.as_deref()))
            .await
            .unwrap_or(false)
    };
    if !ok {
        return (
            StatusCode::UNAUTHORIZED,
            [(header::WWW_AUTHENTICATE, "Basic realm=\"kstall\"")],
            "Unauthorized\n",
        )
            .into_response();
    }
    if let (false, Some(given)) = (known, given) {
        let mut accepted = web.accepted.lock().expect("accepted");
        if accepted.len() >= REMEMBERED_CREDENTIALS {
            accepted.clear();
        }
        accepted.insert(given);
    }
    next.run(request).await
}

/// `http_server_config.headers`, on every response.
async fn add_headers(State(web): State<Option<Arc<Current>>>, request: Request, next: Next) -> Response {
    let mut response = next.run(request).await;
    if let Some(web) = web {
        for (name, value) in &web.get().headers {
            // Checked when the file was read.
            if let (Ok(name), Ok(value)) = (HeaderName::try_from(name), HeaderValue::try_from(value)) {
                response.headers_mut().insert(name, value);
            }
        }
    }
    response
}

/// Capture bundles hold a pod's packets and its network's state: they leave the node only through
/// its API socket (`kstall capture get`, which `kubectl kstall capture get` runs over `kubectl
/// exec`), never on this port, with or without TLS.
pub const CAPTURES_REFUSED: &str = "captures are not served on the metrics port: on the node, kstall capture get ID; \
     from a workstation, kubectl kstall capture get ID --node NODE\n";

async fn captures_refused() -> impl IntoResponse {
    (StatusCode::FORBIDDEN, CAPTURES_REFUSED)
}

async fn metrics_handler(State(state): State<Arc<AgentState>>) -> impl IntoResponse {
    state.metrics.set_pod_source(&state.pod_source.get());
    let text = state.metrics.render();
    crate::memory::return_freed();
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")], text)
}

/// JSON; `?format=tsv` a row per incident for a table across nodes (`kubectl kstall incidents
/// --all-nodes`, through the API server's pod proxy), firing ones only unless `all=1`.
async fn incidents_handler(State(state): State<Arc<AgentState>>, uri: axum::http::Uri) -> Response {
    let report = server::incidents(&state);
    let asked = |key: &str, value: &str| {
        uri.query().unwrap_or_default().split('&').any(|pair| pair.split_once('=') == Some((key, value)))
    };
    if asked("format", "tsv") {
        let rows = report.tsv(asked("all", "1"), crate::kernel::unix_now_ns());
        return ([(header::CONTENT_TYPE, "text/tab-separated-values; charset=utf-8")], rows).into_response();
    }
    let body = serde_json::to_string(&report).unwrap_or_else(|e| format!(r#"{{"error":"{e}"}}"#));
    ([(header::CONTENT_TYPE, "application/json")], body).into_response()
}
