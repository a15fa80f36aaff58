//! The benchmark's storms, small: every event driven is counted, whatever the ring buffer or the
//! sampling did with it, by an agent held to the DaemonSet's memory limit. Checks nothing of
//! timing; `cargo xtask bench` drives them large and prints what they cost.

use kstall_tests::{
    kernel_tests_can_run,
    storms::{Detail, Row, distinct_ports, drop_storm, hung_tasks, oom_storm, reset_storm},
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

#[test]
fn resets_to_distinct_ports_are_counted_exactly() {
    if kernel_tests_can_run("resets_to_distinct_ports_are_counted_exactly") {
        let row = distinct_ports(300, false);
        assert_counted(&row);
        assert_eq!(row.series, 600, "one series per port and direction");
    }
}

#[test]
fn a_hung_task_storm_is_counted_once_per_task() {
    if kernel_tests_can_run("a_hung_task_storm_is_counted_once_per_task") {
        assert_counted(&hung_tasks(5, false));
    }
}

#[test]
fn an_oom_storm_is_counted_exactly() {
    if kernel_tests_can_run("an_oom_storm_is_counted_exactly") {
        assert_counted(&oom_storm(3, false));
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
