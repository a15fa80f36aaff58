//! The kernel's BPF programs: the agent's, by name, and whether released ones are gone.

use std::{
    thread,
    time::{Duration, Instant},
};

use serde_json::Value;

use crate::host::run;

/// The agent's programs, by the 15 characters of their names the kernel keeps.
pub const AGENT_PROGRAMS: [&str; 11] = [
    "tcp_send_reset",
    "tcp_receive_res",
    "sched_process_h",
    "mark_victim",
    "nfs_xprt_retran",
    "nfs_rpc_timeout",
    "nfs_rpc_socket_",
    "nfs_rpc_socket_",
    "nfs_rpc_socket_",
    "nfs_xprt_lookup",
    "nfs4_state_mgr_",
];

/// Ids of the kernel's programs that carry the agent's program names.
pub fn agent_program_ids() -> std::collections::BTreeSet<u64> {
    bpf_programs(&AGENT_PROGRAMS).iter().filter_map(|p| p["id"].as_u64()).collect()
}

/// Which of `ids` are still loaded 5 s on (the kernel frees a released program after an RCU
/// grace period).
pub fn still_loaded_after_grace(ids: &std::collections::BTreeSet<u64>) -> Vec<u64> {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let left: Vec<u64> = agent_program_ids().intersection(ids).copied().collect();
        if left.is_empty() || Instant::now() > deadline {
            return left;
        }
        thread::sleep(Duration::from_millis(100));
    }
}

/// BPF programs whose (15-character) kernel name starts with one of `names`, as bpftool's JSON.
pub fn bpf_programs(names: &[&str]) -> Vec<Value> {
    let progs: Value =
        serde_json::from_str(&run("bpftool", &["prog", "show", "--json"])).expect("bpftool json");
    progs
        .as_array()
        .expect("bpftool prints an array")
        .iter()
        .filter(|p| names.iter().any(|n| p["name"].as_str().is_some_and(|s| s.starts_with(n))))
        .cloned()
        .collect()
}
