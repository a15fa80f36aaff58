//! Turns the signatures' findings into incidents: a stable id per (signature, node, key), `firing`
//! until the signature stops reporting it, then `resolved` (kept a while as history), and links
//! between incidents that explain one another.

use std::collections::{HashMap, VecDeque};

use super::{
    Finding, Incident, NodeView, Settings, Signature, State,
    saved::Saved,
    signatures::{
        conntrack_table_full::{self, ConntrackTableFull},
        container_oom_loop::{self, ContainerOomLoop},
        cpu_soft_lockup::{self, CpuSoftLockup},
        kubelet_degraded::{self, KubeletDegraded},
        memory_pressure::{self, MemoryPressure},
        network_policy_drops::{self, NetworkPolicyDrops},
        nfs_node_wide_stall::{self, NfsNodeWideStall},
        nfs_server_unreachable::{self, NfsServerUnreachable},
        nfs_sidecar_redirect::{self, NfsSidecarRedirect},
        nfs_slow::{self, NfsSlow},
        pod_termination_blocked::{self, PodTerminationBlocked},
        system_oom::{self, SystemOom},
    },
};
use crate::attribution::Attributed;

/// Resolved incidents kept for the API.
const HISTORY: usize = 1000;

/// Every signature's name, in the engine's order: what flags naming signatures are checked
/// against.
pub const NAMES: [&str; 12] = [
    nfs_sidecar_redirect::NAME,
    nfs_server_unreachable::NAME,
    nfs_node_wide_stall::NAME,
    nfs_slow::NAME,
    pod_termination_blocked::NAME,
    system_oom::NAME,
    cpu_soft_lockup::NAME,
    network_policy_drops::NAME,
    conntrack_table_full::NAME,
    memory_pressure::NAME,
    container_oom_loop::NAME,
    kubelet_degraded::NAME,
];

/// The evidence key of an incident's capture (`--capture-on`).
pub const CAPTURE: &str = "capture";

/// How long an incident that fired before a restart stays firing without its signature finding
/// it again: the signatures start empty, and the slowest evidence to come back (an NFS client's
/// reconnects, backing off to minutes) needs this long.
pub const CARRIED_OVER_FOR: std::time::Duration = std::time::Duration::from_secs(300);

pub struct Engine {
    node: String,
    signatures: Vec<Box<dyn Signature>>,
    firing: HashMap<String, Incident>,
    resolved: VecDeque<Incident>,
    /// Incidents restored as firing, until when they stay so unless found again.
    carried_over: HashMap<String, u64>,
    /// What others added to a firing incident's evidence (its capture), kept across evaluations:
    /// the signatures rebuild the evidence each time.
    annotations: HashMap<String, serde_json::Map<String, serde_json::Value>>,
}

/// What one evaluation changed.
#[derive(Debug, Default)]
pub struct Changes {
    pub fired: Vec<Incident>,
    pub resolved: Vec<Incident>,
}

impl Engine {
    /// Every signature, configured.
    pub fn new(node: String, settings: &Settings) -> Self {
        Self::with(
            node,
            vec![
                Box::new(NfsSidecarRedirect::new(settings)),
                Box::new(NfsServerUnreachable::new(settings)),
                Box::new(NfsNodeWideStall::new(settings)),
                Box::new(NfsSlow::new(settings)),
                Box::new(PodTerminationBlocked::new(settings)),
                Box::new(SystemOom::new(settings)),
                Box::new(CpuSoftLockup::new(settings)),
                Box::new(NetworkPolicyDrops::new(settings)),
                Box::new(ConntrackTableFull::new(settings)),
                Box::new(MemoryPressure::new(settings)),
                Box::new(ContainerOomLoop::new(settings)),
                Box::new(KubeletDegraded::new(settings)),
            ],
        )
    }

    pub fn with(node: String, signatures: Vec<Box<dyn Signature>>) -> Self {
        Self {
            node,
            signatures,
            firing: HashMap::new(),
            resolved: VecDeque::new(),
            carried_over: HashMap::new(),
            annotations: HashMap::new(),
        }
    }

    /// Takes one attributed event (on the event path: each signature's work is a map update).
    pub fn observe(&mut self, event: &Attributed) {
        for s in &mut self.signatures {
            s.observe(event);
        }
    }

