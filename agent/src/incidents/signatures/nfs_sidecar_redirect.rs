//! `nfs-sidecar-redirect` (incident 1): in one pod's network namespace, SYNs to an NFS port are
//! redirected by NAT to a local port where nothing listens and answered with RST — the kernel NFS
//! client's connection was captured by a mesh's proxy that is gone (Istio's sidecar, Istio
//! ambient's ztunnel, Linkerd's proxy: [`way_out`] names it and says the way out). A hard mount
//! then retries forever and a task flushing to it never finishes.
//!
//! Fires on `redirect_min_resets` such resets within `redirect_window` that show the redirect
//! persisting: each within 15 s of the one before, going on for two seconds at least; evidence
//! adds the NFS timeouts and retransmits of that namespace and the pod's tasks stuck in NFS.
//! Resolves once no reset came for `quiet_window`, RPCs to the server completed again (or none
//! timed out since), and no task of the pod is stuck in NFS.
//!
//! What healthy traffic looks like to it, and why none of it fires:
//! - A mesh pod whose sidecar is alive: its connections to :2049 are redirected to the proxy,
//!   which accepts them. No reset.
//! - The proxy closing connections it accepted (idle timeouts, a request left unread, its own
//!   exit): reset from a socket, with no original destination. Not a redirect's reset.
//! - The sidecar restarting: the SYNs sent in the second it takes are redirected and reset, and
//!   the client's next try (a hard mount retries after 3 s) gets through. Resets within a second
//!   or so do not persist; two restarts half a minute apart are two blips, not one run.
//! - Port scans, clients refused by a live server, resets to redirected non-NFS ports (8080):
//!   not redirected, or not an NFS port.

use std::{
    collections::{BTreeSet, VecDeque},
    net::IpAddr,
    sync::Arc,
};

use serde::Serialize;

use self::way_out::{Case, Proxy, ProxyEvidence};
use super::{evidence, human_secs, pod_name};
use crate::{
    attribution::{Attributed, Attribution},
    events::Payload,
    incidents::{Finding, NodeView, Settings, Severity, Signature, keyed::Keyed, ns},
    probes::{
        nfs::What,
        ports::CountedPort,
        tcp_reset::{Direction, TcpReset},
        wait::WaitClass,
    },
    stuck::StuckTask,
};

mod way_out;

pub const NAME: &str = "nfs-sidecar-redirect";
/// Times of resets kept per namespace (a count's resets share one); past it the oldest go, the
/// count in `total` staying exact.
const MAX_TIMES: usize = 4096;
const SECOND_NS: u64 = 1_000_000_000;
/// A sidecar restart is over within a second or so (the proxy is back before the client's next
/// try): a redirect persists when its resets go on at least this long ...
const PERSISTS: u64 = 2 * SECOND_NS;
/// ... each within this long of the one before. A refused client tries again within seconds (the
/// kernel's NFS client after 3 s, then 6: `XS_TCP_INIT_REEST_TO`, doubling), so its first tries
/// are within it; a client that got through has no reason to, so two restarts of the sidecar half
/// a minute apart are two blips, not one run.
const RETRY_GAP: u64 = 15 * SECOND_NS;

pub struct NfsSidecarRedirect {
    ports: NfsPorts,
    min_resets: u32,
    window: u64,
    quiet: u64,
    by_netns: Keyed<u32, Namespace>,
}

/// One pod network namespace's redirected NFS connections.
struct Namespace {
    who: Arc<Attribution>,
    netns: u32,
    /// Redirected NFS resets within the window: (time, how many).
    resets: VecDeque<(u64, u64)>,
    total: u64,
    first_reset: u64,
    last_reset: u64,
    server: Option<IpAddr>,
    nfs_port: u16,
    /// Every NFS port whose connections were redirected: an NFSv3 mount's rpcbind and mountd
    /// come before NFS itself.
    nfs_ports: BTreeSet<u16>,
    redirect_ports: BTreeSet<u16>,
    retransmits: u64,
    timeouts: u64,
    connect_errors: u64,
    last_timeout: u64,
    last_responding: u64,
    firing_since: Option<u64>,
}

