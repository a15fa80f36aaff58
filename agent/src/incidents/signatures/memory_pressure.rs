//! `memory-pressure` (issue 39): a pod — or the node — whose tasks stall waiting for memory,
//! long before (and often instead of) an OOM kill: reclaim under its limit, throttling above
//! `memory.high`, refaults of a working set that no longer fits. The app slows to a crawl and
//! nothing fails. Read from PSI (`pressure.rs`): the share of time at least one task waited for
//! memory (`some`), sample by sample; fires when it stays at or above `--memory-pressure-some`
//! (20%) for `--memory-pressure-for` (60 s), resolves `--quiet-window` after the last sample
//! above. Warning: it precedes `container-oom-loop` and `system-oom`, whose evidence then says how
//! squeezed the pod or node was before the kill.
//!
//! The node's own figures count every task, a pod reclaiming under its own limit included: the
//! node is squeezed itself only while it is short of memory (`MemAvailable` under a tenth of
//! `MemTotal`, the kubelet's usual eviction zone), and only then are its figures taken.

use std::{collections::HashMap, sync::Arc};

use serde::Serialize;

use super::{evidence, human_secs, pod_name};
use crate::{
    attribution::Attribution,
    incidents::{Finding, NodeView, Remediation, Settings, Severity, Signature, Step, ns},
    pressure::{MEMORY, Stalls},
};

pub const NAME: &str = "memory-pressure";
const MAX_KEYS: usize = 10_000;
/// The node is short of memory under a tenth of it available.
const NODE_SHORT_TENTHS: u64 = 1;

pub struct MemoryPressure {
    threshold: f64,
    for_ns: u64,
    quiet: u64,
    sample: u64,
    squeezed: HashMap<String, Squeezed>,
    evicted: u64,
}

/// One pod's (or the node's) run of samples above the threshold.
struct Squeezed {
    who: Arc<Attribution>,
    /// The first sample of the current run above the threshold.
    since_unix_ns: u64,
    last_above_unix_ns: u64,
    /// Shares of the run's samples, to say the worst and the mean.
    peak_some: f64,
    sum_some: f64,
    samples: u32,
    peak_full: f64,
    /// The last sample's figures, for the evidence.
    stalls: Stalls,
    limit_bytes: Option<u64>,
    memory_bytes: Option<u64>,
    firing: bool,
}

impl MemoryPressure {
    pub fn new(settings: &Settings) -> Self {
        Self {
            threshold: f64::from(settings.memory_pressure_some_percent) / 100.0,
            for_ns: ns(settings.memory_pressure_for),
            quiet: ns(settings.quiet_window),
            sample: 0,
            squeezed: HashMap::new(),
            evicted: 0,
        }
    }

    fn take(
        &mut self,
        key: String,
        who: &Arc<Attribution>,
        stalls: &Stalls,
        limit: Option<u64>,
        memory: Option<u64>,
        at: u64,
    ) {
        // No share (a first sample, a cgroup made again, a node not short) ends a run too.
        let some = stalls.memory_some_since_last.unwrap_or(0.0);
        let above = some >= self.threshold;
        if !above {
            // A run ends at a sample under the threshold; a firing one waits out the quiet window.
            if self.squeezed.get(&key).is_some_and(|s| !s.firing) {
                self.squeezed.remove(&key);
            }
            return;
        }
        if !self.squeezed.contains_key(&key) && self.squeezed.len() >= MAX_KEYS {
            self.evicted += 1;
            return;
        }
        let s = self.squeezed.entry(key).or_insert_with(|| Squeezed {
            who: who.clone(),
            since_unix_ns: at,
            last_above_unix_ns: at,
            peak_some: 0.0,
            sum_some: 0.0,
            samples: 0,
            peak_full: 0.0,
            stalls: *stalls,
            limit_bytes: limit,
            memory_bytes: memory,
            firing: false,
        });
        s.who = who.clone();
        s.last_above_unix_ns = at;
        s.peak_some = s.peak_some.max(some);
        s.sum_some += some;
        s.samples += 1;
        s.peak_full = s.peak_full.max(stalls.memory_full_since_last.unwrap_or(0.0));
        (s.stalls, s.limit_bytes, s.memory_bytes) = (*stalls, limit, memory);
    }
}

