//! CPUs the kernel's own detectors found stuck: soft lockups (the watchdog) and RCU stalls. Kernel
//! half: `ebpf/src/probes/cpu_lockup.rs`; agent half: `agent/src/probes/cpu_lockup/`.

use crate::header::EventHeader;

pub const VERSION: u32 = 1;
/// Kernel stack frames kept per report. The report runs in the watchdog's (or RCU's) timer
/// interrupt on the stuck CPU: a dozen frames of interrupt handling come first, the interrupted
/// task's frames — what spins — after them.
pub const STACK_DEPTH: usize = 48;

/// `detector` values.
/// The soft-lockup watchdog: the CPU ran no other task (not even its stopper thread) for
/// 2 × `kernel.watchdog_thresh` seconds.
pub const DETECTOR_SOFT_LOCKUP: u32 = 1;
/// RCU's stall detector: the CPU passed no quiescent state for `rcu_cpu_stall_timeout` seconds.
pub const DETECTOR_RCU_STALL: u32 = 2;

/// `TAINT_SOFTLOCKUP` (include/linux/panic.h; 14 since 3.x): `add_taint` with it is the end of
/// a soft-lockup report, and nothing else taints with it.
pub const TAINT_SOFTLOCKUP: u32 = 14;

/// `flags` bits.
/// The report came from another CPU than the stuck one (RCU's detector names every stalled
/// CPU): the header's task and `stack` are the reporter's, not the stuck CPU's, and are left zero.
pub const FLAG_REPORTED_BY_OTHER_CPU: u32 = 1 << 0;

/// One report of a stuck CPU. On the stuck CPU the header describes the task it was running
/// (the one that spins) and `stack` is that CPU's kernel stack.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CpuLockupEvent {
    pub header: EventHeader,
    /// One of `DETECTOR_*`.
    pub detector: u32,
    /// The stuck CPU.
    pub cpu: u32,
    /// The CPU that ran the report.
    pub reporting_cpu: u32,
    pub flags: u32,
    /// Bytes `bpf_get_stack` wrote into `stack`, or a negative errno.
    pub stack_bytes: i64,
    pub stack: [u64; STACK_DEPTH],
}

const _: () = assert!(size_of::<CpuLockupEvent>() == 56 + 4 * 4 + 8 + 8 * STACK_DEPTH);

#[cfg(feature = "user")]
mod user {
    // SAFETY: repr(C), integers only, no implicit padding.
    unsafe impl aya::Pod for super::CpuLockupEvent {}
}
