//! Incidents: the step people took by hand in ../shared/INCIDENTS.md — put the reset, the RPC
//! timeouts and the stuck task side by side, see one cause, and know the safe way out.
//!
//! Each signature ([`signatures`]) keeps its own per-key state from the attributed event stream
//! and says, when asked, what fires now ([`Finding`]). The [`engine`] turns findings into
//! incidents with stable ids, states (`firing` -> `resolved`) and links between them.

pub mod engine;
pub mod evaluator;
pub mod flags;
pub mod history;
pub mod keyed;
pub mod saved;
pub mod signatures;

use std::{sync::Arc, time::Duration};

use serde::{Deserialize, Serialize};

use crate::{
    attribution::{Attributed, Attribution, NodeMemory, pods::KubeletLoad},
    conntrack, kubelet, pressure,
    stuck::StuckSet,
};

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Severity {
    Warning,
    Critical,
}

impl Severity {
    pub fn as_str(self) -> &'static str {
        match self {
            Severity::Warning => "warning",
            Severity::Critical => "critical",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum State {
    Firing,
    Resolved,
}

/// The way out: the permanent fix, and the break-glass steps with the checks that make them safe,
/// filled with this incident's values.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Remediation {
    pub permanent: Vec<String>,
    pub break_glass: Vec<Step>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Step {
    pub description: String,
    /// A command to run on the node, as root.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub command: Option<String>,
}

impl Step {
    pub fn new(description: impl Into<String>, command: Option<String>) -> Self {
        Self { description: description.into(), command }
    }
}

/// What a signature says fires now, for one key (a pod's namespace, a server, the node).
#[derive(Debug, Clone)]
pub struct Finding {
    /// Stable for as long as the condition lasts: the incident's identity within its signature.
    pub key: String,
    pub severity: Severity,
    pub who: Arc<Attribution>,
    pub first_seen_unix_ns: u64,
    pub last_seen_unix_ns: u64,
    pub summary: String,
    /// Counts, ports, servers, stuck tasks: what made it.
    pub evidence: serde_json::Value,
    pub remediation: Remediation,
}

/// One incident as the API, metrics and alerts see it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Incident {
    /// `<signature>/<node>/<key>`: the same while it fires, and again if it fires anew.
    pub id: String,
    pub signature: String,
    pub severity: Severity,
    pub state: State,
    /// When the condition began: its first kernel signal (the first reset, error or kill, or
    /// when the longest-stuck task began to wait).
    pub first_seen_unix_ns: u64,
    /// When kstall fired it; less `first_seen_unix_ns`, its time to name. `None` only in a
    /// history written by a kstall that did not record it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fired_unix_ns: Option<u64>,
    pub last_seen_unix_ns: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub resolved_unix_ns: Option<u64>,
    pub node: String,
    pub namespace: String,
    pub pod: String,
    pub container: String,
    pub workload: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pod_uid: Option<String>,
    pub summary: String,
    pub evidence: serde_json::Value,
    pub remediation: Remediation,
    /// Other firing incidents that explain this one (a pod that cannot terminate because its
    /// NFS traffic is redirected).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub related: Vec<String>,
}

/// What the signatures read of the node when asked what fires, owned elsewhere: the stuck tasks,
/// the node's memory, the pods its kubelet carries, the kubelet's health checks and the connection
/// tracking tables.
pub struct NodeView<'a> {
    pub stuck: &'a StuckSet,
    pub memory: NodeMemory,
    pub kubelet_load: &'a KubeletLoad,
    pub kubelet: &'a kubelet::Health,
    /// The last sample of the connection tracking tables.
    pub conntrack: &'a conntrack::Tables,
    /// The last sample of pressure (PSI), the node's and the pods'.
    pub pressure: &'a pressure::Sample,
    /// Live pods by address: whose a forwarded packet was.
    pub pod_ips: &'a std::collections::HashMap<std::net::IpAddr, Arc<Attribution>>,
    /// The ports the node's NFS mounts name in their options.
    pub nfs_mount_ports: &'a std::collections::BTreeSet<u16>,
}

/// What a signature does with the event stream.
pub trait Signature: Send {
    fn name(&self) -> &'static str;
    /// Takes one attributed event; cheap, called on the event path. Signatures that only read
    /// the node ([`NodeView`]) take none.
    fn observe(&mut self, _event: &Attributed) {}
    /// What fires at `now`; forgets state older than its windows. Called once a second.
    fn evaluate(&mut self, now_unix_ns: u64, node: &NodeView) -> Vec<Finding>;
    /// Per-key states dropped because the signature's cap was reached.
    fn evicted(&self) -> u64;
}

