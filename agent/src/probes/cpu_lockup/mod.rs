//! Stuck CPUs: soft lockups and RCU stalls, as the kernel's own detectors report them. Kernel
//! half: `ebpf/src/probes/cpu_lockup.rs`; event: `common/src/cpu_lockup.rs`.
//!
//! A task spinning in the kernel (an NFS client looping in `nfs_lock_and_join_requests`) is
//! never in D state: the hung-task detector and the stuck-task sampler cannot see it. The
//! kernel's watchdog can, and reports it on the stuck CPU from its timer interrupt: the task is
//! `current` there, and its stack is under the interrupt's.

pub mod event;

pub use event::*;

use kstall_common::{
    EventHeader,
    cpu_lockup::{CpuLockupEvent, DETECTOR_RCU_STALL, DETECTOR_SOFT_LOCKUP, FLAG_REPORTED_BY_OTHER_CPU},
    kind,
};

use super::{
    error::ProbeError,
    kind::EventKind,
    payload::Payload,
    plan::{Fallback, Plan, ProgramSpec, Unavailable},
    probe::{Decoding, Planned, Probe},
    settings::Settings,
    wait::classify,
};
use crate::{
    decode::{DecodeError, read_versioned},
    kernel_btf::KernelBtf,
    symbols::Symbols,
};

pub const NAME: &str = "cpu-lockup";
const SOFT_LOCKUP: ProgramSpec = ProgramSpec::fentry("add_taint", "add_taint");
const RCU_STALL: ProgramSpec = ProgramSpec::fentry("print_cpu_stall_info", "print_cpu_stall_info");
/// Where fentry is refused: the watchdog's console line.
const CONSOLE: ProgramSpec = ProgramSpec::tp_btf("console", "console");
const CONSOLE_HOOK: &str = "tp_btf/console (the watchdog's \"BUG: soft lockup\" line)";

pub fn plan(vmlinux: &KernelBtf) -> Result<Plan, ProbeError> {
    let from_console = vmlinux.tracepoint_arg_count(CONSOLE.target).is_ok().then(|| Fallback {
        programs: vec![CONSOLE],
        hook: CONSOLE_HOOK.into(),
        unavailable: vec![Unavailable::new(
            "rcu_stall",
            "RCU stalls are not reported: fentry is refused on this kernel, and the console \
             hook reads only the soft-lockup line",
        )],
    });
    let fentry = [SOFT_LOCKUP, RCU_STALL];
    if fentry.iter().all(|p| vmlinux.has_function(p.target)) {
        return Ok(Plan {
            config: None,
            programs: fentry.to_vec(),
            hook: "fentry/add_taint (TAINT_SOFTLOCKUP), fentry/print_cpu_stall_info".into(),
            notes: vec![],
            unavailable: vec![],
            fallback: from_console,
        });
    }
    match from_console {
        Some(console) => Ok(Plan {
            config: None,
            programs: console.programs,
            hook: console.hook,
            notes: vec![],
            unavailable: console.unavailable,
            fallback: None,
        }),
        None => Err(ProbeError::Missing(
            "the kernel has neither add_taint and print_cpu_stall_info (fentry) nor the console tracepoint"
                .into(),
        )),
    }
}

/// Whether a frame is the entry of the interrupt the detectors report from (x86: the APIC
/// timer's, or any device interrupt's that the timer interrupt ran on the way out of).
fn is_interrupt_entry(name: &str) -> bool {
    name.starts_with("asm_sysvec_") || name == "asm_common_interrupt"
}

pub fn decode(ev: &CpuLockupEvent, symbols: &Symbols) -> Result<CpuLockup, DecodeError> {
    let detector = match ev.detector {
        DETECTOR_SOFT_LOCKUP => Detector::SoftLockup,
        DETECTOR_RCU_STALL => Detector::RcuStall,
        other => return Err(DecodeError::BadField { field: "cpu_lockup.detector", value: other.into() }),
    };
    let mut stack = symbols.kernel_stack(&ev.stack, ev.stack_bytes);
    // The console hook sees every printk line, and a process may write the watchdog's to
    // /dev/kmsg: the kernel's own comes from its timer interrupt.
    if stack.names().any(|name| name.starts_with("devkmsg_")) {
        return Err(DecodeError::Forged { what: "a soft lockup line" });
    }
    // The report's own frames (the trampoline, the detector, the interrupt) say nothing of what
    // spins: the interrupted frames do.
    stack.trim_through(is_interrupt_entry);
    Ok(CpuLockup {
        detector,
        cpu: ev.cpu,
        task_known: ev.flags & FLAG_REPORTED_BY_OTHER_CPU == 0,
        wait: classify(stack.names()),
        stack,
    })
}

/// The probe, as the registry lists it.
pub struct CpuLockupProbe;