    pub fn evaluate(&mut self, now_unix_ns: u64, node: &NodeView) -> Changes {
        let mut current: HashMap<String, Incident> = HashMap::new();
        for s in &mut self.signatures {
            for finding in s.evaluate(now_unix_ns, node) {
                let incident = incident(&self.node, s.name(), finding, now_unix_ns);
                current.insert(incident.id.clone(), incident);
            }
        }
        link_related(&mut current);
        let reported: std::collections::HashSet<String> = current.keys().cloned().collect();
        let mut changes = Changes::default();
        for (id, mut incident) in current {
            self.carried_over.remove(&id);
            match self.firing.get(&id) {
                // An incident is about one pod. The same key about another pod is a new incident:
                // the kernel reuses a network namespace's inode once its pod is gone.
                Some(known)
                    if known.pod_uid.is_some()
                        && incident.pod_uid.is_some()
                        && known.pod_uid != incident.pod_uid =>
                {
                    if let Some(old) = self.firing.remove(&id) {
                        self.resolve(old, now_unix_ns, &mut changes);
                    }
                    changes.fired.push(incident.clone());
                }
                Some(known) => {
                    incident.first_seen_unix_ns = known.first_seen_unix_ns.min(incident.first_seen_unix_ns);
                    incident.fired_unix_ns = known.fired_unix_ns;
                    if let (Some(added), Some(evidence)) =
                        (self.annotations.get(&id), incident.evidence.as_object_mut())
                    {
                        evidence.extend(added.clone());
                    }
                }
                None => changes.fired.push(incident.clone()),
            }
            self.firing.insert(id, incident);
        }
        self.carried_over.retain(|_, until| *until > now_unix_ns);
        let gone: Vec<String> = self
            .firing
            .keys()
            .filter(|id| !reported.contains(*id) && !self.carried_over.contains_key(*id))
            .cloned()
            .collect();
        for id in gone {
            if let Some(incident) = self.firing.remove(&id) {
                self.resolve(incident, now_unix_ns, &mut changes);
            }
        }
        changes
    }

    fn resolve(&mut self, mut incident: Incident, now_unix_ns: u64, changes: &mut Changes) {
        self.annotations.remove(&incident.id);
        incident.state = State::Resolved;
        incident.resolved_unix_ns = Some(now_unix_ns);
        changes.resolved.push(incident.clone());
        if self.resolved.len() >= HISTORY {
            self.resolved.pop_back();
        }
        self.resolved.push_front(incident);
    }

    /// Adds `key: value` to incident `id`'s evidence, now and at every evaluation while it fires:
    /// the firing incident if its `key` is unset or about the same `value["id"]`, else the newest
    /// resolved one that is (a capture that ends after its incident). False when there is none.
    pub fn annotate(&mut self, id: &str, key: &str, value: serde_json::Value) -> bool {
        let same = |incident: &Incident| {
            let had = &incident.evidence[key];
            had.is_null() || had.get("id").is_some_and(|had| Some(had) == value.get("id"))
        };
        if let Some(incident) = self.firing.get_mut(id).filter(|i| same(i)) {
            if let Some(evidence) = incident.evidence.as_object_mut() {
                evidence.insert(key.to_string(), value.clone());
            }
            self.annotations.entry(id.to_string()).or_default().insert(key.to_string(), value);
            return true;
        }
        match self.resolved.iter_mut().find(|i| i.id == id && same(i)) {
            Some(incident) => {
                if let Some(evidence) = incident.evidence.as_object_mut() {
                    evidence.insert(key.to_string(), value);
                }
                true
            }
            None => false,
        }
    }

    /// Firing incidents first (most severe, then oldest), then resolved ones, newest first.
    pub fn incidents(&self) -> Vec<Incident> {
        let mut firing: Vec<Incident> = self.firing.values().cloned().collect();
        firing.sort_by(|a, b| {
            b.severity.cmp(&a.severity).then(a.first_seen_unix_ns.cmp(&b.first_seen_unix_ns))
        });
        firing.extend(self.resolved.iter().cloned());
        firing
    }

    pub fn firing(&self) -> impl Iterator<Item = &Incident> {
        self.firing.values()
    }

    /// What to write to the state directory.
    pub fn saved(&self, now_unix_ns: u64) -> Saved {
        Saved::new(
            &self.node,
            now_unix_ns,
            self.firing.values().cloned().collect(),
            self.resolved.iter().cloned().collect(),
        )
    }

