//! Hung-task state. The kernel's detector reports a hung task again on every check; this keeps
//! one record per task, passes on only the first report, and forgets the task (with a "cleared"
//! event) once it leaves D state or exits — which it learns by looking at `/proc`, off the event
//! path.

use std::{collections::HashMap, sync::Arc};

use serde::Serialize;

use crate::{
    attribution::Attribution,
    events::{Event, Header, Payload},
    probes::hung_task::{HungTask, WaitClass},
};

/// More tasks than this hung at once is a node on fire; beyond it new ones are counted, not kept.
const MAX_TRACKED: usize = 10_000;

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct HungTaskCleared {
    pub wait: WaitClass,
    /// The longest blocked time reported while it was hung.
    pub blocked_secs: Option<u64>,
    /// `left_d_state` or `exited`.
    pub why: &'static str,
}

/// What `/proc` says about a tracked task.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TaskState {
    Uninterruptible,
    Other,
    Gone,
}

struct Tracked {
    header: Header,
    hung: HungTask,
    attribution: Option<Arc<Attribution>>,
}

#[derive(Default)]
pub struct HungTaskTracker {
    tasks: HashMap<u32, Tracked>,
    /// Reports dropped because `MAX_TRACKED` tasks were already hung.
    pub overflow: u64,
}

impl HungTaskTracker {
    /// Takes one report; returns true when the task is newly hung (the report is news).
    pub fn observe(&mut self, event: &Event) -> bool {
        let Payload::HungTask(hung) = &event.payload else { return false };
        if let Some(known) = self.tasks.get_mut(&event.header.pid) {
            known.hung.blocked_secs = known.hung.blocked_secs.max(hung.blocked_secs);
            // A reused tid with another process behind it is a new hung task.
            if known.header.tgid == event.header.tgid {
                return false;
            }
        } else if self.tasks.len() >= MAX_TRACKED {
            self.overflow += 1;
            return false;
        }
        self.tasks.insert(
            event.header.pid,
            Tracked {
                header: event.header.clone(),
                hung: hung.clone(),
                attribution: event.attribution.clone(),
            },
        );
        true
    }

    /// Tasks to look up in `/proc`: (tgid, tid).
    pub fn tracked(&self) -> Vec<(u32, u32)> {
        self.tasks.values().map(|t| (t.header.tgid, t.header.pid)).collect()
    }

    /// Forgets tasks that are no longer hung, given their states; returns a cleared event each.
    pub fn clear(&mut self, states: &[((u32, u32), TaskState)], now_unix_ns: u64) -> Vec<Event> {
        states
            .iter()
            .filter_map(|&((tgid, tid), state)| {
                let why = match state {
                    TaskState::Uninterruptible => return None,
                    TaskState::Other => "left_d_state",
                    TaskState::Gone => "exited",
                };
                let tracked = self.tasks.remove_entry(&tid).filter(|(_, t)| t.header.tgid == tgid);
                let (_, tracked) = tracked?;
                Some(Event {
                    header: Header { time_unix_ns: now_unix_ns, ..tracked.header },
                    payload: Payload::HungTaskCleared(HungTaskCleared {
                        wait: tracked.hung.wait,
                        blocked_secs: tracked.hung.blocked_secs,
                        why,
                    }),
                    attribution: tracked.attribution,
                })
            })
            .collect()
    }

    /// The tasks of pod `uid` hung now.
    pub fn of_pod(&self, uid: &str) -> Vec<(&Header, &HungTask)> {
        self.tasks
            .values()
            .filter(|t| t.attribution.as_ref().and_then(|a| a.pod_uid.as_deref()) == Some(uid))
            .map(|t| (&t.header, &t.hung))
            .collect()
    }

    /// The tasks hung now: wait class and who they are.
    pub fn hung(&self) -> impl Iterator<Item = (WaitClass, Option<&Attribution>)> {
        self.tasks.values().map(|t| (t.hung.wait, t.attribution.as_deref()))
    }

