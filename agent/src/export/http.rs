//! `/metrics` (Prometheus text format) and `/healthz`.

use std::sync::Arc;

use axum::{Router, extract::State, http::header, response::IntoResponse, routing::get};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use super::metrics::Metrics;

pub async fn serve(listener: TcpListener, metrics: Arc<Metrics>, shutdown: CancellationToken) {
    let app = Router::new()
        .route("/metrics", get(metrics_handler))
        .route("/healthz", get(|| async { "ok\n" }))
        .with_state(metrics);
    if let Err(e) = axum::serve(listener, app).with_graceful_shutdown(shutdown.cancelled_owned()).await {
        tracing::error!(error = %e, "metrics server failed");
    }
}

async fn metrics_handler(State(metrics): State<Arc<Metrics>>) -> impl IntoResponse {
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")], metrics.render())
}
