//! `nfs-slow`: NFS answers, slowly. Nothing fails, nothing times out, no task is stuck long enough
//! for the hung-task detector — every RPC just takes seconds, and the apps crawl. Read from the
//! kernel's RPC latency histograms (the nfs probe's `nfs_latency` counts, one per caller, server
//! and procedure per second): a pod's (or the host's) RPCs to a server whose 99th percentile over
//! the last [`RECENT`] is above `--nfs-slow-threshold`, and stays so for `--nfs-slow-for`. One
//! incident per server, naming each slow pod with its p99 and the slowest operations.
//!
//! What healthy traffic looks like to it, and why none of it fires: RPCs of a millisecond or a
//! few; a slow one now and then (a large COMMIT, a server's disk flush) puts a few seconds in the
//! window, not [`MIN_RPCS`] slow ones at the 99th percentile for a minute; an idle pod has no RPC
//! to judge, and keeps its state until the quiet window has passed without one, so a lull neither
//! fires nor resolves. A server restart makes RPCs wait seconds (the grace period): for less than
//! the hold.

use std::{
    collections::{BTreeMap, VecDeque},
    net::IpAddr,
    sync::Arc,
};

use serde::Serialize;

use super::{evidence, pod_name};
use crate::{
    attribution::{Attributed, Attribution},
    events::Payload,
    incidents::{Finding, NodeView, Remediation, Settings, Severity, Signature, Step, keyed::Keyed, ns},
    probes::nfs::NfsLatency,
};

pub const NAME: &str = "nfs-slow";
/// The window the percentile is taken over: the last seconds, so that it follows the server.
const RECENT: u64 = 10_000_000_000;
/// RPCs in [`RECENT`] below which a client's percentile says nothing either way.
const MIN_RPCS: u64 = 3;
/// Operations named in the evidence, slowest first.
const SLOWEST: usize = 3;

pub struct NfsSlow {
    threshold_secs: f64,
    hold: u64,
    quiet: u64,
    /// Per server and caller (pod, or the host).
    clients: Keyed<(IpAddr, String), Client>,
}

#[derive(Default)]
struct Client {
    who: Arc<Attribution>,
    /// Its intervals in [`RECENT`], oldest first.
    recent: VecDeque<Interval>,
    last_rpc: u64,
    slow_since: Option<u64>,
    /// Its latency when last judged slow: what the incident says through a lull.
    judged: Option<Judged>,
}

struct Judged {
    p99_seconds: f64,
    rpcs: u64,
    mean_seconds: f64,
    operations: Vec<OperationLatency>,
}

struct Interval {
    t: u64,
    operation: String,
    latency: NfsLatency,
}

impl NfsSlow {
    pub fn new(settings: &Settings) -> Self {
        Self {
            threshold_secs: settings.nfs_slow_threshold.as_secs_f64(),
            hold: ns(settings.nfs_slow_for),
            quiet: ns(settings.quiet_window),
            clients: Keyed::new(super::super::keyed::DEFAULT_CAP),
        }
    }
}

impl Signature for NfsSlow {
    fn name(&self) -> &'static str {
        NAME
    }

    fn observe(&mut self, attributed: &Attributed) {
        let Payload::NfsLatency(latency) = &attributed.event.payload else { return };
        let Some(server) = latency.server_addr else { return };
        let t = attributed.event.header.time_unix_ns;
        let client = self.clients.touch(&(server, pod_name(&attributed.who)), t, Client::default);
        client.who = attributed.who.clone();
        client.last_rpc = client.last_rpc.max(t);
        client.recent.push_back(Interval {
            t,
            operation: latency.operation.clone(),
            latency: latency.clone(),
        });
    }

    fn evaluate(&mut self, now: u64, _node: &NodeView) -> Vec<Finding> {
        let (threshold, hold, quiet) = (self.threshold_secs, self.hold, self.quiet);
        self.clients.retain(|_, c| {
            if now.saturating_sub(c.last_rpc) >= quiet {
                return false;
            }
            while c.recent.front().is_some_and(|i| now.saturating_sub(i.t) >= RECENT) {
                c.recent.pop_front();
            }
            let all = NfsLatency::sum_of(c.recent.iter().map(|i| &i.latency));
            if all.rpcs >= MIN_RPCS {
                let p99_seconds = all.quantile(0.99).unwrap_or(0.0);
                if p99_seconds > threshold {
                    c.slow_since = c.slow_since.or(c.recent.front().map(|i| i.t));
                    c.judged = Some(Judged {
                        p99_seconds,
                        rpcs: all.rpcs,
                        mean_seconds: all.seconds_sum / all.rpcs as f64,
                        operations: slowest_operations(&c.recent),
                    });
                } else {
                    (c.slow_since, c.judged) = (None, None);
                }
            }
            true
        });
        let mut slow: BTreeMap<IpAddr, Vec<SlowPod>> = BTreeMap::new();
        for ((server, pod), c) in self.clients.iter() {
            let held = c.slow_since.filter(|since| now.saturating_sub(*since) >= hold);
            if let (Some(since), Some(judged)) = (held, &c.judged) {
                slow.entry(*server).or_default().push(SlowPod {
                    pod: pod.clone(),
                    who: c.who.clone(),
                    since,
                    last: c.last_rpc,
                    judged,
                });
            }
        }
        slow.into_iter().map(|(server, pods)| finding(server, threshold, pods)).collect()
    }

    fn evicted(&self) -> u64 {
        self.clients.evicted()
    }
}

