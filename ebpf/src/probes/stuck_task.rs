//! The D-state sampler. Agent half: `agent/src/probes/stuck_task.rs`; event:
//! `common/src/stuck_task.rs`.
//!
//! Hook: `iter/task`, never attached to an event: the agent reads the iterator every few seconds,
//! and each read walks every task once. A task asleep uninterruptibly (plain `D` or killable, not
//! an idle kernel thread or a frozen task) is remembered with its context-switch count. It is
//! stuck, and reported once for that spell, when `threshold_ns` later either the count is still
//! the same (it has not run: what khungtaskd checks) or every sweep since found it asleep and it
//! woke at most once a second on average: a retry loop, such as an NFS client's state manager
//! checking its lease again every few seconds, which khungtaskd never reports. Only reported tasks
//! leave the kernel, so a sweep costs a walk plus the stuck tasks.
//! The task pointer comes from the iterator's context: a trusted BTF pointer, as
//! `bpf_get_task_stack` requires.

use aya_ebpf::{
    bindings::seq_file,
    helpers::{bpf_get_task_stack, bpf_ktime_get_boot_ns, bpf_seq_write},
    macros::map,
    maps::{Array, LruHashMap},
};
use kstall_common::{
    EventHeader, kind,
    stuck_task::{
        AsleepTask, FLAG_EXITING, FLAG_NO_NSPROXY, STACK_DEPTH, StuckTaskConfig, StuckTaskEvent, SweepStats,
        TASK_FROZEN, TASK_NOLOAD, TASK_UNINTERRUPTIBLE, VERSION,
    },
};

use crate::{
    maps::{Filtered, reserve, submit},
    read::at,
    task::task_header,
};

/// Filled by the agent from the running kernel's BTF before load.
#[unsafe(no_mangle)]
// SAFETY: plain integers; all zero means "not configured" (`valid == 0`).
static STUCK_TASK_CONFIG: StuckTaskConfig = unsafe { core::mem::zeroed() };

/// `PF_EXITING` in `task->flags`.
const PF_EXITING: u32 = kstall_common::hung_task::PF_EXITING;

/// A task seen asleep: since when, with which switch count then, at which sweep last, and
/// whether this spell was reported. `start_time` tells a reused tid from the task it was.
#[repr(C)]
#[derive(Clone, Copy)]
struct Seen {
    start_time: u64,
    switches: u64,
    since_ns: u64,
    last_sweep: u64,
    reported: u64,
}

const SEC: u64 = 1_000_000_000;

/// Tasks seen asleep, by tid. Least recently seen go first when full: a task that ran again is not
/// looked up any more and ages out.
#[map]
static STUCK_SEEN: LruHashMap<u32, Seen> = LruHashMap::with_max_entries(16384, 0);

/// Read by the agent after each sweep.
#[map]
static SWEEP: Array<SweepStats> = Array::with_max_entries(1, 0);

/// `struct bpf_iter__task`: what the iterator passes for each task (`task` is NULL on the final
/// call after the last task).
#[repr(C)]
pub struct TaskIterContext {
    meta: *const IterMeta,
    task: *const u8,
}

/// `struct bpf_iter_meta`, whose first field is the iterator's output.
#[repr(C)]
pub struct IterMeta {
    seq: *mut seq_file,
}