/// Thresholds and windows, one set for all signatures; defaults from the incidents.
#[derive(Debug, Clone, PartialEq)]
pub struct Settings {
    /// Destination ports whose redirected, reset SYNs mean NFS traffic captured by a proxy.
    pub nfs_ports: Vec<u16>,
    /// Redirected NFS resets in `redirect_window` that fire `nfs-sidecar-redirect`.
    pub redirect_min_resets: u32,
    pub redirect_window: Duration,
    /// No resets (and no RPC timeouts) for this long resolves a redirect or unreachable server.
    pub quiet_window: Duration,
    /// A pod's task hung at least this long fires `pod-termination-blocked`.
    pub termination_blocked_after: Duration,
    /// The same container OOM-killed this often within `oom_loop_window`: `container-oom-loop`.
    pub oom_loop_count: u32,
    pub oom_loop_window: Duration,
    /// A system OOM incident stays firing this long after the last global OOM kill.
    pub system_oom_hold: Duration,
    /// Pods with tasks stuck in NFS at once that make `nfs-node-wide-stall`.
    pub node_wide_min_pods: u32,
    /// Pods waiting for an image that make `kubelet-degraded`.
    pub kubelet_image_pull_pods: u32,
    /// Pods this long past their deletion deadline are stuck Terminating ...
    pub kubelet_termination_overdue: Duration,
    /// ... and this many of them make `kubelet-degraded`.
    pub kubelet_stuck_terminating_pods: u32,
    /// A kubelet check failing this long makes `kubelet-degraded` (a restart takes seconds).
    pub kubelet_unhealthy_after: Duration,
    /// A client's NFS RPCs slower than this at the 99th percentile ...
    pub nfs_slow_threshold: Duration,
    /// ... for this long make `nfs-slow`.
    pub nfs_slow_for: Duration,
    /// A stuck CPU's incident stays firing this long after the kernel's last report of it.
    pub cpu_lockup_hold: Duration,
    /// Packets of a pod a firewall rule dropped within `policy_drops_window` that fire
    /// `network-policy-drops`.
    pub policy_drops_min: u32,
    pub policy_drops_window: Duration,
    /// A pod's (or the node's) tasks waiting for memory this share of the time (percent, PSI
    /// `some`) ...
    pub memory_pressure_some_percent: u32,
    /// ... for this long make `memory-pressure`.
    pub memory_pressure_for: Duration,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            nfs_ports: vec![2049, 111, 20048],
            redirect_min_resets: 2,
            redirect_window: Duration::from_secs(600),
            quiet_window: Duration::from_secs(60),
            termination_blocked_after: Duration::from_secs(60),
            oom_loop_count: 3,
            oom_loop_window: Duration::from_secs(3600),
            system_oom_hold: Duration::from_secs(600),
            node_wide_min_pods: 2,
            kubelet_image_pull_pods: 20,
            kubelet_termination_overdue: Duration::from_secs(300),
            kubelet_stuck_terminating_pods: 3,
            kubelet_unhealthy_after: Duration::from_secs(30),
            nfs_slow_threshold: Duration::from_millis(500),
            nfs_slow_for: Duration::from_secs(60),
            // The kernel repeats its report every 2 × watchdog_thresh (at most 120 s) while the
            // CPU stays stuck: longer than that, so a lasting lockup stays one incident.
            cpu_lockup_hold: Duration::from_secs(300),
            // A connect's SYN and its first four retransmissions take 15 s: one blocked connect
            // fires, one dropped datagram or probe does not.
            policy_drops_min: 5,
            policy_drops_window: Duration::from_secs(60),
            // A fifth of the time stalled is felt by users; a minute rules out a burst (a
            // container start, a cache dropped and refilled).
            memory_pressure_some_percent: 20,
            memory_pressure_for: Duration::from_secs(60),
        }
    }
}

impl Settings {
    /// One redirected reset is what a sidecar restart gives: no pattern.
    pub const MIN_REDIRECT_RESETS: u32 = 2;
    /// One OOM kill is not a loop.
    pub const MIN_OOM_LOOP_COUNT: u32 = 2;
    /// One pod's stuck tasks are `pod-termination-blocked`, not a node-wide stall.
    pub const MIN_NODE_WIDE_PODS: u32 = 2;
    /// A pod or two waiting for an image is a typo, not a pile.
    pub const MIN_KUBELET_IMAGE_PULL_PODS: u32 = 2;
    pub const MIN_KUBELET_STUCK_TERMINATING_PODS: u32 = 1;
    /// One dropped packet is no pattern.
    pub const MIN_POLICY_DROPS: u32 = 2;
    /// Under 1% of the time stalled is noise.
    pub const MIN_MEMORY_PRESSURE_PERCENT: u32 = 1;
}

/// Nanoseconds of a duration, for comparisons with event timestamps.
pub(crate) fn ns(d: Duration) -> u64 {
    d.as_nanos().min(u128::from(u64::MAX)) as u64
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A firing (or, given `resolved`, resolved) incident-1 incident for shop/web-1 on node-a.
    pub fn incident(resolved: Option<u64>) -> Incident {
        Incident {
            id: "nfs-sidecar-redirect/node-a/netns-1".into(),
            signature: "nfs-sidecar-redirect".into(),
            severity: Severity::Critical,
            state: if resolved.is_some() { State::Resolved } else { State::Firing },
            first_seen_unix_ns: 1_796_000_000_000_000_000,
            fired_unix_ns: Some(1_796_000_002_000_000_000),
            last_seen_unix_ns: 1_796_000_010_000_000_000,
            resolved_unix_ns: resolved,
            node: "node-a".into(),
            namespace: "shop".into(),
            pod: "web-1".into(),
            container: String::new(),
            workload: String::new(),
            pod_uid: None,
            summary: "redirected".into(),
            evidence: serde_json::Value::Null,
            remediation: Remediation::default(),
            related: vec![],
        }
    }
}
