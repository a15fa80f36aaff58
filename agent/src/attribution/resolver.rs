//! The background half of attribution: walks the cgroup hierarchies, learns each pod's network
//! namespace from its processes, applies pod metadata updates, answers the event path's misses,
//! forgets what is older than the retention time, and publishes a fresh [`Index`] after each
//! change. All of its `/proc` and cgroupfs reads run on the blocking pool; the event path never
//! waits for them.

use std::{
    collections::{HashMap, HashSet},
    path::PathBuf,
    sync::Arc,
    time::{Duration, Instant},
};

use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;

use super::{
    Attribution, Index, Key, NodeMemory, Via, attribute,
    cgroup::{self, Hierarchies, Workload},
    mounts, netns,
    pods::{PodStore, PodUpdate},
};

/// How often the hierarchies are walked again in full (new cgroups are also found on a miss).
const FULL_WALK_INTERVAL: Duration = Duration::from_secs(5);
/// Misses arriving closer together than this share one walk.
const MISS_BATCH: Duration = Duration::from_millis(20);
/// Cgroups and namespaces remembered after they disappeared (for the retention time), at most.
const MAX_REMEMBERED: usize = 100_000;
/// A resolver step taking longer than this is reported as stuck.
const STUCK_AFTER: Duration = Duration::from_secs(5);
/// How often each pod namespace's witness process is checked. The kernel hands a freed
/// namespace's inode number to the next new namespace at once; a pod whose processes are gone
/// stops owning its number within this time rather than at the next walk.
const VERIFY_INTERVAL: Duration = Duration::from_secs(1);

#[derive(Debug, Clone)]
pub struct Settings {
    pub hierarchies: Hierarchies,
    pub proc: PathBuf,
    /// How long a deleted pod (and its cgroups and namespace) is still named.
    pub retention: Duration,
    pub metadata_source: bool,
}

struct Remembered<T> {
    value: T,
    /// When the last walk stopped seeing it.
    gone_at: Option<Instant>,
}

impl<T> Remembered<T> {
    fn new(value: T) -> Self {
        Self { value, gone_at: None }
    }
}

/// A pod's network namespace and the process it was learned from.
#[derive(Debug, Clone, PartialEq)]
struct PodNetns {
    owner: NetnsOwner,
    witness: u32,
}

#[derive(Debug, Clone, PartialEq)]
enum NetnsOwner {
    Pod(Workload),
    /// Processes of two pods were found in it: not guessed.
    Shared,
}

pub struct Resolver {
    settings: Settings,
    /// The host's namespace and a process in it: init's (the agent runs with hostPID), else the
    /// agent's own.
    host_netns: Option<(u32, u32)>,
    cgroups: HashMap<u64, Remembered<Workload>>,
    netns: HashMap<u32, Remembered<PodNetns>>,
    /// Processes in pods' v1 cgroups, as of the last walk (pids are reused: not remembered).
    processes: HashMap<u32, Workload>,
    pods: PodStore,
    unresolvable: HashSet<Key>,
    /// Sum of the pods' memory limits at the last walk (pods without a limit add nothing).
    pod_memory_limits: u64,
    /// Each pod's own cgroup v2 directory (pod UID -> dir), at the last walk: its pressure files.
    pod_dirs: HashMap<String, std::path::PathBuf>,
    /// NFS devices (`major:minor`) mounted as one pod's volume, and that pod's UID, at the last walk.
    nfs_mounts: mounts::NodeNfsMounts,
    node_memory: u64,
}

impl Resolver {
    pub fn new(settings: Settings) -> Self {
        let pods = PodStore::new(settings.retention);
        Self {
            host_netns: netns::host(&settings.proc).map(|ino| {
                let init_is_host = netns::of_process(&settings.proc, 1) == Some(ino);
                (ino, if init_is_host { 1 } else { std::process::id() })
            }),
            node_memory: crate::kernel::mem_total_bytes(&settings.proc).unwrap_or(0),
            settings,
            cgroups: HashMap::new(),
            netns: HashMap::new(),
            processes: HashMap::new(),
            pods,
            unresolvable: HashSet::new(),
            pod_memory_limits: 0,
            pod_dirs: HashMap::new(),
            nfs_mounts: mounts::NodeNfsMounts::default(),
        }
    }

