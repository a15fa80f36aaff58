//! What oom says: a kill, and a series' count of them.

use kstall_common::metrics;
use serde::Serialize;

use crate::{
    probes::kind::{Change, EventData, EventKind, Source, Subject, Update},
    symbols::Stack,
};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Scope {
    /// A memory cgroup hit its limit (a container or pod limit).
    Memcg,
    /// The node ran out of memory.
    Global,
    Unknown,
}

impl Scope {
    pub fn as_str(self) -> &'static str {
        match self {
            Scope::Memcg => "memcg",
            Scope::Global => "global",
            Scope::Unknown => "unknown",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Invoker {
    pub pid: u32,
    pub tgid: u32,
    pub comm: String,
    pub cgroup_id: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct OomKill {
    pub scope: Scope,
    /// The victim is a node-critical process (kubelet, the container runtime, ...).
    pub critical: bool,
    /// Only the victim's pid is known (kernels before 6.9 without the fuller tracepoint).
    pub victim_pid_only: bool,
    pub anon_rss_bytes: Option<u64>,
    pub file_rss_bytes: Option<u64>,
    pub shmem_rss_bytes: Option<u64>,
    pub total_vm_bytes: Option<u64>,
    pub oom_score_adj: Option<i32>,
    /// The cgroup whose limit was hit (fentry hook only; `None` when unknown).
    pub oom_cgroup_id: Option<u64>,
    /// Memory the victim was weighed against, in bytes (fentry hook only).
    pub totalpages_bytes: Option<u64>,
    /// The innermost directories of the victim's memory cgroup path as the kernel had them at
    /// the kill (`kubepods/burstable/pod<uid>/<id>`): who the victim was, also once its
    /// container and cgroup are gone. `None` where the kernel gave no path.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub victim_memcg: Option<String>,
    pub invoker: Invoker,
    /// The invoking task's kernel stack, innermost first: the evidence for `scope`.
    pub invoker_stack: Stack,
}

/// One interval's OOM kills of one series, read from the kernel's counters: exact, and how many
/// were not sent in full. The victim's name is the event header's `comm`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct OomKillCount {
    pub scope: Scope,
    /// The hook that counted it did not know the scope (`mark_victim`): the kills of its key,
    /// sent in full, tell it (the pipeline settles it).
    #[serde(skip)]
    pub scope_from_events: bool,
    pub critical: bool,
    pub kills: u64,
    pub suppressed: u64,
}

pub(super) const KILL: EventKind = EventKind {
    name: "oom_kill",
    subject: Subject::Task,
    families: &[],
    text: |e| {
        let rss =
            e.get("anon_rss_bytes").as_u64().map(|b| format!(" rss {} MiB", b >> 20)).unwrap_or_default();
        let critical = if e.is_true("critical") { " CRITICAL" } else { "" };
        format!("OOM kill ({}) of {}{rss}{critical}", e.s("scope"), e.task())
    },
};

/// A series' kills beyond those shown (sampling).
pub(super) const KILL_COUNT: EventKind = EventKind {
    name: "oom_kill_count",
    subject: Subject::Task,
    families: &[&metrics::OOM_KILLS],
    text: |e| {
        format!(
            "{} more OOM kills ({}) of {} not shown ({} counted in 1 s)",
            e.n("suppressed"),
            e.s("scope"),
            if e.s("comm").is_empty() { "?" } else { e.s("comm") },
            e.n("kills")
        )
    },
};

impl EventData for OomKill {
    fn kind(&self) -> &'static EventKind {
        &KILL
    }
}

impl EventData for OomKillCount {
    fn kind(&self) -> &'static EventKind {
        &KILL_COUNT
    }

    fn updates(&self, source: &Source) -> Vec<Update> {
        let labels = [self.scope.as_str(), source.comm, if self.critical { "true" } else { "false" }];
        vec![Update::new(&metrics::OOM_KILLS, &labels, Change::Add(self.kills))]
    }

    fn suppressed(&self) -> Option<u64> {
        Some(self.suppressed)
    }
}
