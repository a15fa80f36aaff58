//! Hung tasks, as the kernel's hung-task detector reports them. Kernel half:
//! `ebpf/src/probes/hung_task.rs`; agent half: `agent/src/probes/hung_task.rs`.

use crate::{header::EventHeader, task::TaskOffsets};

pub const VERSION: u32 = 1;
/// Kernel stack frames kept per report (the top of the stack is what classifies the wait).
pub const STACK_DEPTH: usize = 32;

/// `flags` bits.
/// The kernel tracks what the task blocks on (`task->blocker`, CONFIG_DETECT_HUNG_TASK_BLOCKER).
pub const FLAG_BLOCKER_TRACKED: u32 = 1 << 0;
/// The task had no network namespace left (exiting): `netns_ino` is 0 for that reason.
pub const FLAG_NO_NSPROXY: u32 = 1 << 1;
/// The task is exiting (`PF_EXITING`): do_exit sets it before it closes the task's files, so a
/// flush stuck in that close — incident 1's — has it while the namespaces are still there.
pub const FLAG_EXITING: u32 = 1 << 2;

/// `PF_EXITING` in `task->flags` (include/linux/sched.h; the same value since Linux 2.6).
pub const PF_EXITING: u32 = 0x4;

/// `task->blocker` low bits (include/linux/hung_task.h).
pub const BLOCKER_TYPE_MUTEX: u64 = 0;
pub const BLOCKER_TYPE_SEM: u64 = 1;
pub const BLOCKER_TYPE_RWSEM_READER: u64 = 2;
pub const BLOCKER_TYPE_RWSEM_WRITER: u64 = 3;
pub const BLOCKER_TYPE_MASK: u64 = 3;

/// One report of a hung task. The header describes the hung task itself (not khungtaskd, which
/// runs the detector).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HungTaskEvent {
    pub header: EventHeader,
    /// `jiffies` when the detector last saw the task switch (i.e. roughly since when it has been
    /// blocked), and `jiffies` now; the agent turns the difference into seconds.
    pub last_switch_jiffies: u64,
    pub now_jiffies: u64,
    /// Raw `task->blocker`: lock address | type, 0 when none or untracked.
    pub blocker: u64,
    /// pid of the lock's owner, when the kernel records one; 0 otherwise.
    pub blocker_owner_pid: u32,
    pub flags: u32,
    /// Bytes `bpf_get_task_stack` wrote into `stack`, or a negative errno.
    pub stack_bytes: i64,
    pub stack: [u64; STACK_DEPTH],
}

const _: () = assert!(size_of::<HungTaskEvent>() == 56 + 8 * 4 + 8 + 8 * STACK_DEPTH);

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HungTaskConfig {
    pub valid: u32,
    /// 1 when `task->blocker` exists on this kernel (offsets below valid).
    pub blocker: u32,
    pub task: TaskOffsets,
    pub task_last_switch_time: u32,
    pub task_flags: u32,
    pub task_blocker: u32,
    pub mutex_owner: u32,
    pub rwsem_owner: u32,
}

#[cfg(feature = "user")]
mod user {
    // SAFETY: repr(C), integers only, no implicit padding.
    unsafe impl aya::Pod for super::HungTaskConfig {}
    unsafe impl aya::Pod for super::HungTaskEvent {}
}
