//! Pod metadata: what a pod UID is called (name, namespace, owning workload, labels, container
//! names). Two sources feed the same updates — the Kubernetes API ([`api`]) and a `kubectl get pods
//! -o json` file ([`file`]) — into a [`PodStore`] that keeps deleted pods for a while, because the
//! incidents are about pods that are Terminating or already gone.

pub mod api;
pub mod file;
pub mod mesh;

use std::{
    collections::{BTreeMap, HashMap},
    sync::Arc,
    time::{Duration, Instant},
};

use k8s_openapi::api::core::v1::Pod;
use serde::Serialize;

/// What kstall knows about a pod from its metadata source.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PodMeta {
    pub uid: String,
    pub name: String,
    pub namespace: String,
    /// The owning workload as `Kind/name` (`Deployment/web`, `StatefulSet/db`, `Node/...` for
    /// static pods), empty for a bare pod.
    pub workload: String,
    pub node: String,
    /// The pod labels selected by `--pod-labels`.
    pub labels: BTreeMap<String, String>,
    pub host_network: bool,
    /// The pod's own addresses (`status.podIPs`), none for a hostNetwork pod (its are the
    /// node's): who a forwarded packet in the host's namespace was from or for.
    pub ips: Vec<std::net::IpAddr>,
    /// Container id (runtime prefix stripped) -> container name, from the pod status.
    pub containers: HashMap<String, String>,
    /// The deletion timestamp (unix seconds) while the pod is Terminating: the time the
    /// deletion was asked for plus the grace period, when the kubelet should be done with it.
    pub deletion_deadline_unix_secs: Option<i64>,
    /// What `kstall_node_pods` counts the pod under.
    pub state: PodState,
    /// The service mesh whose redirect captures the pod's connections, by the pod's marks.
    pub mesh: Option<mesh::PodMesh>,
}

/// A pod's phase and, while one of its containers waits, the first waiting container's reason
/// (init containers first, the order the kubelet starts them): how `kubectl get pods` tells a
/// pile of `ImagePullBackOff` from a running node. Both come from fixed lists, so the gauge they
/// label stays small whatever the API sends.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub struct PodState {
    pub phase: &'static str,
    /// Empty when no container waits; `other` for a reason not in [`WAITING_REASONS`].
    pub waiting_reason: &'static str,
}

impl Default for PodState {
    fn default() -> Self {
        Self { phase: "Unknown", waiting_reason: "" }
    }
}

const PHASES: [&str; 5] = ["Pending", "Running", "Succeeded", "Failed", "Unknown"];
/// The kubelet's waiting reasons (pkg/kubelet/images and kuberuntime).
const WAITING_REASONS: [&str; 12] = [
    "ContainerCreating",
    "PodInitializing",
    "ErrImagePull",
    "ImagePullBackOff",
    "ErrImageNeverPull",
    "InvalidImageName",
    "CrashLoopBackOff",
    "CreateContainerConfigError",
    "CreateContainerError",
    "RunContainerError",
    "PreStartHookError",
    "PostStartHookError",
];

impl PodState {
    fn of(pod: &Pod) -> Self {
        let Some(status) = &pod.status else { return Self::default() };
        let phase = status.phase.as_deref().and_then(|p| PHASES.into_iter().find(|known| *known == p));
        let waiting = [&status.init_container_statuses, &status.container_statuses]
            .into_iter()
            .flatten()
            .flatten()
            .find_map(|c| c.state.as_ref()?.waiting.as_ref())
            .map(|w| {
                let reason = w.reason.as_deref().unwrap_or_default();
                WAITING_REASONS.into_iter().find(|known| *known == reason).unwrap_or("other")
            });
        Self { phase: phase.unwrap_or("Unknown"), waiting_reason: waiting.unwrap_or_default() }
    }
}

