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
    events::Counts,
    incidents::{
        Incident,
        evaluator::{Evaluation, Subscriber},
    },
    probes::{
        kind::{Change, Source, Update},
        plan::ProbeStatus,
        probe::Sweep,
    },
    stuck::StuckSet,
};

use kstall_common::metrics::{self as catalogue, Metric, POD_LABELS};

use super::{
    event_counters::EventCounters,
    histogram::CountedHistogramVec,
    series::{self, Admission, Family, FamilySeries, PodName, SeriesBook},
};

pub struct Metrics {
    registry: Registry,
    probe_up: IntGaugeVec,
    events_total: IntCounterVec,
    events_lost_total: IntCounterVec,
    own_cost: OwnCost,
    events_suppressed_total: IntCounterVec,
    decode_errors_total: IntCounterVec,
    subscriber_drops_total: IntCounterVec,
    export_records_total: IntCounterVec,
    export_dropped_total: IntCounterVec,
    unattributed_total: IntCounterVec,
    pod_metadata_up: IntGauge,
    attribution_pods: IntGaugeVec,
    node_pods: IntGaugeVec,
    kubelet_check_up: IntGaugeVec,
    conntrack: Conntrack,
    pressure: Pressure,
    /// Every state `node_pods` has a series for.
    node_pod_states: std::sync::Mutex<std::collections::BTreeSet<PodState>>,
    /// Every series of the families about events: the cap, and a pod's series.
    series: std::sync::Arc<std::sync::Mutex<SeriesBook>>,
    series_dropped_total: IntCounterVec,
    incident_active: IntGaugeVec,
    alertmanager_posts_total: IntCounterVec,
    state_writes_total: IntCounterVec,
    captures_total: IntCounterVec,
    captures_running: IntGauge,
    kubernetes_writes_total: IntCounterVec,
    overcommit: prometheus::Gauge,
    incidents_total: IntCounterVec,
    incident_evictions_total: IntCounterVec,
    stuck_tasks: IntGaugeVec,
    stuck_task_longest_blocked: IntGauge,
    stuck_task_blocked: prometheus::HistogramVec,
    stuck_untracked_total: prometheus::IntCounter,
    sweeps: Sweeps,
    attribution_queue_full_total: IntCounterVec,
    nfs_server_responding: IntGaugeVec,
    nfs_rpc_duration: CountedHistogramVec,
    /// Read into `events_total` and `events_lost_total` when scraped.
    counts: std::sync::Arc<Counts>,
}

fn pod_label_values(a: &Attribution) -> [&str; 5] {
    [&a.namespace, &a.pod, &a.container, &a.workload, if a.host { "true" } else { "false" }]
}

/// `labels` followed by the pod labels.
fn with_pod_labels<'a>(labels: &[&'a str], a: &'a Attribution) -> Vec<&'a str> {
    let mut all = labels.to_vec();
    all.extend(pod_label_values(a));
    all
}

/// Registers `collector`, made from `metric`'s entry.
fn register<T: prometheus::core::Collector + Clone + 'static>(registry: &Registry, collector: T) -> T {
    registry.register(Box::new(collector.clone())).expect("unique metric");
    collector
}

/// Its labels as exported: its own, then the pod labels for a metric about events.
fn labels_of(metric: &Metric) -> Vec<&'static str> {
    let pod: &[&str] = if metric.has_pod_labels() { &POD_LABELS } else { &[] };
    [metric.labels, pod].concat()
}

fn opts(metric: &Metric) -> Opts {
    Opts::new(metric.name, metric.help)
}

fn counter_vec(registry: &Registry, metric: &Metric) -> IntCounterVec {
    register(registry, IntCounterVec::new(opts(metric), &labels_of(metric)).expect("valid metric"))
}

fn gauge_vec(registry: &Registry, metric: &Metric) -> IntGaugeVec {
    register(registry, IntGaugeVec::new(opts(metric), &labels_of(metric)).expect("valid metric"))
}

