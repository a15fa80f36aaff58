//! Who an event is about: namespace, pod, container and workload — or the host.
//!
//! - [`cgroup`]: cgroup id -> pod UID, container id, QoS class (or the host's systemd unit);
//! - [`netns`]: network namespace -> pod, for events in softirq or kworker context, learned from
//!   the processes in each pod's cgroups;
//! - [`mounts`]: NFS device -> the pod whose volume it is, for RPCs a kernel thread started;
//! - [`pods`]: pod UID -> name, namespace, workload, from the Kubernetes API or a pods file,
//!   deleted pods kept for a retention time;
//! - [`resolver`]: the background task that keeps all of that current and publishes an [`Index`].
//!
//! The event path only reads the published [`Index`]: a hash-map hit. A miss is answered by the
//! resolver off the event path while the event waits a bounded time (`pipeline.rs`). What leaves
//! the pipeline is [`Attributed`]: an event and who it is about, always both.

pub mod cgroup;
pub mod flags;
pub mod mounts;
pub mod netns;
pub mod pods;
pub mod resolver;

use std::{
    collections::{BTreeMap, HashMap, HashSet},
    sync::Arc,
};

use serde::Serialize;

use self::cgroup::{Qos, Workload};
use crate::{
    events::{Event, Payload},
    probes::Subject,
};

/// An event and who it is about: what everything after the pipeline sees. `who` is the host or
/// nobody (all empty) when kstall could not tell, never missing.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Attributed {
    #[serde(flatten)]
    pub event: Event,
    #[serde(flatten)]
    pub who: Arc<Attribution>,
}

impl Attributed {
    /// Neither a pod nor the host: the resolver had no answer.
    pub fn unattributed(&self) -> bool {
        self.who.pod_uid.is_none() && !self.who.host
    }
}

/// The node's memory against what its pods may use (incident 2's overcommit), after each walk.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct NodeMemory {
    /// Sum of the pods' memory limits (pod cgroups; pods without a limit add nothing).
    pub pod_limits_bytes: u64,
    /// `MemTotal`.
    pub node_bytes: u64,
}

impl NodeMemory {
    /// Pod limits over node memory; `None` while either is unknown.
    pub fn overcommit(&self) -> Option<f64> {
        (self.pod_limits_bytes > 0 && self.node_bytes > 0)
            .then(|| self.pod_limits_bytes as f64 / self.node_bytes as f64)
    }
}