    /// Takes back what an earlier run saved: its history, and its firing incidents, which stay
    /// firing for [`CARRIED_OVER_FOR`] unless their signature finds them again (they then go on,
    /// from when they first fired) and resolve after it otherwise.
    pub fn restore(&mut self, saved: Saved, now_unix_ns: u64) {
        let until = now_unix_ns.saturating_add(super::ns(CARRIED_OVER_FOR));
        for mut incident in saved.firing {
            self.carried_over.insert(incident.id.clone(), until);
            if let Some(capture) = incident.evidence.get_mut(CAPTURE) {
                // A capture running at the last exit was cut with it, and its staging removed.
                if capture["state"] == "capturing" {
                    capture["state"] = "failed".into();
                    capture["error"] = "the agent stopped before the capture ended".into();
                }
                let kept = serde_json::Map::from_iter([(CAPTURE.to_string(), capture.clone())]);
                self.annotations.insert(incident.id.clone(), kept);
            }
            self.firing.insert(incident.id.clone(), incident);
        }
        self.resolved.extend(saved.resolved.into_iter().take(HISTORY - self.resolved.len().min(HISTORY)));
    }

    /// Per-signature state evictions (caps reached), for `kstall_incident_state_evictions_total`.
    pub fn evictions(&self) -> Vec<(&'static str, u64)> {
        self.signatures.iter().map(|s| (s.name(), s.evicted())).collect()
    }
}

/// `f` as an incident that fires at `now_unix_ns` unless it already fires.
fn incident(node: &str, signature: &str, f: Finding, now_unix_ns: u64) -> Incident {
    Incident {
        id: format!("{signature}/{node}/{}", f.key),
        signature: signature.to_string(),
        severity: f.severity,
        state: State::Firing,
        first_seen_unix_ns: f.first_seen_unix_ns,
        fired_unix_ns: Some(now_unix_ns),
        last_seen_unix_ns: f.last_seen_unix_ns,
        resolved_unix_ns: None,
        node: node.to_string(),
        namespace: f.who.namespace.clone(),
        pod: f.who.pod.clone(),
        container: f.who.container.clone(),
        workload: f.who.workload.clone(),
        pod_uid: f.who.pod_uid.clone(),
        summary: f.summary,
        evidence: f.evidence,
        remediation: f.remediation,
        related: Vec::new(),
    }
}