impl Signature for MemoryPressure {
    fn name(&self) -> &'static str {
        NAME
    }

    fn evaluate(&mut self, now: u64, node: &NodeView) -> Vec<Finding> {
        let sample = node.pressure;
        if sample.sample != self.sample {
            self.sample = sample.sample;
            if let Some(stalls) = &sample.node {
                let short = sample
                    .node_memory
                    .is_some_and(|(available, total)| available * 10 < total * NODE_SHORT_TENTHS);
                let stalls = if short { *stalls } else { Stalls::default() };
                let host = Arc::new(Attribution { host: true, ..Default::default() });
                let used = sample.node_memory.map(|(available, total)| total - available.min(total));
                self.take(
                    "node".into(),
                    &host,
                    &stalls,
                    sample.node_memory.map(|(_, total)| total),
                    used,
                    sample.at_unix_ns,
                );
            }
            for pod in &sample.pods {
                let Some(uid) = pod.who.pod_uid.clone() else { continue };
                self.take(
                    uid,
                    &pod.who,
                    &pod.stalls,
                    pod.memory_limit_bytes,
                    pod.memory_bytes,
                    sample.at_unix_ns,
                );
            }
        }
        let (for_ns, quiet) = (self.for_ns, self.quiet);
        self.squeezed.retain(|_, s| !s.firing || now.saturating_sub(s.last_above_unix_ns) <= quiet);
        let mut found: Vec<Finding> = self
            .squeezed
            .iter_mut()
            .filter_map(|(key, s)| {
                s.firing |= s.last_above_unix_ns.saturating_sub(s.since_unix_ns) >= for_ns;
                s.firing.then(|| finding(key, s))
            })
            .collect();
        found.sort_by(|a, b| a.key.cmp(&b.key));
        found
    }

    fn evicted(&self) -> u64 {
        self.evicted
    }
}

#[derive(Serialize)]
struct Evidence {
    /// How long the run above the threshold has lasted.
    squeezed_secs: u64,
    /// Shares of time (percent) at least one task (`some`) / every task (`full`) waited for
    /// memory: the run's mean and worst sample, and the kernel's own averages now.
    some_mean_percent: f64,
    some_peak_percent: f64,
    full_peak_percent: f64,
    memory: Option<crate::pressure::Resource>,
    #[serde(skip_serializing_if = "Option::is_none")]
    memory_limit_bytes: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    memory_bytes: Option<u64>,
}

fn percent(share: f64) -> f64 {
    (share * 1000.0).round() / 10.0
}

fn mib(bytes: u64) -> u64 {
    bytes >> 20
}

