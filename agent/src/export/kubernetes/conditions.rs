//! The node conditions kstall owns, in node-problem-detector's convention that drain
//! controllers, node auto-repair and dashboards already read: `True` with the incident's reason
//! and summary while its signature fires on the node, `False` when it resolved. Each is opt-in
//! (`--node-conditions`), because some clusters act on conditions by themselves.
//!
//! Written with a strategic merge patch of the Node's status, which merges `conditions` by
//! `type`: the kubelet's and other owners' conditions are never touched. A change of status or
//! reason is written at once, the messages and `lastHeartbeatTime` every `heartbeat`; the
//! evaluator publishes what the conditions should say on a `watch` channel (the latest wins), so
//! it never waits on the API.

use std::{
    collections::BTreeMap,
    sync::Arc,
    time::{Duration, Instant},
};

use k8s_openapi::{
    api::core::v1::{Node, NodeCondition},
    apimachinery::pkg::apis::meta::v1::Time,
    jiff::Timestamp,
};
use kube::{
    Api, Client,
    api::{Patch, PatchParams},
};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::{Outcomes, REQUEST_TIMEOUT, reason, truncate};
use crate::{
    export::metrics::Metrics,
    incidents::{
        Incident,
        evaluator::{Evaluation, Subscriber},
        signatures::{
            conntrack_table_full, cpu_soft_lockup, kubelet_degraded, nfs_node_wide_stall, system_oom,
        },
    },
};

/// The longest message written; the API has no limit, `kubectl describe node` has a screen.
const MESSAGE_BYTES: usize = 1024;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Condition {
    NfsClientStalled,
    KernelSystemOom,
    KubeletDegraded,
    CpuSoftLockup,
    ConntrackTableFull,
}

impl Condition {
    pub const ALL: [Condition; 5] = [
        Condition::NfsClientStalled,
        Condition::KernelSystemOom,
        Condition::KubeletDegraded,
        Condition::CpuSoftLockup,
        Condition::ConntrackTableFull,
    ];

    /// The condition's `type`, as `--node-conditions` names it.
    pub fn type_name(self) -> &'static str {
        match self {
            Condition::NfsClientStalled => "NFSClientStalled",
            Condition::KernelSystemOom => "KernelSystemOOM",
            Condition::KubeletDegraded => "KubeletDegraded",
            Condition::CpuSoftLockup => "CPUSoftLockup",
            Condition::ConntrackTableFull => "ConntrackTableFull",
        }
    }

    pub fn parse(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|c| c.type_name() == name)
    }

    /// The signature whose firing incidents set it `True`.
    fn signature(self) -> &'static str {
        match self {
            Condition::NfsClientStalled => nfs_node_wide_stall::NAME,
            Condition::KernelSystemOom => system_oom::NAME,
            Condition::KubeletDegraded => kubelet_degraded::NAME,
            Condition::CpuSoftLockup => cpu_soft_lockup::NAME,
            Condition::ConntrackTableFull => conntrack_table_full::NAME,
        }
    }

    /// Whether `incident` is the node's: a full table in one pod's namespace is that pod's
    /// trouble, not the node's condition.
    pub(super) fn is_set_by(self, incident: &Incident) -> bool {
        incident.signature == self.signature()
            && (self != Condition::ConntrackTableFull || incident.pod.is_empty())
    }

    /// Reason and message while `False`.
    fn healthy(self) -> (&'static str, &'static str) {
        match self {
            Condition::NfsClientStalled => {
                ("NoNFSClientStall", "kstall sees no NFS client stall across this node's pods")
            }
            Condition::KernelSystemOom => {
                ("NoSystemOOM", "kstall saw no recent system OOM kill on this node")
            }
            Condition::KubeletDegraded => ("KubeletHealthy", "kstall finds the kubelet healthy"),
            Condition::CpuSoftLockup => {
                ("NoCPUSoftLockup", "the kernel reported no CPU stuck in the kernel on this node recently")
            }
            Condition::ConntrackTableFull => (
                "ConntrackTableHasRoom",
                "kstall saw the node's connection tracking table drop no new connection recently",
            ),
        }
    }
}

/// Why a condition is `True`.
#[derive(Debug, Clone, PartialEq)]
pub struct Cause {
    pub reason: String,
    pub message: String,
}

/// What each enabled condition should say now: `None` is `False`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Wanted(pub BTreeMap<Condition, Option<Cause>>);

/// The enabled conditions as the firing incidents set them: each by the most severe (then
/// oldest) incident of its signature.
/// The evaluator's side of the writer: what the enabled conditions should say now, handed over
/// when it changes.
pub struct Feed {
    enabled: Vec<Condition>,
    wanted: watch::Sender<Wanted>,
}

impl Subscriber for Feed {
    fn publish(&mut self, evaluation: &Evaluation) {
        let now = wanted(&self.enabled, evaluation.firing.iter());
        self.wanted.send_if_modified(|w| std::mem::replace(w, now.clone()) != now);
    }
}

