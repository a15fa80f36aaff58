//! `cpu-soft-lockup` (issue 38): a CPU the kernel's soft-lockup watchdog (or RCU's stall
//! detector) found stuck in the kernel — a task spinning there with preemption off. The NFS client
//! can livelock so (`nfs_lock_and_join_requests`, leptonai/gpud #1245): no task is in D state,
//! khungtaskd and the stuck-task sampler stay silent, and the node stays Ready for days while the
//! CPU is lost and the kernel logs a soft lockup every 2 × `kernel.watchdog_thresh`. The
//! incident names the CPU, the task and its pod, and the stack it spins in; it is worded for the
//! NFS client when the stack is in it. One incident per CPU, firing at the first report and for
//! `--cpu-lockup-hold` after the last (the kernel repeats its report while the CPU stays stuck).
//!
//! What healthy traffic looks like to it: nothing. The watchdog reports a CPU that ran no other
//! task for 20 s (by default); a healthy kernel never does.

use std::collections::{BTreeMap, BTreeSet};

use serde::Serialize;

use super::{evidence, human_secs, task_owner};
use crate::{
    attribution::{Attributed, Attribution},
    events::Payload,
    incidents::{Finding, NodeView, Remediation, Settings, Severity, Signature, Step, ns},
    probes::{
        cpu_lockup::{CpuLockup, Detector},
        wait::WaitClass,
    },
};

pub const NAME: &str = "cpu-soft-lockup";
/// Frames of the stack kept in the evidence: where it spins and how it got there.
const STACK_FRAMES: usize = 16;
/// CPUs tracked at most (a machine has fewer; a corrupt record cannot grow the map).
const MAX_CPUS: usize = 4096;

pub struct CpuSoftLockup {
    hold: u64,
    cpus: BTreeMap<u32, StuckCpu>,
    evicted: u64,
}

/// One CPU's reports.
struct StuckCpu {
    first_unix_ns: u64,
    last_unix_ns: u64,
    reports: u64,
    detectors: BTreeSet<Detector>,
    /// The latest report that knew the task (RCU's reports of another CPU do not).
    task: Option<Task>,
}

#[derive(Debug, Clone, Serialize)]
struct Task {
    comm: String,
    pid: u32,
    tgid: u32,
    pod: String,
    wait: WaitClass,
    stack: Vec<String>,
    #[serde(skip)]
    who: std::sync::Arc<Attribution>,
}

impl CpuSoftLockup {
    pub fn new(settings: &Settings) -> Self {
        Self { hold: ns(settings.cpu_lockup_hold), cpus: BTreeMap::new(), evicted: 0 }
    }
}

impl Signature for CpuSoftLockup {
    fn name(&self) -> &'static str {
        NAME
    }

    fn observe(&mut self, attributed: &Attributed) {
        let event = &attributed.event;
        let Payload::CpuLockup(lockup) = &event.payload else { return };
        if !self.cpus.contains_key(&lockup.cpu) && self.cpus.len() >= MAX_CPUS {
            self.evicted += 1;
            return;
        }
        let t = event.header.time_unix_ns;
        let cpu = self.cpus.entry(lockup.cpu).or_insert_with(|| StuckCpu {
            first_unix_ns: t,
            last_unix_ns: t,
            reports: 0,
            detectors: BTreeSet::new(),
            task: None,
        });
        cpu.first_unix_ns = cpu.first_unix_ns.min(t);
        cpu.last_unix_ns = cpu.last_unix_ns.max(t);
        cpu.reports += 1;
        cpu.detectors.insert(lockup.detector);
        if lockup.task_known {
            cpu.task = Some(task_of(attributed, lockup));
        }
    }

    fn evaluate(&mut self, now: u64, _: &NodeView) -> Vec<Finding> {
        self.cpus.retain(|_, c| now.saturating_sub(c.last_unix_ns) <= self.hold);
        self.cpus.iter().map(|(cpu, c)| finding(*cpu, c)).collect()
    }

    fn evicted(&self) -> u64 {
        self.evicted
    }
}

