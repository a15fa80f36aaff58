//! The Grafana dashboards' queries (deploy/grafana/*.json, written by `cargo xtask dashboards`),
//! run as Grafana runs them against a real Prometheus scraping a test's agent: the proof that
//! every panel shows data — tests/tests/dashboards.rs on the host, tests/tests/vm_scenarios.rs in
//! the kernel-matrix VMs for the panels only the VMs can feed.

use std::{
    net::SocketAddr,
    path::PathBuf,
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use serde_json::Value;

use crate::{alerting, host::wait_for};

/// A query of a dashboard: (dashboard file stem, panel title, refId).
pub type Key = (&'static str, &'static str, &'static str);

/// The queries each VM scenario shows data for (tests/tests/vm_scenarios.rs): what this host
/// cannot feed — its kernel has no NFS client, and it must not run out of memory.
pub const NFS_PROBES: &[Key] = &[
    ("kstall-incidents", "Alerts firing now", "KstallNfsServerUnreachable"),
    ("kstall-nfs", "Server responding", "A"),
    ("kstall-nfs", "Major RPC timeouts", "A"),
    ("kstall-nfs", "RPC retransmits", "A"),
    ("kstall-nfs", "Connect errors", "A"),
    ("kstall-nfs", "NFS errors by node", "A"),
    ("kstall-nfs", "NFS errors by node", "B"),
    ("kstall-nfs", "NFS errors by node", "C"),
    ("kstall-fleet", "Nodes not reaching each NFS server", "A"),
];
pub const NODE_WIDE_STALL: &[Key] = &[
    ("kstall-incidents", "Alerts firing now", "KstallNfsNodeWideStall"),
    ("kstall-nfs", "Tasks stuck in NFS waits", "A"),
];
pub const NFS_SLOW: &[Key] = &[
    ("kstall-incidents", "Alerts firing now", "KstallNfsSlow"),
    ("kstall-nfs", "RPC latency p99", "A"),
    ("kstall-nfs", "Slowest operations (p99)", "A"),
];
pub const CPU_SOFT_LOCKUP: &[Key] = &[
    ("kstall-incidents", "Alerts firing now", "KstallCpuSoftLockup"),
    ("kstall-hung-tasks", "CPUs stuck in the kernel (soft lockups, RCU stalls)", "A"),
];
pub const MEMORY_PRESSURE: &[Key] = &[("kstall-incidents", "Alerts firing now", "KstallMemoryPressure")];
pub const SYSTEM_OOM: &[Key] = &[
    ("kstall-incidents", "Alerts firing now", "KstallSystemOom"),
    ("kstall-memory-oom", "System (global) OOM kills by victim", "A"),
];

/// Every query a VM scenario shows data for.
pub fn fed_by_the_vm_scenarios() -> impl Iterator<Item = Key> {
    [NFS_PROBES, NODE_WIDE_STALL, NFS_SLOW, CPU_SOFT_LOCKUP, MEMORY_PRESSURE, SYSTEM_OOM]
        .into_iter()
        .flatten()
        .copied()
}

/// Every dashboard: (file stem, JSON).
pub fn dashboards() -> Vec<(String, Value)> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(crate::workspace().join("deploy/grafana"))
        .expect("deploy/grafana")
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
        .collect();
    files.sort();
    assert!(files.len() >= 6, "the dashboards: {files:?} (`cargo xtask dashboards` writes them)");
    files
        .into_iter()
        .map(|path| {
            let name = path.file_stem().unwrap().to_string_lossy().into_owned();
            let text = std::fs::read_to_string(&path).unwrap();
            (name, serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display())))
        })
        .collect()
}

/// One query of one panel, as Grafana runs it: an instant query at the end of the time range, or
/// a range query over it.
pub struct Query {
    pub dashboard: String,
    pub panel: String,
    pub ref_id: String,
    pub expr: String,
    pub instant: bool,
}

impl Query {
    pub fn key(&self) -> (&str, &str, &str) {
        (&self.dashboard, &self.panel, &self.ref_id)
    }

    pub fn name(&self) -> String {
        format!("{} / {} / {}", self.dashboard, self.panel, self.ref_id)
    }
}

