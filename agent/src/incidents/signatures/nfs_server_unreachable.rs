//! `nfs-server-unreachable`: this node's NFS client cannot reach a server — major RPC timeouts
//! (the kernel's `nfs: server ... not responding`) or failed connects — with no redirect involved
//! (namespaces whose NFS connections are redirected belong to `nfs-sidecar-redirect`). Evidence per
//! pod, so the comparison across nodes that broke incident 1's wrong hypothesis starts here.
//!
//! Kept per client: a network namespace has one NFS client of a server (the node's mounts share
//! the host's, a pod that mounts for itself has its own). A client fails from its first error
//! until the server answers it again (a reply on its transport after the failure) or its errors
//! stop for the quiet window; it is unreachable with a major timeout, or with failed connects
//! that go on for [`PERSISTS`]. The incident resolves when no client is.
//!
//! What healthy traffic looks like to it, and why none of it fires: a server restart (a failover,
//! an upgrade; in its grace period) closes every client's connection, and a client that reconnects
//! while nfsd is down is refused — each RPC waiting on the connection tries, so a burst of refusals
//! in a few milliseconds, again 3 s later (seen in the VM matrix: eight in 3 s from the node's
//! client), then it gets through and its next reply clears it. Refusals for seconds are a restart;
//! for [`PERSISTS`] they are a server that is down. Each client counts its own, so ten pods'
//! clients refused at once are not one client refused for long. Retransmits after a reconnect are
//! not errors.

use std::{
    collections::{BTreeMap, HashSet},
    net::IpAddr,
    sync::Arc,
};

use serde::Serialize;

use super::{evidence, nfs_sidecar_redirect::redirected_nfs_port, pod_name};
use crate::{
    attribution::{Attributed, Attribution},
    events::Payload,
    incidents::{Finding, NodeView, Remediation, Settings, Severity, Signature, Step, keyed::Keyed, ns},
    probes::nfs::What,
};

pub const NAME: &str = "nfs-server-unreachable";
/// How long one client's failed connects, with no answer between them, must go on to make the
/// server unreachable without a major timeout: longer than a restart refuses (nfsd down for a few
/// seconds, the client's next tries 3 s and 6 s apart); an outage names itself within it.
const PERSISTS: u64 = 20_000_000_000;
/// Clients kept per server: one per network namespace that mounts it.
const MAX_CLIENTS: usize = 4096;

pub struct NfsServerUnreachable {
    nfs_ports: Vec<u16>,
    window: u64,
    quiet: u64,
    by_server: Keyed<IpAddr, Server>,
    /// Namespaces whose NFS connections were seen redirected: another signature's.
    redirected: HashSet<u32>,
}

#[derive(Default)]
struct Server {
    /// The clients failing now, by network namespace.
    failing: BTreeMap<u32, Failing>,
    /// When each client was last answered: an error from before it is old news, even if it
    /// reaches the agent after (a program preempted between taking its time and sending its
    /// event, where the kernel runs programs preemptibly, as 7.3 does).
    answered: BTreeMap<u32, u64>,
    last_error: u64,
    firing_since: Option<u64>,
}

/// One client's errors since the server last answered it.
#[derive(Default)]
struct Failing {
    timeouts: u64,
    connect_errors: u64,
    first_error: u64,
    last_error: u64,
    who: Arc<Attribution>,
}

impl Failing {
    fn unreachable(&self) -> bool {
        self.timeouts >= 1 || (self.connect_errors >= 2 && self.last_error - self.first_error >= PERSISTS)
    }
}

impl NfsServerUnreachable {
    pub fn new(settings: &Settings) -> Self {
        Self {
            nfs_ports: settings.nfs_ports.clone(),
            window: ns(settings.redirect_window),
            quiet: ns(settings.quiet_window),
            by_server: Keyed::new(super::super::keyed::DEFAULT_CAP),
            redirected: HashSet::new(),
        }
    }
}

