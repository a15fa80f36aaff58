//! `system-oom` (incident 2): the node ran out of memory and the kernel's global OOM killer
//! chose a victim — not a container hitting its own limit. Critical when the victim is
//! node-critical (kubelet, the runtime, node daemons): the node goes NotReady next. The evidence
//! counts this node's system OOMs over 24 h, which is what made incident 2 visible (16 in 6 days).
//!
//! What healthy traffic looks like to it, and why none of it fires: a container killed at its own
//! limit (one process, or all of them under `memory.oom.group`), whatever its processes are
//! called, is a memcg OOM — the node had memory to spare. Only the global OOM killer fires it.

use std::collections::VecDeque;

use serde::Serialize;

use super::{evidence, task_owner};
use crate::{
    attribution::{Attributed, Attribution},
    events::Payload,
    incidents::{Finding, NodeView, Remediation, Settings, Severity, Signature, Step, ns},
    probes::oom::Scope,
};

pub const NAME: &str = "system-oom";
const DAY_NS: u64 = 86_400 * 1_000_000_000;
/// Kills remembered for the 24 h count at most.
const MAX_KILLS: usize = 10_000;

pub struct SystemOom {
    hold: u64,
    kills: VecDeque<Kill>,
}

#[derive(Debug, Clone, Serialize)]
struct Kill {
    time_unix_ns: u64,
    pid: u32,
    comm: String,
    critical: bool,
    anon_rss_bytes: Option<u64>,
    victim: String,
    /// Sum of pod memory limits / node memory when it happened (at the evaluation after it:
    /// the node's memory is known from the cgroup walk, every few seconds).
    memory_limit_overcommit_ratio: Option<f64>,
    /// The node's memory pressure at the first sample after it: its averages over 10, 60 and
    /// 300 s say how long the node was squeezed before the kill.
    #[serde(skip_serializing_if = "Option::is_none")]
    memory_pressure: Option<crate::pressure::Resource>,
    #[serde(skip)]
    ratio_taken: bool,
    #[serde(skip)]
    who: std::sync::Arc<Attribution>,
}

impl SystemOom {
    pub fn new(settings: &Settings) -> Self {
        Self { hold: ns(settings.system_oom_hold), kills: VecDeque::new() }
    }
}

impl Signature for SystemOom {
    fn name(&self) -> &'static str {
        NAME
    }

    fn observe(&mut self, attributed: &Attributed) {
        let event = &attributed.event;
        let Payload::OomKill(kill) = &event.payload else { return };
        if kill.scope != Scope::Global {
            return;
        }
        if self.kills.len() >= MAX_KILLS {
            self.kills.pop_front();
        }
        let who = attributed.who.clone();
        self.kills.push_back(Kill {
            time_unix_ns: event.header.time_unix_ns,
            pid: event.header.tgid,
            comm: event.header.comm.clone(),
            critical: kill.critical,
            anon_rss_bytes: kill.anon_rss_bytes,
            memory_limit_overcommit_ratio: None,
            memory_pressure: None,
            ratio_taken: false,
            victim: task_owner(&who),
            who,
        });
    }

    fn evaluate(&mut self, now: u64, node: &NodeView) -> Vec<Finding> {
        while self.kills.front().is_some_and(|k| now.saturating_sub(k.time_unix_ns) > DAY_NS) {
            self.kills.pop_front();
        }
        for kill in self.kills.iter_mut().rev().take_while(|k| !k.ratio_taken) {
            kill.memory_limit_overcommit_ratio = node.memory.overcommit();
            kill.ratio_taken = true;
        }
        let after = node.pressure.at_unix_ns;
        let pressure = node.pressure.node.and_then(|n| n.resources[crate::pressure::MEMORY]);
        for kill in self.kills.iter_mut().filter(|k| k.memory_pressure.is_none() && k.time_unix_ns <= after) {
            kill.memory_pressure = pressure;
        }
        let recent: Vec<&Kill> =
            self.kills.iter().filter(|k| now.saturating_sub(k.time_unix_ns) <= self.hold).collect();
        let (Some(first), Some(last)) = (recent.first(), recent.last()) else { return vec![] };
        let critical: Vec<&&Kill> = recent.iter().filter(|k| k.critical).collect();
        let victims: Vec<String> =
            recent.iter().map(|k| format!("{} (pid {}, {})", k.comm, k.pid, k.victim)).collect();
        let limits = match last.memory_limit_overcommit_ratio {
            Some(r) => format!(", pod memory limits {:.0}% of the node's memory", r * 100.0),
            None => String::new(),
        };
        let squeezed = last.memory_pressure.map(|p| super::squeezed_before(&p)).unwrap_or_default();
        let summary = format!(
            "The node ran out of memory: the kernel's OOM killer killed {} (system OOM #{} on this node in \
             24 h{limits}){}.{squeezed}",
            victims.join(", "),
            self.kills.len(),
            if critical.is_empty() {
                String::new()
            } else {
                format!("; {} of them node-critical: expect the node to go NotReady", critical.len())
            }
        );
        vec![Finding {
            key: "node".into(),
            severity: if critical.is_empty() { Severity::Warning } else { Severity::Critical },
            who: last.who.clone(),
            first_seen_unix_ns: first.time_unix_ns,
            last_seen_unix_ns: last.time_unix_ns,
            summary,
            evidence: evidence(&Evidence {
                victims: &recent,
                system_ooms_24h: self.kills.len(),
                memory_limit_overcommit_ratio: last.memory_limit_overcommit_ratio,
            }),
            remediation: Remediation {
                permanent: vec![
                    "Pod memory limits add up to more than the node has: set limits from observed \
                     peaks (max_over_time(container_memory_working_set_bytes[1h])) so their sum fits \
                     the node's allocatable memory."
                        .into(),
                    "Reserve memory for the system (kubelet --system-reserved / --kube-reserved, \
                     eviction thresholds) so node daemons are not the victims."
                        .into(),
                ],
                break_glass: vec![Step::new(
                    "Find the largest consumers now and move or restart the one with the loosest limit.",
                    Some("ps -eo pid,rss,comm --sort=-rss | head -15".into()),
                )],
            },
        }]
    }

    fn evicted(&self) -> u64 {
        0
    }
}