fn counter(registry: &Registry, metric: &Metric) -> prometheus::IntCounter {
    register(registry, prometheus::IntCounter::with_opts(opts(metric)).expect("valid metric"))
}

fn gauge(registry: &Registry, metric: &Metric) -> IntGauge {
    register(registry, IntGauge::with_opts(opts(metric)).expect("valid metric"))
}

fn histogram_opts(metric: &Metric, buckets: Vec<f64>) -> prometheus::HistogramOpts {
    prometheus::HistogramOpts::new(metric.name, metric.help).buckets(buckets)
}

impl Metrics {
    pub fn new(counts: std::sync::Arc<Counts>, settings: series::Settings) -> Self {
        let registry = Registry::new();
        let build_info = gauge_vec(&registry, &catalogue::BUILD_INFO);
        build_info.with_label_values(&[env!("CARGO_PKG_VERSION")]).set(1);
        let blocked_buckets = [5.0, 15.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0, 4.0 * 3600.0];
        let stuck_task_blocked = register(
            &registry,
            prometheus::HistogramVec::new(
                histogram_opts(&catalogue::STUCK_TASK_BLOCKED, blocked_buckets.to_vec()),
                &labels_of(&catalogue::STUCK_TASK_BLOCKED),
            )
            .expect("valid metric"),
        );
        let overcommit = register(
            &registry,
            prometheus::Gauge::with_opts(opts(&catalogue::NODE_MEMORY_LIMIT_OVERCOMMIT))
                .expect("valid metric"),
        );
        let series = std::sync::Arc::new(std::sync::Mutex::new(SeriesBook::new(settings)));
        register(&registry, EventCounters::new(series.clone()).expect("valid metrics"));
        let metrics = Self {
            probe_up: gauge_vec(&registry, &catalogue::PROBE_UP),
            stuck_tasks: gauge_vec(&registry, &catalogue::STUCK_TASKS),
            stuck_task_longest_blocked: gauge(&registry, &catalogue::STUCK_TASK_LONGEST_BLOCKED),
            stuck_task_blocked,
            sweeps: Sweeps::new(&registry),
            stuck_untracked_total: counter(&registry, &catalogue::STUCK_TASKS_UNTRACKED),
            nfs_server_responding: gauge_vec(&registry, Family::NfsResponding.metric()),
            nfs_rpc_duration: register(
                &registry,
                CountedHistogramVec::new(
                    catalogue::NFS_RPC_DURATION.name,
                    catalogue::NFS_RPC_DURATION.help,
                    &labels_of(&catalogue::NFS_RPC_DURATION),
                    &crate::probes::nfs::LATENCY_BOUNDS_SECONDS,
                )
                .expect("valid metric"),
            ),
            pod_metadata_up: gauge(&registry, &catalogue::POD_METADATA_UP),
            attribution_pods: gauge_vec(&registry, &catalogue::ATTRIBUTION_PODS),
            node_pods: gauge_vec(&registry, &catalogue::NODE_PODS),
            kubelet_check_up: gauge_vec(&registry, &catalogue::KUBELET_CHECK_UP),
            conntrack: Conntrack::new(&registry),
            pressure: Pressure::new(&registry),
            incident_active: gauge_vec(&registry, &catalogue::INCIDENT_ACTIVE),
            overcommit,
            alertmanager_posts_total: counter_vec(&registry, &catalogue::ALERTMANAGER_POSTS),
            state_writes_total: counter_vec(&registry, &catalogue::STATE_WRITES),
            captures_total: counter_vec(&registry, &catalogue::CAPTURES),
            captures_running: gauge(&registry, &catalogue::CAPTURES_RUNNING),
            kubernetes_writes_total: counter_vec(&registry, &catalogue::KUBERNETES_WRITES),
            incidents_total: counter_vec(&registry, &catalogue::INCIDENTS),
            incident_evictions_total: counter_vec(&registry, &catalogue::INCIDENT_STATE_EVICTIONS),
            series,
            series_dropped_total: counter_vec(&registry, &catalogue::METRIC_SERIES_DROPPED),
            node_pod_states: std::sync::Mutex::default(),
            attribution_queue_full_total: counter_vec(&registry, &catalogue::ATTRIBUTION_QUEUE_FULL),
            events_total: counter_vec(&registry, &catalogue::EVENTS),
            events_lost_total: counter_vec(&registry, &catalogue::EVENTS_LOST),
            own_cost: OwnCost::new(&registry),
            events_suppressed_total: counter_vec(&registry, &catalogue::EVENTS_SUPPRESSED),
            decode_errors_total: counter_vec(&registry, &catalogue::EVENT_DECODE_ERRORS),
            unattributed_total: counter_vec(&registry, &catalogue::EVENTS_UNATTRIBUTED),
            subscriber_drops_total: counter_vec(&registry, &catalogue::API_EVENTS_DROPPED),
            export_records_total: counter_vec(&registry, &catalogue::EXPORT_RECORDS),
            export_dropped_total: counter_vec(&registry, &catalogue::EXPORT_RECORDS_DROPPED),
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
        for trigger in ["manual", "incident"] {
            for result in ["complete", "failed"] {
                metrics.captures_total.with_label_values(&[trigger, result]);
            }
        }
        metrics
    }

    pub fn set_probe_statuses(&self, statuses: &[ProbeStatus]) {
        for s in statuses {
            self.probe_up.with_label_values(&[s.name.as_str()]).set(i64::from(s.up));
        }
    }

    /// An event that is news (repeated hung-task reports are not): what its kind says it does
    /// to its families.
    pub fn observe(&self, attributed: &Attributed) {
        let (event, who) = (&attributed.event, &*attributed.who);
        let data = event.payload.data();
        if let Some(n) = data.suppressed() {
            self.counts.suppressed(event.header.probe, n);
        }
        let source = Source { probe: event.header.probe, comm: &event.header.comm };
        for update in data.updates(&source) {
            self.apply(&update, who, event.header.time_unix_ns);
        }
    }

    fn apply(&self, update: &Update, who: &Attribution, at: u64) {
        let own: Vec<&str> = update.labels.iter().map(String::as_str).collect();
        match (Family::of(update.metric), &update.change) {
            (Some(family), Change::Add(n)) => self.inc_by(family, &with_pod_labels(&own, who), who, *n),
            (Some(family), Change::Set(v)) => self.set(family, &with_pod_labels(&own, who), who, *v, at),
            (Some(Family::NfsRpcDuration), Change::Buckets { counts, sum }) => {
                self.add_buckets(&with_pod_labels(&own, who), who, counts, *sum)
            }
            (None, Change::Observe(v)) if update.metric == &catalogue::STUCK_TASK_BLOCKED => {
                self.stuck_task_blocked.with_label_values(&own).observe(*v)
            }
            _ => tracing::warn!(
                metric = update.metric.name,
                "an event updates a metric the exporter does not update so"
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
    pub fn task_sweep(&self, sweep: &Result<Sweep, String>) {
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

    /// A counter's series lives in the book alone, which `EventCounters` exports.
    fn inc_by(&self, family: Family, labels: &[&str], who: &Attribution, n: u64) {
        if !family.is_counter() {
            return;
        }
        let mut book = self.series.lock().expect("series book");
        match book.admit(family, labels, who) {
            Admission::Series(slot) => book.update(slot, |v| *v = v.saturating_add(n as i64)),
            Admission::Overflow { first } => {
                book.add_overflow(family, n);
                self.dropped(family, first);
            }
        }
    }

    /// A gauge has no overflow series (a value of many series means nothing): the update is
    /// dropped and counted.
    fn set(&self, family: Family, labels: &[&str], who: &Attribution, value: i64, at: u64) {
        let mut book = self.series.lock().expect("series book");
        match book.admit(family, labels, who) {
            Admission::Series(slot) => {
                if book.set_if_newer(slot, value, at) && family == Family::NfsResponding {
                    self.nfs_server_responding.with_label_values(labels).set(value);
                }
            }
            Admission::Overflow { first } => self.dropped(family, first),
        }
    }

    /// A histogram's overflow series takes what the cap refused, as a counter's does.
    fn add_buckets(&self, labels: &[&str], who: &Attribution, counts: &[u64], sum: f64) {
        let family = Family::NfsRpcDuration;
        let observed = counts.iter().fold(0u64, |total, n| total.saturating_add(*n));
        let mut book = self.series.lock().expect("series book");
        match book.admit(family, labels, who) {
            Admission::Series(slot) => {
                self.nfs_rpc_duration.add(labels, counts, sum);
                book.update(slot, |v| *v = v.saturating_add(observed as i64));
            }
            Admission::Overflow { first } => {
                self.nfs_rpc_duration.add(&family.overflow_labels(), counts, sum);
                self.dropped(family, first);
            }
        }
    }

    fn dropped(&self, family: Family, first: bool) {
        if first {
            self.series_dropped_total.with_label_values(&[family.name()]).inc();
        }
    }

    /// The series count, cap and refusals of each family about events (`kstall status`).
    pub fn families(&self) -> Vec<FamilySeries> {
        self.series.lock().expect("series book").families()
    }

    /// Removes the series of pods kstall no longer names (deleted longer than the retention
    /// time): a node's pods churn, its metric series must not grow with them forever.
    pub fn forget_pods_except(&self, named: &std::collections::HashSet<PodName>) {
        let gone = self.series.lock().expect("series book").take_except(named);
        // A counter's series went with its entry.
        for series::Entry { family, labels, .. } in gone {
            let labels: Vec<&str> = labels.iter().map(String::as_str).collect();
            match family {
                Family::NfsRpcDuration => self.nfs_rpc_duration.remove(&labels),
                Family::NfsResponding => {
                    let _ = self.nfs_server_responding.remove_label_values(&labels);
                }
                _ => {}
            }
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
                // A histogram's book value is its count of observations.
                let suffix = if s.family.metric().kind == catalogue::Type::Histogram { "_count" } else { "" };
                format!("{}{suffix}{{{}}} {}", s.family.name(), own.join(","), s.value)
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
                .with_label_values(&[
                    &i.signature,
                    i.severity.as_str(),
                    &i.node,
                    &i.namespace,
                    &i.pod,
                    &i.workload,
                ])
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

    /// A capture ended (`trigger`: manual or incident; `complete`: a bundle kept), and how many run.
    pub fn capture_ended(&self, trigger: &str, complete: bool, running: usize) {
        self.captures_total.with_label_values(&[trigger, if complete { "complete" } else { "failed" }]).inc();
        self.set_captures_running(running);
    }

    pub fn set_captures_running(&self, running: usize) {
        self.captures_running.set(running as i64);
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

    pub fn export_written(&self, output: &str, record: &str, n: u64) {
        self.export_records_total.with_label_values(&[output, record]).inc_by(n);
    }

    pub fn export_dropped(&self, output: &str, record: &str, reason: &str, n: u64) {
        self.export_dropped_total.with_label_values(&[output, record, reason]).inc_by(n);
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
        self.own_cost.show(&self.counts);
        let mut out = Vec::new();
        TextEncoder::new().encode(&self.registry.gather(), &mut out).expect("text encoding");
        String::from_utf8(out).expect("prometheus text is UTF-8")
    }
}

/// What fires, for `kstall_incident_active` and the counters of incidents; the kubelet's checks
/// as the evaluation saw them.
impl Subscriber for std::sync::Arc<Metrics> {
    fn publish(&mut self, evaluation: &Evaluation) {
        self.set_kubelet(evaluation.kubelet);
        self.conntrack.set(evaluation.conntrack);
        self.pressure.set(evaluation.pressure);
        self.set_incidents(evaluation.firing.iter(), evaluation.fired, evaluation.evictions);
    }
}

/// The connection tracking tables of the last sample: the tables in use (entries, or drops), the
/// series of one that is gone removed.
struct Conntrack {
    max: IntGauge,
    entries: IntGaugeVec,
    drops_total: IntCounterVec,
    /// The sample shown, and the tables it showed by (namespace, pod).
    shown: std::sync::Mutex<(u64, std::collections::HashSet<[String; 2]>)>,
}

impl Conntrack {
    fn new(registry: &Registry) -> Self {
        Self {
            max: gauge(registry, &catalogue::CONNTRACK_MAX),
            entries: gauge_vec(registry, &catalogue::CONNTRACK_ENTRIES),
            drops_total: counter_vec(registry, &catalogue::CONNTRACK_DROPS),
            shown: std::sync::Mutex::default(),
        }
    }

    fn set(&self, tables: &crate::conntrack::Tables) {
        let mut shown = self.shown.lock().expect("conntrack series");
        if shown.0 == tables.sample {
            return;
        }
        shown.0 = tables.sample;
        let Some(max) = tables.max else { return };
        self.max.set(max as i64);
        let mut now = std::collections::HashSet::new();
        for t in &tables.tables {
            let c = &t.counters;
            let refused = c.drop.saturating_sub(c.insert_failed);
            let labels = [t.who.namespace.clone(), t.who.pod.clone()];
            if (c.entries == 0 && refused == 0 && !t.who.host) || !now.insert(labels.clone()) {
                continue;
            }
            let labels: [&str; 2] = [&labels[0], &labels[1]];
            self.entries.with_label_values(&labels).set(c.entries as i64);
            let drops = self.drops_total.with_label_values(&labels);
            drops.inc_by(refused.saturating_sub(drops.get()));
        }
        for gone in shown.1.difference(&now) {
            let labels: [&str; 2] = [&gone[0], &gone[1]];
            let _ = self.entries.remove_label_values(&labels);
            let _ = self.drops_total.remove_label_values(&labels);
        }
        shown.1 = now;
    }
}

/// The agent's own cost as the kernel counts it, read when scraped: each program's runs, run time
/// and skipped runs; the ring buffer's fill.
struct OwnCost {
    runs_total: IntCounterVec,
    run_seconds_total: prometheus::CounterVec,
    missed_total: IntCounterVec,
    stats_enabled: IntGauge,
    ring_size: IntGauge,
    ring_used: IntGauge,
    ring_used_max: IntGauge,
}

impl OwnCost {
    fn new(registry: &Registry) -> Self {
        let metric = &catalogue::PROGRAM_RUN_SECONDS;
        let seconds = prometheus::CounterVec::new(opts(metric), &labels_of(metric)).expect("valid metric");
        Self {
            runs_total: counter_vec(registry, &catalogue::PROGRAM_RUNS),
            run_seconds_total: register(registry, seconds),
            missed_total: counter_vec(registry, &catalogue::PROGRAM_RUNS_MISSED),
            stats_enabled: gauge(registry, &catalogue::PROGRAM_STATS_ENABLED),
            ring_size: gauge(registry, &catalogue::RING_BUFFER_SIZE),
            ring_used: gauge(registry, &catalogue::RING_BUFFER_USED),
            ring_used_max: gauge(registry, &catalogue::RING_BUFFER_USED_MAX),
        }
    }

    fn show(&self, counts: &Counts) {
        let enabled =
            counts.run_time_stats_held() || crate::probes::runs::run_time_stats_enabled().unwrap_or(false);
        self.stats_enabled.set(i64::from(enabled));
        for (program, runs) in counts.programs() {
            let label = [program.as_str()];
            let total = self.runs_total.with_label_values(&label);
            total.inc_by(runs.count.saturating_sub(total.get()));
            let seconds = self.run_seconds_total.with_label_values(&label);
            seconds.inc_by((runs.run_ns as f64 / 1e9 - seconds.get()).max(0.0));
            if let Some(missed) = runs.missed {
                let total = self.missed_total.with_label_values(&label);
                total.inc_by(missed.saturating_sub(total.get()));
            }
        }
        let (size, (used, used_max)) = (counts.ring_size(), counts.ring_fill());
        if size > 0 {
            self.ring_size.set(size as i64);
            self.ring_used.set(used as i64);
            self.ring_used_max.set(used_max as i64);
        }
    }
}

/// Pressure of the last sample: the node's and each known pod's, the series of a pod that is
/// gone removed.
struct Pressure {
    stalled_seconds_total: prometheus::CounterVec,
    /// The sample shown, and the (namespace, pod) it showed.
    shown: std::sync::Mutex<(u64, std::collections::HashSet<[String; 2]>)>,
}

impl Pressure {
    fn new(registry: &Registry) -> Self {
        let metric = &catalogue::PRESSURE_STALLED;
        let vec = prometheus::CounterVec::new(opts(metric), &labels_of(metric)).expect("valid metric");
        Self { stalled_seconds_total: register(registry, vec), shown: std::sync::Mutex::default() }
    }

    fn set(&self, sample: &crate::pressure::Sample) {
        let mut shown = self.shown.lock().expect("pressure series");
        if shown.0 == sample.sample {
            return;
        }
        shown.0 = sample.sample;
        let mut now = std::collections::HashSet::new();
        let node = sample.node.iter().map(|s| (String::new(), String::new(), s));
        let pods = sample.pods.iter().map(|p| (p.who.namespace.clone(), p.who.pod.clone(), &p.stalls));
        for (namespace, pod, stalls) in node.chain(pods) {
            if !now.insert([namespace.clone(), pod.clone()]) {
                continue;
            }
            for (resource, figures) in crate::pressure::RESOURCES.iter().zip(stalls.resources) {
                let Some(figures) = figures else { continue };
                for (kind, line) in [("some", Some(figures.some)), ("full", figures.full)] {
                    let Some(line) = line else { continue };
                    let series =
                        self.stalled_seconds_total.with_label_values(&[resource, kind, &namespace, &pod]);
                    let seconds = line.total_us as f64 / 1e6;
                    if seconds > series.get() {
                        series.inc_by(seconds - series.get());
                    }
                }
            }
        }
        for gone in shown.1.difference(&now) {
            for resource in crate::pressure::RESOURCES {
                for kind in ["some", "full"] {
                    let _ =
                        self.stalled_seconds_total.remove_label_values(&[resource, kind, &gone[0], &gone[1]]);
                }
            }
        }
        shown.1 = now;
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
        let kernel_buckets = vec![0.0002, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.5];
        let kernel_seconds = prometheus::Histogram::with_opts(histogram_opts(
            &catalogue::STUCK_TASK_SWEEP_KERNEL_SECONDS,
            kernel_buckets,
        ))
        .expect("valid metric");
        Self {
            total: counter(registry, &catalogue::STUCK_TASK_SWEEPS),
            failures_total: counter(registry, &catalogue::STUCK_TASK_SWEEP_FAILURES),
            kernel_seconds: register(registry, kernel_seconds),
            tasks: gauge(registry, &catalogue::STUCK_TASK_SWEEP_TASKS),
            uninterruptible: gauge(registry, &catalogue::STUCK_TASK_SWEEP_UNINTERRUPTIBLE),
            over_limit_total: counter(registry, &catalogue::STUCK_TASK_REPORTS_OVER_LIMIT),
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
        events::{Decoder, Event, Payload},
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

    /// Every catalogue entry is registered (a second metric of its name is refused), and every
    /// family `/metrics` shows is the catalogue's, with its help and type.
    #[test]
    fn the_exported_metrics_are_the_catalogues() {
        let m = Metrics::new(Default::default(), Default::default());
        for metric in catalogue::ALL {
            let again = prometheus::IntGauge::new(metric.name, "again").unwrap();
            assert!(
                matches!(m.registry.register(Box::new(again)), Err(prometheus::Error::AlreadyReg)),
                "{} is in the catalogue but not registered",
                metric.name
            );
        }
        let text = m.render();
        let mut shown = 0;
        for line in text.lines() {
            if let Some(rest) = line.strip_prefix("# HELP ") {
                let (name, help) = rest.split_once(' ').unwrap();
                let metric =
                    catalogue::find(name).unwrap_or_else(|| panic!("{name} is not in the catalogue"));
                assert_eq!(help, metric.help, "{name}");
                shown += 1;
            }
            if let Some(rest) = line.strip_prefix("# TYPE ") {
                let (name, kind) = rest.split_once(' ').unwrap();
                let expected = match catalogue::find(name).unwrap().kind {
                    catalogue::Type::Counter => "counter",
                    catalogue::Type::Gauge => "gauge",
                    catalogue::Type::Histogram => "histogram",
                };
                assert_eq!(kind, expected, "{name}");
            }
        }
        assert!(shown > 10, "{text}");
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

    /// The kernel's histogram of a pod's RPCs, summed over intervals, per server and operation;
    /// capped like any family; gone with the pod.
    #[test]
    fn rpc_latency_histograms_per_pod() {
        let m = Metrics::new(Default::default(), series::Settings { max_series_per_metric: 1 });
        let who = |pod: &str| {
            std::sync::Arc::new(Attribution {
                namespace: "shop".into(),
                pod: pod.into(),
                ..Default::default()
            })
        };
        let writes = |pod: &str| Attributed {
            event: Event {
                payload: Payload::NfsLatency(crate::probes::nfs::tests::slow_writes()),
                ..detail_event()
            },
            who: who(pod),
        };
        m.observe(&writes("catalog-0"));
        m.observe(&writes("catalog-0"));
        let text = m.render();
        let labels = r#"container="",host="false",namespace="shop",operation="WRITE",pod="catalog-0",server="10.55.0.1",workload="""#;
        for line in [
            format!(r#"kstall_nfs_rpc_duration_seconds_bucket{{{labels},le="0.001"}} 16"#),
            format!(r#"kstall_nfs_rpc_duration_seconds_bucket{{{labels},le="0.5"}} 16"#),
            format!(r#"kstall_nfs_rpc_duration_seconds_bucket{{{labels},le="1"}} 20"#),
            format!(r#"kstall_nfs_rpc_duration_seconds_bucket{{{labels},le="+Inf"}} 20"#),
            format!("kstall_nfs_rpc_duration_seconds_count{{{labels}}} 20"),
            format!("kstall_nfs_rpc_duration_seconds_sum{{{labels}}} 3.2112"),
        ] {
            assert!(text.lines().any(|l| l == line), "{line} missing:\n{text}");
        }
        assert_eq!(
            m.pod_activity("shop", "catalog-0"),
            [r#"kstall_nfs_rpc_duration_seconds_count{operation="WRITE",server="10.55.0.1"} 20"#]
        );
        // Past the cap: the overflow series takes it.
        m.observe(&writes("checkout-0"));
        let text = m.render();
        let overflow = r#"kstall_nfs_rpc_duration_seconds_count{container="",host="",namespace="",operation="overflow",pod="",server="overflow",workload=""} 10"#;
        assert!(text.lines().any(|l| l == overflow), "{text}");
        m.forget_pods_except(&Default::default());
        assert!(!m.render().contains(r#"pod="catalog-0""#));
    }

    fn detail_event() -> Event {
        Decoder::default().decode(&bytes_of(&redirected_syn_reset())).unwrap()
    }

    /// `raw` as the agent takes it in: the event, then the kernel's count of its series.
    fn observe_nfs(m: &Metrics, raw: &kstall_common::nfs::NfsEvent, who: &std::sync::Arc<Attribution>) {
        // One decoder, as in the agent: each new one reads the clocks anew, and the jitter
        // could put a later event before an earlier one.
        thread_local!(static DECODER: Decoder = Decoder::default());
        let event = DECODER.with(|d| d.decode(&bytes_of(raw))).unwrap();
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
        assert!(text.contains(r#"kstall_incident_active{namespace="shop",node="node-a",pod="web-1",severity="critical",signature="nfs-sidecar-redirect",workload=""} 1"#), "{text}");
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
