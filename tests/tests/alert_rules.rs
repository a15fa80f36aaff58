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
