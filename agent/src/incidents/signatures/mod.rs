//! One module per signature, each with its own tests (the engine lists them), plus the wording
//! they share. Stuck tasks are not theirs: they read the one set (`stuck.rs`) when evaluated.

pub mod conntrack_table_full;
pub mod container_oom_loop;
pub mod cpu_soft_lockup;
pub mod kubelet_degraded;
pub mod memory_pressure;
pub mod network_policy_drops;
pub mod nfs_node_wide_stall;
pub mod nfs_server_unreachable;
pub mod nfs_sidecar_redirect;
pub mod nfs_slow;
pub mod pod_termination_blocked;
pub mod system_oom;

use crate::attribution::Attribution;

/// A signature's evidence as incidents carry it: each signature's own typed struct, serialized
/// here, where it leaves the signature.
pub fn evidence(typed: &impl serde::Serialize) -> serde_json::Value {
    // Plain structs of numbers, strings, lists and maps: serializing them cannot fail.
    serde_json::to_value(typed).expect("evidence serializes")
}

/// `namespace/pod`, or what is known instead.
pub fn pod_name(who: &Attribution) -> String {
    match (who.pod.is_empty(), &who.pod_uid) {
        (false, _) => format!("{}/{}", who.namespace, who.pod),
        (true, Some(uid)) => format!("pod {uid}"),
        (true, None) if who.host => "the host".to_string(),
        (true, None) => "an unattributed network namespace".to_string(),
    }
}

/// Whose a task is, in words: its pod, or for a node process its systemd unit.
pub fn task_owner(who: &Attribution) -> String {
    if who.host { who.unit.clone().unwrap_or_else(|| "host process".into()) } else { pod_name(who) }
}

/// How squeezed a pod or the node was before an OOM kill, from its memory pressure after it:
/// ` Before the kill its tasks waited for memory 35% of the last minute (12% of the last 5).`
pub fn squeezed_before(memory: &crate::pressure::Resource) -> String {
    if memory.some.avg60 < 1.0 {
        return String::new();
    }
    format!(
        " Before the kill its tasks waited for memory {:.0}% of the last minute ({:.0}% of the last 5).",
        memory.some.avg60, memory.some.avg300
    )
}

/// A duration in words: `45 s`, `12 min`, `20 h`.
pub fn human_secs(secs: u64) -> String {
    match secs {
        0..120 => format!("{secs} s"),
        120..7200 => format!("{} min", secs / 60),
        _ => format!("{} h", secs / 3600),
    }
}

#[cfg(test)]
pub(crate) mod tests {
    //! Event builders for the signatures' tests.

    use std::{net::IpAddr, sync::Arc};

    use crate::attribution::{NodeMemory, pods::KubeletLoad};
    use crate::{
        attribution::{Attributed, Attribution, Via},
        conntrack::Tables,
        events::{Event, Header, Payload},
        incidents::NodeView,
        kubelet,
        probes::{
            hung_task::HungTask,
            nfs::{Nfs, What},
            oom::{Invoker, OomKill, Scope},
            stuck_task::StuckTaskSample,
            tcp_reset::{Direction, TcpReset},
            wait::{WaitClass, WaitKind, classify},
        },
        stuck::StuckSet,
        symbols::Stack,
    };

    pub const SEC: u64 = 1_000_000_000;
    pub const MS: u64 = 1_000_000;
    pub const NETNS: u32 = 4026532999;
    pub const SERVER: &str = "10.55.0.1";

    pub fn pod(uid: &str, name: &str) -> Arc<Attribution> {
        Arc::new(Attribution {
            namespace: "shop".into(),
            pod: name.into(),
            workload: "Deployment/web".into(),
            container: "app".into(),
            pod_uid: Some(uid.into()),
            via: Via::Cgroup,
            ..Default::default()
        })
    }

    pub fn event(t: u64, pid: u32, comm: &str, payload: Payload, who: &Arc<Attribution>) -> Attributed {
        let event = Event {
            header: Header {
                probe: "test",
                time_unix_ns: t,
                tgid: pid,
                pid,
                comm: comm.into(),
                cgroup_id: 1,
                netns: NETNS,
            },
            payload,
        };
        Attributed { event, who: who.clone() }
    }

    /// A SYN to `SERVER:port` redirected to local port 15001 and reset (sent, no socket).
    pub fn redirected_reset(t: u64, port: u16, who: &Arc<Attribution>) -> Attributed {
        let server: IpAddr = SERVER.parse().unwrap();
        let local: IpAddr = "10.0.0.7".parse().unwrap();
        let reset = TcpReset {
            direction: Direction::Sent,
            hook: "tcp_send_reset",
            local_addr: server,
            local_port: 15001,
            remote_addr: local,
            remote_port: 871,
            original_dst_addr: Some(server),
            original_dst_port: Some(port),
            redirect_port: Some(15001),
            reason: Some("NO_SOCKET".into()),
            tcp_state: None,
            has_socket: false,
            unavailable: vec![],
        };
        event(t, 0, "swapper/1", Payload::TcpReset(reset), who)
    }

