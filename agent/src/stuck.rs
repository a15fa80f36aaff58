//! The one set of stuck tasks: tasks in uninterruptible sleep that something reported, until they
//! run again or exit. Two sources report them: the kernel's hung-task detector (again on every
//! check) and kstall's sampler (once per stuck spell, killable sleeps too). The set keeps one
//! record per task, with one blocked-since and one stack (the first report's) and the sources that
//! reported it, and says which report is news. Tasks leave when `/proc` shows them out of D state
//! or gone (read off the event path; the pipeline applies what was read): from each sweep of the
//! sampler when it runs (a stuck task the sweep did not find asleep ran or exited), else from
//! `/proc` once a second.
//!
//! The pipeline is the only writer; the incident signatures, `kstall explain` and `/metrics` read
//! it, so they report the same blocked time and the same stack for a task.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
    time::Duration,
};

use serde::Serialize;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::{
    attribution::{Attributed, Attribution},
    events::{Event, Header, Payload},
    probes::{
        cleared::HungTaskCleared,
        probe::{Sweep, TaskSweeps},
        wait::{Stuck, WaitClass, WaitKind},
    },
};

/// More tasks than this stuck at once is a node on fire; beyond it new ones are counted, not kept.
const MAX_TASKS: usize = 10_000;
/// Frames of a stuck task's stack kept (innermost first): what every reader shows.
pub const STACK_FRAMES: usize = 16;
const SEC: u64 = 1_000_000_000;
/// How often stuck tasks are looked at in `/proc` for having left D state.
const STATE_CHECK_INTERVAL: Duration = Duration::from_secs(1);
/// A `/proc` that takes longer than this to read is skipped this time around.
const STATE_READ_DEADLINE: Duration = Duration::from_secs(2);

/// A stuck task as its readers see it, blocked time brought up to the time asked.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct StuckTask {
    pub pid: u32,
    pub tid: u32,
    pub comm: String,
    pub wait: WaitClass,
    pub wait_kind: WaitKind,
    /// The probes that reported it, the first first: `stuck-task` (the sampler), `hung-task`.
    pub sources: Vec<&'static str>,
    /// Since `blocked_since_unix_ns`, at the time asked.
    pub blocked_secs: u64,
    /// When it last ran, as its first report says: the same for every reader.
    pub blocked_since_unix_ns: u64,
    pub exiting: bool,
    /// Shared with the set's record: readers ask for every stuck task once a second.
    pub stack: Arc<[String]>,
    #[serde(skip)]
    pub who: Arc<Attribution>,
}

/// States of stuck tasks as `/proc` showed them: ((tgid, tid), state).
pub type TaskStates = Vec<((u32, u32), TaskState)>;

/// What `/proc` says about a stuck task.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TaskState {
    Uninterruptible,
    Other,
    Gone,
}

struct Tracked {
    header: Header,
    wait: WaitClass,
    wait_kind: WaitKind,
    sources: Vec<&'static str>,
    exiting: bool,
    stack: Arc<[String]>,
    who: Arc<Attribution>,
    /// When the task last ran, as its first report says: report time minus blocked time (the
    /// report time itself when the tick rate, hence the blocked time, is unknown).
    blocked_since_unix_ns: u64,
}

/// Stuck tasks now, by tid.
#[derive(Default)]
pub struct StuckSet {
    tasks: HashMap<u32, Tracked>,
    /// Reports not kept because `MAX_TASKS` tasks were already stuck.
    untracked: u64,
}

