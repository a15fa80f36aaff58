//! Pressure stall information (issue 39: the gray zone before the OOM kill). The kernel keeps, per
//! cgroup v2 and for the node (`/proc/pressure/*`), how long tasks waited for memory, IO and CPU:
//! `some` (at least one task stalled) and `full` (all of them), as running averages over 10, 60
//! and 300 s and a cumulative total in microseconds. A pod reclaiming under its limit stalls long
//! before the OOM killer picks it; nothing else on the node says so per pod.
//!
//! Every `interval` the node's files and each pod's own cgroup (`Index::pod_cgroups`) are read and
//! published on a `watch` channel, with the pod's memory limit and use: `memory-pressure`, the
//! OOM signatures' evidence and the metrics read the last sample. PSI is a cgroup v2 feature: a
//! node without a v2 hierarchy (pure cgroup v1) has the node's figures only; a kernel booted
//! with `psi=0` (or `CONFIG_PSI_DEFAULT_DISABLED` without `psi=1`) none.

use std::{path::Path, sync::Arc, time::Duration};

use serde::Serialize;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::{
    attribution::{Attribution, Index},
    kernel,
};

pub const DEFAULT_INTERVAL: Duration = Duration::from_secs(2);

/// The resources PSI reports, as the files and `resource` label name them.
pub const RESOURCES: [&str; 3] = ["memory", "io", "cpu"];
pub const MEMORY: usize = 0;

/// One line of a pressure file: running averages (percent of wall time) and the total.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct Line {
    pub avg10: f64,
    pub avg60: f64,
    pub avg300: f64,
    /// Microseconds stalled since boot (or since the cgroup was made).
    pub total_us: u64,
}

/// One resource's file: `some`, and `full` where the kernel has it (not `cpu` on 5.10, nor
/// meaningfully for the node's CPU).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct Resource {
    pub some: Line,
    pub full: Option<Line>,
}

/// What a cgroup (or the node) stalled on, by resource: `None` where the file is missing.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Stalls {
    pub resources: [Option<Resource>; 3],
    /// Share of the time since the sample before that `some` task waited for memory (0..1).
    pub memory_some_since_last: Option<f64>,
    pub memory_full_since_last: Option<f64>,
}

/// A pod's figures.
#[derive(Debug, Clone, PartialEq)]
pub struct Pod {
    pub who: Arc<Attribution>,
    pub stalls: Stalls,
    /// Its memory limit — the lower of `memory.high` (throttled above) and `memory.max` (OOM
    /// killed above) — and use, where cgroup v2's memory controller is on.
    pub memory_limit_bytes: Option<u64>,
    pub memory_bytes: Option<u64>,
}

/// One sample of the node and its pods.
#[derive(Debug, Clone, Default)]
pub struct Sample {
    pub sample: u64,
    pub at_unix_ns: u64,
    /// The node's figures; `None` without PSI.
    pub node: Option<Stalls>,
    /// The node's memory: (`MemAvailable`, `MemTotal`). A pod squeezed under its own limit
    /// stalls the node's figures too; only a node short of memory is squeezed itself.
    pub node_memory: Option<(u64, u64)>,
    pub pods: Vec<Pod>,
    /// The node has a cgroup v2 hierarchy, where pods' pressure is kept.
    pub pods_readable: bool,
}

impl Sample {
    pub fn pod(&self, uid: &str) -> Option<&Pod> {
        self.pods.iter().find(|p| p.who.pod_uid.as_deref() == Some(uid))
    }
}

/// Parses a pressure file: `some avg10=0.12 avg60=0.05 avg300=0.01 total=12345`, then `full ...`.
pub fn parse(text: &str) -> Result<Resource, String> {
    let mut some = None;
    let mut full = None;
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let mut words = line.split_whitespace();
        let kind = words.next().unwrap_or_default();
        let mut parsed = Line::default();
        let mut seen = 0;
        for word in words {
            let (key, value) =
                word.split_once('=').ok_or_else(|| format!("{word:?} is not key=value in {line:?}"))?;
            let bad = || format!("{value:?} is not a number in {line:?}");
            match key {
                "avg10" => parsed.avg10 = value.parse().map_err(|_| bad())?,
                "avg60" => parsed.avg60 = value.parse().map_err(|_| bad())?,
                "avg300" => parsed.avg300 = value.parse().map_err(|_| bad())?,
                "total" => parsed.total_us = value.parse().map_err(|_| bad())?,
                _ => continue,
            }
            seen += 1;
        }
        if seen != 4 {
            return Err(format!("{line:?} lacks avg10, avg60, avg300 or total"));
        }
        match kind {
            "some" => some = Some(parsed),
            "full" => full = Some(parsed),
            _ => return Err(format!("{kind:?} is neither some nor full")),
        }
    }
    Ok(Resource { some: some.ok_or("no some line")?, full })
}

/// The files of one cgroup (`<dir>/<resource>.pressure`) or of the node (`/proc/pressure/<resource>`).
fn read(path_of: impl Fn(&str) -> std::path::PathBuf) -> Stalls {
    let mut stalls = Stalls::default();
    for (i, resource) in RESOURCES.iter().enumerate() {
        let path = path_of(resource);
        let Ok(text) = std::fs::read_to_string(&path) else { continue };
        match parse(&text) {
            Ok(parsed) => stalls.resources[i] = Some(parsed),
            Err(e) => tracing::warn!(path = %path.display(), error = %e, "unreadable pressure"),
        }
    }
    stalls
}