pub fn queries(dashboards: &[(String, Value)]) -> Vec<Query> {
    let mut queries = Vec::new();
    for (dashboard, json) in dashboards {
        for panel in json["panels"].as_array().expect("panels") {
            for target in panel["targets"].as_array().into_iter().flatten() {
                queries.push(Query {
                    dashboard: dashboard.clone(),
                    panel: panel["title"].as_str().unwrap().to_string(),
                    ref_id: target["refId"].as_str().unwrap().to_string(),
                    expr: target["expr"].as_str().unwrap().to_string(),
                    instant: target["instant"] == true,
                });
            }
        }
    }
    queries
}

/// The queries named by `keys`; panics on a key that names none (a list gone stale).
pub fn select<'a>(queries: &'a [Query], keys: &[Key]) -> Vec<&'a Query> {
    keys.iter()
        .map(|key| {
            let (d, p, r) = *key;
            queries
                .iter()
                .find(|q| q.key() == (d, p, r))
                .unwrap_or_else(|| panic!("{d} / {p} / {r}: no such query"))
        })
        .collect()
}

/// The `label_values(<selector>, <label>)` variables of a dashboard: (name, selector, label).
pub fn variable_queries(dashboard: &Value) -> Vec<(String, String, String)> {
    let list = dashboard["templating"]["list"].as_array().expect("templating");
    list.iter()
        .filter(|v| v["type"] == "query")
        .map(|v| {
            let definition = v["definition"].as_str().unwrap();
            let inner = definition.strip_prefix("label_values(").and_then(|d| d.strip_suffix(')'));
            let (selector, label) = inner.and_then(|i| i.rsplit_once(", ")).unwrap_or_else(|| {
                panic!("variable {}: `{definition}` is not label_values(<selector>, <label>)", v["name"])
            });
            (v["name"].as_str().unwrap().to_string(), selector.to_string(), label.to_string())
        })
        .collect()
}

/// What a dashboard user selected: a node, and a namespace and pod or "All" (`None`).
pub struct Selection {
    pub node: String,
    pub namespace: Option<String>,
    pub pod: Option<String>,
}

/// What Grafana puts for the variables: a selected value regex-escaped as its Prometheus data
/// source does for multi-value variables ("All" is `.*`), the time range and the rate interval.
pub struct Variables<'a> {
    pub selection: &'a Selection,
    pub range_secs: u64,
    pub rate_interval_secs: u64,
}

impl Variables<'_> {
    pub fn apply(&self, expr: &str) -> String {
        fn value(selected: Option<&str>) -> String {
            let Some(selected) = selected else { return ".*".into() };
            selected.chars().fold(String::new(), |mut s, c| {
                if "\\^$.|?*+()[]{}".contains(c) {
                    s.push_str("\\\\");
                }
                s.push(c);
                s
            })
        }
        let s = self.selection;
        expr.replace("$__rate_interval", &format!("{}s", self.rate_interval_secs))
            .replace("$__range", &format!("{}s", self.range_secs))
            .replace("$node", &value(Some(&s.node)))
            .replace("$namespace", &value(s.namespace.as_deref()))
            .replace("$pod", &value(s.pod.as_deref()))
    }
}

/// A real Prometheus scraping a test's agent, and the time its data starts.
pub struct Panels {
    prometheus: alerting::Service,
    started: SystemTime,
}

impl Panels {
    /// Scrapes `agent` every second as job `kstall`, its series labelled `node` as the deployment's
    /// scrape does from the pod's node name (`docs/dashboards.md`).
    pub fn scrape(agent: SocketAddr, node: &str) -> Self {
        let started = SystemTime::now();
        let prometheus = alerting::prometheus_with_config(format!(
            "global: {{scrape_interval: 1s}}\n\
             scrape_configs: [{{job_name: kstall, static_configs: [{{targets: ['{agent}'], labels: {{node: '{node}'}}}}]}}]\n"
        ));
        Panels { prometheus, started }
    }

    pub fn addr(&self) -> SocketAddr {
        self.prometheus.addr
    }