impl StuckSet {
    /// Takes one report of a stuck task, from either source; true when the task is newly stuck
    /// (the report is news).
    pub fn report(&mut self, report: &Attributed) -> bool {
        let header = &report.event.header;
        let Some(Stuck { blocked_secs, wait, wait_kind, exiting, stack }) =
            report.event.payload.data().stuck()
        else {
            return false;
        };
        let since = header.time_unix_ns.saturating_sub(blocked_secs.unwrap_or(0).saturating_mul(SEC));
        // Later reports of a task say nothing new: its blocked-since stays the first report's, so
        // every reader, whenever it reads, sees the same one; only the source is added. (A reused
        // tid with another process behind it is a new stuck task.)
        if let Some(known) = self.tasks.get_mut(&header.pid).filter(|known| known.header.tgid == header.tgid)
        {
            if !known.sources.contains(&header.probe) {
                known.sources.push(header.probe);
            }
            return false;
        }
        if !self.tasks.contains_key(&header.pid) && self.tasks.len() >= MAX_TASKS {
            self.untracked += 1;
            return false;
        }
        self.tasks.insert(
            header.pid,
            Tracked {
                header: header.clone(),
                wait,
                wait_kind,
                sources: vec![header.probe],
                exiting,
                stack: stack.texts().take(STACK_FRAMES).collect(),
                who: report.who.clone(),
                blocked_since_unix_ns: since,
            },
        );
        true
    }

    /// Tasks to look up in `/proc`: (tgid, tid).
    pub fn tracked(&self) -> Vec<(u32, u32)> {
        self.tasks.values().map(|t| (t.header.tgid, t.header.pid)).collect()
    }

    /// Forgets the tasks `/proc` shows no longer stuck; a cleared event for each.
    pub fn clear(&mut self, states: &[((u32, u32), TaskState)], now_unix_ns: u64) -> Vec<Attributed> {
        states
            .iter()
            .filter_map(|&((tgid, tid), state)| {
                let why = match state {
                    TaskState::Uninterruptible => return None,
                    TaskState::Other => "left_d_state",
                    TaskState::Gone => "exited",
                };
                if self.tasks.get(&tid)?.header.tgid != tgid {
                    return None;
                }
                let tracked = self.tasks.remove(&tid)?;
                let blocked_secs = now_unix_ns.saturating_sub(tracked.blocked_since_unix_ns) / SEC;
                let event = Event {
                    header: Header { time_unix_ns: now_unix_ns, ..tracked.header },
                    payload: Payload::HungTaskCleared(HungTaskCleared {
                        wait: tracked.wait,
                        wait_kind: tracked.wait_kind,
                        blocked_secs: Some(blocked_secs),
                        why,
                    }),
                };
                Some(Attributed { event, who: tracked.who })
            })
            .collect()
    }

    /// Every stuck task at `now`, longest blocked first.
    pub fn all(&self, now_unix_ns: u64) -> Vec<StuckTask> {
        longest_first(self.tasks.values().map(|t| t.at(now_unix_ns)).collect())
    }

    /// The stuck tasks of pod `uid` at `now`, longest blocked first.
    pub fn of_pod(&self, uid: &str, now_unix_ns: u64) -> Vec<StuckTask> {
        let mine = self.tasks.values().filter(|t| t.who.pod_uid.as_deref() == Some(uid));
        longest_first(mine.map(|t| t.at(now_unix_ns)).collect())
    }

    /// Wait class and kind, and who, of every stuck task.
    pub fn waits(&self) -> impl Iterator<Item = (WaitClass, WaitKind, &Attribution)> {
        self.tasks.values().map(|t| (t.wait, t.wait_kind, &*t.who))
    }

    pub fn longest_blocked_secs(&self, now_unix_ns: u64) -> u64 {
        self.tasks
            .values()
            .map(|t| now_unix_ns.saturating_sub(t.blocked_since_unix_ns) / SEC)
            .max()
            .unwrap_or(0)
    }

    /// Reports not kept because the set was full (`kstall_stuck_tasks_untracked_total`).
    pub fn untracked(&self) -> u64 {
        self.untracked
    }
}

fn longest_first(mut tasks: Vec<StuckTask>) -> Vec<StuckTask> {
    tasks.sort_by(|a, b| b.blocked_secs.cmp(&a.blocked_secs).then(a.tid.cmp(&b.tid)));
    tasks
}

