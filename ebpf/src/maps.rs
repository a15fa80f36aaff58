//! Maps shared by every probe: the event ring buffer and the per-CPU count of events lost to a
//! full ring buffer, indexed by event kind.

use aya_ebpf::{
    bindings::{BPF_RB_AVAIL_DATA, BPF_RB_FORCE_WAKEUP, BPF_RB_NO_WAKEUP},
    macros::map,
    maps::{PerCpuArray, RingBuf, ring_buf::RingBufEntry},
};
use kstall_common::kind;

/// Resized by the agent at load time (`--ring-buffer-bytes`).
#[map]
pub static EVENTS: RingBuf = RingBuf::with_byte_size(1 << 20, 0);

#[map]
pub static LOST: PerCpuArray<u64> = PerCpuArray::with_max_entries(kind::COUNT, 0);

/// Queued bytes at which a producer wakes the agent; set by the agent (a quarter of the ring).
/// Below it events are not signalled one by one: a wakeup is an IPI (several microseconds on a
/// virtualised node, measured here), and the agent also drains on a short timer.
#[unsafe(no_mangle)]
static WAKEUP_BYTES: u64 = 0;

/// Sends `event` to userspace, or counts it as lost for `kind` when the ring buffer is full.
#[inline(always)]
pub fn emit<T: 'static>(kind: u32, event: &T) {
    if EVENTS.output::<T>(event, wakeup_flags()).is_err() {
        count_lost(kind);
    }
}

/// Room for an event too large for the BPF stack, written in place; `None` (counted as lost for
/// `kind`) when the ring buffer is full. Finish with [`submit`].
#[inline(always)]
pub fn reserve<T: 'static>(kind: u32) -> Option<RingBufEntry<T>> {
    let entry = EVENTS.reserve::<T>(0);
    if entry.is_none() {
        count_lost(kind);
    }
    entry
}

#[inline(always)]
pub fn submit<T>(entry: RingBufEntry<T>) {
    entry.submit(wakeup_flags());
}

#[inline(always)]
fn wakeup_flags() -> u64 {
    let threshold = unsafe { core::ptr::read_volatile(&WAKEUP_BYTES) };
    let flags = if EVENTS.query(BPF_RB_AVAIL_DATA as u64) >= threshold {
        BPF_RB_FORCE_WAKEUP
    } else {
        BPF_RB_NO_WAKEUP
    };
    flags as u64
}

#[inline(always)]
fn count_lost(kind: u32) {
    if let Some(lost) = LOST.get_ptr_mut(kind) {
        // Per-CPU slot: no other writer can race this increment.
        unsafe { *lost += 1 };
    }
}
