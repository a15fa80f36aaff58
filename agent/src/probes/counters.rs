//! The kernel's counters (`kstall_common::counter`), read back: once per interval the generation
//! is flipped and the keys of the generation idle since the last flip are read and deleted. What
//! comes back is exact; the metrics are built from it, not from the events, so they stay exact
//! whatever the ring buffer loses or the sampling leaves out.

use aya::{
    Pod,
    maps::{Array, MapData, PerCpuArray, PerCpuHashMap},
};
use kstall_common::{counter::Counter, nfs::NfsCountKey, oom::OomCountKey, tcp_reset::ResetCountKey};

use super::probe::EnumNames;
use super::{
    nfs::{self, NfsCount},
    oom::{self, CountedKills},
    tcp_reset::{self, Direction, ResetCount},
};
use crate::decode::DecodeError;

/// How often the generation flips: counts reach the metrics within two of these.
pub const INTERVAL: std::time::Duration = std::time::Duration::from_secs(1);

/// The maps of the kernel's counters, taken from the loaded object.
pub struct Counters {
    generation: Array<MapData, u32>,
    /// The generation the programs count in now.
    current: u32,
    tcp_reset: Option<(CounterMap<ResetCountKey>, EnumNames)>,
    oom: Option<CounterMap<OomCountKey>>,
    /// Always there: the NFS programs load with the agent, to be attached when sunrpc appears.
    nfs: CounterMap<NfsCountKey>,
}

/// One interval's counts.
#[derive(Debug, Default)]
pub struct Drained {
    /// By network namespace (attributed by the pipeline).
    pub resets: Vec<(u32, ResetCount)>,
    /// By the victim's cgroup (attributed, and their scope settled, by the pipeline).
    pub oom_kills: Vec<CountedKills>,
    /// By network namespace (attributed by the pipeline).
    pub nfs: Vec<(u32, NfsCount)>,
    /// NFS events counted without a key (the map was full): without their kind, only counted as
    /// suppressed.
    pub nfs_overflow: u64,
    /// Keys that could not be read back (a garbage key is counted, never a panic).
    pub errors: Vec<DecodeError>,
    /// A map operation that failed: what it left in the map is read the next time.
    pub failure: Option<String>,
}

/// Which probes' counters the loaded object has.
pub struct Wanted {
    pub tcp_reset: Option<EnumNames>,
    pub oom: bool,
}

impl Counters {
    pub fn take(ebpf: &mut aya::Ebpf, wanted: Wanted) -> Result<Self, String> {
        let generation = ebpf.take_map("GENERATION").ok_or("map GENERATION missing from the eBPF object")?;
        let generation = Array::try_from(generation).map_err(|e| e.to_string())?;
        let tcp_reset = match wanted.tcp_reset {
            Some(names) => {
                Some((CounterMap::take(ebpf, "TCP_RESET_COUNTS", "TCP_RESET_OVERFLOW", 2)?, names))
            }
            None => None,
        };
        let oom = match wanted.oom {
            true => Some(CounterMap::take(ebpf, "OOM_KILL_COUNTS", "OOM_KILL_OVERFLOW", 1)?),
            false => None,
        };
        let nfs = CounterMap::take(ebpf, "NFS_COUNTS", "NFS_OVERFLOW", 1)?;
        Ok(Self { generation, current: 0, tcp_reset, oom, nfs })
    }

    /// Reads and deletes the keys of the generation idle for an interval, then flips: call once
    /// per [`INTERVAL`]. Blocking (a few syscalls per key).
    pub fn drain(&mut self) -> Drained {
        let idle = (self.current + 1) % kstall_common::counter::GENERATIONS;
        let mut drained = Drained::default();
        if let Some((resets, names)) = &mut self.tcp_reset {
            let mut counted = Vec::new();
            let result = resets.drain(idle as u8, &mut counted);
            for (key, counter) in counted {
                match tcp_reset::decode_count(&key, &counter, names) {
                    Ok(count) => drained.resets.push((key.netns_ino, count)),
                    Err(e) => drained.errors.push(e),
                }
            }
            match result {
                Ok(overflow) => {
                    for (new, direction) in overflow.into_iter().zip([Direction::Sent, Direction::Received]) {
                        if new > 0 {
                            drained.resets.push((0, tcp_reset::overflow_count(direction, new)));
                        }
                    }
                }
                Err(e) => drained.failure = Some(e),
            }
        }
        if let Some(kills) = &mut self.oom {
            let mut counted = Vec::new();
            let result = kills.drain(idle as u8, &mut counted);
            drained.oom_kills.extend(counted.iter().map(|(key, counter)| oom::decode_count(key, counter)));
            match result {
                Ok(overflow) => {
                    drained.oom_kills.extend(overflow.into_iter().filter(|&n| n > 0).map(oom::overflow_count))
                }
                Err(e) => drained.failure = Some(e),
            }
        }
        let mut counted = Vec::new();
        let result = self.nfs.drain(idle as u8, &mut counted);
        for (key, counter) in counted {
            match nfs::decode_count(&key, &counter) {
                Ok(count) => drained.nfs.push((key.netns_ino, count)),
                Err(e) => drained.errors.push(e),
            }
        }
        match result {
            Ok(overflow) => drained.nfs_overflow = overflow.iter().fold(0, |sum, n| sum.saturating_add(*n)),
            Err(e) => drained.failure = Some(e),
        }
        match self.generation.set(0, idle, 0) {
            Ok(()) => self.current = idle,
            Err(e) => drained.failure = Some(format!("flipping the counters' generation: {e}")),
        }
        drained
    }