    /// Walks everything again; what is no longer there starts its retention time, what is past
    /// it is forgotten.
    pub fn full_walk(&mut self, now: Instant) {
        let mut seen_cgroups = HashSet::new();
        let mut learned = Learned::default();
        let mut limits = 0u64;
        self.pod_dirs.clear();
        if let Some(v2) = &self.settings.hierarchies.v2 {
            for dir in cgroup::walk(v2, false) {
                if let Workload::Pod { pod_uid, .. } = &dir.workload {
                    self.pod_dirs.insert(pod_uid.clone(), dir.dir.clone());
                }
                seen_cgroups.insert(dir.id);
                if !matches!(dir.workload, Workload::Host { .. }) {
                    learned.pod_cgroup(&self.settings.proc, &dir, false);
                }
                if matches!(dir.workload, Workload::Pod { .. }) {
                    limits += cgroup::memory_limit(&dir.dir).unwrap_or(0);
                }
                self.cgroups.insert(dir.id, Remembered::new(dir.workload));
            }
        }
        if let Some(v1) = &self.settings.hierarchies.v1_memory {
            for dir in cgroup::walk(v1, true) {
                if !matches!(dir.workload, Workload::Host { .. }) {
                    learned.pod_cgroup(&self.settings.proc, &dir, true);
                }
                if matches!(dir.workload, Workload::Pod { .. }) {
                    limits += cgroup::memory_limit(&dir.dir).unwrap_or(0);
                }
            }
        }
        self.pod_memory_limits = limits;
        self.nfs_mounts = mounts::node_mounts(&self.settings.proc);
        for (id, c) in &mut self.cgroups {
            if !seen_cgroups.contains(id) {
                c.gone_at.get_or_insert(now);
            }
        }
        for n in self.netns.values_mut() {
            n.gone_at.get_or_insert(now);
        }
        self.processes.clear();
        self.merge(learned);
        self.forget_expired(now);
        self.unresolvable.clear();
    }

    fn merge(&mut self, learned: Learned) {
        for (ino, owner) in learned.netns {
            // The host's namespace is hostNetwork pods' and node processes' alike: not a pod's.
            if Some(ino) != self.host_netns.map(|(host, _)| host) {
                self.netns.insert(ino, Remembered::new(owner));
            }
        }
        self.processes.extend(learned.processes);
    }

    fn forget_expired(&mut self, now: Instant) {
        let retention = self.settings.retention;
        let expired =
            |gone: Option<Instant>| gone.is_some_and(|at| now.saturating_duration_since(at) >= retention);
        self.cgroups.retain(|_, c| !expired(c.gone_at));
        self.netns.retain(|_, n| !expired(n.gone_at));
        self.pods.expire(now);
        // A node that churns through more pods than this within the retention time loses the
        // oldest departed ones first.
        let excess = (self.cgroups.len() + self.netns.len()).saturating_sub(MAX_REMEMBERED);
        if excess > 0 {
            let mut gone: Vec<(Instant, u64)> =
                self.cgroups.iter().filter_map(|(id, c)| Some((c.gone_at?, *id))).collect();
            gone.sort_unstable();
            for (_, id) in gone.into_iter().take(excess) {
                self.cgroups.remove(&id);
            }
        }
    }

    /// Marks namespaces whose witness process left them (or exited) as departed — unless another
    /// process of the pod is still in it, which becomes the witness: the first one a walk found
    /// may be a container's that ends while the pod lives (a mesh's init container, a short-lived
    /// child). Returns whether anything changed.
    pub fn verify(&mut self, now: Instant) -> bool {
        let proc = &self.settings.proc;
        let mut changed = false;
        for (ino, n) in self.netns.iter_mut().filter(|(_, n)| n.gone_at.is_none()) {
            if netns::of_process(proc, n.value.witness) == Some(*ino) {
                continue;
            }
            match another_witness(proc, &self.pod_dirs, &self.processes, &n.value.owner, *ino) {
                Some(witness) => n.value.witness = witness,
                None => n.gone_at = Some(now),
            }
            changed = true;
        }
        changed
    }

    /// Answers misses. Unknown network namespaces cost one walk for all of them, unknown NFS
    /// mounts one read of the mount table.
    pub fn resolve(&mut self, keys: &HashSet<Key>, now: Instant) {
        let mut walked = false;
        let mut mounts_read = false;
        for &key in keys {
            let found = match key {
                Key::Cgroup(id) => self.resolve_cgroup(id),
                Key::Netns(ino) => {
                    if !walked {
                        self.full_walk(now);
                        walked = true;
                    }
                    self.netns.get(&ino).is_some_and(|n| n.gone_at.is_none())
                        || Some(ino) == self.host_netns.map(|(host, _)| host)
                }
                Key::Process(tgid) => match cgroup::workload_of_process(&self.settings.proc, tgid) {
                    Some(w) => {
                        self.processes.insert(tgid, w);
                        true
                    }
                    None => false,
                },
                Key::NfsMount(_) => {
                    if !mounts_read {
                        self.nfs_mounts = mounts::node_mounts(&self.settings.proc);
                        mounts_read = true;
                    }
                    self.nfs_mounts.pod_volumes.keys().any(|device| super::key_for_mount(device) == key)
                }
                // Metadata arrives from its source on its own; the event path's hold bounds the wait.
                Key::PodMeta(_) | Key::ContainerName(_) => true,
            };
            if !found {
                self.unresolvable.insert(key);
            }
        }
    }

