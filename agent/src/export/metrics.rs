//! Prometheus metrics. Label values are bounded: ports are kept by number only when well known
//! or configured, else counted as `ephemeral` or `other` (in the kernel's counters); reasons are
//! kernel enum names; every family about events is capped by the series book (`series.rs`).
//! Every metric about events carries the pod labels ([`POD_LABELS`], after the family's own); a pod's series live as
//! long as kstall remembers the pod.

use prometheus::{Encoder as _, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry, TextEncoder};

use crate::{
    attribution::{
        Attributed, Attribution, Index,
        pods::{PodState, SourceHealth},
    },
    decode::DecodeError,
    events::{Counts, Payload},
    incidents::Incident,
    probes::{
        nfs::{Nfs, What},
        plan::ProbeStatus,
        stuck_task::Sweep,
        wait::WaitKind,
    },
    stuck::StuckSet,
};

use super::series::{self, Admission, Family, FamilySeries, POD_LABELS, PodName, SeriesBook};

pub struct Metrics {
    registry: Registry,
    probe_up: IntGaugeVec,
    events_total: IntCounterVec,
    events_lost_total: IntCounterVec,
    events_suppressed_total: IntCounterVec,
    decode_errors_total: IntCounterVec,
    subscriber_drops_total: IntCounterVec,
    unattributed_total: IntCounterVec,
    pod_metadata_up: IntGauge,
    attribution_pods: IntGaugeVec,
    node_pods: IntGaugeVec,
    kubelet_check_up: IntGaugeVec,
    /// Every state `node_pods` has a series for.
    node_pod_states: std::sync::Mutex<std::collections::BTreeSet<PodState>>,
    /// Every series of the families about events: the cap, and a pod's series.
    series: std::sync::Mutex<SeriesBook>,
    series_dropped_total: IntCounterVec,
    incident_active: IntGaugeVec,
    alertmanager_posts_total: IntCounterVec,
    state_writes_total: IntCounterVec,
    kubernetes_writes_total: IntCounterVec,
    overcommit: prometheus::Gauge,
    incidents_total: IntCounterVec,
    incident_evictions_total: IntCounterVec,
    tcp_resets_total: IntCounterVec,
    stuck_tasks: IntGaugeVec,
    stuck_tasks_total: IntCounterVec,
    stuck_task_longest_blocked: IntGauge,
    stuck_task_blocked: prometheus::HistogramVec,
    stuck_untracked_total: prometheus::IntCounter,
    sweeps: Sweeps,
    attribution_queue_full_total: IntCounterVec,
    oom_kills_total: IntCounterVec,
    nfs_retransmits_total: IntCounterVec,
    nfs_timeouts_total: IntCounterVec,
    nfs_connect_errors_total: IntCounterVec,
    nfs_state_manager_failures_total: IntCounterVec,
    nfs_server_responding: IntGaugeVec,
    /// Read into `events_total` and `events_lost_total` when scraped.
    counts: std::sync::Arc<Counts>,
}

fn pod_label_values(a: &Attribution) -> [&str; 5] {
    [&a.namespace, &a.pod, &a.container, &a.workload, if a.host { "true" } else { "false" }]
}

/// `labels` followed by the pod labels.
/// The `server` label: transports without an IP address are local ones (rpcbind over a unix
/// socket).
fn nfs_server(nfs: &Nfs) -> String {
    nfs.server_addr.map(|a| a.to_string()).unwrap_or_else(|| "local".into())
}

fn with_pod_labels<'a>(labels: &[&'a str], a: &'a Attribution) -> Vec<&'a str> {
    let mut all = labels.to_vec();
    all.extend(pod_label_values(a));
    all
}

fn counter(registry: &Registry, name: &str, help: &str, labels: &[&str]) -> IntCounterVec {
    let c = IntCounterVec::new(Opts::new(name, help), labels).expect("valid metric");
    registry.register(Box::new(c.clone())).expect("unique metric");
    c
}

/// A counter about events: the family's labels plus the pod labels.
fn event_counter(registry: &Registry, family: Family, help: &str) -> IntCounterVec {
    counter(registry, family.name(), help, &[family.labels(), &POD_LABELS[..]].concat())
}