impl Tracked {
    fn at(&self, now_unix_ns: u64) -> StuckTask {
        StuckTask {
            pid: self.header.tgid,
            tid: self.header.pid,
            comm: self.header.comm.clone(),
            wait: self.wait,
            wait_kind: self.wait_kind,
            sources: self.sources.clone(),
            blocked_secs: now_unix_ns.saturating_sub(self.blocked_since_unix_ns) / SEC,
            blocked_since_unix_ns: self.blocked_since_unix_ns,
            exiting: self.exiting,
            stack: self.stack.clone(),
            who: self.who.clone(),
        }
    }
}

/// Keeps the stuck set's tasks current until `stop`, handing their states to the pipeline (which
/// applies them, `Pipeline::apply_task_states`): from each of a probe's walks of every task when
/// one walks them (a stuck task the sweep did not find asleep ran or exited), else from `/proc`
/// once a second. `swept` gets each sweep's figures.
pub fn follow(
    sweeps: Option<Box<dyn TaskSweeps>>,
    stuck: Arc<Mutex<StuckSet>>,
    states: mpsc::Sender<TaskStates>,
    swept: impl Fn(&Result<Sweep, String>) + Send + Sync + 'static,
    stop: CancellationToken,
) -> tokio::task::JoinHandle<()> {
    let Some(sweeps) = sweeps else { return tokio::spawn(watch_states(stuck, states, stop)) };
    let after_sweep = move |sweep: Result<Sweep, String>| {
        if let Err(e) = &sweep {
            tracing::warn!(error = %e, "stuck-task sweep failed; stuck tasks checked in /proc instead");
        }
        let tracked = stuck.lock().unwrap_or_else(std::sync::PoisonError::into_inner).tracked();
        if !tracked.is_empty() {
            // A failed sweep lists no task: each stuck one is then read in /proc.
            let asleep = sweep.as_ref().map(|s| s.asleep.as_slice()).unwrap_or_default();
            // Full: the pipeline has the previous sweep's still to apply.
            let _ = states.try_send(states_after_sweep(tracked, asleep));
        }
        swept(&sweep);
    };
    tokio::spawn(sweep_every(sweeps, after_sweep, stop))
}

/// Sweeps at the sweeps' interval until `stop`, each on the blocking pool, where `swept` gets
/// its result (it may read `/proc` or wait on a lock there). A sweep is never run twice at once,
/// so a slow one delays the next.
async fn sweep_every(
    mut sweeps: Box<dyn TaskSweeps>,
    swept: impl Fn(Result<Sweep, String>) + Send + Sync + 'static,
    stop: CancellationToken,
) {
    let swept = Arc::new(swept);
    let mut tick = tokio::time::interval(sweeps.interval());
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tick.tick() => {}
        }
        let swept = swept.clone();
        let run = tokio::task::spawn_blocking(move || {
            swept(sweeps.sweep());
            sweeps
        });
        match run.await {
            Ok(back) => sweeps = back,
            Err(e) => {
                tracing::error!(error = %e, "the stuck-task sweep panicked; sampling stops");
                return;
            }
        }
    }
}

/// Reads the stuck tasks' states from `/proc` once a second and hands them to the pipeline. The
/// reads run on the blocking pool with a deadline, so a misbehaving `/proc` cannot stall the
/// agent.
async fn watch_states(
    stuck: Arc<Mutex<StuckSet>>,
    states: mpsc::Sender<TaskStates>,
    stop: CancellationToken,
) {
    let mut tick = tokio::time::interval(STATE_CHECK_INTERVAL);
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tick.tick() => {}
        }
        let tracked = stuck.lock().unwrap_or_else(std::sync::PoisonError::into_inner).tracked();
        if tracked.is_empty() {
            continue;
        }
        let read = tokio::task::spawn_blocking(move || {
            tracked.into_iter().map(|(tgid, tid)| ((tgid, tid), read_task_state(tgid, tid))).collect()
        });
        match tokio::time::timeout(STATE_READ_DEADLINE, read).await {
            Ok(Ok(read)) => {
                if states.send(read).await.is_err() {
                    return;
                }
            }
            _ => tracing::warn!("reading stuck tasks' state from /proc timed out"),
        }
    }
}

