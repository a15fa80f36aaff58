//! The event path: ring buffer -> decode -> attribute (hold an event whose pod is not known yet,
//! for a bounded time) -> emit to the stuck set, the metrics, the incident signatures and the API
//! subscribers, in that order, one event at a time. Also the loops around it: the kernel's loss
//! counters, and the evaluation of incidents once a second.
//!
//! The pipeline is the only writer of the stuck set: hung-task reports come from the ring buffer,
//! task states read from `/proc` (`stuck::watch_states`) come in on a channel, both in order.

use std::{
    collections::{HashSet, VecDeque},
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use aya::maps::{Array, MapData, PerCpuArray, RingBuf};
use tokio::{
    io::unix::AsyncFd,
    sync::{broadcast, mpsc, watch},
};
use tokio_util::sync::CancellationToken;

use crate::{
    attribution::{Attributed, Attribution, Index, Key, Resolution},
    events::{Counts, Decoder, Event, Payload},
    export::metrics::Metrics,
    incidents::engine::Engine,
    kernel,
    probes::{
        self,
        counters::{self, Counters},
        probe::Drained,
    },
    state::lock,
    stuck::{StuckSet, TaskStates},
};

/// How often held events are looked at again.
const HOLD_CHECK_INTERVAL: Duration = Duration::from_millis(20);
/// Events held at once at most; beyond it they go out with what is known at once.
const MAX_HELD: usize = 10_000;
/// While events flow, the kernel only wakes the reader once a quarter of the ring buffer is
/// queued (see [`Wakeup`]); below that, events wait at most this long.
const DRAIN_INTERVAL: Duration = Duration::from_millis(50);
/// Wakeups within a second past which events come faster than the drain would read them: the
/// reader drains on the timer instead.
const BUSY_AFTER_WAKEUPS: u32 = (1000 / DRAIN_INTERVAL.as_millis()) as u32;
/// Empty drains in a row after which the node is quiet again and every event wakes the reader.
const QUIET_AFTER_EMPTY_DRAINS: u32 = 10;
const LOSS_POLL_INTERVAL: Duration = Duration::from_secs(1);
/// The programs' runs are read every this many loss polls: one syscall a program, a fifth of
/// the idle agent's syscalls when read every second (profiled, issue 58), for a figure scraped
/// every 15 s or more.
const RUNS_EVERY_POLLS: u32 = 5;
/// What the pipeline reads and writes; each is owned elsewhere and shared.
pub struct Pipeline {
    pub decoder: Decoder,
    /// The resolver's latest index, and where its misses go.
    pub index: watch::Receiver<Arc<Index>>,
    /// The index last applied here (its forgotten pods' series removed): what `kstall status`
    /// shows, so that a pod it no longer counts has no series left either.
    pub applied: watch::Sender<Arc<Index>>,
    pub misses: mpsc::Sender<Key>,
    pub counts: Arc<Counts>,
    pub metrics: Arc<Metrics>,
    pub stuck: Arc<Mutex<StuckSet>>,
    pub incidents: Arc<Mutex<Engine>>,
    pub events: broadcast::Sender<Arc<Attributed>>,
    /// The node's last events, for captures' bundles (only where the agent can capture).
    pub recent: Option<Arc<crate::capture::context::Recent>>,
    /// `--record-raw`: every record as received, for replaying a decoder bug.
    pub record_raw: Option<std::io::BufWriter<std::fs::File>>,
    pub held: Held,
    pub count_keys: CountKeys,
    /// How full the ring buffer is, read each time the reader wakes.
    pub ring_fill: Option<probes::runs::RingFill>,
}

/// What the events of each key counted by task showed, for its counts to follow (see
/// [`probes::Probe::counts_follow_events`]): learnt as they are decoded (what a count cannot
/// carry, such as an OOM kill's scope) and as they go out (whom they were attributed to). A key's
/// first events in an interval are always sent in full, so a count finds its key here unless all
/// of them were lost; it is attributed by its cgroup when no event of its key has gone out.
pub struct CountKeys {
    by_key: std::collections::HashMap<CountKey, LastEvent>,
    /// The probes whose counts follow their events, asked of the registry once: the event path
    /// compares a name, it does not look the probe up.
    following: Vec<&'static str>,
}

impl Default for CountKeys {
    fn default() -> Self {
        let following = probes::ALL.iter().filter(|p| p.counts_follow_events()).map(|p| p.name()).collect();
        Self { by_key: Default::default(), following }
    }
}

/// Probe, cgroup id, process name: how the kernel keys a count by task.
type CountKey = (&'static str, u64, String);

struct LastEvent {
    payload: Payload,
    who: Option<Arc<Attribution>>,
    seen: Instant,
}

/// How long a key is remembered after its last event: well past the two counter intervals
/// between an event and its count.
const COUNT_KEY_MEMORY: Duration = Duration::from_secs(60);

impl CountKeys {
    /// The key of `event` if its probe's counts follow its events; with whether it is a count.
    fn key_of(&self, event: &Event) -> Option<(CountKey, bool)> {
        let header = &event.header;
        if !self.following.contains(&header.probe) {
            return None;
        }
        let is_count = event.payload.data().suppressed().is_some();
        Some(((header.probe, header.cgroup_id, header.comm.clone()), is_count))
    }

    fn decoded(&mut self, event: &Event, now: Instant) {
        if let Some((key, false)) = self.key_of(event) {
            let last = self.by_key.entry(key).or_insert(LastEvent {
                payload: event.payload.clone(),
                who: None,
                seen: now,
            });
            (last.payload, last.seen) = (event.payload.clone(), now);
        }
    }

    fn attributed(&mut self, attributed: &Attributed) {
        if let Some((key, false)) = self.key_of(&attributed.event)
            && let Some(last) = self.by_key.get_mut(&key)
        {
            last.who = Some(attributed.who.clone());
        }
    }

    /// Forgets the keys whose last event is older than [`COUNT_KEY_MEMORY`] at `now`.
    fn forget_old(&mut self, now: Instant) {
        self.by_key.retain(|_, last| now.saturating_duration_since(last.seen) < COUNT_KEY_MEMORY);
    }

    /// A count takes what its key's last event showed and the counter key cannot carry.
    fn settle(&self, event: &mut Event) {
        if let Some((key, true)) = self.key_of(event)
            && let Some(last) = self.by_key.get(&key)
            && let Some(probe) = probes::by_name(event.header.probe)
        {
            probe.settle_count(&mut event.payload, &last.payload);
        }
    }

    /// Whether the key of count `event` has seen an event, and whom its last one went out to.
    fn seen(&self, event: &Event) -> Option<(CountKey, Option<Arc<Attribution>>)> {
        let (key, _) = self.key_of(event).filter(|(_, is_count)| *is_count)?;
        let who = self.by_key.get(&key)?.who.clone();
        Some((key, who))
    }
}

/// Events waiting for the resolver, in arrival order.
#[derive(Default)]
pub struct Held {
    events: VecDeque<HeldEvent>,
    /// Keys already sent to the resolver (until the next index).
    asked: HashSet<Key>,
    /// Keys whose wait ran out: their events are not held again until the next index.
    gave_up: HashSet<Key>,
}

struct HeldEvent {
    until: Instant,
    key: Key,
    fallback: Option<Arc<Attribution>>,
    event: Event,
}

impl Held {
    fn waiting(&self) -> bool {
        !self.events.is_empty()
    }

    /// The attribution key a held event of count key `key` waits for, if one does.
    fn event_of(&self, key: &CountKey, keys: &CountKeys) -> Option<Key> {
        self.events.iter().find_map(|held| {
            keys.key_of(&held.event).filter(|(k, is_count)| !is_count && k == key).map(|_| held.key)
        })
    }
}

impl Pipeline {
    /// One record from the ring buffer, at `now`.
    pub fn handle(&mut self, bytes: &[u8], now: Instant) {
        if let Some(out) = &mut self.record_raw {
            record(out, bytes);
        }
        match self.decoder.decode(bytes) {
            Ok(event) => {
                self.counts.received(event.header.probe);
                self.count_keys.decoded(&event, now);
                self.attribute(event, now);
            }
            Err(e) => {
                tracing::debug!(error = %e, "undecodable event");
                self.metrics.decode_error(e.label());
            }
        }
    }

    /// Who `event` is about, as `index` says; a count that follows its key's events is
    /// attributed as they were instead, as they may know more than its cgroup id can (an OOM
    /// victim's cgroup path or process), and waits behind them while they wait for theirs.
    fn resolve(&self, index: &Index, event: &Event) -> Resolution {
        match self.count_keys.seen(event) {
            Some((_, Some(who))) => return Resolution::Found(who),
            Some((key, None)) => {
                if let Some(key) = self.held.event_of(&key, &self.count_keys) {
                    return Resolution::Missing { key, fallback: None };
                }
            }
            None => {}
        }
        index.resolve(event)
    }

    fn attribute(&mut self, event: Event, now: Instant) {
        let resolution = self.resolve(&self.index.borrow(), &event);
        match resolution {
            Resolution::Found(who) => self.emit(Attributed { event, who }),
            Resolution::Missing { key, fallback } => {
                if self.held.gave_up.contains(&key) {
                    return self.emit_unresolved(event, fallback);
                }
                if self.held.events.len() >= MAX_HELD {
                    self.metrics.attribution_queue_full("held");
                    return self.emit_unresolved(event, fallback);
                }
                // A full queue means the resolver is busy with misses already: it will walk.
                if self.held.asked.insert(key) && self.misses.try_send(key).is_err() {
                    self.metrics.attribution_queue_full("misses");
                }
                self.held.events.push_back(HeldEvent { until: now + key.hold(), key, fallback, event });
            }
        }
    }

    /// Sends held events whose answer arrived or whose wait ran out at `now`, in arrival order.
    pub fn release_held(&mut self, now: Instant) {
        if self.index.has_changed().unwrap_or(false) {
            self.index.mark_unchanged();
            self.held.asked.clear();
            self.held.gave_up.clear();
            let index = self.index.borrow().clone();
            self.metrics.set_attribution(&index);
            self.metrics.forget_pods_except(&index.named_pods);
            self.applied.send_replace(index);
        }
        if self.held.events.is_empty() {
            return;
        }
        let index = self.index.borrow().clone();
        for held in std::mem::take(&mut self.held.events) {
            match self.resolve(&index, &held.event) {
                Resolution::Found(who) => self.emit(Attributed { event: held.event, who }),
                Resolution::Missing { .. } if now >= held.until => {
                    self.held.gave_up.insert(held.key);
                    self.emit_unresolved(held.event, held.fallback);
                }
                Resolution::Missing { .. } => self.held.events.push_back(held),
            }
        }
    }

    /// Applies what `/proc` showed of stuck tasks: those no longer stuck leave the set, each told
    /// downstream as a cleared event.
    pub fn apply_task_states(&mut self, states: &TaskStates, now_unix_ns: u64) {
        let cleared = {
            let mut stuck = lock(&self.stuck);
            let cleared = stuck.clear(states, now_unix_ns);
            self.metrics.set_stuck_tasks(&stuck, now_unix_ns);
            cleared
        };
        for event in cleared {
            self.emit(event);
        }
    }

    fn take_counts(&mut self, mut drained: Drained) {
        // What was left in the map is read the next time.
        if let Some(e) = drained.failure.take() {
            tracing::warn!(error = %e, "reading the kernel's counters failed");
        }
        self.count(drained, Instant::now());
    }

    /// One interval's counts from the kernel's counters, at `now`: attributed as events are (by
    /// the subject of their kind) and emitted like them.
    pub fn count(&mut self, drained: Drained, now: Instant) {
        for error in drained.errors {
            tracing::debug!(error = %error, "undecodable counter key");
            self.metrics.decode_error(error.label());
        }
        for (probe, n) in drained.uncounted {
            self.counts.suppressed(probe, n);
        }
        self.count_keys.forget_old(now);
        for counted in drained.counts {
            let header = crate::events::Header {
                probe: counted.probe,
                time_unix_ns: kernel::unix_now_ns(),
                tgid: 0,
                pid: 0,
                comm: counted.comm,
                cgroup_id: counted.cgroup_id,
                netns: counted.netns,
            };
            let mut event = Event { header, payload: counted.payload };
            self.count_keys.settle(&mut event);
            self.attribute(event, now);
        }
    }

    fn emit_unresolved(&mut self, event: Event, fallback: Option<Arc<Attribution>>) {
        self.emit(Attributed { event, who: fallback.unwrap_or_default() });
    }

    fn emit(&mut self, attributed: Attributed) {
        let count = attributed.event.payload.data().suppressed();
        if attributed.unattributed() && count.is_none() {
            self.metrics.unattributed(attributed.event.header.probe);
        }
        if attributed.event.payload.data().stuck().is_some() {
            let mut stuck = lock(&self.stuck);
            let news = stuck.report(&attributed);
            self.metrics.set_stuck_tasks(&stuck, attributed.event.header.time_unix_ns);
            if !news {
                return;
            }
        }
        self.count_keys.attributed(&attributed);
        self.metrics.observe(&attributed);
        lock(&self.incidents).observe(&attributed);
        // A count is news to a trace only for what it did not see: the suppressed events.
        if count.is_none_or(|suppressed| suppressed > 0) {
            let attributed = Arc::new(attributed);
            if let Some(recent) = &self.recent {
                recent.keep(&attributed);
            }
            // No subscriber is not an error.
            let _ = self.events.send(attributed);
        }
    }

    /// At shutdown: nothing waits any more.
    fn flush_held(&mut self) {
        for held in std::mem::take(&mut self.held.events) {
            self.emit_unresolved(held.event, held.fallback);
        }
    }
}

/// Hands every record queued in `ring` to `pipeline`; returns how many there were.
fn read_ring(ring: &mut RingBuf<MapData>, pipeline: &mut Pipeline) -> u64 {
    if let Some(fill) = &pipeline.ring_fill {
        pipeline.counts.ring_used(fill.used());
    }
    let mut read = 0;
    while let Some(item) = ring.next() {
        pipeline.handle(&item, Instant::now());
        read += 1;
    }
    read
}

/// The queued bytes at which a kernel program wakes the ring's reader (`WAKEUP` in
/// `ebpf/src/maps.rs`): 0 while the node is quiet, so that every event wakes it and no timer
/// runs; a quarter of the ring while events flow (a wakeup per event would cost an IPI each), and
/// the reader drains every [`DRAIN_INTERVAL`].
pub struct Wakeup {
    map: Array<MapData, u64>,
    busy_bytes: u64,
    /// A failed write is logged once.
    failed: bool,
}

impl Wakeup {
    pub fn new(map: Array<MapData, u64>, ring_buffer_bytes: u32) -> Self {
        Self { map, busy_bytes: u64::from(ring_buffer_bytes / 4), failed: false }
    }

    /// Sets the threshold for `busy` (or quiet); whether the kernel took it.
    fn set(&mut self, busy: bool) -> bool {
        let bytes = if busy { self.busy_bytes } else { 0 };
        match self.map.set(0, bytes, 0) {
            Ok(()) => true,
            Err(e) => {
                if !std::mem::replace(&mut self.failed, true) {
                    tracing::warn!(error = %e, "cannot set the ring buffer's wakeup threshold");
                }
                false
            }
        }
    }
}

/// When the reader drains the ring on a timer: only while events flow (busy). Quiet, the kernel
/// wakes it for every event; more than [`BUSY_AFTER_WAKEUPS`] wakeups with records within a
/// second make it busy (events come faster than the timer would read them: a lone event, or a
/// reset's pair of events, stays one wakeup each), and [`QUIET_AFTER_EMPTY_DRAINS`] empty drains
/// quiet again, after one more drain (the grace): a program that read the busy threshold just
/// before the switch submits without a wakeup, and that drain reads it.
#[derive(Debug, Default)]
struct Pace {
    busy: bool,
    /// Quiet, with one drain still due.
    grace: bool,
    empty_drains: u32,
    /// Quiet: since when wakeups are counted, and how many found records since.
    wakeups: Option<(Instant, u32)>,
}

/// A change of the kernel's wakeup threshold that [`Pace`] asks for.
#[derive(Debug, PartialEq)]
enum Switch {
    Busy,
    Quiet,
}

impl Pace {
    /// Whether the drain timer runs.
    fn draining(&self) -> bool {
        self.busy || self.grace
    }

    /// A read on a wakeup found `records` at `now`.
    fn woken(&mut self, records: u64, now: Instant) -> Option<Switch> {
        if records == 0 {
            return None;
        }
        if self.busy {
            self.empty_drains = 0;
            return None;
        }
        let (since, wakeups) = self.wakeups.get_or_insert((now, 0));
        if now.saturating_duration_since(*since) >= Duration::from_secs(1) {
            (*since, *wakeups) = (now, 0);
        }
        *wakeups += 1;
        (*wakeups > BUSY_AFTER_WAKEUPS).then(|| self.switch(Switch::Busy))
    }

    /// A drain on the timer found `records`.
    fn drained(&mut self, records: u64) -> Option<Switch> {
        if !self.busy {
            self.grace = false;
            return (records > 0).then(|| self.switch(Switch::Busy));
        }
        if records > 0 {
            self.empty_drains = 0;
            return None;
        }
        self.empty_drains += 1;
        (self.empty_drains >= QUIET_AFTER_EMPTY_DRAINS).then(|| self.switch(Switch::Quiet))
    }

    fn switch(&mut self, to: Switch) -> Switch {
        self.busy = to == Switch::Busy;
        self.grace = to == Switch::Quiet;
        self.empty_drains = 0;
        self.wakeups = None;
        to
    }

    /// The kernel did not take the switch: the previous pace goes on.
    fn undo(&mut self, switch: Switch) {
        self.busy = switch == Switch::Quiet;
        self.grace = false;
    }
}

/// Reads the ring buffer (and the stuck tasks' states, and the kernel's counters once per
/// interval) until intake stops, then drains what is left. Returns the number of records drained
/// after the stop. Without `wakeup` (its map missing from the object) it drains on the timer all
/// along.
pub async fn run(
    ring: RingBuf<MapData>,
    mut wakeup: Option<Wakeup>,
    mut counters: Option<Counters>,
    mut pipeline: Pipeline,
    mut task_states: mpsc::Receiver<TaskStates>,
    stop: CancellationToken,
) -> u64 {
    // SAFETY: the RingBuf owns its fd for as long as the AsyncFd lives.
    let mut fd = match unsafe { AsyncFd::register(ring) } {
        Ok(fd) => fd,
        Err(e) => {
            tracing::error!(error = %e, "cannot poll the event ring buffer; no events will be read");
            return 0;
        }
    };
    // The kernel's threshold starts at 0: quiet.
    let mut pace = Pace { busy: wakeup.is_none(), ..Pace::default() };
    let mut drain_tick = tokio::time::interval(DRAIN_INTERVAL);
    drain_tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut hold_tick = tokio::time::interval(HOLD_CHECK_INTERVAL);
    hold_tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // Its own view of the index, to be woken by a new one (the pipeline's marks what it has seen).
    let mut new_index = pipeline.index.clone();
    let mut counter_tick = tokio::time::interval(counters::INTERVAL);
    counter_tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = stop.cancelled() => break,
            _ = counter_tick.tick(), if counters.is_some() => {
                // The events first: a count settles its scope from its key's events.
                read_ring(fd.get_mut(), &mut pipeline);
                let drained = counters.as_mut().map(|c| c.drain(pipeline.decoder.decoding()));
                if let Some(drained) = drained {
                    pipeline.take_counts(drained);
                }
            }
            // Only while something waits: an idle agent has no timer of its own to serve.
            _ = hold_tick.tick(), if pipeline.held.waiting() => pipeline.release_held(Instant::now()),
            Ok(()) = new_index.changed() => pipeline.release_held(Instant::now()),
            Some(states) = task_states.recv() => pipeline.apply_task_states(&states, kernel::unix_now_ns()),
            _ = drain_tick.tick(), if pace.draining() => {
                let read = read_ring(fd.get_mut(), &mut pipeline);
                if let Some(wakeup) = &mut wakeup
                    && let Some(switch) = pace.drained(read)
                {
                    pace_switch(switch, wakeup, &mut pace, &mut drain_tick, fd.get_mut(), &mut pipeline);
                }
            }
            guard = fd.readable_mut() => match guard {
                Ok(mut guard) => {
                    let read = read_ring(guard.get_inner_mut(), &mut pipeline);
                    guard.clear_ready();
                    if let Some(wakeup) = &mut wakeup
                        && let Some(switch) = pace.woken(read, Instant::now())
                    {
                        pace_switch(switch, wakeup, &mut pace, &mut drain_tick, fd.get_mut(), &mut pipeline);
                    }
                }
                Err(e) => {
                    tracing::error!(error = %e, "event ring buffer poll failed");
                    break;
                }
            },
        }
    }
    let drained = read_ring(fd.get_mut(), &mut pipeline);
    // The programs are detached: both generations are complete.
    if let Some(counters) = &mut counters {
        let drained = counters.drain_all(pipeline.decoder.decoding());
        pipeline.take_counts(drained);
    }
    pipeline.release_held(Instant::now());
    pipeline.flush_held();
    if let Some(out) = &mut pipeline.record_raw {
        let _ = std::io::Write::flush(out);
    }
    drained
}

