//! The event both stuck-task probes emit when a stuck task they reported runs again or exits.

use kstall_common::metrics;
use serde::Serialize;

use super::{
    kind::{Change, EventData, EventKind, Source, Subject, Update},
    wait::{WaitClass, WaitKind},
};

/// A stuck task, however found, that left D state or exited: not from the kernel but from the
/// agent's look at `/proc` (`stuck.rs`), told as an event so everything downstream sees it in
/// order. Both stuck-task probes emit it, under their name.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct HungTaskCleared {
    pub wait: WaitClass,
    pub wait_kind: WaitKind,
    /// The longest blocked time reported while it was hung.
    pub blocked_secs: Option<u64>,
    /// `left_d_state` or `exited`.
    pub why: &'static str,
}

pub(super) const CLEARED: EventKind = EventKind {
    name: "hung_task_cleared",
    subject: Subject::Task,
    families: &[&metrics::STUCK_TASK_BLOCKED],
    text: |e| format!("no longer hung ({}) {}", e.s("why"), e.task()),
};

impl EventData for HungTaskCleared {
    fn kind(&self) -> &'static EventKind {
        &CLEARED
    }

    fn updates(&self, _: &Source) -> Vec<Update> {
        let Some(secs) = self.blocked_secs else { return Vec::new() };
        let labels = [self.wait.as_str(), self.wait_kind.as_str()];
        vec![Update::new(&metrics::STUCK_TASK_BLOCKED, &labels, Change::Observe(secs as f64))]
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    pub(crate) fn cleared() -> crate::probes::Payload {
        crate::probes::Payload::HungTaskCleared(HungTaskCleared {
            wait: WaitClass::Nfs,
            wait_kind: WaitKind::Killable,
            blocked_secs: Some(42),
            why: "exited",
        })
    }
}