impl Signature for NfsServerUnreachable {
    fn name(&self) -> &'static str {
        NAME
    }

    fn observe(&mut self, attributed: &Attributed) {
        let event = &attributed.event;
        let (t, netns) = (event.header.time_unix_ns, event.header.netns);
        match &event.payload {
            Payload::TcpReset(r)
                if redirected_nfs_port(r, &self.nfs_ports).is_some()
                    && self.redirected.len() < super::super::keyed::DEFAULT_CAP =>
            {
                self.redirected.insert(netns);
            }
            Payload::TcpResetCount(c)
                if c.redirected_port().is_some_and(|p| self.nfs_ports.contains(&p))
                    && self.redirected.len() < super::super::keyed::DEFAULT_CAP =>
            {
                self.redirected.insert(netns);
            }
            Payload::Nfs(nfs) if !self.redirected.contains(&netns) => {
                let Some(addr) = nfs.server_addr else { return };
                let timeout = match nfs.what {
                    What::Timeout => true,
                    What::SocketError => false,
                    What::SocketConnect if nfs.connect_failed() => false,
                    What::ServerResponding => {
                        if let Some(s) = self.by_server.get_mut(&addr) {
                            s.failing.remove(&netns);
                            if s.answered.len() < MAX_CLIENTS || s.answered.contains_key(&netns) {
                                let answered = s.answered.entry(netns).or_default();
                                *answered = (*answered).max(t);
                            }
                        }
                        return;
                    }
                    _ => return,
                };
                let s = self.by_server.touch(&addr, t, Server::default);
                if s.answered.get(&netns).is_some_and(|answered| t < *answered) {
                    return;
                }
                if s.failing.len() >= MAX_CLIENTS && !s.failing.contains_key(&netns) {
                    return;
                }
                let client = s
                    .failing
                    .entry(netns)
                    .or_insert_with(|| Failing { first_error: t, ..Default::default() });
                if timeout {
                    client.timeouts += 1;
                } else {
                    client.connect_errors += 1;
                }
                client.last_error = client.last_error.max(t);
                client.who = attributed.who.clone();
                s.last_error = s.last_error.max(t);
            }
            _ => {}
        }
    }

    fn evaluate(&mut self, now: u64, _node: &NodeView) -> Vec<Finding> {
        let (window, quiet) = (self.window, self.quiet);
        let mut findings = Vec::new();
        self.by_server.retain(|addr, s| {
            s.failing.retain(|_, c| now.saturating_sub(c.last_error) < quiet);
            s.answered.retain(|_, answered| now.saturating_sub(*answered) < quiet);
            let since = s.failing.values().filter(|c| c.unreachable()).map(|c| c.first_error).min();
            s.firing_since = match (s.firing_since, since) {
                (_, None) => None,
                (None, since) => since,
                (firing, Some(_)) => firing,
            };
            if s.firing_since.is_some() {
                findings.push(s.finding(*addr));
            }
            s.firing_since.is_some() || !s.failing.is_empty() || now.saturating_sub(s.last_error) < window
        });
        findings
    }

    fn evicted(&self) -> u64 {
        self.by_server.evicted()
    }
}

impl Server {
    fn finding(&self, addr: IpAddr) -> Finding {
        let mut by_pod: BTreeMap<String, u64> = BTreeMap::new();
        for c in self.failing.values() {
            *by_pod.entry(pod_name(&c.who)).or_default() += c.timeouts + c.connect_errors;
        }
        let timeouts = self.failing.values().map(|c| c.timeouts).sum();
        let connect_errors = self.failing.values().map(|c| c.connect_errors).sum();
        let pods: Vec<String> = by_pod.keys().cloned().collect();
        let who = match self.failing.values().collect::<Vec<_>>().as_slice() {
            [one] => one.who.clone(),
            _ => Default::default(),
        };
        Finding {
            key: addr.to_string(),
            severity: Severity::Warning,
            who,
            first_seen_unix_ns: self.firing_since.unwrap_or(self.last_error),
            last_seen_unix_ns: self.last_error,
            summary: format!(
                "NFS server {addr} does not answer this node: {timeouts} major RPC timeouts, {connect_errors} \
                 failed connects, from {}. No redirect is involved: compare with other nodes mounting {addr} \
                 — if they are fine, look at this node's network path; if not, at the server.",
                pods.join(", ")
            ),
            evidence: evidence(&Evidence {
                server: addr,
                nfs_timeouts: timeouts,
                nfs_connect_errors: connect_errors,
                errors_by_pod: &by_pod,
            }),
            remediation: Remediation {
                permanent: vec![
                    "Find why the server or the path to it stopped answering (server health, security \
                     groups / firewalls on port 2049, routes from this node)."
                        .into(),
                    "Hard mounts wait forever by design; keep it so for data safety, but alert on this \
                     incident rather than on pods stuck Terminating."
                        .into(),
                ],
                break_glass: vec![
                    Step::new("Test the path from this node.", Some(format!("nc -vz -w 3 {addr} 2049"))),
                    Step::new(
                        "See the client's view of the mount and its transport.",
                        Some("grep -A5 xprt: /proc/self/mountstats | head -40".into()),
                    ),
                ],
            },
        }
    }
}

