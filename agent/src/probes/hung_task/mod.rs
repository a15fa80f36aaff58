//! Hung tasks. Kernel half: `ebpf/src/probes/hung_task.rs`; event: `common/src/hung_task.rs`.
//!
//! Decoding symbolizes the stack and derives the wait class (`wait.rs`); the kernel's detector it
//! reports from is looked after in `detector.rs`.

mod detector;
pub mod event;

pub use event::*;

use kstall_common::hung_task::{
    BLOCKER_TYPE_MASK, BLOCKER_TYPE_MUTEX, BLOCKER_TYPE_RWSEM_READER, BLOCKER_TYPE_RWSEM_WRITER,
    BLOCKER_TYPE_SEM, FLAG_BLOCKER_TRACKED, FLAG_EXITING, FLAG_NO_NSPROXY, HungTaskConfig, HungTaskEvent,
};
use kstall_common::{EventHeader, kind};

use super::{
    error::ProbeError,
    kind::EventKind,
    payload::Payload,
    plan::{Plan, ProgramSpec, Unavailable},
    probe::{Clock, Decoding, Planned, Probe},
    settings::Settings,
    wait::classify,
};
use crate::{
    decode::{DecodeError, read_versioned},
    kernel_btf::KernelBtf,
    symbols::Symbols,
};

pub const NAME: &str = "hung-task";
const GLOBAL: &str = "HUNG_TASK_CONFIG";
const PROG: ProgramSpec = ProgramSpec::tp_btf("sched_process_hang", "sched_process_hang");

pub fn plan(vmlinux: &KernelBtf) -> Result<Plan, ProbeError> {
    vmlinux.tracepoint_arg_count("sched_process_hang")?;
    let mut cfg = HungTaskConfig {
        task: super::task::resolve(vmlinux)?,
        task_last_switch_time: vmlinux.offset_of("task_struct", "last_switch_time")?,
        task_flags: vmlinux.offset_of("task_struct", "flags")?,
        ..HungTaskConfig::default()
    };
    // CONFIG_DETECT_HUNG_TASK_BLOCKER (6.15+): probed, never assumed.
    let blocker = (|| -> Result<(u32, u32, u32), crate::kernel_btf::BtfError> {
        Ok((
            vmlinux.offset_of("task_struct", "blocker")?,
            vmlinux.offset_of("mutex", "owner")?,
            vmlinux.offset_of("rw_semaphore", "owner")?,
        ))
    })();
    let (notes, unavailable) = match blocker {
        Ok((task_blocker, mutex_owner, rwsem_owner)) => {
            cfg.blocker = 1;
            cfg.task_blocker = task_blocker;
            cfg.mutex_owner = mutex_owner;
            cfg.rwsem_owner = rwsem_owner;
            (vec!["lock owner: from task->blocker (CONFIG_DETECT_HUNG_TASK_BLOCKER)".to_string()], vec![])
        }
        Err(_) => (
            vec![],
            vec![Unavailable::new(
                "blocker",
                "the lock owner is not tracked by this kernel (needs CONFIG_DETECT_HUNG_TASK_BLOCKER, 6.15+)",
            )],
        ),
    };
    cfg.valid = 1;
    Ok(Plan {
        config: Some((GLOBAL, crate::decode::bytes_of(&cfg))),
        programs: vec![PROG],
        hook: "tp_btf/sched_process_hang".into(),
        notes,
        unavailable,
        fallback: None,
    })
}

pub fn decode(ev: &HungTaskEvent, symbols: &Symbols, clock: Clock) -> Result<HungTask, DecodeError> {
    let stack = symbols.kernel_stack(&ev.stack, ev.stack_bytes);
    let blocker = (ev.flags & FLAG_BLOCKER_TRACKED != 0 && ev.blocker != 0).then(|| Blocker {
        lock: match ev.blocker & BLOCKER_TYPE_MASK {
            BLOCKER_TYPE_MUTEX => "mutex",
            BLOCKER_TYPE_SEM => "semaphore",
            BLOCKER_TYPE_RWSEM_READER => "rwsem_reader",
            BLOCKER_TYPE_RWSEM_WRITER => "rwsem_writer",
            _ => unreachable!("masked to two bits"),
        },
        owner_pid: (ev.blocker_owner_pid != 0).then_some(ev.blocker_owner_pid),
    });
    let blocked_secs =
        clock.hz.filter(|&hz| hz > 0).map(|hz| ev.now_jiffies.saturating_sub(ev.last_switch_jiffies) / hz);
    Ok(HungTask {
        blocked_secs,
        wait: classify(stack.names()),
        stack,
        blocker,
        exiting: ev.flags & (FLAG_EXITING | FLAG_NO_NSPROXY) != 0,
    })
}

/// The probe, as the registry lists it.
pub struct HungTaskProbe;

