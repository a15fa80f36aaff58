//! The healthy node, short (`cargo xtask soak --healthy` runs it long): traffic of every kind
//! kstall watches from pods that are well — mesh pods with Istio's sidecar rules, Istio ambient's
//! and Linkerd's, each with a live proxy that idles connections out, resets what it rejects and
//! restarts, a port scan, a server that refuses,
//! memory churn, writeback with fsync, one OOM kill — and no incident may fire
//! (`tests/src/healthy.rs`).

use std::{path::Path, time::Duration};

use kstall_tests::{healthy, kernel_tests_can_run};

#[test]
fn a_healthy_node_fires_nothing() {
    if !kernel_tests_can_run("a_healthy_node_fires_nothing") {
        return;
    }
    let secs = std::env::var("KSTALL_HEALTHY_SECS").ok().and_then(|v| v.parse().ok()).unwrap_or(120);
    let report = healthy::soak(Path::new(env!("CARGO_BIN_EXE_mesh_proxy")), Duration::from_secs(secs));
    println!("{}", report.lines());
    assert!(
        report.incidents.is_empty(),
        "incidents on a healthy node:\n{:#?}\nthe events of their pods:\n{:#?}\n{}",
        report.incidents,
        report.incident_events,
        report.lines()
    );
    // The traffic was there, and the agent saw it.
    for work in [
        "http_requests",
        "rpcs",
        "http_requests_ambient",
        "rpcs_ambient",
        "http_requests_linkerd",
        "rpcs_linkerd",
        "inbound_requests",
        "scanned_closed_ports",
        "refused_by_server",
        "rejected_by_proxy",
        "proxy_restarts",
        "memory_cycles",
        "fsyncs",
    ] {
        assert!(report.work.get(work).is_some_and(|&n| n > 0), "no {work}: {}", report.lines());
    }
    assert_eq!(report.work.get("ooms"), Some(&1), "{}", report.lines());
    assert_eq!(
        report.events.get("oom_kill"),
        report.work.get("oom_victims"),
        "the one OOM's kills seen: {}",
        report.lines()
    );
    let scanner = report.work["scanned_closed_ports"] + report.work["refused_by_server"];
    assert_eq!(
        report.scanner_resets_counted,
        scanner as f64,
        "the scanner's resets counted: {}",
        report.lines()
    );
    assert!(
        report.resets.from_a_socket > 0,
        "the proxy's and the server's own resets seen: {}",
        report.lines()
    );
}
