//! Kubernetes Events for incidents (`events.k8s.io/v1`), where `kubectl describe pod` and
//! `kubectl get events` show them: an incident about a pod posts a Warning on that pod, a
//! node-wide one on the Node (with the node's name as its UID, as the kubelet's own node events
//! are). The API server validates an `events.k8s.io/v1` Event strictly on create: the deprecated
//! `source` must be unset, and an Event about a cluster-scoped object must be in `kube-system` —
//! the only namespace 1.20 accepts for it (later versions also take `default`). Repeats of one reason on one object are one Event with a growing
//! `series.count`, as client-go's event recorder keeps them: the first is created at once, the
//! count is patched at most once per `series_interval` per Event, and an Event not seen again for
//! `forget_after` is closed (the next occurrence creates a new one).
//!
//! Its own task behind a bounded queue the evaluator never waits on: a slow or refusing API server
//! costs Events (counted in `kstall_kubernetes_writes_total`), never the event path or incidents.

use std::{
    collections::HashMap,
    sync::Arc,
    time::{Duration, Instant},
};

use k8s_openapi::{
    api::{
        core::v1::ObjectReference,
        events::v1::{Event, EventSeries},
    },
    apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta},
    jiff::Timestamp,
};
use kube::{
    Api, Client,
    api::{Patch, PatchParams, PostParams},
};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::{CONTROLLER, Outcomes, REQUEST_TIMEOUT, reason, truncate};
use crate::{
    export::metrics::Metrics,
    incidents::{
        Incident,
        evaluator::{Evaluation, Subscriber},
    },
};

/// Incidents that fired, batches waiting for the writer.
pub const QUEUE: usize = 64;
/// The API's limit on `note`.
const NOTE_BYTES: usize = 1024;
/// Where Events about the Node go: the one namespace every version's validation accepts for an
/// object without a namespace.
const NODE_EVENTS_NAMESPACE: &str = "kube-system";
/// Open Events remembered; beyond it the one seen longest ago is closed.
const MAX_OPEN: usize = 4096;

#[derive(Debug, Clone, Copy)]
pub struct Settings {
    pub series_interval: Duration,
    pub forget_after: Duration,
}

impl Default for Settings {
    fn default() -> Self {
        Self { series_interval: Duration::from_secs(30), forget_after: Duration::from_secs(600) }
    }
}

/// What an Event is about: the pod, or the node for node-wide incidents.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Regarding {
    kind: &'static str,
    namespace: String,
    name: String,
    uid: String,
}

/// One Event to post or count again.
#[derive(Debug, Clone, PartialEq)]
struct Notice {
    regarding: Regarding,
    reason: String,
    note: String,
}

/// The Event for an incident that fired on `node`; `None` for a pod incident without the pod's
/// UID (a pod kstall cannot name is no object to post on).
fn notice(incident: &Incident, node: &str) -> Option<Notice> {
    let regarding = if incident.pod.is_empty() {
        Regarding {
            kind: "Node",
            namespace: NODE_EVENTS_NAMESPACE.into(),
            name: node.into(),
            uid: node.into(),
        }
    } else {
        Regarding {
            kind: "Pod",
            namespace: incident.namespace.clone(),
            name: incident.pod.clone(),
            uid: incident.pod_uid.clone()?,
        }
    };
    let explain = if incident.pod.is_empty() {
        String::new()
    } else {
        format!("; kstall explain pod {}", incident.pod)
    };
    let capture = &incident.evidence[crate::incidents::engine::CAPTURE];
    let capture = match (capture["path"].as_str(), capture["id"].as_str()) {
        (Some(path), Some(id)) => {
            format!("; capture {path}: kubectl kstall capture get {id} --node {}", incident.node)
        }
        _ => String::new(),
    };
    let pointers = format!(
        " (kstall incident {}{explain}{capture}; runbook docs/runbooks/{}.md)",
        incident.id, incident.signature
    );
    // The summary gives way to the limit, never where to look next.
    let mut note = incident.summary.clone();
    truncate(&mut note, NOTE_BYTES.saturating_sub(pointers.len()).max('…'.len_utf8()));
    note.push_str(&pointers);
    truncate(&mut note, NOTE_BYTES);
    Some(Notice { regarding, reason: reason(&incident.signature), note })
}

