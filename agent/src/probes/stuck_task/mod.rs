//! The D-state sampler. Kernel half: `ebpf/src/probes/stuck_task.rs`; event:
//! `common/src/stuck_task.rs`.
//!
//! The kernel's hung-task detector skips killable sleeps (a hard NFS mount's RPC waits, its state
//! recovery, many `mount` and `stat` calls), reports only after `hung_task_timeout_secs`, not at
//! all when that is 0, and at most `hung_task_warnings` tasks a boot. The sampler sees them all: a
//! task iterator the agent reads every `interval` reports each task asleep uninterruptibly, plain
//! or killable, whose switch count has not moved for `threshold`. Its records go through the ring
//! buffer like every probe's; each read is a sweep whose kernel CPU time is measured here.

pub mod event;

pub use event::*;

use std::{
    fs::File,
    io::Read,
    os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd},
    time::Duration,
};

use aya::{
    Ebpf,
    maps::{Array, MapData},
    programs::Iter,
};
use kstall_common::stuck_task::{
    AsleepTask, FLAG_EXITING, FLAG_NO_NSPROXY, PF_FROZEN, StuckTaskConfig, StuckTaskEvent, SweepStats,
    TASK_WAKEKILL,
};
use kstall_common::{EventHeader, kind};

pub use super::settings::StuckTask as Settings;
use super::{
    error::ProbeError,
    kind::EventKind,
    payload::Payload,
    plan::{Plan, ProbeStatus, ProgramSpec},
    probe::{Completion, Decoding, Planned, Probe, Sweep, TaskSweeps},
    wait::{WaitKind, classify},
};
use crate::{
    decode::{DecodeError, read_versioned},
    kernel_btf::KernelBtf,
    symbols::Symbols,
};

pub const NAME: &str = "stuck-task";
const GLOBAL: &str = "STUCK_TASK_CONFIG";
pub const PROGRAM: &str = "stuck_task_sweep";
const PROG: ProgramSpec = ProgramSpec::task_iter(PROGRAM);
const SWEEP_MAP: &str = "SWEEP";

pub fn plan(vmlinux: &KernelBtf, settings: &Settings) -> Result<Plan, ProbeError> {
    if !vmlinux.has_field("bpf_iter__task", "task") {
        return Err(
            "this kernel has no task iterator (struct bpf_iter__task missing from its BTF; needs 5.8+)"
                .into(),
        );
    }
    // `state` became `__state` in 5.14. Frozen tasks: TASK_FROZEN in the state from 6.1, PF_FROZEN
    // in the flags before. Kernels 5.14 to 6.0 have `__state` and PF_FROZEN: a task frozen there
    // (suspend, the v1 freezer) would be reported; kubelet freezes nothing.
    let (task_state, pf_frozen) = match vmlinux.offset_of("task_struct", "__state") {
        Ok(off) => (off, 0),
        Err(_) => (vmlinux.offset_of("task_struct", "state")?, PF_FROZEN),
    };
    let cfg = StuckTaskConfig {
        valid: 1,
        pf_frozen,
        task: super::task::resolve(vmlinux)?,
        task_state,
        task_flags: vmlinux.offset_of("task_struct", "flags")?,
        task_nvcsw: vmlinux.offset_of("task_struct", "nvcsw")?,
        task_nivcsw: vmlinux.offset_of("task_struct", "nivcsw")?,
        task_start_time: vmlinux.offset_of("task_struct", "start_time")?,
        max_reports: settings.max_reports,
        threshold_ns: u64::try_from(settings.threshold.as_nanos()).unwrap_or(u64::MAX),
    };
    let notes = vec![format!(
        "sweeps every {}s; reports tasks asleep uninterruptibly (plain or killable) and not run for {}s, at most {} a sweep",
        settings.interval.as_secs(),
        settings.threshold.as_secs(),
        settings.max_reports
    )];
    Ok(Plan {
        config: Some((GLOBAL, crate::decode::bytes_of(&cfg))),
        programs: vec![PROG],
        hook: "iter/task (read by the agent every sweep)".into(),
        notes,
        unavailable: Vec::new(),
        fallback: None,
    })
}

