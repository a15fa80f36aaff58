//! Hung tasks. Kernel half: `ebpf/src/probes/hung_task.rs`; event: `common/src/hung_task.rs`.
//!
//! Decoding symbolizes the stack and derives the wait class: what kind of thing the task waits
//! for, which is what tells an NFS stall from a slow disk or a lock.

use kstall_common::hung_task::{
    BLOCKER_TYPE_MASK, BLOCKER_TYPE_MUTEX, BLOCKER_TYPE_RWSEM_READER, BLOCKER_TYPE_RWSEM_WRITER,
    BLOCKER_TYPE_SEM, FLAG_BLOCKER_TRACKED, FLAG_EXITING, FLAG_NO_NSPROXY, HungTaskConfig, HungTaskEvent,
};
use std::sync::LazyLock;

use serde::Serialize;

use super::plan::{Plan, ProgramSpec};
use crate::{
    decode::DecodeError,
    kernel_btf::KernelBtf,
    symbols::{Stack, Symbols},
};

pub const NAME: &str = "hung-task";
const GLOBAL: &str = "HUNG_TASK_CONFIG";
const PROG: ProgramSpec = ProgramSpec::tp_btf("sched_process_hang", "sched_process_hang");

pub fn plan(vmlinux: &KernelBtf) -> Result<Plan, String> {
    vmlinux.tracepoint_arg_count("sched_process_hang").map_err(|e| e.to_string())?;
    let mut cfg = HungTaskConfig {
        task: super::task::resolve(vmlinux).map_err(|e| e.to_string())?,
        task_last_switch_time: vmlinux
            .offset_of("task_struct", "last_switch_time")
            .map_err(|e| e.to_string())?,
        task_flags: vmlinux.offset_of("task_struct", "flags").map_err(|e| e.to_string())?,
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
    let notes = match blocker {
        Ok((task_blocker, mutex_owner, rwsem_owner)) => {
            cfg.blocker = 1;
            cfg.task_blocker = task_blocker;
            cfg.mutex_owner = mutex_owner;
            cfg.rwsem_owner = rwsem_owner;
            vec!["lock owner: from task->blocker (CONFIG_DETECT_HUNG_TASK_BLOCKER)".to_string()]
        }
        Err(_) => vec![
            "lock owner: not tracked by this kernel (needs CONFIG_DETECT_HUNG_TASK_BLOCKER, 6.15+)".into(),
        ],
    };
    cfg.valid = 1;
    Ok(Plan {
        global: GLOBAL,
        global_value: crate::decode::bytes_of(&cfg),
        programs: vec![PROG],
        hook: "tp_btf/sched_process_hang".into(),
        notes,
        fallback: None,
    })
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum WaitClass {
    Nfs,
    Writeback,
    BlockIo,
    FsLock,
    Mm,
    Other,
}

impl WaitClass {
    pub const ALL: [WaitClass; 6] = [
        WaitClass::Nfs,
        WaitClass::Writeback,
        WaitClass::BlockIo,
        WaitClass::FsLock,
        WaitClass::Mm,
        WaitClass::Other,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            WaitClass::Nfs => "nfs",
            WaitClass::Writeback => "writeback",
            WaitClass::BlockIo => "block_io",
            WaitClass::FsLock => "fs_lock",
            WaitClass::Mm => "mm",
            WaitClass::Other => "other",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Blocker {
    /// `mutex`, `semaphore`, `rwsem_reader` or `rwsem_writer`.
    pub lock: &'static str,
    pub owner_pid: Option<u32>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct HungTask {
    /// Seconds since the detector last saw the task run; at least `hung_task_timeout_secs`.
    /// `None` when the kernel's tick rate could not be determined.
    pub blocked_secs: Option<u64>,
    pub wait: WaitClass,
    /// Symbolized kernel stack, innermost frame first.
    pub stack: Stack,
    /// What the task blocks on, on kernels that track it.
    pub blocker: Option<Blocker>,
    /// The task is exiting (`PF_EXITING`, or no namespaces left), as in incident 1's flush of the
    /// files `do_exit` closes.
    pub exiting: bool,
}

/// Converts jiffies to seconds; the kernel's HZ is measured once at start (`kernel::tick_rate`).
#[derive(Debug, Clone, Copy, Default)]
pub struct Clock {
    pub hz: Option<u64>,
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

/// The wait class of a stack (innermost frame first, as `name+0xoff [module]` or bare names).
/// NFS wins over everything: an NFS flush waits in writeback, and the NFS server is the cause.
pub fn classify<'a>(frames: impl Iterator<Item = &'a str>) -> WaitClass {
    let seen = frames.fold(0u8, |seen, frame| seen | frame_signs(frame_name(frame)));
    if seen & NFS != 0 {
        WaitClass::Nfs
    } else if seen & WRITEBACK != 0 {
        WaitClass::Writeback
    } else if seen & BLOCK_IO != 0 {
        WaitClass::BlockIo
    } else if seen & LOCK != 0 && seen & FS != 0 {
        WaitClass::FsLock
    } else if seen & MM != 0 {
        WaitClass::Mm
    } else {
        WaitClass::Other
    }
}

/// `folio_wait_writeback+0x12 [mod]` -> `folio_wait_writeback`.
fn frame_name(frame: &str) -> &str {
    frame.split(['+', ' ']).next().unwrap_or(frame)
}

/// What one function name is a sign of.
const NFS: u8 = 1 << 0;
const WRITEBACK: u8 = 1 << 1;
const BLOCK_IO: u8 = 1 << 2;
/// A sleeping lock: an `fs_lock` when a file-system function is on the stack too.
const LOCK: u8 = 1 << 3;
const FS: u8 = 1 << 4;
const MM: u8 = 1 << 5;

/// (function name or name prefix, whether the whole name must match, sign).
type Sign = (&'static str, bool, u8);
const SIGNS: &[Sign] = &[
    ("nfs_", false, NFS),
    ("nfs3_", false, NFS),
    ("nfs4_", false, NFS),
    ("nfs41_", false, NFS),
    ("rpc_", false, NFS),
    ("__rpc_", false, NFS),
    ("xprt_", false, NFS),
    ("folio_wait_writeback", true, WRITEBACK),
    ("folio_wait_stable", true, WRITEBACK),
    ("wait_on_page_writeback", true, WRITEBACK),
    ("__filemap_fdatawait_range", true, WRITEBACK),
    ("filemap_fdatawait_range", true, WRITEBACK),
    ("filemap_fdatawait_keep_errors", true, WRITEBACK),
    ("filemap_write_and_wait_range", true, WRITEBACK),
    ("file_write_and_wait_range", true, WRITEBACK),
    ("sync_inodes_sb", true, WRITEBACK),
    ("wait_sb_inodes", true, WRITEBACK),
    ("writeback_", false, WRITEBACK),
    ("wb_", false, WRITEBACK),
    ("balance_dirty_pages", false, WRITEBACK),
    ("jbd2_", false, WRITEBACK),
    ("submit_bio_wait", true, BLOCK_IO),
    ("__wait_on_buffer", true, BLOCK_IO),
    ("wait_on_buffer", true, BLOCK_IO),
    ("__lock_buffer", true, BLOCK_IO),
    ("bit_wait_io", true, BLOCK_IO),
    ("io_schedule", true, BLOCK_IO),
    ("blk_", false, BLOCK_IO),
    ("bio_", false, BLOCK_IO),
    ("rwsem_down_", false, LOCK),
    ("__mutex_lock", false, LOCK),
    ("mutex_lock", false, LOCK),
    ("down_read", false, LOCK),
    ("down_write", false, LOCK),
    ("__down", false, LOCK),
    ("vfs_", false, FS),
    ("do_sys_open", false, FS),
    ("path_openat", false, FS),
    ("do_truncate", false, FS),
    ("lookup_slow", false, FS),
    ("filename_create", false, FS),
    ("do_unlinkat", false, FS),
    ("do_renameat", false, FS),
    ("iterate_dir", false, FS),
    ("ext4_", false, FS),
    ("xfs_", false, FS),
    ("btrfs_", false, FS),
    ("fuse_", false, FS),
    ("ovl_", false, FS),
    ("inode_lock", false, FS),
    ("chown_common", false, FS),
    ("chmod_common", false, FS),
    ("do_rmdir", false, FS),
    ("do_mkdirat", false, FS),
    ("__alloc_pages", false, MM),
    ("__alloc_frozen_pages", false, MM),
    ("try_to_free", false, MM),
    ("shrink_", false, MM),
    ("compact_", false, MM),
    ("mem_cgroup_", false, MM),
    ("migrate_", false, MM),
    ("lock_mm_and_find_vma", false, MM),
    ("__mmap_lock", false, MM),
    ("mmap_read_lock", false, MM),
    ("mmap_write_lock", false, MM),
    ("do_user_addr_fault", false, MM),
    ("handle_mm_fault", false, MM),
    ("do_swap_page", false, MM),
    ("swap_", false, MM),
    ("khugepaged", false, MM),
];

/// `SIGNS` indexed by first byte: a name is compared only with the few entries that can match
/// (on a node with many hung tasks every frame of every new stack comes through here).
static SIGNS_BY_FIRST_BYTE: LazyLock<Vec<Vec<Sign>>> = LazyLock::new(|| {
    let mut table = vec![Vec::new(); 256];
    for &(pattern, exact, sign) in SIGNS {
        table[usize::from(pattern.as_bytes()[0])].push((pattern, exact, sign));
    }
    table
});

fn frame_signs(name: &str) -> u8 {
    let Some(&first) = name.as_bytes().first() else { return 0 };
    SIGNS_BY_FIRST_BYTE[usize::from(first)]
        .iter()
        .filter(|(pattern, exact, _)| if *exact { name == *pattern } else { name.starts_with(pattern) })
        .fold(0, |signs, (_, _, sign)| signs | sign)
}

#[cfg(test)]
mod tests {
    use kstall_common::{EventHeader, kind};

    use super::*;
    use crate::symbols::SymbolTable;

    fn class(frames: &[&str]) -> WaitClass {
        classify(frames.iter().copied())
    }

    #[test]
    fn the_incident_1_seed_stack_is_nfs() {
        let stack = ["folio_wait_writeback", "nfs_wb_all", "nfs4_file_flush", "filp_close", "do_exit"];
        assert_eq!(class(&stack), WaitClass::Nfs);
        let with_offsets = [
            "folio_wait_bit_common+0x12a",
            "folio_wait_writeback+0x28",
            "nfs_wb_all+0x6f [nfs]",
            "do_exit+0x2d0",
        ];
        assert_eq!(class(&with_offsets), WaitClass::Nfs);
    }

    #[test]
    fn classes() {
        let fsync =
            ["folio_wait_bit_common", "folio_wait_writeback", "__filemap_fdatawait_range", "ext4_sync_file"];
        assert_eq!(class(&fsync), WaitClass::Writeback);
        // The journal thread of the same file system, as seen on this machine.
        let journal =
            ["jbd2_write_superblock+0x100", "jbd2_journal_commit_transaction+0x102", "kjournald2+0xc7"];
        assert_eq!(class(&journal), WaitClass::Writeback);
        assert_eq!(class(&["io_schedule", "blk_mq_get_tag", "submit_bio"]), WaitClass::BlockIo);
        assert_eq!(
            class(&["rwsem_down_write_slowpath", "down_write", "do_truncate", "do_sys_ftruncate"]),
            WaitClass::FsLock
        );
        assert_eq!(
            class(&["rwsem_down_read_slowpath", "lock_mm_and_find_vma", "do_user_addr_fault"]),
            WaitClass::Mm
        );
        assert_eq!(class(&["__mutex_lock", "some_driver_ioctl"]), WaitClass::Other, "a lock off the fs path");
        assert_eq!(class(&[]), WaitClass::Other);
    }

    fn event(stack: &[u64]) -> HungTaskEvent {
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
        for k in ["6.1", "6.12"] {
            let plan = plan(&kernel(k)).unwrap();
            assert!(plan.notes[0].contains("not tracked"), "{k}: {:?}", plan.notes);
        }
        let plan = plan(&kernel("6.18")).unwrap();
        assert!(plan.notes[0].contains("task->blocker"), "{:?}", plan.notes);
    }
}