    fn resolve_cgroup(&mut self, id: u64) -> bool {
        let Some(v2) = &self.settings.hierarchies.v2 else { return false };
        let Ok(dir) = cgroup::dir_of_id(v2, id) else { return false };
        let relative = dir.strip_prefix(v2).unwrap_or(&dir).to_string_lossy().into_owned();
        let found = cgroup::CgroupDir { id, dir, workload: cgroup::parse(&relative) };
        if !matches!(found.workload, Workload::Host { .. }) {
            let mut learned = Learned::default();
            learned.pod_cgroup(&self.settings.proc, &found, false);
            self.merge(learned);
        }
        self.cgroups.insert(id, Remembered::new(found.workload));
        true
    }

    pub fn apply(&mut self, update: PodUpdate, now: Instant) {
        self.pods.apply(update, now);
        // A deleted pod's namespace is about to be torn down and its inode number handed to the
        // next pod's: stop trusting the mapping before the next walk.
        for n in self.netns.values_mut() {
            if let NetnsOwner::Pod(Workload::Pod { pod_uid, .. }) = &n.value.owner
                && self.pods.is_deleted(pod_uid)
            {
                n.gone_at.get_or_insert(now);
            }
        }
    }

    /// The snapshot the event path reads.
    pub fn index(&self) -> Index {
        // The pod as its own cgroup names it (its QoS class comes with it); declared before
        // `shared`, which borrows from it.
        let mut pods: HashMap<&str, Workload> = HashMap::new();
        for c in self.cgroups.values() {
            if let Workload::Pod { pod_uid, qos } | Workload::Container { pod_uid, qos, .. } = &c.value {
                pods.insert(pod_uid, Workload::Pod { pod_uid: pod_uid.clone(), qos: *qos });
            }
        }
        let mut shared = HashMap::new();
        let mut attribution = |w, via| attribution_of(&mut shared, &self.pods, w, via);
        let mut index = Index {
            v1_pods: !self.processes.is_empty()
                || self.settings.hierarchies.v1_memory.as_ref().is_some_and(|v1| has_kubepods(v1)),
            metadata_source: self.settings.metadata_source,
            unresolvable: self.unresolvable.clone(),
            pods: self.pods.len(),
            deleted_pods: self.pods.deleted(),
            pod_states: self.pods.states(),
            kubelet_load: Arc::new(self.pods.kubelet_load()),
            named_pods: self.pods.names(),
            memory: NodeMemory { pod_limits_bytes: self.pod_memory_limits, node_bytes: self.node_memory },
            nfs_mount_ports: self.nfs_mounts.option_ports.clone(),
            ..Index::default()
        };
        index.pod_meta =
            self.pods.all().map(|(meta, deleted)| (meta.uid.clone(), (meta.clone(), deleted))).collect();
        for (id, c) in &self.cgroups {
            index.by_cgroup.insert(*id, attribution(&c.value, Via::Cgroup));
        }
        for (ino, n) in &self.netns {
            let a = match &n.value.owner {
                NetnsOwner::Pod(w) => attribution(w, Via::Netns),
                NetnsOwner::Shared => Arc::new(Attribution { via: Via::Netns, ..Default::default() }),
            };
            if n.gone_at.is_some() {
                index.departed_netns.insert(*ino, a);
            } else {
                index.by_netns.insert(*ino, a);
                index.netns_witness.insert(*ino, n.value.witness);
            }
        }
        if let Some((host, witness)) = self.host_netns {
            index.netns_witness.insert(host, witness);
            let a = Attribution { host: true, host_network: true, via: Via::Netns, ..Default::default() };
            index.by_netns.insert(host, Arc::new(a));
        }
        for (tgid, w) in &self.processes {
            index.by_process.insert(*tgid, attribution(w, Via::Process));
        }
        for (uid, dir) in &self.pod_dirs {
            if let Some(pod) = pods.get(uid.as_str()) {
                index.pod_cgroups.push((dir.clone(), attribution(pod, Via::Cgroup)));
            }
        }
        for (meta, deleted) in self.pods.all() {
            if let Some(pod) = pods.get(meta.uid.as_str()).filter(|_| !deleted) {
                for ip in &meta.ips {
                    index.by_pod_ip.insert(*ip, attribution(pod, Via::Netns));
                }
            }
        }
        for (device, uid) in &self.nfs_mounts.pod_volumes {
            if let Some(pod) = pods.get(uid.as_str()) {
                index.by_nfs_mount.insert(device.clone(), attribution(pod, Via::Mount));
            }
        }
        index
    }