/// The conditions' writer and the subscriber that feeds it.
pub fn writer(
    client: Client,
    node: String,
    settings: Settings,
    enabled: Vec<Condition>,
    metrics: Arc<Metrics>,
    stop: CancellationToken,
) -> (impl Future<Output = ()>, Feed) {
    let (feed, wanted_rx) = watch::channel(wanted(&enabled, std::iter::empty()));
    (run(client, node, settings, wanted_rx, metrics, stop), Feed { enabled, wanted: feed })
}

pub fn wanted<'a>(enabled: &[Condition], firing: impl Iterator<Item = &'a Incident>) -> Wanted {
    let mut by_condition: BTreeMap<Condition, &Incident> = BTreeMap::new();
    for incident in firing {
        for &c in enabled.iter().filter(|c| c.is_set_by(incident)) {
            let slot = by_condition.entry(c).or_insert(incident);
            if (incident.severity, std::cmp::Reverse(incident.first_seen_unix_ns))
                > (slot.severity, std::cmp::Reverse(slot.first_seen_unix_ns))
            {
                *slot = incident;
            }
        }
    }
    Wanted(
        enabled
            .iter()
            .map(|&c| {
                let cause = by_condition.get(&c).map(|i| {
                    let mut message = format!(
                        "{} (kstall incident {}; runbook docs/runbooks/{}.md)",
                        i.summary, i.id, i.signature
                    );
                    truncate(&mut message, MESSAGE_BYTES);
                    Cause { reason: reason(&i.signature), message }
                });
                (c, cause)
            })
            .collect(),
    )
}

#[derive(Debug, Clone, Copy)]
pub struct Settings {
    /// Every condition is written again this often: fresh messages and `lastHeartbeatTime`,
    /// which tells a reader the condition is still looked after.
    pub heartbeat: Duration,
    /// A write that failed is tried again after this long.
    pub retry: Duration,
}

impl Default for Settings {
    fn default() -> Self {
        Self { heartbeat: Duration::from_secs(60), retry: Duration::from_secs(10) }
    }
}

/// A condition as last written.
struct Written {
    status: bool,
    reason: String,
    transition: Timestamp,
}

/// Keeps `node`'s conditions as `wanted` says until `stop`: all of them at start (so each is
/// there, `False`, before anything fires), on each change of status or reason, and every
/// heartbeat.
pub async fn run(
    client: Client,
    node: String,
    settings: Settings,
    mut wanted: watch::Receiver<Wanted>,
    metrics: Arc<Metrics>,
    stop: CancellationToken,
) {
    let api: Api<Node> = Api::all(client);
    let mut outcomes = Outcomes::new(
        "node_condition",
        "a node condition",
        "the service account needs patch on nodes/status: deploy/components/node-conditions",
        metrics,
    );
    let mut written: BTreeMap<Condition, Written> = BTreeMap::new();
    let mut last: Option<(Instant, bool)> = None;
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            changed = wanted.changed() => if changed.is_err() { return },
            _ = tick.tick() => {}
        }
        let now_wanted = wanted.borrow_and_update().clone();
        let changed = now_wanted.0.iter().any(|(c, cause)| {
            let reason = cause.as_ref().map_or(c.healthy().0, |cause| cause.reason.as_str());
            written.get(c).is_none_or(|w| w.status != cause.is_some() || w.reason != reason)
        });
        let due = match last {
            None => true,
            Some((at, false)) => at.elapsed() >= settings.retry,
            Some((at, true)) => changed || at.elapsed() >= settings.heartbeat,
        };
        if !due {
            continue;
        }
        let now = Timestamp::now();
        let mut next = BTreeMap::new();
        let conditions: Vec<NodeCondition> = now_wanted
            .0
            .iter()
            .map(|(&c, cause)| {
                let status = cause.is_some();
                let (reason, message) = match cause {
                    Some(cause) => (cause.reason.clone(), cause.message.clone()),
                    None => (c.healthy().0.to_string(), c.healthy().1.to_string()),
                };
                let transition = match written.get(&c) {
                    Some(w) if w.status == status => w.transition,
                    _ => now,
                };
                next.insert(c, Written { status, reason: reason.clone(), transition });
                NodeCondition {
                    type_: c.type_name().into(),
                    status: if status { "True" } else { "False" }.into(),
                    reason: Some(reason),
                    message: Some(message),
                    last_heartbeat_time: Some(Time(now)),
                    last_transition_time: Some(Time(transition)),
                }
            })
            .collect();
        let patch = serde_json::json!({ "status": { "conditions": conditions } });
        let (params, patch) = (PatchParams::default(), Patch::Strategic(&patch));
        let request = api.patch_status(&node, &params, &patch);
        // A write in flight is abandoned at shutdown, not waited for.
        let outcome = tokio::select! {
            _ = stop.cancelled() => return,
            outcome = tokio::time::timeout(REQUEST_TIMEOUT, request) => outcome,
        };
        let ok = outcomes.record("patched", outcome);
        if ok {
            written = next;
        }
        last = Some((Instant::now(), ok));
    }
}

#[cfg(test)]
mod tests;