impl NfsSidecarRedirect {
    pub fn new(settings: &Settings) -> Self {
        Self {
            ports: NfsPorts::new(&settings.nfs_ports),
            min_resets: settings.redirect_min_resets.max(Settings::MIN_REDIRECT_RESETS),
            window: ns(settings.redirect_window),
            quiet: ns(settings.quiet_window),
            by_netns: Keyed::new(super::super::keyed::DEFAULT_CAP),
        }
    }
}

/// The NFS port a SYN was sent to when NAT sent it to another local port and it was answered with
/// RST (the sidecar-redirect signature's evidence, also what other signatures leave to it).
pub fn redirected_nfs_port(reset: &TcpReset, nfs_ports: &[u16]) -> Option<u16> {
    redirected_port(reset).filter(|p| nfs_ports.contains(p))
}

/// The port a SYN was sent to when NAT sent it to another local port and it was answered with RST.
fn redirected_port(reset: &TcpReset) -> Option<u16> {
    let original = reset.original_dst_port?;
    (reset.direction == Direction::Sent && reset.local_port != original).then_some(original)
}

/// The ports NFS is reached on: the setting's (2049, and an NFSv3 mount's rpcbind 111 and mountd
/// 20048), the ones the node's NFS mounts show in their options (`port=`, `mountport=`), and the
/// servers' ports the kernel's RPC clients connect to (a mount made in a pod's own mount namespace
/// is not in the node's table, but its RPCs are seen).
struct NfsPorts {
    configured: Vec<u16>,
    mounted: BTreeSet<u16>,
    kernel: BTreeSet<u16>,
}

/// Ports learned from the kernel's RPC clients kept at most: a node talks to few.
const MAX_KERNEL_PORTS: usize = 64;

impl NfsPorts {
    fn new(configured: &[u16]) -> Self {
        NfsPorts { configured: configured.to_vec(), mounted: BTreeSet::new(), kernel: BTreeSet::new() }
    }

    fn is_nfs(&self, port: u16) -> bool {
        self.configured.contains(&port) || self.mounted.contains(&port) || self.kernel.contains(&port)
    }

    fn used_by_the_kernel(&mut self, port: u16) {
        if self.kernel.len() < MAX_KERNEL_PORTS && port != 0 {
            self.kernel.insert(port);
        }
    }

    /// What a connection to `port` is for: an NFSv3 mount asks rpcbind, then mountd, before it
    /// connects to NFS itself.
    fn service(port: u16) -> Service {
        match port {
            RPCBIND_PORT => Service::Rpcbind,
            MOUNTD_PORT => Service::Mountd,
            _ => Service::Nfs,
        }
    }

    /// The ports a way out must let through, once `seen` were redirected: those alone when they
    /// are NFS's own; every NFS port known when an NFSv3 mount's rpcbind or mountd was among them
    /// (the mount is at its start, and will need each in turn).
    fn to_let_through(&self, seen: &BTreeSet<u16>) -> Vec<u16> {
        if seen.iter().all(|&p| Self::service(p) == Service::Nfs) {
            return seen.iter().copied().collect();
        }
        let all = self.configured.iter().chain(&self.mounted).chain(seen);
        all.copied().collect::<BTreeSet<u16>>().into_iter().collect()
    }
}

const RPCBIND_PORT: u16 = 111;
const MOUNTD_PORT: u16 = 20048;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Service {
    Rpcbind,
    Mountd,
    Nfs,
}