    pub fn pods(&self) -> &PodStore {
        &self.pods
    }
}

/// One shared attribution per (workload, via): a pod's many cgroups point at the same one.
fn attribution_of<'a>(
    shared: &mut HashMap<(&'a Workload, Via), Arc<Attribution>>,
    pods: &PodStore,
    workload: &'a Workload,
    via: Via,
) -> Arc<Attribution> {
    shared
        .entry((workload, via))
        .or_insert_with(|| {
            let uid = match workload {
                Workload::Container { pod_uid, .. } | Workload::Pod { pod_uid, .. } => Some(pod_uid),
                Workload::Host { .. } => None,
            };
            let meta = uid.and_then(|u| pods.get(u));
            let deleted = uid.is_some_and(|u| pods.is_deleted(u));
            Arc::new(attribute(workload, meta.map(|m| &**m), deleted, via))
        })
        .clone()
}

fn has_kubepods(root: &std::path::Path) -> bool {
    ["kubepods", "kubepods.slice"].iter().any(|d| root.join(d).is_dir())
}

/// A process of `owner`'s pod still in namespace `ino`: from the pod's cgroup directory and its
/// containers' (v2), or the processes a v1 walk placed in the pod.
fn another_witness(
    proc: &std::path::Path,
    pod_dirs: &HashMap<String, std::path::PathBuf>,
    processes: &HashMap<u32, Workload>,
    owner: &NetnsOwner,
    ino: u32,
) -> Option<u32> {
    let NetnsOwner::Pod(Workload::Pod { pod_uid, .. }) = owner else { return None };
    let dirs = pod_dirs.get(pod_uid).into_iter().flat_map(|pod| {
        let containers = std::fs::read_dir(pod).into_iter().flatten().flatten().map(|e| e.path());
        std::iter::once(pod.clone()).chain(containers.filter(|p| p.is_dir()))
    });
    let v1 = processes.iter().filter_map(|(&tgid, w)| match w {
        Workload::Container { pod_uid: uid, .. } | Workload::Pod { pod_uid: uid, .. } if uid == pod_uid => {
            Some(tgid)
        }
        _ => None,
    });
    dirs.flat_map(|dir| cgroup::procs(&dir))
        .chain(v1)
        .find(|&tgid| netns::of_process(proc, tgid) == Some(ino))
}

/// What the processes of pod cgroups tell: each pod's network namespace, and (v1) which pod a
/// process is in.
#[derive(Default)]
struct Learned {
    netns: HashMap<u32, PodNetns>,
    processes: HashMap<u32, Workload>,
    /// Pods whose namespace is known: one readable process per pod is enough.
    pods_done: HashSet<String>,
}

impl Learned {
    fn pod_cgroup(&mut self, proc: &std::path::Path, dir: &cgroup::CgroupDir, v1: bool) {
        let pod = match &dir.workload {
            Workload::Container { pod_uid, qos, .. } | Workload::Pod { pod_uid, qos } => {
                Workload::Pod { pod_uid: pod_uid.clone(), qos: *qos }
            }
            Workload::Host { .. } => return,
        };
        let Workload::Pod { pod_uid, .. } = &pod else { return };
        let tgids = cgroup::procs(&dir.dir);
        if v1 {
            self.processes.extend(tgids.iter().map(|&t| (t, dir.workload.clone())));
        }
        if self.pods_done.contains(pod_uid) {
            return;
        }
        let Some((witness, ino)) = tgids.iter().find_map(|&t| Some((t, netns::of_process(proc, t)?))) else {
            return;
        };
        self.pods_done.insert(pod_uid.clone());
        match self.netns.get_mut(&ino) {
            Some(known) if matches!(&known.owner, NetnsOwner::Pod(other) if *other != pod) => {
                known.owner = NetnsOwner::Shared;
            }
            Some(_) => {}
            None => {
                self.netns.insert(ino, PodNetns { owner: NetnsOwner::Pod(pod), witness });
            }
        }
    }
}

/// Inputs of the resolver task.
pub struct Inputs {
    pub pods: mpsc::Receiver<PodUpdate>,
    pub misses: mpsc::Receiver<Key>,
}

