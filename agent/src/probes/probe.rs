//! What one probe is to the agent: the [`Probe`] trait each probe's agent half implements — what
//! it is and emits, how it plans its programs for the running kernel and decodes its records —
//! and what every probe shares: the decoding context ([`Decoding`]: facts about this kernel and
//! node, no probe's own) and the [`Completion`] of a probe whose work goes on after loading.
//! The registry (`probes::ALL`) lists the probes; loading, decoding, `kstall trace`, the filters
//! and attribution read them from there instead of naming probes.

use std::{
    collections::{BTreeMap, HashMap},
    sync::Arc,
    time::Duration,
};

use aya::Ebpf;
use kstall_common::EventHeader;

use super::{
    error::ProbeError,
    kind::EventKind,
    payload::Payload,
    plan::{Plan, ProbeStatus},
    settings::Settings,
};
use crate::{decode::DecodeError, kernel_btf::KernelBtf, symbols::Symbols};

pub trait Probe: Sync {
    /// Its name in `--probes`, `kstall status`, `kstall trace --probe` and the `probe` label.
    fn name(&self) -> &'static str;

    /// The record kind its kernel half writes (`kstall_common::kind`); it also indexes the
    /// kernel's per-kind loss counters.
    fn record_kind(&self) -> u32;

    /// Every kind of event it emits, records and the agent's own (counts, cleared tasks).
    fn events(&self) -> &'static [EventKind];

    /// The field of its records that is in jiffies, if any: the tick rate is measured for it, and
    /// its status says how (or that the field is unavailable).
    fn jiffies_field(&self) -> Option<&'static str> {
        None
    }

    /// Its programs for the running kernel, planned from BTF; what decoding will need (kernel
    /// enum names) goes into `decoding`.
    fn plan(
        &self,
        vmlinux: &KernelBtf,
        settings: &Settings,
        decoding: &mut Decoding,
    ) -> Result<Planned, ProbeError>;

    /// Its counters in the kernel (exact counts of the series its events are a sample of), taken
    /// from the loaded object; `None` when its kernel half counts nothing.
    fn counting(&self, _ebpf: &mut Ebpf) -> Result<Option<Box<dyn Counting>>, String> {
        Ok(None)
    }

    /// Whether its counts are keyed by task (cgroup and process name) and follow its events of
    /// the same key: a count is attributed as their last one was (on cgroup v1 only the event
    /// has the victim's process to find its pod by), waits behind one still held, and is settled
    /// by the last one ([`Probe::settle_count`]).
    fn counts_follow_events(&self) -> bool {
        false
    }

    /// One of its counts, given its key's last event: fills in what the counter key cannot carry.
    fn settle_count(&self, _count: &mut Payload, _last_event: &Payload) {}

    /// One of its ring-buffer records, whose header (already read) has its record kind.
    fn decode(
        &self,
        header: &EventHeader,
        record: &[u8],
        decoding: &Decoding,
    ) -> Result<Payload, DecodeError>;

    /// One event of each of its kinds, for the registry's generated test.
    #[cfg(test)]
    fn samples(&self) -> Vec<Payload>;
}

/// A probe planned for the running kernel.
pub struct Planned {
    /// Its programs, attached with the others; `None`: it attaches its own (in its completion).
    pub programs: Option<Plan>,
    /// What it does once the object is loaded, and later when a module it waits for loads.
    pub completion: Option<Box<dyn Completion>>,
}

impl From<Plan> for Planned {
    fn from(plan: Plan) -> Self {
        Self { programs: Some(plan), completion: None }
    }
}

/// The part of a probe that goes on after loading: a map its programs read to fill, programs in
/// kernel modules to attach when the modules load (sunrpc with the first NFS mount, nf_conntrack
/// with the first NAT rule), without a restart.
pub trait Completion: Send {
    /// Right after loading and attaching; `status` is the probe's, up or not. Marking it down
    /// unloads the programs it had attached.
    fn on_load(&mut self, ebpf: &mut Ebpf, status: &mut ProbeStatus);

    /// Whether it still waits for a kernel module (the module watcher runs while one does).
    fn waiting(&self) -> bool;

    /// A look for the modules it waits for: whether it changed `status`.
    fn on_modules(&mut self, ebpf: &mut Ebpf, status: &mut ProbeStatus) -> bool;

    /// The programs it attached itself, to detach at shutdown.
    fn attached(&self) -> Vec<&'static str> {
        Vec::new()
    }

    /// Its walks of every task, if it makes them, for the agent to run (taken once).
    fn take_task_sweeps(&mut self) -> Option<Box<dyn TaskSweeps>> {
        None
    }
}

