//! The benchmark's storms, small: every event driven is counted, whatever the ring buffer or the
//! sampling did with it, by an agent held to the DaemonSet's memory limit. Checks nothing of
//! timing; `cargo xtask bench` drives them large and prints what they cost.

use kstall_tests::{
    kernel_tests_can_run,
    storms::{
        Detail, Row, distinct_ports, drop_storm, hung_tasks, oom_storm, reset_storm, streamed_reset_storm,
    },
};

fn assert_counted(row: &Row) {
    assert!(row.exact(), "{}: {} {} driven, {} counted", row.scenario, row.driven, row.unit, row.counted);
    assert!(
        row.accounted(),
        "{}: {} driven, events {} received + {} lost + {} suppressed",
        row.scenario,
        row.driven,
        row.received,
        row.lost,
        row.suppressed
    );
    assert!(
        row.held_to_limit(),
        "{}: peak {} KiB, {} OOM kills at the agent's {} MiB limit",
        row.scenario,
        row.peak_kib,
        row.agent_oom_kills,
        row.limit_bytes >> 20
    );
}

#[test]
fn a_reset_storm_is_counted_exactly() {
    if kernel_tests_can_run("a_reset_storm_is_counted_exactly") {
        assert_counted(&reset_storm(1, Detail::Sampled, None));
    }
}

#[test]
fn a_reset_storm_sent_in_full_is_counted_exactly() {
    if kernel_tests_can_run("a_reset_storm_sent_in_full_is_counted_exactly") {
        assert_counted(&reset_storm(1, Detail::Full, None));
    }
}

/// With the default sampling, what a log shipper following the rotating file reads is every reset
/// the kernel sent in full, each once and in order, and counts that add up to the storm: the
/// stream keeps up, nothing is dropped. (Every reset in full outruns the writer on two cores: the
/// bench's row, whose drops are counted.)
#[test]
fn a_reset_storm_streamed_as_json_lines_reaches_a_follower_of_the_rotating_file_whole() {
    if !kernel_tests_can_run(
        "a_reset_storm_streamed_as_json_lines_reaches_a_follower_of_the_rotating_file_whole",
    ) {
        return;
    }
    let (row, followed) = streamed_reset_storm(3, Detail::Sampled, |_| true);
    assert_counted(&row);
    let (records, files) = (followed.seqs.len(), followed.files);
    assert_eq!(records, followed.records.len());
    let bad = &followed.bad_lines;
    assert!(bad.is_empty(), "lines that are not JSON: {:?}", &bad[..3.min(bad.len())]);
    assert!(files >= 2, "the 64 KiB file rotated while followed ({records} records)");
    assert!(!followed.repeated(), "no record twice");
    assert_eq!(row.export_dropped, 0.0, "a file keeps up with a reset storm");
    assert_eq!(followed.seq_gaps(), 0, "no record missing from the stream");
    // The storm's: to or from the redirected port or the closed one it was sent to (a count's
    // ports are text: a class, or a kept port's number).
    let ours = |r: &&serde_json::Value| {
        let e = &r["event"];
        r["record"] == "event"
            && ["local_port", "remote_port", "original_dst_port", "port", "original_port"]
                .iter()
                .filter_map(|k| e[k].as_u64().or_else(|| e[k].as_str()?.parse().ok()))
                .any(|port| port == 2049 || port == 15001)
    };
    let of_kind =
        |kind: &'static str| followed.records.iter().filter(ours).filter(move |r| r["event"]["kind"] == kind);
    let resets = of_kind("tcp_reset").count() as f64;
    assert_eq!(
        resets + row.lost + row.suppressed,
        row.driven as f64,
        "every reset the kernel sent in full is a line (lost {}, suppressed {})",
        row.lost,
        row.suppressed
    );
    let counted: u64 = of_kind("tcp_reset_count").filter_map(|r| r["event"]["resets"].as_u64()).sum();
    assert_eq!(counted, row.driven, "the stream's counts add up to the storm");
    for r in &followed.records {
        assert_eq!(r["schema"], "kstall/v1", "{r}");
        assert!(r["time"].as_str().is_some_and(|t| t.ends_with('Z')), "{r}");
    }
    println!("{records} records in {files} files; {}", row.notes.join("; "));
}

#[test]
fn resets_to_distinct_ports_are_counted_exactly() {
    if kernel_tests_can_run("resets_to_distinct_ports_are_counted_exactly") {
        let row = distinct_ports(300, None);
        assert_counted(&row);
        assert_eq!(row.series, 600, "one series per port and direction");
    }
}

#[test]
fn a_hung_task_storm_is_counted_once_per_task() {
    if kernel_tests_can_run("a_hung_task_storm_is_counted_once_per_task") {
        assert_counted(&hung_tasks(5, None));
    }
}

#[test]
fn an_oom_storm_is_counted_exactly() {
    if kernel_tests_can_run("an_oom_storm_is_counted_exactly") {
        assert_counted(&oom_storm(3, None));
    }
}

#[test]
fn a_drop_storm_is_counted_exactly() {
    if kernel_tests_can_run("a_drop_storm_is_counted_exactly") {
        assert_counted(&drop_storm(1, 1, None));
    }
}

#[test]
fn drops_to_distinct_ports_make_one_series() {
    if kernel_tests_can_run("drops_to_distinct_ports_make_one_series") {
        let row = drop_storm(1, 3000, None);
        assert_counted(&row);
        assert_eq!(row.series, 1, "ports outside the kept ones are one class: port=\"other\"");
    }
}
