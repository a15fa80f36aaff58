//! The agent's lifecycle against the real kernel.

use kstall_tests::{
    agent::Agent,
    bpf::{agent_program_ids, still_loaded_after_grace},
    kernel_tests_can_run,
};

/// SIGTERM detaches every program: the programs the agent loaded are gone after it exits.
#[test]
fn sigterm_detaches_every_program() {
    if !kernel_tests_can_run("sigterm_detaches_every_program") {
        return;
    }
    let before = agent_program_ids();
    let mut agent = Agent::start(&[]);
    let loaded: Vec<u64> = agent_program_ids().difference(&before).copied().collect();
    // tcp-reset 2, hung-task 1, oom 1 attached; nfs 7 loaded, waiting for sunrpc.
    assert_eq!(loaded.len(), 11, "the agent's programs: {loaded:?}");
    let log = agent.log();
    assert_eq!(agent.stop(), Some(0), "{log}");
    let left = still_loaded_after_grace(&loaded.iter().copied().collect());
    assert!(left.is_empty(), "still loaded 5 s after SIGTERM: {left:?}");
    let log = agent.log();
    assert!(log.contains(r#""detached":4"#), "the agent reports what it detached:\n{log}");
}

/// A probe that cannot run on this kernel is reported with its reason, and the others run on. This
/// kernel has no NFS client (KERNEL_NOTES), so the NFS probe must say so.
#[test]
fn a_probe_that_cannot_run_here_is_down_with_its_reason_and_the_rest_run() {
    if !kernel_tests_can_run("a_probe_that_cannot_run_here_is_down_with_its_reason_and_the_rest_run") {
        return;
    }
    if std::path::Path::new("/sys/kernel/btf/sunrpc").exists() {
        panic!("this test expects a kernel without sunrpc loaded (the kind CI runs on)");
    }
    let mut agent = Agent::start(&[]);
    let status = agent.status();
    let probes = status["probes"].as_array().expect("probes");
    let nfs = probes.iter().find(|p| p["name"] == "nfs").expect("nfs listed");
    assert_eq!(nfs["up"], false, "{nfs}");
    assert!(nfs["reason"].as_str().unwrap().contains("sunrpc not loaded"), "{nfs}");
    for p in probes.iter().filter(|p| p["name"] != "nfs") {
        assert_eq!(p["up"], true, "{p}");
    }
    assert_eq!(agent.metric(r#"kstall_probe_up{probe="nfs"}"#), Some(0.0));
    assert_eq!(agent.metric(r#"kstall_probe_up{probe="tcp-reset"}"#), Some(1.0));
    assert_eq!(agent.stop(), Some(0), "{}", agent.log());
}