/// Queues what fired for the writer; a full queue drops it, counted.
/// The evaluator's side of the writer: what fired, queued (a full queue drops and counts it).
pub struct Feed {
    queue: mpsc::Sender<Vec<Incident>>,
    metrics: Arc<Metrics>,
}

impl Subscriber for Feed {
    fn publish(&mut self, evaluation: &Evaluation) {
        offer(&self.queue, evaluation.fired, &self.metrics);
    }
}

/// The Event writer and the subscriber that feeds it.
pub fn writer(
    client: Client,
    node: String,
    settings: Settings,
    metrics: Arc<Metrics>,
    stop: CancellationToken,
) -> (impl Future<Output = ()>, Feed) {
    let (queue, fired) = mpsc::channel(QUEUE);
    (run(client, node, settings, fired, metrics.clone(), stop), Feed { queue, metrics })
}

pub fn offer(queue: &mpsc::Sender<Vec<Incident>>, fired: &[Incident], metrics: &Metrics) {
    if fired.is_empty() {
        return;
    }
    if queue.try_send(fired.to_vec()).is_err() {
        for _ in fired {
            metrics.kubernetes_write("event", "dropped");
        }
    }
}

/// An Event written, and the occurrences since.
struct Open {
    namespace: String,
    name: String,
    count: i32,
    written: i32,
    last_write: Instant,
    last_seen: Instant,
}

/// Posts the Events of what arrives on `fired` until `stop`.
pub async fn run(
    client: Client,
    node: String,
    settings: Settings,
    mut fired: mpsc::Receiver<Vec<Incident>>,
    metrics: Arc<Metrics>,
    stop: CancellationToken,
) {
    let outcomes = Outcomes::new(
        "event",
        "an Event",
        "the service account needs create and patch on events.k8s.io events: deploy/base/rbac.yaml",
        metrics,
    );
    let mut writer = Writer { client, node, settings, outcomes, open: HashMap::new() };
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    loop {
        let batch = tokio::select! {
            _ = stop.cancelled() => return,
            batch = fired.recv() => match batch {
                Some(incidents) => Some(incidents),
                None => return,
            },
            _ = tick.tick() => None,
        };
        // A write in flight is abandoned at shutdown, not waited for.
        let work = async {
            match batch {
                Some(incidents) => {
                    let node = writer.node.clone();
                    for notice in incidents.iter().filter_map(|i| notice(i, &node)) {
                        writer.occurred(notice).await;
                    }
                }
                None => writer.flush().await,
            }
        };
        tokio::select! {
            _ = stop.cancelled() => return,
            () = work => {}
        }
    }
}

struct Writer {
    client: Client,
    node: String,
    settings: Settings,
    outcomes: Outcomes,
    open: HashMap<(Regarding, String), Open>,
}

impl Writer {
    async fn occurred(&mut self, notice: Notice) {
        let now = Instant::now();
        let key = (notice.regarding.clone(), notice.reason.clone());
        if let Some(open) = self.open.get_mut(&key) {
            open.count += 1;
            open.last_seen = now;
            if now.duration_since(open.last_write) >= self.settings.series_interval {
                self.patch(&key).await;
            }
            return;
        }
        let event = self.event(&notice);
        let (namespace, name) =
            (notice.regarding.namespace.clone(), event.metadata.name.clone().unwrap_or_default());
        let api: Api<Event> = Api::namespaced(self.client.clone(), &namespace);
        let created = tokio::time::timeout(REQUEST_TIMEOUT, api.create(&PostParams::default(), &event)).await;
        if self.outcomes.record("created", created) {
            if self.open.len() >= MAX_OPEN
                && let Some(oldest) =
                    self.open.iter().min_by_key(|(_, o)| o.last_seen).map(|(k, _)| k.clone())
            {
                self.open.remove(&oldest);
            }
            self.open
                .insert(key, Open { namespace, name, count: 1, written: 1, last_write: now, last_seen: now });
        }
    }

