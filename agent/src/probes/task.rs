//! `struct task_struct` offsets shared by the probes whose event is about a task (hung task, OOM
//! victim).

use kstall_common::task::TaskOffsets;

use crate::kernel_btf::{BtfError, KernelBtf};

pub fn resolve(btf: &KernelBtf) -> Result<TaskOffsets, BtfError> {
    Ok(TaskOffsets {
        pid: btf.offset_of("task_struct", "pid")?,
        tgid: btf.offset_of("task_struct", "tgid")?,
        comm: btf.offset_of("task_struct", "comm")?,
        cgroups: btf.offset_of("task_struct", "cgroups")?,
        css_set_dfl_cgrp: btf.offset_of("css_set", "dfl_cgrp")?,
        cgroup_kn: btf.offset_of("cgroup", "kn")?,
        kernfs_node_id: btf.offset_of("kernfs_node", "id")?,
        nsproxy: btf.offset_of("task_struct", "nsproxy")?,
        nsproxy_net_ns: btf.offset_of("nsproxy", "net_ns")?,
        net_ns_inum: btf.offset_of("net", "ns.inum")?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernel_btf::tests::{KERNELS, kernel};

    #[test]
    fn resolves_on_every_kernel() {
        let all: Vec<TaskOffsets> = KERNELS.iter().map(|k| resolve(&kernel(k)).expect(k)).collect();
        for (k, off) in KERNELS.iter().zip(&all) {
            assert_eq!(off.tgid, off.pid + 4, "{k}: tgid follows pid");
        }
        assert_ne!(all[0], all[2], "6.1 and 6.18 lay task_struct out differently");
    }
}
