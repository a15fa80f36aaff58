//! The agent's local API: a unix socket (mode 0600) speaking JSON lines. The client sends one
//! request line; the agent answers with one JSON document (`status`) or a stream (`events`,
//! `trace`): a `StreamStarted` line once the agent is subscribed, then one event per line, until
//! the client hangs up. `kstall status` and `kstall trace` are its clients.

pub mod captures;
pub mod explain;
pub mod filter;
pub mod http;
pub mod nfs_mesh;
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
    /// Starts capturing a pod's network namespace, a namespace by inode (or `host`), or an
    /// incident's pod — one of the three: `{"capture": Info}`, refused in one line (`{"error":
    /// …}`). With `wait`, a second `{"capture": Info}` when it has ended.
    CaptureStart {
        #[serde(default)]
        pod: Option<String>,
        #[serde(default)]
        namespace: Option<String>,
        #[serde(default)]
        netns: Option<String>,
        #[serde(default)]
        incident: Option<String>,
        #[serde(default)]
        filter: Option<String>,
        #[serde(default)]
        duration_secs: Option<u64>,
        #[serde(default)]
        max_bytes: Option<u64>,
        #[serde(default)]
        max_packets: Option<u64>,
        #[serde(default)]
        snaplen: Option<String>,
        #[serde(default)]
        wait: bool,
    },
    /// The captures kept, failed and running: `{"captures": [...]}`.
    Captures,
    /// A finished capture's bundle: one line `{"capture": Info}` (its summary with `bytes` and
    /// `sha256`), then exactly `bytes` raw bytes of the `.tar.gz`.
    CaptureGet {
        id: String,
    },
    /// Ends a running capture early (its bundle is kept, cut): `{"capture": Info}`.
    CaptureStop {
        id: String,
    },
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct IncidentsReport {
    pub incidents: Vec<Incident>,
}

impl IncidentsReport {
    /// One line per incident (firing ones, and resolved ones with `all`), its fields separated by
    /// tabs: node, state, severity, signature, who (`namespace/pod` or `node`), since (RFC 3339),
    /// summary. No header: a table across nodes puts the rows of every node under one.
    pub fn tsv(&self, all: bool, now_unix_ns: u64) -> String {
        let field = |text: &str| text.replace(['\t', '\n', '\r'], " ");
        let mut out = String::new();
        for i in self.incidents.iter().filter(|i| all || i.state == crate::incidents::State::Firing) {
            let who =
                if i.pod.is_empty() { "node".to_string() } else { format!("{}/{}", i.namespace, i.pod) };
            let since = jiff::Timestamp::from_nanosecond(i128::from(i.first_seen_unix_ns))
                .map(|t| t.strftime("%Y-%m-%dT%H:%M:%SZ").to_string())
                .unwrap_or_default();
            let state = match i.state {
                crate::incidents::State::Firing => "firing".to_string(),
                crate::incidents::State::Resolved => {
                    let ago =
                        now_unix_ns.saturating_sub(i.resolved_unix_ns.unwrap_or(now_unix_ns)) / 1_000_000_000;
                    format!("resolved {} ago", crate::incidents::signatures::human_secs(ago))
                }
            };
            out.push_str(&format!(
                "{}\t{state}\t{}\t{}\t{}\t{since}\t{}\n",
                field(&i.node),
                i.severity.as_str(),
                i.signature,
                field(&who),
                field(&i.summary)
            ));
        }
        out
    }
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
    /// What the node's samplers read, or why they cannot.
    #[serde(default)]
    pub node: NodeSignals,
    /// What the agent's programs cost, as the kernel counts it, or why it does not.
    #[serde(default)]
    pub cost: AgentCost,
}

/// The agent's own cost as the kernel counts it: its programs' runs and time, the ring buffer's
/// fill, each one line.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct AgentCost {
    pub programs: String,
    pub ring_buffer: String,
}

impl AgentCost {
    pub fn of(counts: &crate::events::Counts) -> Self {
        let programs = counts.programs();
        let (runs, ns) = programs.iter().fold((0u64, 0u64), |(r, n), (_, p)| (r + p.count, n + p.run_ns));
        let counted = format!("{runs} runs, {:.1} ms in all", ns as f64 / 1e6);
        let held = counts.run_time_stats_held();
        let programs = match (held, crate::probes::runs::run_time_stats_enabled()) {
            (true, _) => format!("counted (--program-stats on, while the agent runs): {counted}"),
            (false, Some(true)) => format!("counted (kernel.bpf_stats_enabled=1): {counted}"),
            (false, Some(false)) => "not counted: kernel.bpf_stats_enabled=0 (--program-stats on counts \
                                     them while the agent runs, ~20 ns a run)"
                .to_string(),
            (false, None) => "not known: /proc/sys/kernel/bpf_stats_enabled is unreadable".to_string(),
        };
        let kib = |b: u64| b as f64 / 1024.0;
        let ring_buffer = match (counts.ring_size(), counts.ring_fill()) {
            (0, _) => "fill not read (no ring buffer mapped)".to_string(),
            (size, (used, most)) => format!(
                "{:.1} KiB of {:.0} KiB unread when the reader last woke; the most, {:.1} KiB",
                kib(used),
                kib(size),
                kib(most)
            ),
        };
        Self { programs, ring_buffer }
    }
}