impl Probe for HungTaskProbe {
    fn name(&self) -> &'static str {
        NAME
    }

    fn record_kind(&self) -> u32 {
        kind::HUNG_TASK
    }

    fn events(&self) -> &'static [EventKind] {
        &[HUNG, super::cleared::CLEARED]
    }

    fn jiffies_field(&self) -> Option<&'static str> {
        Some("blocked_secs")
    }

    fn plan(
        &self,
        vmlinux: &KernelBtf,
        settings: &Settings,
        _: &mut Decoding,
    ) -> Result<Planned, ProbeError> {
        let programs = plan(vmlinux)?;
        let sampling = settings.enabled.iter().any(|name| name == super::stuck_task::NAME);
        let detector = detector::Detector::new(settings.hung_task_timeout_secs, sampling);
        Ok(Planned { programs: Some(programs), completion: Some(Box::new(detector)) })
    }

    fn decode(
        &self,
        header: &EventHeader,
        record: &[u8],
        decoding: &Decoding,
    ) -> Result<Payload, DecodeError> {
        let raw: HungTaskEvent =
            read_versioned(header, record, kstall_common::hung_task::VERSION, "hung_task event")?;
        Ok(Payload::HungTask(decode(&raw, &decoding.symbols, decoding.clock)?))
    }

    #[cfg(test)]
    fn samples(&self) -> Vec<Payload> {
        let hung =
            decode(&tests::event(&[0xffff_ffff_8100_0000]), &Symbols::default(), Clock { hz: Some(250) });
        vec![Payload::HungTask(hung.expect("sample")), super::cleared::tests::cleared()]
    }
}

#[cfg(test)]
mod tests {
    use crate::probes::wait::WaitClass;
    use kstall_common::EventHeader;

    use super::*;
    use crate::symbols::SymbolTable;

    pub(super) fn event(stack: &[u64]) -> HungTaskEvent {
        let mut header = EventHeader::zeroed();
        header.kind = kind::HUNG_TASK;
        header.version = kstall_common::hung_task::VERSION;
        let mut ev = HungTaskEvent {
            header,
            last_switch_jiffies: 1_000,
            now_jiffies: 1_000 + 250 * 130,
            blocker: 0,
            blocker_owner_pid: 0,
            flags: 0,
            stack_bytes: (stack.len() * 8) as i64,
            stack: [0; kstall_common::hung_task::STACK_DEPTH],
        };
        ev.stack[..stack.len()].copy_from_slice(stack);
        ev
    }

    #[test]
    fn decodes_symbolizes_and_converts_jiffies() {
        let symbols = Symbols::from_table(SymbolTable::parse(
            "ffffffff81100000 T folio_wait_writeback\nffffffffc0a00000 t nfs_wb_all\t[nfs]\n",
        ));
        let ev = event(&[0xffffffff81100010, 0xffffffffc0a00020, 0x42]);
        let hung = decode(&ev, &symbols, Clock { hz: Some(250) }).unwrap();
        let stack: Vec<String> = hung.stack.texts().collect();
        assert_eq!(stack, ["folio_wait_writeback+0x10", "nfs_wb_all+0x20 [nfs]", "0x42"]);
        assert_eq!(hung.wait, WaitClass::Nfs);
        assert_eq!(hung.blocked_secs, Some(130));
        assert_eq!(decode(&ev, &symbols, Clock { hz: None }).unwrap().blocked_secs, None);
    }

    #[test]
    fn exiting_is_pf_exiting_or_no_namespaces() {
        let mut ev = event(&[]);
        let exiting = |ev: &HungTaskEvent| decode(ev, &Symbols::default(), Clock::default()).unwrap().exiting;
        assert!(!exiting(&ev));
        // Incident 1's flush in do_exit -> put_files_struct -> filp_close: the namespaces are
        // still there, PF_EXITING is set.
        ev.flags = FLAG_EXITING;
        assert!(exiting(&ev));
        ev.flags = FLAG_NO_NSPROXY;
        assert!(exiting(&ev));
    }

    #[test]
    fn blocker_and_failed_stacks() {
        let mut ev = event(&[]);
        ev.stack_bytes = -14;
        ev.flags = FLAG_BLOCKER_TRACKED | FLAG_NO_NSPROXY;
        ev.blocker = 0xffff_8880_1234_5600 | BLOCKER_TYPE_RWSEM_WRITER;
        ev.blocker_owner_pid = 77;
        let hung = decode(&ev, &Symbols::default(), Clock::default()).unwrap();
        assert!(hung.stack.is_empty());
        assert_eq!(hung.blocker, Some(Blocker { lock: "rwsem_writer", owner_pid: Some(77) }));
        assert!(hung.exiting);
        // A huge byte count from a corrupt record is clamped to the array.
        ev.stack_bytes = i64::MAX;
        assert_eq!(
            decode(&ev, &Symbols::default(), Clock::default()).unwrap().stack.len(),
            kstall_common::hung_task::STACK_DEPTH
        );
    }

    #[test]
    fn plans_on_every_kernel_and_probes_the_blocker() {
        use crate::kernel_btf::tests::kernel;
        for k in ["5.10", "6.1", "6.12"] {
            let plan = plan(&kernel(k)).unwrap();
            assert!(plan.unavailable[0].why.contains("not tracked"), "{k}: {:?}", plan.unavailable);
        }
        let plan = plan(&kernel("6.18")).unwrap();
        assert!(plan.notes[0].contains("task->blocker"), "{:?}", plan.notes);
    }
}
