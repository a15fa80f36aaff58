//! The soak, short (`cargo xtask soak` runs it long: 2,000 pods over 10 minutes): pods churned
//! through the pods file with real cgroups, network namespaces, resets and OOM kills, the agent
//! held to the DaemonSet's memory limit. Once every pod is past retention, what the agent holds
//! (RSS, open fds, the attribution index) is back within 10% of its baseline, and no series
//! names a churned pod.

use std::time::Duration;

use kstall_tests::{kernel_tests_can_run, soak};

/// `KSTALL_SOAK_PODS` and `KSTALL_SOAK_SECS` make it the long one.
fn setting(name: &str, default: u64) -> u64 {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

#[test]
fn after_a_pod_churn_the_agent_holds_what_it_held_before() {
    if !kernel_tests_can_run("after_a_pod_churn_the_agent_holds_what_it_held_before") {
        return;
    }
    let pods = setting("KSTALL_SOAK_PODS", 120) as usize;
    let secs = setting("KSTALL_SOAK_SECS", 30);
    let report = soak::soak(pods, Duration::from_secs(secs));
    println!("{}", report.lines());
    assert!(
        report.peak.pod_series > report.baseline.pod_series,
        "the churn made series of its pods: {report:?}"
    );
    let grown = report.returned();
    assert!(grown.is_empty(), "not back to the baseline: {grown:?}\n{}", report.lines());
}