/// Runs the resolver until `stop`, publishing each new index on `publish`.
pub async fn run(
    mut resolver: Resolver,
    mut inputs: Inputs,
    publish: watch::Sender<Arc<Index>>,
    stop: CancellationToken,
) {
    let mut tick = tokio::time::interval(FULL_WALK_INTERVAL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut verify_tick = tokio::time::interval(VERIFY_INTERVAL);
    verify_tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        enum Work {
            Verify,
            Walk,
            Pods(Vec<PodUpdate>),
            Misses(HashSet<Key>),
        }
        let work = tokio::select! {
            _ = stop.cancelled() => return,
            _ = tick.tick() => Work::Walk,
            _ = verify_tick.tick() => Work::Verify,
            Some(update) = inputs.pods.recv() => {
                let mut all = vec![update];
                while let Ok(more) = inputs.pods.try_recv() {
                    all.push(more);
                }
                Work::Pods(all)
            }
            Some(key) = inputs.misses.recv() => {
                tokio::time::sleep(MISS_BATCH).await;
                let mut keys = HashSet::from([key]);
                while let Ok(more) = inputs.misses.try_recv() {
                    keys.insert(more);
                }
                Work::Misses(keys)
            }
        };
        let started = Instant::now();
        let mut job = tokio::task::spawn_blocking(move || {
            let now = Instant::now();
            let changed = match work {
                Work::Verify => resolver.verify(now),
                Work::Walk => {
                    resolver.full_walk(now);
                    true
                }
                Work::Pods(updates) => {
                    updates.into_iter().for_each(|u| resolver.apply(u, now));
                    true
                }
                Work::Misses(keys) => {
                    resolver.resolve(&keys, now);
                    true
                }
            };
            let index = changed.then(|| resolver.index());
            (resolver, index)
        });
        // A blocking read cannot be cancelled; say so while it lasts. Events keep flowing with
        // the last index meanwhile (misses go out with what is known after their hold).
        let done = match tokio::time::timeout(STUCK_AFTER, &mut job).await {
            Ok(done) => done,
            Err(_) => {
                tracing::warn!(
                    after_secs = STUCK_AFTER.as_secs(),
                    "attribution is stuck reading cgroupfs or /proc; events use the pods known so far"
                );
                job.await
            }
        };
        let (back, index) = match done {
            Ok(done) => done,
            Err(e) => {
                tracing::error!(error = %e, "attribution resolver failed; events keep the last known pods");
                return;
            }
        };
        resolver = back;
        let Some(index) = index else { continue };
        let took = started.elapsed();
        if took > Duration::from_secs(1) && took < STUCK_AFTER {
            tracing::warn!(took_ms = took.as_millis() as u64, "attribution update was slow");
        }
        tracing::trace!(
            cgroups = index.by_cgroup.len(),
            netns = index.by_netns.len(),
            "attribution index published"
        );
        publish.send_replace(Arc::new(index));
    }
}

#[cfg(test)]
mod tests {
    use std::{os::unix::fs::MetadataExt as _, path::Path};

    use super::*;
    use crate::{
        attribution::{PodPhase, Resolution, pods::PodMeta},
        decode::bytes_of,
        events::{Decoder, Event},
        probes::tcp_reset::tests::redirected_syn_reset,
    };

    const HOST_NETNS: u32 = 4026531840;
    const POD_NETNS: u32 = 4026532999;
    const UID: &str = "0c2a5b1e-7f3d-4c1a-9e8b-1234567890ab";
    const CID: &str = "4f1a2b3c4d5e6f708192a3b4c5d6e7f8091a2b3c4d5e6f708192a3b4c5d6e7f8";

    /// A fake node: a v2 hierarchy with one pod (systemd driver), a v1 memory hierarchy with
    /// another (cgroupfs driver), and a /proc with their processes' namespaces.
    struct Node {
        dir: tempfile::TempDir,
    }

