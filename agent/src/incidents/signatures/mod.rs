//! One module per signature, each with its own tests, plus what several of them share: the set of
//! tasks hung right now.

pub mod container_oom_loop;
pub mod nfs_node_wide_stall;
pub mod nfs_server_unreachable;
pub mod nfs_sidecar_redirect;
pub mod pod_termination_blocked;
pub mod system_oom;

use std::{collections::HashMap, sync::Arc};

use serde::Serialize;

use super::{Settings, Signature};
use crate::{
    attribution::Attribution,
    events::{Event, Payload},
    probes::hung_task::WaitClass,
};

/// Every signature, configured.
pub fn all(settings: &Settings) -> Vec<Box<dyn Signature>> {
    vec![
        Box::new(nfs_sidecar_redirect::NfsSidecarRedirect::new(settings)),
        Box::new(nfs_server_unreachable::NfsServerUnreachable::new(settings)),
        Box::new(nfs_node_wide_stall::NfsNodeWideStall::new(settings)),
        Box::new(pod_termination_blocked::PodTerminationBlocked::new(settings)),
        Box::new(system_oom::SystemOom::new(settings)),
        Box::new(container_oom_loop::ContainerOomLoop::new(settings)),
    ]
}

/// Frames of a stuck task's stack kept as evidence.
const STACK_FRAMES: usize = 16;
/// Hung tasks tracked at most (the hung-task tracker has the same bound).
const MAX_STUCK: usize = 10_000;

/// A task the kernel's hung-task detector reported, until it is cleared.
#[derive(Debug, Clone, Serialize)]
pub struct StuckTask {
    pub pid: u32,
    pub tid: u32,
    pub comm: String,
    pub wait: WaitClass,
    /// Blocked time as last reported, plus the time since then.
    pub blocked_secs: u64,
    pub exiting: bool,
    pub stack: Vec<String>,
    #[serde(skip)]
    pub who: Arc<Attribution>,
    #[serde(skip)]
    reported_unix_ns: u64,
    #[serde(skip)]
    reported_blocked_secs: u64,
}

/// Hung tasks now, by tid.
#[derive(Default)]
pub struct StuckTasks {
    tasks: HashMap<u32, StuckTask>,
}

impl StuckTasks {
    pub fn observe(&mut self, event: &Event) {
        match &event.payload {
            Payload::HungTask(hung)
                if self.tasks.len() < MAX_STUCK || self.tasks.contains_key(&event.header.pid) =>
            {
                let blocked = hung.blocked_secs.unwrap_or(0);
                self.tasks.insert(
                    event.header.pid,
                    StuckTask {
                        pid: event.header.tgid,
                        tid: event.header.pid,
                        comm: event.header.comm.clone(),
                        wait: hung.wait,
                        blocked_secs: blocked,
                        exiting: hung.exiting,
                        stack: hung.stack.texts().take(STACK_FRAMES).collect(),
                        who: event.attribution.clone().unwrap_or_default(),
                        reported_unix_ns: event.header.time_unix_ns,
                        reported_blocked_secs: blocked,
                    },
                );
            }
            Payload::HungTaskCleared(_) => {
                self.tasks.remove(&event.header.pid);
            }
            _ => {}
        }
    }

    /// The tasks of pod `uid`, blocked times brought up to `now`.
    pub fn of_pod(&self, uid: &str, now_unix_ns: u64) -> Vec<StuckTask> {
        self.all(now_unix_ns).into_iter().filter(|t| t.who.pod_uid.as_deref() == Some(uid)).collect()
    }

    /// Every stuck task, blocked times brought up to `now`, longest first.
    pub fn all(&self, now_unix_ns: u64) -> Vec<StuckTask> {
        let mut all: Vec<StuckTask> = self
            .tasks
            .values()
            .map(|t| {
                let mut t = t.clone();
                t.blocked_secs =
                    t.reported_blocked_secs + now_unix_ns.saturating_sub(t.reported_unix_ns) / 1_000_000_000;
                t
            })
            .collect();
        all.sort_by(|a, b| b.blocked_secs.cmp(&a.blocked_secs).then(a.tid.cmp(&b.tid)));
        all
    }
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

    use crate::{
        attribution::{Attribution, Via},
        events::{Event, Header, Payload},
        hung_tasks::HungTaskCleared,
        probes::{
            hung_task::{HungTask, WaitClass},
            nfs::{Nfs, What},
            oom::{Invoker, OomKill, Scope},
            tcp_reset::{Direction, TcpReset},
        },
        symbols::Stack,
    };

    pub const SEC: u64 = 1_000_000_000;
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

    fn event(t: u64, pid: u32, comm: &str, payload: Payload, who: &Arc<Attribution>) -> Event {
        Event {
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
            attribution: Some(who.clone()),
        }
    }

    /// A SYN to `SERVER:port` redirected to local port 15001 and reset (sent, no socket).
    pub fn redirected_reset(t: u64, port: u16, who: &Arc<Attribution>) -> Event {
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
        };
        event(t, 0, "swapper/1", Payload::TcpReset(reset), who)
    }

    pub fn nfs(t: u64, what: What, who: &Arc<Attribution>) -> Event {
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

    pub fn hung(t: u64, tid: u32, wait: WaitClass, blocked: u64, who: &Arc<Attribution>) -> Event {
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

    pub fn cleared(t: u64, tid: u32, who: &Arc<Attribution>) -> Event {
        let c = HungTaskCleared { wait: WaitClass::Nfs, blocked_secs: Some(1), why: "left_d_state" };
        event(t, tid, "java", Payload::HungTaskCleared(c), who)
    }

    pub fn oom(t: u64, pid: u32, comm: &str, scope: Scope, critical: bool, who: &Arc<Attribution>) -> Event {
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
            invoker: Invoker { pid: 1, tgid: 1, comm: "python3".into(), cgroup_id: 1 },
            invoker_stack: Stack::from_names(&["oom_kill_process", "out_of_memory"]),
        };
        event(t, pid, comm, Payload::OomKill(k), who)
    }
}