impl PodMeta {
    /// `None` for a pod without a UID (nothing to attribute it by).
    pub fn from_pod(pod: &Pod, selected_labels: &[String]) -> Option<Self> {
        let meta = &pod.metadata;
        let uid = meta.uid.clone().filter(|u| !u.is_empty())?;
        let labels = meta.labels.as_ref();
        let spec = pod.spec.as_ref();
        let host_network = spec.and_then(|s| s.host_network).unwrap_or(false);
        let mut containers = HashMap::new();
        let mut ips = Vec::new();
        if let Some(status) = &pod.status {
            let listed = status.pod_ips.iter().flatten().map(|p| p.ip.as_str());
            for ip in listed.chain(status.pod_ip.as_deref()).filter_map(|ip| ip.parse().ok()) {
                if !host_network && !ips.contains(&ip) {
                    ips.push(ip);
                }
            }
            let all = [
                &status.init_container_statuses,
                &status.container_statuses,
                &status.ephemeral_container_statuses,
            ];
            for s in all.into_iter().flatten().flatten() {
                // The container before the last restart too: its kill may be read after it.
                let last = s.last_state.as_ref().and_then(|l| l.terminated.as_ref()?.container_id.as_deref());
                for id in [s.container_id.as_deref(), last].into_iter().flatten().filter_map(strip_runtime) {
                    containers.insert(id.to_string(), s.name.clone());
                }
            }
        }
        Some(PodMeta {
            uid,
            name: meta.name.clone().unwrap_or_default(),
            namespace: meta.namespace.clone().unwrap_or_default(),
            workload: workload_of(pod),
            node: spec.and_then(|s| s.node_name.clone()).unwrap_or_default(),
            labels: selected_labels
                .iter()
                .filter_map(|k| labels.and_then(|l| l.get(k)).map(|v| (k.clone(), v.clone())))
                .collect(),
            host_network,
            ips,
            containers,
            deletion_deadline_unix_secs: meta.deletion_timestamp.as_ref().map(|t| t.0.as_second()),
            state: PodState::of(pod),
            mesh: mesh::PodMesh::of(pod),
        })
    }

    /// The API server set a deletion timestamp: the pod is Terminating.
    pub fn terminating(&self) -> bool {
        self.deletion_deadline_unix_secs.is_some()
    }

    /// `namespace/name`.
    pub fn full_name(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }
}

/// `containerd://<id>`, `cri-o://<id>`, `docker://<id>` -> `<id>`.
fn strip_runtime(container_id: &str) -> Option<&str> {
    let id = container_id.split_once("://").map_or(container_id, |(_, id)| id);
    (!id.is_empty()).then_some(id)
}

/// The controller owner; a ReplicaSet created by a Deployment (its name is the Deployment's plus
/// `-<pod-template-hash>`) is reported as that Deployment, which is what people name.
fn workload_of(pod: &Pod) -> String {
    let meta = &pod.metadata;
    let Some(owner) = meta.owner_references.iter().flatten().find(|o| o.controller == Some(true)) else {
        return String::new();
    };
    let hash = meta.labels.as_ref().and_then(|l| l.get("pod-template-hash"));
    if owner.kind == "ReplicaSet"
        && let Some(deployment) = hash.and_then(|h| owner.name.strip_suffix(h.as_str())?.strip_suffix('-'))
    {
        return format!("Deployment/{deployment}");
    }
    // The CronJob controller names each Job `<cronjob>-<scheduled time in minutes>`: a CronJob
    // piling pods onto a node is one owner, not one per run.
    if owner.kind == "Job"
        && let Some((cronjob, minutes)) = owner.name.rsplit_once('-')
        && minutes.len() >= 8
        && minutes.bytes().all(|b| b.is_ascii_digit())
    {
        return format!("CronJob/{cronjob}");
    }
    format!("{}/{}", owner.kind, owner.name)
}

/// How the pod metadata source is doing: `kstall status` and `kstall_pod_metadata_up`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct SourceHealth {
    /// `none`, `file <path>`, `api (node <name>)`.
    pub source: String,
    /// The source's view is current (the file parsed, the watch is running).
    pub up: bool,
    /// Why not, when not.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// Shared between a source (writer) and the API and metrics (readers).
#[derive(Debug, Clone, Default)]
pub struct Health(Arc<std::sync::Mutex<SourceHealth>>);

impl Health {
    pub fn new(source: String, up: bool) -> Self {
        Self(Arc::new(std::sync::Mutex::new(SourceHealth { source, up, error: None })))
    }

    pub fn set(&self, up: bool, error: Option<String>) {
        let mut h = self.0.lock().expect("source health");
        h.up = up;
        h.error = error;
    }

    pub fn get(&self) -> SourceHealth {
        self.0.lock().expect("source health").clone()
    }
}