    /// Both generations, at shutdown once the programs are detached: nothing counted is left.
    pub fn drain_all(&mut self) -> Drained {
        let mut drained = self.drain();
        let rest = self.drain();
        drained.resets.extend(rest.resets);
        drained.oom_kills.extend(rest.oom_kills);
        drained.nfs.extend(rest.nfs);
        drained.nfs_overflow += rest.nfs_overflow;
        drained.errors.extend(rest.errors);
        drained.failure = drained.failure.or(rest.failure);
        drained
    }
}

/// A counter key: it carries the generation it was counted in.
trait CountKey: Pod {
    fn generation(&self) -> u8;
}

impl CountKey for ResetCountKey {
    fn generation(&self) -> u8 {
        self.generation
    }
}

impl CountKey for NfsCountKey {
    fn generation(&self) -> u8 {
        self.generation
    }
}

impl CountKey for OomCountKey {
    fn generation(&self) -> u8 {
        self.generation
    }
}

/// One probe's per-CPU counter map and its overflow counters (cumulative, one per slot).
struct CounterMap<K: CountKey> {
    name: &'static str,
    counts: PerCpuHashMap<MapData, K, Counter>,
    overflow: PerCpuArray<MapData, u64>,
    /// What of `overflow` was already read, by slot.
    overflow_read: Vec<u64>,
}

impl<K: CountKey> CounterMap<K> {
    fn take(ebpf: &mut aya::Ebpf, name: &'static str, overflow: &str, slots: usize) -> Result<Self, String> {
        let mut map = |name: &str| {
            ebpf.take_map(name).ok_or_else(|| format!("map {name} missing from the eBPF object"))
        };
        Ok(Self {
            name,
            counts: PerCpuHashMap::try_from(map(name)?).map_err(|e| e.to_string())?,
            overflow: PerCpuArray::try_from(map(overflow)?).map_err(|e| e.to_string())?,
            overflow_read: vec![0; slots],
        })
    }

    /// Moves the keys of `generation` into `counted`, summed over the CPUs, and returns what
    /// each overflow slot gained since the last drain. A failure stops the drain and leaves the
    /// rest for the next one.
    fn drain(&mut self, generation: u8, counted: &mut Vec<(K, Counter)>) -> Result<Vec<u64>, String> {
        let keys: Vec<K> =
            self.counts.keys().filter_map(Result::ok).filter(|key| key.generation() == generation).collect();
        for key in keys {
            // A key read is deleted before it is counted, so that a failed delete cannot count
            // it twice.
            let values = self.counts.get(&key, 0).map_err(|e| format!("reading {}: {e}", self.name))?;
            // Saturating: the values are the kernel's, and a corrupt one must not wrap the sum.
            let counter = values.iter().fold(Counter::default(), |sum, c| Counter {
                events: sum.events.saturating_add(c.events),
                emitted: sum.emitted.saturating_add(c.emitted),
            });
            self.counts.remove(&key).map_err(|e| format!("deleting from {}: {e}", self.name))?;
            counted.push((key, counter));
        }
        let mut gained = Vec::with_capacity(self.overflow_read.len());
        for (slot, read) in self.overflow_read.iter_mut().enumerate() {
            let values = self
                .overflow
                .get(&(slot as u32), 0)
                .map_err(|e| format!("reading {} overflow: {e}", self.name))?;
            let total = values.iter().fold(0u64, |sum, v| sum.saturating_add(*v));
            gained.push(total.saturating_sub(*read));
            *read = total;
        }
        Ok(gained)
    }
}