/// The samplers of the node: the connection tracking tables and pressure (PSI), each as one line
/// saying what is read or what is unavailable and why.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct NodeSignals {
    pub conntrack: String,
    pub pressure: String,
}

impl NodeSignals {
    pub fn of(conntrack: &crate::conntrack::Tables, pressure: &crate::pressure::Sample) -> Self {
        let conntrack = match (conntrack.sample, conntrack.max) {
            (0, _) => "not read yet".to_string(),
            (_, None) => "unavailable: nf_conntrack is not loaded (no table to fill)".to_string(),
            (_, Some(max)) => {
                let pods = conntrack.tables.iter().filter(|t| !t.who.host).count();
                let n = conntrack.tables.len();
                let tables = if n == 1 { "table" } else { "tables" };
                format!("nf_conntrack_max {max}; {n} {tables} read (the node's and {pods} pods')")
            }
        };
        let pressure = match (pressure.sample, &pressure.node, pressure.pods_readable) {
            (0, _, _) => "not read yet".to_string(),
            (_, None, _) => {
                "unavailable: no /proc/pressure (a kernel without PSI, or booted with psi=0)".to_string()
            }
            (_, Some(_), false) => {
                "the node's; pods' unavailable: no cgroup v2 hierarchy (PSI is kept per cgroup v2)"
                    .to_string()
            }
            (_, Some(_), true) => format!("the node's and {} pods' (cgroup v2)", pressure.pods.len()),
        };
        Self { conntrack, pressure }
    }
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

#[cfg(test)]
mod tests {
    #[test]
    fn incidents_as_rows_one_each_tab_separated_firing_unless_all() {
        let mut resolved = crate::incidents::tests::incident(Some(1_796_000_060_000_000_000));
        resolved.pod = String::new();
        resolved.summary = "two\tlines\nof it".into();
        let firing = crate::incidents::tests::incident(None);
        let report = IncidentsReport { incidents: vec![firing, resolved] };
        let now = 1_796_000_120_000_000_000;
        let firing_row =
            "node-a\tfiring\tcritical\tnfs-sidecar-redirect\tshop/web-1\t2026-11-30T00:53:20Z\tredirected\n";
        assert_eq!(report.tsv(false, now), firing_row);
        let all = report.tsv(true, now);
        assert_eq!(
            all.lines().nth(1),
            Some(
                "node-a\tresolved 60 s ago\tcritical\tnfs-sidecar-redirect\tnode\t2026-11-30T00:53:20Z\ttwo lines of it"
            )
        );
    }

    #[test]
    fn the_cost_says_what_counts_it_and_how_full_the_ring_was() {
        let counts = crate::events::Counts::default();
        assert_eq!(AgentCost::of(&counts).ring_buffer, "fill not read (no ring buffer mapped)");
        counts.set_ring_size(1 << 20);
        counts.ring_used(300 << 10);
        counts.ring_used(2048);
        let cost = AgentCost::of(&counts);
        assert_eq!(
            cost.ring_buffer,
            "2.0 KiB of 1024 KiB unread when the reader last woke; the most, 300.0 KiB"
        );
        counts.hold_run_time_stats();
        let runs = crate::probes::runs::Runs { count: 10, run_ns: 2_500_000, missed: None };
        counts.set_runs("a", runs);
        counts.set_runs("b", runs);
        let held = "counted (--program-stats on, while the agent runs): 20 runs, 5.0 ms in all";
        assert_eq!(AgentCost::of(&counts).programs, held);
    }

    use super::*;
    use crate::{
        attribution::Attribution,
        conntrack::{Counters, Table, Tables},
        pressure::Sample,
    };

    #[test]
    fn the_samplers_say_what_they_read_or_why_not() {
        let (none, unread) = (Tables::default(), Sample::default());
        assert_eq!(NodeSignals::of(&none, &unread).conntrack, "not read yet");
        let host = std::sync::Arc::new(Attribution { host: true, ..Default::default() });
        let table =
            Table { netns: 1, who: host, counters: Counters::default(), refused: 0, early_dropped: 0 };
        let read = Tables { sample: 3, at_unix_ns: 1, max: Some(65536), tables: vec![table] };
        let no_module = Tables { max: None, ..read.clone() };
        let no_psi = Sample { sample: 3, ..Sample::default() };
        let v1_only = Sample { node: Some(Default::default()), ..no_psi.clone() };
        let v2 = Sample { pods_readable: true, ..v1_only.clone() };
        assert_eq!(
            NodeSignals::of(&read, &v2).conntrack,
            "nf_conntrack_max 65536; 1 table read (the node's and 0 pods')"
        );
        assert!(
            NodeSignals::of(&no_module, &v2).conntrack.starts_with("unavailable: nf_conntrack is not loaded")
        );
        assert!(NodeSignals::of(&read, &no_psi).pressure.starts_with("unavailable: no /proc/pressure"));
        assert!(
            NodeSignals::of(&read, &v1_only).pressure.contains("pods' unavailable: no cgroup v2 hierarchy")
        );
        assert_eq!(NodeSignals::of(&read, &v2).pressure, "the node's and 0 pods' (cgroup v2)");
    }
}
