//! The connection tracking tables, sampled (issue 39: "nf_conntrack: table full, dropping
//! packet"). No tracepoint says the kernel refused to track a connection, and the hook that could
//! (`__nf_conntrack_alloc`) is a module function or refused on many kernels; but every network
//! namespace keeps per-CPU counters of what its table did (`/proc/<pid>/net/stat/nf_conntrack`),
//! among them `drop` — packets conntrack dropped because it could not get an entry — and
//! `entries`, the table's size now. The limit, `nf_conntrack_max`, is one for the node, checked
//! against each namespace's own count.
//!
//! Every `interval`, the host's namespace and each pod namespace the attribution index knows
//! (read through a process in it: a `/proc` read, no `setns`, nothing a stuck task holds) are read
//! and published on a `watch` channel: `conntrack-table-full` and the metrics read the last
//! sample and never wait on it.

use std::{collections::HashMap, path::PathBuf, sync::Arc, time::Duration};

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::{
    attribution::{Attribution, Index},
    kernel,
};

pub const DEFAULT_INTERVAL: Duration = Duration::from_secs(2);

/// One sample of every table kstall can read.
#[derive(Debug, Clone, Default)]
pub struct Tables {
    /// Counts the samples: a reader handles each once.
    pub sample: u64,
    pub at_unix_ns: u64,
    /// `nf_conntrack_max`; `None` where conntrack is not loaded (no table, nothing to fill).
    pub max: Option<u64>,
    pub tables: Vec<Table>,
}

/// One network namespace's table.
#[derive(Debug, Clone, PartialEq)]
pub struct Table {
    pub netns: u32,
    /// The pod whose namespace it is, or the host's.
    pub who: Arc<Attribution>,
    pub counters: Counters,
    /// Since the sample before (0 in a table's first): packets dropped for want of room
    /// (`Counters::refused_since`) ...
    pub refused: u64,
    /// ... and entries evicted to make room.
    pub early_dropped: u64,
}

/// The kernel's counters, summed over CPUs (`entries` is the table's, the same on every line).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counters {
    pub entries: u64,
    /// Packets dropped because no entry could be had: the table full (after `early_drop` found
    /// nothing to evict), an allocation failure — and, since they count here too, `insert_failed`.
    pub drop: u64,
    /// Entries that lost a race to be confirmed (the classic DNS-over-UDP clash): dropped too,
    /// but not for want of room.
    pub insert_failed: u64,
    /// Unassured entries evicted to make room: the table was full and the packet still got in.
    pub early_drop: u64,
}

impl Counters {
    /// Packets dropped since `before` because the table had no room (or memory).
    pub fn refused_since(&self, before: &Counters) -> u64 {
        let drops = self.drop.saturating_sub(before.drop);
        drops.saturating_sub(self.insert_failed.saturating_sub(before.insert_failed))
    }
}

/// Parses `/proc/<pid>/net/stat/nf_conntrack`: a header of column names, then one line of hex
/// numbers per CPU. Columns are found by name (5.10 has `delete_list` where later kernels have
/// `chainlength`).
pub fn parse(text: &str) -> Result<Counters, String> {
    let mut lines = text.lines();
    let header: Vec<&str> = lines.next().ok_or("empty")?.split_whitespace().collect();
    let column = |name: &str| {
        header.iter().position(|h| *h == name).ok_or_else(|| format!("no {name:?} column in {header:?}"))
    };
    let (entries, drop, insert_failed, early_drop) =
        (column("entries")?, column("drop")?, column("insert_failed")?, column("early_drop")?);
    let mut counters = Counters::default();
    let mut cpus = 0;
    for line in lines.filter(|l| !l.trim().is_empty()) {
        let values = line
            .split_whitespace()
            .map(|v| u64::from_str_radix(v, 16).map_err(|_| format!("{v:?} is not hex in {line:?}")))
            .collect::<Result<Vec<u64>, String>>()?;
        if values.len() != header.len() {
            return Err(format!("{} values under {} columns: {line:?}", values.len(), header.len()));
        }
        counters.entries = values[entries];
        counters.drop += values[drop];
        counters.insert_failed += values[insert_failed];
        counters.early_drop += values[early_drop];
        cpus += 1;
    }
    if cpus == 0 {
        return Err("no CPU lines".into());
    }
    Ok(counters)
}

#[derive(Debug, Clone)]
pub struct Settings {
    pub proc: PathBuf,
    pub interval: Duration,
}

impl Default for Settings {
    fn default() -> Self {
        Self { proc: PathBuf::from("/proc"), interval: DEFAULT_INTERVAL }
    }
}

