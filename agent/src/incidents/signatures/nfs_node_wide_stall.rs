//! `nfs-node-wide-stall` (incident 3): tasks of several pods stuck in NFS at once. The kernel keeps
//! one `nfs_client` per server per node, shared by every mount of it; when its recovery blocks,
//! every mount to that server on the node blocks with it — not one bad volume, the node. One
//! critical incident instead of one per pod, with "drain this node" guidance.
//!
//! Which server: the one the stuck pods' namespaces talked to when known; else the one server
//! this node has seen RPC errors from (volumes mounted by the kubelet use the host's namespace).

use std::collections::{BTreeMap, BTreeSet, HashMap};

use serde_json::json;

use super::{human_secs, pod_name};
use crate::{
    attribution::Attributed,
    events::Payload,
    incidents::{Finding, NodeView, Remediation, Settings, Severity, Signature, Step},
    probes::{nfs::What, wait::WaitClass},
    stuck::StuckTask,
};

pub const NAME: &str = "nfs-node-wide-stall";
/// Pods whose NFS servers are remembered at most.
const MAX_PODS: usize = 10_000;

pub struct NfsNodeWideStall {
    min_pods: usize,
    /// Pod UID -> the NFS servers its network namespace's transports used.
    servers_of_pod: HashMap<String, BTreeSet<String>>,
    /// Servers this node saw RPC timeouts or state-manager failures from.
    failing: BTreeSet<String>,
}

impl NfsNodeWideStall {
    pub fn new(settings: &Settings) -> Self {
        Self {
            min_pods: settings.node_wide_min_pods.max(Settings::MIN_NODE_WIDE_PODS) as usize,
            servers_of_pod: HashMap::new(),
            failing: BTreeSet::new(),
        }
    }
}

impl Signature for NfsNodeWideStall {
    fn name(&self) -> &'static str {
        NAME
    }

    fn observe(&mut self, attributed: &Attributed) {
        let Payload::Nfs(nfs) = &attributed.event.payload else { return };
        let Some(server) = nfs.server_addr.map(|a| a.to_string()) else { return };
        if let Some(uid) = attributed.who.pod_uid.clone()
            && (self.servers_of_pod.len() < MAX_PODS || self.servers_of_pod.contains_key(&uid))
        {
            self.servers_of_pod.entry(uid).or_default().insert(server.clone());
        }
        match nfs.what {
            What::Timeout | What::StateManagerFailed => {
                self.failing.insert(server);
            }
            What::ServerResponding => {
                self.failing.remove(&server);
            }
            _ => {}
        }
    }

    fn evaluate(&mut self, now: u64, node: &NodeView) -> Vec<Finding> {
        let tasks: Vec<_> = node.stuck.all(now).into_iter().filter(|t| t.wait == WaitClass::Nfs).collect();
        // Pods (or the host) with a task stuck in NFS.
        let mut by_pod: BTreeMap<String, Vec<&StuckTask>> = BTreeMap::new();
        for t in &tasks {
            let key = t.who.pod_uid.clone().unwrap_or_else(|| "host".into());
            by_pod.entry(key).or_default().push(t);
        }
        if by_pod.len() < self.min_pods {
            return vec![];
        }
        let named: BTreeSet<&String> =
            by_pod.keys().filter_map(|uid| self.servers_of_pod.get(uid)).flatten().collect();
        let server = match (named.len(), self.failing.len()) {
            (1, _) => named.first().map(|s| s.to_string()),
            (0, 1) => self.failing.first().cloned(),
            _ => None,
        };
        let longest = tasks[0].blocked_secs;
        let pods: Vec<String> = by_pod.values().map(|ts| pod_name(&ts[0].who)).collect();
        let server_text = server.clone().unwrap_or_else(|| "its NFS server".into());
        vec![Finding {
            key: server.clone().unwrap_or_else(|| "node".into()),
            severity: Severity::Critical,
            who: Default::default(),
            first_seen_unix_ns: now.saturating_sub(longest * 1_000_000_000),
            last_seen_unix_ns: now,
            summary: format!(
                "Tasks of {} pods are stuck in NFS at once on this node ({}; longest {}): the node's NFS \
                 client for {server_text} is stalled, not one volume. Every mount of that server on this \
                 node is affected; drain the node.",
                by_pod.len(),
                pods.join(", "),
                human_secs(longest),
            ),
            evidence: json!({
                "server": server,
                "pods": pods,
                "stuck_tasks": tasks,
                "servers_with_errors": self.failing,
            }),
            remediation: Remediation {
                permanent: vec![
                    "NFS v4 keeps per-server client state (lease, recovery) shared by every mount on the \
                     node; v3 is stateless and avoids this failure. Consider v3 (or another storage) for \
                     these volumes."
                        .into(),
                    "Alert on this incident and drain early: pods stay in Init or Terminating with no \
                     event explaining why."
                        .into(),
                ],
                break_glass: vec![
                    Step::new("Stop new pods landing here and move the others.", Some("kubectl cordon <node> && kubectl drain <node> --ignore-daemonsets --delete-emptydir-data".into())),
                    Step::new(
                        "A blocked v4 state recovery does not recover by itself: reboot the node once it is drained.",
                        Some("systemctl reboot".into()),
                    ),
                ],
            },
        }]
    }

    fn evicted(&self) -> u64 {
        0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{incidents::signatures::tests::*, stuck::TaskState};

    #[test]
    fn two_pods_stuck_on_one_server_are_one_node_incident() {
        let (a, b) = (pod("u1", "web-1"), pod("u2", "db-0"));
        let mut s = NfsNodeWideStall::new(&Settings::default());
        s.observe(&nfs(SEC, What::Timeout, &a));
        let mut stuck = stuck(&[hung(2 * SEC, 10, WaitClass::Nfs, 120, &a)]);
        assert!(s.evaluate(3 * SEC, &node(&stuck)).is_empty(), "one pod: that is pod-termination-blocked's");
        stuck.report(&hung(4 * SEC, 20, WaitClass::Writeback, 120, &b));
        assert!(s.evaluate(5 * SEC, &node(&stuck)).is_empty(), "the second pod is not stuck in NFS");
        stuck.report(&hung(6 * SEC, 21, WaitClass::Nfs, 120, &b));
        let f = s.evaluate(7 * SEC, &node(&stuck));
        assert_eq!((f.len(), f[0].key.as_str(), f[0].severity), (1, SERVER, Severity::Critical));
        assert_eq!(f[0].evidence["pods"], json!(["shop/web-1", "shop/db-0"]));
        stuck.clear(&[((21, 21), TaskState::Other)], 8 * SEC);
        assert!(s.evaluate(9 * SEC, &node(&stuck)).is_empty());
    }
}
