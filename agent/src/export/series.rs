//! The series book: every series of the metric families about events, the one place that decides
//! whether a new series may exist. Each family has a cap (`--max-series-per-metric`); past it a
//! new label set is counted in the family's overflow series instead, and refused once in
//! `kstall_metric_series_dropped_total`. A named pod's series are listed per pod, for `kstall
//! explain` and for removal when the pod is forgotten, which frees their room under the cap.

use std::collections::{HashMap, HashSet};

use serde::{Deserialize, Serialize};

use crate::attribution::Attribution;

/// The series cap as users give it: the flag, the `KSTALL_*` variable and the file's key at once.
#[derive(Debug, Default, clap::Args, serde::Serialize, serde::Deserialize)]
#[serde(default)]
// A group id of its own: clap names a flattened struct's group after the type.
#[group(id = "series_settings")]
pub struct Flags {
    /// Series one metric family may have; past it, new series are counted in the family's
    /// overflow series and in kstall_metric_series_dropped_total [default: 5000].
    #[arg(long, env = "KSTALL_MAX_SERIES_PER_METRIC", value_name = "N")]
    pub max_series_per_metric: Option<String>,
}

impl Flags {
    pub fn settings(self) -> Result<Settings, crate::setting::Invalid> {
        match self.max_series_per_metric {
            Some(text) => Settings::max_series_per_metric(&text).map_err(|e| ("max_series_per_metric", e)),
            None => Ok(Settings::default()),
        }
    }
}

/// The series cap.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Settings {
    pub max_series_per_metric: usize,
}

impl Settings {
    pub const DEFAULT_MAX_SERIES_PER_METRIC: usize = 5000;
    const MAX_MAX_SERIES_PER_METRIC: usize = 1_000_000;

    /// `--max-series-per-metric`: at least one series, at most a million.
    pub fn max_series_per_metric(text: &str) -> Result<Self, String> {
        text.trim()
            .parse::<usize>()
            .ok()
            .filter(|n| (1..=Self::MAX_MAX_SERIES_PER_METRIC).contains(n))
            .map(|max_series_per_metric| Self { max_series_per_metric })
            .ok_or_else(|| format!("{text:?} is not a number of series (1 to 1000000)"))
    }
}

impl Default for Settings {
    fn default() -> Self {
        Self { max_series_per_metric: Self::DEFAULT_MAX_SERIES_PER_METRIC }
    }
}

/// The labels that say who an event is about. `host` is "true" for node processes and
/// host-network events, "false" otherwise (an empty pod with host="false": not attributed).
pub use kstall_common::metrics::POD_LABELS;
use kstall_common::metrics::{self as catalogue, Metric};

/// The metric families about events: each carries the pod labels after its own and is capped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Family {
    TcpResets,
    PacketDrops,
    StuckTasks,
    CpuLockups,
    OomKills,
    NfsRetransmits,
    NfsTimeouts,
    NfsConnectErrors,
    NfsStateManager,
    NfsResponding,
    NfsRpcDuration,
}

impl Family {
    pub const ALL: [Family; 11] = [
        Family::TcpResets,
        Family::PacketDrops,
        Family::StuckTasks,
        Family::CpuLockups,
        Family::OomKills,
        Family::NfsRetransmits,
        Family::NfsTimeouts,
        Family::NfsConnectErrors,
        Family::NfsStateManager,
        Family::NfsResponding,
        Family::NfsRpcDuration,
    ];

    /// The family of the catalogue's `metric`, if it is one about events.
    pub fn of(metric: &Metric) -> Option<Family> {
        Family::ALL.into_iter().find(|f| f.metric() == metric)
    }

