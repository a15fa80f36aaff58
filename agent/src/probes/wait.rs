//! What a stuck task waits for, from its kernel stack: the wait class tells an NFS stall from a
//! slow disk or a lock; and a stuck task as one report of it tells it ([`Stuck`]). Shared by the
//! two probes that find stuck tasks (hung-task, stuck-task).

use std::sync::LazyLock;

use serde::Serialize;

use crate::symbols::Stack;

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

/// A stuck task as one report of it tells it.
pub struct Stuck<'a> {
    /// `None` when the kernel's tick rate could not be determined.
    pub blocked_secs: Option<u64>,
    pub wait: WaitClass,
    pub wait_kind: WaitKind,
    pub exiting: bool,
    pub stack: &'a Stack,
}

/// How the task sleeps: `killable` sleeps (`TASK_KILLABLE`) are the ones the kernel's hung-task
/// detector skips, and a fatal signal ends them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum WaitKind {
    Uninterruptible,
    Killable,
}

impl WaitKind {
    pub const ALL: [WaitKind; 2] = [WaitKind::Uninterruptible, WaitKind::Killable];

    pub fn as_str(self) -> &'static str {
        match self {
            WaitKind::Uninterruptible => "uninterruptible",
            WaitKind::Killable => "killable",
        }
    }
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
pub fn frame_name(frame: &str) -> &str {
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
    // A read waiting for its page to come from the disk (killable: the detector never sees it).
    ("filemap_get_pages", true, BLOCK_IO),
    ("filemap_update_page", true, BLOCK_IO),
    ("filemap_read_folio", true, BLOCK_IO),
    ("filemap_fault", true, BLOCK_IO),
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
    use super::*;

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
        // The killable read of this host's frozen-disk recipe.
        let read =
            ["folio_wait_bit_common+0x13d", "filemap_get_pages+0x5ab", "filemap_read+0xf6", "vfs_read+0x2a0"];
        assert_eq!(class(&read), WaitClass::BlockIo);
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
}
