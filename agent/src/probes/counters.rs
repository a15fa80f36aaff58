//! The kernel's counters (`kstall_common::counter`), read back: once per interval the generation
//! is flipped and the keys of the generation idle since the last flip are read and deleted. What
//! comes back is exact; the metrics are built from it, not from the events, so they stay exact
//! whatever the ring buffer loses or the sampling leaves out.

use aya::{
    Pod,
    maps::{Array, Map, MapData, PerCpuArray},
};
use kstall_common::{
    counter::Counter,
    nfs::{NfsCountKey, NfsLatency, NfsLatencyKey},
    oom::OomCountKey,
    tcp_reset::ResetCountKey,
};

use super::{
    map_batch,
    probe::{Counting, Decoding, Drained, Turn},
};

/// How often the generation flips: counts reach the metrics within two of these.
pub const INTERVAL: std::time::Duration = std::time::Duration::from_secs(1);

/// The generation the programs count in, and every probe's counters.
pub struct Counters {
    generation: Array<MapData, u32>,
    /// The generation the programs count in now.
    current: u32,
    /// Keys the programs inserted, per CPU (`COUNTER_INSERTS`), and its sum at the last drain.
    inserts: PerCpuArray<MapData, u64>,
    inserts_read: Option<u64>,
    counting: Vec<Box<dyn Counting>>,
}

impl Counters {
    pub fn take(ebpf: &mut aya::Ebpf, counting: Vec<Box<dyn Counting>>) -> Result<Self, String> {
        let generation = ebpf.take_map("GENERATION").ok_or("map GENERATION missing from the eBPF object")?;
        let generation = Array::try_from(generation).map_err(|e| e.to_string())?;
        let inserts =
            ebpf.take_map("COUNTER_INSERTS").ok_or("map COUNTER_INSERTS missing from the eBPF object")?;
        let inserts = PerCpuArray::try_from(inserts).map_err(|e| e.to_string())?;
        Ok(Self { generation, current: 0, inserts, inserts_read: None, counting })
    }

    /// Reads and deletes the keys of the generation idle for an interval, then flips: call once
    /// per [`INTERVAL`]. Blocking (a few syscalls per key).
    pub fn drain(&mut self, decoding: &Decoding) -> Drained {
        let idle = (self.current + 1) % kstall_common::counter::GENERATIONS;
        let mut drained = Drained::default();
        // Read before the maps: a key inserted after this read moves it for the next drain.
        let inserts =
            self.inserts.get(&0, 0).map(|per_cpu| per_cpu.iter().fold(0u64, |s, n| s.wrapping_add(*n)));
        let inserts = inserts.ok();
        let turn =
            Turn { generation: idle as u8, inserted: inserts.is_none() || inserts != self.inserts_read };
        self.inserts_read = inserts;
        for counting in &mut self.counting {
            if let Err(e) = counting.drain(turn, decoding, &mut drained) {
                drained.failure = Some(e);
            }
        }
        match self.generation.set(0, idle, 0) {
            Ok(()) => self.current = idle,
            Err(e) => drained.failure = Some(format!("flipping the counters' generation: {e}")),
        }
        drained
    }

    /// Both generations, at shutdown once the programs are detached: nothing counted is left.
    pub fn drain_all(&mut self, decoding: &Decoding) -> Drained {
        let mut drained = self.drain(decoding);
        let rest = self.drain(decoding);
        drained.counts.extend(rest.counts);
        drained.uncounted.extend(rest.uncounted);
        drained.errors.extend(rest.errors);
        drained.failure = drained.failure.or(rest.failure);
        drained
    }
}

