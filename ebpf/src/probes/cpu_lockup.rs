//! Stuck CPUs, as the kernel's own detectors report them. Agent half:
//! `agent/src/probes/cpu_lockup/`; event: `common/src/cpu_lockup.rs`.
//!
//! Hooks (the same on 5.10 through 7.3, none of them a tracepoint: the kernel has none for a soft
//! lockup, and `rcu_stall_warning` (6.1+) names no CPU):
//! - `fentry/add_taint`: `void add_taint(unsigned flag, enum lockdep_ok)`. The soft-lockup
//!   watchdog (`watchdog_timer_fn`, an hrtimer on the stuck CPU) ends every report with
//!   `add_taint(TAINT_SOFTLOCKUP, ...)`, and nothing else taints with that flag. It runs in the
//!   timer interrupt, so `current` is the task that spins and the stack continues, past the
//!   interrupt's frames, into the spinning code.
//! - `fentry/print_cpu_stall_info`: `static void print_cpu_stall_info(int cpu)`, once per stalled
//!   CPU of an RCU stall report: from the scheduler tick of the stalled CPU itself (self-detected:
//!   `current` spins, as above), or from another CPU that noticed (then the stalled CPU's task is
//!   not at hand: only the CPU is reported).
//! - Where the kernel refuses fentry (no trampolines): `tp_btf/console`, `TP_PROTO(const char
//!   *text, size_t len)`, for the watchdog's first line, `BUG: soft lockup - CPU#`. From 6.1 the
//!   event fires when the line is stored, in the printing context (the watchdog's interrupt);
//!   before, when the console is flushed, in whichever context holds the console lock — there
//!   fentry is used. Root can forge the line through `/dev/kmsg`, as for any log-based detector.

use aya_ebpf::{
    EbpfContext,
    helpers::{bpf_get_smp_processor_id, bpf_get_stack, bpf_ktime_get_boot_ns},
    macros::{btf_tracepoint, fentry},
    programs::{BtfTracePointContext, FEntryContext},
};
use kstall_common::{
    EventHeader,
    cpu_lockup::{
        CpuLockupEvent, DETECTOR_RCU_STALL, DETECTOR_SOFT_LOCKUP, FLAG_REPORTED_BY_OTHER_CPU, STACK_DEPTH,
        TAINT_SOFTLOCKUP, VERSION,
    },
    kind,
};

use crate::{
    maps::{Filtered, reserve, submit},
    read::string,
    task::stamp_current,
};

/// How the soft-lockup watchdog's report begins (kernel/watchdog.c, the same since 4.x).
const SOFT_LOCKUP_LINE: &[u8; 23] = b"BUG: soft lockup - CPU#";

#[fentry(function = "add_taint")]
pub fn add_taint(ctx: FEntryContext) -> u32 {
    let flag: u64 = ctx.arg(0);
    if flag as u32 == TAINT_SOFTLOCKUP {
        report(&ctx, DETECTOR_SOFT_LOCKUP, unsafe { bpf_get_smp_processor_id() });
    }
    0
}

#[btf_tracepoint(function = "console")]
pub fn console(ctx: BtfTracePointContext) -> u32 {
    let text: *const u8 = ctx.arg(0);
    let mut line = [0u8; SOFT_LOCKUP_LINE.len() + 1];
    string(text, &mut line);
    if line.starts_with(SOFT_LOCKUP_LINE) {
        report(&ctx, DETECTOR_SOFT_LOCKUP, unsafe { bpf_get_smp_processor_id() });
    }
    0
}

#[fentry(function = "print_cpu_stall_info")]
pub fn print_cpu_stall_info(ctx: FEntryContext) -> u32 {
    let cpu: u64 = ctx.arg(0);
    report(&ctx, DETECTOR_RCU_STALL, cpu as u32);
    0
}

#[inline(always)]
fn report<C: EbpfContext>(ctx: &C, detector: u32, cpu: u32) {
    let Some(mut entry) = reserve::<CpuLockupEvent>(kind::CPU_LOCKUP) else { return };
    // SAFETY: the entry is zeroed, a valid event (plain integers).
    let ev = unsafe { entry.assume_init_mut() };
    let reporting_cpu = unsafe { bpf_get_smp_processor_id() };
    ev.detector = detector;
    ev.cpu = cpu;
    ev.reporting_cpu = reporting_cpu;
    if cpu == reporting_cpu {
        stamp_current(ctx, &mut ev.header, kind::CPU_LOCKUP, VERSION);
        ev.stack_bytes =
            unsafe { bpf_get_stack(ctx.as_ptr(), ev.stack.as_mut_ptr().cast(), (STACK_DEPTH * 8) as u32, 0) };
    } else {
        // The reporter is not what is stuck: the task fields stay zero.
        ev.header.kind = kind::CPU_LOCKUP;
        ev.header.version = VERSION;
        ev.header.timestamp_ns = unsafe { bpf_ktime_get_boot_ns() };
        ev.flags = FLAG_REPORTED_BY_OTHER_CPU;
    }
    submit(entry);
}

impl Filtered for CpuLockupEvent {
    fn header(&self) -> &EventHeader {
        &self.header
    }
}

// SAFETY: integers only; size a multiple of 8, alignment 8 (the header's u64).
unsafe impl crate::zero::Zeroable for CpuLockupEvent {}
