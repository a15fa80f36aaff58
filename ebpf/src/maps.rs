//! Maps shared by every probe: the event ring buffer and when it wakes the agent, the per-CPU
//! count of events lost to a full ring buffer, indexed by event kind, and the generation and
//! sample budget of the in-kernel counters (`kstall_common::counter`).

use crate::zero::{Zeroable, zero};
use aya_ebpf::{
    bindings::{BPF_RB_AVAIL_DATA, BPF_RB_FORCE_WAKEUP, BPF_RB_NO_WAKEUP},
    macros::map,
    maps::{Array, PerCpuArray, PerCpuHashMap, RingBuf, ring_buf::RingBufEntry},
};
use kstall_common::{
    EventHeader,
    capture::CaptureFilter,
    counter::{Counter, DEFAULT_SAMPLE_EVENTS, KeptPorts},
    kind,
};

/// Resized by the agent at load time (`--ring-buffer-bytes`).
#[map]
pub static EVENTS: RingBuf = RingBuf::with_byte_size(1 << 20, 0);

#[map]
pub static LOST: PerCpuArray<u64> = PerCpuArray::with_max_entries(kind::COUNT, 0);

/// Queued bytes at which a producer wakes the agent, written by the agent at run time
/// (`pipeline::Wakeup`): 0 while the node is quiet, so that every event wakes it (nothing else
/// reads the ring then), a quarter of the ring while events flow. Below it events are not
/// signalled one by one: a wakeup is an IPI (several microseconds on a virtualised node, measured
/// here), and the agent drains on a short timer while events flow.
#[map]
pub static WAKEUP: Array<u64> = Array::with_max_entries(1, 0);

/// The counters' generation (0 or 1), flipped by the agent once per interval.
#[map]
pub static GENERATION: Array<u32> = Array::with_max_entries(1, 0);

/// Counter keys inserted, per CPU (slot 0): the agent walks a counter map only when it held keys
/// at its last walk or this moved since. An idle node's maps are empty, and a walk of an empty map
/// still visits every bucket (the idle agent's largest cost, profiled); a key is inserted once per
/// interval, so the count costs nothing on the path every event takes.
#[map]
pub static COUNTER_INSERTS: PerCpuArray<u64> = PerCpuArray::with_max_entries(1, 0);

/// Events of one counter key sent in full per CPU per interval (`--sample-events`); `u32::MAX`:
/// every event, nothing counted (a standalone capture, which exports no counters).
#[unsafe(no_mangle)]
static SAMPLE_EVENTS: u32 = DEFAULT_SAMPLE_EVENTS;

/// The ports the counters keep by number, written by the agent before load (the metrics' port
/// policy).
#[unsafe(no_mangle)]
static KEPT_PORTS: KeptPorts = KeptPorts::NONE;

/// How a counter key holds a port.
pub enum PortClass {
    /// By number.
    Kept,
    /// In the node's ephemeral range: a client's random port.
    Ephemeral,
    Other,
}

/// The class of `port` (see `KeptPorts`), so that a port scan makes two keys, not one a port.
#[inline(always)]
pub fn port_class(port: u16, ephemeral_low: u16, ephemeral_high: u16) -> PortClass {
    // Through a volatile copy of its address: the compiler must not fold the initializer.
    let kept = &raw const KEPT_PORTS;
    let kept = unsafe { &*core::ptr::read_volatile(&kept) };
    if kept.contains(port) {
        PortClass::Kept
    } else if port >= ephemeral_low && port <= ephemeral_high {
        PortClass::Ephemeral
    } else {
        PortClass::Other
    }
}

/// Set by an agent run for one capture (`kstall trace --standalone`); empty otherwise.
#[unsafe(no_mangle)]
static CAPTURE: CaptureFilter = CaptureFilter { pid: 0, port: 0, _pad: 0 };

/// What the capture filter looks at in an event.
pub trait Filtered {
    fn header(&self) -> &EventHeader;
    /// The ports the event carries (0: none).
    fn ports(&self) -> [u16; 3] {
        [0; 3]
    }
}