/// The labels an event carries. Every field is always present in JSON and metrics, empty when
/// unknown, so a dashboard can tell apart a host process (`host: true`, pod empty) from an event
/// kstall could not attribute (`host: false`, pod empty).
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Attribution {
    pub namespace: String,
    pub pod: String,
    /// The container's name; empty for events attributed by network namespace (a pod's
    /// containers share it) or while the pod's metadata is unknown.
    pub container: String,
    /// `Kind/name` of the owning workload (`Deployment/web`), empty when unknown.
    pub workload: String,
    /// A node process (`unit` is its systemd unit), or a host-network event.
    pub host: bool,
    /// The event happened in the host's network namespace: it may be any hostNetwork pod's or a
    /// node process's — kstall does not guess which.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub host_network: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub unit: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pod_uid: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub container_id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub qos: Option<Qos>,
    /// The pod's labels selected with `--pod-labels`.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    /// The pod is Terminating, or was already deleted (kept for the retention time).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pod_phase: Option<PodPhase>,
    /// How the event was tied to it.
    pub via: Via,
    /// The pod's service mesh, for the incidents' way out (not an event's label).
    #[serde(skip)]
    pub mesh: Option<pods::mesh::PodMesh>,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Via {
    /// The cgroup of the task the event is about.
    #[default]
    Cgroup,
    /// The network namespace of the socket or packet.
    Netns,
    /// The task's process, found in a pod's cgroup of a v1 hierarchy.
    Process,
    /// The NFS mount an RPC served, one pod's volume: the RPC was a kernel thread's (writeback).
    Mount,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum PodPhase {
    Terminating,
    Deleted,
}

/// What the resolver is asked when an event misses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Key {
    Cgroup(u64),
    Netns(u32),
    /// A process whose v2 cgroup says "host" on a node whose pods live in a v1 hierarchy.
    Process(u32),
    /// A pod seen in the cgroup tree before its metadata arrived from the API or file.
    PodMeta(u64),
    /// A container of a known pod that the pod's status does not list yet: one that died as it
    /// started is listed when the kubelet next writes the status (a hash of pod UID and id).
    ContainerName(u64),
    /// An NFS mount newer than the last walk (a hash of its `major:minor`).
    NfsMount(u64),
}

impl Key {
    /// How long an event waits for the answer: the resolver answers at once, a pod's status
    /// takes the kubelet a PLEG relist (1 s) and a write.
    pub fn hold(&self) -> std::time::Duration {
        match self {
            Key::ContainerName(_) => std::time::Duration::from_secs(10),
            _ => std::time::Duration::from_millis(100),
        }
    }
}

pub enum Resolution {
    Found(Arc<Attribution>),
    /// Not known yet: ask the resolver for `key`, hold the event a moment, then send it with
    /// `fallback` (what is known without the answer).
    Missing {
        key: Key,
        fallback: Option<Arc<Attribution>>,
    },
}

/// The read-only snapshot the event path looks events up in; replaced whole by the resolver.
#[derive(Debug, Default)]
pub struct Index {
    pub by_cgroup: HashMap<u64, Arc<Attribution>>,
    pub by_netns: HashMap<u32, Arc<Attribution>>,
    /// Namespaces of pods that are gone. The kernel reuses namespace inode numbers at once, so
    /// an event in one is only attributed to the departed pod after a fresh walk found no live
    /// pod in it (a namespace outlives its pod when, say, an NFS mount still holds it).
    pub departed_netns: HashMap<u32, Arc<Attribution>>,
    /// Live pods by their addresses (`status.podIPs`): a forwarded packet in the host's namespace
    /// is no pod's by its namespace, but its addresses say whose.
    pub by_pod_ip: HashMap<std::net::IpAddr, Arc<Attribution>>,
    /// Each pod's own cgroup v2 directory, where its pressure is read (none without cgroup v2).
    pub pod_cgroups: Vec<(std::path::PathBuf, Arc<Attribution>)>,
    /// A process in each live namespace of `by_netns`, to read the namespace's `/proc/<pid>/net`.
    pub netns_witness: HashMap<u32, u32>,
    /// Processes in pods' v1 cgroups: for nodes whose kubelet uses cgroup v1, where the v2 cgroup
    /// id of an event says nothing about the pod.
    pub by_process: HashMap<u32, Arc<Attribution>>,
    /// NFS devices (`major:minor`) mounted as one pod's volume.
    pub by_nfs_mount: HashMap<String, Arc<Attribution>>,
    /// The ports the node's NFS mounts name in their options (`port=`, `mountport=`).
    pub nfs_mount_ports: std::collections::BTreeSet<u16>,
    /// The pods' cgroups live in a v1 hierarchy.
    pub v1_pods: bool,
    /// A metadata source (API, file) is configured: a pod without a name is worth a short wait.
    pub metadata_source: bool,
    /// Keys the resolver looked for and did not find: events with them are not held again until
    /// the next full walk.
    pub unresolvable: HashSet<Key>,
    /// Pods with metadata, of which `deleted_pods` are kept for the retention time.
    pub pods: usize,
    pub deleted_pods: usize,
    /// The listed pods by phase and waiting reason (`kstall_node_pods`).
    pub pod_states: BTreeMap<pods::PodState, usize>,
    /// What the kubelet carries (`kubelet-degraded`).
    pub kubelet_load: Arc<pods::KubeletLoad>,
    /// Pod UID -> metadata and whether the pod was deleted: for an event that names its pod's
    /// cgroup itself (an OOM kill's victim).
    pub pod_meta: HashMap<String, (Arc<pods::PodMeta>, bool)>,
    /// (namespace, name) of every pod kstall can still name: the metrics of any other are removed.
    pub named_pods: HashSet<(String, String)>,
    pub memory: NodeMemory,
}

impl Index {
    pub fn resolve(&self, event: &Event) -> Resolution {
        let found = |a: &Arc<Attribution>| {
            if self.metadata_source && a.pod.is_empty() && a.pod_uid.is_some() {
                self.missing(key_for_meta(a), Some(a.clone()))
            } else {
                Resolution::Found(a.clone())
            }
        };
        if let Some(workload) = victim_pod(event) {
            return self.resolve_workload(&workload);
        }
        if subject_is_task(event) {
            let cgroup = event.header.cgroup_id;
            let by_cgroup = self.by_cgroup.get(&cgroup);
            if let Some(a) = by_cgroup.filter(|a| a.pod_uid.is_some()) {
                return found(a);
            }
            let tgid = event.header.tgid;
            if let Some(a) = self.by_process.get(&tgid) {
                return found(a);
            }
            // A kernel thread's RPC (writeback, state renewal): the pod whose transport it is (a
            // pod that mounted in its own network namespace), else whose volume the mount is.
            if let Some(a) = nfs_transport_pod(event).and_then(|netns| self.by_netns.get(&netns))
                && a.pod_uid.is_some()
            {
                return found(a);
            }
            if let Some(device) = nfs_mount(event) {
                match self.by_nfs_mount.get(device) {
                    Some(a) => return found(a),
                    // A mount newer than the last walk, maybe.
                    None if by_cgroup.is_some() => {
                        return self.missing(key_for_mount(device), by_cgroup.cloned());
                    }
                    None => {}
                }
            }
            match by_cgroup {
                // A count has no process to look up (tgid 0): its cgroup is all there is.
                Some(host) if self.v1_pods && tgid != 0 => {
                    self.missing(Key::Process(tgid), Some(host.clone()))
                }
                Some(host) => Resolution::Found(host.clone()),
                None => self.missing(Key::Cgroup(cgroup), None),
            }
        } else {
            let netns = event.header.netns;
            match self.by_netns.get(&netns) {
                Some(a) => {
                    // Only what the index knows already: a reset never waits to name a container.
                    found(self.pods_own_task(event, a).unwrap_or(a))
                }
                None if netns == 0 => Resolution::Found(Arc::default()),
                None => self.missing(Key::Netns(netns), self.departed_netns.get(&netns).cloned()),
            }
        }
    }

    /// The container of `pod` whose task the CPU ran when the event was taken, if that task is the
    /// pod's own: a reset answering a connect the task made itself (a REDIRECT to a closed local
    /// port answers in the sender's context) names the container that connected. A task of
    /// another pod or of the host was interrupted by the softirq and names nothing.
    fn pods_own_task(&self, event: &Event, pod: &Attribution) -> Option<&Arc<Attribution>> {
        let own = |a: &&Arc<Attribution>| {
            a.pod_uid.is_some() && a.pod_uid == pod.pod_uid && !a.container.is_empty()
        };
        self.by_cgroup
            .get(&event.header.cgroup_id)
            .filter(own)
            .or_else(|| self.by_process.get(&event.header.tgid).filter(own))
    }

    /// An event about a container or pod it names itself: attributed without a lookup, named as
    /// soon as the metadata lists the pod and the container.
    fn resolve_workload(&self, workload: &Workload) -> Resolution {
        let (Workload::Container { pod_uid, .. } | Workload::Pod { pod_uid, .. }) = workload else {
            return Resolution::Found(Arc::new(attribute(workload, None, false, Via::Cgroup)));
        };
        let meta = self.pod_meta.get(pod_uid);
        let a = Arc::new(attribute(
            workload,
            meta.map(|(m, _)| &**m),
            meta.is_some_and(|(_, d)| *d),
            Via::Cgroup,
        ));
        if !self.metadata_source {
            Resolution::Found(a)
        } else if a.pod.is_empty() {
            self.missing(key_for_meta(&a), Some(a))
        } else if a.container.is_empty() && a.container_id.is_some() {
            self.missing(key_for_container(&a), Some(a))
        } else {
            Resolution::Found(a)
        }
    }

    fn missing(&self, key: Key, fallback: Option<Arc<Attribution>>) -> Resolution {
        if self.unresolvable.contains(&key) {
            Resolution::Found(fallback.unwrap_or_default())
        } else {
            Resolution::Missing { key, fallback }
        }
    }
}

/// Metadata misses are keyed by a hash (of the pod UID; of UID and container id): `Key` stays
/// `Copy`.
fn key_for_meta(a: &Attribution) -> Key {
    Key::PodMeta(hash_of(&a.pod_uid))
}

fn key_for_container(a: &Attribution) -> Key {
    Key::ContainerName(hash_of(&(&a.pod_uid, &a.container_id)))
}

pub fn key_for_mount(device: &str) -> Key {
    Key::NfsMount(hash_of(&device))
}

fn hash_of(value: &impl std::hash::Hash) -> u64 {
    use std::hash::Hasher as _;
    let mut h = std::collections::hash_map::DefaultHasher::new();
    value.hash(&mut h);
    h.finish()
}

/// The pod's container (or pod) an OOM kill's victim was in, from the memory cgroup path the
/// kernel gave with the kill; `None` for a node process or without a path.
fn victim_pod(event: &Event) -> Option<Workload> {
    let Payload::OomKill(kill) = &event.payload else { return None };
    let workload = cgroup::parse(kill.victim_memcg.as_deref()?);
    (!matches!(workload, Workload::Host { .. })).then_some(workload)
}

/// The NFS mount whose RPCs an event counts, when the kernel said which.
fn nfs_mount(event: &Event) -> Option<&str> {
    let Payload::NfsLatency(latency) = &event.payload else { return None };
    latency.device.as_deref()
}

/// The network namespace of the transport whose RPCs an event counts.
fn nfs_transport_pod(event: &Event) -> Option<u32> {
    matches!(event.payload, Payload::NfsLatency(_)).then_some(event.header.netns).filter(|n| *n != 0)
}

/// Whether the event's header task (for a count: its cgroup) is what it is about (a hung task, an
/// OOM victim), or its network namespace is (see [`Subject`]).
fn subject_is_task(event: &Event) -> bool {
    event.payload.kind().subject == Subject::Task
}

/// The attribution of a workload, with the pod's metadata when it is known.
pub fn attribute(workload: &Workload, meta: Option<&pods::PodMeta>, deleted: bool, via: Via) -> Attribution {
    let (pod_uid, container_id, qos) = match workload {
        Workload::Host { unit } => {
            return Attribution { host: true, unit: unit.clone(), via, ..Default::default() };
        }
        Workload::Pod { pod_uid, qos } => (pod_uid, None, qos),
        Workload::Container { pod_uid, container_id, qos } => (pod_uid, Some(container_id), qos),
    };
    let mut a = Attribution {
        pod_uid: Some(pod_uid.clone()),
        container_id: container_id.cloned(),
        qos: Some(*qos),
        via,
        ..Default::default()
    };
    if let Some(meta) = meta {
        a.namespace = meta.namespace.clone();
        a.pod = meta.name.clone();
        a.workload = meta.workload.clone();
        a.labels = meta.labels.clone();
        a.mesh = meta.mesh.clone();
        a.container = container_id.and_then(|id| meta.containers.get(id)).cloned().unwrap_or_default();
        a.pod_phase = if deleted {
            Some(PodPhase::Deleted)
        } else {
            meta.terminating().then_some(PodPhase::Terminating)
        };
    }
    a
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{decode::bytes_of, events::Decoder, probes::tcp_reset::tests::redirected_syn_reset};

    fn reset_in(netns: u32) -> Event {
        let mut raw = redirected_syn_reset();
        raw.header.netns_ino = netns;
        Decoder::default().decode(&bytes_of(&raw)).unwrap()
    }

    fn pod(uid: &str, name: &str) -> Arc<Attribution> {
        Arc::new(Attribution {
            pod_uid: Some(uid.into()),
            pod: name.into(),
            via: Via::Netns,
            ..Default::default()
        })
    }

    #[test]
    fn resets_are_attributed_by_netns_not_by_the_interrupted_task() {
        let mut index = Index::default();
        index.by_netns.insert(4026532999, pod("u1", "web"));
        // The reset's header cgroup is whoever ran the softirq: it must not be used.
        index.by_cgroup.insert(7, pod("u2", "innocent"));
        let mut event = reset_in(4026532999);
        event.header.cgroup_id = 7;
        let Resolution::Found(a) = index.resolve(&event) else { panic!() };
        assert_eq!(a.pod, "web");
    }

    #[test]
    fn a_reset_in_the_pods_own_task_names_its_container() {
        let mut index = Index::default();
        index.by_netns.insert(4026532999, pod("u1", "web"));
        let mut app = (*pod("u1", "web")).clone();
        app.container = "app".into();
        index.by_cgroup.insert(7, Arc::new(app.clone()));
        let mut event = reset_in(4026532999);
        event.header.cgroup_id = 7;
        let Resolution::Found(a) = index.resolve(&event) else { panic!() };
        assert_eq!((a.pod.as_str(), a.container.as_str()), ("web", "app"));
        // On a v1 node, by the process the walk found in the pod's cgroups.
        let mut v1 = Index { v1_pods: true, ..Index::default() };
        v1.by_netns.insert(4026532999, pod("u1", "web"));
        let mut event = reset_in(4026532999);
        event.header.tgid = 812;
        let Resolution::Found(a) = v1.resolve(&event) else { panic!() };
        assert_eq!(
            a.container, "",
            "a task the index does not know names no container, and is not waited for"
        );
        v1.by_process.insert(812, Arc::new(app));
        let Resolution::Found(a) = v1.resolve(&event) else { panic!() };
        assert_eq!(a.container, "app");
        // A bystander of another pod: the pod of the namespace, no container.
        v1.by_process.insert(813, pod("u2", "innocent"));
        event.header.tgid = 813;
        let Resolution::Found(a) = v1.resolve(&event) else { panic!() };
        assert_eq!((a.pod.as_str(), a.container.as_str()), ("web", ""));
    }

    #[test]
    fn an_oom_kill_is_attributed_by_the_memory_cgroup_path_the_kernel_gave() {
        use crate::probes::oom::tests::{victim_event, with_memcg_path};
        let uid = "0b5e7b7e-7d45-4a8e-9c1e-2f4f1c0c9a11";
        let id = "ab".repeat(32);
        let pod_dir = format!("pod{uid}");
        let decode = |raw| Decoder::default().decode(&bytes_of(&raw)).unwrap();
        let mut raw = with_memcg_path(victim_event(), &[&id, &pod_dir, "burstable", "kubepods"]);
        // A v1 node: the header's v2 cgroup is the host's, and the victim's process is gone.
        raw.header.cgroup_id = 1;
        raw.header.tgid = 4321;
        let kill = decode(raw);
        let mut index = Index { v1_pods: true, ..Index::default() };
        index.by_cgroup.insert(1, Arc::new(Attribution { host: true, ..Default::default() }));
        let Resolution::Found(a) = index.resolve(&kill) else { panic!("no lookup needed") };
        assert_eq!(
            (a.pod_uid.as_deref(), a.container_id.as_deref(), a.host),
            (Some(uid), Some(id.as_str()), false)
        );
        assert_eq!(a.qos, Some(Qos::Burstable));
        // A node process's path says nothing: the header's cgroup does as before.
        let mut host = with_memcg_path(victim_event(), &["kubelet.service", "system.slice", ""]);
        (host.header.cgroup_id, host.header.tgid) = (1, 812);
        let host = decode(host);
        let Resolution::Missing { key: Key::Process(_), fallback: Some(f) } = index.resolve(&host) else {
            panic!()
        };
        assert!(f.host);
    }

    #[test]
    fn a_kernel_threads_rpcs_belong_to_the_pod_whose_nfs_volume_they_served() {
        let mut latency = crate::probes::nfs::tests::slow_writes();
        latency.device = Some("0:53".into());
        let mut event = reset_in(0);
        event.payload = Payload::NfsLatency(latency);
        event.header.tgid = 0;
        event.header.cgroup_id = 1;
        let mut index = Index::default();
        index.by_cgroup.insert(1, Arc::new(Attribution { host: true, ..Default::default() }));
        index.by_nfs_mount.insert("0:53".into(), pod("u1", "ledger-0"));
        let Resolution::Found(a) = index.resolve(&event) else { panic!() };
        assert_eq!(a.pod, "ledger-0", "a kworker's writeback is the volume's pod's");
        // A pod's own process started them: that pod, whoever's volume it is.
        index.by_cgroup.insert(7, pod("u2", "reports-0"));
        event.header.cgroup_id = 7;
        let Resolution::Found(a) = index.resolve(&event) else { panic!() };
        assert_eq!(a.pod, "reports-0");
        // A mount the last walk did not see: the resolver reads the mounts again, the count waits.
        event.header.cgroup_id = 1;
        if let Payload::NfsLatency(l) = &mut event.payload {
            l.device = Some("0:54".into());
        }
        let Resolution::Missing { key, fallback: Some(host) } = index.resolve(&event) else { panic!() };
        assert_eq!(key, key_for_mount("0:54"));
        assert!(host.host);
        // No single pod's: the host, as its cgroup says.
        index.unresolvable.insert(key);
        let Resolution::Found(a) = index.resolve(&event) else { panic!() };
        assert!(a.host && a.pod.is_empty());
        // On a transport a pod made in its own network namespace (it mounted for itself): that pod's.
        index.by_netns.insert(4026532999, pod("u3", "catalog-0"));
        event.header.netns = 4026532999;
        let Resolution::Found(a) = index.resolve(&event) else { panic!() };
        assert_eq!(a.pod, "catalog-0");
    }

    #[test]
    fn a_miss_asks_once_then_the_key_is_unresolvable() {
        let mut index = Index::default();
        assert!(matches!(
            index.resolve(&reset_in(5)),
            Resolution::Missing { key: Key::Netns(5), fallback: None }
        ));
        index.unresolvable.insert(Key::Netns(5));
        let Resolution::Found(a) = index.resolve(&reset_in(5)) else { panic!() };
        assert_eq!(*a, Attribution::default());
    }

    #[test]
    fn a_pod_without_metadata_waits_only_when_a_source_is_configured() {
        let mut index = Index::default();
        index.by_netns.insert(9, pod("u1", ""));
        assert!(matches!(index.resolve(&reset_in(9)), Resolution::Found(_)));
        index.metadata_source = true;
        assert!(matches!(
            index.resolve(&reset_in(9)),
            Resolution::Missing { key: Key::PodMeta(_), fallback: Some(_) }
        ));
    }

    #[test]
    fn container_names_and_phases_come_from_metadata() {
        let workload =
            Workload::Container { pod_uid: "u1".into(), container_id: "c1".into(), qos: Qos::Burstable };
        let meta = pods::PodMeta {
            uid: "u1".into(),
            name: "web-1".into(),
            namespace: "shop".into(),
            workload: "Deployment/web".into(),
            node: "n".into(),
            labels: BTreeMap::new(),
            host_network: false,
            ips: Vec::new(),
            containers: HashMap::from([("c1".to_string(), "app".to_string())]),
            deletion_deadline_unix_secs: Some(1_796_000_000),
            state: pods::PodState::default(),
            mesh: None,
        };
        let a = attribute(&workload, Some(&meta), false, Via::Cgroup);
        assert_eq!((a.namespace.as_str(), a.pod.as_str(), a.container.as_str()), ("shop", "web-1", "app"));
        assert_eq!(a.pod_phase, Some(PodPhase::Terminating));
        assert_eq!(attribute(&workload, Some(&meta), true, Via::Cgroup).pod_phase, Some(PodPhase::Deleted));
        let bare = attribute(&workload, None, false, Via::Cgroup);
        assert_eq!((bare.pod.as_str(), bare.pod_uid.as_deref()), ("", Some("u1")));
        let host =
            attribute(&Workload::Host { unit: Some("kubelet.service".into()) }, None, false, Via::Cgroup);
        assert!(host.host && host.pod.is_empty());
    }
}