/// The waiting reasons of a container whose image cannot be pulled.
pub const IMAGE_PULL_REASONS: [&str; 2] = ["ImagePullBackOff", "ErrImagePull"];
/// Terminating pods named in a [`KubeletLoad`]; the count is exact.
pub const MAX_TERMINATING: usize = 1000;

/// What this node's kubelet carries, from the pods the source lists (`kubelet-degraded`).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct KubeletLoad {
    /// Pods with a container waiting in `ImagePullBackOff` or `ErrImagePull`, by (namespace,
    /// owner): the workload, or `Pod/<name>` for a bare pod.
    pub image_pull: BTreeMap<(String, String), u32>,
    /// Pods with a deletion timestamp, oldest deadline first.
    pub terminating: Vec<Terminating>,
    pub terminating_total: usize,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Terminating {
    /// `namespace/name`.
    pub pod: String,
    pub uid: String,
    pub deadline_unix_secs: i64,
}

/// What a source tells the store.
#[derive(Debug, Clone, PartialEq)]
pub enum PodUpdate {
    /// The complete set of pods (an initial list, a relist, a reloaded file): pods missing from
    /// it are deleted.
    Snapshot(Vec<PodMeta>),
    Upsert(Box<PodMeta>),
    Delete {
        uid: String,
    },
}

struct Entry {
    meta: Arc<PodMeta>,
    /// When the source stopped listing the pod; it is forgotten `retention` later.
    deleted_at: Option<Instant>,
}

/// Pod UID -> metadata, with deleted pods kept for `retention`.
pub struct PodStore {
    pods: HashMap<String, Entry>,
    retention: Duration,
    /// Bumped on every change, so derived indexes know when to rebuild.
    generation: u64,
}

impl PodStore {
    pub fn new(retention: Duration) -> Self {
        Self { pods: HashMap::new(), retention, generation: 0 }
    }

    pub fn apply(&mut self, update: PodUpdate, now: Instant) {
        match update {
            PodUpdate::Snapshot(pods) => {
                let listed: HashMap<String, PodMeta> = pods.into_iter().map(|p| (p.uid.clone(), p)).collect();
                for (uid, entry) in &mut self.pods {
                    if !listed.contains_key(uid) && entry.deleted_at.is_none() {
                        entry.deleted_at = Some(now);
                    }
                }
                for (_, meta) in listed {
                    self.upsert(meta);
                }
            }
            PodUpdate::Upsert(meta) => self.upsert(*meta),
            PodUpdate::Delete { uid } => {
                if let Some(entry) = self.pods.get_mut(&uid) {
                    entry.deleted_at.get_or_insert(now);
                }
            }
        }
        self.generation += 1;
    }

    fn upsert(&mut self, meta: PodMeta) {
        match self.pods.get_mut(&meta.uid) {
            Some(entry) if *entry.meta == meta && entry.deleted_at.is_none() => {}
            _ => {
                let uid = meta.uid.clone();
                self.pods.insert(uid, Entry { meta: Arc::new(meta), deleted_at: None });
            }
        }
    }

    /// Forgets pods deleted longer than `retention` ago; returns their UIDs.
    pub fn expire(&mut self, now: Instant) -> Vec<String> {
        let retention = self.retention;
        let expired: Vec<String> = self
            .pods
            .iter()
            .filter(|(_, e)| e.deleted_at.is_some_and(|at| now.saturating_duration_since(at) >= retention))
            .map(|(uid, _)| uid.clone())
            .collect();
        for uid in &expired {
            self.pods.remove(uid);
        }
        if !expired.is_empty() {
            self.generation += 1;
        }
        expired
    }

    pub fn get(&self, uid: &str) -> Option<&Arc<PodMeta>> {
        self.pods.get(uid).map(|e| &e.meta)
    }

    /// Every pod, and whether it was deleted.
    pub fn all(&self) -> impl Iterator<Item = (&Arc<PodMeta>, bool)> {
        self.pods.values().map(|e| (&e.meta, e.deleted_at.is_some()))
    }

    /// Whether the pod is known and was deleted (kept for retention).
    pub fn is_deleted(&self, uid: &str) -> bool {
        self.pods.get(uid).is_some_and(|e| e.deleted_at.is_some())
    }