    impl Node {
        fn new() -> Self {
            let node = Self { dir: tempfile::tempdir().unwrap() };
            node.process(1, Some(HOST_NETNS));
            node
        }
        fn path(&self, rel: &str) -> std::path::PathBuf {
            self.dir.path().join(rel)
        }
        fn cgroup(&self, rel: &str, procs: &[u32]) -> u64 {
            let dir = self.path(rel);
            std::fs::create_dir_all(&dir).unwrap();
            let text: String = procs.iter().map(|p| format!("{p}\n")).collect();
            std::fs::write(dir.join("cgroup.procs"), text).unwrap();
            std::fs::metadata(&dir).unwrap().ino()
        }
        fn process(&self, pid: u32, netns: Option<u32>) {
            let ns = self.path(&format!("proc/{pid}/ns"));
            std::fs::create_dir_all(&ns).unwrap();
            if let Some(ino) = netns {
                std::os::unix::fs::symlink(format!("net:[{ino}]"), ns.join("net")).unwrap();
            }
        }
        fn resolver(&self, metadata_source: bool) -> Resolver {
            Resolver::new(Settings {
                hierarchies: Hierarchies { v2: Some(self.path("v2")), v1_memory: Some(self.path("v1")) },
                proc: self.path("proc"),
                retention: Duration::from_secs(3600),
                metadata_source,
            })
        }
    }

    fn systemd_container(uid: &str, id: &str) -> String {
        let uid = uid.replace('-', "_");
        format!(
            "v2/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{uid}.slice/cri-containerd-{id}.scope"
        )
    }

    fn reset_in(netns: u32) -> Event {
        let mut raw = redirected_syn_reset();
        raw.header.netns_ino = netns;
        Decoder::default().decode(&bytes_of(&raw)).unwrap()
    }

    fn found(index: &Index, event: &Event) -> Arc<Attribution> {
        match index.resolve(event) {
            Resolution::Found(a) => a,
            Resolution::Missing { key, .. } => panic!("missing {key:?}"),
        }
    }

    fn meta(uid: &str, name: &str) -> PodMeta {
        let pod = serde_json::from_value(crate::attribution::pods::tests::pod_json(uid, name, CID)).unwrap();
        PodMeta::from_pod(&pod, &[]).unwrap()
    }

    #[test]
    fn a_pods_netns_is_learned_from_its_processes() {
        let node = Node::new();
        node.cgroup("v2", &[1]);
        node.cgroup(&systemd_container(UID, CID), &[100]);
        node.process(100, Some(POD_NETNS));
        let mut r = node.resolver(false);
        r.full_walk(Instant::now());
        let index = r.index();
        let a = found(&index, &reset_in(POD_NETNS));
        assert_eq!((a.pod_uid.as_deref(), a.via), (Some(UID), Via::Netns));
        let host = found(&index, &reset_in(HOST_NETNS));
        assert!(host.host && host.host_network && host.pod_uid.is_none(), "{host:?}");
        assert!(matches!(index.resolve(&reset_in(5)), Resolution::Missing { .. }));
    }

    #[test]
    fn zombie_leaders_hostnetwork_pods_and_shared_namespaces() {
        let node = Node::new();
        let other = "11111111-2222-4333-8444-555555555555";
        let host_pod = "22222222-2222-4333-8444-555555555555";
        // The leader's link is unreadable (a zombie): a thread's is used.
        node.cgroup(&systemd_container(UID, CID), &[100]);
        node.process(100, None);
        std::fs::create_dir_all(node.path("proc/100/task/101/ns")).unwrap();
        std::os::unix::fs::symlink(format!("net:[{POD_NETNS}]"), node.path("proc/100/task/101/ns/net"))
            .unwrap();
        // A hostNetwork pod: its namespace is the host's and stays "host network".
        node.cgroup(&systemd_container(host_pod, CID), &[300]);
        node.process(300, Some(HOST_NETNS));
        // Two pods in one namespace: not guessed.
        node.cgroup(&format!("v2/kubepods/besteffort/pod{other}/{CID}"), &[200]);
        node.process(200, Some(7));
        node.cgroup(&format!("v2/kubepods/besteffort/pod{}/{CID}", UID.replace("0c", "0d")), &[201]);
        node.process(201, Some(7));
        let mut r = node.resolver(false);
        r.full_walk(Instant::now());
        let index = r.index();
        assert_eq!(found(&index, &reset_in(POD_NETNS)).pod_uid.as_deref(), Some(UID));
        assert!(found(&index, &reset_in(HOST_NETNS)).host_network);
        let shared = found(&index, &reset_in(7));
        assert!(shared.pod_uid.is_none() && !shared.host, "{shared:?}");
    }

