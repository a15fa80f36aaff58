//! The shipped Prometheus alerting rules, checked and unit-tested by the real promtool (Debian's
//! `prometheus` package, installed by the bootstrap), and every runbook they point at present.

use std::{path::Path, process::Command};

fn promtool(args: &[&str]) -> String {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/prometheus");
    let out = Command::new("promtool")
        .args(args)
        .current_dir(&dir)
        .output()
        .expect("promtool (Debian package `prometheus`; `cargo xtask test` installs it)");
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "promtool {args:?}:\n{text}");
    text
}

#[test]
fn rules_are_valid_and_their_unit_tests_pass() {
    let checked = promtool(&["check", "rules", "kstall-rules.yaml"]);
    assert!(checked.contains("SUCCESS"), "{checked}");
    let tested = promtool(&["test", "rules", "kstall-rules.test.yaml"]);
    assert!(tested.contains("SUCCESS"), "{tested}");
}

#[test]
fn every_signature_has_an_alert_and_every_runbook_exists() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let rules = std::fs::read_to_string(root.join("deploy/prometheus/kstall-rules.yaml")).unwrap();
    for signature in [
        "nfs-sidecar-redirect",
        "nfs-server-unreachable",
        "nfs-node-wide-stall",
        "nfs-slow",
        "pod-termination-blocked",
        "system-oom",
        "container-oom-loop",
        "kubelet-degraded",
        "cpu-soft-lockup",
        "network-policy-drops",
        "conntrack-table-full",
        "memory-pressure",
    ] {
        assert!(rules.contains(&format!(r#"signature="{signature}""#)), "no alert for {signature}");
        assert!(root.join(format!("docs/runbooks/{signature}.md")).exists(), "no runbook for {signature}");
    }
    for line in rules.lines().filter_map(|l| l.trim().strip_prefix("runbook: ")) {
        assert!(root.join(line.trim()).exists(), "runbook {line} is missing");
    }
}

/// The shipped Alertmanager fragment, on a real Alertmanager: while a fleet alert fires, the
/// per-node alerts it sums up are held back (inhibited), and nothing else is.
#[test]
fn the_fleet_alerts_hold_back_the_per_node_ones_they_sum_up() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let config = root.join("deploy/alertmanager/kstall-inhibit.yaml");
    let checked = Command::new("amtool").arg("check-config").arg(&config).output().expect("amtool");
    assert!(checked.status.success(), "{}", String::from_utf8_lossy(&checked.stdout));
    let am = kstall_tests::alerting::alertmanager_with_config(&config);
    let alert = |labels: &[(&str, &str)]| {
        let labels: serde_json::Map<String, serde_json::Value> =
            labels.iter().map(|(k, v)| (k.to_string(), (*v).into())).collect();
        serde_json::json!({"labels": labels})
    };
    let alerts = serde_json::json!([
        alert(&[
            ("alertname", "KstallNfsServerUnreachableFromNodes"),
            ("signature", "nfs-server-unreachable"),
            ("server", "10.0.0.5"),
            ("severity", "critical")
        ]),
        alert(&[
            ("alertname", "KstallNfsServerUnreachable"),
            ("signature", "nfs-server-unreachable"),
            ("node", "node-a"),
            ("severity", "critical")
        ]),
        alert(&[
            ("alertname", "KstallNfsSidecarRedirectRollout"),
            ("signature", "nfs-sidecar-redirect"),
            ("namespace", "shop"),
            ("workload", "Deployment/web"),
            ("severity", "critical")
        ]),
        alert(&[
            ("alertname", "KstallNfsSidecarRedirect"),
            ("signature", "nfs-sidecar-redirect"),
            ("namespace", "shop"),
            ("pod", "web-1"),
            ("node", "node-a"),
            ("severity", "critical")
        ]),
        alert(&[
            ("alertname", "KstallNfsSidecarRedirect"),
            ("signature", "nfs-sidecar-redirect"),
            ("namespace", "billing"),
            ("pod", "pay-1"),
            ("node", "node-b"),
            ("severity", "critical")
        ]),
        alert(&[
            ("alertname", "KstallSignatureOnManyNodes"),
            ("signature", "memory-pressure"),
            ("severity", "warning")
        ]),
        alert(&[
            ("alertname", "KstallMemoryPressure"),
            ("signature", "memory-pressure"),
            ("namespace", "shop"),
            ("pod", "a"),
            ("node", "node-c"),
            ("severity", "warning")
        ]),
        alert(&[
            ("alertname", "KstallSystemOom"),
            ("signature", "system-oom"),
            ("node", "node-d"),
            ("severity", "critical")
        ]),
    ]);
    let posted = Command::new("curl")
        .args(["--silent", "--fail", "-H", "Content-Type: application/json", "--data-binary"])
        .arg(alerts.to_string())
        .arg(format!("http://{}/api/v2/alerts", am.addr))
        .output()
        .expect("curl");
    assert!(posted.status.success(), "POST alerts: {}", String::from_utf8_lossy(&posted.stderr));
    // (alertname, namespace or node) -> inhibited?
    let expected = [
        ("KstallNfsServerUnreachableFromNodes", "", false),
        ("KstallNfsServerUnreachable", "node-a", true),
        ("KstallNfsSidecarRedirectRollout", "shop", false),
        ("KstallNfsSidecarRedirect", "shop", true),
        ("KstallNfsSidecarRedirect", "billing", false),
        ("KstallSignatureOnManyNodes", "", false),
        ("KstallMemoryPressure", "shop", true),
        ("KstallSystemOom", "node-d", false),
    ];
    let states = || -> Vec<(String, String, bool)> {
        am.get_json("/api/v2/alerts")
            .as_array()
            .into_iter()
            .flatten()
            .map(|a| {
                let l = &a["labels"];
                let place = l["namespace"].as_str().or(l["node"].as_str()).unwrap_or("");
                let place =
                    if l["alertname"].as_str().is_some_and(|n| n.ends_with("Nodes")) { "" } else { place };
                let inhibited = !a["status"]["inhibitedBy"].as_array().is_none_or(|by| by.is_empty());
                (l["alertname"].as_str().unwrap_or("").to_string(), place.to_string(), inhibited)
            })
            .collect()
    };
    let mut wanted: Vec<(String, String, bool)> =
        expected.iter().map(|(a, p, i)| (a.to_string(), p.to_string(), *i)).collect();
    wanted.sort();
    let seen = kstall_tests::host::wait_for(std::time::Duration::from_secs(30), || {
        let mut now = states();
        now.sort();
        (now == wanted).then_some(now)
    });
    assert!(
        seen.is_some(),
        "inhibited as expected: {wanted:?}\nAlertmanager says: {:?}\n{}",
        states(),
        am.log()
    );
}