#[derive(Serialize)]
struct Evidence<'a> {
    victims: &'a [&'a Kill],
    system_ooms_24h: usize,
    memory_limit_overcommit_ratio: Option<f64>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{attribution::NodeMemory, incidents::signatures::tests::*, stuck::StuckSet};

    /// Healthy: containers at their own limits, one of them a kind node running its own kubelet
    /// (a node-critical name, in a pod), killed together under memory.oom.group.
    #[test]
    fn containers_killed_at_their_own_limits_are_no_system_oom() {
        let (web, kind) = (pod("u1", "web-1"), pod("u2", "kind-control-plane"));
        let mut s = SystemOom::new(&Settings::default());
        let stuck = StuckSet::default();
        for (i, (comm, critical, who)) in
            [("java", false, &web), ("kubelet", true, &kind), ("containerd", true, &kind)]
                .into_iter()
                .enumerate()
        {
            s.observe(&oom(SEC + i as u64, 40 + i as u32, comm, Scope::Memcg, critical, who));
        }
        assert!(s.evaluate(2 * SEC, &crate::incidents::signatures::tests::node(&stuck)).is_empty());
    }

    #[test]
    fn global_kills_fire_critical_for_kubelet_and_count_over_a_day() {
        let host = std::sync::Arc::new(Attribution {
            host: true,
            unit: Some("kubelet.service".into()),
            ..Default::default()
        });
        let web = pod("u1", "web-1");
        let mut s = SystemOom::new(&Settings::default());
        let stuck = StuckSet::default();
        // Incident 2's node: 4340 Mi of limits on 3369 Mi.
        let memory = NodeMemory { pod_limits_bytes: 4340 << 20, node_bytes: 3369 << 20 };
        let node = NodeView { memory, ..crate::incidents::signatures::tests::node(&stuck) };
        s.observe(&oom(SEC, 9, "python3", Scope::Memcg, false, &web));
        assert!(s.evaluate(2 * SEC, &node).is_empty(), "a container limit is not a system OOM");
        s.observe(&oom(10 * SEC, 10, "worker", Scope::Global, false, &web));
        let f = s.evaluate(11 * SEC, &node);
        assert_eq!((f.len(), f[0].severity), (1, Severity::Warning));
        s.observe(&oom(20 * SEC, 11, "kubelet", Scope::Global, true, &host));
        let f = s.evaluate(21 * SEC, &node);
        assert_eq!(f[0].severity, Severity::Critical);
        assert_eq!(f[0].evidence["system_ooms_24h"], 2);
        assert!(f[0].summary.contains("kubelet (pid 11, kubelet.service)"), "{}", f[0].summary);
        assert!(f[0].summary.contains("limits 129% of the node's memory"), "{}", f[0].summary);
        // Resolves after the hold time; the 24 h count remembers.
        assert!(s.evaluate(700 * SEC, &node).is_empty());
        s.observe(&oom(800 * SEC, 12, "alloy", Scope::Global, true, &host));
        assert_eq!(s.evaluate(801 * SEC, &node)[0].evidence["system_ooms_24h"], 3);
    }
}
