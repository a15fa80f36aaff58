//! NoSchedule taints for the node-wide signatures kstall owns (`--node-taints`, opt-in): a
//! scheduler keeps new pods off a node whose NFS client is stalled or whose CPU is stuck, and
//! remediation (medik8s, the descheduler's RemovePodsViolatingNodeTaints) acts on them. One
//! key per condition (`kstall.io/nfs-client-stalled`, ...), the same node-wide rule as the
//! conditions'.
//!
//! Added only after the signature has fired for `add_after` without a break, removed only after
//! it has been quiet for `remove_after`: a flapping signature does not flap the node's
//! schedulability. Others' taints are never touched: the Node's taint list is read, kstall's keys
//! set in it, and the whole list written back in a merge patch conditional on the Node's
//! `resourceVersion` (the API server refuses it with a conflict if anyone changed the Node
//! meanwhile; it is read again and retried).

use std::{
    collections::{BTreeMap, BTreeSet},
    sync::Arc,
    time::{Duration, Instant},
};

use k8s_openapi::api::core::v1::Node;
use kube::{
    Api, Client,
    api::{Patch, PatchParams},
};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::{Outcomes, REQUEST_TIMEOUT, conditions::Condition};
use crate::{
    export::metrics::Metrics,
    incidents::evaluator::{Evaluation, Subscriber},
};

/// The taint key of `condition`.
pub fn key(condition: Condition) -> &'static str {
    match condition {
        Condition::NfsClientStalled => "kstall.io/nfs-client-stalled",
        Condition::KernelSystemOom => "kstall.io/system-oom",
        Condition::KubeletDegraded => "kstall.io/kubelet-degraded",
        Condition::CpuSoftLockup => "kstall.io/cpu-soft-lockup",
        Condition::ConntrackTableFull => "kstall.io/conntrack-table-full",
    }
}

/// A taint as the Node's `spec.taints` holds it (what kstall reads and writes back).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Taint {
    pub key: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<String>,
    pub effect: String,
    #[serde(rename = "timeAdded", default, skip_serializing_if = "Option::is_none")]
    pub time_added: Option<String>,
}

/// How long a signature must fire, and then stay quiet, before its taint comes and goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Holds {
    pub add_after: Duration,
    pub remove_after: Duration,
}

impl Default for Holds {
    fn default() -> Self {
        Self { add_after: Duration::from_secs(120), remove_after: Duration::from_secs(300) }
    }
}

/// One condition's course: since when it has fired (or been quiet) without a break, and whether
/// its taint is on.
#[derive(Debug, Clone, Copy, Default)]
struct Course {
    firing_since: Option<u64>,
    quiet_since: Option<u64>,
    tainted: bool,
}

/// The taints kstall wants on the node, decided each evaluation from what fires.
#[derive(Debug, Default)]
pub struct Decisions {
    holds: Holds,
    courses: BTreeMap<Condition, Course>,
}

impl Decisions {
    pub fn new(holds: Holds) -> Self {
        Self { holds, courses: BTreeMap::new() }
    }

    /// With `firing` the enabled conditions that fire at `now_unix_ns`: the conditions whose
    /// taint should be on.
    pub fn step(
        &mut self,
        now_unix_ns: u64,
        enabled: &[Condition],
        firing: &BTreeSet<Condition>,
    ) -> BTreeSet<Condition> {
        let held = |since: Option<u64>, hold: Duration| {
            since.is_some_and(|t| now_unix_ns.saturating_sub(t) >= hold.as_nanos() as u64)
        };
        let mut on = BTreeSet::new();
        for &c in enabled {
            let course = self.courses.entry(c).or_default();
            if firing.contains(&c) {
                course.quiet_since = None;
                course.firing_since.get_or_insert(now_unix_ns);
                if held(course.firing_since, self.holds.add_after) {
                    course.tainted = true;
                }
            } else {
                course.firing_since = None;
                course.quiet_since.get_or_insert(now_unix_ns);
                if held(course.quiet_since, self.holds.remove_after) {
                    course.tainted = false;
                }
            }
            if course.tainted {
                on.insert(c);
            }
        }
        on
    }
}

/// `existing` with kstall's keys set to `wanted` (NoSchedule, added at `now`; a taint already on
/// keeps its time), every other taint as it was, in its place; `None` when nothing changes.
pub fn merged(existing: &[Taint], wanted: &BTreeSet<Condition>, now: &str) -> Option<Vec<Taint>> {
    let ours = |t: &Taint| Condition::ALL.iter().any(|&c| key(c) == t.key);
    let mut next: Vec<Taint> = existing
        .iter()
        .filter(|t| !ours(t) || wanted.iter().any(|&c| key(c) == t.key && t.effect == "NoSchedule"))
        .cloned()
        .collect();
    for &c in wanted {
        if !next.iter().any(|t| t.key == key(c)) {
            next.push(Taint {
                key: key(c).into(),
                value: Some("true".into()),
                effect: "NoSchedule".into(),
                time_added: Some(now.into()),
            });
        }
    }
    (next != existing).then_some(next)
}

