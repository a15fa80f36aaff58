//! The running agent's state that the API and `/metrics` answer from (`api/`), each piece held
//! once and shared here by its writer: probe statuses (the module watcher), the stuck-task set (the
//! pipeline), the incident engine (the pipeline and the evaluator), the attribution index (the
//! resolver), the event broadcast (the pipeline), the captures (their own threads).

use std::{
    sync::{Arc, Mutex, MutexGuard, PoisonError},
    time::{Duration, Instant},
};

use tokio::sync::{broadcast, watch};

use crate::{
    attribution::{Attributed, Index, pods::Health},
    events::Counts,
    export::metrics::Metrics,
    incidents::engine::Engine,
    probes::plan::ProbeStatus,
    stuck::StuckSet,
};

pub struct AgentState {
    pub started: Instant,
    pub kernel: String,
    /// The probes' statuses: the one copy, updated when a module a probe waits for appears
    /// (`probes::watch_modules`).
    pub probes: Arc<Mutex<Vec<ProbeStatus>>>,
    pub metrics: Arc<Metrics>,
    /// Records received and lost per probe.
    pub counts: Arc<Counts>,
    pub events: broadcast::Sender<Arc<Attributed>>,
    pub attribution: watch::Receiver<Arc<Index>>,
    pub pod_source: Health,
    pub retention: Duration,
    pub incidents: Arc<Mutex<Engine>>,
    pub stuck: Arc<Mutex<StuckSet>>,
    pub kubelet: watch::Receiver<crate::kubelet::Health>,
    pub conntrack: watch::Receiver<Arc<crate::conntrack::Tables>>,
    pub pressure: watch::Receiver<Arc<crate::pressure::Sample>>,
    /// The ports NFS uses (`--nfs-ports`): what `explain pod` checks a meshed pod's rules for.
    pub nfs_ports: Vec<u16>,
    /// The captures (`kstall capture`), or the one line saying why there are none.
    pub captures: Result<Arc<crate::capture::service::Captures>, String>,
}

/// A lock that survives a panic elsewhere while it was held: a bug in one signature must not take
/// the event path and the API down with it.
pub fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}