/// The states of the `tracked` stuck tasks after a sweep that found `asleep` asleep
/// uninterruptibly. A tracked task it did not find ran or exited: `/proc` tells which (only for
/// those, so a sweep costs no `/proc` read while its stuck tasks stay stuck). Run off the async
/// runtime.
pub fn states_after_sweep(tracked: Vec<(u32, u32)>, asleep: &[(u32, u32)]) -> TaskStates {
    let asleep: std::collections::HashSet<&(u32, u32)> = asleep.iter().collect();
    tracked
        .into_iter()
        .map(|task| {
            let state = if asleep.contains(&task) {
                TaskState::Uninterruptible
            } else {
                read_task_state(task.0, task.1)
            };
            (task, state)
        })
        .collect()
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
    use crate::{probes::hung_task::HungTask, symbols::Stack};

    fn report(t: u64, tgid: u32, tid: u32, blocked: Option<u64>, wait: WaitClass) -> Attributed {
        let frames: Vec<String> = (0..20).map(|i| format!("frame_{i}")).collect();
        let frames: Vec<&str> = frames.iter().map(String::as_str).collect();
        let event = Event {
            header: Header {
                probe: "hung-task",
                time_unix_ns: t * SEC,
                tgid,
                pid: tid,
                comm: "dd".into(),
                cgroup_id: 9,
                netns: 7,
            },
            payload: Payload::HungTask(HungTask {
                blocked_secs: blocked,
                wait,
                stack: Stack::from_names(&frames),
                blocker: None,
                exiting: false,
            }),
        };
        Attributed { event, who: Arc::new(Attribution { pod_uid: Some("u1".into()), ..Default::default() }) }
    }

    #[test]
    fn repeated_reports_are_one_task_with_one_blocked_since() {
        let mut s = StuckSet::default();
        assert!(s.report(&report(1000, 10, 11, Some(120), WaitClass::Writeback)));
        assert!(!s.report(&report(1120, 10, 11, Some(240), WaitClass::Writeback)));
        assert!(s.report(&report(1000, 20, 20, Some(120), WaitClass::Nfs)));
        assert_eq!(s.waits().filter(|(w, _, _)| *w == WaitClass::Writeback).count(), 1);
        // Blocked since 880 s by both reports; at 1200 s that is 320 s, for every reader.
        let all = s.all(1200 * SEC);
        assert_eq!((all[0].tid, all[0].blocked_secs), (11, 320));
        assert_eq!(all[0].blocked_since_unix_ns, 880 * SEC);
        assert_eq!(s.of_pod("u1", 1200 * SEC)[0].blocked_secs, 320);
        assert_eq!(s.longest_blocked_secs(1200 * SEC), 320);
        assert_eq!(all[0].stack.len(), STACK_FRAMES);
        // The tid was reused by another process: that is a new stuck task.
        assert!(s.report(&report(1200, 30, 11, Some(120), WaitClass::Mm)));
    }

    #[test]
    fn without_a_tick_rate_blocked_counts_from_the_first_report() {
        let mut s = StuckSet::default();
        s.report(&report(1000, 10, 11, None, WaitClass::Nfs));
        assert_eq!(s.all(1030 * SEC)[0].blocked_secs, 30);
    }

    #[test]
    fn clears_only_tasks_no_longer_in_d_state() {
        let mut s = StuckSet::default();
        s.report(&report(100, 10, 11, Some(3), WaitClass::Writeback));
        s.report(&report(106, 10, 11, Some(9), WaitClass::Writeback));
        s.report(&report(100, 20, 20, Some(3), WaitClass::Nfs));
        s.report(&report(100, 30, 30, Some(3), WaitClass::Mm));
        let states = [
            ((10, 11), TaskState::Other),
            ((20, 20), TaskState::Uninterruptible),
            ((30, 30), TaskState::Gone),
            // A tid now of another process is not the tracked task.
            ((99, 20), TaskState::Other),
        ];
        let cleared = s.clear(&states, 110 * SEC);
        assert_eq!(cleared.len(), 2);
        let Payload::HungTaskCleared(c) = &cleared[0].event.payload else { panic!() };
        assert_eq!(
            (c.why, c.blocked_secs, cleared[0].event.header.time_unix_ns),
            ("left_d_state", Some(13), 110 * SEC)
        );
        assert_eq!(cleared[0].who.pod_uid.as_deref(), Some("u1"));
        assert_eq!(s.tracked(), vec![(20, 20)]);
    }

    #[test]
    fn a_full_set_counts_what_it_does_not_keep() {
        let mut s = StuckSet::default();
        for tid in 0..MAX_TASKS as u32 {
            assert!(s.report(&report(100, tid, tid, Some(1), WaitClass::Nfs)));
        }
        assert!(!s.report(&report(100, 1 << 30, 1 << 30, Some(1), WaitClass::Nfs)));
        // A task already kept is not news, and not counted as untracked.
        assert!(!s.report(&report(200, 5, 5, Some(150), WaitClass::Nfs)));
        assert_eq!(s.untracked(), 1);
        assert_eq!(s.of_pod("u1", 200 * SEC).iter().find(|t| t.tid == 5).unwrap().blocked_secs, 101);
    }

    #[test]
    fn both_sources_make_one_task() {
        use crate::probes::stuck_task::StuckTaskSample;
        let mut s = StuckSet::default();
        let mut sample = report(1000, 10, 11, Some(45), WaitClass::Nfs);
        sample.event.header.probe = "stuck-task";
        sample.event.payload = Payload::StuckTask(StuckTaskSample {
            blocked_secs: 45,
            wakeups: 0,
            wait: WaitClass::Nfs,
            wait_kind: WaitKind::Killable,
            stack: Stack::from_names(&["rpc_wait_bit_killable"]),
            exiting: false,
        });
        assert!(s.report(&sample));
        // The detector's later report of the same task adds its source, nothing else.
        assert!(!s.report(&report(1100, 10, 11, Some(120), WaitClass::Writeback)));
        let all = s.all(1200 * SEC);
        assert_eq!(all.len(), 1);
        assert_eq!(all[0].sources, ["stuck-task", "hung-task"]);
        assert_eq!(
            (all[0].wait, all[0].wait_kind, all[0].blocked_secs),
            (WaitClass::Nfs, WaitKind::Killable, 245)
        );
        assert!(
            all[0].stack[0].starts_with("rpc_wait_bit_killable"),
            "the sampler's stack: {:?}",
            all[0].stack
        );
        let cleared = s.clear(&[((10, 11), TaskState::Other)], 1300 * SEC);
        let Payload::HungTaskCleared(c) = &cleared[0].event.payload else { panic!() };
        assert_eq!((c.wait_kind, c.blocked_secs), (WaitKind::Killable, Some(345)));
    }

    #[test]
    fn a_sweep_keeps_the_tasks_it_found_asleep() {
        let me = std::process::id();
        let tracked = vec![(10, 11), (me, me), (u32::MAX, u32::MAX)];
        let states = states_after_sweep(tracked, &[(10, 11), (20, 20)]);
        assert_eq!(
            states,
            [
                ((10, 11), TaskState::Uninterruptible),
                // Not found asleep: running (this test), or gone.
                ((me, me), TaskState::Other),
                ((u32::MAX, u32::MAX), TaskState::Gone),
            ]
        );
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
