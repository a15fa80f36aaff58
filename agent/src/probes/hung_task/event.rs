//! What hung-task says: a task the kernel's detector reported.

use kstall_common::metrics;
use serde::Serialize;

use crate::{
    probes::{
        kind::{Change, EventData, EventKind, Source, Subject, Update},
        wait::{Stuck, WaitClass, WaitKind},
    },
    symbols::Stack,
};

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Blocker {
    /// `mutex`, `semaphore`, `rwsem_reader` or `rwsem_writer`.
    pub lock: &'static str,
    pub owner_pid: Option<u32>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct HungTask {
    /// Seconds since the detector last saw the task run; at least `hung_task_timeout_secs`.
    /// `None` when the kernel's tick rate could not be determined.
    pub blocked_secs: Option<u64>,
    pub wait: WaitClass,
    /// Symbolized kernel stack, innermost frame first.
    pub stack: Stack,
    /// What the task blocks on, on kernels that track it.
    pub blocker: Option<Blocker>,
    /// The task is exiting (`PF_EXITING`, or no namespaces left), as in incident 1's flush of the
    /// files `do_exit` closes.
    pub exiting: bool,
}

pub(super) const HUNG: EventKind = EventKind {
    name: "hung_task",
    subject: Subject::Task,
    families: &[&metrics::STUCK_TASKS_TOTAL],
    text: |e| format!("hung {}s in {} {} at {}", e.n("blocked_secs"), e.s("wait"), e.task(), e.top_frame()),
};

impl EventData for HungTask {
    fn kind(&self) -> &'static EventKind {
        &HUNG
    }

    fn stuck(&self) -> Option<Stuck<'_>> {
        Some(Stuck {
            blocked_secs: self.blocked_secs,
            wait: self.wait,
            wait_kind: WaitKind::Uninterruptible,
            exiting: self.exiting,
            stack: &self.stack,
        })
    }

    fn updates(&self, source: &Source) -> Vec<Update> {
        let labels = [self.wait.as_str(), WaitKind::Uninterruptible.as_str(), source.probe];
        vec![Update::new(&metrics::STUCK_TASKS_TOTAL, &labels, Change::Add(1))]
    }
}
