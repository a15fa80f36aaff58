//! The agent's lifecycle against the real kernel.

use std::time::Duration;

use kstall_tests::{AGENT_PROGRAMS as PROGRAMS, Agent, bpf_programs, kernel_tests_can_run};

/// SIGTERM detaches every program: the programs the agent loaded are gone after it exits.
#[test]
fn sigterm_detaches_every_program() {
    if !kernel_tests_can_run("sigterm_detaches_every_program") {
        return;
    }
    // Program ids carrying the probe's program names (the kernel keeps 15 characters of a name).
    let ours = || -> std::collections::BTreeSet<u64> {
        bpf_programs(&PROGRAMS).iter().filter_map(|p| p["id"].as_u64()).collect()
    };
    let before = ours();
    let mut agent = Agent::start(&[]);
    let loaded: Vec<u64> = ours().difference(&before).copied().collect();
    // tcp-reset 2, hung-task 1, oom 1 attached; nfs 7 loaded, waiting for sunrpc.
    assert_eq!(loaded.len(), 11, "the agent's programs: {loaded:?}");
    let log = agent.log();
    assert_eq!(agent.stop(), Some(0), "{log}");
    // The kernel frees a released program after an RCU grace period: give it a moment.
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    let left = loop {
        let left: Vec<u64> = ours().into_iter().filter(|id| loaded.contains(id)).collect();
        if left.is_empty() || std::time::Instant::now() > deadline {
            break left;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
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