    /// Its entry in the metric catalogue.
    pub fn metric(self) -> &'static Metric {
        match self {
            Family::TcpResets => &catalogue::TCP_RESETS,
            Family::PacketDrops => &catalogue::PACKET_DROPS,
            Family::StuckTasks => &catalogue::STUCK_TASKS_TOTAL,
            Family::CpuLockups => &catalogue::CPU_LOCKUPS,
            Family::OomKills => &catalogue::OOM_KILLS,
            Family::NfsRetransmits => &catalogue::NFS_RETRANSMITS,
            Family::NfsTimeouts => &catalogue::NFS_TIMEOUTS,
            Family::NfsConnectErrors => &catalogue::NFS_CONNECT_ERRORS,
            Family::NfsStateManager => &catalogue::NFS_STATE_MANAGER_FAILURES,
            Family::NfsResponding => &catalogue::NFS_SERVER_RESPONDING,
            Family::NfsRpcDuration => &catalogue::NFS_RPC_DURATION,
        }
    }

    pub fn name(self) -> &'static str {
        self.metric().name
    }

    /// Its own labels, before the pod labels.
    pub fn labels(self) -> &'static [&'static str] {
        self.metric().labels
    }

    /// The overflow series' label values: `overflow` for each of its own labels, the pod labels
    /// empty (who it was about is what the cap gave up).
    pub fn overflow_labels(self) -> Vec<&'static str> {
        let mut labels = vec![OVERFLOW; self.labels().len()];
        labels.extend([""; POD_LABELS.len()]);
        labels
    }

    /// Whether it is a counter (exported by `EventCounters` from the book).
    pub fn is_counter(self) -> bool {
        self.metric().kind == catalogue::Type::Counter
    }

    fn index(self) -> usize {
        Family::ALL.iter().position(|&f| f == self).expect("every family is in ALL")
    }
}

pub const OVERFLOW: &str = "overflow";

/// How many series a family has, its cap, and the new series it refused.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FamilySeries {
    pub metric: String,
    pub series: usize,
    pub max: usize,
    pub dropped: u64,
}

/// (namespace, pod).
pub type PodName = (String, String);

/// One series: its family, label values, and value (a counter's count, a gauge's last value).
pub struct Entry {
    pub family: Family,
    pub labels: Vec<String>,
    pub value: i64,
    /// When the event that last set a gauge happened (`time_unix_ns`).
    set_at: u64,
}

/// Where an update goes.
pub enum Admission {
    /// The series' slot: it exists (or was just made) and is to be updated.
    Series(usize),
    /// The family is full: the update goes to its overflow series; `first` when this label set
    /// was refused for the first time (since room was last freed).
    Overflow { first: bool },
}

/// Label sets remembered as refused, so that each counts once; beyond this every refusal counts.
const REMEMBERED_REFUSALS: usize = 1 << 16;

pub struct SeriesBook {
    max_per_family: usize,
    /// The series, where `seen` and `by_pod` point; a removed series' slot is reused.
    slots: Vec<Option<Entry>>,
    free: Vec<usize>,
    by_pod: HashMap<PodName, Vec<usize>>,
    /// Series hash -> its slot: the event path pays a hash, not an allocation, for a series it
    /// has seen.
    seen: HashMap<u64, usize, SeriesHasher>,
    live: [usize; Family::ALL.len()],
    dropped: [u64; Family::ALL.len()],
    /// A counter family's overflow series, once an update went there.
    overflow: [Option<u64>; Family::ALL.len()],
    refused: HashSet<u64, SeriesHasher>,
    hasher: SeriesHasher,
}

/// foldhash, seeded per process: a series' identity is its hash, taken on every event, and
/// SipHash was a fifth of the book's time in a storm of new series (profiled).
type SeriesHasher = foldhash::fast::RandomState;

impl SeriesBook {
    pub fn new(settings: Settings) -> Self {
        Self {
            max_per_family: settings.max_series_per_metric,
            slots: Vec::new(),
            free: Vec::new(),
            by_pod: HashMap::new(),
            seen: HashMap::default(),
            live: [0; Family::ALL.len()],
            dropped: [0; Family::ALL.len()],
            overflow: [None; Family::ALL.len()],
            refused: HashSet::default(),
            hasher: SeriesHasher::default(),
        }
    }

    fn hash(&self, family: Family, labels: &[&str]) -> u64 {
        std::hash::BuildHasher::hash_one(&self.hasher, (family, labels))
    }