/// Whether the capture filter keeps `event` (always, for the node agent).
#[inline(always)]
fn wanted<T: Filtered>(event: &T) -> bool {
    let filter = unsafe { core::ptr::read_volatile(&CAPTURE) };
    if filter.pid != 0 {
        let header = event.header();
        if header.tgid != filter.pid && header.pid != filter.pid {
            return false;
        }
    }
    if filter.port != 0 {
        let ports = event.ports();
        if ports[0] != filter.port && ports[1] != filter.port && ports[2] != filter.port {
            return false;
        }
    }
    true
}

/// Sends `event` to userspace, or counts it as lost for `kind` when the ring buffer is full.
#[inline(always)]
pub fn emit<T: Filtered + 'static>(kind: u32, event: &T) {
    if !wanted(event) {
        return;
    }
    if EVENTS.output::<T>(event, wakeup_flags()).is_err() {
        count_lost(kind);
    }
}

/// Room for an event too large for the BPF stack, zeroed (padding and the fields a kernel cannot
/// fill stay defined) to be written in place; `None` (counted as lost for `kind`) when the ring
/// buffer is full. Finish with [`submit`].
#[inline(always)]
pub fn reserve<T: Zeroable + 'static>(kind: u32) -> Option<RingBufEntry<T>> {
    let Some(mut entry) = EVENTS.reserve::<T>(0) else {
        count_lost(kind);
        return None;
    };
    // SAFETY: the entry is reserved ring buffer memory of `T`'s size, 8-byte aligned.
    unsafe { zero(entry.as_mut_ptr()) };
    Some(entry)
}

/// Submits a written entry (or discards it when the capture filter does not keep it).
#[inline(always)]
pub fn submit<T: Filtered>(entry: RingBufEntry<T>) {
    // SAFETY: the caller wrote the whole event before submitting it.
    if wanted(unsafe { entry.assume_init_ref() }) {
        entry.submit(wakeup_flags());
    } else {
        entry.discard(0);
    }
}

/// Read at each submit, so that the agent's switch to 0 reaches the next event.
#[inline(always)]
fn wakeup_flags() -> u64 {
    // No entry cannot happen (index 0 of a one-entry array); waking is the safe answer.
    let threshold = WAKEUP.get(0).copied().unwrap_or(0);
    let flags = if threshold == 0 || EVENTS.query(BPF_RB_AVAIL_DATA as u64) >= threshold {
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

/// The generation a counter key is counted in now.
#[inline(always)]
pub fn generation() -> u8 {
    GENERATION.get(0).map(|g| (*g & 1) as u8).unwrap_or(0)
}

/// Counts one event of `key` (its `generation` set by the caller) and says whether it is to be
/// sent in full: the first `SAMPLE_EVENTS` of the key on this CPU in this interval are. A key
/// that finds the map full is counted in `overflow[slot]` and not sent.
#[inline(always)]
pub fn count<K>(counts: &PerCpuHashMap<K, Counter>, overflow: &PerCpuArray<u64>, slot: u32, key: &K) -> bool {
    let budget = unsafe { core::ptr::read_volatile(&SAMPLE_EVENTS) };
    if budget == u32::MAX {
        return true;
    }
    let budget = u64::from(budget);
    // Twice: another CPU may insert the key between this CPU's lookup and insert.
    for _ in 0..2 {
        if let Some(counter) = counts.get_ptr_mut(key) {
            // This CPU's slot: no other writer races the increments.
            let counter = unsafe { &mut *counter };
            counter.events += 1;
            if counter.emitted < budget {
                counter.emitted += 1;
                return true;
            }
            return false;
        }
        let first = Counter { events: 1, emitted: u64::from(budget > 0) };
        match counts.insert(key, first, BPF_NOEXIST) {
            Ok(()) => {
                note_insert();
                return budget > 0;
            }
            Err(e) if e == -EEXIST => continue,
            Err(_) => break,
        }
    }
    if let Some(n) = overflow.get_ptr_mut(slot) {
        unsafe { *n += 1 };
    }
    false
}

/// Counts a key inserted into a counter map (see [`COUNTER_INSERTS`]): after the insert.
#[inline(always)]
pub fn note_insert() {
    if let Some(n) = COUNTER_INSERTS.get_ptr_mut(0) {
        // Per-CPU slot: no other writer races the increment.
        unsafe { *n += 1 };
    }
}

pub const BPF_NOEXIST: u64 = 1;
pub const EEXIST: i32 = 17;
