//! The metric catalogue: every metric the agent exports, with its help, labels and scope. Not for
//! the kernel: the agent builds its metrics from it (`agent/src/export/metrics.rs`), a probe's
//! event kinds name the families they feed from it, and the dashboard generator
//! (`xtask/src/dashboards.rs`) filters each query by its metric's scope from it. One list, so a
//! name cannot drift between them.

/// Labels every metric about events carries after its own: whose event it was.
pub const POD_LABELS: [&str; 5] = ["namespace", "pod", "container", "workload", "host"];

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Type {
    Counter,
    Gauge,
    Histogram,
}

/// Which of the dashboards' variables select its series.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    /// `node` only: the agent's own metrics and the node-wide gauges.
    Node,
    /// `node`, `namespace` and `pod`: the metrics about events (they carry [`POD_LABELS`]).
    Pod,
    /// As `Pod`, and the node's own incidents (no pod: a node-wide stall, a system OOM) with any
    /// pod selected: they are every pod's on the node.
    Incident,
}

#[derive(Debug, PartialEq, Eq)]
pub struct Metric {
    pub name: &'static str,
    pub help: &'static str,
    pub kind: Type,
    /// Its own labels; a `Pod`-scoped metric carries [`POD_LABELS`] after them.
    pub labels: &'static [&'static str],
    pub scope: Scope,
}

impl Metric {
    /// Whether it carries [`POD_LABELS`] after its own.
    pub const fn has_pod_labels(&self) -> bool {
        matches!(self.scope, Scope::Pod)
    }
}

