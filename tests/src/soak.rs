//! The soak: pods churned through the pods file against a real agent held to the DaemonSet's
//! memory limit — each pod a real container cgroup, network namespace and sandbox process made and
//! removed here, with resets from every pod and OOM kills along the way — and what the agent
//! holds measured before, at the peak, and once every pod is past retention.

use std::{
    net::{Ipv4Addr, SocketAddr},
    path::Path,
    time::{Duration, Instant},
};

use serde_json::Value;

use crate::{
    agent::{Agent, LimitedAgent, pod_json, write_pods_file},
    cgroup::{Cgroup, MemoryLimit, PodProcess},
    host::{memory_kib, wait_for},
    netns::{NetNs, refused_connects},
    oom::{OOM_LIMIT, oom_kill},
};

/// Pods alive at once.
const LIVE: usize = 20;
/// One pod in this many is OOM-killed once.
const OOM_EVERY: usize = 50;
/// Short, so that the churned pods are forgotten within the run.
const RETENTION: &str = "10s";

/// What the agent holds, read from the outside.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Held {
    pub rss_kib: u64,
    pub fds: usize,
    /// Series of every event metric family (`kstall status`).
    pub series: u64,
    /// Of those, the series naming a pod: what grows with the pods a node has seen unless the
    /// agent forgets them. The others carry classes (reason, protocol, direction, port class) of
    /// the host's own traffic or of namespaces already gone: their set follows what the host
    /// does meanwhile, bounded by the classes, not by the pods churned.
    pub pod_series: u64,
    /// The attribution index: pods known (running and deleted), cgroups, pod network namespaces.
    pub index: u64,
}

impl Held {
    fn of(agent: &Agent) -> Self {
        // A scrape first: it returns what it freed to the kernel, as every scrape does.
        let pod_series = pod_series(&agent.metrics()).len() as u64;
        let status = agent.status();
        let a = &status["attribution"];
        let n = |v: &Value| v.as_u64().unwrap_or(0);
        let series = status["series"].as_array().map_or(0, |f| f.iter().map(|f| n(&f["series"])).sum());
        let fds = std::fs::read_dir(format!("/proc/{}/fd", agent.pid())).map_or(0, |d| d.count());
        Held {
            rss_kib: memory_kib(agent.pid()).0,
            fds,
            series,
            pod_series,
            index: n(&a["pods"]) + n(&a["cgroups"]) + n(&a["pod_namespaces"]),
        }
    }

    fn max(self, other: Held) -> Held {
        Held {
            rss_kib: self.rss_kib.max(other.rss_kib),
            fds: self.fds.max(other.fds),
            series: self.series.max(other.series),
            pod_series: self.pod_series.max(other.pod_series),
            index: self.index.max(other.index),
        }
    }
}

/// The samples of `metrics` about events that name a pod.
fn pod_series(metrics: &str) -> Vec<&str> {
    metrics
        .lines()
        .filter(|l| !l.starts_with('#') && l.contains("host=\"") && !l.contains("pod=\"\""))
        .collect()
}

#[derive(Debug)]
pub struct Report {
    pub pods: usize,
    pub resets: usize,
    pub oom_kills: usize,
    pub churn: Duration,
    pub baseline: Held,
    pub peak: Held,
    pub after: Held,
    /// The agent's peak resident size (VmHWM), start-up's BTF parsing included.
    pub high_water_kib: u64,
    /// The series naming a pod still exported after the churn: none, once every pod is forgotten.
    pub pod_series_left: Vec<String>,
    /// The memory limit it was held to: the DaemonSet's.
    pub limit_bytes: u64,
}

impl Report {
    /// Each figure after the churn within 10% of its baseline (and one unit: a baseline of 0);
    /// no series naming a pod.
    pub fn returned(&self) -> Vec<String> {
        let (b, a) = (self.baseline, self.after);
        [("RSS KiB", b.rss_kib, a.rss_kib), ("fds", b.fds as u64, a.fds as u64), ("index", b.index, a.index)]
            .into_iter()
            .filter(|(_, base, after)| *after as f64 > *base as f64 * 1.1 + 1.0)
            .map(|(what, base, after)| format!("{what}: {base} before, {after} after"))
            .chain(self.pod_series_left.iter().map(|s| format!("a forgotten pod's series: {s}")))
            .collect()
    }

    pub fn lines(&self) -> String {
        let row = |name: &str, h: &Held| {
            format!(
                "  {name:<9} RSS {:>6.1} MiB  fds {:>4}  series {:>5} (naming a pod {:>5})  index {:>5}\n",
                h.rss_kib as f64 / 1024.0,
                h.fds,
                h.series,
                h.pod_series,
                h.index
            )
        };
        format!(
            "soak: {} pods churned in {:.0} s ({} resets, {} OOM kills), agent limited to {} MiB, peak {:.1} MiB\n{}{}{}",
            self.pods,
            self.churn.as_secs_f64(),
            self.resets,
            self.oom_kills,
            self.limit_bytes >> 20,
            self.high_water_kib as f64 / 1024.0,
            row("baseline", &self.baseline),
            row("peak", &self.peak),
            row("after", &self.after),
        )
    }
}