impl Signature for NfsSidecarRedirect {
    fn name(&self) -> &'static str {
        NAME
    }

    fn observe(&mut self, attributed: &Attributed) {
        let event = &attributed.event;
        let t = event.header.time_unix_ns;
        let netns = event.header.netns;
        match &event.payload {
            Payload::TcpReset(reset) => {
                let Some(port) = redirected_port(reset).filter(|&p| self.ports.is_nfs(p)) else { return };
                let ns = self.namespace(netns, attributed, t);
                ns.add_resets(t, 1, port, Some(reset.local_port));
                ns.server = reset.original_dst_addr.or(ns.server);
            }
            // The resets of the series not sent in full (the sent ones are counted above).
            Payload::TcpResetCount(count) if count.suppressed > 0 => {
                let Some(port) = count.redirected_port().filter(|&p| self.ports.is_nfs(p)) else {
                    return;
                };
                let local = match count.port {
                    CountedPort::Number(local) => Some(local),
                    _ => None,
                };
                self.namespace(netns, attributed, t).add_resets(t, count.suppressed, port, local);
            }
            Payload::Nfs(nfs) => {
                if let Some(port) = nfs.server_port {
                    self.ports.used_by_the_kernel(port);
                }
                // Only namespaces already seen redirecting: NFS errors alone are another signature's.
                let Some(ns) = self.by_netns.get_mut(&netns) else { return };
                match nfs.what {
                    What::Retransmit => ns.retransmits += 1,
                    What::Timeout => {
                        ns.timeouts += 1;
                        ns.last_timeout = t;
                    }
                    What::SocketConnect if nfs.connect_failed() => ns.connect_errors += 1,
                    What::SocketError | What::SocketReset => ns.connect_errors += 1,
                    What::ServerResponding => ns.last_responding = t,
                    _ => {}
                }
            }
            _ => {}
        }
    }

    fn evaluate(&mut self, now: u64, node: &NodeView) -> Vec<Finding> {
        self.ports.mounted.clone_from(node.nfs_mount_ports);
        let (window, quiet, min) = (self.window, self.quiet, self.min_resets);
        let ports = &self.ports;
        let stuck = node.stuck;
        let mut findings = Vec::new();
        self.by_netns.retain(|_, ns| {
            while ns.resets.front().is_some_and(|&(r, _)| now.saturating_sub(r) > window) {
                ns.resets.pop_front();
            }
            let tasks: Vec<StuckTask> = ns
                .who
                .pod_uid
                .as_deref()
                .map(|uid| stuck.of_pod(uid, now).into_iter().filter(|t| t.wait == WaitClass::Nfs).collect())
                .unwrap_or_default();
            match ns.firing_since {
                None => ns.firing_since = persisting(&ns.resets, min),
                Some(_) => {
                    let quiet_now = now.saturating_sub(ns.last_reset) >= quiet;
                    let rpcs_ok = ns.last_responding > ns.last_reset || ns.last_timeout <= ns.last_reset;
                    if quiet_now && rpcs_ok && tasks.is_empty() {
                        // Resolved: what counted for it does not count for the next one.
                        ns.firing_since = None;
                        ns.resets.clear();
                    }
                }
            }
            if ns.firing_since.is_some() {
                findings.push(ns.finding(&tasks, ports));
            }
            // Forget a namespace once it neither fires nor has resets in the window.
            ns.firing_since.is_some() || !ns.resets.is_empty()
        });
        findings
    }

    fn evicted(&self) -> u64 {
        self.by_netns.evicted()
    }
}

/// The first reset of the latest run of resets that shows the redirect persisting: at least `min`
/// of them, each within [`RETRY_GAP`] of the one before, the run spanning [`PERSISTS`]. (A count's
/// resets carry the time of its interval: times are in arrival order, not quite sorted.)
fn persisting(resets: &VecDeque<(u64, u64)>, min: u32) -> Option<u64> {
    let mut times = resets.iter().rev().copied();
    let (last, n) = times.next()?;
    let (mut first, mut latest, mut n) = (last, last, n);
    for (t, more) in times {
        if first.saturating_sub(t) > RETRY_GAP {
            break;
        }
        (first, latest, n) = (first.min(t), latest.max(t), n + more);
    }
    (n >= u64::from(min) && latest - first >= PERSISTS).then_some(first)
}

