//! The evaluator: once a second it asks the signatures what fires with the node as it is now
//! (stuck tasks, memory, the kubelet's pods and health), logs what started and what ended, and
//! publishes the result to its [`Subscriber`]s — the metrics, the Alertmanager pusher, Kubernetes
//! Events, node conditions, the state file. It knows none of them: a new output is a subscriber
//! and one line where the agent starts them.

use std::{
    sync::{Arc, Mutex, MutexGuard, PoisonError},
    time::{Duration, Instant},
};

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::{Incident, NodeView, engine::Engine, saved::Saved};
use crate::{attribution::Index, conntrack, kernel, kubelet, pressure, stuck::StuckSet};

const EVALUATION_INTERVAL: Duration = Duration::from_secs(1);

/// While incidents fire, their last-seen times and evidence reach the state directory this often
/// (what fires or resolves is written at once).
const SAVE_FIRING_EVERY: Duration = Duration::from_secs(30);

/// What one evaluation found.
pub struct Evaluation<'a> {
    pub now_unix_ns: u64,
    /// Every incident firing now.
    pub firing: &'a [Incident],
    /// What started firing in this evaluation.
    pub fired: &'a [Incident],
    /// What stopped.
    pub resolved: &'a [Incident],
    /// Per signature, the per-key states dropped at its cap so far.
    pub evictions: &'a [(&'static str, u64)],
    /// The kubelet's health as the signatures saw it.
    pub kubelet: &'a kubelet::Health,
    /// The connection tracking tables as the signatures saw them.
    pub conntrack: &'a conntrack::Tables,
    /// Pressure as the signatures saw it.
    pub pressure: &'a pressure::Sample,
    /// The incident history to keep, when it is due: when something fired or resolved, and
    /// every 30 s while something fires.
    pub history: Option<&'a Arc<Saved>>,
}

pub trait Subscriber: Send {
    /// Takes an evaluation. Called under the engine's lock (the API and every output agree on
    /// what fires), so it never waits: a subscriber behind queues, skips or counts what it drops.
    fn publish(&mut self, evaluation: &Evaluation);

    /// The agent stops: the last history.
    fn stopping(&mut self, _history: &Arc<Saved>) {}
}

/// Acts when an incident fires (a capture of its pod, `--capture-on`), and says what it did as
/// one evidence entry, which the incident carries from then on — in the very evaluation the
/// subscribers see. Called under the engine's lock: it decides and hands off, never waits.
pub trait Trigger: Send {
    fn fired(&mut self, incident: &Incident, index: &Index) -> Option<(&'static str, serde_json::Value)>;
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// What the evaluator reads of the node, each owned by its own task.
pub struct Inputs {
    pub stuck: Arc<Mutex<StuckSet>>,
    pub index: watch::Receiver<Arc<Index>>,
    pub kubelet: watch::Receiver<kubelet::Health>,
    pub conntrack: watch::Receiver<Arc<conntrack::Tables>>,
    pub pressure: watch::Receiver<Arc<pressure::Sample>>,
}

/// Evaluates once a second until `stop`, running the triggers on what fired and publishing each
/// evaluation to every subscriber.
pub async fn run(
    engine: Arc<Mutex<Engine>>,
    inputs: Inputs,
    mut triggers: Vec<Box<dyn Trigger>>,
    mut subscribers: Vec<Box<dyn Subscriber>>,
    stop: CancellationToken,
) {
    let Inputs { stuck, index, kubelet, conntrack, pressure } = inputs;
    let mut tick = tokio::time::interval(EVALUATION_INTERVAL);
    let mut last_saved = Instant::now();
    loop {
        tokio::select! {
            _ = stop.cancelled() => {
                let history = Arc::new(lock(&engine).saved(kernel::unix_now_ns()));
                for subscriber in &mut subscribers {
                    subscriber.stopping(&history);
                }
                return;
            }
            _ = tick.tick() => {}
        }
        let now = kernel::unix_now_ns();
        let index = index.borrow().clone();
        let kubelet = kubelet.borrow().clone();
        let conntrack = conntrack.borrow().clone();
        let pressure = pressure.borrow().clone();
        let stuck = lock(&stuck);
        let mut engine = lock(&engine);
        let node = NodeView {
            stuck: &stuck,
            memory: index.memory,
            kubelet_load: &index.kubelet_load,
            kubelet: &kubelet,
            conntrack: &conntrack,
            pod_ips: &index.by_pod_ip,
            nfs_mount_ports: &index.nfs_mount_ports,
            pressure: &pressure,
        };
        let mut changes = engine.evaluate(now, &node);
        drop(stuck);
        for incident in &mut changes.fired {
            for trigger in &mut triggers {
                let Some((key, value)) = trigger.fired(incident, &index) else { continue };
                engine.annotate(&incident.id, key, value.clone());
                if let Some(evidence) = incident.evidence.as_object_mut() {
                    evidence.insert(key.to_string(), value);
                }
            }
        }
        for i in &changes.fired {
            tracing::warn!(id = %i.id, severity = i.severity.as_str(), namespace = %i.namespace, pod = %i.pod, summary = %i.summary, "incident firing");
        }
        for i in &changes.resolved {
            tracing::info!(id = %i.id, "incident resolved");
        }
        let firing: Vec<Incident> = engine.firing().cloned().collect();
        let changed = !changes.fired.is_empty() || !changes.resolved.is_empty();
        let history =
            (changed || (!firing.is_empty() && last_saved.elapsed() >= SAVE_FIRING_EVERY)).then(|| {
                last_saved = Instant::now();
                Arc::new(engine.saved(now))
            });
        let evaluation = Evaluation {
            now_unix_ns: now,
            firing: &firing,
            fired: &changes.fired,
            resolved: &changes.resolved,
            evictions: &engine.evictions(),
            kubelet: &kubelet,
            conntrack: &conntrack,
            pressure: &pressure,
            history: history.as_ref(),
        };
        for subscriber in &mut subscribers {
            subscriber.publish(&evaluation);
        }
    }
}