    pub fn len(&self) -> usize {
        self.pods.len()
    }

    /// (namespace, name) of every pod in the store.
    pub fn names(&self) -> std::collections::HashSet<(String, String)> {
        self.pods.values().map(|e| (e.meta.namespace.clone(), e.meta.name.clone())).collect()
    }

    /// How many pods the source lists in each state (deleted pods not counted).
    pub fn states(&self) -> BTreeMap<PodState, usize> {
        let mut states = BTreeMap::new();
        for e in self.pods.values().filter(|e| e.deleted_at.is_none()) {
            *states.entry(e.meta.state).or_default() += 1;
        }
        states
    }

    /// What the kubelet carries of the listed pods: the ones waiting for an image, and the ones
    /// Terminating (oldest deadline first, at most `MAX_TERMINATING` named).
    pub fn kubelet_load(&self) -> KubeletLoad {
        let mut load = KubeletLoad::default();
        let listed = self.pods.values().filter(|e| e.deleted_at.is_none()).map(|e| &e.meta);
        for meta in listed {
            if IMAGE_PULL_REASONS.contains(&meta.state.waiting_reason) {
                let owner = match meta.workload.as_str() {
                    "" => format!("Pod/{}", meta.name),
                    workload => workload.to_string(),
                };
                *load.image_pull.entry((meta.namespace.clone(), owner)).or_default() += 1;
            }
            if let Some(deadline) = meta.deletion_deadline_unix_secs {
                load.terminating.push(Terminating {
                    pod: meta.full_name(),
                    uid: meta.uid.clone(),
                    deadline_unix_secs: deadline,
                });
            }
        }
        load.terminating
            .sort_by(|a, b| a.deadline_unix_secs.cmp(&b.deadline_unix_secs).then(a.pod.cmp(&b.pod)));
        load.terminating_total = load.terminating.len();
        load.terminating.truncate(MAX_TERMINATING);
        load
    }

    pub fn deleted(&self) -> usize {
        self.pods.values().filter(|e| e.deleted_at.is_some()).count()
    }

    pub fn is_empty(&self) -> bool {
        self.pods.is_empty()
    }

