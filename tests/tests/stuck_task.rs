//! The stuck-task sampler against the real kernel, with the hung-task detector off
//! (`kernel.hung_task_timeout_secs=0`, restored after): a writer stuck in writeback and a reader in
//! a killable wait on the same frozen disk, each in its own pod, are found by the sampler alone,
//! with stack, wait class and kind, attributed to their pods (and in `kstall trace --probe
//! stuck-task`), and cleared when the disk thaws.

use std::time::Duration;

use kstall_tests::{
    agent::{Agent, TraceCapture, pod_json, write_pods_file},
    cgroup::Cgroup,
    host::Sysctl,
    kernel_tests_can_run,
    writeback::FreezableDisk,
};
use serde_json::Value;

const WRITER_UID: &str = "0b5e8f1a-2c3d-4e5f-9a0b-1c2d3e4f5a6b";
const READER_UID: &str = "7c6d5e4f-3a2b-4c1d-8e9f-0a1b2c3d4e5f";
const WRITER_CONTAINER: &str = "1f2e3d4c5b6a79881f2e3d4c5b6a79881f2e3d4c5b6a79881f2e3d4c5b6a7988";
const READER_CONTAINER: &str = "8a9b0c1d2e3f40518a9b0c1d2e3f40518a9b0c1d2e3f40518a9b0c1d2e3f4051";

fn stack(e: &Value) -> Vec<&str> {
    e["stack"].as_array().map(|s| s.iter().filter_map(|f| f.as_str()).collect()).unwrap_or_default()
}

