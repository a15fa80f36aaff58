//! `network-policy-drops` (issue 39): a pod whose packets a firewall rule in its own network
//! namespace drops — a NetworkPolicy as the CNI writes it, a mesh's rule. The app sees timeouts,
//! never a refusal: a SYN dropped is retransmitted for two minutes, a DNS query for five seconds,
//! and nothing on the node says which pod lost what. The incident names the pod, what it lost
//! (direction, protocol, port: the kernel's exact counts) and the peers of the first drops of
//! each, so the policy that drops it can be found; it resolves `--quiet-window` after the last.
//!
//! What healthy traffic looks like to it: nothing in a pod's namespace is dropped with
//! `NETFILTER_DROP` unless a rule says so. A packet or two (one datagram, a probe) stays under
//! `--policy-drops-min` within `--policy-drops-window`. Drops in the host's namespace (forwarded
//! traffic, hostNetwork pods) are no single pod's and not this signature's; kernels before 5.17
//! give no drop reason and it stays silent there. Conntrack drops with the same reason when its
//! table is full: what the namespace's table refused in the window (its counters, read every 2 s)
//! is `conntrack-table-full`'s and not counted here, and drops are only weighed once the tables
//! were read after them.

use std::{
    collections::{BTreeMap, HashMap, VecDeque},
    net::IpAddr,
    sync::Arc,
};

use serde::Serialize;

use super::{evidence, human_secs, pod_name};
use crate::{
    attribution::{Attributed, Attribution},
    events::Payload,
    incidents::{Finding, NodeView, Remediation, Settings, Severity, Signature, Step, ns},
    probes::packet_drop::{Direction, DropCount, PacketDrop},
};

pub const NAME: &str = "network-policy-drops";
/// The kernel's reason for a firewall rule's (or conntrack's) drop.
const NETFILTER_DROP: &str = "NETFILTER_DROP";
/// Pods tracked at most.
const MAX_PODS: usize = 10_000;
/// What each pod keeps at most: kinds of traffic dropped, and peers named.
const MAX_FLOWS: usize = 32;
const MAX_PEERS: usize = 8;

pub struct NetworkPolicyDrops {
    min_drops: u64,
    window: u64,
    quiet: u64,
    pods: HashMap<String, DroppedPod>,
    evicted: u64,
    /// The last conntrack sample read, and what each namespace's table refused since the window.
    conntrack_sample: u64,
    conntrack_refused: HashMap<u32, VecDeque<(u64, u64)>>,
}

/// One pod's drops.
struct DroppedPod {
    who: Arc<Attribution>,
    /// Its network namespace, where its drops happen.
    netns: u32,
    first_unix_ns: u64,
    last_unix_ns: u64,
    /// The kernel's counts, one entry per interval: what the window adds up.
    recent: VecDeque<(u64, u64)>,
    /// Since the first drop, by kind of traffic.
    flows: BTreeMap<Flow, u64>,
    /// The first drops' other ends, newest last.
    peers: VecDeque<Peer>,
    /// Reached the threshold once: fires until a quiet window passes without drops.
    firing: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize)]
struct Flow {
    direction: &'static str,
    protocol: &'static str,
    /// The destination port, or its class; empty without ports.
    port: String,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
struct Peer {
    direction: &'static str,
    protocol: &'static str,
    addr: IpAddr,
    /// The destination port (the service).
    port: Option<u16>,
    location: String,
}

impl NetworkPolicyDrops {
    pub fn new(settings: &Settings) -> Self {
        Self {
            min_drops: u64::from(settings.policy_drops_min),
            window: ns(settings.policy_drops_window),
            quiet: ns(settings.quiet_window),
            pods: HashMap::new(),
            evicted: 0,
            conntrack_sample: 0,
            conntrack_refused: HashMap::new(),
        }
    }