pub fn decode(ev: &StuckTaskEvent, symbols: &Symbols) -> Result<StuckTaskSample, DecodeError> {
    let stack = symbols.kernel_stack(&ev.stack, ev.stack_bytes);
    Ok(StuckTaskSample {
        blocked_secs: ev.header.timestamp_ns.saturating_sub(ev.blocked_since_ns) / 1_000_000_000,
        wakeups: ev.wakeups,
        wait: classify(stack.names()),
        wait_kind: if ev.state & TASK_WAKEKILL != 0 { WaitKind::Killable } else { WaitKind::Uninterruptible },
        stack,
        exiting: ev.flags & (FLAG_EXITING | FLAG_NO_NSPROXY) != 0,
    })
}

/// Links the loaded iterator once the object is loaded; its sweeps are then the agent's to run.
struct Linking {
    interval: Duration,
    sampler: Option<Sampler>,
}

impl Completion for Linking {
    fn on_load(&mut self, ebpf: &mut Ebpf, status: &mut ProbeStatus) {
        if !status.up {
            return;
        }
        match Sampler::new(ebpf, self.interval) {
            Ok(sampler) => self.sampler = Some(sampler),
            Err(e) => {
                *status = ProbeStatus {
                    notes: std::mem::take(&mut status.notes),
                    unavailable: std::mem::take(&mut status.unavailable),
                    ..ProbeStatus::down(NAME, e)
                };
            }
        }
    }

    fn waiting(&self) -> bool {
        false
    }

    fn on_modules(&mut self, _: &mut Ebpf, _: &mut ProbeStatus) -> bool {
        false
    }

    fn take_task_sweeps(&mut self) -> Option<Box<dyn TaskSweeps>> {
        self.sampler.take().map(|sampler| Box::new(sampler) as Box<dyn TaskSweeps>)
    }
}

/// The loaded iterator: a link to it (each sweep opens a new iterator from the link) and the
/// sweep counters. Owned by the sweep loop.
struct Sampler {
    link: OwnedFd,
    stats: Array<MapData, SweepStats>,
    last: SweepStats,
    interval: Duration,
}

impl Sampler {
    /// Links the loaded program (aya's iterator links open only one iterator each, hence the two
    /// `bpf()` calls made here) and takes its counters.
    fn new(ebpf: &mut Ebpf, interval: Duration) -> Result<Self, String> {
        let program: &mut Iter = ebpf
            .program_mut(PROGRAM)
            .ok_or_else(|| format!("program {PROGRAM} missing from the eBPF object"))?
            .try_into()
            .map_err(|e| format!("program {PROGRAM}: {e}"))?;
        let program_fd = program.fd().map_err(|e| format!("program {PROGRAM}: {e}"))?;
        let link = link_create_iter(program_fd.as_fd().as_raw_fd())
            .map_err(|e| format!("iter/task ({PROGRAM}): link: {e}"))?;
        let stats = ebpf
            .take_map(SWEEP_MAP)
            .ok_or_else(|| format!("map {SWEEP_MAP} missing from the eBPF object"))
            .and_then(|m| Array::try_from(m).map_err(|e| format!("map {SWEEP_MAP}: {e}")))?;
        Ok(Self { link, stats, last: SweepStats::default(), interval })
    }
}

impl TaskSweeps for Sampler {
    fn interval(&self) -> Duration {
        self.interval
    }

    fn sweep(&mut self) -> Result<Sweep, String> {
        // The per-sweep report count starts at 0 (no sweep runs meanwhile: this one is the only).
        let start = SweepStats { this_sweep: 0, sweep: self.last.sweep.wrapping_add(1), ..self.last };
        self.stats.set(0, start, 0).map_err(|e| format!("resetting the sweep counters: {e}"))?;
        let iter =
            iter_create(self.link.as_raw_fd()).map_err(|e| format!("opening the task iterator: {e}"))?;
        let mut file = File::from(iter);
        let started = thread_cpu_time();
        // The program writes one record per task asleep; the reads walk every task.
        let mut out = Vec::new();
        file.read_to_end(&mut out).map_err(|e| format!("reading the task iterator: {e}"))?;
        let kernel_cpu = thread_cpu_time().saturating_sub(started);
        let asleep = asleep_tasks(&out)?;
        let now = self.stats.get(&0, 0).map_err(|e| format!("reading the sweep counters: {e}"))?;
        let sweep = Sweep {
            tasks: now.walked.wrapping_sub(self.last.walked),
            uninterruptible: now.uninterruptible.wrapping_sub(self.last.uninterruptible),
            reported: now.reported.wrapping_sub(self.last.reported),
            over_limit: now.over_limit.wrapping_sub(self.last.over_limit),
            kernel_cpu,
            asleep,
        };
        self.last = now;
        Ok(sweep)
    }
}

