//! `nfs-node-wide-stall` (incident 3): tasks of several pods stuck in NFS at once. The kernel keeps
//! one `nfs_client` per server per node, shared by every mount of it; when its recovery blocks,
//! every mount to that server on the node blocks with it — not one bad volume, the node. One
//! critical incident instead of one per pod, with "drain this node" guidance.
//!
//! What healthy traffic looks like to it, and why none of it fires: NFS calls wait in the kernel
//! for milliseconds, and during a server restart inside its grace period for seconds — below the
//! sampler's threshold, so no task of any pod is in the stuck set; one pod's stuck tasks are
//! `pod-termination-blocked`, and tasks of several pods stuck in anything but NFS are not this.
//! See `two_pods_stuck_on_one_server_are_one_node_incident`.
//!
//! Which server: the one the stuck pods' namespaces talked to when known; else the one server
//! this node has seen RPC errors from (volumes mounted by the kubelet use the host's namespace);
//! else the one whose NFSv4 state manager is stuck.
//!
//! The recovery: the NFSv4 client runs state recovery (lease check, new client ID and session,
//! reclaim) in one kernel thread per server, `<server>-manager`. While it is stuck, every call of
//! every mount of that server waits behind it. The sampler sees that thread (its waits are
//! killable, so the hung-task detector never does); the incident names it and the step it is
//! stuck in, and does not count it as a pod.

use std::{
    collections::{BTreeMap, BTreeSet, HashMap},
    net::IpAddr,
    sync::Arc,
};

use serde::Serialize;