    /// The pod's state, made at its first drop; `None` at the cap, or for drops that are no pod's.
    fn pod(&mut self, attributed: &Attributed) -> Option<&mut DroppedPod> {
        let who = &attributed.who;
        let uid = who.pod_uid.as_ref().filter(|_| !who.host)?;
        if !self.pods.contains_key(uid) && self.pods.len() >= MAX_PODS {
            self.evicted += 1;
            return None;
        }
        let t = attributed.event.header.time_unix_ns;
        let pod = self.pods.entry(uid.clone()).or_insert_with(|| DroppedPod {
            who: who.clone(),
            netns: attributed.event.header.netns,
            first_unix_ns: t,
            last_unix_ns: t,
            recent: VecDeque::new(),
            flows: BTreeMap::new(),
            peers: VecDeque::new(),
            firing: false,
        });
        pod.who = who.clone();
        pod.netns = attributed.event.header.netns;
        Some(pod)
    }
}

impl Signature for NetworkPolicyDrops {
    fn name(&self) -> &'static str {
        NAME
    }

    fn observe(&mut self, attributed: &Attributed) {
        let t = attributed.event.header.time_unix_ns;
        match &attributed.event.payload {
            Payload::PacketDropCount(count) if count.reason == NETFILTER_DROP => {
                let Some(pod) = self.pod(attributed) else { return };
                pod.count(t, count);
            }
            // The counts say how many (they come a second later); a drop sent in full says whom.
            Payload::PacketDrop(drop) if drop.reason == NETFILTER_DROP => {
                let Some(pod) = self.pod(attributed) else { return };
                pod.name_peer(drop);
            }
            _ => {}
        }
    }

    fn evaluate(&mut self, now: u64, node: &NodeView) -> Vec<Finding> {
        let (window, quiet) = (self.window, self.quiet);
        let tables = node.conntrack;
        if tables.sample != self.conntrack_sample {
            self.conntrack_sample = tables.sample;
            for t in tables.tables.iter().filter(|t| t.refused > 0) {
                self.conntrack_refused.entry(t.netns).or_default().push_back((tables.at_unix_ns, t.refused));
            }
        }
        self.conntrack_refused.retain(|_, refused| {
            refused.retain(|(t, _)| now.saturating_sub(*t) <= window);
            !refused.is_empty()
        });
        // Drops are weighed once the tables were read after them (where there are tables).
        let seen = if tables.max.is_some() { tables.at_unix_ns } else { u64::MAX };
        let conntrack_refused = &self.conntrack_refused;
        self.pods.retain(|_, p| now.saturating_sub(p.last_unix_ns) <= quiet.max(window));
        let mut firing: Vec<Finding> = self
            .pods
            .values_mut()
            .filter_map(|p| {
                while p.recent.front().is_some_and(|(t, _)| now.saturating_sub(*t) > window) {
                    p.recent.pop_front();
                }
                let in_window: u64 = p.recent.iter().map(|(_, n)| n).sum();
                let seen_in_window: u64 = p.recent.iter().filter(|(t, _)| *t <= seen).map(|(_, n)| n).sum();
                let table_refused: u64 =
                    conntrack_refused.get(&p.netns).map_or(0, |r| r.iter().map(|(_, n)| n).sum());
                let by_rules = seen_in_window.saturating_sub(table_refused);
                // Fires at the threshold, until a quiet window passes without a drop.
                p.firing =
                    (p.firing || by_rules >= self.min_drops) && now.saturating_sub(p.last_unix_ns) <= quiet;
                p.firing.then(|| finding(p, in_window, window))
            })
            .collect();
        firing.sort_by(|a, b| a.key.cmp(&b.key));
        firing
    }

    fn evicted(&self) -> u64 {
        self.evicted
    }
}