    #[test]
    fn v1_pods_are_found_by_process() {
        let node = Node::new();
        let host_cgroup = node.cgroup("v2/system.slice/containerd.service", &[400]);
        node.cgroup(&format!("v1/kubepods/burstable/pod{UID}/{CID}"), &[400]);
        node.process(400, Some(POD_NETNS));
        let mut r = node.resolver(false);
        r.full_walk(Instant::now());
        let index = r.index();
        assert!(index.v1_pods);
        let mut oom = crate::probes::oom::tests::victim_event();
        oom.header.cgroup_id = host_cgroup;
        oom.header.tgid = 400;
        let event = Decoder::default().decode(&bytes_of(&oom)).unwrap();
        let a = found(&index, &event);
        assert_eq!((a.container_id.as_deref(), a.via), (Some(CID), Via::Process));
        // A process of a host unit on a v1 node: asked about (it may be a pod's not walked yet).
        oom.header.tgid = 401;
        let event = Decoder::default().decode(&bytes_of(&oom)).unwrap();
        let Resolution::Missing { key: Key::Process(401), fallback: Some(host) } = index.resolve(&event)
        else {
            panic!()
        };
        assert_eq!(host.unit.as_deref(), Some("containerd.service"));
    }

    #[test]
    fn misses_are_answered_and_unknowns_are_not_asked_again() {
        let node = Node::new();
        let mut r = node.resolver(false);
        r.full_walk(Instant::now());
        // A pod that appeared after the walk.
        node.cgroup(&systemd_container(UID, CID), &[100]);
        node.process(100, Some(POD_NETNS));
        r.resolve(&HashSet::from([Key::Netns(POD_NETNS), Key::Netns(9)]), Instant::now());
        let index = r.index();
        assert_eq!(found(&index, &reset_in(POD_NETNS)).pod_uid.as_deref(), Some(UID));
        assert_eq!(*found(&index, &reset_in(9)), Attribution::default(), "unresolvable: not held again");
        r.full_walk(Instant::now());
        assert!(
            matches!(r.index().resolve(&reset_in(9)), Resolution::Missing { .. }),
            "asked again after a walk"
        );
    }

    #[test]
    fn names_arrive_with_metadata_and_outlive_the_pod_for_the_retention_time() {
        let node = Node::new();
        let container = node.cgroup(&systemd_container(UID, CID), &[100]);
        node.process(100, Some(POD_NETNS));
        let mut r = node.resolver(true);
        let t0 = Instant::now();
        r.full_walk(t0);
        assert!(matches!(
            r.index().resolve(&reset_in(POD_NETNS)),
            Resolution::Missing { key: Key::PodMeta(_), .. }
        ));
        r.apply(PodUpdate::Snapshot(vec![meta(UID, "web-1")]), t0);
        let a = found(&r.index(), &reset_in(POD_NETNS));
        assert_eq!(
            (a.namespace.as_str(), a.pod.as_str(), a.workload.as_str()),
            ("shop", "web-1", "Deployment/web")
        );
        // The pod is deleted and its cgroups removed: a late event still names it...
        r.apply(PodUpdate::Snapshot(vec![]), t0 + Duration::from_secs(1));
        std::fs::remove_dir_all(node.path("v2/kubepods.slice")).unwrap();
        r.full_walk(t0 + Duration::from_secs(60));
        let mut hung = crate::probes::oom::tests::victim_event();
        hung.header.cgroup_id = container;
        let late = found(&r.index(), &Decoder::default().decode(&bytes_of(&hung)).unwrap());
        assert_eq!((late.pod.as_str(), late.pod_phase), ("web-1", Some(PodPhase::Deleted)));
        // (its namespace only once a walk has found no live pod in it: inode numbers are reused)
        let Resolution::Missing { key, fallback: Some(departed) } = r.index().resolve(&reset_in(POD_NETNS))
        else {
            panic!()
        };
        assert_eq!(departed.pod, "web-1");
        r.resolve(&HashSet::from([key]), t0 + Duration::from_secs(61));
        assert_eq!(found(&r.index(), &reset_in(POD_NETNS)).pod, "web-1");
        // ...until the retention time has passed.
        r.full_walk(t0 + Duration::from_secs(3700));
        assert!(r.pods().is_empty());
        assert!(matches!(r.index().resolve(&reset_in(POD_NETNS)), Resolution::Missing { .. }));
    }

    #[test]
    fn a_reused_namespace_inode_belongs_to_the_new_pod() {
        let node = Node::new();
        let new_uid = "33333333-2222-4333-8444-555555555555";
        node.cgroup(&systemd_container(UID, CID), &[100]);
        node.process(100, Some(POD_NETNS));
        let mut r = node.resolver(true);
        let t0 = Instant::now();
        r.full_walk(t0);
        r.apply(PodUpdate::Snapshot(vec![meta(UID, "old"), meta(new_uid, "new")]), t0);
        // The old pod is deleted; the kernel gives its namespace's inode to a new pod.
        r.apply(PodUpdate::Delete { uid: UID.into() }, t0);
        std::fs::remove_dir_all(node.path("v2/kubepods.slice")).unwrap();
        std::fs::remove_dir_all(node.path("proc/100")).unwrap();
        node.cgroup(&systemd_container(new_uid, CID), &[101]);
        node.process(101, Some(POD_NETNS));
        let Resolution::Missing { key, .. } = r.index().resolve(&reset_in(POD_NETNS)) else { panic!() };
        r.resolve(&HashSet::from([key]), t0);
        assert_eq!(found(&r.index(), &reset_in(POD_NETNS)).pod, "new");
    }

