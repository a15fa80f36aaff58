//! The agent's local API: a unix socket (mode 0600) speaking JSON lines. The client sends one
//! request line; the agent answers with one JSON document (`status`) or a stream (`events`,
//! `trace`): a `StreamStarted` line once the agent is subscribed, then one event per line, until
//! the client hangs up. `kstall status` and `kstall trace` are its clients.

pub mod explain;
pub mod filter;
pub mod http;
pub mod server;

use serde::{Deserialize, Serialize};

use crate::{attribution::pods::SourceHealth, incidents::Incident, probes::plan::ProbeStatus};

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(tag = "request", rename_all = "snake_case")]
pub enum Request {
    Status,
    /// Every decoded event as it arrives, unfiltered.
    Events,
    /// The events that match `filter` as they arrive (`kstall trace`), until the client hangs up.
    Trace {
        #[serde(default)]
        filter: filter::TraceFilter,
    },
    /// Firing incidents, then recently resolved ones: `{"incidents": [...]}`.
    Incidents,
    /// Everything known about one pod (name or UID): an `explain::PodExplanation`.
    ExplainPod {
        pod: String,
        #[serde(default)]
        namespace: Option<String>,
    },
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct IncidentsReport {
    pub incidents: Vec<Incident>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct StatusReport {
    pub version: String,
    pub kernel: String,
    pub uptime_secs: u64,
    pub probes: Vec<ProbeReport>,
    pub attribution: AttributionReport,
    /// The metric families about events: series now, the cap, new series refused.
    #[serde(default)]
    pub series: Vec<crate::export::series::FamilySeries>,
    /// The kubelet checks' last results, and where they go.
    #[serde(default)]
    pub kubelet: crate::kubelet::Health,
}

/// Where pod names come from and how much the agent knows.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct AttributionReport {
    #[serde(flatten)]
    pub source: SourceHealth,
    pub pods: usize,
    pub deleted_pods: usize,
    pub retention_secs: u64,
    pub cgroups: usize,
    pub pod_namespaces: usize,
    /// Processes found in pods' cgroup v1 hierarchies (nodes whose kubelet uses cgroup v1, where
    /// events are attributed by process).
    #[serde(default)]
    pub v1_pod_processes: usize,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ProbeReport {
    #[serde(flatten)]
    pub status: ProbeStatus,
    pub events: u64,
    pub lost: u64,
    /// Counted in the kernel, not sent in full (`--sample-events`).
    #[serde(default)]
    pub suppressed: u64,
}

/// The first line of an event stream: every event from here on reaches the client, so a client can
/// wait for it before causing what it wants to see.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct StreamStarted {
    pub subscribed: bool,
}

/// Sent instead of a document when a request is not understood.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ErrorReply {
    pub error: String,
}