/// The evaluator's side: decides each evaluation and hands the writer the taints wanted when
/// they change.
pub struct Feed {
    enabled: Vec<Condition>,
    decisions: Decisions,
    wanted: watch::Sender<BTreeSet<Condition>>,
}

impl Subscriber for Feed {
    fn publish(&mut self, evaluation: &Evaluation) {
        let firing: BTreeSet<Condition> = self
            .enabled
            .iter()
            .copied()
            .filter(|c| evaluation.firing.iter().any(|i| c.is_set_by(i)))
            .collect();
        let on = self.decisions.step(evaluation.now_unix_ns, &self.enabled, &firing);
        self.wanted.send_if_modified(|w| std::mem::replace(w, on.clone()) != on);
    }
}

/// The taints' writer and the subscriber that feeds it.
pub fn writer(
    client: Client,
    node: String,
    enabled: Vec<Condition>,
    holds: Holds,
    metrics: Arc<Metrics>,
    stop: CancellationToken,
) -> (impl Future<Output = ()>, Feed) {
    let (wanted, wanted_rx) = watch::channel(BTreeSet::new());
    let writer = run(client, node, wanted_rx, holds.remove_after, metrics, stop);
    (writer, Feed { enabled, decisions: Decisions::new(holds), wanted })
}

/// A write that failed (or lost a race) is tried again after this long.
const RETRY: Duration = Duration::from_secs(10);