impl Metrics {
    pub fn new(counts: std::sync::Arc<Counts>, settings: series::Settings) -> Self {
        let registry = Registry::new();
        let probe_up = IntGaugeVec::new(
            Opts::new(
                "kstall_probe_up",
                "1 when the probe is loaded and attached, 0 when it is not (see `kstall status`).",
            ),
            &["probe"],
        )
        .expect("valid metric");
        registry.register(Box::new(probe_up.clone())).expect("unique metric");
        let build_info = IntGaugeVec::new(Opts::new("kstall_build_info", "kstall version."), &["version"])
            .expect("valid metric");
        registry.register(Box::new(build_info.clone())).expect("unique metric");
        build_info.with_label_values(&[env!("CARGO_PKG_VERSION")]).set(1);
        let stuck_tasks = IntGaugeVec::new(
            Opts::new(
                "kstall_stuck_tasks",
                "Tasks stuck in uninterruptible sleep now, by wait class, kind (uninterruptible, or \
                 killable: the sleeps the kernel's hung-task detector skips) and pod (a series exists \
                 only while a task is stuck).",
            ),
            &[&["wait", "kind"], &POD_LABELS[..]].concat(),
        )
        .expect("valid metric");
        registry.register(Box::new(stuck_tasks.clone())).expect("unique metric");
        let stuck_task_longest_blocked = IntGauge::new(
            "kstall_stuck_task_longest_blocked_seconds",
            "Longest time any currently stuck task has been blocked.",
        )
        .expect("valid metric");
        registry.register(Box::new(stuck_task_longest_blocked.clone())).expect("unique metric");
        let stuck_task_blocked = prometheus::HistogramVec::new(
            prometheus::HistogramOpts::new(
                "kstall_stuck_task_blocked_seconds",
                "How long stuck tasks were blocked, observed when they ran again or exited, by wait \
                 class and kind.",
            )
            .buckets(vec![
                5.0,
                15.0,
                30.0,
                60.0,
                120.0,
                300.0,
                600.0,
                1800.0,
                3600.0,
                4.0 * 3600.0,
            ]),
            &["wait", "kind"],
        )
        .expect("valid metric");
        registry.register(Box::new(stuck_task_blocked.clone())).expect("unique metric");
        let sweeps = Sweeps::new(&registry);
        let stuck_untracked_total = prometheus::IntCounter::new(
            "kstall_stuck_tasks_untracked_total",
            "Reports of stuck tasks not kept because 10,000 tasks were stuck already (the node is \
             on fire; the first 10,000 are reported).",
        )
        .expect("valid metric");
        registry.register(Box::new(stuck_untracked_total.clone())).expect("unique metric");
        let nfs_server_responding = IntGaugeVec::new(
            Opts::new(
                Family::NfsResponding.name(),
                "0 after a major RPC timeout to the server (the kernel's \"server not responding\"), \
                 1 again once a reply arrives (\"server OK\").",
            ),
            &[Family::NfsResponding.labels(), &POD_LABELS[..]].concat(),
        )
        .expect("valid metric");
        registry.register(Box::new(nfs_server_responding.clone())).expect("unique metric");
        let pod_metadata_up = IntGauge::new(
            "kstall_pod_metadata_up",
            "1 while the pod metadata source (Kubernetes API, pods file) is current, 0 while it is \
             not (API unreachable, file unreadable): events then carry the names known before.",
        )
        .expect("valid metric");
        registry.register(Box::new(pod_metadata_up.clone())).expect("unique metric");
        let attribution_pods = IntGaugeVec::new(
            Opts::new(
                "kstall_attribution_pods",
                "Pods whose names kstall knows: state=\"running\", or \"deleted\" (kept for the retention time).",
            ),
            &["state"],
        )
        .expect("valid metric");
        registry.register(Box::new(attribution_pods.clone())).expect("unique metric");
        let node_pods = IntGaugeVec::new(
            Opts::new(
                "kstall_node_pods",
                "Pods the metadata source lists on this node, by phase and by the reason the first \
                 waiting container waits (\"\" when none waits; \"other\" for a reason outside the \
                 kubelet's): a pile of ImagePullBackOff or stuck ContainerCreating, per node.",
            ),
            &["phase", "waiting_reason"],
        )
        .expect("valid metric");
        registry.register(Box::new(node_pods.clone())).expect("unique metric");
        let kubelet_check_up = IntGaugeVec::new(
            Opts::new(
                "kstall_kubelet_check_up",
                "1 when the last check of the node's kubelet passed: check=\"healthz\" (GET of its \
                 healthz), \"tls\" (a TLS handshake with its server, :10250). Absent when the checks \
                 are off (--kubelet-checks).",
            ),
            &["check"],
        )
        .expect("valid metric");
        registry.register(Box::new(kubelet_check_up.clone())).expect("unique metric");
        let incident_active = IntGaugeVec::new(
            Opts::new("kstall_incident_active", "1 while an incident of this signature fires for this pod."),
            &["signature", "severity", "node", "namespace", "pod"],
        )
        .expect("valid metric");
        registry.register(Box::new(incident_active.clone())).expect("unique metric");
        let overcommit = prometheus::Gauge::new(
            "kstall_node_memory_limit_overcommit_ratio",
            "Sum of the pods' memory limits (pod cgroups; pods without a limit add nothing) over the \
             node's memory (MemTotal). Above 1, the limits cannot all be honoured: a system OOM is possible.",
        )
        .expect("valid metric");
        registry.register(Box::new(overcommit.clone())).expect("unique metric");
        let metrics = Self {
            alertmanager_posts_total: counter(
                &registry,
                "kstall_alertmanager_posts_total",
                "Pushes of incidents to an Alertmanager (--alertmanager-url), by result.",
                &["url", "result"],
            ),
            state_writes_total: counter(
                &registry,
                "kstall_state_writes_total",
                "Writes of the incident history to the state directory (--state-dir), by result: ok, \
                 error (the agent's log says why; the history then does not survive a restart).",
                &["result"],
            ),
            kubernetes_writes_total: counter(
                &registry,
                "kstall_kubernetes_writes_total",
                "Writes to the Kubernetes API (kind=\"event\": Events on pods and nodes; \
                 \"node_condition\": the Node's status), by result: \
                 created, patched (a repeat counted), forbidden, conflict, not_found, server_error, \
                 rejected, unreachable, dropped (the writer's queue was full).",
                &["kind", "result"],
            ),
            overcommit,
            incident_active,
            incidents_total: counter(
                &registry,
                "kstall_incidents_total",
                "Incidents that started firing, by signature and severity.",
                &["signature", "severity"],
            ),
            incident_evictions_total: counter(
                &registry,
                "kstall_incident_state_evictions_total",
                "Per-key incident state dropped because a signature's cap was reached.",
                &["signature"],
            ),
            series: std::sync::Mutex::new(SeriesBook::new(settings)),
            series_dropped_total: counter(
                &registry,
                "kstall_metric_series_dropped_total",
                "New series not made because their metric family had --max-series-per-metric \
                 series already, each counted once (until a forgotten pod frees room); their \
                 counts went to the family's overflow series (its own labels \"overflow\").",
                &["metric"],
            ),
            pod_metadata_up,
            attribution_pods,
            node_pods,
            kubelet_check_up,
            node_pod_states: std::sync::Mutex::default(),
            nfs_server_responding,
            nfs_retransmits_total: event_counter(
                &registry,
                Family::NfsRetransmits,
                "RPC requests retransmitted to an NFS/RPC server.",
            ),
            nfs_timeouts_total: event_counter(
                &registry,
                Family::NfsTimeouts,
                "Major RPC timeouts (\"server not responding\").",
            ),
            nfs_connect_errors_total: event_counter(
                &registry,
                Family::NfsConnectErrors,
                "Failed connects, socket errors and connection resets of RPC transports, by errno.",
            ),
            nfs_state_manager_failures_total: event_counter(
                &registry,
                Family::NfsStateManager,
                "NFSv4 state recovery failures (nfs4_state_mgr_failed), by section.",
            ),
            oom_kills_total: event_counter(
                &registry,
                Family::OomKills,
                "OOM kills. scope: memcg (a cgroup limit), global (the node ran out) or unknown; \
                 critical: the victim is node-critical (kubelet, container runtime, ...).",
            ),
            stuck_tasks,
            stuck_task_longest_blocked,
            stuck_task_blocked,
            stuck_untracked_total,
            sweeps,
            attribution_queue_full_total: counter(
                &registry,
                "kstall_attribution_queue_full_total",
                "Events that went out without waiting for the resolver because a queue was full: \
                 misses (the resolver's queue of keys to look up), held (events waiting for it).",
                &["queue"],
            ),
            stuck_tasks_total: event_counter(
                &registry,
                Family::StuckTasks,
                "Tasks newly stuck (a task counts once however long it stays stuck), by wait class, \
                 kind and the probe that found it first: stuck-task (the sampler) or hung-task (the \
                 kernel's detector).",
            ),
            probe_up,
            events_total: counter(
                &registry,
                "kstall_events_total",
                "Events received from the kernel.",
                &["probe"],
            ),
            events_lost_total: counter(
                &registry,
                "kstall_events_lost_total",
                "Events the kernel could not queue because the ring buffer was full.",
                &["probe"],
            ),
            events_suppressed_total: counter(
                &registry,
                "kstall_events_suppressed_total",
                "Events counted in the kernel but not sent in full: beyond the first --sample-events \
                 of their series per CPU per second, or counted without a key in a full counter map. \
                 The event metrics count them; kstall trace and the incidents say how many.",
                &["probe"],
            ),
            decode_errors_total: counter(
                &registry,
                "kstall_event_decode_errors_total",
                "Ring buffer records that could not be decoded.",
                &["error"],
            ),
            unattributed_total: counter(
                &registry,
                "kstall_events_unattributed_total",
                "Events sent without knowing their pod or host: the resolver had no answer within \
                 the hold time (a network namespace or cgroup of no pod, or one already gone).",
                &["probe"],
            ),
            subscriber_drops_total: counter(
                &registry,
                "kstall_api_events_dropped_total",
                "Events not delivered to an API client that fell behind.",
                &["stream"],
            ),
            tcp_resets_total: event_counter(
                &registry,
                Family::TcpResets,
                "TCP resets. port: the refusing local port (sent) or the remote port (received); \
                 original_port: pre-NAT destination port of a redirected connection, empty otherwise.",
            ),
            registry,
            counts,
        };
        // Present from the start at 0, as events_total is: an alert or a dashboard's rate() on
        // them has a value before the first error.
        for label in DecodeError::LABELS {
            metrics.decode_errors_total.with_label_values(&[label]);
        }
        for queue in ["misses", "held"] {
            metrics.attribution_queue_full_total.with_label_values(&[queue]);
        }
        for family in Family::ALL {
            metrics.series_dropped_total.with_label_values(&[family.name()]);
        }
        for result in ["ok", "error"] {
            metrics.state_writes_total.with_label_values(&[result]);
        }
        metrics
    }

