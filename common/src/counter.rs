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

#[cfg(feature = "user")]
// SAFETY: repr(C), two u64.
unsafe impl aya::Pod for Counter {}