/// One churned pod: what the kubelet and the runtime would have made.
struct Pod {
    json: Value,
    netns: NetNs,
    /// Held for the pod's life; dropped (killed) before the cgroup is removed.
    _sandbox: PodProcess,
    limit: Option<MemoryLimit>,
    cgroup: Cgroup,
}

impl Pod {
    fn new(i: usize) -> Self {
        let uid = format!("50a50a50-0000-4000-8000-{i:012}");
        let container = format!("{i:064x}");
        let cgroup = Cgroup::kubepods_container("burstable", &uid, &container);
        let netns = NetNs::new(&format!("soak{i}"));
        let sandbox = PodProcess::start(&netns, &cgroup.procs());
        let json = pod_json(&uid, &format!("soak-{i}"), &container);
        Pod { json, netns, _sandbox: sandbox, limit: None, cgroup }
    }
}

/// Pods churned before the baseline is taken: the agent's first pods, resets and OOM kill warm
/// up what it keeps for good (the unattributed series of class ports, pools, caches), so that
/// the baseline is a steady state, as the figures after the churn are.
const WARM_UP: usize = 2 * LIVE + OOM_EVERY / 2 + 1;

/// Until every pod the agent knew is forgotten (past retention): what it holds then.
fn forgotten(agent: &Agent) -> Option<Held> {
    wait_for(Duration::from_secs(120), || {
        let status = agent.status();
        let a = &status["attribution"];
        (a["pods"] == 0 && a["pod_namespaces"] == 0).then(|| Held::of(agent))
    })
}

/// Churns `pods` pods (after a warm-up), taking at least `at_least`, and measures.
pub fn soak(pods: usize, at_least: Duration) -> Report {
    let dir = tempfile::tempdir().expect("a folder for the pods file");
    let pods_file = dir.path().join("pods.json");
    write_pods_file(&pods_file, &[]);
    let agent = LimitedAgent::start(
        "soak-agent",
        &["--pods-file", pods_file.to_str().unwrap(), "--pod-retention", RETENTION],
    );
    // The QoS parents the pods share, made once: a pod's cgroup then removes only its own.
    let _parents = Cgroup::at("kubepods.slice/kubepods-burstable.slice");
    churn(&agent, &pods_file, 0..WARM_UP, Duration::ZERO);
    let baseline = forgotten(&agent).expect("the warm-up's pods forgotten");
    let started = Instant::now();
    let (resets, oom_kills, peak) = churn(&agent, &pods_file, WARM_UP..WARM_UP + pods, at_least);
    let peak = peak.max(baseline);
    let churn = started.elapsed();
    let after = forgotten(&agent).unwrap_or_else(|| Held::of(&agent));
    let pod_series_left = pod_series(&agent.metrics()).into_iter().map(String::from).collect();
    let high_water_kib = memory_kib(agent.pid()).1;
    assert_eq!(agent.oom_kills(), 0, "the agent was OOM-killed at its limit");
    assert!(
        agent.log().lines().all(|l| !l.contains("\"level\":\"ERROR\"")),
        "the agent logged errors:\n{}",
        agent.log()
    );
    let limit_bytes = agent.limit_bytes();
    Report {
        pods,
        resets,
        oom_kills,
        churn,
        baseline,
        peak,
        after,
        high_water_kib,
        limit_bytes,
        pod_series_left,
    }
}

/// Pods `numbers` made and removed, `LIVE` at a time, paced over `at_least`: the resets and OOM
/// kills done, and the most the agent held meanwhile.
fn churn(
    agent: &Agent,
    pods_file: &Path,
    numbers: std::ops::Range<usize>,
    at_least: Duration,
) -> (usize, usize, Held) {
    let mut peak = Held::default();
    let (mut live, mut resets, mut oom_kills) = (Vec::<Pod>::new(), 0, 0);
    let started = Instant::now();
    let per_pod = at_least / numbers.len().max(1) as u32;
    for (n, i) in numbers.enumerate() {
        let mut pod = Pod::new(i);
        if i % OOM_EVERY == OOM_EVERY / 2 {
            pod.limit = Some(MemoryLimit::new(&pod.cgroup, OOM_LIMIT));
        }
        live.push(pod);
        write_pods(pods_file, &live);
        if live.len() > LIVE {
            let gone = live.remove(0);
            // Before it goes, a reset in its namespace, and the OOM kill of its container.
            gone.netns.run_inside(|| refused_connects(SocketAddr::from((Ipv4Addr::LOCALHOST, 2050)), 1));
            resets += 1;
            if let Some(limit) = &gone.limit {
                oom_kill(&[gone.cgroup.procs().as_path(), limit.procs()], |_| {});
                oom_kills += 1;
            }
            write_pods(pods_file, &live);
            drop(gone);
        }
        if n % 100 == 0 {
            peak = peak.max(Held::of(agent));
        }
        // Paced to last the run's length: the pods' lives overlap as on a busy node.
        let due = per_pod * (n as u32 + 1);
        if let Some(wait) = due.checked_sub(started.elapsed()) {
            std::thread::sleep(wait);
        }
    }
    peak = peak.max(Held::of(agent));
    live.clear();
    write_pods(pods_file, &live);
    (resets, oom_kills, peak)
}

fn write_pods(path: &Path, live: &[Pod]) {
    let pods: Vec<Value> = live.iter().map(|p| p.json.clone()).collect();
    write_pods_file(path, &pods);
}
