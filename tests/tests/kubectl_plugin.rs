//! The kubectl plugin (deploy/kubectl-kstall) against a fake `kubectl` that records its calls and
//! answers like a cluster would: it must find the pod's node, the kstall agent on that node, and
//! run the same kstall command there.

use std::{path::Path, process::Command};

/// Runs the plugin with a fake kubectl first on PATH; returns (exit code, stderr, kubectl calls).
fn plugin(args: &[&str]) -> (Option<i32>, String, Vec<String>) {
    let dir = tempfile::tempdir().unwrap();
    let calls = dir.path().join("calls");
    let fake = dir.path().join("kubectl");
    std::fs::write(
        &fake,
        format!(
            r#"#!/bin/sh
echo "$*" >> {calls}
case "$*" in
  "get pod web-1 --namespace shop -o jsonpath={{.spec.nodeName}}") printf node-a ;;
  "get pod pending-0 --namespace shop -o jsonpath={{.spec.nodeName}}") printf '' ;;
  "get pods --namespace kstall -l app.kubernetes.io/name=kstall --field-selector spec.nodeName=node-a -o jsonpath={{.items[0].metadata.name}}") printf kstall-x7k2p ;;
  "get pods --namespace kstall -l app.kubernetes.io/name=kstall --field-selector spec.nodeName=node-b -o jsonpath={{.items[0].metadata.name}}") printf '' ;;
  exec*) ;;
  *) echo "Error from server (NotFound)" >&2; exit 1 ;;
esac
"#,
            calls = calls.display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&fake, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/kubectl-kstall");
    let out = Command::new(script)
        .args(args)
        .env("PATH", format!("{}:/usr/bin:/bin", dir.path().display()))
        .output()
        .expect("run kubectl-kstall");
    let calls = std::fs::read_to_string(&calls).unwrap_or_default().lines().map(String::from).collect();
    (out.status.code(), String::from_utf8_lossy(&out.stderr).into_owned(), calls)
}

#[test]
fn runs_the_command_on_the_pods_node() {
    let (code, stderr, calls) = plugin(&["trace", "--pod", "web-1", "-n", "shop", "--port", "2049"]);
    assert_eq!(code, Some(0), "{stderr}");
    assert_eq!(
        calls.last().unwrap(),
        "exec -i --namespace kstall kstall-x7k2p -- kstall trace --pod web-1 -n shop --port 2049"
    );
    let (code, _, calls) = plugin(&["explain", "pod", "web-1", "-n", "shop"]);
    assert_eq!(code, Some(0));
    assert_eq!(
        calls.last().unwrap(),
        "exec -i --namespace kstall kstall-x7k2p -- kstall explain pod web-1 -n shop"
    );
    let (code, _, calls) = plugin(&["incidents", "--node", "node-a", "--all"]);
    assert_eq!(code, Some(0));
    assert_eq!(calls.len(), 2, "no pod lookup with --node: {calls:?}");
    assert_eq!(calls.last().unwrap(), "exec -i --namespace kstall kstall-x7k2p -- kstall incidents --all");
}

#[test]
fn says_what_is_missing() {
    for (args, expect, exit) in [
        (&["incidents"][..], "say which node", 64),
        (&[][..], "no kstall command", 64),
        (&["trace", "--pod", "ghost", "-n", "shop"][..], "cannot find pod ghost in namespace shop", 1),
        (&["trace", "--pod", "pending-0", "-n", "shop"][..], "not scheduled", 1),
        (&["status", "--node", "node-b"][..], "no kstall agent runs on node node-b", 1),
    ] {
        let (code, stderr, calls) = plugin(args);
        assert_eq!(code, Some(exit), "{args:?}: {stderr}");
        assert!(stderr.lines().any(|l| l.contains(expect)), "{args:?}: {stderr}");
        assert!(!calls.iter().any(|c| c.starts_with("exec")), "{args:?}: nothing run: {calls:?}");
    }
}
