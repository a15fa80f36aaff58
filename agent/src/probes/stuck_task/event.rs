//! What stuck-task says: a task a sweep found stuck.

use kstall_common::metrics;
use serde::Serialize;

use crate::{
    probes::{
        kind::{Change, EventData, EventKind, Source, Subject, Update},
        wait::{Stuck, WaitClass, WaitKind},
    },
    symbols::Stack,
};

/// A stuck task as one sweep found it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct StuckTaskSample {
    /// Since the first sweep of this spell that saw it asleep: at least the threshold, short of
    /// the true time by up to one interval (or by how long it slept before the agent started).
    pub blocked_secs: u64,
    /// Times it woke and slept again meanwhile: 0 when it has not run at all, a few in a retry
    /// loop (at most one a second, or it would not be stuck).
    pub wakeups: u64,
    pub wait: WaitClass,
    /// Named so, not `kind`: that key is the event's kind in JSON.
    pub wait_kind: WaitKind,
    /// Symbolized kernel stack, innermost frame first.
    pub stack: Stack,
    pub exiting: bool,
}

/// Found by the sampler: killable waits too, which the kernel's detector never reports.
pub(super) const STUCK: EventKind = EventKind {
    name: "stuck_task",
    subject: Subject::Task,
    families: &[&metrics::STUCK_TASKS_TOTAL],
    text: |e| {
        let exiting = if e.is_true("exiting") { " while exiting" } else { "" };
        format!(
            "stuck {}s ({}, {} wakeups) in {} {} at {}{exiting}",
            e.n("blocked_secs"),
            e.s("wait_kind"),
            e.n("wakeups"),
            e.s("wait"),
            e.task(),
            e.top_frame()
        )
    },
};

impl EventData for StuckTaskSample {
    fn kind(&self) -> &'static EventKind {
        &STUCK
    }

    fn stuck(&self) -> Option<Stuck<'_>> {
        Some(Stuck {
            blocked_secs: Some(self.blocked_secs),
            wait: self.wait,
            wait_kind: self.wait_kind,
            exiting: self.exiting,
            stack: &self.stack,
        })
    }

    fn updates(&self, source: &Source) -> Vec<Update> {
        let labels = [self.wait.as_str(), self.wait_kind.as_str(), source.probe];
        vec![Update::new(&metrics::STUCK_TASKS_TOTAL, &labels, Change::Add(1))]
    }
}
