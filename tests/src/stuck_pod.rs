//! Incident 1 on the host, as tests/tests/incidents.rs and capture_on.rs stage it: a pod — a
//! container cgroup in the systemd driver's layout and a network namespace with the sidecar's
//! REDIRECT of 2049 to 15001 where nothing listens, a process in both — whose hard-mounted NFS
//! client's reconnects are refused through the rule, and a task of the pod stuck flushing to a
//! frozen disk.

use crate::{
    cgroup::{Cgroup, PodProcess},
    netns::{NetNs, NfsReconnects},
    writeback::FreezableDisk,
};

/// Dropped in field order: the reconnects stop and the pod's process goes before the namespace
/// and the cgroup they are in.
pub struct RedirectedStuckPod {
    /// The reconnects, every half second until stopped.
    pub client: NfsReconnects,
    _sandbox: PodProcess,
    pub netns: NetNs,
    pub container: Cgroup,
    /// The pid of the task stuck in D state (dd, its flush waiting on `disk`).
    pub writer: u32,
}

impl RedirectedStuckPod {
    /// The pod of `uid` and `container_id`, its namespace named `name`; `disk` frozen under its
    /// writer.
    pub fn start(name: &str, uid: &str, container_id: &str, disk: &mut FreezableDisk) -> Self {
        let container = Cgroup::kubepods_container("burstable", uid, container_id);
        let netns = NetNs::new(name);
        let sandbox = PodProcess::start(&netns, &container.procs());
        netns.redirect_tcp("iptables", 2049, 15001);
        let client = NfsReconnects::start(&netns);
        disk.freeze();
        let writer = disk.start_writer(&container.procs());
        RedirectedStuckPod { client, _sandbox: sandbox, netns, container, writer }
    }
}
