//! The agent's lifecycle against the real kernel.

use kstall_tests::{
    agent::Agent,
    bpf::{loaded_program_ids, still_loaded_after_grace},
    kernel_tests_can_run,
};

/// SIGTERM detaches every program: the programs the agent held are gone after it exits.
#[test]
fn sigterm_detaches_every_program() {
    if !kernel_tests_can_run("sigterm_detaches_every_program") {
        return;
    }
    let mut agent = Agent::start(&[]);
    // What the agent's process holds, in the kernel's view: each probe up has at least one program
    // attached (the NFS probe's are loaded too, waiting for sunrpc).
    let held = agent.program_ids();
    let status = agent.status();
    let up = status["probes"].as_array().expect("probes").iter().filter(|p| p["up"] == true).count();
    assert!(!held.is_empty() && held.len() >= up, "the agent holds programs {held:?} for {up} probes up");
    let unlisted: Vec<u64> = held.difference(&loaded_program_ids()).copied().collect();
    assert!(unlisted.is_empty(), "programs the agent holds that bpftool does not list: {unlisted:?}");
    let log = agent.log();
    assert_eq!(agent.stop(), Some(0), "{log}");
    let left = still_loaded_after_grace(&held);
    assert!(left.is_empty(), "still loaded 5 s after SIGTERM: {left:?}");
    let log = agent.log();
    // tcp-reset's two programs, hung-task's, oom's, the stuck-task iterator, cpu-lockup's
    // console hook (this kernel refuses fentry; NFS waits) and packet-drop's.
    assert!(log.contains(r#""detached":7"#), "the agent reports what it detached:\n{log}");
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