fn finding(key: &str, s: &Squeezed) -> Finding {
    let node_wide = s.who.host;
    let whose =
        if node_wide { "The node's tasks".to_string() } else { format!("{}'s tasks", pod_name(&s.who)) };
    let mean = s.sum_some / f64::from(s.samples.max(1));
    let squeezed_secs = s.last_above_unix_ns.saturating_sub(s.since_unix_ns) / 1_000_000_000;
    let limit = match (s.memory_bytes, s.limit_bytes) {
        (Some(used), Some(total)) if node_wide => {
            format!(" ({} MiB of its {} MiB in use)", mib(used), mib(total))
        }
        (Some(used), Some(limit)) => format!(" (it uses {} MiB of a {} MiB limit)", mib(used), mib(limit)),
        _ => String::new(),
    };
    let summary = format!(
        "{whose} wait for memory {:.0}% of the time (up to {:.0}%; every task at once up to {:.0}%) for {}{limit}: \
         reclaim, throttling or refaults slow it long before an OOM kill.",
        percent(mean),
        percent(s.peak_some),
        percent(s.peak_full),
        human_secs(squeezed_secs),
    );
    let (namespace, name) = (s.who.namespace.as_str(), s.who.pod.as_str());
    let look = if node_wide {
        Step::new(
            "See what holds the node's memory and what reclaims.",
            Some("cat /proc/pressure/memory; grep -E 'MemAvailable|Dirty|Writeback' /proc/meminfo; kubectl top pods -A --sort-by=memory | head".to_string()),
        )
    } else {
        Step::new(
            "See the pod's use against its limits and which container grows.",
            Some(format!(
                "kubectl top pod -n {namespace} {name} --containers && kubectl get pod -n {namespace} {name} -o jsonpath='{{.spec.containers[*].resources}}'"
            )),
        )
    };
    Finding {
        key: key.to_string(),
        severity: Severity::Warning,
        who: s.who.clone(),
        first_seen_unix_ns: s.since_unix_ns,
        last_seen_unix_ns: s.last_above_unix_ns,
        summary,
        evidence: evidence(&Evidence {
            squeezed_secs,
            some_mean_percent: percent(mean),
            some_peak_percent: percent(s.peak_some),
            full_peak_percent: percent(s.peak_full),
            memory: s.stalls.resources[MEMORY],
            memory_limit_bytes: s.limit_bytes,
            memory_bytes: s.memory_bytes,
        }),
        remediation: Remediation {
            permanent: vec![if node_wide {
                "Give the node room: fewer or smaller pods (requests that match use), eviction thresholds \
                 that act before reclaim stalls, or more memory."
                    .to_string()
            } else {
                "Raise the pod's memory limit (and request) to its working set, or make it use less (a cache \
                 sized to the limit, fewer workers); a limit the app keeps reaching costs it time in reclaim \
                 and ends in an OOM kill."
                    .to_string()
            }],
            break_glass: vec![look],
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        incidents::signatures::tests::{SEC, node, pod},
        pressure::{Pod, Sample},
        stuck::StuckSet,
    };

    fn settings() -> Settings {
        Settings {
            memory_pressure_for: std::time::Duration::from_secs(10),
            quiet_window: std::time::Duration::from_secs(6),
            ..Settings::default()
        }
    }

    fn sample(n: u64, some: f64, who: &Arc<Attribution>) -> Sample {
        let stalls = Stalls {
            memory_some_since_last: Some(some),
            memory_full_since_last: Some(some / 2.0),
            ..Stalls::default()
        };
        let pod = Pod {
            who: who.clone(),
            stalls,
            memory_limit_bytes: Some(64 << 20),
            memory_bytes: Some(63 << 20),
        };
        Sample {
            sample: n,
            at_unix_ns: n * 2 * SEC,
            node: None,
            node_memory: None,
            pods: vec![pod],
            pods_readable: true,
        }
    }

    fn evaluate(s: &mut MemoryPressure, sample: &Sample) -> Vec<Finding> {
        let stuck = StuckSet::default();
        s.evaluate(sample.at_unix_ns, &NodeView { pressure: sample, ..node(&stuck) })
    }

    #[test]
    fn a_pod_squeezed_for_the_window_fires_and_resolves_when_it_eases() {
        let mut s = MemoryPressure::new(&settings());
        let web = pod("u1", "web-1");
        // 40% for 8 s: not yet.
        for n in 1..=5 {
            assert!(evaluate(&mut s, &sample(n, 0.4, &web)).is_empty(), "sample {n}");
        }
        let found = evaluate(&mut s, &sample(6, 0.6, &web));
        assert_eq!(found.len(), 1);
        let f = &found[0];
        assert_eq!((f.key.as_str(), f.severity), ("u1", Severity::Warning));
        assert!(
            f.summary.starts_with("shop/web-1's tasks wait for memory 43% of the time (up to 60%"),
            "{}",
            f.summary
        );
        assert!(f.summary.contains("it uses 63 MiB of a 64 MiB limit"), "{}", f.summary);
        assert_eq!(f.evidence["squeezed_secs"], 10);
        // Eased: still firing for the quiet window after the last sample above, then resolved.
        assert_eq!(evaluate(&mut s, &sample(7, 0.01, &web)).len(), 1);
        assert_eq!(evaluate(&mut s, &sample(9, 0.01, &web)).len(), 1);
        assert!(evaluate(&mut s, &sample(10, 0.01, &web)).is_empty());
    }

    #[test]
    fn a_dip_under_the_threshold_starts_the_run_again() {
        let mut s = MemoryPressure::new(&settings());
        let web = pod("u1", "web-1");
        for n in 1..=4 {
            evaluate(&mut s, &sample(n, 0.5, &web));
        }
        assert!(evaluate(&mut s, &sample(5, 0.1, &web)).is_empty());
        for n in 6..=10 {
            assert!(evaluate(&mut s, &sample(n, 0.5, &web)).is_empty(), "sample {n}");
        }
        assert_eq!(evaluate(&mut s, &sample(11, 0.5, &web)).len(), 1);
    }

    #[test]
    fn the_node_is_squeezed_only_while_it_is_short_of_memory() {
        let mut s = MemoryPressure::new(&settings());
        let node_sample = |n: u64, available_mib: u64| {
            let stalls = Stalls { memory_some_since_last: Some(0.5), ..Stalls::default() };
            Sample {
                sample: n,
                at_unix_ns: n * 2 * SEC,
                node: Some(stalls),
                node_memory: Some((available_mib << 20, 1000 << 20)),
                pods: vec![],
                pods_readable: true,
            }
        };
        // A pod reclaiming under its own limit stalls the node's figures; the node has room.
        for n in 1..=8 {
            assert!(evaluate(&mut s, &node_sample(n, 600)).is_empty(), "sample {n}");
        }
        for n in 9..=13 {
            assert!(evaluate(&mut s, &node_sample(n, 50)).is_empty(), "sample {n}");
        }
        let found = evaluate(&mut s, &node_sample(14, 50));
        assert_eq!(found.len(), 1);
        assert_eq!(found[0].key, "node");
        assert!(found[0].summary.starts_with("The node's tasks wait for memory 50%"), "{}", found[0].summary);
        assert!(found[0].summary.contains("(950 MiB of its 1000 MiB in use)"), "{}", found[0].summary);
    }
}