#[test]
fn sampler_finds_uninterruptible_and_killable_waits_with_the_detector_off() {
    if !kernel_tests_can_run("sampler_finds_uninterruptible_and_killable_waits_with_the_detector_off") {
        return;
    }
    let _detector_off = Sysctl::set("kernel.hung_task_timeout_secs", "0");
    let dir = tempfile::tempdir().unwrap();
    let pods_file = dir.path().join("pods.json");
    write_pods_file(
        &pods_file,
        &[
            pod_json(WRITER_UID, "writer-7d9f", WRITER_CONTAINER),
            pod_json(READER_UID, "reader-init-4c2b", READER_CONTAINER),
        ],
    );
    let writer_cgroup = Cgroup::kubepods_container("burstable", WRITER_UID, WRITER_CONTAINER);
    let reader_cgroup = Cgroup::kubepods_container("besteffort", READER_UID, READER_CONTAINER);
    let mut disk = FreezableDisk::new("sampler");
    disk.prepare_read_file();
    let mut agent = Agent::start(&[
        "--pods-file",
        pods_file.to_str().unwrap(),
        "--stuck-task-interval",
        "1s",
        "--stuck-task-threshold",
        "3s",
    ]);
    let status = agent.status();
    let hung = status["probes"].as_array().unwrap().iter().find(|p| p["name"] == "hung-task").unwrap();
    assert!(hung.to_string().contains("stuck-task (the sampler) still finds stuck tasks"), "{hung}");
    let events = agent.subscribe();
    // `kstall trace` as a user runs it for the reader's pod, capturing before it gets stuck.
    let trace = TraceCapture::of(
        &agent,
        &[
            "--probe",
            "stuck-task",
            "--pod",
            "reader-init-4c2b",
            "--count",
            "1",
            "--duration",
            "60s",
            "--output",
            "json",
        ],
    );

    disk.freeze();
    let writer = disk.start_writer(&writer_cgroup.procs());
    let reader = disk.start_reader(&reader_cgroup.procs());
    let found = |pid: u32| move |e: &Value| e["kind"] == "stuck_task" && e["tgid"] == pid;
    let writer_found = events.collect(found(writer), 1, Duration::from_secs(30));
    assert_eq!(writer_found.len(), 1, "writer {writer} found by the sampler:\n{}", agent.log());
    let reader_found = events.collect(found(reader), 1, Duration::from_secs(30));
    assert_eq!(reader_found.len(), 1, "reader {reader} found by the sampler:\n{}", agent.log());

    let w = &writer_found[0];
    assert_eq!((w["probe"].as_str(), w["comm"].as_str()), (Some("stuck-task"), Some("dd")), "{w}");
    assert_eq!(w["wait"], "writeback", "{w}");
    assert_eq!(w["wait_kind"], "uninterruptible", "{w}");
    assert_eq!(
        (w["pod"].as_str(), w["cgroup_id"].as_u64()),
        (Some("writer-7d9f"), Some(writer_cgroup.id())),
        "{w}"
    );
    assert!(w["blocked_secs"].as_u64().is_some_and(|s| s >= 3), "{w}");
    assert!(stack(w).iter().any(|f| f.starts_with("folio_wait")), "{w}");

    let (code, traced, stderr) = trace.lines();
    assert_eq!((code, traced.len()), (Some(0), 1), "kstall trace: {traced:#?} {stderr}");
    let t: Value = serde_json::from_str(&traced[0]).expect("one JSON event");
    assert_eq!(
        (&t["kind"], &t["tgid"], &t["wait_kind"], &t["pod"]),
        (&"stuck_task".into(), &reader.into(), &"killable".into(), &"reader-init-4c2b".into()),
        "the trace has the reader's report, as the event stream: {t:#}"
    );
    let r = &reader_found[0];
    assert_eq!(r["comm"], "cat", "{r}");
    assert_eq!(r["wait_kind"], "killable", "the detector skips this sleep: {r}");
    assert_eq!(r["wait"], "block_io", "a read waiting for its page from the disk: {r}");
    assert_eq!(r["pod"], "reader-init-4c2b", "{r}");
    assert!(stack(r).iter().any(|f| f.starts_with("folio_wait_bit") || f.starts_with("filemap_")), "{r}");

    let metrics = agent.metrics();
    let gauge = |kind: &str, pod: &str| {
        kstall_tests::agent::sample_with(&metrics, "kstall_stuck_tasks", &[("kind", kind), ("pod", pod)])
    };
    assert_eq!(gauge("uninterruptible", "writer-7d9f"), Some(1.0), "{metrics}");
    assert_eq!(gauge("killable", "reader-init-4c2b"), Some(1.0), "{metrics}");
    assert_eq!(
        kstall_tests::agent::sample_with(&metrics, "kstall_events_total", &[("probe", "hung-task")]),
        Some(0.0),
        "the detector is off: everything came from the sampler"
    );
    assert!(agent.metric("kstall_stuck_task_sweep_tasks").is_some_and(|n| n > 10.0), "{metrics}");
    // explain shows the same task, from the same set.
    let explained = agent.explain("writer-7d9f");
    let tasks = explained["stuck_tasks"].as_array().cloned().unwrap_or_default();
    assert!(
        tasks.iter().any(|t| t["tid"] == writer
            && t["sources"][0] == "stuck-task"
            && t["wait_kind"] == "uninterruptible"),
        "{explained:#}"
    );

    disk.thaw();
    disk.wait_writers(Duration::from_secs(30));
    for pid in [writer, reader] {
        let cleared = events.collect(
            |e| e["kind"] == "hung_task_cleared" && e["tgid"] == pid,
            1,
            Duration::from_secs(10),
        );
        assert_eq!(cleared.len(), 1, "{pid} cleared after the thaw:\n{}", agent.log());
    }
    let metrics = agent.metrics();
    // The reader's blocked time is in the histogram (the loop device's worker, reading the frozen
    // FUSE file for it, waits killably too and may be there as well).
    let observed = kstall_tests::agent::sample_with(
        &metrics,
        "kstall_stuck_task_blocked_seconds_count",
        &[("kind", "killable"), ("wait", "block_io")],
    );
    assert!(observed.is_some_and(|n| n >= 1.0), "{metrics}");
    assert_eq!(agent.stop(), Some(0), "{}", agent.log());
}
