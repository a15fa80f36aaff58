//! The kinds of events: the [`EventKind`] each event of a probe declares (its trace text, its
//! subject, its metric families) and the [`EventData`] each payload type implements (its filter
//! fields, a count's suppressed events). `kstall trace`, the filters, attribution and the
//! pipeline read events through them instead of naming probes.

use kstall_common::metrics::Metric;
use serde_json::Value;

use super::wait::Stuck;

/// One kind of event: the `kind` its JSON carries and all that generic code needs to know of it.
pub struct EventKind {
    pub name: &'static str,
    pub subject: Subject,
    /// The metric families `export/metrics.rs` feeds from it, from the catalogue (none: counted
    /// from the kernel's counters, which arrive as another kind).
    pub families: &'static [&'static Metric],
    /// Its line in `kstall trace`, from the JSON the agent sends (the client renders).
    pub text: fn(&Fields) -> String,
}

/// Whom an event is about, which decides how it is attributed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Subject {
    /// The task in its header (or, for a count, its cgroup): a hung task, an OOM victim.
    Task,
    /// Its network namespace: resets and RPCs run in softirq or kworker context, whose task is
    /// whoever the CPU was running.
    Netns,
}

/// What a trace's `--port` and `--server` filters match in an event.
#[derive(Debug, Default, PartialEq)]
pub struct FilterFields {
    pub ports: Vec<u16>,
    pub addrs: Vec<String>,
}

/// The data of one event kind (each payload type implements it; `Payload::data` dispatches).
pub trait EventData {
    fn kind(&self) -> &'static EventKind;

    fn filter_fields(&self) -> FilterFields {
        FilterFields::default()
    }

    /// For a count from the kernel's counters: the events it counted that were not sent in full.
    fn suppressed(&self) -> Option<u64> {
        None
    }

    /// For a report of a stuck task: what the stuck set keeps of it (the pipeline sends it
    /// there, and on only if it is news).
    fn stuck(&self) -> Option<Stuck<'_>> {
        None
    }

    /// What it does to its metric families (a family about events gets the pod labels after the
    /// label values given here; the exporter adds them and caps the family).
    fn updates(&self, _: &Source) -> Vec<Update> {
        Vec::new()
    }
}

/// The header fields a payload's metric labels may take.
pub struct Source<'a> {
    /// The probe that sent it (a stuck task's `source`).
    pub probe: &'static str,
    /// The task's name (an OOM victim's `comm`).
    pub comm: &'a str,
}

/// One change to one series of a family of the catalogue: its own label values, in its order.
#[derive(Debug, PartialEq)]
pub struct Update {
    pub metric: &'static Metric,
    pub labels: Vec<String>,
    pub change: Change,
}

#[derive(Debug, PartialEq)]
pub enum Change {
    /// A counter counts this many more.
    Add(u64),
    /// A gauge is now this.
    Set(i64),
    /// A histogram observes this.
    Observe(f64),
    /// A histogram observes what a histogram in the kernel counted: RPCs per bucket (not
    /// cumulative; one per bound and the last past them) and their sum.
    Buckets { counts: Vec<u64>, sum: f64 },
}

impl Update {
    pub fn new(metric: &'static Metric, labels: &[&str], change: Change) -> Self {
        Self { metric, labels: labels.iter().map(|l| l.to_string()).collect(), change }
    }
}

/// An event's JSON as its trace text reads it: missing fields read as empty (`s`) or `?` (`n`).
pub struct Fields<'a>(pub &'a Value);

impl Fields<'_> {
    pub fn s(&self, key: &str) -> &str {
        self.0[key].as_str().unwrap_or("")
    }

    pub fn n(&self, key: &str) -> String {
        self.0[key].as_u64().map(|v| v.to_string()).unwrap_or_else(|| "?".into())
    }

    pub fn is_true(&self, key: &str) -> bool {
        self.0[key] == true
    }

    pub fn get(&self, key: &str) -> &Value {
        &self.0[key]
    }

    /// `tgid/pid comm` of the header's task.
    pub fn task(&self) -> String {
        format!("{}/{} {}", self.n("tgid"), self.n("pid"), self.s("comm"))
    }

    /// The first frame of `stack`.
    pub fn top_frame(&self) -> &str {
        self.0["stack"].as_array().and_then(|f| f.first()).and_then(Value::as_str).unwrap_or("")
    }
}
