//! `pod-termination-blocked`: a task of a pod has been in uninterruptible sleep for longer than
//! `termination_blocked_after` — the cause of "Terminating forever": the container runtime cannot
//! reap a task the kernel will not wake. The evidence is each task's wait class and stack; the
//! engine links the incident to an NFS incident of the same pod or node that explains it.
//!
//! What healthy traffic looks like to it, and why none of it fires: writeback bursts and fsyncs
//! put tasks in D state for milliseconds to seconds, a slow disk or NFS server for longer; the
//! sampler reports a task only after its threshold (30 s) and this signature only past 60 s, and
//! a task that runs again leaves the set before either.

use serde::Serialize;

use super::{evidence, human_secs, pod_name};
use crate::{
    incidents::{Finding, NodeView, Remediation, Settings, Severity, Signature, Step},
    probes::wait::WaitClass,
    stuck::StuckTask,
};

pub const NAME: &str = "pod-termination-blocked";

pub struct PodTerminationBlocked {
    after_secs: u64,
}

impl PodTerminationBlocked {
    pub fn new(settings: &Settings) -> Self {
        Self { after_secs: settings.termination_blocked_after.as_secs() }
    }
}

impl Signature for PodTerminationBlocked {
    fn name(&self) -> &'static str {
        NAME
    }

    fn evaluate(&mut self, now: u64, node: &NodeView) -> Vec<Finding> {
        // One incident per pod, its tasks longest-blocked first.
        let mut by_pod: std::collections::BTreeMap<String, Vec<StuckTask>> = Default::default();
        for task in node.stuck.all(now).into_iter().filter(|t| t.blocked_secs >= self.after_secs) {
            if let Some(uid) = task.who.pod_uid.clone() {
                by_pod.entry(uid).or_default().push(task);
            }
        }
        by_pod
            .into_iter()
            .map(|(uid, tasks)| {
                let longest = &tasks[0];
                let who = longest.who.clone();
                let exiting = tasks.iter().any(|t| t.exiting);
                let waits: std::collections::BTreeSet<&str> = tasks.iter().map(|t| t.wait.as_str()).collect();
                let summary = format!(
                    "{} task(s) of {} stuck in uninterruptible sleep (longest: {} pid {} tid {}, {} in {}){}. \
                     The kernel will not wake them until what they wait for ({}) completes; the pod cannot \
                     terminate until then.",
                    tasks.len(),
                    pod_name(&who),
                    longest.comm,
                    longest.pid,
                    longest.tid,
                    human_secs(longest.blocked_secs),
                    longest.wait.as_str(),
                    if exiting { ", while exiting" } else { "" },
                    waits.into_iter().collect::<Vec<_>>().join(", "),
                );
                Finding {
                    key: uid,
                    severity: if exiting { Severity::Critical } else { Severity::Warning },
                    first_seen_unix_ns: now.saturating_sub(longest.blocked_secs * 1_000_000_000),
                    last_seen_unix_ns: now,
                    summary,
                    evidence: evidence(&Evidence { stuck_tasks: &tasks }),
                    remediation: remediation(longest.wait, longest.pid, longest.tid),
                    who,
                }
            })
            .collect()
    }

    fn evicted(&self) -> u64 {
        0
    }
}

fn remediation(wait: WaitClass, pid: u32, tid: u32) -> Remediation {
    let permanent = vec![match wait {
        WaitClass::Nfs => "The task waits on NFS: see the related NFS incident (redirected connections, an \
                           unreachable server, a node-wide NFS client stall) and fix that."
            .to_string(),
        WaitClass::Writeback | WaitClass::BlockIo => {
            "The task waits for writes to complete: find the device or file system that stopped \
             completing them (its stack names the path)."
                .to_string()
        }
        _ => "Read the task's stack for what it waits on; a task in D state cannot be killed, only \
              unblocked."
            .to_string(),
    }];
    let break_glass = vec![
        Step::new(
            "See what the task waits for now (SIGKILL does not reach a task in D state).",
            Some(format!("cat /proc/{pid}/task/{tid}/stack /proc/{pid}/task/{tid}/wchan")),
        ),
        Step::new("Unblock what it waits for; rebooting the node is the last resort.", None),
    ];
    Remediation { permanent, break_glass }
}

#[derive(Serialize)]
struct Evidence<'a> {
    stuck_tasks: &'a [StuckTask],
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{incidents::signatures::tests::*, stuck::TaskState};

    #[test]
    fn a_pod_task_hung_past_the_threshold_fires_until_it_clears() {
        let web = pod("u1", "web-1");
        let mut s = PodTerminationBlocked::new(&Settings::default());
        let mut stuck = stuck(&[hung(100 * SEC, 10, WaitClass::Nfs, 30, &web)]);
        assert!(s.evaluate(100 * SEC, &node(&stuck)).is_empty(), "30 s is below the 60 s threshold");
        let f = s.evaluate(131 * SEC, &node(&stuck));
        assert_eq!(f.len(), 1);
        assert_eq!((f[0].key.as_str(), f[0].severity), ("u1", Severity::Critical));
        assert_eq!(f[0].evidence["stuck_tasks"][0]["blocked_secs"], 61);
        assert!(f[0].summary.contains("shop/web-1"), "{}", f[0].summary);
        stuck.clear(&[((10, 10), TaskState::Other)], 140 * SEC);
        assert!(s.evaluate(141 * SEC, &node(&stuck)).is_empty());
    }

    /// Healthy: an fsync that waited 50 s on a slow disk, then returned.
    #[test]
    fn a_long_wait_that_ends_below_the_threshold_fires_nothing() {
        let web = pod("u1", "web-1");
        let mut s = PodTerminationBlocked::new(&Settings::default());
        let mut stuck = stuck(&[hung(100 * SEC, 10, WaitClass::Writeback, 30, &web)]);
        assert!(s.evaluate(120 * SEC, &node(&stuck)).is_empty(), "50 s blocked");
        stuck.clear(&[((10, 10), TaskState::Other)], 121 * SEC);
        assert!(s.evaluate(200 * SEC, &node(&stuck)).is_empty());
    }

    #[test]
    fn host_tasks_are_not_pod_incidents() {
        let host = std::sync::Arc::new(crate::attribution::Attribution { host: true, ..Default::default() });
        let mut s = PodTerminationBlocked::new(&Settings::default());
        let stuck = stuck(&[hung(100 * SEC, 10, WaitClass::Writeback, 600, &host)]);
        assert!(s.evaluate(100 * SEC, &node(&stuck)).is_empty());
    }
}
