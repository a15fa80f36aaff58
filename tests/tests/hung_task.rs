//! The hung-task probe against the real kernel: a writer really stuck in writeback (D state),
//! reported once however often the detector repeats itself, attributed to its cgroup, classified,
//! and cleared when it is released.

use std::time::Duration;

use kstall_tests::{
    agent::Agent,
    cgroup::Cgroup,
    host::{Sysctl, wait_for},
    kernel_tests_can_run,
    netns::own_netns_inode,
    writeback::FreezableDisk,
};

const TIMEOUT_SYSCTL: &str = "kernel.hung_task_timeout_secs";

#[test]
fn writer_stuck_in_writeback_is_reported_once_and_cleared() {
    if !kernel_tests_can_run("writer_stuck_in_writeback_is_reported_once_and_cleared") {
        return;
    }
    // The agent lowers the sysctl itself (--hung-task-timeout-secs) and restores it; this guard
    // restores it too should the agent die before it can.
    let original = std::fs::read_to_string("/proc/sys/kernel/hung_task_timeout_secs").unwrap();
    let _restore = Sysctl::set(TIMEOUT_SYSCTL, original.trim());
    let _warnings = Sysctl::keep("kernel.hung_task_warnings");
    let cgroup = Cgroup::new("hung");
    let mut disk = FreezableDisk::new("hung");
    let mut agent = Agent::start(&["--hung-task-timeout-secs", "3"]);
    let status = agent.status();
    let probe = status["probes"].as_array().unwrap().iter().find(|p| p["name"] == "hung-task").unwrap();
    let note = format!("detector: kernel.hung_task_timeout_secs=3 (set by kstall, was {})", original.trim());
    assert!(probe["notes"].as_array().unwrap().iter().any(|n| n == note.as_str()), "{note:?} in {probe}");
    let events = agent.subscribe();

    disk.freeze();
    let writer = disk.start_writer(&cgroup.procs());
    let is_writer = |e: &serde_json::Value| e["kind"] == "hung_task" && e["pid"] == writer;
    let first = events.collect(is_writer, 1, Duration::from_secs(30));
    assert_eq!(first.len(), 1, "writer {writer} reported hung:\n{}", agent.log());
    // The detector checks every 3 s and reports the writer each time: once it has done so twice
    // more, kstall has folded the repeats into the one event.
    let reports = || agent.metric(r#"kstall_events_total{probe="hung-task"}"#).unwrap_or(0.0);
    let repeated = wait_for(Duration::from_secs(30), || (reports() >= 3.0).then_some(()));
    assert!(repeated.is_some(), "the detector repeated itself ({} reports)", reports());
    let hung = events.collect(is_writer, 2, Duration::ZERO);
    assert_eq!(hung.len(), 1, "one hung task however many reports ({}): {hung:#?}", reports());

    let e = &hung[0];
    assert_eq!(e["comm"], "dd", "{e}");
    assert_eq!(e["tgid"], writer, "{e}");
    assert_eq!(e["cgroup_id"], cgroup.id(), "{e}");
    assert_eq!(e["netns"], own_netns_inode(), "{e}");
    assert_eq!(e["wait"], "writeback", "{e}");
    assert!(e["blocked_secs"].as_u64().is_some_and(|s| s >= 3), "{e}");
    let stack: Vec<&str> = e["stack"].as_array().unwrap().iter().filter_map(|f| f.as_str()).collect();
    assert!(stack.iter().any(|f| f.starts_with("folio_wait")), "{stack:?}");
    assert!(
        agent
            .metric(r#"kstall_stuck_tasks{container="",host="true",kind="uninterruptible",namespace="",pod="",wait="writeback",workload=""}"#)
            .unwrap_or(0.0)
            >= 1.0,
        "{}",
        agent.metrics()
    );
    assert!(agent.metric(r#"kstall_stuck_task_longest_blocked_seconds"#).unwrap_or(0.0) >= 3.0);

    disk.thaw();
    disk.wait_writers(Duration::from_secs(30));
    let cleared = events.collect(
        |e| e["kind"] == "hung_task_cleared" && e["pid"] == writer,
        1,
        Duration::from_secs(10),
    );
    assert_eq!(cleared.len(), 1, "cleared after the thaw:\n{}", agent.log());
    assert_eq!(cleared[0]["wait"], "writeback");

    assert_eq!(agent.stop(), Some(0), "{}", agent.log());
    assert_eq!(
        std::fs::read_to_string("/proc/sys/kernel/hung_task_timeout_secs").unwrap(),
        original,
        "the agent restores the sysctl it lowered"
    );
}