    pub fn nfs(t: u64, what: What, who: &Arc<Attribution>) -> Attributed {
        let n = Nfs {
            what,
            server_addr: Some(SERVER.parse().unwrap()),
            server_port: Some(2049),
            xid: Some(1),
            ntrans: Some(2),
            client_id: Some(0),
            owner_pid: Some(4242),
            timeout_ms: Some(60_000),
            program: Some("nfs".into()),
            procedure: Some("WRITE".into()),
            error: None,
            error_name: None,
        };
        event(t, 77, "kworker/u4:1", Payload::Nfs(n), who)
    }

    /// A stuck-task set holding what the reports say.
    pub fn stuck(reports: &[Attributed]) -> StuckSet {
        let mut set = StuckSet::default();
        for r in reports {
            set.report(r);
        }
        set
    }

    pub static NO_LOAD: KubeletLoad = KubeletLoad {
        image_pull: std::collections::BTreeMap::new(),
        terminating: Vec::new(),
        terminating_total: 0,
    };
    pub static NOT_CHECKED: kubelet::Health = kubelet::Health { healthz: None, tls: None };
    pub static NO_POD_IPS: std::sync::LazyLock<std::collections::HashMap<IpAddr, Arc<Attribution>>> =
        std::sync::LazyLock::new(Default::default);
    pub static NO_PRESSURE: crate::pressure::Sample = crate::pressure::Sample {
        sample: 0,
        at_unix_ns: 0,
        node: None,
        node_memory: None,
        pods: Vec::new(),
        pods_readable: true,
    };
    pub static NO_MOUNT_PORTS: std::collections::BTreeSet<u16> = std::collections::BTreeSet::new();
    pub static NO_CONNTRACK: Tables = Tables { sample: 0, at_unix_ns: 0, max: None, tables: Vec::new() };

    /// The node as the signatures see it when evaluated.
    pub fn node(stuck: &StuckSet) -> NodeView<'_> {
        NodeView {
            stuck,
            memory: NodeMemory::default(),
            kubelet_load: &NO_LOAD,
            kubelet: &NOT_CHECKED,
            conntrack: &NO_CONNTRACK,
            pod_ips: &NO_POD_IPS,
            nfs_mount_ports: &NO_MOUNT_PORTS,
            pressure: &NO_PRESSURE,
        }
    }

    pub fn hung(t: u64, tid: u32, wait: WaitClass, blocked: u64, who: &Arc<Attribution>) -> Attributed {
        let h = HungTask {
            blocked_secs: Some(blocked),
            wait,
            stack: Stack::from_names(&[
                "folio_wait_writeback",
                "nfs_wb_all",
                "nfs4_file_flush",
                "filp_close",
                "do_exit",
            ]),
            blocker: None,
            exiting: true,
        };
        event(t, tid, "java", Payload::HungTask(h), who)
    }

    /// A sampler's report of task `tid` named `comm`, asleep (killable) in `stack` for `blocked` s.
    pub fn sampled(
        t: u64,
        tid: u32,
        comm: &str,
        stack: &[&str],
        blocked: u64,
        who: &Arc<Attribution>,
    ) -> Attributed {
        let names: Vec<&str> = stack.to_vec();
        let s = StuckTaskSample {
            blocked_secs: blocked,
            wakeups: 0,
            wait: classify(names.iter().copied()),
            wait_kind: WaitKind::Killable,
            stack: Stack::from_names(&names),
            exiting: false,
        };
        event(t, tid, comm, Payload::StuckTask(s), who)
    }

    pub fn oom(
        t: u64,
        pid: u32,
        comm: &str,
        scope: Scope,
        critical: bool,
        who: &Arc<Attribution>,
    ) -> Attributed {
        let k = OomKill {
            scope,
            critical,
            victim_pid_only: false,
            anon_rss_bytes: Some(300 << 20),
            file_rss_bytes: Some(1 << 20),
            shmem_rss_bytes: Some(0),
            total_vm_bytes: Some(900 << 20),
            oom_score_adj: Some(-997),
            oom_cgroup_id: None,
            totalpages_bytes: None,
            victim_memcg: None,
            invoker: Invoker { pid: 1, tgid: 1, comm: "python3".into(), cgroup_id: 1 },
            invoker_stack: Stack::from_names(&["oom_kill_process", "out_of_memory"]),
        };
        event(t, pid, comm, Payload::OomKill(k), who)
    }
}