    pub fn longest_blocked_secs(&self) -> u64 {
        self.tasks.values().filter_map(|t| t.hung.blocked_secs).max().unwrap_or(0)
    }
}

/// The state of `tid` from `/proc/<tgid>/task/<tid>/stat`. Reading `stat` does not take the
/// task's mm lock (unlike `cmdline`), so it does not block on a stuck task.
pub fn read_task_state(tgid: u32, tid: u32) -> TaskState {
    match std::fs::read_to_string(format!("/proc/{tgid}/task/{tid}/stat")) {
        Ok(stat) => parse_state(&stat),
        Err(_) => TaskState::Gone,
    }
}

fn parse_state(stat: &str) -> TaskState {
    // `pid (comm) S ...`; comm may contain spaces and parentheses, so split at the last ')'.
    match stat.rfind(')').and_then(|i| stat[i + 1..].split_whitespace().next()) {
        Some("D") => TaskState::Uninterruptible,
        Some("Z") | Some("X") | None => TaskState::Gone,
        Some(_) => TaskState::Other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(tgid: u32, tid: u32, blocked: u64, wait: WaitClass) -> Event {
        Event {
            header: Header {
                probe: "hung-task",
                time_unix_ns: 1,
                tgid,
                pid: tid,
                comm: "dd".into(),
                cgroup_id: 9,
                netns: 7,
            },
            payload: Payload::HungTask(HungTask {
                blocked_secs: Some(blocked),
                wait,
                stack: Default::default(),
                blocker: None,
                exiting: false,
            }),
            attribution: None,
        }
    }

    #[test]
    fn repeated_reports_are_one_hung_task() {
        let mut t = HungTaskTracker::default();
        assert!(t.observe(&report(10, 11, 3, WaitClass::Writeback)));
        assert!(!t.observe(&report(10, 11, 4, WaitClass::Writeback)));
        assert!(!t.observe(&report(10, 11, 5, WaitClass::Writeback)));
        assert!(t.observe(&report(20, 20, 3, WaitClass::Nfs)));
        assert_eq!(t.hung().filter(|(w, _)| *w == WaitClass::Writeback).count(), 1);
        assert_eq!(t.longest_blocked_secs(), 5);
        // The tid was reused by another process: that is a new hung task.
        assert!(t.observe(&report(30, 11, 3, WaitClass::Mm)));
    }

    #[test]
    fn clears_only_tasks_no_longer_in_d_state() {
        let mut t = HungTaskTracker::default();
        t.observe(&report(10, 11, 3, WaitClass::Writeback));
        t.observe(&report(10, 11, 9, WaitClass::Writeback));
        t.observe(&report(20, 20, 3, WaitClass::Nfs));
        t.observe(&report(30, 30, 3, WaitClass::Mm));
        let states = [
            ((10, 11), TaskState::Other),
            ((20, 20), TaskState::Uninterruptible),
            ((30, 30), TaskState::Gone),
        ];
        let cleared = t.clear(&states, 99);
        assert_eq!(cleared.len(), 2);
        let Payload::HungTaskCleared(c) = &cleared[0].payload else { panic!() };
        assert_eq!((c.why, c.blocked_secs, cleared[0].header.time_unix_ns), ("left_d_state", Some(9), 99));
        assert_eq!(t.tracked(), vec![(20, 20)]);
    }

    #[test]
    fn proc_stat_states() {
        assert_eq!(parse_state("42 (dd) D 1 2 3"), TaskState::Uninterruptible);
        assert_eq!(parse_state("42 (a) b) (c) R 1"), TaskState::Other);
        assert_eq!(parse_state("42 (dd) Z 1"), TaskState::Gone);
        assert_eq!(parse_state("garbage"), TaskState::Gone);
        assert_eq!(read_task_state(u32::MAX, u32::MAX), TaskState::Gone);
    }
}
