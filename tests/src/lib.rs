//! Helpers for kstall's kernel integration tests: they need root and a real kernel, trigger the
//! real thing, and assert on what a real `kstall agent` saw. Everything a test creates (network
//! namespaces and their iptables rules, cgroups, the agent process) is owned by a guard that removes
//! it on drop, also when the test fails. Each module holds one concern; this root only says whether
//! the tests can run here.

use std::{
    path::{Path, PathBuf},
    time::Duration,
};

use crate::agent::agent_binary;

/// How long what a test starts (an agent, its event stream, Prometheus) may take to be ready
/// before the test calls it hung. Only a guard: tests wait for readiness itself. Seconds on the
/// host; in the kernel matrix, two emulated guests share two cores and the 5.10 verifier walks
/// the NFS programs slowly, and an agent's start took 40 s, Prometheus's over 30 s.
pub const START_WITHIN: Duration = Duration::from_secs(180);

/// The kstall checkout: `KSTALL_WORKSPACE` where the machine running the tests sees it elsewhere
/// (a kernel-matrix guest is told where its checkout is shared with it), else where this crate
/// was built.
pub fn workspace() -> PathBuf {
    std::env::var_os("KSTALL_WORKSPACE")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join(".."))
}

pub mod agent;
pub mod alerting;
pub mod bpf;
pub mod bpftrace;
pub mod capture;
pub mod capture_cost;
pub mod cgroup;
pub mod cluster;
pub mod container;
pub mod dashboards;
pub mod deploy;
pub mod healthy;
pub mod helm;
pub mod host;
pub mod json_lines;
pub mod krew;
pub mod kubelet;
pub mod meshes;
pub mod netns;
pub mod nfs;
pub mod oom;
pub mod otlp;
pub mod sidecar;
pub mod soak;
pub mod storms;
pub mod stuck_pod;
pub mod tls;
pub mod writeback;

/// Returns false (after printing why) when kernel tests cannot run here; panics instead when they
/// are required (`KSTALL_KERNEL_TESTS=require`, set by `cargo xtask test` as root and in CI).
pub fn kernel_tests_can_run(test: &str) -> bool {
    let required = std::env::var("KSTALL_KERNEL_TESTS").as_deref() == Ok("require");
    let reason = if unsafe { libc::geteuid() } != 0 {
        Some("needs root".to_string())
    } else if !Path::new("/sys/kernel/btf/vmlinux").exists() {
        Some("kernel has no BTF".to_string())
    } else if !agent_binary().exists() {
        Some(format!("no agent binary at {} (run `cargo xtask test`)", agent_binary().display()))
    } else {
        None
    };
    match reason {
        None => true,
        Some(reason) if required => panic!("{test}: kernel tests are required here but {reason}"),
        Some(reason) => {
            println!("skipping {test}: {reason}");
            false
        }
    }
}
