//! Stuck tasks as the D-state sampler finds them: a task iterator run by the agent every few
//! seconds reports each task in an uninterruptible sleep (plain or killable) whose context-switch
//! count has not moved for the threshold, or that every sweep for the threshold found asleep and
//! that woke at most once a second (a retry loop). Kernel half: `ebpf/src/probes/stuck_task.rs`; agent half:
//! `agent/src/probes/stuck_task.rs`.

use crate::{header::EventHeader, task::TaskOffsets};

pub const VERSION: u32 = 2;
/// Kernel stack frames kept per report, as for the hung-task detector's reports.
pub const STACK_DEPTH: usize = crate::hung_task::STACK_DEPTH;

/// `task->__state` bits (include/linux/sched.h; the same values on every kernel kstall supports).
pub const TASK_UNINTERRUPTIBLE: u32 = 0x2;
/// Set with `TASK_UNINTERRUPTIBLE` in `TASK_KILLABLE` sleeps, which the hung-task detector skips.
pub const TASK_WAKEKILL: u32 = 0x100;
/// `TASK_IDLE` kernel threads (`TASK_UNINTERRUPTIBLE | TASK_NOLOAD`) wait for work, not for I/O.
pub const TASK_NOLOAD: u32 = 0x400;
/// Frozen by the freezer (6.1+), not stuck.
pub const TASK_FROZEN: u32 = 0x8000;
/// Before 6.1 a frozen task is `TASK_UNINTERRUPTIBLE` with `PF_FROZEN` in `task->flags`.
pub const PF_FROZEN: u32 = 0x10000;

/// `flags` bits, as in the hung-task event.
pub const FLAG_NO_NSPROXY: u32 = crate::hung_task::FLAG_NO_NSPROXY;
pub const FLAG_EXITING: u32 = crate::hung_task::FLAG_EXITING;

/// One stuck task, reported once per stuck spell (until a sweep finds it awake, or it wakes more
/// than once a second).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StuckTaskEvent {
    pub header: EventHeader,
    /// `CLOCK_BOOTTIME` of the first sweep of this spell that saw the task asleep.
    pub blocked_since_ns: u64,
    /// Raw `task->__state`.
    pub state: u32,
    pub flags: u32,
    /// `nvcsw + nivcsw` (what tells that it has not run, as khungtaskd uses it).
    pub switches: u64,
    /// Times it woke (and slept again) since `blocked_since_ns`: 0 when it has not run at all.
    pub wakeups: u64,
    /// Bytes `bpf_get_task_stack` wrote into `stack`, or a negative errno.
    pub stack_bytes: i64,
    pub stack: [u64; STACK_DEPTH],
}

const _: () = assert!(size_of::<StuckTaskEvent>() == 56 + 8 * 5 + 8 * STACK_DEPTH);

/// A task asleep uninterruptibly at the sweep, stuck yet or not: what each sweep writes to the
/// iterator's output for each such task, so the agent knows which stuck tasks still are.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AsleepTask {
    pub tgid: u32,
    pub tid: u32,
}

/// Filled by the agent before load: the offsets, the threshold and the per-sweep report limit.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StuckTaskConfig {
    pub valid: u32,
    /// `PF_FROZEN` where the kernel still marks frozen tasks that way, else 0.
    pub pf_frozen: u32,
    pub task: TaskOffsets,
    /// `task->__state` (`state` before 5.14; its low 32 bits on little-endian).
    pub task_state: u32,
    pub task_flags: u32,
    pub task_nvcsw: u32,
    pub task_nivcsw: u32,
    pub task_start_time: u32,
    /// Reports per sweep at most; the tasks beyond are counted (`SweepStats::over_limit`).
    pub max_reports: u32,
    /// Nanoseconds a task must stay asleep (see the module) before it is reported.
    pub threshold_ns: u64,
}

const _: () = assert!(size_of::<StuckTaskConfig>() == 80);

/// What the sweeps saw, counted since load by the kernel program (the agent takes differences).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SweepStats {
    /// Tasks walked.
    pub walked: u64,
    /// Of those, asleep uninterruptibly (idle kernel threads and frozen tasks not counted).
    pub uninterruptible: u64,
    pub reported: u64,
    /// Stuck tasks not reported because the sweep had reached `max_reports` (reported by a later
    /// sweep while they stay stuck).
    pub over_limit: u64,
    /// Reports of the sweep under way (zeroed by the agent before each sweep).
    pub this_sweep: u64,
    /// The number of the sweep under way (set by the agent before each sweep): a task asleep at
    /// consecutive sweeps was asleep whenever looked at.
    pub sweep: u64,
}

#[cfg(feature = "user")]
mod user {
    // SAFETY: repr(C), integers only, no implicit padding.
    unsafe impl aya::Pod for super::StuckTaskConfig {}
    unsafe impl aya::Pod for super::StuckTaskEvent {}
    unsafe impl aya::Pod for super::SweepStats {}
    unsafe impl aya::Pod for super::AsleepTask {}
}