const fn node(name: &'static str, kind: Type, labels: &'static [&'static str], help: &'static str) -> Metric {
    Metric { name, help, kind, labels, scope: Scope::Node }
}

const fn pod(name: &'static str, kind: Type, labels: &'static [&'static str], help: &'static str) -> Metric {
    Metric { name, help, kind, labels, scope: Scope::Pod }
}

use Type::{Counter, Gauge, Histogram};

// The families about events (pod labels, capped by the series book).

pub const TCP_RESETS: Metric = pod(
    "kstall_tcp_resets_total",
    Counter,
    &["direction", "port", "original_port", "reason"],
    "TCP resets. port: the refusing local port (sent) or the remote port (received); original_port: \
     pre-NAT destination port of a redirected connection, empty otherwise.",
);
pub const PACKET_DROPS: Metric = pod(
    "kstall_packet_drops_total",
    Counter,
    &["reason", "protocol", "direction", "port"],
    "Packets the kernel dropped, by its drop reason (NETFILTER_DROP: a firewall rule or conntrack; the \
     kernel's enum names, per kernel), protocol, direction (egress: sent by the pod's sockets; \
     ingress: arriving) and destination port (by number for well-known ports, else ephemeral or \
     other; empty without ports).",
);
pub const STUCK_TASKS_TOTAL: Metric = pod(
    "kstall_stuck_tasks_total",
    Counter,
    &["wait", "kind", "source"],
    "Tasks newly stuck (a task counts once however long it stays stuck), by wait class, kind and the \
     probe that found it first: stuck-task (the sampler) or hung-task (the kernel's detector).",
);
pub const CPU_LOCKUPS: Metric = pod(
    "kstall_cpu_lockups_total",
    Counter,
    &["detector", "wait"],
    "Reports of a stuck CPU by the kernel's detectors, attributed to the task that ran there. \
     detector: soft_lockup (the watchdog: no other task ran for 2 x kernel.watchdog_thresh) or \
     rcu_stall; wait: where the task's kernel stack spins (nfs: in the NFS client).",
);
pub const OOM_KILLS: Metric = pod(
    "kstall_oom_kills_total",
    Counter,
    &["scope", "comm", "critical"],
    "OOM kills. scope: memcg (a cgroup limit), global (the node ran out) or unknown; critical: the \
     victim is node-critical (kubelet, container runtime, ...).",
);
pub const NFS_RETRANSMITS: Metric = pod(
    "kstall_nfs_rpc_retransmits_total",
    Counter,
    &["server"],
    "RPC requests retransmitted to an NFS/RPC server.",
);
pub const NFS_TIMEOUTS: Metric = pod(
    "kstall_nfs_rpc_timeouts_total",
    Counter,
    &["server"],
    "Major RPC timeouts (\"server not responding\").",
);
pub const NFS_CONNECT_ERRORS: Metric = pod(
    "kstall_nfs_connect_errors_total",
    Counter,
    &["server", "error"],
    "Failed connects, socket errors and connection resets of RPC transports, by errno.",
);
pub const NFS_STATE_MANAGER_FAILURES: Metric = pod(
    "kstall_nfs_state_manager_failures_total",
    Counter,
    &["server", "section"],
    "NFSv4 state recovery failures (nfs4_state_mgr_failed), by section.",
);
pub const NFS_SERVER_RESPONDING: Metric = pod(
    "kstall_nfs_server_responding",
    Gauge,
    &["server"],
    "0 after a major RPC timeout to the server (the kernel's \"server not responding\"), 1 again once \
     a reply arrives (\"server OK\").",
);
pub const NFS_RPC_DURATION: Metric = pod(
    "kstall_nfs_rpc_duration_seconds",
    Histogram,
    &["server", "operation"],
    "NFS RPCs by how long their caller waited for them (queued, sent and answered), by server and \
     procedure; the pod is the one whose task started the RPC.",
);

// Stuck tasks now and when they ended.

pub const STUCK_TASKS: Metric = pod(
    "kstall_stuck_tasks",
    Gauge,
    &["wait", "kind"],
    "Tasks stuck in uninterruptible sleep now, by wait class, kind (uninterruptible, or killable: the \
     sleeps the kernel's hung-task detector skips) and pod (a series exists only while a task is \
     stuck).",
);
pub const STUCK_TASK_LONGEST_BLOCKED: Metric = node(
    "kstall_stuck_task_longest_blocked_seconds",
    Gauge,
    &[],
    "Longest time any currently stuck task has been blocked.",
);
pub const STUCK_TASK_BLOCKED: Metric = node(
    "kstall_stuck_task_blocked_seconds",
    Histogram,
    &["wait", "kind"],
    "How long stuck tasks were blocked, observed when they ran again or exited, by wait class and kind.",
);
pub const STUCK_TASKS_UNTRACKED: Metric = node(
    "kstall_stuck_tasks_untracked_total",
    Counter,
    &[],
    "Reports of stuck tasks not kept because 10,000 tasks were stuck already (the node is on fire; the \
     first 10,000 are reported).",
);
pub const STUCK_TASK_SWEEPS: Metric =
    node("kstall_stuck_task_sweeps_total", Counter, &[], "Sweeps of every task by the stuck-task sampler.");
pub const STUCK_TASK_SWEEP_FAILURES: Metric = node(
    "kstall_stuck_task_sweep_failures_total",
    Counter,
    &[],
    "Sweeps that could not run (the agent's log says why).",
);
pub const STUCK_TASK_SWEEP_KERNEL_SECONDS: Metric = node(
    "kstall_stuck_task_sweep_kernel_seconds",
    Histogram,
    &[],
    "CPU time of each sweep, spent in the kernel walking the tasks.",
);
pub const STUCK_TASK_SWEEP_TASKS: Metric =
    node("kstall_stuck_task_sweep_tasks", Gauge, &[], "Tasks the last sweep walked.");
pub const STUCK_TASK_SWEEP_UNINTERRUPTIBLE: Metric = node(
    "kstall_stuck_task_sweep_uninterruptible",
    Gauge,
    &[],
    "Tasks the last sweep found asleep uninterruptibly, stuck or not (idle kernel threads and frozen \
     tasks not counted).",
);
pub const STUCK_TASK_REPORTS_OVER_LIMIT: Metric = node(
    "kstall_stuck_task_reports_over_limit_total",
    Counter,
    &[],
    "Stuck tasks a sweep did not report because it had reported --stuck-task-max-reports already (a \
     later sweep reports them).",
);

// Incidents and what was done with them.

pub const INCIDENT_ACTIVE: Metric = Metric {
    name: "kstall_incident_active",
    help: "1 while an incident of this signature fires for this pod (workload: its owner, Kind/name).",
    kind: Gauge,
    labels: &["signature", "severity", "node", "namespace", "pod", "workload"],
    scope: Scope::Incident,
};
pub const INCIDENTS: Metric = node(
    "kstall_incidents_total",
    Counter,
    &["signature", "severity"],
    "Incidents that started firing, by signature and severity.",
);
pub const INCIDENT_STATE_EVICTIONS: Metric = node(
    "kstall_incident_state_evictions_total",
    Counter,
    &["signature"],
    "Per-key incident state dropped because a signature's cap was reached.",
);
pub const ALERTMANAGER_POSTS: Metric = node(
    "kstall_alertmanager_posts_total",
    Counter,
    &["url", "result"],
    "Pushes of incidents to an Alertmanager (--alertmanager-url), by result.",
);
pub const STATE_WRITES: Metric = node(
    "kstall_state_writes_total",
    Counter,
    &["result"],
    "Writes of the incident history to the state directory (--state-dir), by result: ok, error (the \
     agent's log says why; the history then does not survive a restart).",
);
pub const CAPTURES: Metric = node(
    "kstall_captures_total",
    Counter,
    &["trigger", "result"],
    "Captures (kstall capture) that ended, by what asked for them (manual: kstall capture start; \
     incident: --capture-on) and result: complete (a bundle kept), failed (none: its entry in kstall \
     capture list says why).",
);
pub const CAPTURES_RUNNING: Metric = node(
    "kstall_captures_running",
    Gauge,
    &[],
    "Captures running now (at most --capture-running); while none runs, the agent holds no packet socket.",
);
pub const KUBERNETES_WRITES: Metric = node(
    "kstall_kubernetes_writes_total",
    Counter,
    &["kind", "result"],
    "Writes to the Kubernetes API (kind=\"event\": Events on pods and nodes; \"node_condition\": the \
     Node's status; \"node_taint\": its taints), by result: created, patched (a repeat counted), forbidden, conflict, not_found, \
     server_error, rejected, unreachable, dropped (the writer's queue was full).",
);

// The node.

pub const NODE_MEMORY_LIMIT_OVERCOMMIT: Metric = node(
    "kstall_node_memory_limit_overcommit_ratio",
    Gauge,
    &[],
    "Sum of the pods' memory limits (pod cgroups; pods without a limit add nothing) over the node's \
     memory (MemTotal). Above 1, the limits cannot all be honoured: a system OOM is possible.",
);
pub const POD_METADATA_UP: Metric = node(
    "kstall_pod_metadata_up",
    Gauge,
    &[],
    "1 while the pod metadata source (Kubernetes API, pods file) is current, 0 while it is not (API \
     unreachable, file unreadable): events then carry the names known before.",
);
pub const ATTRIBUTION_PODS: Metric = node(
    "kstall_attribution_pods",
    Gauge,
    &["state"],
    "Pods whose names kstall knows: state=\"running\", or \"deleted\" (kept for the retention time).",
);
pub const NODE_PODS: Metric = node(
    "kstall_node_pods",
    Gauge,
    &["phase", "waiting_reason"],
    "Pods the metadata source lists on this node, by phase and by the reason the first waiting \
     container waits (\"\" when none waits; \"other\" for a reason outside the kubelet's): a pile of \
     ImagePullBackOff or stuck ContainerCreating, per node.",
);
pub const CONNTRACK_MAX: Metric = node(
    "kstall_conntrack_max",
    Gauge,
    &[],
    "net.netfilter.nf_conntrack_max: the entries each network namespace's connection tracking table \
     may hold (one limit for the node). Absent where conntrack is not loaded.",
);
pub const CONNTRACK_ENTRIES: Metric = node(
    "kstall_conntrack_entries",
    Gauge,
    &["namespace", "pod"],
    "Entries in a connection tracking table: the host's network namespace's (namespace and pod \
     empty: forwarded and NATed pod traffic, Services) and each pod namespace's whose table is in \
     use. At kstall_conntrack_max, new connections are dropped.",
);
pub const CONNTRACK_DROPS: Metric = node(
    "kstall_conntrack_drops_total",
    Counter,
    &["namespace", "pod"],
    "Packets conntrack dropped because it could not track their connection — the table full (or \
     no memory): the kernel's drop counter less its insert_failed clashes, per table as \
     kstall_conntrack_entries.",
);
pub const PRESSURE_STALLED: Metric = node(
    "kstall_pressure_stalled_seconds_total",
    Counter,
    &["resource", "kind", "namespace", "pod"],
    "Time tasks waited for a resource (PSI): resource memory, io or cpu; kind some (at least one \
     task waited) or full (every task at once). rate() is the share of time stalled. The node's \
     (/proc/pressure: namespace and pod empty) and each pod's own cgroup (cgroup v2).",
);
pub const KUBELET_CHECK_UP: Metric = node(
    "kstall_kubelet_check_up",
    Gauge,
    &["check"],
    "1 when the last check of the node's kubelet passed: check=\"healthz\" (GET of its healthz), \
     \"tls\" (a TLS handshake with its server, :10250). Absent when the checks are off \
     (--kubelet-checks).",
);

// The agent itself.

pub const BUILD_INFO: Metric = node("kstall_build_info", Gauge, &["version"], "kstall version.");
pub const PROBE_UP: Metric = node(
    "kstall_probe_up",
    Gauge,
    &["probe"],
    "1 when the probe is loaded and attached, 0 when it is not (see `kstall status`).",
);
pub const EVENTS: Metric =
    node("kstall_events_total", Counter, &["probe"], "Events received from the kernel.");
pub const EVENTS_LOST: Metric = node(
    "kstall_events_lost_total",
    Counter,
    &["probe"],
    "Events the kernel could not queue because the ring buffer was full.",
);
pub const PROGRAM_RUNS_MISSED: Metric = node(
    "kstall_program_runs_missed_total",
    Counter,
    &["program"],
    "Runs of a kstall eBPF program the kernel skipped because the program was already running on \
     that CPU (where tracepoints run programs preemptibly, as on 7.3, a task preempted inside one \
     makes the next one's run a miss): hook firings no counter or histogram saw. Absent before 5.12.",
);
pub const PROGRAM_RUNS: Metric = node(
    "kstall_program_runs_total",
    Counter,
    &["program"],
    "Runs of a kstall eBPF program the kernel counted: only while run-time statistics are on \
     (kstall_program_stats_enabled).",
);
pub const PROGRAM_RUN_SECONDS: Metric = node(
    "kstall_program_run_seconds_total",
    Counter,
    &["program"],
    "Time the kernel spent in a kstall eBPF program, over those runs: its CPU cost on the node.",
);
pub const PROGRAM_STATS_ENABLED: Metric = node(
    "kstall_program_stats_enabled",
    Gauge,
    &[],
    "1 while the kernel counts eBPF programs' runs and time (kernel.bpf_stats_enabled, or \
     --program-stats on), 0 when it does not: kstall_program_runs_total and \
     kstall_program_run_seconds_total stand still then.",
);
pub const RING_BUFFER_SIZE: Metric =
    node("kstall_ring_buffer_size_bytes", Gauge, &[], "The event ring buffer's size (--ring-buffer-bytes).");
pub const RING_BUFFER_USED: Metric = node(
    "kstall_ring_buffer_used_bytes",
    Gauge,
    &[],
    "Bytes of events in the ring buffer not read yet when the agent's reader last woke; past the \
     size, events are lost (kstall_events_lost_total).",
);
pub const RING_BUFFER_USED_MAX: Metric = node(
    "kstall_ring_buffer_used_max_bytes",
    Gauge,
    &[],
    "The most the reader ever found unread in the ring buffer since the agent started.",
);
pub const EVENTS_SUPPRESSED: Metric = node(
    "kstall_events_suppressed_total",
    Counter,
    &["probe"],
    "Events counted in the kernel but not sent in full: beyond the first --sample-events of their \
     series per CPU per second, or counted without a key in a full counter map. The event metrics \
     count them; kstall trace and the incidents say how many.",
);
pub const EVENT_DECODE_ERRORS: Metric = node(
    "kstall_event_decode_errors_total",
    Counter,
    &["error"],
    "Ring buffer records that could not be decoded, or that are not what they claim (forged: a \
     kernel report's text written to /dev/kmsg by a process).",
);
pub const EVENTS_UNATTRIBUTED: Metric = node(
    "kstall_events_unattributed_total",
    Counter,
    &["probe"],
    "Events sent without knowing their pod or host: the resolver had no answer within the hold time \
     (a network namespace or cgroup of no pod, or one already gone).",
);
pub const ATTRIBUTION_QUEUE_FULL: Metric = node(
    "kstall_attribution_queue_full_total",
    Counter,
    &["queue"],
    "Events that went out without waiting for the resolver because a queue was full: misses (the \
     resolver's queue of keys to look up), held (events waiting for it).",
);
pub const METRIC_SERIES_DROPPED: Metric = node(
    "kstall_metric_series_dropped_total",
    Counter,
    &["metric"],
    "New series not made because their metric family had --max-series-per-metric series already, \
     each counted once (until a forgotten pod frees room); their counts went to the family's overflow \
     series (its own labels \"overflow\").",
);
pub const API_EVENTS_DROPPED: Metric = node(
    "kstall_api_events_dropped_total",
    Counter,
    &["stream"],
    "Events not delivered to an API client that fell behind.",
);
pub const EXPORT_RECORDS: Metric = node(
    "kstall_export_records_total",
    Counter,
    &["output", "record"],
    "Records written to an event stream (--export-events: output \"json\"; --export-otlp: \"otlp\", taken by \
     the endpoint), by record type (event, incident).",
);
pub const EXPORT_RECORDS_DROPPED: Metric = node(
    "kstall_export_records_dropped_total",
    Counter,
    &["output", "record", "reason"],
    "Records an event stream dropped: its consumer, disk or endpoint was behind and the queue full \
     (reason \"behind\"), writing or sending failed (\"write_error\"), or the OTLP endpoint said it \
     rejected them (\"rejected\"). Each is a gap in the stream's seq.",
);

/// Every metric the agent exports.
pub const ALL: &[&Metric] = &[
    &TCP_RESETS,
    &PACKET_DROPS,
    &STUCK_TASKS_TOTAL,
    &CPU_LOCKUPS,
    &OOM_KILLS,
    &NFS_RETRANSMITS,
    &NFS_TIMEOUTS,
    &NFS_CONNECT_ERRORS,
    &NFS_STATE_MANAGER_FAILURES,
    &NFS_SERVER_RESPONDING,
    &NFS_RPC_DURATION,
    &STUCK_TASKS,
    &STUCK_TASK_LONGEST_BLOCKED,
    &STUCK_TASK_BLOCKED,
    &STUCK_TASKS_UNTRACKED,
    &STUCK_TASK_SWEEPS,
    &STUCK_TASK_SWEEP_FAILURES,
    &STUCK_TASK_SWEEP_KERNEL_SECONDS,
    &STUCK_TASK_SWEEP_TASKS,
    &STUCK_TASK_SWEEP_UNINTERRUPTIBLE,
    &STUCK_TASK_REPORTS_OVER_LIMIT,
    &INCIDENT_ACTIVE,
    &INCIDENTS,
    &INCIDENT_STATE_EVICTIONS,
    &ALERTMANAGER_POSTS,
    &STATE_WRITES,
    &CAPTURES,
    &CAPTURES_RUNNING,
    &KUBERNETES_WRITES,
    &NODE_MEMORY_LIMIT_OVERCOMMIT,
    &POD_METADATA_UP,
    &ATTRIBUTION_PODS,
    &NODE_PODS,
    &KUBELET_CHECK_UP,
    &CONNTRACK_MAX,
    &CONNTRACK_ENTRIES,
    &CONNTRACK_DROPS,
    &PRESSURE_STALLED,
    &BUILD_INFO,
    &PROBE_UP,
    &EVENTS,
    &EVENTS_LOST,
    &PROGRAM_RUNS_MISSED,
    &PROGRAM_RUNS,
    &PROGRAM_RUN_SECONDS,
    &PROGRAM_STATS_ENABLED,
    &RING_BUFFER_SIZE,
    &RING_BUFFER_USED,
    &RING_BUFFER_USED_MAX,
    &EVENTS_SUPPRESSED,
    &EVENT_DECODE_ERRORS,
    &EVENTS_UNATTRIBUTED,
    &ATTRIBUTION_QUEUE_FULL,
    &METRIC_SERIES_DROPPED,
    &API_EVENTS_DROPPED,
    &EXPORT_RECORDS,
    &EXPORT_RECORDS_DROPPED,
];

/// The catalogue's metric whose series `series_name` is (a histogram's `_bucket`, `_sum` and
/// `_count` are its own).
pub fn find(series_name: &str) -> Option<&'static Metric> {
    ALL.iter().copied().find(|m| {
        m.name == series_name
            || (m.kind == Type::Histogram
                && ["_bucket", "_sum", "_count"].iter().any(|s| series_name.strip_suffix(s) == Some(m.name)))
    })
}