    pub fn set_probe_statuses(&self, statuses: &[ProbeStatus]) {
        for s in statuses {
            self.probe_up.with_label_values(&[s.name.as_str()]).set(i64::from(s.up));
        }
    }

    /// An event that is news (repeated hung-task reports are not).
    pub fn observe(&self, attributed: &Attributed) {
        let (event, who) = (&attributed.event, &*attributed.who);
        match &event.payload {
            // Counted from the kernel's counters, exact whatever the ring buffer or the sampling
            // left out; the events are their detail.
            Payload::TcpReset(_) => {}
            Payload::TcpResetCount(count) => {
                let (port, original) = (count.port.label(), count.original_port.map(|p| p.label()));
                let labels = [
                    count.direction.as_str(),
                    &port,
                    original.as_deref().unwrap_or(""),
                    count.reason.as_deref().unwrap_or(""),
                ];
                self.inc_by(Family::TcpResets, &with_pod_labels(&labels, who), who, count.resets);
                self.counts.suppressed(event.header.probe, count.suppressed);
            }
            Payload::HungTask(hung) => {
                let labels = [hung.wait.as_str(), WaitKind::Uninterruptible.as_str(), event.header.probe];
                self.inc(Family::StuckTasks, &with_pod_labels(&labels, who), who)
            }
            Payload::StuckTask(stuck) => {
                let labels = [stuck.wait.as_str(), stuck.wait_kind.as_str(), event.header.probe];
                self.inc(Family::StuckTasks, &with_pod_labels(&labels, who), who)
            }
            Payload::HungTaskCleared(cleared) => {
                if let Some(secs) = cleared.blocked_secs {
                    self.stuck_task_blocked
                        .with_label_values(&[cleared.wait.as_str(), cleared.wait_kind.as_str()])
                        .observe(secs as f64);
                }
            }
            // The counters from the kernel's counts, the server's state from the events.
            Payload::Nfs(nfs) => self.nfs_responding(nfs, who),
            Payload::NfsCount(count) => {
                self.count_nfs(&count.series, who, count.events);
                self.counts.suppressed(event.header.probe, count.suppressed);
            }
            Payload::OomKill(_) => {}
            Payload::OomKillCount(count) => {
                let critical = if count.critical { "true" } else { "false" };
                let labels = [count.scope.as_str(), event.header.comm.as_str(), critical];
                self.inc_by(Family::OomKills, &with_pod_labels(&labels, who), who, count.kills);
                self.counts.suppressed(event.header.probe, count.suppressed);
            }
        }
    }