    /// The variables of `selection` for a range from the first scrape to `end`: Grafana's
    /// $__rate_interval, max(step + scrape interval, 4 × scrape interval), for a 1 s step and scrape.
    pub fn variables<'a>(&self, selection: &'a Selection, end: u64) -> Variables<'a> {
        Variables { selection, range_secs: end - unix_secs(self.started) + 1, rate_interval_secs: 4 }
    }

    /// What Prometheus answers `q`, as Grafana asks it: the series (instant) or the series with
    /// samples (range); an error names the query.
    pub fn run(&self, q: &Query, selection: &Selection, end: u64) -> Result<Vec<Value>, String> {
        let expr = self.variables(selection, end).apply(&q.expr);
        let path = if q.instant {
            format!("/api/v1/query?query={}&time={end}", encoded(&expr))
        } else {
            let start = unix_secs(self.started);
            format!("/api/v1/query_range?query={}&start={start}&end={end}&step=1", encoded(&expr))
        };
        let body = alerting::http_get(self.addr(), &path)
            .ok_or_else(|| format!("{}: query failed: {expr}", q.name()))?;
        let answer: Value = serde_json::from_str(&body).map_err(|e| format!("{}: {e}: {body}", q.name()))?;
        let series = answer["data"]["result"].as_array().cloned().unwrap_or_default();
        Ok(series.into_iter().filter(|s| s["values"].as_array().is_none_or(|v| !v.is_empty())).collect())
    }

    /// Runs every query until it shows data (the scrapes and rate windows catch up) or `timeout`:
    /// the series each one showed, and one line (dashboard, panel, refId, query) per query that
    /// showed none or failed.
    pub fn await_data(
        &self,
        queries: &[&Query],
        selection: &Selection,
        timeout: Duration,
    ) -> (Vec<(String, Vec<Value>)>, Vec<String>) {
        let (mut shown, mut failures) = (Vec::new(), Vec::new());
        let mut pending: Vec<&Query> = queries.to_vec();
        wait_for(timeout, || {
            let end = unix_secs(SystemTime::now());
            pending.retain(|q| match self.run(q, selection, end) {
                Ok(series) if series.is_empty() => true,
                Ok(series) => {
                    shown.push((q.name(), series));
                    false
                }
                Err(e) => {
                    failures.push(e);
                    false
                }
            });
            pending.is_empty().then_some(())
        });
        let end = unix_secs(SystemTime::now());
        let vars = self.variables(selection, end);
        failures.extend(pending.iter().map(|q| format!("{}: no data: {}", q.name(), vars.apply(&q.expr))));
        (shown, failures)
    }

    /// Waits until each dashboard's `node`, `namespace` and `pod` variables list `selection`'s;
    /// one line per variable that does not.
    pub fn await_variables(
        &self,
        dashboards: &[(String, Value)],
        selection: &Selection,
        timeout: Duration,
    ) -> Vec<String> {
        let mut pending: Vec<(String, String, String, String)> = dashboards
            .iter()
            .flat_map(|(d, json)| {
                variable_queries(json).into_iter().map(move |(n, s, l)| (d.clone(), n, s, l))
            })
            .collect();
        wait_for(timeout, || {
            let end = unix_secs(SystemTime::now());
            let vars = self.variables(selection, end);
            pending.retain(|(_, name, selector, label)| {
                let wanted = match name.as_str() {
                    "node" => Some(&selection.node),
                    "namespace" => selection.namespace.as_ref(),
                    _ => selection.pod.as_ref(),
                };
                let Some(wanted) = wanted else { return false };
                let path = format!(
                    "/api/v1/label/{label}/values?match[]={}&start={}&end={end}",
                    encoded(&vars.apply(selector)),
                    unix_secs(self.started)
                );
                let values = alerting::http_get(self.addr(), &path).unwrap_or_default();
                let listed = serde_json::from_str::<Value>(&values)
                    .ok()
                    .and_then(|v| v["data"].as_array().cloned())
                    .is_some_and(|v| v.iter().any(|x| x == wanted.as_str()));
                !listed
            });
            pending.is_empty().then_some(())
        });
        pending
            .iter()
            .map(|(d, n, s, _)| format!("{d}: variable {n} does not list the selected value: {s}"))
            .collect()
    }
}

/// How many series, and the first one's labels and last value, for a test's log.
pub fn described(series: &[Value]) -> String {
    let first = &series[0];
    let value = first["value"].get(1).or_else(|| first["values"].as_array()?.last()?.get(1));
    format!(
        "{} series, e.g. {} = {}",
        series.len(),
        first["metric"],
        value.and_then(Value::as_str).unwrap_or("?")
    )
}

fn encoded(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

fn unix_secs(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH).unwrap().as_secs()
}
