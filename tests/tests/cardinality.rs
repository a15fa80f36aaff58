//! A hostile workload must not blow up the series kstall exports: a port scan of 3,000 closed
//! ports, in a namespace of no pod, against a real agent. By default the ports that are not well
//! known are counted as a class; with every port kept by number, the family's cap holds and the
//! overflow series and the dropped counter account for the rest.

use std::net::SocketAddr;

use kstall_tests::{
    agent::{Agent, COUNTED_WITHIN, samples_with},
    alerting::promtool_complaints,
    host::{memory_kib, wait_for},
    kernel_tests_can_run,
    netns::{NetNs, refused_connects},
};

const RESETS: &str = "kstall_tcp_resets_total";
const PORTS: u16 = 3000;
/// One refused connect a port, seen twice: the reset sent and the reset received.
const RESETS_DRIVEN: f64 = 2.0 * PORTS as f64;
/// The scan's namespace is no pod's and not the host's: its series say host="false".
const NOT_HOST: (&str, &str) = ("host", "false");

/// The scan's first port: none from here on is well known (20048, NFS mountd, is below).
const FIRST_PORT: u16 = 21000;

/// Connects once to each of 3,000 closed ports in a fresh namespace.
fn port_scan(ns: &NetNs) {
    ns.run_inside(|| {
        for port in FIRST_PORT..FIRST_PORT + PORTS {
            refused_connects(SocketAddr::from(([127, 0, 0, 1], port)), 1);
        }
    });
}

/// What the scan left: the figures the issue asks for, printed.
fn report(test: &str, agent: &Agent, metrics: &str) {
    let (rss, _) = memory_kib(agent.pid());
    println!(
        "cardinality: {test}: {} {RESETS} series, {} bytes a scrape, RSS {:.1} MiB",
        samples_with(metrics, RESETS, &[]).count(),
        metrics.len(),
        rss as f64 / 1024.0
    );
}

fn family<'a>(status: &'a serde_json::Value, metric: &str) -> &'a serde_json::Value {
    let families = status["series"].as_array().expect("status lists the series per family");
    families.iter().find(|f| f["metric"] == metric).unwrap_or_else(|| panic!("{metric} in {status}"))
}

#[test]
fn a_port_scan_is_counted_by_port_class_not_by_port() {
    if !kernel_tests_can_run("a_port_scan_is_counted_by_port_class_not_by_port") {
        return;
    }
    let agent = Agent::start(&[]);
    let ns = NetNs::new("scan");
    port_scan(&ns);

    let counted = wait_for(COUNTED_WITHIN, || {
        let metrics = agent.metrics();
        let sum: f64 = samples_with(&metrics, RESETS, &[NOT_HOST]).sum();
        (sum >= RESETS_DRIVEN).then_some(metrics)
    });
    let metrics =
        counted.unwrap_or_else(|| panic!("{} resets not counted:\n{}", RESETS_DRIVEN, agent.metrics()));
    for direction in ["sent", "received"] {
        let class = [NOT_HOST, ("direction", direction), ("port", "other")];
        assert_eq!(
            samples_with(&metrics, RESETS, &class).collect::<Vec<_>>(),
            [f64::from(PORTS)],
            "{direction}: one series, every reset in it:\n{metrics}"
        );
    }
    report("by class", &agent, &metrics);
    let scan_series = samples_with(&metrics, RESETS, &[NOT_HOST]).count();
    assert_eq!(scan_series, 2, "the scan made one series a direction:\n{metrics}");
    let status = agent.status();
    let resets = family(&status, RESETS);
    assert!(resets["series"].as_u64().is_some_and(|n| n < 20), "{resets}");
    assert_eq!(resets["dropped"], 0, "{resets}");
    let complaints = promtool_complaints(&metrics);
    assert!(complaints.is_empty(), "{complaints}");
}

#[test]
fn past_the_series_cap_resets_go_to_the_overflow_series_and_are_counted_as_dropped() {
    if !kernel_tests_can_run(
        "past_the_series_cap_resets_go_to_the_overflow_series_and_are_counted_as_dropped",
    ) {
        return;
    }
    const CAP: usize = 1000;
    // Every scanned port kept by number: 6,000 series asked for.
    let agent = Agent::start(&["--metric-ports", "20000-29999", "--max-series-per-metric", &CAP.to_string()]);
    let ns = NetNs::new("scan-cap");
    port_scan(&ns);

    let overflow = [("direction", "overflow"), ("port", "overflow")];
    let counted = wait_for(COUNTED_WITHIN, || {
        let metrics = agent.metrics();
        let kept: f64 = samples_with(&metrics, RESETS, &[NOT_HOST]).sum();
        let overflowed: f64 = samples_with(&metrics, RESETS, &overflow).sum();
        (kept + overflowed >= RESETS_DRIVEN).then_some(metrics)
    });
    let metrics =
        counted.unwrap_or_else(|| panic!("{RESETS_DRIVEN} resets not counted:\n{}", agent.metrics()));
    // Every series but the overflow one is within the cap; the host's own resets, if any, took
    // room too, so the scan's are at most the cap.
    report("every port kept, capped", &agent, &metrics);
    let all = samples_with(&metrics, RESETS, &[]).count();
    assert_eq!(all, CAP + 1, "the cap's series and the overflow series:\n{metrics}");
    let kept: Vec<f64> = samples_with(&metrics, RESETS, &[NOT_HOST]).collect();
    assert!(kept.iter().all(|&v| v == 1.0), "one reset a kept series: {kept:?}");
    let overflowed: Vec<f64> = samples_with(&metrics, RESETS, &overflow).collect();
    assert_eq!(overflowed.len(), 1, "one overflow series:\n{metrics}");
    let refused = RESETS_DRIVEN - kept.len() as f64;
    assert!(overflowed[0] >= refused, "{} in overflow, {refused} refused", overflowed[0]);

    let status = agent.status();
    let resets = family(&status, RESETS);
    assert_eq!(
        (resets["series"].as_u64(), resets["max"].as_u64()),
        (Some(CAP as u64), Some(CAP as u64)),
        "{resets}"
    );
    assert!(resets["dropped"].as_f64().is_some_and(|d| d >= refused), "{resets}: {refused} refused");
    let dropped = agent.metric(&format!(r#"kstall_metric_series_dropped_total{{metric="{RESETS}"}}"#));
    assert!(dropped.is_some_and(|d| d >= refused), "dropped {dropped:?}, {refused} refused");
    let exposition_bytes = metrics.len();
    assert!(exposition_bytes < 1 << 20, "{exposition_bytes} bytes a scrape");
    let complaints = promtool_complaints(&metrics);
    assert!(complaints.is_empty(), "{complaints}");
}