    fn nfs_responding(&self, nfs: &Nfs, who: &Attribution) {
        let server = nfs_server(nfs);
        let server = with_pod_labels(&[server.as_str()], who);
        match nfs.what {
            What::Timeout => self.set(Family::NfsResponding, &server, who, 0),
            What::ServerResponding => self.set(Family::NfsResponding, &server, who, 1),
            _ => {}
        }
    }

    /// `n` events of the series `nfs` (a count's key).
    fn count_nfs(&self, nfs: &Nfs, who: &Attribution, n: u64) {
        let server = nfs_server(nfs);
        let server = with_pod_labels(&[server.as_str()], who);
        let error =
            nfs.error_name.map(str::to_string).or(nfs.error.map(|e| e.to_string())).unwrap_or_default();
        fn with<'a>(server: &[&'a str], extra: &'a str) -> Vec<&'a str> {
            let mut labels = vec![server[0], extra];
            labels.extend(&server[1..]);
            labels
        }
        match nfs.what {
            What::Retransmit => self.inc_by(Family::NfsRetransmits, &server, who, n),
            What::Timeout => self.inc_by(Family::NfsTimeouts, &server, who, n),
            What::ServerResponding => {}
            What::SocketConnect if !nfs.connect_failed() => {}
            What::SocketConnect | What::SocketError => {
                self.inc_by(Family::NfsConnectErrors, &with(&server, &error), who, n)
            }
            What::SocketReset => self.inc_by(Family::NfsConnectErrors, &with(&server, "reset"), who, n),
            What::StateManagerFailed => self.inc_by(
                Family::NfsStateManager,
                &with(&server, nfs.procedure.as_deref().unwrap_or("")),
                who,
                n,
            ),
        }
    }

    /// The stuck set as gauges, at `now`; and what it could not keep.
    pub fn set_stuck_tasks(&self, stuck: &StuckSet, now_unix_ns: u64) {
        let mut counts: std::collections::HashMap<Vec<&str>, i64> = std::collections::HashMap::new();
        for (wait, kind, who) in stuck.waits() {
            *counts.entry(with_pod_labels(&[wait.as_str(), kind.as_str()], who)).or_default() += 1;
        }
        // Series of pods no longer stuck disappear rather than stay at 0 forever.
        self.stuck_tasks.reset();
        for (labels, n) in counts {
            self.stuck_tasks.with_label_values(&labels).set(n);
        }
        self.stuck_task_longest_blocked.set(stuck.longest_blocked_secs(now_unix_ns) as i64);
        self.stuck_untracked_total.inc_by(stuck.untracked().saturating_sub(self.stuck_untracked_total.get()));
    }

    /// What a stuck-task sweep cost and found; a failed sweep is counted (and warned by the caller).
    pub fn stuck_task_sweep(&self, sweep: &Result<Sweep, String>) {
        let s = &self.sweeps;
        match sweep {
            Ok(sweep) => {
                s.total.inc();
                s.kernel_seconds.observe(sweep.kernel_cpu.as_secs_f64());
                s.tasks.set(sweep.tasks as i64);
                s.uninterruptible.set(sweep.uninterruptible as i64);
                s.over_limit_total.inc_by(sweep.over_limit);
            }
            Err(_) => s.failures_total.inc(),
        }
    }

    /// An event that did not wait for the resolver's answer because a queue was full: `misses`
    /// (the resolver's), `held` (events waiting for it).
    pub fn attribution_queue_full(&self, queue: &str) {
        self.attribution_queue_full_total.with_label_values(&[queue]).inc();
    }

    fn inc(&self, family: Family, labels: &[&str], who: &Attribution) {
        self.inc_by(family, labels, who, 1);
    }

    fn inc_by(&self, family: Family, labels: &[&str], who: &Attribution, n: u64) {
        let Some(counter) = self.counter(family) else { return };
        let mut book = self.series.lock().expect("series book");
        match book.admit(family, labels, who) {
            Admission::Series(slot) => {
                counter.with_label_values(labels).inc_by(n);
                book.update(slot, |v| *v += n as i64);
            }
            Admission::Overflow { first } => {
                counter.with_label_values(&family.overflow_labels()).inc_by(n);
                self.dropped(family, first);
            }
        }
    }

    /// A gauge has no overflow series (a value of many series means nothing): the update is
    /// dropped and counted.
    fn set(&self, family: Family, labels: &[&str], who: &Attribution, value: i64) {
        let mut book = self.series.lock().expect("series book");
        match book.admit(family, labels, who) {
            Admission::Series(slot) => {
                if let Family::NfsResponding = family {
                    self.nfs_server_responding.with_label_values(labels).set(value);
                }
                book.update(slot, |v| *v = value);
            }
            Admission::Overflow { first } => self.dropped(family, first),
        }
    }

    fn dropped(&self, family: Family, first: bool) {
        if first {
            self.series_dropped_total.with_label_values(&[family.name()]).inc();
        }
    }

    fn counter(&self, family: Family) -> Option<&IntCounterVec> {
        Some(match family {
            Family::TcpResets => &self.tcp_resets_total,
            Family::StuckTasks => &self.stuck_tasks_total,
            Family::OomKills => &self.oom_kills_total,
            Family::NfsRetransmits => &self.nfs_retransmits_total,
            Family::NfsTimeouts => &self.nfs_timeouts_total,
            Family::NfsConnectErrors => &self.nfs_connect_errors_total,
            Family::NfsStateManager => &self.nfs_state_manager_failures_total,
            Family::NfsResponding => return None,
        })
    }

    /// The series count, cap and refusals of each family about events (`kstall status`).
    pub fn families(&self) -> Vec<FamilySeries> {
        self.series.lock().expect("series book").families()
    }

    /// Removes the series of pods kstall no longer names (deleted longer than the retention
    /// time): a node's pods churn, its metric series must not grow with them forever.
    pub fn forget_pods_except(&self, named: &std::collections::HashSet<PodName>) {
        let gone = self.series.lock().expect("series book").take_except(named);
        for series::Entry { family, labels, .. } in gone {
            let labels: Vec<&str> = labels.iter().map(String::as_str).collect();
            let _ = match self.counter(family) {
                Some(counter) => counter.remove_label_values(&labels),
                None => self.nfs_server_responding.remove_label_values(&labels),
            };
        }
    }

    /// `name{labels} value` of every event series of pod `namespace/pod`, its pod labels (and
    /// empty ones) left out, sorted: what `kstall explain` shows as the pod's activity.
    pub fn pod_activity(&self, namespace: &str, pod: &str) -> Vec<String> {
        let series = self.series.lock().expect("series book");
        let mut lines: Vec<String> = series
            .of(namespace, pod)
            .iter()
            .map(|s| {
                let mut own: Vec<(&str, &str)> = s
                    .family
                    .labels()
                    .iter()
                    .zip(&s.labels)
                    .filter(|(_, v)| !v.is_empty())
                    .map(|(k, v)| (*k, v.as_str()))
                    .collect();
                own.sort_unstable();
                let own: Vec<String> = own.iter().map(|(k, v)| format!("{k}=\"{v}\"")).collect();
                format!("{}{{{}}} {}", s.family.name(), own.join(","), s.value)
            })
            .collect();
        lines.sort_unstable();
        lines
    }

    /// Whether the pod metadata source is current, read when scraped: a source that fails
    /// makes no new index, so the index cannot carry it.
    pub fn set_pod_source(&self, source: &SourceHealth) {
        self.pod_metadata_up.set(i64::from(source.up));
    }

    pub fn set_attribution(&self, index: &Index) {
        self.attribution_pods.with_label_values(&["running"]).set((index.pods - index.deleted_pods) as i64);
        self.attribution_pods.with_label_values(&["deleted"]).set(index.deleted_pods as i64);
        // A state no pod is in any more reads 0 rather than vanishing: a query over time sees
        // the pile go away. The label values come from fixed lists: the series stay few.
        let mut exported = self.node_pod_states.lock().expect("node pod states");
        for gone in exported.iter().filter(|state| !index.pod_states.contains_key(state)) {
            self.node_pods.with_label_values(&[gone.phase, gone.waiting_reason]).set(0);
        }
        exported.extend(index.pod_states.keys().copied());
        for (state, pods) in &index.pod_states {
            self.node_pods.with_label_values(&[state.phase, state.waiting_reason]).set(*pods as i64);
        }
        self.overcommit.set(index.memory.overcommit().unwrap_or(0.0));
    }

    /// The kubelet checks' last results, the ones that ran.
    pub fn set_kubelet(&self, health: &crate::kubelet::Health) {
        for (check, result) in [("healthz", &health.healthz), ("tls", &health.tls)] {
            if let Some(result) = result {
                self.kubelet_check_up.with_label_values(&[check]).set(i64::from(result.error.is_none()));
            }
        }
    }

    /// After an evaluation: the firing set as gauges, new incidents counted.
    pub fn set_incidents<'a>(
        &self,
        firing: impl Iterator<Item = &'a Incident>,
        fired: &[Incident],
        evictions: &[(&str, u64)],
    ) {
        self.incident_active.reset();
        for i in firing {
            self.incident_active
                .with_label_values(&[&i.signature, i.severity.as_str(), &i.node, &i.namespace, &i.pod])
                .set(1);
        }
        for i in fired {
            self.incidents_total.with_label_values(&[&i.signature, i.severity.as_str()]).inc();
        }
        for (signature, total) in evictions {
            let c = self.incident_evictions_total.with_label_values(&[signature]);
            c.inc_by(total.saturating_sub(c.get()));
        }
    }

    pub fn kubernetes_write(&self, kind: &str, result: &str) {
        self.kubernetes_writes_total.with_label_values(&[kind, result]).inc();
    }

    /// A write of the incident history to the state directory.
    pub fn state_write(&self, ok: bool) {
        self.state_writes_total.with_label_values(&[if ok { "ok" } else { "error" }]).inc();
    }

    pub fn alertmanager_post(&self, url: &str, ok: bool) {
        self.alertmanager_posts_total.with_label_values(&[url, if ok { "ok" } else { "error" }]).inc();
    }

    pub fn unattributed(&self, probe: &str) {
        self.unattributed_total.with_label_values(&[probe]).inc();
    }

    pub fn decode_error(&self, label: &str) {
        self.decode_errors_total.with_label_values(&[label]).inc();
    }

    pub fn subscriber_dropped(&self, stream: &str, n: u64) {
        self.subscriber_drops_total.with_label_values(&[stream]).inc_by(n);
    }

    pub fn render(&self) -> String {
        // Every probe's, from the start: a dashboard's rate() has a zero to begin from.
        for probe in crate::probes::names() {
            let (received, lost) = self.counts.of(probe);
            let suppressed = self.counts.suppressed_of(probe);
            for (counter, now) in [
                (&self.events_total, received),
                (&self.events_lost_total, lost),
                (&self.events_suppressed_total, suppressed),
            ] {
                let series = counter.with_label_values(&[probe]);
                series.inc_by(now.saturating_sub(series.get()));
            }
        }
        let mut out = Vec::new();
        TextEncoder::new().encode(&self.registry.gather(), &mut out).expect("text encoding");
        String::from_utf8(out).expect("prometheus text is UTF-8")
    }
}