use super::{evidence, human_secs, pod_name};
use crate::{
    attribution::Attributed,
    events::Payload,
    incidents::{Finding, NodeView, Remediation, Settings, Severity, Signature, Step},
    probes::{
        nfs::What,
        wait::{WaitClass, WaitKind, frame_name},
    },
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
        let stuck = node.stuck.all(now);
        let (managers, tasks): (Vec<&StuckTask>, Vec<&StuckTask>) =
            stuck.iter().filter(|t| t.wait == WaitClass::Nfs).partition(|t| recovery_step(t).is_some());
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
        let managing: BTreeSet<String> = managers.iter().filter_map(|m| managed_server(&m.comm)).collect();
        let server = match (named.len(), self.failing.len(), managing.len()) {
            (1, _, _) => named.first().map(|s| s.to_string()),
            (0, 1, _) => self.failing.first().cloned(),
            (0, 0, 1) => managing.first().cloned(),
            _ => None,
        };
        // The server's recovery when its thread is known; the longest stuck one otherwise.
        let recovery = managers
            .iter()
            .find(|m| server.is_some() && managed_server(&m.comm) == server)
            .or(managers.first())
            .map(|m| Recovery::of(m));
        let waiting_on_recovery: Vec<u32> =
            tasks.iter().filter(|t| t.stack.iter().any(|f| waits_for_recovery(f))).map(|t| t.pid).collect();
        let longest = tasks[0].blocked_secs;
        let pods: Vec<String> = by_pod.values().map(|ts| pod_name(&ts[0].who)).collect();
        let server_text = server.clone().unwrap_or_else(|| "its NFS server".into());
        let recovery_text = recovery.as_ref().map_or(String::new(), |r| {
            format!(
                " Its NFSv4 state recovery (kernel thread {}, pid {}) has been stuck for {} {}: every call to \
                 that server waits behind it.",
                r.comm,
                r.pid,
                human_secs(r.blocked_secs),
                r.step
            )
        });
        vec![Finding {
            key: server.clone().unwrap_or_else(|| "node".into()),
            severity: Severity::Critical,
            who: Default::default(),
            first_seen_unix_ns: now.saturating_sub(longest * 1_000_000_000),
            last_seen_unix_ns: now,
            summary: format!(
                "Tasks of {} pods are stuck in NFS at once on this node ({}; longest {}): the node's NFS \
                 client for {server_text} is stalled, not one volume.{recovery_text} Every mount of that \
                 server on this node is affected; drain the node.",
                by_pod.len(),
                pods.join(", "),
                human_secs(longest),
            ),
            evidence: evidence(&Evidence {
                server,
                pods,
                stuck_tasks: tasks,
                recovery,
                waiting_on_recovery,
                servers_with_errors: &self.failing,
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

#[derive(Serialize)]
struct Evidence<'a> {
    server: Option<String>,
    pods: Vec<String>,
    stuck_tasks: Vec<&'a StuckTask>,
    recovery: Option<Recovery>,
    waiting_on_recovery: Vec<u32>,
    servers_with_errors: &'a BTreeSet<String>,
}

/// The NFSv4 state manager of one server, stuck.
#[derive(Serialize)]
struct Recovery {
    pid: u32,
    comm: String,
    /// What it is stuck doing, in words.
    step: &'static str,
    blocked_secs: u64,
    wait_kind: WaitKind,
    stack: Arc<[String]>,
}

impl Recovery {
    fn of(task: &StuckTask) -> Self {
        Recovery {
            pid: task.pid,
            comm: task.comm.clone(),
            step: recovery_step(task).unwrap_or_default(),
            blocked_secs: task.blocked_secs,
            wait_kind: task.wait_kind,
            stack: task.stack.clone(),
        }
    }
}

/// The step of state recovery a stuck task is in, when it is a state manager: the innermost
/// frame that names one (nfs4state.c's sections), else "recovering state".
fn recovery_step(task: &StuckTask) -> Option<&'static str> {
    let names = || task.stack.iter().map(|f| frame_name(f));
    if !names().any(|n| n == "nfs4_run_state_manager" || n == "nfs4_state_manager") {
        return None;
    }
    let step = names().find_map(|name| {
        RECOVERY_STEPS.iter().find(|(functions, _)| functions.contains(&name)).map(|(_, step)| *step)
    });
    Some(step.unwrap_or("recovering state"))
}

const RECOVERY_STEPS: &[(&[&str], &str)] = &[
    (
        &["nfs4_proc_sequence", "nfs4_proc_renew", "nfs4_check_lease"],
        "checking its lease (SEQUENCE: the server does not answer)",
    ),
    (
        &["nfs4_proc_exchange_id", "nfs4_establish_lease", "nfs41_init_clientid"],
        "establishing a new client ID (EXCHANGE_ID)",
    ),
    (&["nfs4_proc_create_session"], "creating a new session (CREATE_SESSION)"),
    (&["nfs4_proc_destroy_session", "nfs4_reset_session"], "resetting its session"),
    (&["nfs4_begin_drain_session", "nfs4_drain_slot_tbl"], "waiting for the calls in flight to drain"),
    (
        &["nfs4_proc_reclaim_complete", "nfs41_proc_reclaim_complete"],
        "finishing its reclaim (RECLAIM_COMPLETE)",
    ),
    (
        &["nfs4_do_reclaim", "nfs4_reclaim_open_state", "nfs4_open_reclaim", "nfs4_reclaim_locks"],
        "reclaiming open and lock state",
    ),
];

/// A task that waits for its client's state recovery to finish before it may send its call.
fn waits_for_recovery(frame: &str) -> bool {
    matches!(frame_name(frame), "nfs4_wait_clnt_recover" | "nfs4_client_recover_expired_lease")
}

/// The server a state manager thread works for: its name is `<server>-manager`, cut to the 15
/// characters of a task name, so only a name that still holds a whole address gives one.
fn managed_server(comm: &str) -> Option<String> {
    let server = comm.split_once("-manag")?.0;
    server.parse::<IpAddr>().ok().map(|a| a.to_string())
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use serde_json::Value;

    use super::*;
    use crate::{attribution::Attribution, incidents::signatures::tests::*, stuck::TaskState};

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

    /// Incident 3 as the sampler sees it: kubelet-mounted volumes (no pod namespace names the
    /// server, no RPC error seen), an init container's stat and a writer stuck, and the server's
    /// state manager stuck checking its lease.
    #[test]
    fn a_stuck_state_recovery_is_named_and_names_the_server() {
        let (init, app, host) = (
            pod("u1", "billing-0"),
            pod("u2", "orders-0"),
            Arc::new(Attribution { host: true, ..Default::default() }),
        );
        let rpc = ["rpc_wait_bit_killable", "__rpc_execute", "rpc_run_task"];
        let manager = [&rpc[..1], &["nfs4_proc_sequence", "nfs4_run_state_manager", "kthread"][..]].concat();
        let stat = [&rpc[..], &["nfs4_do_call_sync", "nfs4_proc_getattr", "vfs_statx"][..]].concat();
        let open =
            ["nfs4_wait_clnt_recover", "nfs4_client_recover_expired_lease", "nfs4_do_open", "path_openat"];
        let mut s = NfsNodeWideStall::new(&Settings::default());
        let mut stuck = stuck(&[
            sampled(10 * SEC, 300, "10.55.0.1-manag", &manager, 40, &host),
            sampled(11 * SEC, 301, "stat", &stat, 30, &init),
        ]);
        assert!(s.evaluate(12 * SEC, &node(&stuck)).is_empty(), "the state manager is not a second pod");
        stuck.report(&sampled(13 * SEC, 302, "python3", &open, 20, &app));
        let f = s.evaluate(14 * SEC, &node(&stuck));
        assert_eq!((f.len(), f[0].key.as_str()), (1, SERVER), "the server from the manager's name: {f:?}");
        let evidence = &f[0].evidence;
        assert_eq!(evidence["pods"], json!(["shop/billing-0", "shop/orders-0"]));
        assert_eq!(evidence["recovery"]["pid"], 300);
        assert_eq!(evidence["recovery"]["step"], "checking its lease (SEQUENCE: the server does not answer)");
        assert_eq!(evidence["recovery"]["wait_kind"], "killable");
        assert_eq!(evidence["waiting_on_recovery"], json!([302]));
        let pids: Vec<&Value> =
            evidence["stuck_tasks"].as_array().unwrap().iter().map(|t| &t["pid"]).collect();
        assert_eq!(pids, [&json!(301), &json!(302)], "the manager is the recovery, not a stuck pod task");
        assert!(
            f[0].summary.contains("state recovery (kernel thread 10.55.0.1-manag, pid 300)"),
            "{}",
            f[0].summary
        );
        // A name cut before the whole address names nothing.
        assert_eq!(managed_server("10.55.0.1-manag").as_deref(), Some(SERVER));
        assert_eq!(managed_server("192.168.100.20-"), None);
        assert_eq!(managed_server("kworker/u4:1"), None);
    }
}