/// A pod that cannot terminate is explained by an NFS incident of the same pod.
fn link_related(incidents: &mut HashMap<String, Incident>) {
    let explaining: Vec<(String, Option<String>)> = incidents
        .values()
        .filter(|i| i.signature != pod_termination_blocked::NAME)
        .map(|i| (i.id.clone(), i.pod_uid.clone()))
        .collect();
    for incident in incidents.values_mut().filter(|i| i.signature == pod_termination_blocked::NAME) {
        incident.related = explaining
            .iter()
            .filter(|(_, uid)| uid.is_some() && *uid == incident.pod_uid)
            .map(|(id, _)| id.clone())
            .collect();
        incident.related.sort();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        incidents::{
            Severity,
            signatures::{nfs_sidecar_redirect, pod_termination_blocked, tests::*},
        },
        probes::wait::WaitClass,
        stuck::TaskState,
    };

    #[test]
    fn an_incident_fires_once_links_its_cause_and_resolves() {
        let mut engine = Engine::new("node-a".into(), &Settings::default());
        let who = pod("u1", "web-1");
        let mut stuck = stuck(&[hung(100 * SEC, 4243, WaitClass::Nfs, 120, &who)]);
        // A hard mount's first tries, 3 s apart.
        engine.observe(&redirected_reset(101 * SEC, 2049, &who));
        engine.observe(&redirected_reset(104 * SEC, 2049, &who));
        let changes = engine.evaluate(105 * SEC, &node(&stuck));
        let mut fired: Vec<&str> = changes.fired.iter().map(|i| i.signature.as_str()).collect();
        fired.sort();
        assert_eq!(fired, [nfs_sidecar_redirect::NAME, pod_termination_blocked::NAME]);
        let blocked = changes.fired.iter().find(|i| i.signature == pod_termination_blocked::NAME).unwrap();
        assert_eq!(blocked.related, ["nfs-sidecar-redirect/node-a/netns-4026532999"]);
        let redirect = changes.fired.iter().find(|i| i.signature == nfs_sidecar_redirect::NAME).unwrap();
        assert_eq!((redirect.namespace.as_str(), redirect.pod.as_str()), ("shop", "web-1"));
        assert_eq!(redirect.severity, Severity::Critical);
        // Named 4 s after its first reset: fired at this evaluation.
        assert_eq!((redirect.first_seen_unix_ns, redirect.fired_unix_ns), (101 * SEC, Some(105 * SEC)));

        // Still firing: nothing new, nothing resolved, still fired when it was.
        let again = engine.evaluate(106 * SEC, &node(&stuck));
        assert!(again.fired.is_empty() && again.resolved.is_empty(), "{again:?}");
        assert_eq!(engine.firing().count(), 2);
        assert!(engine.firing().all(|i| i.fired_unix_ns == Some(105 * SEC)));

        // The writer finishes, the server answers, resets stop: both resolve.
        engine.observe(&nfs(110 * SEC, crate::probes::nfs::What::ServerResponding, &who));
        stuck.clear(&[((4243, 4243), TaskState::Other)], 111 * SEC);
        let done = engine.evaluate(200 * SEC, &node(&stuck));
        assert_eq!(done.resolved.len(), 2, "{done:?}");
        assert!(
            done.resolved.iter().all(|i| i.state == State::Resolved && i.resolved_unix_ns == Some(200 * SEC))
        );
        assert_eq!(engine.firing().count(), 0);
        assert_eq!(engine.incidents().len(), 2, "kept as history");
    }

    /// Seen on a real cluster: a pod's network namespace gone, the kernel gave its inode to the
    /// next pod, whose redirect then continued the first pod's incident (no new firing, no Event).
    #[test]
    fn a_reused_namespace_of_another_pod_is_a_new_incident() {
        let mut engine = Engine::new("node-a".into(), &Settings::default());
        let (first, second) = (pod("u1", "export-1"), pod("u2", "sync-1"));
        let quiet = crate::stuck::StuckSet::default();
        engine.observe(&redirected_reset(101 * SEC, 2049, &first));
        engine.observe(&redirected_reset(104 * SEC, 2049, &first));
        let fired = engine.evaluate(105 * SEC, &node(&quiet)).fired;
        assert_eq!((fired.len(), fired[0].pod.as_str()), (1, "export-1"));
        // Same namespace inode, another pod.
        engine.observe(&redirected_reset(110 * SEC, 2049, &second));
        engine.observe(&redirected_reset(113 * SEC, 2049, &second));
        let changes = engine.evaluate(114 * SEC, &node(&quiet));
        assert_eq!(changes.fired.len(), 1, "{changes:?}");
        assert_eq!(changes.fired[0].pod, "sync-1");
        assert_eq!(changes.fired[0].first_seen_unix_ns, 110 * SEC, "the second pod's own first reset");
        assert_eq!(changes.fired[0].fired_unix_ns, Some(114 * SEC), "fired anew");
        assert_eq!(changes.fired[0].evidence["resets_total"], 2, "not the first pod's resets");
        assert_eq!((changes.resolved.len(), changes.resolved[0].pod.as_str()), (1, "export-1"));
    }

    #[test]
    fn the_names_flags_are_checked_against_are_the_engines_signatures() {
        let engine = Engine::new("node-a".into(), &Settings::default());
        let names: Vec<&str> = engine.signatures.iter().map(|s| s.name()).collect();
        assert_eq!(names, NAMES);
    }

    /// `--capture-on`: the capture's entry stays in the evidence the signature rebuilds each
    /// second, is updated when the capture ends (after its incident resolved, too), and does not
    /// pass to the incident that fires anew with the same id.
    #[test]
    fn a_capture_annotation_lasts_as_long_as_its_incident_and_follows_it_into_history() {
        let mut engine = Engine::new("node-a".into(), &Settings::default());
        let who = pod("u1", "web-1");
        let quiet = crate::stuck::StuckSet::default();
        engine.observe(&redirected_reset(101 * SEC, 2049, &who));
        engine.observe(&redirected_reset(104 * SEC, 2049, &who));
        let fired = engine.evaluate(105 * SEC, &node(&quiet)).fired;
        let id = fired[0].id.clone();
        let capturing = serde_json::json!({"id": "cap-1", "state": "capturing"});
        assert!(engine.annotate(&id, CAPTURE, capturing.clone()));
        // Another capture's entry does not overwrite it while it fires.
        assert!(!engine.annotate(&id, CAPTURE, serde_json::json!({"id": "cap-2", "state": "complete"})));
        engine.observe(&redirected_reset(107 * SEC, 2049, &who));
        engine.evaluate(108 * SEC, &node(&quiet));
        let firing = engine.firing().next().unwrap();
        assert_eq!(firing.evidence[CAPTURE], capturing, "kept across evaluations");
        assert_eq!(firing.evidence["resets_total"], 3, "beside the signature's own evidence");

        // Resolved while capturing; then the capture completes.
        let resolved = engine.evaluate(300 * SEC, &node(&quiet)).resolved;
        assert_eq!(resolved[0].evidence[CAPTURE], capturing);
        let complete = serde_json::json!({"id": "cap-1", "state": "complete", "bytes": 4096});
        assert!(engine.annotate(&id, CAPTURE, complete.clone()));
        assert_eq!(engine.incidents()[0].evidence[CAPTURE], complete, "the history says complete");

        // The same id fires anew: no capture of its own yet.
        engine.observe(&redirected_reset(400 * SEC, 2049, &who));
        engine.observe(&redirected_reset(403 * SEC, 2049, &who));
        let again = engine.evaluate(404 * SEC, &node(&quiet)).fired;
        assert_eq!(again[0].id, id);
        assert!(again[0].evidence[CAPTURE].is_null(), "{:#}", again[0].evidence);

        // Saved while a capture runs, restored after a restart: that capture was cut.
        assert!(engine.annotate(&id, CAPTURE, serde_json::json!({"id": "cap-3", "state": "capturing"})));
        let mut after = Engine::new("node-a".into(), &Settings::default());
        after.restore(engine.saved(405 * SEC), 500 * SEC);
        let restored = after.firing().next().unwrap();
        assert_eq!(restored.evidence[CAPTURE]["state"], "failed");
        assert_eq!(restored.evidence[CAPTURE]["error"], "the agent stopped before the capture ended");
    }

    #[test]
    fn a_restored_incident_goes_on_when_found_again_and_resolves_when_not() {
        let who = pod("u1", "web-1");
        let mut before = Engine::new("node-a".into(), &Settings::default());
        before.observe(&redirected_reset(101 * SEC, 2049, &who));
        before.observe(&redirected_reset(104 * SEC, 2049, &who));
        let empty = stuck(&[]);
        assert_eq!(before.evaluate(105 * SEC, &node(&empty)).fired.len(), 1);
        let mut resolved = crate::incidents::tests::incident(Some(50 * SEC));
        resolved.state = State::Resolved;
        let mut saved = before.saved(106 * SEC);
        saved.resolved.push(resolved.clone());

        // Restarted: found again, it goes on from when it first fired, not fired anew.
        let mut after = Engine::new("node-a".into(), &Settings::default());
        after.restore(saved.clone(), 200 * SEC);
        assert_eq!(after.firing().count(), 1);
        after.observe(&redirected_reset(201 * SEC, 2049, &who));
        after.observe(&redirected_reset(204 * SEC, 2049, &who));
        let again = after.evaluate(205 * SEC, &node(&empty));
        assert!(again.fired.is_empty() && again.resolved.is_empty(), "{again:?}");
        let going_on = after.firing().next().unwrap();
        assert_eq!((going_on.first_seen_unix_ns, going_on.fired_unix_ns), (101 * SEC, Some(105 * SEC)));
        assert_eq!(after.incidents().last(), Some(&resolved), "the history is back");

        // Restarted, and nothing shows it again: firing through the grace, resolved after.
        let mut quiet = Engine::new("node-a".into(), &Settings::default());
        quiet.restore(saved, 200 * SEC);
        let grace_ends = 200 * SEC + crate::incidents::ns(CARRIED_OVER_FOR);
        assert!(quiet.evaluate(grace_ends - SEC, &node(&empty)).resolved.is_empty());
        let done = quiet.evaluate(grace_ends, &node(&empty));
        assert_eq!(done.resolved.len(), 1, "{done:?}");
        assert_eq!(done.resolved[0].resolved_unix_ns, Some(grace_ends));
        assert_eq!(quiet.firing().count(), 0);
    }
}
