//! `nfs-server-unreachable`: this node's NFS client cannot reach a server — major RPC timeouts
//! (the kernel's `nfs: server ... not responding`) or failed connects — with no redirect involved
//! (namespaces whose NFS connections are redirected belong to `nfs-sidecar-redirect`). Evidence per
//! pod, so the comparison across nodes that broke incident 1's wrong hypothesis starts here.
//! Resolves when the server answers again (`server ... OK`) or errors stop for the quiet window.

use std::{
    collections::{BTreeMap, HashSet},
    net::IpAddr,
};

use serde::Serialize;

use super::{evidence, nfs_sidecar_redirect::redirected_nfs_port, pod_name};
use crate::{
    attribution::Attributed,
    events::Payload,
    incidents::{Finding, NodeView, Remediation, Settings, Severity, Signature, Step, keyed::Keyed, ns},
    probes::nfs::What,
};

pub const NAME: &str = "nfs-server-unreachable";
/// Failed connects within the window that count as unreachable without a major timeout.
const MIN_CONNECT_ERRORS: u64 = 3;

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
    timeouts: u64,
    connect_errors: u64,
    first_error: u64,
    last_error: u64,
    last_responding: u64,
    /// Errors per pod (or "host network"), for the evidence.
    by_pod: BTreeMap<String, u64>,
    who: std::sync::Arc<crate::attribution::Attribution>,
    firing_since: Option<u64>,
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
        let t = event.header.time_unix_ns;
        match &event.payload {
            Payload::TcpReset(r)
                if redirected_nfs_port(r, &self.nfs_ports).is_some()
                    && self.redirected.len() < super::super::keyed::DEFAULT_CAP =>
            {
                self.redirected.insert(event.header.netns);
            }
            Payload::TcpResetCount(c)
                if c.redirected_port().is_some_and(|p| self.nfs_ports.contains(&p))
                    && self.redirected.len() < super::super::keyed::DEFAULT_CAP =>
            {
                self.redirected.insert(event.header.netns);
            }
            Payload::Nfs(nfs) if !self.redirected.contains(&event.header.netns) => {
                let Some(addr) = nfs.server_addr else { return };
                let error = match nfs.what {
                    What::Timeout => true,
                    What::SocketConnect => nfs.connect_failed(),
                    What::SocketError => true,
                    What::ServerResponding => {
                        if let Some(s) = self.by_server.get_mut(&addr) {
                            s.last_responding = t;
                        }
                        return;
                    }
                    _ => false,
                };
                if !error {
                    return;
                }
                let who = attributed.who.clone();
                let s = self.by_server.touch(&addr, t, Server::default);
                if nfs.what == What::Timeout {
                    s.timeouts += 1;
                } else {
                    s.connect_errors += 1;
                }
                if s.first_error == 0 {
                    s.first_error = t;
                }
                s.last_error = s.last_error.max(t);
                *s.by_pod.entry(pod_name(&who)).or_default() += 1;
                s.who = who;
            }
            _ => {}
        }
    }

    fn evaluate(&mut self, now: u64, _node: &NodeView) -> Vec<Finding> {
        let (window, quiet) = (self.window, self.quiet);
        let mut findings = Vec::new();
        self.by_server.retain(|addr, s| {
            let recovered = s.last_responding > s.last_error || now.saturating_sub(s.last_error) >= quiet;
            let enough = s.timeouts >= 1 || s.connect_errors >= MIN_CONNECT_ERRORS;
            match s.firing_since {
                None if enough && !recovered => s.firing_since = Some(s.first_error),
                Some(_) if recovered => {
                    s.firing_since = None;
                    // What counted for this one does not count for the next.
                    *s = Server { last_responding: s.last_responding, ..Server::default() };
                }
                _ => {}
            }
            if s.firing_since.is_some() {
                findings.push(s.finding(*addr));
            }
            s.firing_since.is_some() || now.saturating_sub(s.last_error) < window
        });
        findings
    }

    fn evicted(&self) -> u64 {
        self.by_server.evicted()
    }
}

impl Server {
    fn finding(&self, addr: IpAddr) -> Finding {
        let pods: Vec<String> = self.by_pod.keys().cloned().collect();
        Finding {
            key: addr.to_string(),
            severity: Severity::Warning,
            who: if self.by_pod.len() == 1 { self.who.clone() } else { Default::default() },
            first_seen_unix_ns: self.firing_since.unwrap_or(self.first_error),
            last_seen_unix_ns: self.last_error,
            summary: format!(
                "NFS server {addr} does not answer this node: {} major RPC timeouts, {} failed connects, \
                 from {}. No redirect is involved: compare with other nodes mounting {addr} — if they are \
                 fine, look at this node's network path; if not, at the server.",
                self.timeouts,
                self.connect_errors,
                pods.join(", ")
            ),
            evidence: evidence(&Evidence {
                server: addr,
                nfs_timeouts: self.timeouts,
                nfs_connect_errors: self.connect_errors,
                errors_by_pod: &self.by_pod,
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

    #[test]
    fn redirected_namespaces_are_not_this_signature() {
        let web = pod("u1", "web-1");
        let mut s = NfsServerUnreachable::new(&Settings::default());
        let stuck = StuckSet::default();
        s.observe(&redirected_reset(SEC, 2049, &web));
        s.observe(&nfs(2 * SEC, What::Timeout, &web));
        assert!(s.evaluate(3 * SEC, &node(&stuck)).is_empty());
    }

    #[test]
    fn connect_errors_need_a_few_and_quiet_resolves() {
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
        s.observe(&refused(3 * SEC));
        assert_eq!(s.evaluate(4 * SEC, &node(&stuck)).len(), 1);
        assert!(s.evaluate(70 * SEC, &node(&stuck)).is_empty(), "quiet for the window");
    }
}
