//! Offsets into `struct task_struct` and friends, shared by the probes whose event is about a task
//! other than `current` (a hung task, an OOM victim). Resolved by the agent from BTF.

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TaskOffsets {
    pub pid: u32,
    pub tgid: u32,
    pub comm: u32,
    /// `task->cgroups` (css_set) -> `dfl_cgrp` (cgroup) -> `kn` (kernfs_node) -> `id`.
    pub cgroups: u32,
    pub css_set_dfl_cgrp: u32,
    pub cgroup_kn: u32,
    pub kernfs_node_id: u32,
    /// `task->nsproxy` (NULL once the task is exiting) -> `net_ns` -> `ns.inum`.
    pub nsproxy: u32,
    pub nsproxy_net_ns: u32,
    pub net_ns_inum: u32,
}
