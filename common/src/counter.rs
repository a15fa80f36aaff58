//! In-kernel counters: what the metrics count is added up in per-CPU hash maps, so it is exact
//! whatever the ring buffer does, and only the first events of each key in each interval are sent
//! in full (sampling; the rest are counted as suppressed, never dropped silently).
//!
//! Every key carries the *generation* it was counted in (`GENERATION[0]`, 0 or 1). The agent
//! flips the generation once per interval and then drains the keys of the one before: it reads
//! and deletes them. A program finishes in microseconds and the drained generation has been
//! idle for a whole interval, so no increment lands in a key after it was read; and since every
//! key is deleted once drained, the map holds only the keys of the last two intervals and each
//! key's sample budget starts afresh in each interval.

/// The value of every counter key; per CPU, summed by the agent.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counter {
    /// Events counted for the key.
    pub events: u64,
    /// Of those, the ones sent in full to the ring buffer (or counted lost when it was full).
    pub emitted: u64,
}

impl Counter {
    /// Counted, not sent in full.
    pub fn suppressed(&self) -> u64 {
        self.events.saturating_sub(self.emitted)
    }
}

/// Generations the agent alternates between.
pub const GENERATIONS: u32 = 2;

/// Events of one key sent in full per CPU per interval when the agent does not say (`--sample-events`).
pub const DEFAULT_SAMPLE_EVENTS: u32 = 32;

/// The ports the counters keep by number (one bit a port); every other port is counted as a
/// class, so a port scan makes two keys, not one a port. The global `KEPT_PORTS`, written by the
/// agent before load.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KeptPorts {
    pub words: [u64; 1024],
}

const _: () = assert!(size_of::<KeptPorts>() == 8192);

impl KeptPorts {
    pub const NONE: Self = Self { words: [0; 1024] };

    pub fn insert(&mut self, port: u16) {
        self.words[usize::from(port >> 6)] |= 1 << (port & 63);
    }

    #[inline(always)]
    pub fn contains(&self, port: u16) -> bool {
        // `port >> 6` < 1024 always; `get` spares the verifier a panic path.
        self.words.get(usize::from(port >> 6)).is_some_and(|w| w >> (port & 63) & 1 != 0)
    }
}

impl Default for KeptPorts {
    fn default() -> Self {
        Self::NONE
    }
}

#[cfg(feature = "user")]
mod user {
    // SAFETY: repr(C), integers only.
    unsafe impl aya::Pod for super::Counter {}
    unsafe impl aya::Pod for super::KeptPorts {}
}