impl NfsSidecarRedirect {
    fn namespace(&mut self, netns: u32, attributed: &Attributed, t: u64) -> &mut Namespace {
        let who = attributed.who.clone();
        let ns = self.by_netns.touch(&netns, t, || Namespace::new(netns, who.clone()));
        // The kernel reuses a gone pod's namespace inode: another pod's reset starts afresh.
        if who.pod_uid.is_some() && ns.who.pod_uid.is_some() && who.pod_uid != ns.who.pod_uid {
            *ns = Namespace::new(netns, who.clone());
        }
        // A count (no task) or a bystander's reset names the pod alone: keep the container a
        // reset in the pod's own task named.
        if !(who.container.is_empty() && who.pod_uid == ns.who.pod_uid) {
            ns.who = who;
        }
        ns
    }
}

impl Namespace {
    /// `n` redirected resets at `t` of NFS port `nfs_port`, refused by `local` (when known).
    fn add_resets(&mut self, t: u64, n: u64, nfs_port: u16, local: Option<u16>) {
        if self.resets.len() >= MAX_TIMES {
            self.resets.pop_front();
        }
        self.resets.push_back((t, n));
        self.total += n;
        if self.first_reset == 0 {
            self.first_reset = t;
        }
        self.last_reset = self.last_reset.max(t);
        self.nfs_port = nfs_port;
        self.nfs_ports.insert(nfs_port);
        self.redirect_ports.extend(local);
    }

    /// Only an NFSv3 mount's rpcbind or mountd was reached: the mount has not got to NFS.
    fn mount_stage(&self) -> bool {
        self.nfs_ports.iter().all(|&p| NfsPorts::service(p) != Service::Nfs)
    }

    fn in_window(&self) -> u64 {
        self.resets.iter().map(|(_, n)| n).sum()
    }

    fn new(netns: u32, who: Arc<Attribution>) -> Self {
        Namespace {
            who,
            netns,
            resets: VecDeque::new(),
            total: 0,
            first_reset: 0,
            last_reset: 0,
            server: None,
            nfs_port: 0,
            nfs_ports: BTreeSet::new(),
            redirect_ports: BTreeSet::new(),
            retransmits: 0,
            timeouts: 0,
            connect_errors: 0,
            last_timeout: 0,
            last_responding: 0,
            firing_since: None,
        }
    }

