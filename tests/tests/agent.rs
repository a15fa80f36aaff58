//! The agent's lifecycle against the real kernel.

use std::time::Duration;

use kstall_tests::{Agent, bpf_programs, kernel_tests_can_run};

/// SIGTERM detaches every program: the programs the agent loaded are gone after it exits.
#[test]
fn sigterm_detaches_every_program() {
    if !kernel_tests_can_run("sigterm_detaches_every_program") {
        return;
    }
    // Program ids carrying the probe's program names (the kernel keeps 15 characters of a name).
    let ours = || -> std::collections::BTreeSet<u64> {
        bpf_programs(&["tcp_send_reset", "tcp_receive_res", "sched_process_h", "mark_victim"])
            .iter()
            .filter_map(|p| p["id"].as_u64())
            .collect()
    };
    let before = ours();
    let mut agent = Agent::start(&[]);
    let loaded: Vec<u64> = ours().difference(&before).copied().collect();
    assert_eq!(loaded.len(), 4, "the agent's programs (tcp-reset: 2, hung-task: 1, oom: 1): {loaded:?}");
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
