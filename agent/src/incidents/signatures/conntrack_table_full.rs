//! `conntrack-table-full` (issue 39): a connection tracking table with no room, so the kernel
//! drops the packets of new connections ("nf_conntrack: table full, dropping packet"). Nothing
//! refuses them: each app's connect retransmits its SYN until it times out, on every pod whose
//! traffic the table tracks. The host's table (all forwarded and NATed pod traffic, Services)
//! makes it node-wide and critical; a pod's own (a mesh's or a policy's stateful rules in its
//! namespace) is that pod's, a warning.
//!
//! Read from the tables' counters (`conntrack.rs`): packets dropped for want of an entry (the
//! `drop` counter less the confirm clashes counted there too, `insert_failed`) while the table
//! was at least nine tenths full. Resolves `--quiet-window` after the last such drop. The packets
//! it dropped — sent in full by the packet-drop probe (`NETFILTER_DROP` where netfilter's hook
//! dropped it) — name the connections refused, and for the host's table the pods by their
//! addresses (a forwarded packet is in the host's namespace, no pod's).

use std::{
    collections::{HashMap, VecDeque},
    net::IpAddr,
    sync::Arc,
};

use serde::Serialize;

use super::{evidence, human_secs, pod_name};
use crate::{
    attribution::{Attributed, Attribution},
    conntrack::Tables,
    events::Payload,
    incidents::{Finding, NodeView, Remediation, Settings, Severity, Signature, Step, ns},
};

pub const NAME: &str = "conntrack-table-full";
/// The kernel's reason for a drop by netfilter, conntrack's included.
const NETFILTER_DROP: &str = "NETFILTER_DROP";
/// Netfilter's hook, where conntrack's verdicts drop (a rule of nf_tables drops in its chain).
const HOOK: &str = "nf_hook_slow";
/// Namespaces tracked at most (one per pod and the host's).
const MAX_TABLES: usize = 10_000;
/// Refused connections named per table.
const MAX_REFUSED: usize = 8;

/// A table this full (in tenths of `nf_conntrack_max`) when it dropped is full; below, the
/// drops were something else (an allocation failure, a tracker's verdict on 7.x).
const FULL_TENTHS: u64 = 9;

pub struct ConntrackTableFull {
    quiet: u64,
    /// The last sample read, and the limit then.
    sample: u64,
    max: Option<u64>,
    tables: HashMap<u32, Tracked>,
    evicted: u64,
}

struct Tracked {
    who: Arc<Attribution>,
    /// Drops since kstall first saw the table refuse, and when.
    refused_total: u64,
    first_refused_unix_ns: Option<u64>,
    last_refused_unix_ns: u64,
    /// Entries and the limit when it last refused.
    entries: u64,
    max: u64,
    /// Evictions since it first refused: `early_drop` made room for others.
    early_drops: u64,
    /// The newest refused packets (from the packet-drop probe), newest last.
    refused: VecDeque<Refused>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
struct Refused {
    /// The pod the packet came from or went to, when kstall knows it: the namespace's, or for
    /// the host's table the pod with its address.
    #[serde(skip_serializing_if = "String::is_empty")]
    pod: String,
    protocol: &'static str,
    src: IpAddr,
    dst: IpAddr,
    dst_port: Option<u16>,
    #[serde(skip)]
    at_unix_ns: u64,
}

impl ConntrackTableFull {
    pub fn new(settings: &Settings) -> Self {
        Self { quiet: ns(settings.quiet_window), sample: 0, max: None, tables: HashMap::new(), evicted: 0 }
    }

    /// The pods of the host table's refused packets, by their addresses: the source's (a pod's
    /// connect), else the destination's (a connect to a pod).
    fn name_pods(&mut self, node: &NodeView) {
        let host_tables = self.tables.values_mut().filter(|t| t.who.host);
        for r in host_tables.flat_map(|t| t.refused.iter_mut()).filter(|r| r.pod.is_empty()) {
            if let Some(who) = node.pod_ips.get(&r.src).or_else(|| node.pod_ips.get(&r.dst)) {
                r.pod = pod_name(who);
            }
        }
    }