    /// The series of `labels` (the family's own then the pod labels) about `who`, made if its
    /// family has room.
    pub fn admit(&mut self, family: Family, labels: &[&str], who: &Attribution) -> Admission {
        let hash = self.hash(family, labels);
        if let Some(&slot) = self.seen.get(&hash) {
            return Admission::Series(slot);
        }
        let f = family.index();
        if self.live[f] >= self.max_per_family {
            let first = self.refused.len() >= REMEMBERED_REFUSALS || self.refused.insert(hash);
            if first {
                self.dropped[f] += 1;
            }
            return Admission::Overflow { first };
        }
        let entry =
            Entry { family, labels: labels.iter().map(|l| l.to_string()).collect(), value: 0, set_at: 0 };
        let slot = match self.free.pop() {
            Some(slot) => {
                self.slots[slot] = Some(entry);
                slot
            }
            None => {
                self.slots.push(Some(entry));
                self.slots.len() - 1
            }
        };
        self.seen.insert(hash, slot);
        self.live[f] += 1;
        if !who.pod.is_empty() {
            self.by_pod.entry((who.namespace.clone(), who.pod.clone())).or_default().push(slot);
        }
        Admission::Series(slot)
    }

    pub fn update(&mut self, slot: usize, update: impl FnOnce(&mut i64)) {
        if let Some(entry) = &mut self.slots[slot] {
            update(&mut entry.value);
        }
    }

    /// Adds `n` to counter `family`'s overflow series (an update its cap refused).
    pub fn add_overflow(&mut self, family: Family, n: u64) {
        let total = self.overflow[family.index()].get_or_insert(0);
        *total = total.saturating_add(n);
    }

    /// What counter `family`'s overflow series holds, once an update went there.
    pub fn overflowed(&self, family: Family) -> Option<u64> {
        self.overflow[family.index()]
    }

    /// Every series of `family`.
    pub fn series_of(&self, family: Family) -> impl Iterator<Item = &Entry> {
        self.slots.iter().flatten().filter(move |e| e.family == family)
    }

    /// Sets a gauge's value to what an event of time `at` says, unless a later event set it
    /// already: events can reach the agent out of order (a program preempted between taking its
    /// time and sending its event, where the kernel runs programs preemptibly, as 7.3 does).
    /// Whether it was set.
    pub fn set_if_newer(&mut self, slot: usize, value: i64, at: u64) -> bool {
        match &mut self.slots[slot] {
            Some(entry) if at >= entry.set_at => {
                (entry.value, entry.set_at) = (value, at);
                true
            }
            _ => false,
        }
    }

    pub fn of(&self, namespace: &str, pod: &str) -> Vec<&Entry> {
        let slots = self.by_pod.get(&(namespace.to_string(), pod.to_string()));
        slots.into_iter().flatten().filter_map(|&slot| self.slots[slot].as_ref()).collect()
    }

    /// Takes the series of every named pod not in `named`, freeing their room.
    pub fn take_except(&mut self, named: &HashSet<PodName>) -> Vec<Entry> {
        let gone: Vec<PodName> = self.by_pod.keys().filter(|k| !named.contains(*k)).cloned().collect();
        let mut series = Vec::new();
        for key in gone {
            for slot in self.by_pod.remove(&key).unwrap_or_default() {
                let Some(entry) = self.slots[slot].take() else { continue };
                let refs: Vec<&str> = entry.labels.iter().map(String::as_str).collect();
                let hash = self.hash(entry.family, &refs);
                self.seen.remove(&hash);
                self.live[entry.family.index()] -= 1;
                self.free.push(slot);
                series.push(entry);
            }
        }
        if !series.is_empty() {
            // What was refused may now have room.
            self.refused.clear();
        }
        series
    }