/// Written without a macro: aya-ebpf has none for iterators.
#[unsafe(no_mangle)]
#[unsafe(link_section = "iter/task")]
pub fn stuck_task_sweep(ctx: *const TaskIterContext) -> i32 {
    let cfg = unsafe { core::ptr::read_volatile(&STUCK_TASK_CONFIG) };
    let Some(stats) = SWEEP.get_ptr_mut(0) else { return 0 };
    // SAFETY: the context is the iterator's; the load through it is checked by the verifier.
    let task = unsafe { core::ptr::read_volatile(&(*ctx).task) };
    // SAFETY: a map value pointer, valid for this program run; sweeps run one at a time.
    let stats = unsafe { &mut *stats };
    if cfg.valid == 0 || task.is_null() {
        return 0;
    }
    // Most tasks end here, after one read.
    let state = at::<u32>(task, cfg.task_state).unwrap_or(0);
    if state & TASK_UNINTERRUPTIBLE == 0 || state & (TASK_NOLOAD | TASK_FROZEN) != 0 {
        stats.walked += 1;
        return 0;
    }
    let task_flags = at::<u32>(task, cfg.task_flags).unwrap_or(0);
    if task_flags & cfg.pf_frozen != 0 {
        stats.walked += 1;
        return 0;
    }
    let (Ok(tid), Ok(tgid), Ok(nvcsw), Ok(nivcsw), Ok(start_time)) = (
        at::<u32>(task, cfg.task.pid),
        at::<u32>(task, cfg.task.tgid),
        at::<u64>(task, cfg.task_nvcsw),
        at::<u64>(task, cfg.task_nivcsw),
        at::<u64>(task, cfg.task_start_time),
    ) else {
        stats.walked += 1;
        return 0;
    };
    // Every task asleep goes to the iterator's output: the agent learns from it which stuck tasks
    // still are. A full output buffer fails the write, and the kernel runs the program for this
    // task again in the agent's next read: so nothing is counted or changed before it.
    let listed = AsleepTask { tgid, tid };
    // SAFETY: `meta` and its `seq` come from the iterator's context (BTF-typed, checked by the
    // verifier); `listed` is on the stack for the size given.
    let written = unsafe {
        let seq = core::ptr::read_volatile(&(*core::ptr::read_volatile(&(*ctx).meta)).seq);
        bpf_seq_write(seq, (&raw const listed).cast(), size_of::<AsleepTask>() as u32)
    };
    if written != 0 {
        return 0;
    }
    stats.walked += 1;
    stats.uninterruptible += 1;
    let switches = nvcsw.wrapping_add(nivcsw);
    let now = unsafe { bpf_ktime_get_boot_ns() };
    let sweep = stats.sweep;
    // Still the same spell: it has not run, or it woke now and then but every sweep found it
    // asleep, no more than once a second on average.
    let same_spell = |seen: &Seen| {
        let woke = switches.wrapping_sub(seen.switches);
        seen.start_time == start_time
            && (woke == 0
                || (seen.last_sweep.wrapping_add(1) == sweep
                    && woke <= now.wrapping_sub(seen.since_ns) / SEC))
    };
    let seen = match STUCK_SEEN.get_ptr_mut(tid) {
        // SAFETY: a map value pointer, valid for this program run.
        Some(seen) if same_spell(unsafe { &*seen }) => unsafe { &mut *seen },
        _ => {
            let first = Seen { start_time, switches, since_ns: now, last_sweep: sweep, reported: 0 };
            let _ = STUCK_SEEN.insert(tid, first, 0);
            return 0;
        }
    };
    seen.last_sweep = sweep;
    if seen.reported != 0 || now.wrapping_sub(seen.since_ns) < cfg.threshold_ns {
        return 0;
    }
    if stats.this_sweep >= u64::from(cfg.max_reports) {
        stats.over_limit += 1;
        return 0;
    }
    let Ok((header, flags)) = task_header(&cfg.task, task, (kind::STUCK_TASK, VERSION, now), FLAG_NO_NSPROXY)
    else {
        return 0;
    };
    // Not marked reported when the ring buffer is full: the next sweep tries again.
    let Some(mut entry) = reserve::<StuckTaskEvent>(kind::STUCK_TASK) else { return 0 };
    // SAFETY: the entry is zeroed, a valid event (plain integers); the task pointer is the
    // iterator's own.
    unsafe {
        let ev = entry.assume_init_mut();
        ev.header = header;
        ev.flags = flags;
        if task_flags & PF_EXITING != 0 {
            ev.flags |= FLAG_EXITING;
        }
        ev.blocked_since_ns = seen.since_ns;
        ev.state = state;
        ev.switches = switches;
        ev.wakeups = switches.wrapping_sub(seen.switches);
        ev.stack_bytes =
            bpf_get_task_stack(task as *mut _, ev.stack.as_mut_ptr().cast(), (STACK_DEPTH * 8) as u32, 0);
    }
    submit(entry);
    seen.reported = 1;
    stats.reported += 1;
    stats.this_sweep += 1;
    0
}

impl Filtered for StuckTaskEvent {
    fn header(&self) -> &EventHeader {
        &self.header
    }
}