fn task_of(attributed: &Attributed, lockup: &CpuLockup) -> Task {
    let header = &attributed.event.header;
    let who = attributed.who.clone();
    Task {
        comm: header.comm.clone(),
        pid: header.pid,
        tgid: header.tgid,
        pod: task_owner(&who),
        wait: lockup.wait,
        stack: lockup.stack.texts().take(STACK_FRAMES).collect(),
        who,
    }
}

fn finding(cpu: u32, c: &StuckCpu) -> Finding {
    let span = human_secs(c.last_unix_ns.saturating_sub(c.first_unix_ns) / 1_000_000_000);
    let detectors: Vec<&str> = c.detectors.iter().map(|d| d.describe()).collect();
    let reported = format!("{} reported it {} time(s) over {span}", detectors.join(" and "), c.reports);
    let in_nfs = c.task.as_ref().is_some_and(|t| t.wait == WaitClass::Nfs);
    let summary = match &c.task {
        Some(t) if in_nfs => format!(
            "CPU {cpu} is spinning in the NFS client at {}: {} (pid {}) of {} has held it ({reported}). \
             No task is in D state, so hung-task alerts stay silent and the node stays Ready while the CPU \
             is lost; the NFS client does not recover by itself: drain and reboot the node.",
            t.stack.first().map_or("?", String::as_str),
            t.comm,
            t.pid,
            t.pod,
        ),
        Some(t) => format!(
            "CPU {cpu} is stuck in the kernel at {}: {} (pid {}) of {} has held it ({reported}).",
            t.stack.first().map_or("?", String::as_str),
            t.comm,
            t.pid,
            t.pod,
        ),
        None => format!("CPU {cpu} is stuck in the kernel ({reported} from another CPU; its task unknown)."),
    };
    let mut permanent = vec![
        "Send the stack to whoever owns the code it spins in (the kernel's or a module's maintainers, \
         the node image's vendor): a soft lockup is a kernel bug or a driver's."
            .to_string(),
        "To have such a node leave the pool by itself, set kernel.softlockup_panic=1 with a panic reboot \
         (kernel.panic=10): the watchdog then reboots it instead of logging."
            .to_string(),
    ];
    if in_nfs {
        permanent.insert(
            0,
            "Update the node's kernel: NFS client livelocks in page-request locking \
             (nfs_lock_and_join_requests) are kernel bugs fixed in later stable releases; until then, \
             avoid the workload's pattern (many writers to one file over NFS) or mount with a smaller \
             wsize."
                .to_string(),
        );
    }
    Finding {
        key: format!("cpu{cpu}"),
        severity: Severity::Critical,
        who: c.task.as_ref().map(|t| t.who.clone()).unwrap_or_default(),
        first_seen_unix_ns: c.first_unix_ns,
        last_seen_unix_ns: c.last_unix_ns,
        summary,
        evidence: evidence(&Evidence {
            cpu,
            detectors: c.detectors.iter().map(|d| d.as_str()).collect(),
            reports: c.reports,
            task: c.task.as_ref(),
            in_nfs_client: in_nfs,
        }),
        remediation: Remediation {
            permanent,
            break_glass: vec![
                Step::new(
                    "Stop new pods landing here and move the others: the stuck CPU does not come back by itself.",
                    Some("kubectl cordon <node> && kubectl drain <node> --ignore-daemonsets --delete-emptydir-data".into()),
                ),
                Step::new("Reboot the node once it is drained.", Some("systemctl reboot".into())),
            ],
        },
    }
}