#[derive(Serialize)]
struct Evidence<'a> {
    server: IpAddr,
    nfs_timeouts: u64,
    nfs_connect_errors: u64,
    /// Errors per pod (or "host network").
    errors_by_pod: &'a BTreeMap<String, u64>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{incidents::signatures::tests::*, stuck::StuckSet};

    #[test]
    fn timeouts_fire_per_server_and_a_reply_resolves() {
        let web = pod("u1", "web-1");
        let mut s = NfsServerUnreachable::new(&Settings::default());
        let stuck = StuckSet::default();
        s.observe(&nfs(10 * SEC, What::Retransmit, &web));
        assert!(s.evaluate(11 * SEC, &node(&stuck)).is_empty(), "a retransmit is not an outage");
        s.observe(&nfs(12 * SEC, What::Timeout, &web));
        let f = s.evaluate(13 * SEC, &node(&stuck));
        assert_eq!((f.len(), f[0].key.as_str()), (1, SERVER));
        assert_eq!(f[0].evidence["errors_by_pod"]["shop/web-1"], 1);
        s.observe(&nfs(20 * SEC, What::ServerResponding, &web));
        assert!(s.evaluate(21 * SEC, &node(&stuck)).is_empty());
    }

    /// 7.3 runs programs preemptibly: a timeout's event can reach the agent after the reply that
    /// followed it. It is older than the answer: the client stays answered.
    #[test]
    fn an_error_older_than_the_answer_that_arrives_after_it_is_old_news() {
        let web = pod("u1", "web-1");
        let mut s = NfsServerUnreachable::new(&Settings::default());
        let stuck = StuckSet::default();
        s.observe(&nfs(10 * SEC, What::Timeout, &web));
        assert_eq!(s.evaluate(11 * SEC, &node(&stuck)).len(), 1);
        s.observe(&nfs(20 * SEC, What::ServerResponding, &web));
        s.observe(&nfs(19 * SEC, What::Timeout, &web));
        assert!(s.evaluate(21 * SEC, &node(&stuck)).is_empty(), "answered at 20 s");
        s.observe(&nfs(30 * SEC, What::Timeout, &web));
        assert_eq!(s.evaluate(31 * SEC, &node(&stuck)).len(), 1, "a new timeout after the answer");
    }

    #[test]
    fn redirected_namespaces_are_not_this_signature() {
        let web = pod("u1", "web-1");
        let mut s = NfsServerUnreachable::new(&Settings::default());
        let stuck = StuckSet::default();
        s.observe(&redirected_reset(SEC, 2049, &web));
        s.observe(&nfs(2 * SEC, What::Timeout, &web));
        assert!(s.evaluate(3 * SEC, &node(&stuck)).is_empty());
    }

    /// An NFS event of `what` from the client in network namespace `netns`, `error` its errno.
    fn client(t: u64, netns: u32, what: What, error: Option<i32>, who: &Arc<Attribution>) -> Attributed {
        let mut e = nfs(t, what, who);
        e.event.header.netns = netns;
        if let Payload::Nfs(n) = &mut e.event.payload {
            n.error = error;
        }
        e
    }

    /// Healthy: the server restarts, down for 3 s. Each of three pods' clients has its connection
    /// reset and is refused once, then gets through: six errors on the node, none of them a
    /// client that cannot reach the server.
    #[test]
    fn a_server_restart_refusing_every_client_for_seconds_fires_nothing() {
        let mut s = NfsServerUnreachable::new(&Settings::default());
        let stuck = StuckSet::default();
        let pods = [(11, pod("u1", "ledger-0")), (12, pod("u2", "reports-0")), (13, pod("u3", "archive-0"))];
        let refused = |t, netns, who| client(t, netns, What::SocketError, Some(-libc::ECONNREFUSED), who);
        for (netns, who) in &pods {
            s.observe(&client(10 * SEC, *netns, What::SocketError, Some(-libc::ECONNRESET), who));
            // Each waiting RPC tries: a burst, and another 3 s later.
            for t in [10_068, 10_069, 10_070, 13_180, 13_181] {
                s.observe(&refused(t * MS, *netns, who));
            }
        }
        assert!(s.evaluate(14 * SEC, &node(&stuck)).is_empty(), "refused for 3 s");
        for (netns, who) in &pods {
            s.observe(&client(15_743 * MS, *netns, What::SocketConnect, Some(-libc::EINPROGRESS), who));
            s.observe(&client(15_757 * MS, *netns, What::ServerResponding, None, who));
        }
        assert!(s.evaluate(16 * SEC, &node(&stuck)).is_empty());
        // The next restart starts from nothing: what the first one counted is gone.
        let (netns, who) = &pods[0];
        s.observe(&refused(40 * SEC, *netns, who));
        s.observe(&refused(43 * SEC, *netns, who));
        assert!(s.evaluate(44 * SEC, &node(&stuck)).is_empty());
        // A client refused in a restart, with nothing more to send, is not refused on and on.
        assert!(s.evaluate(90 * SEC, &node(&stuck)).is_empty());
    }

    #[test]
    fn a_client_refused_on_and_on_is_unreachable_until_the_server_answers_it() {
        let mut s = NfsServerUnreachable::new(&Settings::default());
        let stuck = StuckSet::default();
        let (ledger, reports) = (pod("u1", "ledger-0"), pod("u2", "reports-0"));
        let refused = |t, netns, who| client(t, netns, What::SocketError, Some(-libc::ECONNREFUSED), who);
        // The kernel's back-off: 3 s, 6 s, then 12 s.
        for t in [10, 13, 19] {
            s.observe(&refused(t * SEC, 11, &ledger));
        }
        s.observe(&refused(13 * SEC, 12, &reports));
        assert!(s.evaluate(20 * SEC, &node(&stuck)).is_empty(), "refused for 9 s: a restart, so far");
        s.observe(&refused(31 * SEC, 11, &ledger));
        let f = s.evaluate(32 * SEC, &node(&stuck));
        assert_eq!(f.len(), 1, "{f:?}");
        assert_eq!(f[0].first_seen_unix_ns, 10 * SEC, "since the client's first refusal");
        assert_eq!(f[0].evidence["nfs_connect_errors"], 5, "{}", f[0].evidence);
        let by_pod = serde_json::json!({"shop/ledger-0": 4, "shop/reports-0": 1});
        assert_eq!(f[0].evidence["errors_by_pod"], by_pod);
        // The other client getting through says nothing of this one.
        s.observe(&client(33 * SEC, 12, What::ServerResponding, None, &reports));
        let f = s.evaluate(34 * SEC, &node(&stuck));
        assert_eq!((f.len(), f[0].who.pod.as_str()), (1, "ledger-0"));
        s.observe(&client(55 * SEC, 11, What::ServerResponding, None, &ledger));
        assert!(s.evaluate(56 * SEC, &node(&stuck)).is_empty(), "answered");
    }

    #[test]
    fn connect_errors_must_persist_and_quiet_resolves() {
        let web = pod("u1", "web-1");
        let mut s = NfsServerUnreachable::new(&Settings::default());
        let stuck = StuckSet::default();
        let refused = |t| {
            let mut e = nfs(t, What::SocketConnect, &web);
            if let Payload::Nfs(n) = &mut e.event.payload {
                n.error = Some(-libc::ECONNREFUSED);
            }
            e
        };
        s.observe(&refused(SEC));
        s.observe(&refused(2 * SEC));
        assert!(s.evaluate(3 * SEC, &node(&stuck)).is_empty());
        s.observe(&refused(21 * SEC));
        assert_eq!(s.evaluate(22 * SEC, &node(&stuck)).len(), 1);
        assert!(s.evaluate(90 * SEC, &node(&stuck)).is_empty(), "quiet for the window");
    }
}