    #[test]
    fn a_namespace_whose_pod_processes_left_is_departed_within_a_verify() {
        let node = Node::new();
        node.cgroup(&systemd_container(UID, CID), &[100]);
        node.process(100, Some(POD_NETNS));
        let mut r = node.resolver(false);
        r.full_walk(Instant::now());
        assert!(!r.verify(Instant::now()), "nothing changed");
        std::fs::remove_dir_all(node.path("proc/100")).unwrap();
        assert!(r.verify(Instant::now()));
        let index = r.index();
        assert!(!index.by_netns.contains_key(&POD_NETNS));
        assert!(matches!(
            index.resolve(&reset_in(POD_NETNS)),
            Resolution::Missing { key: Key::Netns(POD_NETNS), fallback: Some(_) }
        ));
    }

    #[test]
    fn a_namespace_outlives_its_witness_while_another_process_of_the_pod_is_in_it() {
        let node = Node::new();
        let sandbox = "1111111111111111111111111111111111111111111111111111111111111111";
        node.cgroup(&systemd_container(UID, CID), &[100]);
        node.cgroup(&systemd_container(UID, sandbox), &[90]);
        node.process(100, Some(POD_NETNS));
        node.process(90, Some(POD_NETNS));
        let mut r = node.resolver(false);
        r.full_walk(Instant::now());
        let first = r.index().netns_witness[&POD_NETNS];
        std::fs::remove_dir_all(node.path(&format!("proc/{first}"))).unwrap();
        assert!(r.verify(Instant::now()), "a new witness");
        let index = r.index();
        let other = if first == 100 { 90 } else { 100 };
        assert_eq!(index.netns_witness.get(&POD_NETNS), Some(&other));
        assert_eq!(found(&index, &reset_in(POD_NETNS)).pod_uid.as_deref(), Some(UID));
        assert!(!r.verify(Instant::now()), "nothing changed");
        std::fs::remove_dir_all(node.path(&format!("proc/{other}"))).unwrap();
        assert!(r.verify(Instant::now()));
        assert!(!r.index().by_netns.contains_key(&POD_NETNS), "departed once none is left");
    }

    #[test]
    fn pod_memory_limits_add_up_against_node_memory() {
        let node = Node::new();
        std::fs::write(node.path("proc/meminfo"), "MemTotal:        4194304 kB\nMemFree: 1 kB\n").unwrap();
        node.cgroup(&format!("v1/kubepods/burstable/pod{UID}"), &[]);
        std::fs::write(
            node.path(&format!("v1/kubepods/burstable/pod{UID}/memory.limit_in_bytes")),
            "2369781760\n",
        )
        .unwrap();
        let other = "11111111-2222-4333-8444-555555555555";
        node.cgroup(&format!("v1/kubepods/besteffort/pod{other}"), &[]);
        // No limit: the kernel's "unlimited" adds nothing.
        std::fs::write(
            node.path(&format!("v1/kubepods/besteffort/pod{other}/memory.limit_in_bytes")),
            "9223372036854771712\n",
        )
        .unwrap();
        let mut r = node.resolver(false);
        r.full_walk(Instant::now());
        let index = r.index();
        assert_eq!((index.memory.pod_limits_bytes, index.memory.node_bytes), (2369781760, 4 << 30));
    }

    #[test]
    fn real_hierarchy_ids_resolve_by_handle() {
        let hierarchies = Hierarchies::for_this_host();
        let Some(v2) = hierarchies.v2 else { return };
        let me = std::fs::read_to_string("/proc/self/cgroup").unwrap();
        let Some(own) = me.lines().find_map(|l| l.strip_prefix("0::")) else { return };
        let dir = v2.join(own.trim_start_matches('/'));
        let id = std::fs::metadata(&dir).unwrap().ino();
        match cgroup::dir_of_id(&v2, id) {
            Ok(found) => assert_eq!(found, dir),
            // Without CAP_DAC_READ_SEARCH (not root) the walk is the only way.
            Err(e) => assert_eq!(e.raw_os_error(), Some(libc::EPERM), "{e}"),
        }
        assert!(Path::new("/proc/self/ns/net").exists());
    }
}
