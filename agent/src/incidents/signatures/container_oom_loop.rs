//! `container-oom-loop`: the same container OOM-killed `oom_loop_count` times within
//! `oom_loop_window` — its limit is below what it needs, and every restart ends the same way.
//! A container is its pod and name: its runtime id changes with every restart.

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
    kills: VecDeque<(u64, u32, Option<u64>)>,
}

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
        c.kills.push_back((t, event.header.tgid, kill.anon_rss_bytes));
        if c.kills.len() > self.count * 4 {
            c.kills.pop_front();
        }
    }

    fn evaluate(&mut self, now: u64, _node: &NodeView) -> Vec<Finding> {
        let (count, window) = (self.count, self.window);
        let mut findings = Vec::new();
        self.by_container.retain(|(uid, name), c| {
            while c.kills.front().is_some_and(|k| now.saturating_sub(k.0) > window) {
                c.kills.pop_front();
            }
            if c.kills.len() >= count {
                let kills = c
                    .kills
                    .iter()
                    .map(|&(time_unix_ns, pid, anon_rss_bytes)| Kill { time_unix_ns, pid, anon_rss_bytes })
                    .collect();
                findings.push(Finding {
                    key: format!("{uid}/{name}"),
                    severity: Severity::Warning,
                    who: c.who.clone(),
                    first_seen_unix_ns: c.kills.front().map_or(now, |k| k.0),
                    last_seen_unix_ns: c.kills.back().map_or(now, |k| k.0),
                    summary: format!(
                        "Container {name} of {} was OOM-killed {} times within {} min: its memory limit is \
                         below what it uses.",
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

#[derive(Serialize)]
struct Kill {
    time_unix_ns: u64,
    pid: u32,
    anon_rss_bytes: Option<u64>,
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
}
