//! OOM kills. Kernel half: `ebpf/src/probes/oom.rs`; agent half: `agent/src/probes/oom.rs`.

use crate::{
    header::{EventHeader, TASK_COMM_LEN},
    task::TaskOffsets,
};

pub const VERSION: u32 = 3;
/// Frames of the OOM-invoking task's kernel stack: its call path tells a memcg OOM
/// (`mem_cgroup_out_of_memory`) from a global one (`out_of_memory` from the page allocator).
pub const STACK_DEPTH: usize = 32;

/// `flags` bits.
/// Only the victim's pid is known (the `mark_victim(int pid)` form before 6.9).
pub const FLAG_VICTIM_PID_ONLY: u32 = 1 << 0;
/// `anon_rss`/`file_rss`/`shmem_rss`/`total_vm` were read from the victim's mm.
pub const FLAG_HAS_RSS: u32 = 1 << 1;
/// `oom_score_adj` was read.
pub const FLAG_HAS_SCORE_ADJ: u32 = 1 << 2;
/// From `oom_kill_process(oc)`: `oc->memcg` was set (a cgroup hit its limit;
/// `oom_cgroup_id` names it) — or, without this flag but with `FLAG_FROM_OOM_CONTROL`, it was
/// NULL (the node ran out).
pub const FLAG_MEMCG_OOM: u32 = 1 << 3;
/// The event comes from `oom_kill_process(oc)`: scope, OOMing cgroup and `totalpages` are the
/// kernel's own, not derived.
pub const FLAG_FROM_OOM_CONTROL: u32 = 1 << 4;
/// `victim_memcg` holds the names of the victim's memory cgroup and its parents.
pub const FLAG_HAS_MEMCG_PATH: u32 = 1 << 5;

/// Directories of the victim's memory cgroup path captured, innermost first: enough for
/// `kubepods[.slice]/<qos>/<pod>/<container>`, the deepest Kubernetes layout.
pub const MEMCG_PATH_LEVELS: usize = 4;
/// Bytes of each directory name, NUL included (a systemd container scope,
/// `cri-containerd-<64 hex>.scope`, is 85).
pub const MEMCG_NAME_LEN: usize = 128;

/// One OOM kill. The header describes the victim; `invoker_*` the task whose allocation ran the
/// OOM killer.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OomKillEvent {
    pub header: EventHeader,
    pub invoker_pid: u32,
    pub invoker_tgid: u32,
    pub invoker_cgroup_id: u64,
    pub invoker_comm: [u8; TASK_COMM_LEN],
    /// Pages.
    pub anon_rss: u64,
    pub file_rss: u64,
    pub shmem_rss: u64,
    pub total_vm: u64,
    pub oom_score_adj: i32,
    pub flags: u32,
    /// cgroup v2 id of the memory cgroup whose limit was hit (`oc->memcg`), 0 when unknown.
    pub oom_cgroup_id: u64,
    /// Pages the OOM killer weighed the victim against (`oc->totalpages`), 0 when unknown.
    pub totalpages: u64,
    /// Bytes `bpf_get_stack` wrote into `invoker_stack`, or a negative errno.
    pub stack_bytes: i64,
    pub invoker_stack: [u64; STACK_DEPTH],
    /// The names of the victim's memory cgroup directory and its parents, innermost first, as
    /// the kernel had them at the kill (`FLAG_HAS_MEMCG_PATH`): a container that dies at once
    /// takes its cgroup with it before any walk of the hierarchy could find it.
    pub victim_memcg: [[u8; MEMCG_NAME_LEN]; MEMCG_PATH_LEVELS],
}

const _: () = assert!(
    size_of::<OomKillEvent>()
        == 56 + 16 + 16 + 32 + 8 + 16 + 8 + 8 * STACK_DEPTH + MEMCG_NAME_LEN * MEMCG_PATH_LEVELS
);

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct OomConfig {
    pub valid: u32,
    pub task: TaskOffsets,
    pub task_mm: u32,
    pub task_signal: u32,
    pub signal_oom_score_adj: u32,
    /// `mm->rss_stat` counters (8-byte counts; the layout changed in 6.2, resolved per kernel).
    pub mm_rss_file: u32,
    pub mm_rss_anon: u32,
    pub mm_rss_shmem: u32,
    pub mm_total_vm: u32,
    /// `struct oom_control` members and `mem_cgroup.css.cgroup`, for the fentry hook.
    pub oc_chosen: u32,
    pub oc_memcg: u32,
    pub oc_totalpages: u32,
    pub memcg_css_cgroup: u32,
    /// `task->cgroups` (css_set) -> `subsys[memory_cgrp_id]` -> `cgroup` -> `kn`, then
    /// `kernfs_node.name` and `.parent` up the tree: the victim's memory cgroup path. 0 in
    /// `memcg_path` when the kernel has no memory controller.
    pub memcg_path: u32,
    pub css_set_memory_css: u32,
    pub css_cgroup: u32,
    pub kernfs_node_name: u32,
    pub kernfs_node_parent: u32,
}

/// A key of the in-kernel OOM kill counters (`OOM_KILL_COUNTS`): one `kstall_oom_kills_total`
/// series before attribution (the victim's cgroup is attributed to a pod when the agent reads
/// it). `flags` has `FLAG_FROM_OOM_CONTROL` and `FLAG_MEMCG_OOM` when the hook knows the scope,
/// and `FLAG_VICTIM_PID_ONLY` when it knows nothing of the victim (cgroup and comm are 0 then);
/// without the first, the scope is the one the key's events show.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct OomCountKey {
    pub cgroup_id: u64,
    pub comm: [u8; TASK_COMM_LEN],
    pub flags: u8,
    /// See `crate::counter`.
    pub generation: u8,
    pub _pad: [u8; 6],
}

const _: () = assert!(size_of::<OomCountKey>() == 32);

/// Entries of `OOM_KILL_COUNTS`: two intervals' keys (a key per victim cgroup and name). A kill
/// whose key finds the map full is counted in `OOM_KILL_OVERFLOW` and not sent.
pub const COUNT_KEYS: u32 = 4096;

#[cfg(feature = "user")]
mod user {
    // SAFETY: repr(C), integers only, no implicit padding.
    unsafe impl aya::Pod for super::OomCountKey {}
    unsafe impl aya::Pod for super::OomConfig {}
    unsafe impl aya::Pod for super::OomKillEvent {}
}
