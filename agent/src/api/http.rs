//! `/metrics` (Prometheus text format), `/healthz`, and `/api/v1/incidents` (JSON).

use std::sync::Arc;

use axum::{Router, extract::State, http::header, response::IntoResponse, routing::get};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use super::server;
use crate::state::AgentState;

pub async fn serve(listener: TcpListener, state: Arc<AgentState>, shutdown: CancellationToken) {
    let app = Router::new()
        .route("/metrics", get(metrics_handler))
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/api/v1/incidents", get(incidents_handler))
        .with_state(state);
    if let Err(e) = axum::serve(listener, app).with_graceful_shutdown(shutdown.cancelled_owned()).await {
        tracing::error!(error = %e, "metrics server failed");
    }
}

async fn metrics_handler(State(state): State<Arc<AgentState>>) -> impl IntoResponse {
    let text = state.metrics.render();
    crate::memory::return_freed();
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")], text)
}

async fn incidents_handler(State(state): State<Arc<AgentState>>) -> impl IntoResponse {
    let body =
        serde_json::to_string(&server::incidents(&state)).unwrap_or_else(|e| format!(r#"{{"error":"{e}"}}"#));
    ([(header::CONTENT_TYPE, "application/json")], body)
}