/// What to read: the host's namespace through init (the agent runs with hostPID), each live pod
/// namespace through the process the index found in it.
fn witnesses(index: &Index) -> Vec<(u32, u32, Arc<Attribution>)> {
    let mut all: Vec<(u32, u32, Arc<Attribution>)> = index
        .netns_witness
        .iter()
        .filter_map(|(ino, pid)| Some((*ino, *pid, index.by_netns.get(ino)?.clone())))
        .collect();
    all.sort_by_key(|(ino, _, _)| *ino);
    all
}

/// One sample: the tables that could be read (a pod that just left is not an error), each with
/// when it last refused, from the sample before.
fn sample(settings: &Settings, index: &Index, sample: u64, before: &Tables) -> Tables {
    let at_unix_ns = kernel::unix_now_ns();
    let before = by_netns(before);
    let max = std::fs::read_to_string(settings.proc.join("sys/net/netfilter/nf_conntrack_max"))
        .ok()
        .and_then(|text| text.trim().parse().ok());
    let mut tables = Vec::new();
    if max.is_some() {
        for (netns, pid, who) in witnesses(index) {
            let path = settings.proc.join(format!("{pid}/net/stat/nf_conntrack"));
            let Ok(text) = std::fs::read_to_string(&path) else { continue };
            match parse(&text) {
                Ok(counters) => {
                    let earlier = before.get(&netns).map_or(counters, |t| t.counters);
                    tables.push(Table {
                        netns,
                        who,
                        counters,
                        refused: counters.refused_since(&earlier),
                        early_dropped: counters.early_drop.saturating_sub(earlier.early_drop),
                    })
                }
                Err(e) => tracing::warn!(path = %path.display(), error = %e, "unreadable conntrack counters"),
            }
        }
    }
    Tables { sample, at_unix_ns, max, tables }
}

/// Samples every `settings.interval` until `stop` (`sampler::every`).
pub async fn watch(
    settings: Settings,
    index: watch::Receiver<Arc<Index>>,
    tx: watch::Sender<Arc<Tables>>,
    stop: CancellationToken,
) {
    let interval = settings.interval;
    let sample = move |index: &Index, n, before: &Tables| sample(&settings, index, n, before);
    crate::sampler::every("conntrack", interval, index, tx, stop, sample).await;
}

/// The namespaces of the last sample by inode, for readers that look one up.
pub fn by_netns(tables: &Tables) -> HashMap<u32, &Table> {
    tables.tables.iter().map(|t| (t.netns, t)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const HOST_6_18: &str = "\
entries  clashres found new invalid ignore delete chainlength insert insert_failed drop early_drop icmp_error  expect_new expect_create expect_delete search_restart
00000008  00000000 00000003 00000000 00000001 00000000 00000000 00000000 00000000 00000001 0000000a 00000002 00000000  00000000 00000000 00000000 00000000
00000008  00000000 00000000 00000000 00000000 00000000 00000000 00000000 00000000 00000000 00000006 00000000 00000000  00000000 00000000 00000000 00000000
";

    #[test]
    fn counters_are_summed_over_cpus_and_found_by_name() {
        let c = parse(HOST_6_18).unwrap();
        assert_eq!(c, Counters { entries: 8, drop: 16, insert_failed: 1, early_drop: 2 });
        // 5.10 names a column differently; the ones read are where the header says.
        let old = "entries searched found new invalid ignore delete delete_list insert insert_failed drop early_drop icmp_error expect_new expect_create expect_delete search_restart\n\
                   00000002 0 0 0 0 0 0 0 0 00000000 00000005 0 0 0 0 0 0\n";
        assert_eq!(parse(old).unwrap(), Counters { entries: 2, drop: 5, insert_failed: 0, early_drop: 0 });
    }

    #[test]
    fn malformed_counters_are_one_error() {
        for (text, error) in [
            ("", "empty"),
            ("entries drop\n1 2\n", "no \"insert_failed\" column"),
            ("entries drop insert_failed early_drop\n", "no CPU lines"),
            ("entries drop insert_failed early_drop\n1 2 3\n", "3 values under 4 columns"),
            ("entries drop insert_failed early_drop\n1 2 3 zz\n", "\"zz\" is not hex"),
        ] {
            let e = parse(text).unwrap_err();
            assert!(e.contains(error), "{e} for {text:?}");
        }
    }

    #[test]
    fn a_clash_is_not_a_full_table() {
        let before = Counters { entries: 10, drop: 3, insert_failed: 2, early_drop: 0 };
        let clash = Counters { drop: 4, insert_failed: 3, ..before };
        assert_eq!(clash.refused_since(&before), 0);
        let full = Counters { drop: 9, insert_failed: 3, ..before };
        assert_eq!(full.refused_since(&before), 5);
        // Counters that went back (a namespace reused) refuse nothing.
        assert_eq!(before.refused_since(&full), 0);
    }

    #[test]
    fn the_hosts_own_table_reads() {
        let Ok(text) = std::fs::read_to_string("/proc/self/net/stat/nf_conntrack") else { return };
        parse(&text).unwrap();
    }
}