    /// Patches the counts that are due; closes the Events not seen for `forget_after`.
    async fn flush(&mut self) {
        let now = Instant::now();
        let due: Vec<_> = self
            .open
            .iter()
            .filter(|(_, o)| {
                o.count > o.written && now.duration_since(o.last_write) >= self.settings.series_interval
            })
            .map(|(k, _)| k.clone())
            .collect();
        for key in due {
            self.patch(&key).await;
        }
        let forget_after = self.settings.forget_after;
        self.open.retain(|_, o| o.count > o.written || now.duration_since(o.last_seen) < forget_after);
    }

    async fn patch(&mut self, key: &(Regarding, String)) {
        let Some(open) = self.open.get(key) else { return };
        let series = EventSeries { count: open.count, last_observed_time: MicroTime(Timestamp::now()) };
        let patch = serde_json::json!({ "series": series });
        let api: Api<Event> = Api::namespaced(self.client.clone(), &open.namespace);
        let count = open.count;
        let patched = tokio::time::timeout(
            REQUEST_TIMEOUT,
            api.patch(&open.name, &PatchParams::default(), &Patch::Merge(&patch)),
        )
        .await;
        let gone = matches!(&patched, Ok(Err(kube::Error::Api(status))) if status.code == 404);
        if self.outcomes.record("patched", patched) {
            if let Some(open) = self.open.get_mut(key) {
                open.written = count;
                open.last_write = Instant::now();
            }
        } else if gone {
            // The API server expired it (its event TTL): the next occurrence starts a new one.
            self.open.remove(key);
        }
    }

    fn event(&self, notice: &Notice) -> Event {
        let now = Timestamp::now();
        let r = &notice.regarding;
        Event {
            metadata: ObjectMeta {
                name: Some(event_name(&r.name, now)),
                namespace: Some(r.namespace.clone()),
                ..ObjectMeta::default()
            },
            event_time: Some(MicroTime(now)),
            type_: Some("Warning".into()),
            reason: Some(notice.reason.clone()),
            action: Some("Detected".into()),
            note: Some(notice.note.clone()),
            regarding: Some(ObjectReference {
                api_version: Some("v1".into()),
                kind: Some(r.kind.into()),
                namespace: (r.kind == "Pod").then(|| r.namespace.clone()),
                name: Some(r.name.clone()),
                uid: Some(r.uid.clone()),
                ..ObjectReference::default()
            }),
            reporting_controller: Some(CONTROLLER.into()),
            reporting_instance: Some(reporting_instance(&self.node)),
            ..Event::default()
        }
    }
}

/// `<object>.<nanoseconds in hex>`, as client-go names Events, cut to fit a DNS subdomain (253):
/// a pod's name may be 253 characters itself.
fn event_name(object: &str, now: Timestamp) -> String {
    let suffix = format!(".{:x}", now.as_nanosecond());
    let name = cut(object, 253 - suffix.len()).trim_end_matches(['.', '-']);
    format!("{name}{suffix}")
}

/// `kstall-<node>`, cut to the 128 characters the API allows (node names may be 253).
fn reporting_instance(node: &str) -> String {
    cut(&format!("{CONTROLLER}-{node}"), 128).to_string()
}

/// The first `bytes` of `name` (object names are ASCII; a stray character ends it early).
fn cut(name: &str, bytes: usize) -> &str {
    let mut end = bytes.min(name.len());
    while !name.is_char_boundary(end) {
        end -= 1;
    }
    &name[..end]
}

#[cfg(test)]
mod tests;