/// The share of `elapsed_us` stalled between two totals.
fn share(before: Option<&Line>, now: Option<&Line>, elapsed_us: u64) -> Option<f64> {
    let stalled = now?.total_us.checked_sub(before?.total_us)?;
    (elapsed_us > 0).then(|| (stalled as f64 / elapsed_us as f64).min(1.0))
}

/// Fills the shares of the time since `before` (same cgroup or node, earlier sample).
fn with_shares(mut stalls: Stalls, before: Option<&Stalls>, elapsed_us: u64) -> Stalls {
    let (now, before) = (stalls.resources[MEMORY], before.and_then(|b| b.resources[MEMORY]));
    stalls.memory_some_since_last =
        share(before.as_ref().map(|b| &b.some), now.as_ref().map(|n| &n.some), elapsed_us);
    stalls.memory_full_since_last = share(
        before.as_ref().and_then(|b| b.full.as_ref()),
        now.as_ref().and_then(|n| n.full.as_ref()),
        elapsed_us,
    );
    stalls
}

fn bytes(dir: &Path, file: &str) -> Option<u64> {
    std::fs::read_to_string(dir.join(file)).ok()?.trim().parse().ok()
}

#[derive(Debug, Clone)]
pub struct Settings {
    pub proc: std::path::PathBuf,
    pub interval: Duration,
    /// The node has a cgroup v2 hierarchy (on cgroup v1 only, pods' pressure is kept nowhere).
    pub cgroup_v2: bool,
}

fn sample(settings: &Settings, index: &Index, n: u64, before: &Sample) -> Sample {
    let at_unix_ns = kernel::unix_now_ns();
    let elapsed_us = at_unix_ns.saturating_sub(before.at_unix_ns) / 1000;
    let elapsed_us = if before.sample == 0 { 0 } else { elapsed_us };
    let node = read(|resource| settings.proc.join("pressure").join(resource));
    let node = node
        .resources
        .iter()
        .any(Option::is_some)
        .then(|| with_shares(node, before.node.as_ref(), elapsed_us));
    let mut pods = Vec::new();
    for (dir, who) in &index.pod_cgroups {
        let stalls = read(|resource| dir.join(format!("{resource}.pressure")));
        if stalls.resources.iter().all(Option::is_none) {
            continue;
        }
        let earlier = before.pods.iter().find(|p| p.who.pod_uid == who.pod_uid).map(|p| &p.stalls);
        let limit = [bytes(dir, "memory.high"), bytes(dir, "memory.max")].into_iter().flatten().min();
        pods.push(Pod {
            who: who.clone(),
            stalls: with_shares(stalls, earlier, elapsed_us),
            memory_limit_bytes: limit,
            memory_bytes: bytes(dir, "memory.current"),
        });
    }
    let node_memory = kernel::mem_available_and_total_bytes(&settings.proc);
    Sample { sample: n, at_unix_ns, node, node_memory, pods, pods_readable: settings.cgroup_v2 }
}

/// Samples every `settings.interval` until `stop` (`sampler::every`).
pub async fn watch(
    settings: Settings,
    index: watch::Receiver<Arc<Index>>,
    tx: watch::Sender<Arc<Sample>>,
    stop: CancellationToken,
) {
    let interval = settings.interval;
    let sample = move |index: &Index, n, before: &Sample| sample(&settings, index, n, before);
    crate::sampler::every("pressure", interval, index, tx, stop, sample).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pressure_file_parses() {
        let r = parse(
            "some avg10=44.16 avg60=10.74 avg300=2.36 total=7054665\nfull avg10=40.00 avg60=9.00 avg300=2.00 total=7054656\n",
        )
        .unwrap();
        assert_eq!(r.some, Line { avg10: 44.16, avg60: 10.74, avg300: 2.36, total_us: 7054665 });
        assert_eq!(r.full.unwrap().total_us, 7054656);
        // 5.10's cpu.pressure has no full line.
        assert_eq!(parse("some avg10=0.00 avg60=0.00 avg300=0.00 total=0\n").unwrap().full, None);
    }

    #[test]
    fn malformed_pressure_is_one_error() {
        for (text, error) in [
            ("", "no some line"),
            ("some avg10=1 avg60=2 total=3\n", "lacks"),
            ("some avg10=x avg60=2 avg300=3 total=4\n", "\"x\" is not a number"),
            ("half avg10=1 avg60=2 avg300=3 total=4\n", "neither some nor full"),
            ("some avg10\n", "not key=value"),
        ] {
            let e = parse(text).unwrap_err();
            assert!(e.contains(error), "{e} for {text:?}");
        }
    }

    #[test]
    fn the_share_stalled_is_the_totals_difference_over_the_time_between() {
        let line = |total_us| Line { total_us, ..Line::default() };
        assert_eq!(share(Some(&line(1_000_000)), Some(&line(1_500_000)), 2_000_000), Some(0.25));
        // A cgroup made again (its total restarted) or a first sample says nothing.
        assert_eq!(share(Some(&line(9)), Some(&line(1)), 2_000_000), None);
        assert_eq!(share(None, Some(&line(1)), 2_000_000), None);
        assert_eq!(share(Some(&line(0)), Some(&line(3_000_000)), 2_000_000), Some(1.0));
    }

    #[test]
    fn the_nodes_own_pressure_reads() {
        let Ok(text) = std::fs::read_to_string("/proc/pressure/memory") else { return };
        parse(&text).unwrap();
    }
}
