//! Maps shared by every probe: the event ring buffer and the per-CPU count of events lost to a
//! full ring buffer, indexed by event kind.

use aya_ebpf::{
    macros::map,
    maps::{PerCpuArray, RingBuf},
};
use kstall_common::kind;

/// Resized by the agent at load time (`--ring-buffer-bytes`).
#[map]
pub static EVENTS: RingBuf = RingBuf::with_byte_size(1 << 20, 0);

#[map]
pub static LOST: PerCpuArray<u64> = PerCpuArray::with_max_entries(kind::COUNT, 0);

/// Sends `event` to userspace, or counts it as lost for `kind` when the ring buffer is full.
#[inline(always)]
pub fn emit<T: 'static>(kind: u32, event: &T) {
    if EVENTS.output::<T>(event, 0).is_err()
        && let Some(lost) = LOST.get_ptr_mut(kind)
    {
        // Per-CPU slot: no other writer can race this increment.
        unsafe { *lost += 1 };
    }
}