    /// Reads a new sample: what each table refused since the last.
    fn read(&mut self, tables: &Tables) {
        if tables.sample == self.sample {
            return;
        }
        self.sample = tables.sample;
        // The lowest limit in force since the last sample: a table refused under it may have been
        // given room again before this one.
        let max = match (tables.max, std::mem::replace(&mut self.max, tables.max)) {
            (Some(now), before) => now.min(before.unwrap_or(now)),
            (None, _) => return,
        };
        for table in &tables.tables {
            let known = self.tables.contains_key(&table.netns);
            if !known && self.tables.len() >= MAX_TABLES {
                self.evicted += 1;
                continue;
            }
            let tracked = self.tables.entry(table.netns).or_insert_with(|| Tracked {
                who: table.who.clone(),
                refused_total: 0,
                first_refused_unix_ns: None,
                last_refused_unix_ns: 0,
                entries: 0,
                max,
                early_drops: 0,
                refused: VecDeque::new(),
            });
            let entries = table.counters.entries;
            if table.refused > 0 && entries * 10 >= max * FULL_TENTHS {
                tracked.first_refused_unix_ns.get_or_insert(tables.at_unix_ns);
                tracked.last_refused_unix_ns = tables.at_unix_ns;
                tracked.refused_total += table.refused;
                (tracked.entries, tracked.max) = (entries, max);
            }
            if tracked.first_refused_unix_ns.is_some() {
                tracked.early_drops += table.early_dropped;
            }
            tracked.who = table.who.clone();
        }
    }
}

impl Signature for ConntrackTableFull {
    fn name(&self) -> &'static str {
        NAME
    }

    fn observe(&mut self, attributed: &Attributed) {
        let Payload::PacketDrop(drop) = &attributed.event.payload else { return };
        if drop.reason != NETFILTER_DROP || !drop.location.starts_with(HOOK) {
            return;
        }
        let Some(table) = self.tables.get_mut(&attributed.event.header.netns) else { return };
        let (Some(src), Some(dst)) = (drop.src_addr, drop.dst_addr) else { return };
        let who = &attributed.who;
        let refused = Refused {
            pod: if who.host || who.pod.is_empty() { String::new() } else { pod_name(who) },
            protocol: drop.protocol,
            src,
            dst,
            dst_port: drop.dst_port,
            at_unix_ns: attributed.event.header.time_unix_ns,
        };
        let same = |r: &Refused| (r.src, r.dst, r.dst_port) == (refused.src, refused.dst, refused.dst_port);
        table.refused.retain(|r| !same(r));
        if table.refused.len() >= MAX_REFUSED {
            table.refused.pop_front();
        }
        table.refused.push_back(refused);
    }

    fn evaluate(&mut self, now: u64, node: &NodeView) -> Vec<Finding> {
        self.read(node.conntrack);
        self.name_pods(node);
        let quiet = self.quiet;
        let live: std::collections::HashSet<u32> = node.conntrack.tables.iter().map(|t| t.netns).collect();
        let firing = |t: &Tracked| {
            t.first_refused_unix_ns.is_some() && now.saturating_sub(t.last_refused_unix_ns) <= quiet
        };
        // A table that stopped refusing starts over; one no longer read is forgotten.
        for t in self.tables.values_mut().filter(|t| !firing(t)) {
            (t.first_refused_unix_ns, t.refused_total, t.early_drops) = (None, 0, 0);
            t.refused.clear();
        }
        self.tables.retain(|netns, t| live.contains(netns) || firing(t));
        let mut found: Vec<Finding> =
            self.tables.iter().filter(|(_, t)| firing(t)).map(|(netns, t)| finding(*netns, t)).collect();
        found.sort_by(|a, b| a.key.cmp(&b.key));
        found
    }

    fn evicted(&self) -> u64 {
        self.evicted
    }
}

#[derive(Serialize)]
struct Evidence<'a> {
    netns: u32,
    entries: u64,
    nf_conntrack_max: u64,
    /// Packets dropped for want of room since the table first refused.
    refused_packets: u64,
    /// Entries evicted to make room meanwhile.
    early_drops: u64,
    refused_pods: Vec<&'a str>,
    refused: Vec<&'a Refused>,
}