/// Each operation's p99 in the window, slowest first.
fn slowest_operations(recent: &VecDeque<Interval>) -> Vec<OperationLatency> {
    let mut by_operation: BTreeMap<&str, Vec<&NfsLatency>> = BTreeMap::new();
    for i in recent {
        by_operation.entry(&i.operation).or_default().push(&i.latency);
    }
    let mut operations: Vec<OperationLatency> = by_operation
        .into_iter()
        .map(|(operation, latencies)| {
            let all = NfsLatency::sum_of(latencies);
            OperationLatency {
                operation: operation.to_string(),
                p99_seconds: all.quantile(0.99).unwrap_or(0.0),
                rpcs: all.rpcs,
            }
        })
        .collect();
    operations.sort_by(|a, b| b.p99_seconds.total_cmp(&a.p99_seconds));
    operations.truncate(SLOWEST);
    operations
}

struct SlowPod<'a> {
    pod: String,
    who: Arc<Attribution>,
    since: u64,
    last: u64,
    judged: &'a Judged,
}

#[derive(Serialize)]
struct OperationLatency {
    operation: String,
    p99_seconds: f64,
    rpcs: u64,
}

#[derive(Serialize)]
struct PodLatency<'a> {
    pod: &'a str,
    p99_seconds: f64,
    mean_seconds: f64,
    rpcs: u64,
    slowest_operations: &'a [OperationLatency],
}

#[derive(Serialize)]
struct Evidence<'a> {
    server: IpAddr,
    threshold_seconds: f64,
    window_seconds: u64,
    pods: Vec<PodLatency<'a>>,
}

