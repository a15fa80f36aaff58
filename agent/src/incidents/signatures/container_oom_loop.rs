//! `container-oom-loop`: the same container OOM-killed `oom_loop_count` times within
//! `oom_loop_window` — its limit is below what it needs, and every restart ends the same way.
//! A container is its pod and name: its runtime id changes with every restart.
//!
//! What healthy traffic looks like to it, and why none of it fires:
//! - One OOM kill of a container (a spike past its limit): one kill is no loop.
//! - One OOM of a container of several processes under `memory.oom.group` (what the kubelet sets
//!   on cgroup v2 since 1.28): every process is killed in one go, one kill event each. Kills of
//!   one container within 10 ms are one OOM.
//! - OOM kills of different containers, or of one container hours apart: counted apart, or aged
//!   out of the window.

use std::{collections::VecDeque, sync::Arc};

use serde::Serialize;

use super::{evidence, pod_name};
use crate::{
    attribution::{Attributed, Attribution},
    events::Payload,
    incidents::{Finding, NodeView, Remediation, Settings, Severity, Signature, Step, keyed::Keyed, ns},
};

pub const NAME: &str = "container-oom-loop";

pub struct ContainerOomLoop {
    count: usize,
    window: u64,
    by_container: Keyed<(String, String), Container>,
}

struct Container {
    who: Arc<Attribution>,
    /// One entry per OOM of the container: its first kill's time, pid and RSS, and how many
    /// processes it killed.
    kills: VecDeque<Kill>,
}

/// Kills of one container this close are one OOM: a group kill marks every process of the cgroup
/// in one pass (microseconds each), while another OOM needs a process started and grown again.
const ONE_OOM: u64 = 10_000_000;

impl ContainerOomLoop {
    pub fn new(settings: &Settings) -> Self {
        Self {
            count: settings.oom_loop_count.max(Settings::MIN_OOM_LOOP_COUNT) as usize,
            window: ns(settings.oom_loop_window),
            by_container: Keyed::new(super::super::keyed::DEFAULT_CAP),
        }
    }
}

impl Signature for ContainerOomLoop {
    fn name(&self) -> &'static str {
        NAME
    }

    fn observe(&mut self, attributed: &Attributed) {
        let event = &attributed.event;
        let Payload::OomKill(kill) = &event.payload else { return };
        let who = attributed.who.clone();
        let Some(uid) = who.pod_uid.clone() else { return };
        // Without a name (no metadata), the runtime id is the best there is.
        let container = if who.container.is_empty() {
            who.container_id.clone().unwrap_or_default()
        } else {
            who.container.clone()
        };
        let t = event.header.time_unix_ns;
        let c = self
            .by_container
            .touch(&(uid, container), t, || Container { who: who.clone(), kills: VecDeque::new() });
        c.who = who;
        match c.kills.back_mut() {
            Some(last) if t.abs_diff(last.time_unix_ns) < ONE_OOM => last.processes += 1,
            _ => c.kills.push_back(Kill {
                time_unix_ns: t,
                pid: event.header.tgid,
                anon_rss_bytes: kill.anon_rss_bytes,
                processes: 1,
                memory_pressure: None,
            }),
        }
        if c.kills.len() > self.count * 4 {
            c.kills.pop_front();
        }
    }

    fn evaluate(&mut self, now: u64, node: &NodeView) -> Vec<Finding> {
        let (count, window) = (self.count, self.window);
        let mut findings = Vec::new();
        let after = node.pressure.at_unix_ns;
        self.by_container.retain(|(uid, name), c| {
            // The pod's memory pressure at the first sample after each kill.
            let pressure = node.pressure.pod(uid).and_then(|p| p.stalls.resources[crate::pressure::MEMORY]);
            for kill in c.kills.iter_mut().filter(|k| k.memory_pressure.is_none() && k.time_unix_ns <= after)
            {
                kill.memory_pressure = pressure;
            }
            // The latest kill whose pressure was read (the last one's comes with the next sample).
            let squeezed = c
                .kills
                .iter()
                .rev()
                .find_map(|k| k.memory_pressure)
                .map(|p| super::squeezed_before(&p))
                .unwrap_or_default();
            while c.kills.front().is_some_and(|k| now.saturating_sub(k.time_unix_ns) > window) {
                c.kills.pop_front();
            }
            if c.kills.len() >= count {
                let kills = c.kills.iter().cloned().collect();
                findings.push(Finding {
                    key: format!("{uid}/{name}"),
                    severity: Severity::Warning,
                    who: c.who.clone(),
                    first_seen_unix_ns: c.kills.front().map_or(now, |k| k.time_unix_ns),
                    last_seen_unix_ns: c.kills.back().map_or(now, |k| k.time_unix_ns),
                    summary: format!(
                        "Container {name} of {} was OOM-killed {} times within {} min: its memory limit is \
                         below what it uses.{squeezed}",
                        pod_name(&c.who),
                        c.kills.len(),
                        window / 60_000_000_000
                    ),
                    evidence: evidence(&Evidence { kills }),
                    remediation: Remediation {
                        permanent: vec![
                            "Raise the container's memory limit to its observed peak \
                             (max_over_time(container_memory_working_set_bytes[24h])), or find what \
                             grows."
                                .into(),
                        ],
                        break_glass: vec![Step::new(
                            "See the limit and the last kills.",
                            Some(format!("kubectl -n {} describe pod {}", c.who.namespace, c.who.pod)),
                        )],
                    },
                });
            }
            !c.kills.is_empty()
        });
        findings
    }

    fn evicted(&self) -> u64 {
        self.by_container.evicted()
    }
}