fn finding(netns: u32, t: &Tracked) -> Finding {
    let node_wide = t.who.host;
    let first = t.first_refused_unix_ns.unwrap_or(t.last_refused_unix_ns);
    // A pod's own table refuses the pod; the host's, whoever's packets it dropped (a pod's when
    // kstall can tell).
    let own = pod_name(&t.who);
    let mut refused_pods: Vec<&str> = if node_wide {
        t.refused.iter().map(|r| r.pod.as_str()).filter(|p| !p.is_empty()).collect()
    } else {
        vec![own.as_str()]
    };
    refused_pods.sort_unstable();
    refused_pods.dedup();
    let whose = if node_wide {
        "The node's connection tracking table".to_string()
    } else {
        format!("The connection tracking table of {own}'s network namespace")
    };
    let victims = if node_wide { "pods on this node" } else { "the pod" };
    let named = if refused_pods.is_empty() || !node_wide {
        String::new()
    } else {
        format!(" Refused: {}.", refused_pods.join(", "))
    };
    let connections: Vec<String> = t
        .refused
        .iter()
        .rev()
        .take(3)
        .map(|r| match r.dst_port {
            Some(port) => format!("{} {} → {}:{port}", r.protocol, r.src, r.dst),
            None => format!("{} {} → {}", r.protocol, r.src, r.dst),
        })
        .collect();
    let latest =
        if connections.is_empty() { String::new() } else { format!(" ({})", connections.join(", ")) };
    let summary = format!(
        "{whose} is full ({} entries, nf_conntrack_max {}): the kernel dropped {} packets of new connections \
         over {}{latest} — connects by {victims} time out instead of failing.{named}",
        t.entries,
        t.max,
        t.refused_total,
        human_secs(t.last_refused_unix_ns.saturating_sub(first) / 1_000_000_000),
    );
    let key = if node_wide { "node".to_string() } else { t.who.pod_uid.clone().unwrap_or(netns.to_string()) };
    let inside = if node_wide {
        String::new()
    } else {
        format!(
            " in the pod's namespace (kubectl debug -n {} {} --image=<an image with conntrack> --profile=netadmin)",
            t.who.namespace, t.who.pod
        )
    };
    Finding {
        key,
        severity: if node_wide { Severity::Critical } else { Severity::Warning },
        who: t.who.clone(),
        first_seen_unix_ns: first,
        last_seen_unix_ns: t.last_refused_unix_ns,
        summary,
        evidence: evidence(&Evidence {
            netns,
            entries: t.entries,
            nf_conntrack_max: t.max,
            refused_packets: t.refused_total,
            early_drops: t.early_drops,
            refused_pods,
            refused: t.refused.iter().collect(),
        }),
        remediation: Remediation {
            permanent: vec![
                "Size the table for the node's connections: kube-proxy sets nf_conntrack_max from \
                 --conntrack-max-per-core (conntrack.maxPerCore) at every start, so raise it there, not only \
                 with sysctl; an entry costs about 320 bytes."
                    .to_string(),
                "Find what fills it — a client that opens a connection per request, a UDP flood, a scan — and \
                 shorten the timeouts of what lingers (net.netfilter.nf_conntrack_tcp_timeout_time_wait, \
                 _close_wait, nf_conntrack_udp_timeout)."
                    .to_string(),
            ],
            break_glass: vec![
                Step::new(
                    format!("See what fills the table{inside}: the most frequent destinations first."),
                    Some(
                        "conntrack -L -o extended 2>/dev/null | awk '{print $3, $7, $8}' | sort | uniq -c | sort -rn | head -20"
                            .to_string(),
                    ),
                ),
                Step::new(
                    "Make room now (the limit is one for the node; memory grows with use, not with the limit).",
                    Some(format!("sysctl -w net.netfilter.nf_conntrack_max={}", t.max.saturating_mul(2).max(65536))),
                ),
            ],
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        conntrack::{Counters, Table},
        incidents::signatures::tests::{SEC, event, node, pod},
        probes::packet_drop::{Direction, PacketDrop},
        stuck::StuckSet,
    };

    const POD_NETNS: u32 = 4026533001;
    const HOST_NETNS: u32 = 4026531840;

    fn host() -> Arc<Attribution> {
        Arc::new(Attribution { host: true, host_network: true, ..Default::default() })
    }

    /// A sample of one table: its entries, and the packets it refused since the sample before.
    fn sample(
        sample: u64,
        at: u64,
        max: u64,
        netns: u32,
        who: &Arc<Attribution>,
        entries: u64,
        refused: u64,
    ) -> Tables {
        let counters = Counters { entries, ..Counters::default() };
        let table = Table { netns, who: who.clone(), counters, refused, early_dropped: 0 };
        Tables { sample, at_unix_ns: at, max: Some(max), tables: vec![table] }
    }

    fn evaluate(s: &mut ConntrackTableFull, now: u64, tables: &Tables) -> Vec<Finding> {
        let stuck = StuckSet::default();
        s.evaluate(now, &NodeView { conntrack: tables, ..node(&stuck) })
    }

    fn settings() -> Settings {
        Settings { quiet_window: std::time::Duration::from_secs(10), ..Settings::default() }
    }

    #[test]
    fn a_full_pod_table_fires_names_the_pod_and_resolves_when_quiet() {
        let mut s = ConntrackTableFull::new(&settings());
        let web = pod("u1", "web-1");
        assert!(evaluate(&mut s, SEC, &sample(1, SEC, 8, POD_NETNS, &web, 3, 0)).is_empty());
        let full = sample(2, 3 * SEC, 8, POD_NETNS, &web, 8, 4);
        let found = evaluate(&mut s, 3 * SEC, &full);
        assert_eq!(found.len(), 1, "{found:?}");
        let f = &found[0];
        assert_eq!((f.severity, f.key.as_str()), (Severity::Warning, "u1"));
        assert!(
            f.summary.contains("shop/web-1's network namespace is full (8 entries, nf_conntrack_max 8)"),
            "{}",
            f.summary
        );
        assert_eq!(f.evidence["refused_packets"], 4);
        assert_eq!(f.evidence["refused_pods"], serde_json::json!(["shop/web-1"]));
        // The same sample read again adds nothing.
        assert_eq!(evaluate(&mut s, 4 * SEC, &full)[0].evidence["refused_packets"], 4);
        let more = sample(3, 5 * SEC, 8, POD_NETNS, &web, 8, 2);
        assert_eq!(evaluate(&mut s, 5 * SEC, &more)[0].evidence["refused_packets"], 6);
        // No more drops: firing until the quiet window has passed.
        let calm = sample(4, 7 * SEC, 8, POD_NETNS, &web, 2, 0);
        assert_eq!(evaluate(&mut s, 14 * SEC, &calm).len(), 1);
        assert!(evaluate(&mut s, 16 * SEC, &calm).is_empty());
    }

    #[test]
    fn drops_of_a_roomy_table_are_not_a_full_table() {
        let mut s = ConntrackTableFull::new(&settings());
        let web = pod("u1", "web-1");
        // Dropped with room to spare: an allocation failure or a tracker's verdict.
        assert!(evaluate(&mut s, 2 * SEC, &sample(1, 2 * SEC, 100, POD_NETNS, &web, 50, 5)).is_empty());
        assert!(evaluate(&mut s, 3 * SEC, &sample(2, 3 * SEC, 100, POD_NETNS, &web, 89, 5)).is_empty());
        assert_eq!(evaluate(&mut s, 4 * SEC, &sample(3, 4 * SEC, 100, POD_NETNS, &web, 90, 5)).len(), 1);
    }

    #[test]
    fn a_table_refused_under_a_limit_raised_since_is_full() {
        let mut s = ConntrackTableFull::new(&settings());
        let web = pod("u1", "web-1");
        evaluate(&mut s, SEC, &sample(1, SEC, 4, POD_NETNS, &web, 4, 0));
        let found = evaluate(&mut s, 3 * SEC, &sample(2, 3 * SEC, 262144, POD_NETNS, &web, 4, 2));
        assert_eq!(found.len(), 1, "{found:?}");
        assert_eq!(found[0].evidence["nf_conntrack_max"], 4);
    }

    #[test]
    fn the_hosts_table_is_node_wide_and_names_what_it_refused() {
        let mut s = ConntrackTableFull::new(&settings());
        let host = host();
        evaluate(&mut s, SEC, &sample(1, SEC, 10, HOST_NETNS, &host, 10, 0));
        let drop = |dst_port: u16, location: &str| {
            let payload = Payload::PacketDrop(PacketDrop {
                reason: NETFILTER_DROP.into(),
                direction: Direction::Ingress,
                protocol: "tcp",
                src_addr: Some("10.244.1.7".parse().unwrap()),
                dst_addr: Some("10.96.0.10".parse().unwrap()),
                src_port: Some(40000),
                dst_port: Some(dst_port),
                location: location.into(),
            });
            let mut e = event(2 * SEC, 0, "swapper/1", payload, &host);
            e.event.header.netns = HOST_NETNS;
            e
        };
        s.observe(&drop(443, "nf_hook_slow+0x9c"));
        // A rule of nf_tables dropped this one, not conntrack.
        s.observe(&drop(80, "nft_do_chain+0x4c3"));
        // The source is a pod's address.
        let pod_ips = std::collections::HashMap::from([("10.244.1.7".parse().unwrap(), pod("u1", "web-1"))]);
        let stuck = StuckSet::default();
        let node = NodeView {
            conntrack: &sample(2, 3 * SEC, 10, HOST_NETNS, &host, 10, 7),
            pod_ips: &pod_ips,
            ..node(&stuck)
        };
        let found = s.evaluate(3 * SEC, &node);
        assert_eq!(found.len(), 1, "{found:?}");
        let f = &found[0];
        assert_eq!((f.severity, f.key.as_str()), (Severity::Critical, "node"));
        assert!(
            f.summary.starts_with("The node's connection tracking table is full (10 entries"),
            "{}",
            f.summary
        );
        assert!(f.summary.contains("(tcp 10.244.1.7 → 10.96.0.10:443)"), "{}", f.summary);
        assert_eq!(f.evidence["refused"].as_array().map(Vec::len), Some(1), "{}", f.evidence);
        assert_eq!(f.evidence["refused_pods"], serde_json::json!(["shop/web-1"]));
        assert!(f.summary.ends_with("Refused: shop/web-1."), "{}", f.summary);
    }
}