/// A probe's walks of every task at an interval (an iterator program): it knows which stuck
/// tasks are still asleep, so the stuck set follows its sweeps instead of reading `/proc`
/// (`stuck::follow`).
pub trait TaskSweeps: Send {
    fn interval(&self) -> Duration;

    /// One walk of every task (blocking: run off the async runtime).
    fn sweep(&mut self) -> Result<Sweep, String>;
}

/// What one sweep did: the walk's own figures, exported as the agent's metrics, and the tasks it
/// found asleep uninterruptibly.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Sweep {
    pub tasks: u64,
    pub uninterruptible: u64,
    pub reported: u64,
    pub over_limit: u64,
    /// CPU time of the read that ran the walk: the sweep's cost in the kernel.
    pub kernel_cpu: Duration,
    /// (tgid, tid) of every task asleep uninterruptibly (idle kernel threads and frozen tasks
    /// aside), stuck for the threshold or not: a stuck task not among them ran or exited.
    pub asleep: Vec<(u32, u32)>,
}

/// One drain of one counter map.
#[derive(Debug, Clone, Copy)]
pub struct Turn {
    /// The generation to read and delete.
    pub generation: u8,
    /// Whether the programs inserted a key since the last drain (or it is unknown): if not, a map
    /// empty at its last walk is still empty.
    pub inserted: bool,
}

/// A probe's counters in the kernel, read back once per interval (`probes::counters` flips the
/// generation they count in).
pub trait Counting: Send {
    /// Reads and deletes its keys of the turn's generation into `drained`, with what its overflow
    /// counters gained since the last drain; stops at a failure, leaving the rest for the next.
    fn drain(&mut self, turn: Turn, decoding: &Decoding, drained: &mut Drained) -> Result<(), String>;
}

/// One interval's counts of every probe.
#[derive(Debug, Default)]
pub struct Drained {
    pub counts: Vec<Counted>,
    /// Events counted without a key (their map was full) that no count can carry, by probe:
    /// only counted as suppressed.
    pub uncounted: Vec<(&'static str, u64)>,
    /// Keys that could not be read back (a garbage key is counted, never a panic).
    pub errors: Vec<DecodeError>,
    /// A map operation that failed: what it left in the map is read the next time.
    pub failure: Option<String>,
}

/// One series' count, emitted as an event of its probe: attributed by its network namespace,
/// or by its cgroup and process name (then `netns` is 0), as its kind's subject says.
#[derive(Debug)]
pub struct Counted {
    pub probe: &'static str,
    pub netns: u32,
    pub cgroup_id: u64,
    pub comm: String,
    pub payload: Payload,
}

/// What decoding records needs beyond the records: facts about this kernel and node, shared by
/// every probe, built whole by `probes::load` (the symbols kept current by the agent).
#[derive(Clone)]
pub struct Decoding {
    pub symbols: Arc<Symbols>,
    pub clock: Clock,
    /// Kernel enums' value names, read from BTF for the probes that report enum values.
    pub enums: EnumNames,
    /// Process names whose death takes the node down (kubelet, the container runtime, ...).
    pub critical_comms: Arc<[String]>,
    pub agent_pid: u32,
    pub page_size: u64,
}

impl Default for Decoding {
    fn default() -> Self {
        Self {
            symbols: Arc::default(),
            clock: Clock::default(),
            enums: EnumNames::default(),
            critical_comms: super::settings::DEFAULT_CRITICAL_COMMS.iter().map(|s| s.to_string()).collect(),
            agent_pid: std::process::id(),
            // SAFETY: sysconf has no preconditions.
            page_size: u64::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).unwrap_or(4096),
        }
    }
}

/// Converts jiffies to seconds; the kernel's HZ is measured once at start (`kernel::tick_rate`).
#[derive(Debug, Clone, Copy, Default)]
pub struct Clock {
    pub hz: Option<u64>,
}

/// Kernel enums' value names (`SK_RST_REASON_NO_SOCKET` read as `NO_SOCKET`), by enum.
#[derive(Debug, Clone, Default)]
pub struct EnumNames(BTreeMap<&'static str, Arc<HashMap<u32, String>>>);

impl EnumNames {
    pub fn insert(&mut self, kernel_enum: &'static str, names: HashMap<u32, String>) {
        self.0.insert(kernel_enum, Arc::new(names));
    }

    /// The name of `value` in `kernel_enum`, or the number when BTF did not name it.
    pub fn name(&self, kernel_enum: &str, value: u32) -> String {
        self.0
            .get(kernel_enum)
            .and_then(|names| names.get(&value))
            .cloned()
            .unwrap_or_else(|| value.to_string())
    }

    pub fn extend(&mut self, other: EnumNames) {
        self.0.extend(other.0);
    }

    pub fn has(&self, kernel_enum: &str) -> bool {
        self.0.get(kernel_enum).is_some_and(|names| !names.is_empty())
    }
}