/// Keeps the node's taints as `wanted` says until `stop`: on each change, and again after a
/// failure. A kstall taint found on the Node at start (an agent restarted, upgraded) is kept for
/// `inherited_for` unless its signature fires again — a restart must not lift a taint early —
/// and removed after that if nothing wants it. Each write is the list as read with kstall's keys
/// set, conditional on the Node's `resourceVersion`: a Node changed meanwhile is a 409, read again
/// at the next try.
async fn run(
    client: Client,
    node: String,
    mut wanted: watch::Receiver<BTreeSet<Condition>>,
    inherited_for: Duration,
    metrics: Arc<Metrics>,
    stop: CancellationToken,
) {
    let started = Instant::now();
    // Read at the first write: kstall's taints the Node had then.
    let mut inherited: Option<BTreeSet<Condition>> = None;
    let api: Api<Node> = Api::all(client);
    let mut outcomes = Outcomes::new(
        "node_taint",
        "a node taint",
        "the service account needs patch on nodes: deploy/components/node-taints",
        metrics,
    );
    let mut pending = true;
    let mut last_try: Option<Instant> = None;
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            changed = wanted.changed() => if changed.is_err() { return } else { pending = true },
            _ = tick.tick() => {}
        }
        if inherited.as_ref().is_some_and(|i| !i.is_empty()) && started.elapsed() >= inherited_for {
            inherited = Some(BTreeSet::new());
            pending = true;
        }
        if !pending || last_try.is_some_and(|at| at.elapsed() < RETRY) {
            continue;
        }
        last_try = Some(Instant::now());
        let on = wanted.borrow_and_update().clone();
        let read = tokio::select! {
            _ = stop.cancelled() => return,
            read = tokio::time::timeout(REQUEST_TIMEOUT, api.get(&node)) => read,
        };
        let current = match read {
            Ok(Ok(current)) => current,
            other => {
                outcomes.record("read", other);
                continue;
            }
        };
        let existing: Vec<Taint> = current
            .spec
            .as_ref()
            .and_then(|s| s.taints.as_ref())
            .map(|taints| {
                taints
                    .iter()
                    .filter_map(|t| serde_json::from_value(serde_json::to_value(t).ok()?).ok())
                    .collect()
            })
            .unwrap_or_default();
        let inherited = inherited.get_or_insert_with(|| {
            Condition::ALL.into_iter().filter(|&c| existing.iter().any(|t| t.key == key(c))).collect()
        });
        let on: BTreeSet<Condition> = on.union(inherited).copied().collect();
        let now = jiff::Timestamp::now().strftime("%Y-%m-%dT%H:%M:%SZ").to_string();
        let Some(next) = merged(&existing, &on, &now) else {
            pending = false;
            continue;
        };
        let patch = serde_json::json!({
            "metadata": {"resourceVersion": current.metadata.resource_version},
            "spec": {"taints": next},
        });
        let (params, patch) = (PatchParams::default(), Patch::Merge(&patch));
        let request = api.patch(&node, &params, &patch);
        let outcome = tokio::select! {
            _ = stop.cancelled() => return,
            outcome = tokio::time::timeout(REQUEST_TIMEOUT, request) => outcome,
        };
        let conflict = matches!(&outcome, Ok(Err(kube::Error::Api(status))) if status.code == 409);
        if outcomes.record("patched", outcome) {
            pending = false;
            // Wrote it: the next change may go at once.
            last_try = None;
        } else if conflict {
            // The Node changed between the read and the write (a status update, a taint of
            // someone else's): read it again at the next tick, not after the error's wait.
            last_try = None;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SEC: u64 = 1_000_000_000;

    #[test]
    fn a_taint_comes_after_the_hold_and_goes_only_after_the_quiet_hold() {
        let holds = Holds { add_after: Duration::from_secs(120), remove_after: Duration::from_secs(300) };
        let mut d = Decisions::new(holds);
        let enabled = [Condition::NfsClientStalled, Condition::CpuSoftLockup];
        let stalled = BTreeSet::from([Condition::NfsClientStalled]);
        let none = BTreeSet::new();
        assert!(d.step(0, &enabled, &stalled).is_empty(), "not at once");
        assert!(d.step(119 * SEC, &enabled, &stalled).is_empty());
        assert_eq!(d.step(120 * SEC, &enabled, &stalled), stalled, "after two minutes of firing");
        // A gap resets the firing hold, not the taint: it stays through short quiets.
        assert_eq!(d.step(121 * SEC, &enabled, &none), stalled);
        assert_eq!(d.step(400 * SEC, &enabled, &stalled), stalled, "fired again within the quiet hold");
        assert_eq!(d.step(401 * SEC, &enabled, &none), stalled);
        assert_eq!(d.step(700 * SEC, &enabled, &none), stalled, "299 s quiet");
        assert!(d.step(701 * SEC, &enabled, &none).is_empty(), "300 s quiet: removed");
        // A flapping signature never taints: each break starts the firing hold again.
        for t in 0..20 {
            let firing = if t % 2 == 0 { &stalled } else { &none };
            assert!(d.step((1000 + 60 * t) * SEC, &enabled, firing).is_empty(), "flap {t}");
        }
    }

    #[test]
    fn every_taint_key_is_documented_and_in_the_descheduler_example() {
        let readme = include_str!("../../../../docs/kubernetes.md");
        let policy = include_str!("../../../../deploy/remediation/descheduler-policy.yaml");
        for c in Condition::ALL {
            assert!(readme.contains(&format!("`{}`", key(c))), "docs/kubernetes.md: {}", key(c));
            assert!(policy.contains(&format!("- {}\n", key(c))), "descheduler-policy.yaml: {}", key(c));
        }
    }

    fn taint(key: &str, effect: &str) -> Taint {
        Taint { key: key.into(), value: None, effect: effect.into(), time_added: None }
    }

    #[test]
    fn only_kstalls_own_taints_are_set_the_others_stay_as_they_were() {
        let theirs = vec![
            taint("node.kubernetes.io/unreachable", "NoExecute"),
            taint("dedicated", "NoSchedule"),
            taint("kstall.io/cpu-soft-lockup", "NoSchedule"),
        ];
        let wanted = BTreeSet::from([Condition::NfsClientStalled]);
        let next = merged(&theirs, &wanted, "2026-12-05T10:00:00Z").unwrap();
        let keys: Vec<&str> = next.iter().map(|t| t.key.as_str()).collect();
        assert_eq!(keys, ["node.kubernetes.io/unreachable", "dedicated", "kstall.io/nfs-client-stalled"]);
        assert_eq!(next[2].time_added.as_deref(), Some("2026-12-05T10:00:00Z"));
        assert_eq!(merged(&next, &wanted, "2026-12-05T11:00:00Z"), None, "already so: no write");
        // Someone else's taint under a key kstall does not own, in kstall's domain, is theirs.
        let foreign = vec![taint("kstall.io/maintenance", "NoSchedule")];
        assert_eq!(merged(&foreign, &BTreeSet::new(), "t"), None);
        // kstall's key with another effect (set by hand) is replaced by kstall's when wanted,
        // removed when not.
        let by_hand = vec![taint("kstall.io/nfs-client-stalled", "NoExecute")];
        let next = merged(&by_hand, &wanted, "t").unwrap();
        assert_eq!((next.len(), next[0].effect.as_str()), (1, "NoSchedule"));
        assert_eq!(merged(&by_hand, &BTreeSet::new(), "t"), Some(vec![]));
    }
}