fn finding(server: IpAddr, threshold: f64, pods: Vec<SlowPod<'_>>) -> Finding {
    let worded: Vec<String> = pods
        .iter()
        .map(|p| {
            let operations: Vec<String> = p
                .judged
                .operations
                .iter()
                .map(|o| format!("{} {:.2} s", o.operation, o.p99_seconds))
                .collect();
            format!("{} (p99 {:.2} s; {})", p.pod, p.judged.p99_seconds, operations.join(", "))
        })
        .collect();
    let who = match pods.as_slice() {
        [one] => one.who.clone(),
        _ => Default::default(),
    };
    Finding {
        key: server.to_string(),
        severity: Severity::Warning,
        who,
        first_seen_unix_ns: pods.iter().map(|p| p.since).min().unwrap_or_default(),
        last_seen_unix_ns: pods.iter().map(|p| p.last).max().unwrap_or_default(),
        summary: format!(
            "NFS server {server} answers this node slowly: 99% of the RPCs of the last {} s took up to {} — \
             over {threshold:.2} s — for {}. Nothing fails or times out: the apps wait. Compare the RPC \
             latency of other nodes mounting {server}: slow everywhere is the server (its disks, its \
             load); slow only here is this node's path to it.",
            RECENT / 1_000_000_000,
            pods.iter().map(|p| format!("{:.2} s", p.judged.p99_seconds)).collect::<Vec<_>>().join(" / "),
            worded.join(", "),
        ),
        evidence: evidence(&Evidence {
            server,
            threshold_seconds: threshold,
            window_seconds: RECENT / 1_000_000_000,
            pods: pods
                .iter()
                .map(|p| PodLatency {
                    pod: &p.pod,
                    p99_seconds: p.judged.p99_seconds,
                    mean_seconds: p.judged.mean_seconds,
                    rpcs: p.judged.rpcs,
                    slowest_operations: &p.judged.operations,
                })
                .collect(),
        }),
        remediation: Remediation {
            permanent: vec![
                "Find where the time goes: the server (nfsstat -s, the export's disk latency, its nfsd \
                 threads), or the path (latency and loss between this node and the server)."
                    .into(),
                "If only some operations are slow (WRITE/COMMIT), look at the server's storage; if every \
                 operation is, at the network or the server's CPU."
                    .into(),
            ],
            break_glass: vec![
                Step::new(
                    "See this node's per-operation counts and times for the server's mounts (from memory: \
                     no RPC).",
                    Some(format!(
                        "grep -A60 'device {server}:' /proc/self/mountstats | grep -E 'READ:|WRITE:|COMMIT:|GETATTR:|LOOKUP:'"
                    )),
                ),
                Step::new("Measure the round trip to the server.", Some(format!("ping -c 5 {server}"))),
            ],
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        events::{Event, Header},
        incidents::signatures::tests::*,
        stuck::StuckSet,
    };

    /// One second's `rpcs` RPCs of `operation` by `who`, each taking `seconds`.
    fn rpcs(t: u64, operation: &str, n: u64, seconds: f64, who: &Arc<Attribution>) -> Attributed {
        let mut buckets = vec![0; kstall_common::nfs::LATENCY_BUCKETS];
        let bucket = crate::probes::nfs::LATENCY_BOUNDS_SECONDS
            .iter()
            .position(|b| seconds <= *b)
            .unwrap_or(buckets.len() - 1);
        buckets[bucket] = n;
        let latency = NfsLatency {
            server_addr: Some(SERVER.parse().unwrap()),
            operation: operation.into(),
            device: None,
            rpcs: n,
            seconds_sum: seconds * n as f64,
            buckets,
        };
        let header = Header {
            probe: "nfs",
            time_unix_ns: t,
            tgid: 0,
            pid: 0,
            comm: String::new(),
            cgroup_id: 9,
            netns: 0,
        };
        Attributed { event: Event { header, payload: Payload::NfsLatency(latency) }, who: who.clone() }
    }

    fn slow_settings() -> Settings {
        Settings {
            nfs_slow_threshold: std::time::Duration::from_millis(500),
            nfs_slow_for: std::time::Duration::from_secs(30),
            ..Settings::default()
        }
    }

    #[test]
    fn a_pods_slow_rpcs_fire_after_the_hold_and_resolve_when_fast_again() {
        let (catalog, checkout) = (pod("u1", "catalog-0"), pod("u2", "checkout-0"));
        let mut s = NfsSlow::new(&slow_settings());
        let stuck = StuckSet::default();
        for second in 10..=45 {
            s.observe(&rpcs(second * SEC, "WRITE", 2, 0.8, &catalog));
            s.observe(&rpcs(second * SEC, "GETATTR", 1, 0.81, &catalog));
            s.observe(&rpcs(second * SEC, "WRITE", 5, 0.002, &checkout));
            let f = s.evaluate(second * SEC + 1, &node(&stuck));
            assert_eq!(f.is_empty(), second < 40, "slow since 10 s, held 30 s: {second}: {f:?}");
        }
        let f = s.evaluate(45 * SEC + 1, &node(&stuck));
        assert_eq!((f.len(), f[0].key.as_str(), f[0].who.pod.as_str()), (1, SERVER, "catalog-0"));
        assert_eq!(f[0].first_seen_unix_ns, 10 * SEC);
        let pods = f[0].evidence["pods"].as_array().unwrap();
        assert_eq!(pods.len(), 1, "the fast pod is not named: {}", f[0].evidence);
        assert_eq!(pods[0]["pod"], "shop/catalog-0");
        let p99 = pods[0]["p99_seconds"].as_f64().unwrap();
        assert!((0.99..1.0).contains(&p99), "interpolated in the 0.5-1 s bucket: {p99}");
        let operations: Vec<&str> = pods[0]["slowest_operations"]
            .as_array()
            .unwrap()
            .iter()
            .map(|o| o["operation"].as_str().unwrap())
            .collect();
        assert_eq!(operations.len(), 2);
        assert!(f[0].summary.contains("catalog-0") && f[0].summary.contains("WRITE"), "{}", f[0].summary);
        // Fast again: once the slow seconds have left the window, it resolves.
        for second in 46..=60 {
            s.observe(&rpcs(second * SEC, "WRITE", 2, 0.003, &catalog));
        }
        assert!(s.evaluate(60 * SEC + 1, &node(&stuck)).is_empty());
    }

    #[test]
    fn a_slow_rpc_now_and_then_and_a_restarts_wait_fire_nothing() {
        let web = pod("u1", "web-1");
        let mut s = NfsSlow::new(&slow_settings());
        let stuck = StuckSet::default();
        for second in 0..300 {
            s.observe(&rpcs(second * SEC, "READ", 50, 0.001, &web));
            if second % 20 == 0 {
                s.observe(&rpcs(second * SEC, "COMMIT", 1, 4.0, &web));
            }
            // A restart: 12 s in which the few RPCs that complete waited out the grace period.
            if (100..112).contains(&second) {
                s.observe(&rpcs(second * SEC, "WRITE", 3, 9.0, &web));
            }
            assert!(s.evaluate(second * SEC + 1, &node(&stuck)).is_empty(), "{second}");
        }
    }

    #[test]
    fn an_idle_pod_neither_fires_nor_resolves_on_no_rpcs() {
        let web = pod("u1", "web-1");
        let mut s = NfsSlow::new(&slow_settings());
        let stuck = StuckSet::default();
        // Slow RPCs every 4 s: each window holds enough of them.
        for second in (0..=60).step_by(4) {
            s.observe(&rpcs(second * SEC, "READ", 2, 2.0, &web));
            for idle in second..second + 4 {
                let f = s.evaluate(idle * SEC + 1, &node(&stuck));
                assert_eq!(f.is_empty(), idle < 30, "{idle}: {f:?}");
            }
        }
        assert_eq!(s.evaluate(110 * SEC, &node(&stuck)).len(), 1, "a lull: still firing, as last judged");
        assert!(s.evaluate(121 * SEC, &node(&stuck)).is_empty(), "nothing for the quiet window: forgotten");
    }
}