    pub fn families(&self) -> Vec<FamilySeries> {
        Family::ALL
            .iter()
            .map(|&f| FamilySeries {
                metric: f.name().into(),
                series: self.live[f.index()],
                max: self.max_per_family,
                dropped: self.dropped[f.index()],
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(name: &str) -> Attribution {
        Attribution { namespace: "shop".into(), pod: name.into(), ..Default::default() }
    }

    fn labels(port: &str, pod: &str) -> Vec<String> {
        ["sent", port, "", ""].iter().map(|s| s.to_string()).chain(["shop".into(), pod.into()]).collect()
    }

    fn admit(book: &mut SeriesBook, port: &str, who: &Attribution) -> Admission {
        let labels = labels(port, &who.pod);
        let refs: Vec<&str> = labels.iter().map(String::as_str).collect();
        book.admit(Family::TcpResets, &refs, who)
    }

    #[test]
    fn a_gauge_keeps_the_latest_events_value_whatever_order_they_arrive_in() {
        let mut book = SeriesBook::new(Settings::default());
        let Admission::Series(slot) = admit(&mut book, "2049", &pod("web-1")) else { panic!() };
        assert!(book.set_if_newer(slot, 0, 10));
        assert!(book.set_if_newer(slot, 1, 20), "answered at 20");
        assert!(!book.set_if_newer(slot, 0, 19), "a timeout of 19 that arrived late");
        assert_eq!(book.of("shop", "web-1")[0].value, 1);
    }

    #[test]
    fn a_full_family_overflows_and_counts_each_refused_series_once() {
        let mut book = SeriesBook::new(Settings { max_series_per_metric: 2 });
        let web = pod("web-1");
        assert!(matches!(admit(&mut book, "80", &web), Admission::Series(_)));
        assert!(matches!(admit(&mut book, "443", &web), Admission::Series(_)));
        // A known series is always updated.
        assert!(matches!(admit(&mut book, "80", &web), Admission::Series(_)));
        assert!(matches!(admit(&mut book, "8080", &web), Admission::Overflow { first: true }));
        assert!(matches!(admit(&mut book, "8080", &web), Admission::Overflow { first: false }));
        assert!(matches!(admit(&mut book, "9090", &web), Admission::Overflow { first: true }));
        // Another family has its own room.
        let oom = ["memcg", "stress", "false", "shop", "web-1"];
        assert!(matches!(book.admit(Family::OomKills, &oom, &web), Admission::Series(_)));
        let resets = &book.families()[0];
        assert_eq!(
            (resets.metric.as_str(), resets.series, resets.max, resets.dropped),
            (Family::TcpResets.name(), 2, 2, 2)
        );
        let ooms = book.families().into_iter().find(|f| f.metric == Family::OomKills.name()).unwrap();
        assert_eq!(ooms.series, 1);
    }

    #[test]
    fn a_forgotten_pod_frees_its_room() {
        let mut book = SeriesBook::new(Settings { max_series_per_metric: 2 });
        let (web, db) = (pod("web-1"), pod("db-0"));
        admit(&mut book, "80", &web);
        admit(&mut book, "443", &web);
        assert!(matches!(admit(&mut book, "5432", &db), Admission::Overflow { first: true }));
        let gone = book.take_except(&HashSet::from([("shop".to_string(), "db-0".to_string())]));
        assert_eq!(gone.len(), 2);
        assert_eq!(book.families()[0].series, 0);
        assert!(matches!(admit(&mut book, "5432", &db), Admission::Series(_)));
        assert_eq!(book.of("shop", "db-0").len(), 1);
        assert!(book.of("shop", "web-1").is_empty());
        // Unnamed series count against the cap too, and stay: nothing names them to forget.
        let host = Attribution { host: true, ..Default::default() };
        assert!(matches!(admit(&mut book, "22", &host), Admission::Series(_)));
        assert!(matches!(admit(&mut book, "23", &host), Admission::Overflow { first: true }));
        book.take_except(&HashSet::new());
        assert_eq!(book.families()[0].series, 1);
    }

    #[test]
    fn the_cap_takes_one_to_a_million() {
        assert_eq!(Settings::max_series_per_metric(" 200").unwrap().max_series_per_metric, 200);
        for bad in ["0", "-1", "1000001", "many", ""] {
            assert!(Settings::max_series_per_metric(bad).is_err(), "{bad}");
        }
    }
}
