//! Identity of the task an event is about: `current`, or another task (a hung task, an OOM
//! victim) read through offsets the agent resolved from BTF.

use aya_ebpf::{
    EbpfContext,
    cty::c_void,
    helpers::{bpf_get_current_cgroup_id, bpf_ktime_get_boot_ns, generated},
};
use kstall_common::{EventHeader, TASK_COMM_LEN, task::TaskOffsets};

use crate::read::at;

/// Stamps the (zeroed) header of an event about `current`, now, in place (a copy would not fit
/// the stack beside the larger events); `netns_ino` is left to the probe (the event's own
/// namespace, which in softirq context is not current's).
#[inline(always)]
pub fn stamp_current<C: EbpfContext>(ctx: &C, header: &mut EventHeader, kind: u32, version: u32) {
    header.kind = kind;
    header.version = version;
    header.timestamp_ns = unsafe { bpf_ktime_get_boot_ns() };
    header.tgid = ctx.tgid();
    header.pid = ctx.pid();
    header.cgroup_id = unsafe { bpf_get_current_cgroup_id() };
    current_comm(&mut header.comm);
}

/// `current`'s comm into `comm` (zeroed by the helper when it fails), in place: aya's
/// `bpf_get_current_comm` zeroes a copy first, with a byte loop (see `zero`).
#[inline(always)]
pub fn current_comm(comm: &mut [u8; TASK_COMM_LEN]) {
    unsafe { generated::bpf_get_current_comm(comm.as_mut_ptr().cast::<c_void>(), TASK_COMM_LEN as u32) };
}

/// Fills pid, tgid, comm, cgroup id and netns of `task` into `header`. Returns false when the
/// task has no nsproxy left (it is exiting), in which case `netns_ino` stays 0.
#[inline(always)]
pub fn fill_header(off: &TaskOffsets, task: *const u8, header: &mut EventHeader) -> Result<bool, i32> {
    header.pid = at(task, off.pid)?;
    header.tgid = at(task, off.tgid)?;
    header.comm = at(task, off.comm)?;
    header.cgroup_id = cgroup_id(off, task)?;
    let nsproxy: *const u8 = at(task, off.nsproxy)?;
    if nsproxy.is_null() {
        return Ok(false);
    }
    let net: *const u8 = at(nsproxy, off.nsproxy_net_ns)?;
    header.netns_ino = at(net, off.net_ns_inum).unwrap_or(0);
    Ok(true)
}

/// The cgroup v2 id of `task`.
#[inline(always)]
pub fn cgroup_id(off: &TaskOffsets, task: *const u8) -> Result<u64, i32> {
    let css_set: *const u8 = at(task, off.cgroups)?;
    let cgroup: *const u8 = at(css_set, off.css_set_dfl_cgrp)?;
    let kn: *const u8 = at(cgroup, off.cgroup_kn)?;
    at(kn, off.kernfs_node_id)
}

/// A header for an event about `task` (not `current`), stamped `timestamp_ns`, and the event's
/// flag for a task without namespaces left (`no_nsproxy_flag` when so, else 0). Fails when the
/// task's identity cannot be read: no event then.
#[inline(always)]
pub fn task_header(
    off: &TaskOffsets,
    task: *const u8,
    (kind, version, timestamp_ns): (u32, u32, u64),
    no_nsproxy_flag: u32,
) -> Result<(EventHeader, u32), i32> {
    let mut header = EventHeader::zeroed();
    header.kind = kind;
    header.version = version;
    header.timestamp_ns = timestamp_ns;
    let has_nsproxy = fill_header(off, task, &mut header)?;
    Ok((header, if has_nsproxy { 0 } else { no_nsproxy_flag }))
}
