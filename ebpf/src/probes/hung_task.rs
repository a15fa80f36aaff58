//! Hung tasks. Agent half: `agent/src/probes/hung_task.rs`; event: `common/src/hung_task.rs`.
//!
//! Hook (match-proto): `tp_btf/sched_process_hang`: `TP_PROTO(struct task_struct *tsk)`, emitted by
//! khungtaskd's `check_hung_task()` for a TASK_UNINTERRUPTIBLE task not scheduled for
//! `hung_task_timeout_secs`, again on every check while it stays so. `current` is khungtaskd:
//! everything is read from `tsk`. The argument is a trusted BTF pointer, which
//! `bpf_get_task_stack` requires (>= 5.9).

use aya_ebpf::{
    helpers::{bpf_get_task_stack, bpf_jiffies64, bpf_ktime_get_boot_ns},
    macros::btf_tracepoint,
    programs::BtfTracePointContext,
};
use kstall_common::{
    EventHeader,
    hung_task::{
        BLOCKER_TYPE_MASK, BLOCKER_TYPE_MUTEX, BLOCKER_TYPE_RWSEM_READER, BLOCKER_TYPE_RWSEM_WRITER,
        FLAG_BLOCKER_TRACKED, FLAG_EXITING, FLAG_NO_NSPROXY, HungTaskConfig, HungTaskEvent, PF_EXITING,
        STACK_DEPTH, VERSION,
    },
    kind,
};

use crate::{
    maps::{Filtered, reserve, submit},
    read::at,
    task::task_header,
};

/// Filled by the agent from the running kernel's BTF before load.
#[unsafe(no_mangle)]
// SAFETY: plain integers; all zero means "not configured" (`valid == 0`).
static HUNG_TASK_CONFIG: HungTaskConfig = unsafe { core::mem::zeroed() };

/// Low bits of a mutex's or rwsem's `owner` word that are flags, not pointer.
const OWNER_FLAGS_MASK: u64 = 0x7;

#[btf_tracepoint(function = "sched_process_hang")]
pub fn sched_process_hang(ctx: BtfTracePointContext) -> u32 {
    let cfg = unsafe { core::ptr::read_volatile(&HUNG_TASK_CONFIG) };
    if cfg.valid == 0 {
        return 0;
    }
    let task: *const u8 = ctx.arg(0);
    let stamp = (kind::HUNG_TASK, VERSION, unsafe { bpf_ktime_get_boot_ns() });
    let Ok((header, flags)) = task_header(&cfg.task, task, stamp, FLAG_NO_NSPROXY) else { return 0 };
    let Some(mut entry) = reserve::<HungTaskEvent>(kind::HUNG_TASK) else {
        return 0;
    };
    // SAFETY: the entry is zeroed, a valid event (plain integers); the task pointer is the
    // tracepoint's own.
    unsafe {
        let ev = entry.assume_init_mut();
        ev.header = header;
        ev.flags = flags;
        if at::<u32>(task, cfg.task_flags).unwrap_or(0) & PF_EXITING != 0 {
            ev.flags |= FLAG_EXITING;
        }
        ev.last_switch_jiffies = at(task, cfg.task_last_switch_time).unwrap_or(0);
        ev.now_jiffies = bpf_jiffies64();
        if cfg.blocker != 0 {
            ev.flags |= FLAG_BLOCKER_TRACKED;
            let blocker: u64 = at(task, cfg.task_blocker).unwrap_or(0);
            ev.blocker = blocker;
            ev.blocker_owner_pid = blocker_owner_pid(&cfg, blocker);
        }
        ev.stack_bytes =
            bpf_get_task_stack(task as *mut _, ev.stack.as_mut_ptr().cast(), (STACK_DEPTH * 8) as u32, 0);
    }
    submit(entry);
    0
}

/// pid of the task owning the lock `blocker` points at: mutexes and rwsem writers record their
/// owner (`owner` word = task pointer | flags); semaphores and rwsem readers do not reliably.
#[inline(always)]
fn blocker_owner_pid(cfg: &HungTaskConfig, blocker: u64) -> u32 {
    let lock = (blocker & !BLOCKER_TYPE_MASK) as *const u8;
    let owner_offset = match blocker & BLOCKER_TYPE_MASK {
        BLOCKER_TYPE_MUTEX => cfg.mutex_owner,
        BLOCKER_TYPE_RWSEM_WRITER | BLOCKER_TYPE_RWSEM_READER => cfg.rwsem_owner,
        _ => return 0,
    };
    let Ok(owner) = at::<u64>(lock, owner_offset) else { return 0 };
    let owner = (owner & !OWNER_FLAGS_MASK) as *const u8;
    at(owner, cfg.task.pid).unwrap_or(0)
}

impl Filtered for HungTaskEvent {
    fn header(&self) -> &EventHeader {
        &self.header
    }
}
