//! The kernel's counters (`kstall_common::counter`), read back: once per interval the generation
//! is flipped and the keys of the generation idle since the last flip are read and deleted. What
//! comes back is exact; the metrics are built from it, not from the events, so they stay exact
//! whatever the ring buffer loses or the sampling leaves out.

use aya::maps::{Array, MapData, PerCpuArray, PerCpuHashMap};
use kstall_common::{counter::Counter, tcp_reset::ResetCountKey};

use super::tcp_reset::{self, Direction, ResetCount};
use crate::decode::DecodeError;

/// How often the generation flips: counts reach the metrics within two of these.
pub const INTERVAL: std::time::Duration = std::time::Duration::from_secs(1);

/// The maps of the kernel's counters, taken from the loaded object.
pub struct Counters {
    generation: Array<MapData, u32>,
    /// The generation the programs count in now.
    current: u32,
    tcp_reset: Option<ResetCounters>,
}

struct ResetCounters {
    counts: PerCpuHashMap<MapData, ResetCountKey, Counter>,
    overflow: PerCpuArray<MapData, u64>,
    /// `overflow` is cumulative: what was already read, by direction.
    overflow_read: [u64; 2],
    names: tcp_reset::Names,
}

/// One interval's counts.
#[derive(Debug, Default)]
pub struct Drained {
    /// By network namespace (attributed by the pipeline).
    pub resets: Vec<(u32, ResetCount)>,
    /// Keys that could not be read back (a garbage key is counted, never a panic).
    pub errors: Vec<DecodeError>,
    /// A map operation that failed: what it left in the map is read the next time.
    pub failure: Option<String>,
}

impl Counters {
    pub fn take(ebpf: &mut aya::Ebpf, tcp_reset: Option<tcp_reset::Names>) -> Result<Self, String> {
        let mut map = |name: &str| {
            ebpf.take_map(name).ok_or_else(|| format!("map {name} missing from the eBPF object"))
        };
        let generation = Array::try_from(map("GENERATION")?).map_err(|e| e.to_string())?;
        let tcp_reset = match tcp_reset {
            Some(names) => Some(ResetCounters {
                counts: PerCpuHashMap::try_from(map("TCP_RESET_COUNTS")?).map_err(|e| e.to_string())?,
                overflow: PerCpuArray::try_from(map("TCP_RESET_OVERFLOW")?).map_err(|e| e.to_string())?,
                overflow_read: [0; 2],
                names,
            }),
            None => None,
        };
        Ok(Self { generation, current: 0, tcp_reset })
    }

    /// Reads and deletes the keys of the generation idle for an interval, then flips: call once
    /// per [`INTERVAL`]. Blocking (a few syscalls per key).
    pub fn drain(&mut self) -> Drained {
        let idle = (self.current + 1) % kstall_common::counter::GENERATIONS;
        let mut drained = Drained::default();
        if let Some(resets) = &mut self.tcp_reset
            && let Err(e) = resets.drain(idle as u8, &mut drained)
        {
            drained.failure = Some(e);
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
        drained.errors.extend(rest.errors);
        drained.failure = drained.failure.or(rest.failure);
        drained
    }
}

impl ResetCounters {
    fn drain(&mut self, generation: u8, drained: &mut Drained) -> Result<(), String> {
        let keys: Vec<ResetCountKey> =
            self.counts.keys().filter_map(Result::ok).filter(|key| key.generation == generation).collect();
        for key in keys {
            // A key read is deleted before it is counted, so that a failed delete cannot count
            // it twice; a failure stops the drain and leaves the rest for the next one.
            let values = self.counts.get(&key, 0).map_err(|e| format!("reading a tcp-reset counter: {e}"))?;
            let counter = values.iter().fold(Counter::default(), |sum, c| Counter {
                events: sum.events + c.events,
                emitted: sum.emitted + c.emitted,
            });
            self.counts.remove(&key).map_err(|e| format!("deleting a tcp-reset counter: {e}"))?;
            match tcp_reset::decode_count(&key, &counter, &self.names) {
                Ok(count) => drained.resets.push((key.netns_ino, count)),
                Err(e) => drained.errors.push(e),
            }
        }
        let overflow = self.overflow_totals()?;
        for (i, direction) in [Direction::Sent, Direction::Received].into_iter().enumerate() {
            let new = overflow[i].saturating_sub(self.overflow_read[i]);
            if new > 0 {
                drained.resets.push((0, tcp_reset::overflow_count(direction, new)));
            }
        }
        self.overflow_read = overflow;
        Ok(())
    }

    fn overflow_totals(&self) -> Result<[u64; 2], String> {
        let mut totals = [0; 2];
        for (i, total) in totals.iter_mut().enumerate() {
            let values =
                self.overflow.get(&(i as u32), 0).map_err(|e| format!("reading TCP_RESET_OVERFLOW: {e}"))?;
            *total = values.iter().sum();
        }
        Ok(totals)
    }
}
