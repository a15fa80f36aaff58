//! The header every event starts with.

pub const TASK_COMM_LEN: usize = 16;

/// Common to every event. `tgid`, `pid`, `comm` and `cgroup_id` describe the task the event is
/// about: the hung task, the OOM victim — or, for resets handled in softirq context, whichever task
/// the kernel was running (`current`), a hint only. `netns_ino` is the network namespace *of the
/// event* (socket, packet, task), which is what attribution must use in softirq context.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EventHeader {
    /// One of [`crate::kind`].
    pub kind: u32,
    /// Layout version of this kind's record; bumped when the record changes.
    pub version: u32,
    /// `CLOCK_BOOTTIME` nanoseconds (`bpf_ktime_get_boot_ns`).
    pub timestamp_ns: u64,
    pub tgid: u32,
    pub pid: u32,
    /// cgroup v2 id (kernfs inode) of `current`.
    pub cgroup_id: u64,
    /// Network namespace inode of the event, 0 when unknown.
    pub netns_ino: u32,
    pub _pad: u32,
    pub comm: [u8; TASK_COMM_LEN],
}

const _: () = assert!(size_of::<EventHeader>() == 56);

impl EventHeader {
    pub const fn zeroed() -> Self {
        Self {
            kind: 0,
            version: 0,
            timestamp_ns: 0,
            tgid: 0,
            pid: 0,
            cgroup_id: 0,
            netns_ino: 0,
            _pad: 0,
            comm: [0; TASK_COMM_LEN],
        }
    }
}

// SAFETY: repr(C), only integer fields, no implicit padding.
#[cfg(feature = "user")]
unsafe impl aya::Pod for EventHeader {}