/// The stuck-task sampler's own figures.
struct Sweeps {
    total: prometheus::IntCounter,
    failures_total: prometheus::IntCounter,
    kernel_seconds: prometheus::Histogram,
    tasks: IntGauge,
    uninterruptible: IntGauge,
    over_limit_total: prometheus::IntCounter,
}

impl Sweeps {
    fn new(registry: &Registry) -> Self {
        fn reg<T: prometheus::core::Collector + Clone + 'static>(registry: &Registry, m: T) -> T {
            registry.register(Box::new(m.clone())).expect("unique metric");
            m
        }
        let counter = |name: &str, help: &str| {
            reg(registry, prometheus::IntCounter::new(name, help).expect("valid metric"))
        };
        let gauge = |name: &str, help: &str| reg(registry, IntGauge::new(name, help).expect("valid metric"));
        Self {
            total: counter(
                "kstall_stuck_task_sweeps_total",
                "Sweeps of every task by the stuck-task sampler.",
            ),
            failures_total: counter(
                "kstall_stuck_task_sweep_failures_total",
                "Sweeps that could not run (the agent's log says why).",
            ),
            kernel_seconds: reg(
                registry,
                prometheus::Histogram::with_opts(
                    prometheus::HistogramOpts::new(
                        "kstall_stuck_task_sweep_kernel_seconds",
                        "CPU time of each sweep, spent in the kernel walking the tasks.",
                    )
                    .buckets(vec![0.0002, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.5]),
                )
                .expect("valid metric"),
            ),
            tasks: gauge("kstall_stuck_task_sweep_tasks", "Tasks the last sweep walked."),
            uninterruptible: gauge(
                "kstall_stuck_task_sweep_uninterruptible",
                "Tasks the last sweep found asleep uninterruptibly, stuck or not (idle kernel threads \
                 and frozen tasks not counted).",
            ),
            over_limit_total: counter(
                "kstall_stuck_task_reports_over_limit_total",
                "Stuck tasks a sweep did not report because it had reported --stuck-task-max-reports \
                 already (a later sweep reports them).",
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use kstall_common::tcp_reset::{
        DIRECTION_RECEIVED, HOOK_TCP_RECEIVE_RESET, KEY_PORT_EPHEMERAL, ResetCountKey,
    };

    use super::*;
    use crate::{
        decode::bytes_of,
        events::{Decoder, Event},
        probes::tcp_reset::{
            self,
            tests::{redirected_count_key, redirected_syn_reset},
        },
    };

    /// One interval's count of the redirected reset's series, as the kernel's counters give it.
    fn count(resets: u64, mutate: impl Fn(&mut ResetCountKey)) -> Attributed {
        let mut key = redirected_count_key();
        mutate(&mut key);
        let counter = kstall_common::counter::Counter { events: resets, emitted: resets.min(2) };
        let count = tcp_reset::decode_count(&key, &counter, &Default::default()).unwrap();
        let mut event = Decoder::default().decode(&bytes_of(&redirected_syn_reset())).unwrap();
        event.payload = Payload::TcpResetCount(count);
        Attributed { event, who: Default::default() }
    }

    fn event(resets: u64) -> Attributed {
        count(resets, |_| {})
    }

    #[test]
    fn reset_labels() {
        let counts = std::sync::Arc::new(Counts::default());
        let m = Metrics::new(counts.clone(), Default::default());
        let observe = |e: &Attributed| {
            counts.received(e.event.header.probe);
            m.observe(e);
        };
        let mut in_pod = event(1);
        in_pod.who = std::sync::Arc::new(Attribution {
            namespace: "shop".into(),
            pod: "web-1".into(),
            workload: "Deployment/web".into(),
            ..Default::default()
        });
        observe(&in_pod);
        m.observe(&count(1, |k| {
            k.direction = DIRECTION_RECEIVED;
            k.hook = HOOK_TCP_RECEIVE_RESET;
            k.flags = 0;
            k.port = 2049;
        }));
        m.observe(&count(1, |k| {
            k.port = 0;
            k.flags = KEY_PORT_EPHEMERAL;
        }));
        // The events are detail: the counts are what the metric counts.
        observe(&Attributed { event: detail_event(), who: Default::default() });
        // Of 5000 resets of one series, 2 were sent in full.
        m.observe(&count(5000, |k| k.orig_dst_port = 2050));
        let text = m.render();
        assert!(
            text.contains(
                r#"kstall_tcp_resets_total{container="",direction="sent",host="false",namespace="shop",original_port="2049",pod="web-1",port="15001",reason="1",workload="Deployment/web"} 1"#
            ),
            "{text}"
        );
        assert!(
            text.contains(
                r#"kstall_tcp_resets_total{container="",direction="received",host="false",namespace="",original_port="",pod="",port="2049",reason="",workload=""} 1"#
            ),
            "{text}"
        );
        assert!(
            text.contains(
                r#"kstall_tcp_resets_total{container="",direction="sent",host="false",namespace="",original_port="",pod="",port="ephemeral",reason="",workload=""} 1"#
            ),
            "{text}"
        );
        assert!(
            text.contains(
                r#"kstall_tcp_resets_total{container="",direction="sent",host="false",namespace="",original_port="2050",pod="",port="15001",reason="1",workload=""} 5000"#
            ),
            "{text}"
        );
        assert!(
            !text.contains(r#"original_port="2049",pod="",port="15001""#),
            "the event is not counted: {text}"
        );
        assert!(text.contains(r#"kstall_events_total{probe="tcp-reset"} 2"#), "{text}");
        assert!(text.contains(r#"kstall_events_suppressed_total{probe="tcp-reset"} 4998"#), "{text}");
        // A full map's resets: counted without a key.
        m.observe(&Attributed {
            event: Event {
                payload: Payload::TcpResetCount(tcp_reset::overflow_count(tcp_reset::Direction::Sent, 7)),
                ..detail_event()
            },
            who: Default::default(),
        });
        let text = m.render();
        assert!(text.contains(r#"direction="sent",host="false",namespace="",original_port="",pod="",port="overflow",reason="",workload=""} 7"#), "{text}");
    }

    fn detail_event() -> Event {
        Decoder::default().decode(&bytes_of(&redirected_syn_reset())).unwrap()
    }

    /// `raw` as the agent takes it in: the event, then the kernel's count of its series.
    fn observe_nfs(m: &Metrics, raw: &kstall_common::nfs::NfsEvent, who: &std::sync::Arc<Attribution>) {
        let event = Decoder::default().decode(&bytes_of(raw)).unwrap();
        m.observe(&Attributed { event: event.clone(), who: who.clone() });
        let count = crate::probes::nfs::tests::count_of(raw, 1);
        m.observe(&Attributed {
            event: Event { payload: Payload::NfsCount(count), ..event },
            who: who.clone(),
        });
    }

    /// Label sets of `kstall_nfs_*` for events no pod was found for.
    fn nfs(name: &str, labels: &str) -> String {
        format!(r#"{name}{{container="",{labels}host="false",namespace="",pod="","#)
    }

    #[test]
    fn nfs_server_responding_goes_to_zero_on_a_timeout_and_back_on_a_reply() {
        use kstall_common::nfs::{
            WHAT_RETRANSMIT, WHAT_SERVER_RESPONDING, WHAT_SOCKET_CONNECT, WHAT_SOCKET_ERROR, WHAT_TIMEOUT,
        };

        use crate::probes::nfs::tests::event as nfs_event;
        let m = Metrics::new(Default::default(), Default::default());
        let observe = |what, error| observe_nfs(&m, &nfs_event(what, error), &Default::default());
        observe(WHAT_TIMEOUT, -110);
        let responding = nfs("kstall_nfs_server_responding", "");
        assert!(m.render().contains(&format!(r#"{responding}server="10.55.0.1",workload=""}} 0"#)));
        observe(WHAT_RETRANSMIT, 0);
        observe(WHAT_SOCKET_CONNECT, -115);
        observe(WHAT_SOCKET_ERROR, -111);
        observe(WHAT_SERVER_RESPONDING, 0);
        let text = m.render();
        let server = r#"server="10.55.0.1",workload=""}"#;
        assert!(text.contains(&format!("{responding}{server} 1")), "{text}");
        assert!(text.contains(&format!("{}{server} 1", nfs("kstall_nfs_rpc_timeouts_total", ""))), "{text}");
        assert!(
            text.contains(&format!("{}{server} 1", nfs("kstall_nfs_rpc_retransmits_total", ""))),
            "{text}"
        );
        let refused = nfs("kstall_nfs_connect_errors_total", r#"error="ECONNREFUSED","#);
        assert!(text.contains(&format!("{refused}{server} 1")), "{text}");
        assert!(!text.contains("EINPROGRESS"), "a connect in progress is not an error: {text}");
    }

    #[test]
    fn past_the_cap_new_series_go_to_the_overflow_series_and_are_counted() {
        let m = Metrics::new(Default::default(), series::Settings { max_series_per_metric: 3 });
        for port in 1..=5 {
            m.observe(&count(10, |k| k.port = port));
        }
        // A refused series seen again is not refused twice; a kept one still counts.
        m.observe(&count(10, |k| k.port = 5));
        m.observe(&count(1, |k| k.port = 1));
        let text = m.render();
        let ports = |port: &str| {
            format!(r#"direction="sent",host="false",namespace="",original_port="2049",pod="",port="{port}""#)
        };
        assert!(text.contains(&format!("{},reason=\"1\",workload=\"\"}} 11", ports("1"))), "{text}");
        assert!(!text.contains(&ports("4")), "{text}");
        assert!(
            text.contains(r#"kstall_tcp_resets_total{container="",direction="overflow",host="",namespace="",original_port="overflow",pod="",port="overflow",reason="overflow",workload=""} 30"#),
            "{text}"
        );
        assert!(
            text.contains(r#"kstall_metric_series_dropped_total{metric="kstall_tcp_resets_total"} 2"#),
            "{text}"
        );
        assert!(text.contains(r#"kstall_metric_series_dropped_total{metric="kstall_oom_kills_total"} 0"#));
        let families = m.families();
        let resets = families.iter().find(|f| f.metric == "kstall_tcp_resets_total").unwrap();
        assert_eq!((resets.series, resets.max, resets.dropped), (3, 3, 2));
    }

    #[test]
    fn a_forgotten_pods_series_are_removed() {
        let m = Metrics::new(Default::default(), Default::default());
        let named = |pod: &str| {
            let mut e = event(1);
            e.who = std::sync::Arc::new(Attribution {
                namespace: "shop".into(),
                pod: pod.into(),
                ..Default::default()
            });
            e
        };
        m.observe(&named("web-1"));
        m.observe(&named("web-1"));
        m.observe(&named("web-2"));
        assert!(m.render().contains(r#"pod="web-1""#));
        let keep = std::collections::HashSet::from([("shop".to_string(), "web-2".to_string())]);
        m.forget_pods_except(&keep);
        let text = m.render();
        assert!(!text.contains(r#"pod="web-1""#), "{text}");
        assert!(text.contains(r#"pod="web-2""#), "{text}");
        // A pod seen again after being forgotten is tracked again.
        m.observe(&named("web-1"));
        m.forget_pods_except(&keep);
        assert!(!m.render().contains(r#"pod="web-1""#));
    }

    #[test]
    fn a_pods_activity_is_its_series_with_their_values() {
        use kstall_common::nfs::{WHAT_SERVER_RESPONDING, WHAT_TIMEOUT};

        use crate::probes::nfs::tests::event as nfs_event;
        let m = Metrics::new(Default::default(), Default::default());
        let who = std::sync::Arc::new(Attribution {
            namespace: "shop".into(),
            pod: "web-1".into(),
            workload: "Deployment/web".into(),
            ..Default::default()
        });
        let mut reset = event(1);
        reset.who = who.clone();
        m.observe(&reset);
        m.observe(&reset);
        for what in [WHAT_TIMEOUT, WHAT_SERVER_RESPONDING] {
            observe_nfs(&m, &nfs_event(what, 0), &who);
        }
        // Another pod's series are not this one's.
        let mut other = event(1);
        other.who = std::sync::Arc::new(Attribution {
            namespace: "shop".into(),
            pod: "db-0".into(),
            ..Default::default()
        });
        m.observe(&other);
        assert_eq!(
            m.pod_activity("shop", "web-1"),
            [
                r#"kstall_nfs_rpc_timeouts_total{server="10.55.0.1"} 1"#,
                r#"kstall_nfs_server_responding{server="10.55.0.1"} 1"#,
                r#"kstall_tcp_resets_total{direction="sent",original_port="2049",port="15001",reason="1"} 2"#,
            ]
        );
        // The values are the exported ones.
        let text = m.render();
        assert!(text.contains(r#"namespace="shop",original_port="2049",pod="web-1",port="15001",reason="1",workload="Deployment/web"} 2"#), "{text}");
        m.forget_pods_except(&std::collections::HashSet::from([("shop".to_string(), "db-0".to_string())]));
        assert!(m.pod_activity("shop", "web-1").is_empty());
        assert_eq!(m.pod_activity("shop", "db-0").len(), 1);
    }

    #[test]
    fn incident_metrics() {
        let m = Metrics::new(Default::default(), Default::default());
        let incident = crate::incidents::tests::incident(None);
        m.set_incidents(
            [&incident].into_iter(),
            std::slice::from_ref(&incident),
            &[("nfs-sidecar-redirect", 2)],
        );
        let text = m.render();
        assert!(text.contains(r#"kstall_incident_active{namespace="shop",node="node-a",pod="web-1",severity="critical",signature="nfs-sidecar-redirect"} 1"#), "{text}");
        assert!(
            text.contains(
                r#"kstall_incidents_total{severity="critical",signature="nfs-sidecar-redirect"} 1"#
            ),
            "{text}"
        );
        assert!(
            text.contains(r#"kstall_incident_state_evictions_total{signature="nfs-sidecar-redirect"} 2"#),
            "{text}"
        );
        m.set_incidents(std::iter::empty(), &[], &[]);
        assert!(!m.render().contains("kstall_incident_active{"), "resolved: the series goes");
    }

    #[test]
    fn node_pods_by_phase_and_waiting_reason() {
        let m = Metrics::new(Default::default(), Default::default());
        let backoff = PodState { phase: "Pending", waiting_reason: "ImagePullBackOff" };
        let running = PodState { phase: "Running", waiting_reason: "" };
        let mut index = Index { pod_states: [(backoff, 360), (running, 12)].into(), ..Index::default() };
        m.set_attribution(&index);
        let text = m.render();
        assert!(
            text.contains(r#"kstall_node_pods{phase="Pending",waiting_reason="ImagePullBackOff"} 360"#),
            "{text}"
        );
        assert!(text.contains(r#"kstall_node_pods{phase="Running",waiting_reason=""} 12"#), "{text}");
        // The CronJob is suspended and its pods deleted: the pile reads 0.
        index.pod_states = [(running, 12)].into();
        m.set_attribution(&index);
        let text = m.render();
        assert!(
            text.contains(r#"kstall_node_pods{phase="Pending",waiting_reason="ImagePullBackOff"} 0"#),
            "{text}"
        );
    }
}