/// The iterator's output: one [`AsleepTask`] per task asleep.
fn asleep_tasks(out: &[u8]) -> Result<Vec<(u32, u32)>, String> {
    let size = size_of::<AsleepTask>();
    if !out.len().is_multiple_of(size) {
        return Err(format!("the task iterator wrote {} bytes, not whole records of {size}", out.len()));
    }
    out.chunks_exact(size)
        .map(|record| {
            crate::decode::read_record::<AsleepTask>(record, "asleep task")
                .map(|t| (t.tgid, t.tid))
                .map_err(|e| e.to_string())
        })
        .collect()
}

/// `BPF_LINK_CREATE` of an iterator program, without iterator arguments (every task).
fn link_create_iter(program_fd: i32) -> std::io::Result<OwnedFd> {
    const BPF_LINK_CREATE: libc::c_long = 28;
    const BPF_TRACE_ITER: u32 = 28;
    // union bpf_attr's link_create: prog_fd, target_fd, attach_type, flags.
    let attr: [u32; 4] = [program_fd as u32, 0, BPF_TRACE_ITER, 0];
    bpf(BPF_LINK_CREATE, &attr)
}

/// `BPF_ITER_CREATE`: a new iterator (a readable fd) from an iterator link.
fn iter_create(link_fd: i32) -> std::io::Result<OwnedFd> {
    const BPF_ITER_CREATE: libc::c_long = 33;
    // union bpf_attr's iter_create: link_fd, flags.
    let attr: [u32; 2] = [link_fd as u32, 0];
    bpf(BPF_ITER_CREATE, &attr)
}