impl DroppedPod {
    fn count(&mut self, t: u64, count: &DropCount) {
        self.first_unix_ns = self.first_unix_ns.min(t);
        self.last_unix_ns = self.last_unix_ns.max(t);
        self.recent.push_back((t, count.drops));
        let flow = Flow {
            direction: count.direction.as_str(),
            protocol: count.protocol,
            port: count.port.map(|p| p.label()).unwrap_or_default(),
        };
        if self.flows.contains_key(&flow) || self.flows.len() < MAX_FLOWS {
            *self.flows.entry(flow).or_default() += count.drops;
        }
    }

    fn name_peer(&mut self, drop: &PacketDrop) {
        let Some(addr) = drop.peer() else { return };
        let peer = Peer {
            direction: drop.direction.as_str(),
            protocol: drop.protocol,
            addr,
            port: drop.dst_port,
            location: drop.location.clone(),
        };
        if self.peers.iter().any(|p| (p.direction, p.addr, p.port) == (peer.direction, peer.addr, peer.port))
        {
            return;
        }
        if self.peers.len() >= MAX_PEERS {
            self.peers.pop_front();
        }
        self.peers.push_back(peer);
    }
}

fn finding(p: &DroppedPod, in_window: u64, window: u64) -> Finding {
    let pod = pod_name(&p.who);
    let total: u64 = p.flows.values().sum();
    let mut flows: Vec<(&Flow, &u64)> = p.flows.iter().collect();
    flows.sort_by(|a, b| b.1.cmp(a.1).then(a.0.cmp(b.0)));
    let lost: Vec<String> = flows.iter().take(3).map(|(f, n)| describe(f, **n, &p.peers)).collect();
    let summary = format!(
        "A firewall rule in {pod}'s network namespace (a NetworkPolicy, a mesh's rule) drops its packets: {} in the \
         last {}, {total} over {} — {}. The app sees timeouts, not refusals.",
        in_window,
        human_secs(window / 1_000_000_000),
        human_secs(p.last_unix_ns.saturating_sub(p.first_unix_ns) / 1_000_000_000),
        lost.join("; ")
    );
    let (namespace, name) = (p.who.namespace.as_str(), p.who.pod.as_str());
    Finding {
        key: p.who.pod_uid.clone().unwrap_or_default(),
        severity: Severity::Warning,
        who: p.who.clone(),
        first_seen_unix_ns: p.first_unix_ns,
        last_seen_unix_ns: p.last_unix_ns,
        summary,
        evidence: evidence(&Evidence {
            drops_in_window: in_window,
            drops_total: total,
            dropped: flows.iter().map(|(f, n)| Dropped { flow: f, drops: **n }).collect(),
            peers: p.peers.iter().collect(),
        }),
        remediation: Remediation {
            permanent: vec![
                "If the traffic is wanted, allow it in the NetworkPolicy that selects the pod (or the peer's \
                 ingress policy, or the mesh's authorization policy); if not, stop the app from trying: each \
                 dropped connect waits out its timeout."
                    .to_string(),
            ],
            break_glass: vec![
                Step::new(
                    "List the policies that select the pod and what they allow.",
                    Some(format!(
                        "kubectl get networkpolicy -n {namespace} -o wide && kubectl describe pod -n {namespace} {name}"
                    )),
                ),
                Step::new(
                    "Watch what is dropped, with its peers and where the kernel dropped it.",
                    Some(format!(
                        "kstall trace -n {namespace} --pod {name} --probe packet-drop --duration 30s"
                    )),
                ),
            ],
        },
    }
}

/// `egress tcp to port 5432 (10.96.0.10): 12`.
fn describe(flow: &Flow, drops: u64, peers: &VecDeque<Peer>) -> String {
    let to = if flow.direction == Direction::Egress.as_str() { "to" } else { "from" };
    let port = if flow.port.is_empty() { String::new() } else { format!(" port {}", flow.port) };
    let peers: Vec<String> = peers
        .iter()
        .filter(|p| p.direction == flow.direction && p.protocol == flow.protocol)
        .filter(|p| {
            p.port.map(|n| n.to_string()).unwrap_or_default() == flow.port
                || flow.port.parse::<u16>().is_err()
        })
        .map(|p| p.addr.to_string())
        .collect();
    let peers = if peers.is_empty() { String::new() } else { format!(" ({} {})", to, peers.join(", ")) };
    format!("{} {}{port}{peers}: {drops}", flow.direction, flow.protocol)
}