    fn finding(&self, tasks: &[StuckTask], ports: &NfsPorts) -> Finding {
        let proxy = Proxy::of(self.who.mesh.as_ref(), &self.redirect_ports);
        let server = self.server.map(|s| s.to_string()).unwrap_or_else(|| "the NFS server".into());
        let redirect_ports: Vec<String> = self.redirect_ports.iter().map(u16::to_string).collect();
        let reached: Vec<String> = self.nfs_ports.iter().map(|&p| format!("{server}:{p}")).collect();
        let mut summary = format!(
            "Connections from {} to NFS server {} are redirected to local port {} where nothing \
             listens, and reset ({} resets in the window, {} in all).",
            pod_name(&self.who),
            reached.join(", "),
            redirect_ports.join(", "),
            self.in_window(),
            self.total,
        );
        if self.mount_stage() {
            summary.push_str(
                " They are an NFSv3 mount's first steps (rpcbind on 111, then mountd): the mount hangs \
                 before it reaches NFS, retrying until it gives up.",
            );
        } else {
            summary.push_str(" A hard-mounted NFS client retries them forever.");
        }
        summary.push_str(&proxy.said());
        if self.timeouts > 0 {
            summary.push_str(&format!(" {} RPC timeouts to the server from this namespace.", self.timeouts));
        }
        if let Some(t) = tasks.first() {
            summary.push_str(&format!(
                " {} task(s) stuck in NFS (longest: {} pid {} tid {}, {}): the pod cannot terminate.",
                tasks.len(),
                t.comm,
                t.pid,
                t.tid,
                human_secs(t.blocked_secs)
            ));
        }
        Finding {
            key: format!("netns-{}", self.netns),
            severity: if tasks.is_empty() { Severity::Warning } else { Severity::Critical },
            who: self.who.clone(),
            first_seen_unix_ns: self.firing_since.unwrap_or(self.first_reset),
            last_seen_unix_ns: self.last_reset,
            summary,
            evidence: evidence(&Evidence {
                netns: self.netns,
                server: self.server,
                nfs_port: self.nfs_port,
                nfs_ports: &self.nfs_ports,
                nfs_stage: if self.mount_stage() { "mount" } else { "nfs" },
                redirect_ports: &self.redirect_ports,
                resets_in_window: self.in_window(),
                resets_total: self.total,
                nfs_retransmits: self.retransmits,
                nfs_timeouts: self.timeouts,
                nfs_connect_errors: self.connect_errors,
                server_responding_since_last_reset: self.last_responding > self.last_reset,
                stuck_tasks: tasks,
                proxy: proxy.evidence(),
            }),
            remediation: way_out::remediation(&Case {
                proxy: &proxy,
                nfs_ports: &ports.to_let_through(&self.nfs_ports),
                server: self.server,
                pod_uid: self.who.pod_uid.as_deref(),
                stuck: tasks.first(),
            }),
        }
    }
}