/// A counter key: it carries the generation it was counted in.
pub trait CountKey: Pod {
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

impl CountKey for NfsLatencyKey {
    fn generation(&self) -> u8 {
        self.generation
    }
}

/// A counter map's value: each CPU has its own, the agent adds them up.
pub trait PerCpuSum: Pod + Default {
    fn add(&mut self, other: &Self);
}

impl PerCpuSum for Counter {
    fn add(&mut self, other: &Self) {
        self.events = self.events.saturating_add(other.events);
        self.emitted = self.emitted.saturating_add(other.emitted);
    }
}

impl PerCpuSum for NfsLatency {
    fn add(&mut self, other: &Self) {
        self.rpcs = self.rpcs.saturating_add(other.rpcs);
        self.sum_ns = self.sum_ns.saturating_add(other.sum_ns);
        for (sum, n) in self.buckets.iter_mut().zip(other.buckets) {
            *sum = sum.saturating_add(n);
        }
    }
}

/// One probe's counter map and its overflow counters (cumulative, one per slot). The counters
/// are per CPU; a map the program adds to atomically (where a per-CPU lookup would be a helper
/// call on the hot path of older kernels) has one value per key.
pub struct CounterMap<K: CountKey, V: PerCpuSum = Counter> {
    name: &'static str,
    counts: MapData,
    /// Whether `counts` is a per-CPU hash (else a hash).
    per_cpu: bool,
    kinds: std::marker::PhantomData<(K, V)>,
    overflow: PerCpuArray<MapData, u64>,
    /// What of `overflow` was already read, by slot.
    overflow_read: Vec<u64>,
    /// Whether the last walk found keys (or failed): then the next walks it whatever was inserted.
    held_keys: bool,
}

impl<K: CountKey, V: PerCpuSum> CounterMap<K, V> {
    pub fn take(
        ebpf: &mut aya::Ebpf,
        name: &'static str,
        overflow: &str,
        slots: usize,
    ) -> Result<Self, String> {
        let mut map = |name: &str| {
            ebpf.take_map(name).ok_or_else(|| format!("map {name} missing from the eBPF object"))
        };
        let (counts, per_cpu) = match map(name)? {
            Map::PerCpuHashMap(data) => (data, true),
            Map::HashMap(data) => (data, false),
            _ => return Err(format!("map {name} is neither a hash nor a per-CPU hash")),
        };
        // A hash's values are packed at their size, a per-CPU hash's at 8 bytes (`map_batch`).
        if !size_of::<V>().is_multiple_of(8) {
            return Err(format!("map {name}: a value of {} bytes, not a multiple of 8", size_of::<V>()));
        }
        Ok(Self {
            name,
            counts,
            per_cpu,
            kinds: std::marker::PhantomData,
            overflow: PerCpuArray::try_from(map(overflow)?).map_err(|e| e.to_string())?,
            overflow_read: vec![0; slots],
            held_keys: true,
        })
    }

    /// Moves the keys of the turn's generation into `counted`, summed over the CPUs, and returns
    /// what each overflow slot gained since the last drain. A failure stops the drain and leaves
    /// the rest for the next one. In batches: one lookup of every key, one delete of those
    /// drained; none when the map was empty and nothing was inserted since.
    pub fn drain(&mut self, turn: Turn, counted: &mut Vec<(K, V)>) -> Result<Vec<u64>, String> {
        if self.held_keys || turn.inserted {
            self.walk(turn.generation, counted)?;
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

    fn walk(&mut self, generation: u8, counted: &mut Vec<(K, V)>) -> Result<(), String> {
        let cpus =
            if self.per_cpu { aya::util::nr_cpus().map_err(|(what, e)| format!("{what}: {e}"))? } else { 1 };
        let fd = self.counts.fd();
        self.held_keys = true;
        let entries: Vec<(K, Vec<V>)> =
            map_batch::lookup_all(fd, cpus).map_err(|e| format!("reading {}: {e}", self.name))?;
        self.held_keys = !entries.is_empty();
        let (keys, sums): (Vec<K>, Vec<V>) = entries
            .into_iter()
            .filter(|(key, _)| key.generation() == generation)
            .map(|(key, values)| {
                // Saturating: the values are the kernel's, and a corrupt one must not wrap the sum.
                let sum = values.iter().fold(V::default(), |mut sum, c| {
                    sum.add(c);
                    sum
                });
                (key, sum)
            })
            .unzip();
        // A key is counted once deleted, so that a failed delete cannot count it twice.
        let deleted = match map_batch::delete(fd, &keys) {
            Ok(()) => keys.len(),
            Err((deleted, e)) => {
                counted.extend(keys.into_iter().zip(sums).take(deleted));
                return Err(format!("deleting from {}: {e}", self.name));
            }
        };
        counted.extend(keys.into_iter().zip(sums).take(deleted));
        Ok(())
    }
}