#[derive(Serialize)]
struct Evidence<'a> {
    drops_in_window: u64,
    drops_total: u64,
    /// By direction, protocol and destination port, most first.
    dropped: Vec<Dropped<'a>>,
    /// The other ends of the first drops of each kind (sampled), with where the kernel dropped them.
    peers: Vec<&'a Peer>,
}

#[derive(Serialize)]
struct Dropped<'a> {
    #[serde(flatten)]
    flow: &'a Flow,
    drops: u64,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        incidents::signatures::tests::*,
        probes::{packet_drop::Direction, ports::CountedPort},
        stuck::StuckSet,
    };

    fn count(t: u64, drops: u64, reason: &str, port: u16, who: &Arc<Attribution>) -> Attributed {
        let c = DropCount {
            reason: reason.into(),
            direction: Direction::Egress,
            protocol: "tcp",
            port: Some(CountedPort::Number(port)),
            drops,
            suppressed: drops - 1,
        };
        event(t, 0, "", Payload::PacketDropCount(c), who)
    }

    fn sampled(t: u64, port: u16, who: &Arc<Attribution>) -> Attributed {
        let d = PacketDrop {
            reason: NETFILTER_DROP.into(),
            direction: Direction::Egress,
            protocol: "tcp",
            src_addr: Some("10.0.0.7".parse().unwrap()),
            src_port: Some(40001),
            dst_addr: Some("10.96.0.10".parse().unwrap()),
            dst_port: Some(port),
            location: "nft_do_chain+0x4a5".into(),
        };
        event(t, 0, "", Payload::PacketDrop(d), who)
    }

    #[test]
    fn a_pods_dropped_connects_name_the_port_and_peer_then_resolve_when_quiet() {
        let web = pod("u1", "web-1");
        let settings = Settings::default();
        let mut s = NetworkPolicyDrops::new(&settings);
        let stuck = StuckSet::default();
        // A connect's SYN and its retransmissions at 1, 3, 7 and 15 s: one blocked connect.
        s.observe(&sampled(SEC, 5432, &web));
        for t in [1, 2, 4, 8] {
            s.observe(&count(t * SEC, 1, NETFILTER_DROP, 5432, &web));
            if t < 8 {
                assert!(s.evaluate(t * SEC, &node(&stuck)).is_empty(), "4 drops are under the threshold");
            }
        }
        s.observe(&sampled(15 * SEC, 5432, &web));
        s.observe(&count(16 * SEC, 1, NETFILTER_DROP, 5432, &web));
        let f = s.evaluate(16 * SEC, &node(&stuck));
        assert_eq!(f.len(), 1);
        let f = &f[0];
        assert_eq!((f.key.as_str(), f.severity, f.who.pod.as_str()), ("u1", Severity::Warning, "web-1"));
        assert!(f.summary.contains("shop/web-1's network namespace"), "{}", f.summary);
        assert!(f.summary.contains("egress tcp port 5432 (to 10.96.0.10): 5"), "{}", f.summary);
        assert_eq!(f.evidence["dropped"][0]["port"], "5432");
        assert_eq!(f.evidence["peers"].as_array().unwrap().len(), 1, "a peer is named once");
        assert_eq!(f.evidence["peers"][0]["location"], "nft_do_chain+0x4a5");
        assert!(f.remediation.break_glass[1].command.as_deref().unwrap().contains("--probe packet-drop"));
        // Still firing while drops go on at a lower rate, then resolved a quiet window after them.
        s.observe(&count(70 * SEC, 1, NETFILTER_DROP, 5432, &web));
        assert_eq!(s.evaluate(71 * SEC, &node(&stuck)).len(), 1, "a lasting block stays one incident");
        let quiet = ns(settings.quiet_window);
        assert!(s.evaluate(70 * SEC + quiet + SEC, &node(&stuck)).is_empty());
    }

    #[test]
    fn drops_of_a_full_conntrack_table_are_not_a_policys() {
        use crate::conntrack::{Counters, Table, Tables};
        let web = pod("u1", "web-1");
        let stuck = StuckSet::default();
        let table = |sample: u64, at: u64, refused: u64| Tables {
            sample,
            at_unix_ns: at,
            max: Some(8),
            tables: vec![Table {
                netns: NETNS,
                who: web.clone(),
                counters: Counters::default(),
                refused,
                early_dropped: 0,
            }],
        };
        let evaluate = |s: &mut NetworkPolicyDrops, t: u64, tables: &Tables| {
            s.evaluate(t, &NodeView { conntrack: tables, ..node(&stuck) })
        };
        // Five drops at 5 s; the tables were last read before them: not weighed yet.
        let mut s = NetworkPolicyDrops::new(&Settings::default());
        s.observe(&count(5 * SEC, 5, NETFILTER_DROP, 5432, &web));
        assert!(evaluate(&mut s, 5 * SEC, &table(1, 4 * SEC, 0)).is_empty());
        // Read after: the pod's table refused four of them, one is a rule's.
        assert!(evaluate(&mut s, 6 * SEC, &table(2, 6 * SEC, 4)).is_empty());
        // Five more by rules: over the threshold.
        s.observe(&count(7 * SEC, 5, NETFILTER_DROP, 5432, &web));
        assert!(evaluate(&mut s, 7 * SEC, &table(2, 6 * SEC, 4)).is_empty());
        assert_eq!(evaluate(&mut s, 8 * SEC, &table(3, 8 * SEC, 0)).len(), 1);
        // No conntrack on the node: weighed at once.
        let mut s = NetworkPolicyDrops::new(&Settings::default());
        s.observe(&count(5 * SEC, 5, NETFILTER_DROP, 5432, &web));
        assert_eq!(s.evaluate(5 * SEC, &node(&stuck)).len(), 1);
    }

    #[test]
    fn a_quiet_window_shorter_than_the_count_window_resolves_and_does_not_fire_again() {
        let web = pod("u1", "web-1");
        let settings = Settings { quiet_window: std::time::Duration::from_secs(5), ..Settings::default() };
        let mut s = NetworkPolicyDrops::new(&settings);
        let stuck = StuckSet::default();
        s.observe(&count(SEC, 6, NETFILTER_DROP, 5432, &web));
        assert_eq!(s.evaluate(2 * SEC, &node(&stuck)).len(), 1);
        // The 6 drops are still in the 60 s window, but none came for 5 s.
        assert!(s.evaluate(7 * SEC, &node(&stuck)).is_empty());
        assert!(s.evaluate(20 * SEC, &node(&stuck)).is_empty());
    }

    #[test]
    fn other_reasons_the_host_and_a_stray_packet_fire_nothing() {
        let web = pod("u1", "web-1");
        let mut s = NetworkPolicyDrops::new(&Settings::default());
        let stuck = StuckSet::default();
        s.observe(&count(SEC, 50, "NO_SOCKET", 8080, &web));
        s.observe(&count(SEC, 50, "SOCKET_RCVBUFF", 8080, &web));
        let host = Arc::new(Attribution { host: true, ..Default::default() });
        s.observe(&count(SEC, 50, NETFILTER_DROP, 8080, &host));
        s.observe(&count(SEC, 50, NETFILTER_DROP, 8080, &Default::default()));
        s.observe(&count(2 * SEC, 2, NETFILTER_DROP, 53, &web));
        assert!(s.evaluate(3 * SEC, &node(&stuck)).is_empty());
    }
}