#[derive(Serialize)]
struct Evidence {
    kills: Vec<Kill>,
}

/// One OOM of the container.
#[derive(Clone, Serialize)]
struct Kill {
    time_unix_ns: u64,
    pid: u32,
    anon_rss_bytes: Option<u64>,
    /// Processes killed in it (a group kill takes them all).
    processes: u32,
    /// The pod's memory pressure at the first sample after the kill: its averages over 10, 60
    /// and 300 s say how long the pod was squeezed before it.
    #[serde(skip_serializing_if = "Option::is_none")]
    memory_pressure: Option<crate::pressure::Resource>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{incidents::signatures::tests::*, probes::oom::Scope, stuck::StuckSet};

    #[test]
    fn three_kills_of_one_container_in_an_hour_fire_and_age_out() {
        let web = pod("u1", "web-1");
        let other = pod("u2", "web-2");
        let mut s = ContainerOomLoop::new(&Settings::default());
        let stuck = StuckSet::default();
        s.observe(&oom(SEC, 10, "java", Scope::Memcg, false, &web));
        s.observe(&oom(100 * SEC, 11, "java", Scope::Memcg, false, &web));
        s.observe(&oom(150 * SEC, 12, "java", Scope::Memcg, false, &other));
        assert!(s.evaluate(160 * SEC, &node(&stuck)).is_empty(), "two kills each");
        s.observe(&oom(200 * SEC, 13, "java", Scope::Memcg, false, &web));
        let f = s.evaluate(201 * SEC, &node(&stuck));
        assert_eq!(f.len(), 1);
        assert_eq!(f[0].key, "u1/app");
        assert!(f[0].summary.contains("3 times"), "{}", f[0].summary);
        // An hour after the first kill it no longer counts.
        assert!(s.evaluate(3602 * SEC, &node(&stuck)).is_empty());
    }

    /// Healthy: one OOM of a container of four processes under memory.oom.group, each killed
    /// within the same millisecond or so; then, once, a single kill of another container.
    #[test]
    fn one_group_kill_and_one_single_kill_are_no_loop() {
        let web = pod("u1", "web-1");
        let other = pod("u2", "batch-1");
        let mut s = ContainerOomLoop::new(&Settings::default());
        let stuck = StuckSet::default();
        for (i, pid) in [20, 21, 22, 23].into_iter().enumerate() {
            s.observe(&oom(500 * SEC + i as u64 * 1_000_000, pid, "nginx", Scope::Memcg, false, &web));
        }
        s.observe(&oom(600 * SEC, 30, "python3", Scope::Memcg, false, &other));
        assert!(s.evaluate(601 * SEC, &node(&stuck)).is_empty(), "one OOM each");
        // Two more OOMs of the first container: a loop, each OOM counted once.
        s.observe(&oom(700 * SEC, 24, "nginx", Scope::Memcg, false, &web));
        s.observe(&oom(900 * SEC, 25, "nginx", Scope::Memcg, false, &web));
        let f = s.evaluate(901 * SEC, &node(&stuck));
        assert_eq!(f.len(), 1);
        assert!(f[0].summary.contains("3 times"), "{}", f[0].summary);
        assert_eq!(f[0].evidence["kills"][0]["processes"], 4, "{:#}", f[0].evidence);
    }

    #[test]
    fn the_kills_carry_how_squeezed_the_pod_was_before() {
        use crate::pressure::{Line, Pod, Resource, Sample, Stalls};
        let web = pod("u1", "web-1");
        let mut s = ContainerOomLoop::new(&Settings::default());
        let stuck = StuckSet::default();
        let squeezed =
            Resource { some: Line { avg10: 80.0, avg60: 35.4, avg300: 12.0, total_us: 1 }, full: None };
        let stalls = Stalls { resources: [Some(squeezed), None, None], ..Stalls::default() };
        let pod = Pod { who: web.clone(), stalls, memory_limit_bytes: None, memory_bytes: None };
        let sample = Sample {
            sample: 1,
            at_unix_ns: 301 * SEC,
            node: None,
            node_memory: None,
            pods: vec![pod],
            pods_readable: true,
        };
        for (t, pid) in [(SEC, 10), (100 * SEC, 11), (300 * SEC, 12)] {
            s.observe(&oom(t, pid, "java", Scope::Memcg, false, &web));
        }
        let f = s.evaluate(302 * SEC, &NodeView { pressure: &sample, ..node(&stuck) });
        assert_eq!(f.len(), 1);
        assert!(
            f[0].summary.ends_with(
                "Before the kill its tasks waited for memory 35% of the last minute (12% of the last 5)."
            ),
            "{}",
            f[0].summary
        );
        assert_eq!(
            f[0].evidence["kills"][2]["memory_pressure"]["some"]["avg60"], 35.4,
            "{:#}",
            f[0].evidence
        );
    }
}
