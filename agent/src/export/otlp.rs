//! Every event and incident as an OpenTelemetry log record over OTLP (`--export-otlp on`), to an
//! OpenTelemetry Collector or any backend that takes OTLP: where and how as the OpenTelemetry
//! SDKs read it, from the `OTEL_EXPORTER_OTLP_*` variables (`settings.rs`), over gRPC or HTTP
//! (`transport.rs`), one resource per pod (`records.rs`).
//!
//! The records are the JSON stream's (`stream.rs`), numbered the same way: the exporter's own
//! thread takes them from the stream's queue and sends a batch every second or every 512
//! records. A batch the endpoint refuses is tried twice more (after 1 s, 2 s) when the failure
//! is one the specification calls retryable, then dropped and counted; while it is tried, the
//! queue fills and what does not fit is dropped and counted too. Nothing waits on the endpoint
//! but that thread.

mod records;
mod settings;
mod transport;

use std::{
    sync::{
        Arc,
        mpsc::{Receiver, RecvTimeoutError},
    },
    time::{Duration, Instant},
};

pub use settings::{Protocol, Settings};
use tokio::sync::broadcast;
use tokio_util::sync::CancellationToken;

use super::{
    metrics::Metrics,
    stream::{self, Feed, Record},
};
use crate::{
    attribution::Attributed,
    setting::{Invalid, on_off},
};

/// A batch goes when it has this many records, or when its first is this old.
const BATCH_RECORDS: usize = 512;
const BATCH_DELAY: Duration = Duration::from_secs(1);
/// Waits before the second and third try of a batch.
const RETRIES: [Duration; 2] = [Duration::from_secs(1), Duration::from_secs(2)];

/// The exporter as users turn it on; the rest is the OpenTelemetry variables'.
#[derive(Debug, Default, clap::Args, serde::Serialize, serde::Deserialize)]
#[serde(default)]
#[group(id = "otlp_settings")]
pub struct Flags {
    /// Send every event and incident as an OTLP log record (`on`/`off`), where the
    /// OTEL_EXPORTER_OTLP_* variables say (endpoint, protocol grpc or http/protobuf, headers,
    /// timeout, certificates) [default: off].
    #[arg(long, env = "KSTALL_EXPORT_OTLP", value_name = "on|off")]
    pub export_otlp: Option<String>,
}

impl Flags {
    /// `None` when off; the variables are read, and the certificates they name checked, now.
    pub fn settings(self) -> Result<Option<Settings>, Invalid> {
        if on_off("export_otlp", self.export_otlp)? != Some(true) {
            return Ok(None);
        }
        let settings = settings::from_env(|name| std::env::var(name).ok())?;
        transport::Transport::check(&settings).map_err(|e| ("export_otlp", e))?;
        Ok(Some(settings))
    }
}

/// The exporter's tasks: the events' subscriber (ending once the exporter has sent or dropped
/// what was queued), and the incidents' feed for the evaluator.
pub fn start(
    settings: Settings,
    node: String,
    events: &broadcast::Sender<Arc<Attributed>>,
    metrics: Arc<Metrics>,
    stop: CancellationToken,
) -> (impl Future<Output = ()> + use<>, Feed) {
    let exporter_stop = stop.clone();
    stream::start(
        "otlp",
        "kstall-otlp",
        events,
        metrics.clone(),
        stop,
        Box::new(move |records| export_all(records, &settings, &node, &metrics, &exporter_stop)),
    )
}

/// Batches and sends until every producer is gone. Its own single-threaded runtime runs each
/// send: the gRPC channel's and the HTTP client's tasks live there, off the agent's.
fn export_all(
    rx: Receiver<Record>,
    settings: &Settings,
    node: &str,
    metrics: &Metrics,
    stop: &CancellationToken,
) {
    let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(runtime) => runtime,
        Err(e) => {
            tracing::error!(error = %e, "cannot start the OTLP exporter");
            return;
        }
    };
    // Checked at start; built inside the runtime, whose tasks it spawns.
    let mut transport = match runtime.block_on(async { transport::Transport::new(settings) }) {
        Ok(transport) => transport,
        Err(e) => {
            tracing::error!(error = %e, "cannot start the OTLP exporter");
            return;
        }
    };
    let mut failing = false;
    while let Some(batch) = next_batch(&rx) {
        let counts = batch.counts();
        let request = batch.into_request(node, &settings.service_name, &settings.resource);
        let mut result = runtime.block_on(transport.send(request.clone()));
        for wait in RETRIES {
            match &result {
                Err(failure) if failure.retryable && !stop.is_cancelled() => {
                    std::thread::sleep(wait);
                    result = runtime.block_on(transport.send(request.clone()));
                }
                _ => break,
            }
        }
        match result {
            Ok(rejected) => {
                if failing {
                    tracing::info!(endpoint = %settings.endpoint, "the OTLP endpoint takes records again");
                    failing = false;
                }
                for (record, n) in counts {
                    metrics.export_written("otlp", record, n);
                }
                if rejected > 0 {
                    // The endpoint says how many, not which: events are nearly all of them.
                    metrics.export_dropped("otlp", "event", "rejected", rejected);
                }
            }
            Err(failure) => {
                if !failing {
                    tracing::warn!(endpoint = %settings.endpoint, error = %failure.message,
                        "the OTLP endpoint refused records; counting what is dropped in kstall_export_records_dropped_total");
                    failing = true;
                }
                for (record, n) in counts {
                    metrics.export_dropped("otlp", record, "write_error", n);
                }
            }
        }
    }
}

/// The next batch: waits for a first record, then takes more until the batch is full or its
/// first record is [`BATCH_DELAY`] old. `None` once every producer is gone and nothing is left.
fn next_batch(rx: &Receiver<Record>) -> Option<records::Batch> {
    let first = rx.recv().ok()?;
    let observed = crate::kernel::unix_now_ns();
    let mut batch = records::Batch::default();
    batch.push(&first, observed);
    let due = Instant::now() + BATCH_DELAY;
    while batch.len() < BATCH_RECORDS {
        match rx.recv_timeout(due.saturating_duration_since(Instant::now())) {
            Ok(record) => batch.push(&record, crate::kernel::unix_now_ns()),
            Err(RecvTimeoutError::Timeout | RecvTimeoutError::Disconnected) => break,
        }
    }
    Some(batch)
}