fn bpf<const N: usize>(cmd: libc::c_long, attr: &[u32; N]) -> std::io::Result<OwnedFd> {
    // SAFETY: `attr` is the leading part of union bpf_attr for `cmd`, its size passed with it (the
    // kernel zero-fills the rest); both commands return a new file descriptor or -1.
    let fd = unsafe { libc::syscall(libc::SYS_bpf, cmd, attr.as_ptr(), size_of_val(attr)) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: a new descriptor nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

fn thread_cpu_time() -> Duration {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: a valid timespec to fill; this clock always exists on Linux.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

/// The probe, as the registry lists it.
pub struct StuckTaskProbe;

impl Probe for StuckTaskProbe {
    fn name(&self) -> &'static str {
        NAME
    }

    fn record_kind(&self) -> u32 {
        kind::STUCK_TASK
    }

    fn events(&self) -> &'static [EventKind] {
        &[STUCK, super::cleared::CLEARED]
    }

    fn plan(
        &self,
        vmlinux: &KernelBtf,
        settings: &super::settings::Settings,
        _: &mut Decoding,
    ) -> Result<Planned, ProbeError> {
        let programs = plan(vmlinux, &settings.stuck_task)?;
        let linking = Linking { interval: settings.stuck_task.interval, sampler: None };
        Ok(Planned { programs: Some(programs), completion: Some(Box::new(linking)) })
    }

    fn decode(
        &self,
        header: &EventHeader,
        record: &[u8],
        decoding: &Decoding,
    ) -> Result<Payload, DecodeError> {
        let raw: StuckTaskEvent =
            read_versioned(header, record, kstall_common::stuck_task::VERSION, "stuck_task event")?;
        Ok(Payload::StuckTask(decode(&raw, &decoding.symbols)?))
    }

    #[cfg(test)]
    fn samples(&self) -> Vec<Payload> {
        let raw = tests::event(kstall_common::stuck_task::TASK_UNINTERRUPTIBLE | TASK_WAKEKILL, &[1]);
        vec![
            Payload::StuckTask(decode(&raw, &Symbols::default()).expect("sample")),
            super::cleared::tests::cleared(),
        ]
    }
}

#[cfg(test)]
mod tests {
    use crate::probes::wait::WaitClass;
    use kstall_common::EventHeader;

    use kstall_common::stuck_task::TASK_UNINTERRUPTIBLE;

    use super::*;
    use crate::{kernel_btf::tests::kernel, symbols::SymbolTable};

    pub(super) fn event(state: u32, stack: &[u64]) -> StuckTaskEvent {
        let mut header = EventHeader::zeroed();
        header.kind = kind::STUCK_TASK;
        header.version = kstall_common::stuck_task::VERSION;
        header.timestamp_ns = 500 * 1_000_000_000;
        let mut ev = StuckTaskEvent {
            header,
            blocked_since_ns: 455 * 1_000_000_000,
            state,
            flags: 0,
            switches: 12,
            wakeups: 3,
            stack_bytes: (stack.len() * 8) as i64,
            stack: [0; kstall_common::stuck_task::STACK_DEPTH],
        };
        ev.stack[..stack.len()].copy_from_slice(stack);
        ev
    }

    #[test]
    fn decodes_kind_wait_and_blocked_time() {
        let symbols = Symbols::from_table(SymbolTable::parse(
            "ffffffff81100000 T folio_wait_bit_common\nffffffff81200000 T filemap_read\n\
             ffffffffc0a00000 t rpc_wait_bit_killable\t[sunrpc]\n",
        ));
        // The killable read of this host's recipe (state 0x102).
        let read = event(TASK_UNINTERRUPTIBLE | TASK_WAKEKILL, &[0xffffffff81100010, 0xffffffff81200020]);
        let sample = decode(&read, &symbols).unwrap();
        assert_eq!(
            (sample.wait_kind, sample.blocked_secs, sample.wakeups, sample.exiting),
            (WaitKind::Killable, 45, 3, false)
        );
        assert_eq!(
            sample.stack.texts().collect::<Vec<_>>(),
            ["folio_wait_bit_common+0x10", "filemap_read+0x20"]
        );
        let rpc = event(TASK_UNINTERRUPTIBLE | TASK_WAKEKILL, &[0xffffffffc0a00008]);
        assert_eq!(decode(&rpc, &symbols).unwrap().wait, WaitClass::Nfs);
        let mut writer = event(TASK_UNINTERRUPTIBLE, &[]);
        writer.flags = FLAG_EXITING;
        let sample = decode(&writer, &symbols).unwrap();
        assert_eq!((sample.wait_kind, sample.exiting), (WaitKind::Uninterruptible, true));
        // A since after the sweep (a corrupt record) is not a huge blocked time.
        writer.blocked_since_ns = u64::MAX;
        assert_eq!(decode(&writer, &symbols).unwrap().blocked_secs, 0);
    }

    #[test]
    fn the_iterator_output_is_whole_records() {
        let mut out = Vec::new();
        for t in [AsleepTask { tgid: 10, tid: 11 }, AsleepTask { tgid: 20, tid: 20 }] {
            out.extend(crate::decode::bytes_of(&t));
        }
        assert_eq!(asleep_tasks(&out), Ok(vec![(10, 11), (20, 20)]));
        assert_eq!(asleep_tasks(&[]), Ok(vec![]));
        assert!(asleep_tasks(&out[..12]).unwrap_err().contains("not whole records of 8"));
    }

    #[test]
    fn plans_on_every_kernel() {
        for k in ["6.1", "6.12", "6.18"] {
            let plan = plan(&kernel(k), &Settings::default()).unwrap();
            let cfg: StuckTaskConfig =
                crate::decode::read_record(&plan.config.as_ref().unwrap().1, "config").unwrap();
            assert_eq!(cfg.pf_frozen, 0, "{k}: frozen is a state from 6.1");
            assert_eq!((cfg.threshold_ns, cfg.max_reports), (30_000_000_000, 1000), "{k}");
            assert!(cfg.task_nivcsw > cfg.task_nvcsw, "{k}");
        }
    }

    #[test]
    fn settings_bounds() {
        assert!(Settings::interval(Duration::from_millis(500), "500ms").is_err());
        assert!(Settings::interval(Duration::from_secs(7200), "2h").is_err());
        assert!(Settings::threshold(Duration::ZERO, "0").is_err());
        assert_eq!(Settings::max_reports(Some(50), "50"), Ok(50));
        assert!(Settings::max_reports(Some(0), "0").unwrap_err().contains("between 1 and 100000"));
        assert!(Settings::max_reports(None, "x").is_err());
    }
}