impl Probe for CpuLockupProbe {
    fn name(&self) -> &'static str {
        NAME
    }

    fn record_kind(&self) -> u32 {
        kind::CPU_LOCKUP
    }

    fn events(&self) -> &'static [EventKind] {
        &[LOCKUP]
    }

    fn plan(&self, vmlinux: &KernelBtf, _: &Settings, _: &mut Decoding) -> Result<Planned, ProbeError> {
        Ok(plan(vmlinux)?.into())
    }

    fn decode(
        &self,
        header: &EventHeader,
        record: &[u8],
        decoding: &Decoding,
    ) -> Result<Payload, DecodeError> {
        let raw: CpuLockupEvent =
            read_versioned(header, record, kstall_common::cpu_lockup::VERSION, "cpu_lockup event")?;
        Ok(Payload::CpuLockup(decode(&raw, &decoding.symbols)?))
    }

    #[cfg(test)]
    fn samples(&self) -> Vec<Payload> {
        let lockup =
            decode(&tests::event(DETECTOR_SOFT_LOCKUP, &[0xffff_ffff_8100_0000]), &Symbols::default());
        vec![Payload::CpuLockup(lockup.expect("sample"))]
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use kstall_common::cpu_lockup::STACK_DEPTH;

    use super::*;
    use crate::{probes::wait::WaitClass, symbols::SymbolTable};

    pub(crate) fn event(detector: u32, stack: &[u64]) -> CpuLockupEvent {
        let mut header = EventHeader::zeroed();
        header.kind = kind::CPU_LOCKUP;
        header.version = kstall_common::cpu_lockup::VERSION;
        let mut ev = CpuLockupEvent {
            header,
            detector,
            cpu: 3,
            reporting_cpu: 3,
            flags: 0,
            stack_bytes: (stack.len() * 8) as i64,
            stack: [0; STACK_DEPTH],
        };
        ev.stack[..stack.len()].copy_from_slice(stack);
        ev
    }

    /// A symbol table of `names` and a stack of one address in each, innermost first.
    fn symbolized(names: &[&str]) -> (Symbols, Vec<u64>) {
        let base = 0xffff_ffff_8100_0000u64;
        let text: String =
            names.iter().enumerate().map(|(i, n)| format!("{:x} T {n}\n", base + i as u64 * 0x100)).collect();
        let addrs = (0..names.len()).map(|i| base + 0x10 + i as u64 * 0x100).collect();
        (Symbols::from_table(SymbolTable::parse(&text)), addrs)
    }

    /// gpud PR #1245's node: a CPU pinned in the NFS client, as the watchdog's interrupt sees it.
    #[test]
    fn the_interrupted_frames_are_the_stack_and_name_the_nfs_client() {
        let names = [
            "bpf_trampoline_6442",
            "add_taint",
            "watchdog_timer_fn",
            "__hrtimer_run_queues",
            "hrtimer_interrupt",
            "__sysvec_apic_timer_interrupt",
            "sysvec_apic_timer_interrupt",
            "asm_sysvec_apic_timer_interrupt",
            "nfs_lock_and_join_requests",
            "nfs_page_async_flush",
            "nfs_writepages",
            "do_writepages",
        ];
        let (symbols, addrs) = symbolized(&names);
        let lockup = decode(&event(DETECTOR_SOFT_LOCKUP, &addrs), &symbols).unwrap();
        assert_eq!(lockup.detector, Detector::SoftLockup);
        assert_eq!(lockup.stack.names().collect::<Vec<_>>(), names[8..]);
        assert_eq!(lockup.wait, WaitClass::Nfs);
        assert!(lockup.task_known);
        // Without an interrupt entry (the unwinder stopped at it) the whole stack is kept.
        let lockup = decode(&event(DETECTOR_SOFT_LOCKUP, &addrs[..5]), &symbols).unwrap();
        assert_eq!(lockup.stack.len(), 5);
        assert_eq!(lockup.wait, WaitClass::Other);
    }

    #[test]
    fn a_line_a_process_wrote_to_kmsg_is_not_the_kernels_report() {
        let (symbols, addrs) = symbolized(&[
            "bpf_prog_91beb613c4ca8fd5_console",
            "printk_sprint",
            "vprintk_store",
            "devkmsg_write",
        ]);
        assert_eq!(
            decode(&event(DETECTOR_SOFT_LOCKUP, &addrs), &symbols),
            Err(DecodeError::Forged { what: "a soft lockup line" })
        );
    }

    #[test]
    fn another_cpus_stall_has_no_task_and_garbage_is_an_error() {
        let mut ev = event(DETECTOR_RCU_STALL, &[]);
        ev.flags = FLAG_REPORTED_BY_OTHER_CPU;
        let stall = decode(&ev, &Symbols::default()).unwrap();
        assert_eq!((stall.detector, stall.task_known, stall.cpu), (Detector::RcuStall, false, 3));
        ev.detector = 9;
        assert!(decode(&ev, &Symbols::default()).is_err());
        ev.detector = DETECTOR_SOFT_LOCKUP;
        ev.stack_bytes = i64::MAX;
        assert_eq!(decode(&ev, &Symbols::default()).unwrap().stack.len(), STACK_DEPTH);
    }

    #[test]
    fn plans_fentry_on_every_kernel_and_the_console_where_it_is_refused() {
        use crate::kernel_btf::tests::kernel;
        for k in ["5.10", "6.1", "6.12", "6.18", "7.3"] {
            let plan = plan(&kernel(k)).unwrap();
            assert_eq!(plan.programs.len(), 2, "{k}");
            assert!(plan.unavailable.is_empty(), "{k}: {:?}", plan.unavailable);
            let fallback = plan.fallback.unwrap();
            assert_eq!(fallback.programs[0].target, "console", "{k}");
            assert_eq!(fallback.unavailable[0].field, "rcu_stall");
        }
    }
}