#[derive(Serialize)]
struct Evidence<'a> {
    cpu: u32,
    detectors: Vec<&'static str>,
    reports: u64,
    /// What the CPU was running, from the latest report made on it.
    task: Option<&'a Task>,
    in_nfs_client: bool,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{incidents::signatures::tests::*, probes::wait::classify, stuck::StuckSet, symbols::Stack};

    fn lockup(
        t: u64,
        cpu: u32,
        detector: Detector,
        stack: &[&str],
        who: &std::sync::Arc<Attribution>,
    ) -> Attributed {
        let l = CpuLockup {
            detector,
            cpu,
            task_known: !stack.is_empty(),
            wait: classify(stack.iter().copied()),
            stack: Stack::from_names(stack),
        };
        event(t, 4242, "writer", Payload::CpuLockup(l), who)
    }

    const NFS_SPIN: &[&str] =
        &["nfs_lock_and_join_requests", "nfs_page_async_flush", "nfs_writepages", "do_writepages"];

    #[test]
    fn a_cpu_spinning_in_the_nfs_client_names_its_pod_and_says_drain() {
        let web = pod("u1", "web-1");
        let mut s = CpuSoftLockup::new(&Settings::default());
        let stuck = StuckSet::default();
        assert!(s.evaluate(SEC, &node(&stuck)).is_empty(), "a healthy node: nothing");
        s.observe(&lockup(10 * SEC, 3, Detector::SoftLockup, NFS_SPIN, &web));
        s.observe(&lockup(32 * SEC, 3, Detector::SoftLockup, NFS_SPIN, &web));
        // RCU's report of the same CPU from another one adds a detector, not an incident.
        s.observe(&lockup(33 * SEC, 3, Detector::RcuStall, &[], &Default::default()));
        let f = s.evaluate(34 * SEC, &node(&stuck));
        assert_eq!(f.len(), 1);
        let f = &f[0];
        assert_eq!((f.key.as_str(), f.severity, f.who.pod.as_str()), ("cpu3", Severity::Critical, "web-1"));
        assert!(
            f.summary.starts_with("CPU 3 is spinning in the NFS client at nfs_lock_and_join_requests+0x10"),
            "{}",
            f.summary
        );
        assert!(f.summary.contains("writer (pid 4242) of shop/web-1"), "{}", f.summary);
        assert!(
            f.summary.contains("soft lockup and RCU stall reported it 3 time(s) over 23 s"),
            "{}",
            f.summary
        );
        assert_eq!(f.evidence["task"]["stack"][0], "nfs_lock_and_join_requests+0x10");
        assert_eq!(f.evidence["detectors"], serde_json::json!(["soft_lockup", "rcu_stall"]));
        assert_eq!(f.evidence["in_nfs_client"], true);
        assert!(f.remediation.break_glass[0].command.as_deref().unwrap().starts_with("kubectl cordon"));
        assert!(f.remediation.permanent[0].contains("nfs_lock_and_join_requests"));
        // Held after the last report, then resolved.
        let hold = ns(Settings::default().cpu_lockup_hold);
        assert_eq!(s.evaluate(33 * SEC + hold, &node(&stuck)).len(), 1);
        assert!(s.evaluate(33 * SEC + hold + SEC, &node(&stuck)).is_empty());
    }

    #[test]
    fn a_lockup_elsewhere_is_worded_for_the_kernel_and_a_cpu_without_its_task_is_still_named() {
        let web = pod("u1", "web-1");
        let mut s = CpuSoftLockup::new(&Settings::default());
        let stuck = StuckSet::default();
        s.observe(&lockup(
            SEC,
            0,
            Detector::SoftLockup,
            &["kstall_spin", "param_attr_store", "kernfs_fop_write_iter"],
            &web,
        ));
        s.observe(&lockup(SEC, 1, Detector::RcuStall, &[], &Default::default()));
        let f = s.evaluate(2 * SEC, &node(&stuck));
        assert_eq!(f.len(), 2);
        assert!(
            f[0].summary.starts_with("CPU 0 is stuck in the kernel at kstall_spin+0x10"),
            "{}",
            f[0].summary
        );
        assert!(!f[0].remediation.permanent[0].contains("NFS"));
        assert_eq!(
            f[1].summary,
            "CPU 1 is stuck in the kernel (RCU stall reported it 1 time(s) over 0 s from another CPU; its task unknown)."
        );
        assert_eq!(f[1].evidence["task"], serde_json::Value::Null);
    }
}