    pub fn generation(&self) -> u64 {
        self.generation
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A pod as `kubectl get pods -o json` prints it (trimmed to what kstall reads).
    pub fn pod_json(uid: &str, name: &str, container_id: &str) -> serde_json::Value {
        serde_json::json!({
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": name,
                "namespace": "shop",
                "uid": uid,
                "labels": {"app": "web", "pod-template-hash": "5d8c7b9f4", "team": "storage"},
                "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web-5d8c7b9f4",
                                     "uid": "11111111-2222-3333-4444-555555555555", "controller": true}]
            },
            "spec": {"nodeName": "node-a", "containers": [{"name": "app", "image": "nginx"}]},
            "status": {"containerStatuses": [{"name": "app", "containerID": format!("containerd://{container_id}"),
                       "image": "nginx", "imageID": "", "ready": true, "restartCount": 0}]}
        })
    }

    fn meta(uid: &str) -> PodMeta {
        let pod: Pod = serde_json::from_value(pod_json(uid, "web-5d8c7b9f4-x2x9z", "abc")).unwrap();
        PodMeta::from_pod(&pod, &["app".into(), "missing".into()]).unwrap()
    }

    #[test]
    fn a_pods_addresses_are_its_own_not_a_host_network_pods() {
        let mut json = pod_json("u1", "web-1", "abc");
        json["status"]["podIP"] = "10.244.1.7".into();
        json["status"]["podIPs"] =
            serde_json::json!([{"ip": "10.244.1.7"}, {"ip": "fd00::7"}, {"ip": "bogus"}]);
        let pod: Pod = serde_json::from_value(json.clone()).unwrap();
        let ips: Vec<String> =
            PodMeta::from_pod(&pod, &[]).unwrap().ips.iter().map(|ip| ip.to_string()).collect();
        assert_eq!(ips, ["10.244.1.7", "fd00::7"]);
        json["spec"]["hostNetwork"] = true.into();
        let pod: Pod = serde_json::from_value(json).unwrap();
        assert!(PodMeta::from_pod(&pod, &[]).unwrap().ips.is_empty());
    }

    #[test]
    fn metadata_from_a_pod() {
        let m = meta("u1");
        assert_eq!(
            (m.name.as_str(), m.namespace.as_str(), m.node.as_str()),
            ("web-5d8c7b9f4-x2x9z", "shop", "node-a")
        );
        assert_eq!(m.workload, "Deployment/web");
        assert_eq!(m.containers.get("abc").map(String::as_str), Some("app"));
        assert_eq!(m.labels, BTreeMap::from([("app".to_string(), "web".to_string())]));
        assert!(!m.host_network && !m.terminating());
        assert_eq!(m.state, PodState::default(), "no phase in the status: Unknown");
    }

    #[test]
    fn a_restarted_container_keeps_the_name_of_the_one_before() {
        let mut pod = pod_json("u1", "hog", "new");
        pod["status"]["containerStatuses"][0]["lastState"] = serde_json::json!({"terminated": {"exitCode": 137, "reason": "OOMKilled", "containerID": "containerd://old"}});
        let m = PodMeta::from_pod(&serde_json::from_value(pod).unwrap(), &[]).unwrap();
        assert_eq!(m.containers.get("new").map(String::as_str), Some("app"));
        assert_eq!(
            m.containers.get("old").map(String::as_str),
            Some("app"),
            "its kill may be read after the restart"
        );
    }

    #[test]
    fn a_pods_state_is_its_phase_and_first_waiting_reason() {
        let state = |status: serde_json::Value| {
            let mut pod = pod_json("u", "report-29000000-abcde", "abc");
            pod["status"] = status;
            PodState::of(&serde_json::from_value(pod).unwrap())
        };
        let waiting = |reason: &str| {
            serde_json::json!({"name": "c", "image": "i", "imageID": "", "ready": false,
                                            "restartCount": 0, "state": {"waiting": {"reason": reason}}})
        };
        let running = serde_json::json!({"name": "c", "image": "i", "imageID": "", "ready": true, "restartCount": 0,
                             "state": {"running": {}}});
        assert_eq!(
            state(
                serde_json::json!({"phase": "Pending", "containerStatuses": [running.clone(), waiting("ImagePullBackOff")]})
            ),
            PodState { phase: "Pending", waiting_reason: "ImagePullBackOff" }
        );
        // An init container waits first.
        assert_eq!(
            state(serde_json::json!({"phase": "Pending", "initContainerStatuses": [waiting("ErrImagePull")],
                         "containerStatuses": [waiting("PodInitializing")]})),
            PodState { phase: "Pending", waiting_reason: "ErrImagePull" }
        );
        assert_eq!(
            state(serde_json::json!({"phase": "Running", "containerStatuses": [running]})).waiting_reason,
            ""
        );
        // Values outside the lists do not become label values.
        assert_eq!(
            state(
                serde_json::json!({"phase": "Exploded", "containerStatuses": [waiting("a reason of 300 chars")]})
            ),
            PodState { phase: "Unknown", waiting_reason: "other" }
        );
    }

    #[test]
    fn states_count_the_pods_listed_now() {
        let mut backoff = meta("a");
        backoff.state = PodState { phase: "Pending", waiting_reason: "ImagePullBackOff" };
        let mut second = backoff.clone();
        second.uid = "b".into();
        let mut running = meta("c");
        running.state = PodState { phase: "Running", waiting_reason: "" };
        let mut store = PodStore::new(Duration::from_secs(3600));
        let t0 = Instant::now();
        store.apply(PodUpdate::Snapshot(vec![backoff, second, running]), t0);
        store.apply(PodUpdate::Delete { uid: "c".into() }, t0);
        assert_eq!(
            store.states(),
            BTreeMap::from([(PodState { phase: "Pending", waiting_reason: "ImagePullBackOff" }, 2)])
        );
    }

    #[test]
    fn the_kubelets_load_is_the_pile_by_owner_and_the_terminating_pods() {
        let waiting = |uid: &str, name: &str, workload: &str, reason: &'static str| {
            let mut m = meta(uid);
            (m.name, m.workload) = (name.into(), workload.into());
            m.state = PodState { phase: "Pending", waiting_reason: reason };
            m
        };
        let mut late = meta("t1");
        (late.name, late.deletion_deadline_unix_secs) = ("db-0".into(), Some(100));
        let mut later = meta("t2");
        (later.name, later.deletion_deadline_unix_secs) = ("db-1".into(), Some(50));
        let pods = vec![
            waiting("a", "report-1", "CronJob/report", "ImagePullBackOff"),
            waiting("b", "report-2", "CronJob/report", "ErrImagePull"),
            waiting("c", "typo", "", "ImagePullBackOff"),
            waiting("d", "crashing", "Deployment/web", "CrashLoopBackOff"),
            late,
            later,
        ];
        let mut store = PodStore::new(Duration::from_secs(3600));
        let t0 = Instant::now();
        store.apply(PodUpdate::Snapshot(pods), t0);
        store.apply(PodUpdate::Delete { uid: "b".into() }, t0);
        let load = store.kubelet_load();
        let shop = |owner: &str| ("shop".to_string(), owner.to_string());
        assert_eq!(load.image_pull, BTreeMap::from([(shop("CronJob/report"), 1), (shop("Pod/typo"), 1)]));
        let terminating: Vec<(&str, i64)> =
            load.terminating.iter().map(|t| (t.pod.as_str(), t.deadline_unix_secs)).collect();
        assert_eq!(terminating, [("shop/db-1", 50), ("shop/db-0", 100)], "oldest deadline first");
        assert_eq!(load.terminating_total, 2);
    }

    #[test]
    fn workload_kinds() {
        let mut pod: Pod = serde_json::from_value(pod_json("u", "db-0", "abc")).unwrap();
        let owner = &mut pod.metadata.owner_references.as_mut().unwrap()[0];
        owner.kind = "StatefulSet".into();
        owner.name = "db".into();
        assert_eq!(workload_of(&pod), "StatefulSet/db");
        // A ReplicaSet whose name does not end in the template hash is not a Deployment's.
        let owner = &mut pod.metadata.owner_references.as_mut().unwrap()[0];
        owner.kind = "ReplicaSet".into();
        owner.name = "handmade".into();
        assert_eq!(workload_of(&pod), "ReplicaSet/handmade");
        // A CronJob's Jobs are `<cronjob>-<minutes>`: the pods are the CronJob's; a Job named so
        // by hand is still a Job.
        let owner = &mut pod.metadata.owner_references.as_mut().unwrap()[0];
        (owner.kind, owner.name) = ("Job".into(), "report-29420160".into());
        assert_eq!(workload_of(&pod), "CronJob/report");
        pod.metadata.owner_references.as_mut().unwrap()[0].name = "migrate-2".into();
        assert_eq!(workload_of(&pod), "Job/migrate-2");
        pod.metadata.owner_references = None;
        assert_eq!(workload_of(&pod), "");
    }

    #[test]
    fn deleted_pods_are_kept_for_the_retention_time() {
        let t0 = Instant::now();
        let mut store = PodStore::new(Duration::from_secs(3600));
        store.apply(PodUpdate::Snapshot(vec![meta("a"), meta("b")]), t0);
        store.apply(PodUpdate::Delete { uid: "a".into() }, t0 + Duration::from_secs(1));
        // "b" is missing from the next snapshot: deleted too.
        store.apply(PodUpdate::Snapshot(vec![meta("a2")]), t0 + Duration::from_secs(2));
        assert!(store.is_deleted("a") && store.is_deleted("b") && !store.is_deleted("a2"));
        assert!(store.expire(t0 + Duration::from_secs(60)).is_empty());
        assert_eq!(store.get("a").unwrap().name, "web-5d8c7b9f4-x2x9z");
        let mut gone = store.expire(t0 + Duration::from_secs(3602));
        gone.sort();
        assert_eq!(gone, ["a", "b"]);
        assert!(store.get("a").is_none() && store.get("a2").is_some());
    }

    #[test]
    fn a_pod_that_comes_back_is_no_longer_deleted() {
        let t0 = Instant::now();
        let mut store = PodStore::new(Duration::from_secs(10));
        store.apply(PodUpdate::Upsert(Box::new(meta("a"))), t0);
        store.apply(PodUpdate::Delete { uid: "a".into() }, t0);
        store.apply(PodUpdate::Upsert(Box::new(meta("a"))), t0);
        assert!(!store.is_deleted("a"));
        assert!(store.expire(t0 + Duration::from_secs(20)).is_empty());
    }
}
