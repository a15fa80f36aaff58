//! The record stream the log outputs share (the JSON lines, OTLP): every event and every
//! incident's change as one `kstall/v1` record, numbered, queued to the output's own writer.
//!
//! Never on the event path's clock: a queue full because the output is behind (a pipe nobody
//! reads, an endpoint down) drops the record and counts it. `seq` numbers every record offered,
//! so a gap in what the output wrote is exactly what was dropped.

use std::{
    sync::{
        Arc, Mutex,
        mpsc::{self, Receiver, SyncSender, TrySendError},
    },
    time::Duration,
};

use serde::Serialize;
use tokio::sync::{broadcast, oneshot};
use tokio_util::sync::CancellationToken;

use super::metrics::Metrics;
use crate::{
    attribution::Attributed,
    incidents::{
        Incident,
        evaluator::{Evaluation, Subscriber},
    },
};

pub const SCHEMA: &str = "kstall/v1";

/// Records queued for an output: a storm's burst of resets rides it out, a stopped consumer fills
/// it in a fraction of a second and the rest is dropped (counted), not held in memory.
const QUEUE_RECORDS: usize = 16_384;

/// The record itself: an event as the API socket streams it, or an incident's change with the
/// incident as `/api/v1/incidents` lists it.
#[derive(Serialize)]
#[serde(untagged)]
pub enum Body {
    Event { event: Arc<Attributed> },
    Incident { transition: Transition, incident: Box<Incident> },
}

#[derive(Debug, Clone, Copy, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Transition {
    Fired,
    Resolved,
}

impl Body {
    /// The `record` field, and the metrics' `record` label.
    pub fn record(&self) -> &'static str {
        match self {
            Body::Event { .. } => "event",
            Body::Incident { .. } => "incident",
        }
    }
}

/// One record as its output takes it from the queue.
pub struct Record {
    pub seq: u64,
    /// When it happened: the kernel's time of an event, the evaluation's of an incident's change.
    pub time_unix_ns: u64,
    pub body: Body,
}

/// A lock that survives a panic elsewhere while it was held.
fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The producers' side: numbers each record and queues it, or drops and counts it.
#[derive(Clone)]
pub(super) struct Offer {
    /// The `output` label of the counts.
    output: &'static str,
    next: Arc<Mutex<(u64, SyncSender<Record>)>>,
    metrics: Arc<Metrics>,
}

impl Offer {
    pub(super) fn send(&self, time_unix_ns: u64, body: Body) {
        let record = body.record();
        let mut next = lock(&self.next);
        next.0 += 1;
        let queued = Record { seq: next.0, time_unix_ns, body };
        if let Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) = next.1.try_send(queued) {
            self.metrics.export_dropped(self.output, record, "behind", 1);
        }
    }

    /// `n` events the broadcast dropped before this subscriber took them: numbered all the same,
    /// so the gap shows.
    fn lagged(&self, n: u64) {
        lock(&self.next).0 += n;
        self.metrics.export_dropped(self.output, "event", "behind", n);
    }
}

/// The incidents' feed for the evaluator: an evaluation's changes, queued.
pub struct Feed(Offer);

impl Feed {
    pub(super) fn changes(&self, now_unix_ns: u64, fired: &[Incident], resolved: &[Incident]) {
        for (transition, incidents) in [(Transition::Fired, fired), (Transition::Resolved, resolved)] {
            for incident in incidents {
                let body = Body::Incident { transition, incident: Box::new(incident.clone()) };
                self.0.send(now_unix_ns, body);
            }
        }
    }
}

impl Subscriber for Feed {
    fn publish(&mut self, evaluation: &Evaluation) {
        self.changes(evaluation.now_unix_ns, evaluation.fired, evaluation.resolved);
    }
}

/// The stream for `output`: `write` takes the records from the queue on a thread of its own
/// (`thread`) until every producer is gone. Returns the events' subscriber and the incidents'
/// feed. `stop` comes after the event path has drained the kernel's last events: what the
/// broadcast still holds is taken first, and the subscriber ends once `write` has returned (or,
/// stuck on its consumer, after 2 s).
pub fn start(
    output: &'static str,
    thread: &str,
    events: &broadcast::Sender<Arc<Attributed>>,
    metrics: Arc<Metrics>,
    stop: CancellationToken,
    write: Box<dyn FnOnce(Receiver<Record>) + Send>,
) -> (impl Future<Output = ()> + use<>, Feed) {
    let (tx, records) = mpsc::sync_channel(QUEUE_RECORDS);
    let offer = Offer { output, next: Arc::new(Mutex::new((0, tx))), metrics };
    let (done_tx, done) = oneshot::channel();
    std::thread::Builder::new()
        .name(thread.into())
        .spawn(move || {
            write(records);
            let _ = done_tx.send(());
        })
        .expect("spawn an output's writer");
    let mut subscribed = events.subscribe();
    let events_offer = offer.clone();
    let events_task = async move {
        loop {
            let event = tokio::select! {
                biased;
                event = subscribed.recv() => event,
                _ = stop.cancelled() => break,
            };
            match event {
                Ok(event) => {
                    let time = event.event.header.time_unix_ns;
                    events_offer.send(time, Body::Event { event });
                }
                Err(broadcast::error::RecvError::Lagged(n)) => events_offer.lagged(n),
                Err(broadcast::error::RecvError::Closed) => break,
            }
        }
        drop(events_offer);
        let _ = tokio::time::timeout(Duration::from_secs(2), done).await;
    };
    (events_task, Feed(offer))
}

#[cfg(test)]
pub(super) fn offer_for_tests(
    output: &'static str,
    queue: usize,
    metrics: Arc<Metrics>,
) -> (Offer, Receiver<Record>) {
    let (tx, rx) = mpsc::sync_channel(queue);
    (Offer { output, next: Arc::new(Mutex::new((0, tx))), metrics }, rx)
}