/// Writes the threshold `switch` asks for. Busy, the timer's next drain is one interval away;
/// quiet, the ring is drained once more after the threshold is 0, as what was submitted before
/// woke nobody.
fn pace_switch(
    switch: Switch,
    wakeup: &mut Wakeup,
    pace: &mut Pace,
    drain_tick: &mut tokio::time::Interval,
    ring: &mut RingBuf<MapData>,
    pipeline: &mut Pipeline,
) {
    let busy = switch == Switch::Busy;
    if !wakeup.set(busy) {
        return pace.undo(switch);
    }
    if busy {
        drain_tick.reset();
    } else {
        read_ring(ring, pipeline);
    }
}

/// `<kind> <hex bytes>` (--record-raw); a write error stops nothing, it is only logged.
fn record(out: &mut std::io::BufWriter<std::fs::File>, bytes: &[u8]) {
    use std::io::Write as _;
    let kind = bytes.get(..4).map(|k| u32::from_ne_bytes(k.try_into().expect("4 bytes"))).unwrap_or(0);
    let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    if let Err(e) = writeln!(out, "{kind} {hex}").and_then(|()| out.flush()) {
        tracing::warn!(error = %e, "--record-raw write failed");
    }
}

/// Adds the kernel's per-CPU loss counters to the agent's (`kstall_events_lost_total`), and reads
/// what it says of the programs' runs.
pub async fn poll_losses(
    lost: PerCpuArray<MapData, u64>,
    programs: Option<probes::runs::Programs>,
    counts: Arc<Counts>,
    stop: CancellationToken,
) {
    let mut reported = vec![0u64; probes::ALL.len()];
    let mut tick = tokio::time::interval(LOSS_POLL_INTERVAL);
    let mut polls = 0u32;
    loop {
        let stopping = tokio::select! {
            _ = stop.cancelled() => true,
            _ = tick.tick() => false,
        };
        polls = polls.wrapping_add(1);
        for (i, probe) in probes::ALL.iter().enumerate() {
            let Ok(per_cpu) = lost.get(&probe.record_kind(), 0) else { continue };
            let total: u64 = per_cpu.iter().sum();
            if total > reported[i] {
                counts.add_lost(probe.name(), total - reported[i]);
                reported[i] = total;
            }
        }
        // The first poll too: the programs show from the start.
        if polls % RUNS_EVERY_POLLS == 1 || stopping {
            for (program, runs) in programs.iter().flat_map(|p| p.read()) {
                counts.set_runs(program, runs);
            }
        }
        if stopping {
            break;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        attribution::Via,
        decode::bytes_of,
        incidents::Settings,
        probes::{
            probe::Counted,
            tcp_reset::{
                self,
                tests::{redirected_count_key, redirected_syn_reset},
            },
        },
    };

    const NETNS: u32 = 4026532999;

    struct Harness {
        pipeline: Pipeline,
        index: watch::Sender<Arc<Index>>,
        misses: mpsc::Receiver<Key>,
        events: broadcast::Receiver<Arc<Attributed>>,
        t0: Instant,
    }

    fn harness() -> Harness {
        let (index_tx, index_rx) = watch::channel(Arc::new(Index::default()));
        let (misses_tx, misses) = mpsc::channel(16);
        let (events_tx, events) = broadcast::channel(64);
        let pipeline = Pipeline {
            decoder: Decoder::default(),
            index: index_rx,
            applied: watch::Sender::new(Arc::default()),
            misses: misses_tx,
            counts: Arc::default(),
            metrics: Arc::new(Metrics::new(Arc::default(), Default::default())),
            stuck: Arc::default(),
            incidents: Arc::new(Mutex::new(Engine::new("node-a".into(), &Settings::default()))),
            events: events_tx,
            recent: None,
            record_raw: None,
            held: Held::default(),
            count_keys: Default::default(),
            ring_fill: None,
        };
        Harness { pipeline, index: index_tx, misses, events, t0: Instant::now() }
    }

    fn reset_bytes() -> Vec<u8> {
        let mut raw = redirected_syn_reset();
        raw.header.netns_ino = NETNS;
        bytes_of(&raw)
    }

    fn index_with_pod() -> Arc<Index> {
        let mut index = Index::default();
        let who = Attribution {
            namespace: "shop".into(),
            pod: "web-1".into(),
            pod_uid: Some("u1".into()),
            via: Via::Netns,
            ..Default::default()
        };
        index.by_netns.insert(NETNS, Arc::new(who));
        Arc::new(index)
    }

    impl Harness {
        fn at(&self, ms: u64) -> Instant {
            self.t0 + Duration::from_millis(ms)
        }

        fn sent(&mut self) -> Vec<Arc<Attributed>> {
            std::iter::from_fn(|| self.events.try_recv().ok()).collect()
        }

        fn asked(&mut self) -> Vec<Key> {
            std::iter::from_fn(|| self.misses.try_recv().ok()).collect()
        }
    }

    #[test]
    fn a_quiet_node_is_read_on_wakeups_alone_and_events_faster_than_the_drain_make_it_busy() {
        assert_eq!(BUSY_AFTER_WAKEUPS, 20);
        let t0 = Instant::now();
        let ms = |n| t0 + Duration::from_millis(n);
        let mut pace = Pace::default();
        assert!(!pace.draining(), "quiet: no timer");
        // A reset's pair of events, a second apart: each read on its own wakeup.
        for second in 0..5 {
            assert_eq!(pace.woken(1, ms(1000 * second)), None);
            assert_eq!(pace.woken(1, ms(1000 * second + 1)), None);
            assert_eq!(pace.woken(0, ms(1000 * second + 2)), None, "a wakeup that found nothing is no event");
        }
        assert!(!pace.draining());
        // As many wakeups in a second as the drain would make: still quiet; one more: busy.
        let t1 = 10_000;
        for i in 0..BUSY_AFTER_WAKEUPS {
            assert_eq!(pace.woken(3, ms(t1 + 49 * u64::from(i))), None);
        }
        assert_eq!(pace.woken(1, ms(t1 + 999)), Some(Switch::Busy));
        assert!(pace.draining());
    }

    #[test]
    fn a_busy_node_goes_quiet_after_empty_drains_and_one_drain_more() {
        let mut pace = Pace { busy: true, ..Pace::default() };
        for _ in 0..QUIET_AFTER_EMPTY_DRAINS - 1 {
            assert_eq!(pace.drained(0), None);
        }
        // Records, read on the timer or on a wakeup (the ring a quarter full), start the count again.
        assert_eq!(pace.drained(3), None);
        for _ in 0..QUIET_AFTER_EMPTY_DRAINS - 1 {
            assert_eq!(pace.drained(0), None);
        }
        assert_eq!(pace.woken(5000, Instant::now()), None);
        for _ in 0..QUIET_AFTER_EMPTY_DRAINS - 1 {
            assert_eq!(pace.drained(0), None);
        }
        assert_eq!(pace.drained(0), Some(Switch::Quiet));
        // Quiet, but the timer drains once more, for what was submitted under the old threshold.
        assert!(pace.draining());
        assert_eq!(pace.drained(0), None);
        assert!(!pace.draining(), "quiet: no timer");
        // A grace drain that finds records: busy again.
        let mut pace = Pace { busy: true, ..Pace::default() };
        (0..QUIET_AFTER_EMPTY_DRAINS).for_each(|_| _ = pace.drained(0));
        assert_eq!(pace.drained(1), Some(Switch::Busy));
        assert!(pace.draining());
    }

    #[test]
    fn a_switch_the_kernel_refused_leaves_the_pace_as_it_was() {
        let mut pace = Pace { busy: true, ..Pace::default() };
        (0..QUIET_AFTER_EMPTY_DRAINS - 1).for_each(|_| _ = pace.drained(0));
        let switch = pace.drained(0).expect("quiet");
        pace.undo(switch);
        assert!(pace.busy && pace.draining(), "still woken only a quarter full: the timer must go on");
        let mut pace = Pace::default();
        let now = Instant::now();
        (0..BUSY_AFTER_WAKEUPS).for_each(|_| _ = pace.woken(1, now));
        let switch = pace.woken(1, now).expect("busy");
        pace.undo(switch);
        assert!(!pace.draining(), "still woken by every event");
    }

    #[test]
    fn a_reset_in_an_unknown_netns_is_held_and_released_with_the_new_index() {
        let mut h = harness();
        h.pipeline.handle(&reset_bytes(), h.at(0));
        assert!(h.sent().is_empty(), "held until the resolver answers");
        assert_eq!(h.asked(), [Key::Netns(NETNS)]);
        // A second event of the same namespace waits too, without asking again.
        h.pipeline.handle(&reset_bytes(), h.at(10));
        assert!(h.asked().is_empty());
        h.pipeline.release_held(h.at(20));
        assert!(h.sent().is_empty(), "no answer yet, not timed out");
        h.index.send(index_with_pod()).unwrap();
        h.pipeline.release_held(h.at(40));
        let sent = h.sent();
        assert_eq!(sent.len(), 2);
        assert!(sent.iter().all(|e| e.who.pod == "web-1"), "{sent:?}");
    }

    #[test]
    fn an_index_is_applied_once_the_series_of_the_pods_it_forgot_are_gone() {
        let mut h = harness();
        let applied = h.pipeline.applied.subscribe();
        let mut index = Arc::into_inner(index_with_pod()).expect("its one owner");
        index.named_pods.insert(("shop".into(), "web-1".into()));
        h.index.send(Arc::new(index)).unwrap();
        h.pipeline.release_held(h.at(0));
        let counter = kstall_common::counter::Counter { events: 3, emitted: 1 };
        let count = tcp_reset::decode_count(&redirected_count_key(), &counter, &Default::default()).unwrap();
        let payload = Payload::TcpResetCount(count);
        let counted =
            Counted { probe: tcp_reset::NAME, netns: NETNS, cgroup_id: 0, comm: String::new(), payload };
        h.pipeline.count(Drained { counts: vec![counted], ..Default::default() }, h.at(1));
        let series = |h: &Harness| h.pipeline.metrics.families().iter().map(|f| f.series).sum::<usize>();
        assert_eq!(series(&h), 1);
        assert!(applied.borrow().named_pods.contains(&("shop".into(), "web-1".into())));
        // The pod past retention: the resolver's index no longer names it.
        h.index.send(Arc::new(Index::default())).unwrap();
        assert!(!applied.borrow().named_pods.is_empty(), "not applied until the pipeline runs");
        h.pipeline.release_held(h.at(2));
        assert!(applied.borrow().named_pods.is_empty());
        assert_eq!(series(&h), 0, "applied with its series gone");
    }

    #[test]
    fn without_an_answer_it_goes_out_unattributed_after_the_hold_and_is_not_held_again() {
        let mut h = harness();
        h.pipeline.handle(&reset_bytes(), h.at(0));
        h.pipeline.release_held(h.at(99));
        assert!(h.sent().is_empty());
        h.pipeline.release_held(h.at(100));
        let sent = h.sent();
        assert_eq!(sent.len(), 1);
        assert!(sent[0].unattributed(), "{sent:?}");
        // Until the next walk, the same namespace is neither held nor asked again.
        h.pipeline.handle(&reset_bytes(), h.at(150));
        assert_eq!(h.sent().len(), 1);
        assert_eq!(h.asked(), [Key::Netns(NETNS)], "asked once, by the first event");
        // A new index (the next walk) without the namespace: it is worth asking again.
        h.index.send(Arc::new(Index::default())).unwrap();
        h.pipeline.release_held(h.at(160));
        h.pipeline.handle(&reset_bytes(), h.at(170));
        assert!(h.sent().is_empty(), "held again");
        assert_eq!(h.asked(), [Key::Netns(NETNS)]);
        assert!(
            h.pipeline.metrics.render().contains(r#"kstall_events_unattributed_total{probe="tcp-reset"} 2"#)
        );
    }

    #[test]
    fn a_known_netns_goes_out_at_once_in_order() {
        let mut h = harness();
        h.index.send(index_with_pod()).unwrap();
        h.pipeline.release_held(h.at(0));
        h.pipeline.handle(&reset_bytes(), h.at(1));
        h.pipeline.handle(&reset_bytes(), h.at(2));
        assert_eq!(h.sent().len(), 2);
        assert!(h.asked().is_empty());
    }

    #[test]
    fn a_full_miss_queue_is_counted_and_the_event_still_waits() {
        let mut h = harness();
        for netns in 0..20u32 {
            let mut raw = redirected_syn_reset();
            raw.header.netns_ino = 5000 + netns;
            h.pipeline.handle(&bytes_of(&raw), h.at(0));
        }
        assert_eq!(h.asked().len(), 16, "the queue's capacity");
        assert!(
            h.pipeline.metrics.render().contains(r#"kstall_attribution_queue_full_total{queue="misses"} 4"#),
            "{}",
            h.pipeline.metrics.render()
        );
        h.pipeline.release_held(h.at(100));
        assert_eq!(h.sent().len(), 20, "every event out after the hold");
    }

    /// The index of a node whose kubelet lists pod `u1` (`batch/hog`) with the containers in
    /// `listed` (id -> name).
    fn index_listing(listed: &[(&str, &str)]) -> Arc<Index> {
        let meta = crate::attribution::pods::PodMeta {
            uid: POD_UID.into(),
            name: "hog".into(),
            namespace: "batch".into(),
            workload: String::new(),
            node: "node-a".into(),
            labels: Default::default(),
            host_network: false,
            ips: Vec::new(),
            containers: listed.iter().map(|(id, name)| (id.to_string(), name.to_string())).collect(),
            deletion_deadline_unix_secs: None,
            state: Default::default(),
            mesh: None,
        };
        let mut index = Index { metadata_source: true, ..Index::default() };
        index.pod_meta.insert(POD_UID.into(), (Arc::new(meta), false));
        index.named_pods.insert(("batch".into(), "hog".into()));
        Arc::new(index)
    }

    const POD_UID: &str = "0b5e7b7e-7d45-4a8e-9c1e-2f4f1c0c9a11";

    /// A kill of `dd` in container `id` of pod `u1`, whose cgroup (`cgroup_id`) no walk ever saw.
    fn kill_in_container(id: &str) -> Vec<u8> {
        use crate::probes::oom::tests::{victim_event, with_memcg_path};
        let mut kill = victim_event();
        kill.header.cgroup_id = 31337;
        kill.flags |= kstall_common::oom::FLAG_FROM_OOM_CONTROL | kstall_common::oom::FLAG_MEMCG_OOM;
        kill.header.comm = *b"dd\0\0\0\0\0\0\0\0\0\0\0\0\0\0";
        let pod = format!("pod{POD_UID}");
        bytes_of(&with_memcg_path(kill, &[id, &pod, "burstable", "kubepods"]))
    }

    fn dd_count(kills: u64) -> Drained {
        use kstall_common::{counter::Counter, oom::OomCountKey};
        let mut key = OomCountKey { cgroup_id: 31337, ..Default::default() };
        key.comm[..2].copy_from_slice(b"dd");
        let counted = crate::probes::oom::decode_count(&key, &Counter { events: kills, emitted: kills });
        Drained { counts: vec![counted.counted(&Default::default())], ..Default::default() }
    }

    #[test]
    fn a_container_killed_as_it_started_waits_for_its_name_and_its_count_waits_behind_it() {
        let id = "c0ffee".repeat(10) + "c0ff";
        let mut h = harness();
        h.index.send(index_listing(&[("previous", "hog")])).unwrap();
        h.pipeline.release_held(h.at(0));
        h.pipeline.handle(&kill_in_container(&id), h.at(1));
        assert!(h.sent().is_empty(), "the status does not list the new container yet");
        assert!(matches!(h.asked()[..], [Key::ContainerName(_)]));
        // The kernel's count of the key arrives before the status: it waits behind its kill.
        h.pipeline.count(dd_count(1), h.at(5_000));
        h.pipeline.release_held(h.at(6_000));
        assert!(h.sent().is_empty());
        // The kubelet writes the status.
        h.index.send(index_listing(&[("previous", "hog"), (&id, "hog")])).unwrap();
        h.pipeline.release_held(h.at(7_000));
        let sent = h.sent();
        assert_eq!(sent.len(), 1, "the kill; the count had nothing suppressed: {sent:#?}");
        let who = &sent[0].who;
        assert_eq!(
            (who.namespace.as_str(), who.pod.as_str(), who.container.as_str()),
            ("batch", "hog", "hog")
        );
        let text = h.pipeline.metrics.render();
        assert!(text.contains(r#"kstall_oom_kills_total{comm="dd",container="hog",critical="false",host="false",namespace="batch",pod="hog",scope="memcg",workload=""} 1"#), "{text}");
    }

    #[test]
    fn a_container_never_listed_goes_out_with_its_pod_after_the_wait() {
        let id = "c0ffee".repeat(10) + "c0ff";
        let mut h = harness();
        h.index.send(index_listing(&[])).unwrap();
        h.pipeline.release_held(h.at(0));
        h.pipeline.handle(&kill_in_container(&id), h.at(1));
        h.pipeline.release_held(h.at(9_000));
        assert!(h.sent().is_empty(), "waits up to 10 s");
        h.pipeline.release_held(h.at(10_001));
        let sent = h.sent();
        assert_eq!(sent.len(), 1);
        let who = &sent[0].who;
        assert_eq!((who.pod.as_str(), who.container.as_str()), ("hog", ""));
        assert_eq!(who.container_id.as_deref(), Some(id.as_str()));
    }

    #[test]
    fn an_oom_count_takes_the_scope_its_events_showed_and_is_the_metric() {
        use kstall_common::{
            counter::Counter,
            oom::{FLAG_FROM_OOM_CONTROL, FLAG_MEMCG_OOM, OomCountKey},
        };

        use crate::probes::oom::{decode_count, tests::victim_event};
        const CGROUP: u64 = 900;
        let mut h = harness();
        let mut index = Index::default();
        let who = Attribution { namespace: "batch".into(), pod: "report-1".into(), ..Default::default() };
        index.by_cgroup.insert(CGROUP, Arc::new(who));
        h.index.send(Arc::new(index)).unwrap();
        h.pipeline.release_held(h.at(0));
        // A kill sent in full, from the hook that knows the scope.
        let mut kill = victim_event();
        kill.header.cgroup_id = CGROUP;
        kill.flags |= FLAG_FROM_OOM_CONTROL | FLAG_MEMCG_OOM;
        h.pipeline.handle(&bytes_of(&kill), h.at(1));
        let counted = |text: &str| text.lines().filter(|l| l.starts_with("kstall_oom_kills_total{")).count();
        assert_eq!(counted(&h.pipeline.metrics.render()), 0, "events are the detail, not the count");
        // Its key's count, from a hook that does not know it (mark_victim), and a key never seen.
        let key = |cgroup_id, comm: &[u8]| {
            let mut key = OomCountKey { cgroup_id, ..Default::default() };
            key.comm[..comm.len()].copy_from_slice(comm);
            key
        };
        let decoding = Default::default();
        let drained = Drained {
            counts: vec![
                decode_count(&key(CGROUP, b"python3"), &Counter { events: 40, emitted: 32 })
                    .counted(&decoding),
                decode_count(&key(CGROUP, b"java"), &Counter { events: 1, emitted: 1 }).counted(&decoding),
            ],
            ..Default::default()
        };
        h.pipeline.count(drained, h.at(1000));
        let text = h.pipeline.metrics.render();
        assert!(text.contains(r#"kstall_oom_kills_total{comm="python3",container="",critical="false",host="false",namespace="batch",pod="report-1",scope="memcg",workload=""} 40"#), "{text}");
        assert!(text.contains(r#"comm="java",container="",critical="false",host="false",namespace="batch",pod="report-1",scope="unknown""#), "{text}");
        // The event, then only the count with events not shown.
        let sent = h.sent();
        assert_eq!(sent.len(), 2, "{sent:#?}");
        assert!(
            matches!(&sent[1].event.payload, Payload::OomKillCount(c) if c.suppressed == 8 && c.kills == 40)
        );
    }
}
