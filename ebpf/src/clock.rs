//! The kernel's tick counter, for the agent to measure HZ (hung-task blocked times and RPC
//! timeouts are in jiffies). Never attached: the agent runs it with `BPF_PROG_TEST_RUN` (raw
//! tracepoints can be test-run from 5.10) and reads its return value, because
//! `/proc/timer_list`, the only file that shows jiffies, is masked in containers.

use core::ffi::c_void;

use aya_ebpf::helpers::bpf_jiffies64;

/// The low 32 bits of `jiffies_64`: enough for the difference of two runs a moment apart.
/// Written without `#[raw_tracepoint]`, whose wrapper returns 0 whatever the body returns.
#[unsafe(no_mangle)]
#[unsafe(link_section = "raw_tp")]
pub fn kstall_jiffies(_ctx: *mut c_void) -> u32 {
    unsafe { bpf_jiffies64() as u32 }
}