#[derive(Serialize)]
struct Evidence<'a> {
    netns: u32,
    server: Option<IpAddr>,
    /// The latest reset's NFS port, and all of them.
    nfs_port: u16,
    nfs_ports: &'a BTreeSet<u16>,
    /// `mount` when only an NFSv3 mount's rpcbind or mountd was reached, else `nfs`.
    nfs_stage: &'static str,
    redirect_ports: &'a BTreeSet<u16>,
    resets_in_window: u64,
    resets_total: u64,
    nfs_retransmits: u64,
    nfs_timeouts: u64,
    nfs_connect_errors: u64,
    server_responding_since_last_reset: bool,
    stuck_tasks: &'a [StuckTask],
    #[serde(flatten)]
    proxy: ProxyEvidence,
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::{
        attribution::pods::mesh::{Mesh, PodMesh},
        incidents::signatures::tests::*,
        stuck::{StuckSet, TaskState},
    };

    const UID: &str = "0c2a5b1e-7f3d-4c1a-9e8b-1234567890ab";

    fn signature() -> NfsSidecarRedirect {
        NfsSidecarRedirect::new(&Settings::default())
    }

    /// A storm: two resets sent in full, the kernel's count says 5000 (4998 suppressed).
    #[test]
    fn the_resets_not_sent_in_full_count_too() {
        let who = pod(UID, "web-1");
        let mut s = signature();
        s.observe(&redirected_reset(101 * SEC, 2049, &who));
        s.observe(&redirected_reset(101 * SEC, 2049, &who));
        let count = crate::probes::tcp_reset::ResetCount {
            direction: Direction::Sent,
            port: CountedPort::Number(15001),
            original_port: Some(CountedPort::Number(2049)),
            reason: Some("NO_SOCKET".into()),
            resets: 5000,
            suppressed: 4998,
        };
        let mut counted = redirected_reset(103 * SEC, 2049, &who);
        counted.event.payload = Payload::TcpResetCount(count.clone());
        s.observe(&counted);
        // Another port's count is not this signature's.
        let mut other = counted.clone();
        other.event.payload = Payload::TcpResetCount(crate::probes::tcp_reset::ResetCount {
            original_port: Some(CountedPort::Number(8080)),
            ..count
        });
        s.observe(&other);
        let f = s.evaluate(103 * SEC, &node(&StuckSet::default()));
        assert_eq!(f.len(), 1);
        assert_eq!(f[0].evidence["resets_total"], 5000, "{:#}", f[0].evidence);
        assert_eq!(f[0].evidence["resets_in_window"], 5000, "{:#}", f[0].evidence);
    }

    #[test]
    fn redirected_nfs_resets_with_a_stuck_writer_fire_critical_with_the_way_out() {
        let istio = PodMesh { meshes: vec![Mesh::IstioSidecar], native_sidecar: false };
        let who = Arc::new(Attribution { mesh: Some(istio), ..(*pod(UID, "web-1")).clone() });
        let mut s = signature();
        let stuck = stuck(&[hung(100 * SEC, 4243, WaitClass::Nfs, 120, &who)]);
        s.observe(&redirected_reset(101 * SEC, 2049, &who));
        assert!(s.evaluate(101 * SEC, &node(&stuck)).is_empty(), "one reset is not yet a pattern");
        s.observe(&nfs(102 * SEC, What::Timeout, &who));
        s.observe(&redirected_reset(105 * SEC, 2049, &who));
        let f = s.evaluate(106 * SEC, &node(&stuck));
        assert_eq!(f.len(), 1);
        let f = &f[0];
        assert_eq!((f.severity, f.who.pod.as_str()), (Severity::Critical, "web-1"));
        assert_eq!(f.evidence["server"], SERVER);
        assert_eq!(f.evidence["redirect_ports"], json!([15001]));
        assert_eq!(f.evidence["nfs_timeouts"], 1);
        assert_eq!(f.evidence["stuck_tasks"][0]["tid"], 4243);
        assert!(f.summary.contains("shop/web-1") && f.summary.contains("10.55.0.1:2049"), "{}", f.summary);
        let commands: Vec<&str> =
            f.remediation.break_glass.iter().filter_map(|s| s.command.as_deref()).collect();
        assert!(
            commands
                .iter()
                .any(|c| c.contains("/proc/4243/task/4243/ns/net iptables -t nat -D ISTIO_OUTPUT"))
        );
        assert!(commands.iter().any(|c| c.contains("0c2a5b1e_7f3d_4c1a_9e8b_1234567890ab")), "{commands:?}");
        assert!(f.remediation.permanent[0].contains("excludeOutboundPorts: \"2049\""));
        assert_eq!(
            (&f.evidence["mesh"], &f.evidence["proxy"]),
            (&json!("istio-sidecar"), &json!("istio-proxy"))
        );
        assert!(
            f.summary.contains("The redirect is istio-sidecar's: its proxy container istio-proxy"),
            "{}",
            f.summary
        );
    }

    /// An NFSv3 mount through a redirect: rpcbind first, then (had it been let through) mountd.
    /// The incident says the mount is at its start, and its way out lets every NFS port through.
    #[test]
    fn an_nfsv3_mount_redirected_at_rpcbind_is_named_and_every_nfs_port_let_through() {
        let linkerd = PodMesh { meshes: vec![Mesh::Linkerd], native_sidecar: true };
        let who = Arc::new(Attribution { mesh: Some(linkerd), ..(*pod(UID, "web-1")).clone() });
        let mut s = signature();
        let stuck = StuckSet::default();
        for t in [101, 102, 104] {
            let mut e = redirected_reset(t * SEC, 111, &who);
            if let Payload::TcpReset(r) = &mut e.event.payload {
                (r.local_port, r.redirect_port) = (4140, Some(4140));
            }
            s.observe(&e);
        }
        let f = s.evaluate(105 * SEC, &node(&stuck));
        assert_eq!(f.len(), 1);
        let f = &f[0];
        assert_eq!((&f.evidence["nfs_ports"], &f.evidence["nfs_stage"]), (&json!([111]), &json!("mount")));
        assert!(
            f.summary.contains("10.55.0.1:111") && f.summary.contains("NFSv3 mount's first steps"),
            "{}",
            f.summary
        );
        assert!(
            f.remediation.permanent[0].contains("skip-outbound-ports: \"111,2049,20048\""),
            "{:?}",
            f.remediation
        );
        let edit = f.remediation.break_glass[4].command.as_deref().unwrap_or_default();
        assert!(
            edit.ends_with("iptables -t nat -I PROXY_INIT_OUTPUT 1 -p tcp -d 10.55.0.1 -m multiport --dports 111,2049,20048 -j RETURN"),
            "{edit}"
        );
    }

    /// A server on another port: named by a mount's options on the node, or by the kernel's own
    /// RPC client connecting to it (a mount in the pod's own mount namespace).
    #[test]
    fn ports_from_the_mounts_options_and_the_kernels_rpc_clients_are_nfs_ports() {
        let who = pod(UID, "web-1");
        let stuck = StuckSet::default();
        let (mounted, kernel) = (3049, 4049);
        let resets = |s: &mut NfsSidecarRedirect, port: u16, from: u64| {
            for t in [from, from + 3] {
                s.observe(&redirected_reset(t * SEC, port, &who));
            }
            s.evaluate((from + 4) * SEC, &node(&stuck))
        };
        let mut s = signature();
        assert!(resets(&mut s, mounted, 100).is_empty(), "not an NFS port yet");
        let ports = BTreeSet::from([mounted]);
        assert!(s.evaluate(110 * SEC, &NodeView { nfs_mount_ports: &ports, ..node(&stuck) }).is_empty());
        let f = resets(&mut s, mounted, 120);
        assert_eq!((f.len(), &f[0].evidence["nfs_ports"]), (1, &json!([mounted])));
        let edit = f[0].remediation.break_glass[4].command.as_deref().unwrap_or_default();
        assert!(edit.ends_with("-d 10.55.0.1 --dport 3049 -j RETURN"), "{edit}");

        let mut s = signature();
        let mut rpc = nfs(99 * SEC, What::SocketConnect, &who);
        if let Payload::Nfs(n) = &mut rpc.event.payload {
            n.server_port = Some(kernel);
        }
        s.observe(&rpc);
        let f = resets(&mut s, kernel, 100);
        assert_eq!((f.len(), &f[0].evidence["nfs_stage"]), (1, &json!("nfs")));
    }

    #[test]
    fn near_misses_do_not_fire() {
        let who = pod(UID, "web-1");
        let mut s = signature();
        let stuck = StuckSet::default();
        // Not redirected (a refused NFS port without NAT), not an NFS port, received not sent.
        let mut plain = redirected_reset(SEC, 2049, &who);
        if let Payload::TcpReset(r) = &mut plain.event.payload {
            r.local_port = 2049;
        }
        let other_port = redirected_reset(2 * SEC, 443, &who);
        let mut received = redirected_reset(3 * SEC, 2049, &who);
        if let Payload::TcpReset(r) = &mut received.event.payload {
            r.direction = Direction::Received;
        }
        for e in [&plain, &plain, &other_port, &other_port, &received, &received] {
            s.observe(e);
        }
        assert!(s.evaluate(4 * SEC, &node(&stuck)).is_empty());
        // Two resets too far apart for the window.
        s.observe(&redirected_reset(10 * SEC, 2049, &who));
        s.observe(&redirected_reset(700 * SEC, 2049, &who));
        assert!(s.evaluate(701 * SEC, &node(&stuck)).is_empty());
    }

    /// The proxy listening on the redirect port resets its own connections when it is killed:
    /// sent from 15001 with a socket and no original destination. Not the redirect's.
    #[test]
    fn the_proxys_own_resets_do_not_count() {
        let who = pod(UID, "web-1");
        let mut s = signature();
        let stuck = StuckSet::default();
        let proxys_own = |t: u64| {
            let mut e = redirected_reset(t, 2049, &who);
            if let Payload::TcpReset(r) = &mut e.event.payload {
                (r.has_socket, r.original_dst_addr, r.original_dst_port, r.redirect_port) =
                    (true, None, None, None);
                (r.reason, r.tcp_state) = (Some("TCP_ABORT_ON_CLOSE".into()), Some("CLOSE"));
            }
            e
        };
        for t in 1..=5 {
            s.observe(&proxys_own(t * SEC));
        }
        assert!(s.evaluate(6 * SEC, &node(&stuck)).is_empty());
        s.observe(&redirected_reset(7 * SEC, 2049, &who));
        s.observe(&proxys_own(8 * SEC));
        s.observe(&redirected_reset(9 * SEC, 2049, &who));
        let f = s.evaluate(10 * SEC, &node(&stuck));
        assert_eq!(f.len(), 1);
        assert_eq!(f[0].evidence["resets_total"], 2, "{:#}", f[0].evidence);
    }

    /// A sidecar restart that completes within a second: every SYN sent meanwhile (several
    /// mounts, a quick retry) is reset, the next try gets through. Twice, 40 s apart.
    #[test]
    fn a_sidecar_restart_within_a_second_does_not_fire_nor_do_two_half_a_minute_apart() {
        let who = pod(UID, "web-1");
        let mut s = signature();
        let stuck = StuckSet::default();
        let ms = |n: u64| n * SEC / 1000;
        for t in [ms(100_000), ms(100_100), ms(100_600), ms(101_050)] {
            s.observe(&redirected_reset(t, 2049, &who));
        }
        assert!(s.evaluate(ms(101_100), &node(&stuck)).is_empty(), "one restart");
        assert!(s.evaluate(ms(160_000), &node(&stuck)).is_empty());
        s.observe(&redirected_reset(ms(140_000), 2049, &who));
        s.observe(&redirected_reset(ms(140_400), 2049, &who));
        assert!(s.evaluate(ms(140_500), &node(&stuck)).is_empty(), "a second restart, 40 s on");
        // The proxy does not come back: the client's next tries are reset too.
        s.observe(&redirected_reset(ms(143_400), 2049, &who));
        let f = s.evaluate(ms(143_500), &node(&stuck));
        assert_eq!(f.len(), 1, "a persisting redirect");
        assert_eq!(f[0].first_seen_unix_ns, ms(140_000), "since the run's first reset");
    }

    #[test]
    fn resolves_once_rpcs_complete_quiet_and_no_task_is_stuck() {
        let who = pod(UID, "web-1");
        let mut s = signature();
        let mut stuck = stuck(&[hung(100 * SEC, 4243, WaitClass::Nfs, 120, &who)]);
        s.observe(&redirected_reset(101 * SEC, 111, &who));
        s.observe(&redirected_reset(104 * SEC, 111, &who));
        s.observe(&nfs(103 * SEC, What::Timeout, &who));
        assert_eq!(s.evaluate(104 * SEC, &node(&stuck)).len(), 1);
        // Quiet, but the task is still stuck and RPCs have not completed: still firing.
        assert_eq!(s.evaluate(200 * SEC, &node(&stuck)).len(), 1);
        // The rule is deleted: the server answers, the flush completes.
        s.observe(&nfs(201 * SEC, What::ServerResponding, &who));
        assert_eq!(s.evaluate(202 * SEC, &node(&stuck)).len(), 1, "the task is still stuck");
        stuck.clear(&[((4243, 4243), TaskState::Gone)], 203 * SEC);
        assert!(s.evaluate(204 * SEC, &node(&stuck)).is_empty());
        // Fires anew on new resets.
        s.observe(&redirected_reset(300 * SEC, 111, &who));
        s.observe(&redirected_reset(303 * SEC, 111, &who));
        let f = s.evaluate(304 * SEC, &node(&stuck));
        assert_eq!((f.len(), f[0].severity), (1, Severity::Warning));
    }
}
