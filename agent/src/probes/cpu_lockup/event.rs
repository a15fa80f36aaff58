//! What cpu-lockup says: a CPU the kernel's soft-lockup watchdog or RCU's stall detector found
//! stuck, and what it was running.

use kstall_common::metrics;
use serde::Serialize;

use crate::{
    probes::{
        kind::{Change, EventData, EventKind, Source, Subject, Update},
        wait::WaitClass,
    },
    symbols::Stack,
};

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Detector {
    /// The watchdog: the CPU ran no other task for 2 × `kernel.watchdog_thresh` seconds.
    SoftLockup,
    /// RCU: the CPU passed no quiescent state for `rcu_cpu_stall_timeout` seconds.
    RcuStall,
}

impl Detector {
    pub fn as_str(self) -> &'static str {
        match self {
            Detector::SoftLockup => "soft_lockup",
            Detector::RcuStall => "rcu_stall",
        }
    }

    /// As the kernel's message says it.
    pub fn describe(self) -> &'static str {
        match self {
            Detector::SoftLockup => "soft lockup",
            Detector::RcuStall => "RCU stall",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CpuLockup {
    pub detector: Detector,
    /// The stuck CPU.
    pub cpu: u32,
    /// Whether the report ran on the stuck CPU, so that the event's task is the one that was
    /// running there and `stack` its kernel stack. RCU's detector also reports stalls of other
    /// CPUs: then only the CPU is known.
    pub task_known: bool,
    /// Where the stack spins, as for a stuck task (`nfs`: in the NFS client).
    pub wait: WaitClass,
    /// The kernel stack the CPU was running when the detector's timer interrupted it, innermost
    /// frame first (the interrupt's own frames removed).
    pub stack: Stack,
}

pub(super) const LOCKUP: EventKind = EventKind {
    name: "cpu_lockup",
    subject: Subject::Task,
    families: &[&metrics::CPU_LOCKUPS],
    text: |e| {
        let detector = e.s("detector").replace('_', " ");
        if e.is_true("task_known") {
            format!("{detector} on cpu {}: {} in {} at {}", e.n("cpu"), e.task(), e.s("wait"), e.top_frame())
        } else {
            format!("{detector} on cpu {} (reported by another cpu: task unknown)", e.n("cpu"))
        }
    },
};

impl EventData for CpuLockup {
    fn kind(&self) -> &'static EventKind {
        &LOCKUP
    }

    fn updates(&self, _: &Source) -> Vec<Update> {
        let labels = [self.detector.as_str(), self.wait.as_str()];
        vec![Update::new(&metrics::CPU_LOCKUPS, &labels, Change::Add(1))]
    }
}
