//! What a probe gives the registry: the programs it needs and where they attach (its [`Plan`]),
//! and what it reports ([`ProbeStatus`]). Shared by every probe and the registry; names no probe.

use serde::{Deserialize, Serialize};

/// One program of a probe and where it attaches.
#[derive(Debug, Clone, Copy)]
pub struct ProgramSpec {
    pub program: &'static str,
    /// The tracepoint or kernel function (empty for an iterator).
    pub target: &'static str,
    pub attach: Attach,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Attach {
    TpBtf,
    FEntry,
    /// A task iterator: loaded here, linked and read by its probe (nothing fires it).
    TaskIter,
}

impl ProgramSpec {
    pub const fn tp_btf(program: &'static str, target: &'static str) -> Self {
        Self { program, target, attach: Attach::TpBtf }
    }

    pub const fn fentry(program: &'static str, target: &'static str) -> Self {
        Self { program, target, attach: Attach::FEntry }
    }

    pub const fn task_iter(program: &'static str) -> Self {
        Self { program, target: "iter/task", attach: Attach::TaskIter }
    }
}

/// What a probe needs loaded: its programs and the global holding what they read from the agent
/// (offsets resolved from BTF), if they read anything.
pub struct Plan {
    /// The global's name and its bytes.
    pub config: Option<(&'static str, Vec<u8>)>,
    pub programs: Vec<ProgramSpec>,
    /// Human description of the hooks in use, for `kstall status`.
    pub hook: String,
    pub notes: Vec<String>,
    /// What this kernel's hooks cannot give.
    pub unavailable: Vec<Unavailable>,
    /// What to use when `programs` cannot attach (e.g. fentry refused).
    pub fallback: Option<Fallback>,
}

/// A probe's second choice of hooks, and what it gives up.
pub struct Fallback {
    pub programs: Vec<ProgramSpec>,
    pub hook: String,
    /// Missing on the fallback hooks, in addition to the plan's own.
    pub unavailable: Vec<Unavailable>,
}

/// A field a probe's events cannot carry on this kernel, and why: named by `kstall status` and the
/// README's kernel table (generated from the matrix), never left as a silent empty value.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Unavailable {
    pub field: String,
    pub why: String,
}

impl Unavailable {
    pub fn new(field: &str, why: impl Into<String>) -> Self {
        Self { field: field.to_string(), why: why.into() }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ProbeStatus {
    pub name: String,
    pub up: bool,
    pub hook: Option<String>,
    /// Why the probe is down.
    pub reason: Option<String>,
    pub notes: Vec<String>,
    /// Fields its events cannot carry on this kernel.
    #[serde(default)]
    pub unavailable: Vec<Unavailable>,
}

impl ProbeStatus {
    pub fn down(name: &str, reason: impl Into<String>) -> Self {
        Self {
            name: name.to_string(),
            up: false,
            hook: None,
            reason: Some(reason.into()),
            notes: Vec::new(),
            unavailable: Vec::new(),
        }
    }
}
