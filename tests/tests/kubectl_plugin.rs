//! The kubectl plugin (deploy/kubectl-kstall) against a fake `kubectl` that records its calls and
//! answers like a cluster would: it must find the pod's node, the kstall agent on that node, and
//! run the same kstall command there.

use std::{path::Path, process::Command};

/// Runs the plugin with a fake kubectl first on PATH; returns (exit code, stderr, kubectl calls).
fn plugin(args: &[&str]) -> (Option<i32>, String, Vec<String>) {
    let (code, _, stderr, calls) = plugin_out(args);
    (code, stderr, calls)
}

/// As [`plugin`], with stdout: (exit code, stdout, stderr, kubectl calls). Three agents: node-a's
/// has two incidents, node-b's does not answer, node-c's has none.
fn plugin_out(args: &[&str]) -> (Option<i32>, String, String, Vec<String>) {
    let dir = tempfile::tempdir().unwrap();
    plugin_in(dir.path(), args)
}

/// As [`plugin_out`], run in `dir` (where the fake kubectl and its calls are kept too).
fn plugin_in(dir: &Path, args: &[&str]) -> (Option<i32>, String, String, Vec<String>) {
    let calls = dir.join("calls");
    let fake = dir.join("kubectl");
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
  "get pods --namespace kstall -l app.kubernetes.io/name=kstall -o jsonpath="*)
    printf 'kstall-a node-a\nkstall-b node-b\nkstall-c node-c\n' ;;
  "get --raw /api/v1/namespaces/kstall/pods/kstall-a:9700/proxy/api/v1/incidents?format=tsv"*)
    printf 'node-a\tfiring\tcritical\tnfs-sidecar-redirect\tshop/web-1\t2026-12-05T10:00:00Z\tNFS of shop/web-1 is redirected\n'
    printf 'node-a\tfiring\tcritical\tsystem-oom\tnode\t2026-12-05T09:00:00Z\tnode-a ran out of memory\n' ;;
  "get --raw /api/v1/namespaces/kstall/pods/kstall-b:9700/proxy/api/v1/incidents?format=tsv"*)
    echo "Error from server (ServiceUnavailable): the server is currently unable to handle the request" >&2; exit 1 ;;
  "get --raw /api/v1/namespaces/kstall/pods/kstall-c:9700/proxy/api/v1/incidents?format=tsv"*) ;;
  "exec -i --namespace kstall kstall-x7k2p -- kstall capture get cap-ok -o -")
    printf 'bundle'; echo "cap-ok: 6 B (sha256 $(printf bundle | sha256sum | cut -d' ' -f1), sent)" >&2 ;;
  "exec -i --namespace kstall kstall-x7k2p -- kstall capture get cap-cut -o -")
    printf 'bun'; echo "cap-cut: 6 B (sha256 $(printf bundle | sha256sum | cut -d' ' -f1), sent)" >&2 ;;
  "exec -i --namespace kstall kstall-x7k2p -- kstall capture get cap-none -o -")
    echo "kstall capture get: capture cap-none: no such capture on this node (kstall capture list)" >&2; exit 1 ;;
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
        .env("PATH", format!("{}:/usr/bin:/bin", dir.display()))
        .current_dir(dir)
        .output()
        .expect("run kubectl-kstall");
    let calls = std::fs::read_to_string(&calls).unwrap_or_default().lines().map(String::from).collect();
    let text = |bytes: &[u8]| String::from_utf8_lossy(bytes).into_owned();
    (out.status.code(), text(&out.stdout), text(&out.stderr), calls)
}

#[test]
fn all_nodes_is_one_table_of_every_agents_incidents_and_names_the_nodes_that_did_not_answer() {
    let (code, stdout, stderr, calls) = plugin_out(&["incidents", "--all-nodes"]);
    assert_eq!(code, Some(1), "a node did not answer: {stderr}");
    assert_eq!(
        stdout,
        "NODE    STATE   SEVERITY  SIGNATURE             POD         SINCE                 SUMMARY\n\
         node-a  firing  critical  nfs-sidecar-redirect  shop/web-1  2026-12-05T10:00:00Z  NFS of shop/web-1 is redirected\n\
         node-a  firing  critical  system-oom            node        2026-12-05T09:00:00Z  node-a ran out of memory\n"
    );
    assert_eq!(
        stderr,
        "kubectl kstall: node node-b did not answer: Error from server (ServiceUnavailable): the server is \
         currently unable to handle the request \n"
    );
    let asked: Vec<&String> = calls.iter().filter(|c| c.starts_with("get --raw")).collect();
    assert_eq!(asked.len(), 3, "every agent asked once: {calls:?}");
    assert!(asked.iter().all(|c| c.ends_with("--request-timeout=10s")), "{asked:?}");
    // --all asks for the resolved ones too; anything else is refused.
    let (_, _, _, calls) = plugin_out(&["incidents", "--all-nodes", "--all"]);
    assert!(calls.iter().any(|c| c.contains("incidents?format=tsv&all=1 ")), "{calls:?}");
    let (code, _, stderr, _) = plugin_out(&["incidents", "--all-nodes", "--output", "json"]);
    assert_eq!(code, Some(64), "{stderr}");
    let (code, _, stderr, _) = plugin_out(&["trace", "--all-nodes"]);
    assert_eq!(
        (code, stderr.trim_end()),
        (
            Some(64),
            "kubectl kstall: --all-nodes is for incidents (kubectl kstall <trace|incidents|explain|status|capture> [--pod NAME [-n NS] | --node NODE] ...)"
        )
    );
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

#[test]
fn capture_get_brings_the_bundle_here_and_keeps_it_only_whole() {
    let dir = tempfile::tempdir().unwrap();
    let (code, _, stderr, calls) =
        plugin_in(dir.path(), &["capture", "get", "cap-ok", "--pod", "web-1", "-n", "shop"]);
    assert_eq!(code, Some(0), "{stderr}");
    let got = dir.path().join("cap-ok.tar.gz");
    assert_eq!(std::fs::read(&got).unwrap(), b"bundle");
    let mode = std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(&got).unwrap().permissions());
    assert_eq!(mode & 0o777, 0o600);
    assert!(stderr.starts_with("cap-ok.tar.gz: 6 bytes from node node-a (sha256 "), "{stderr}");
    assert!(
        calls.iter().any(|c| c
            == "exec -i --namespace kstall kstall-x7k2p -- kstall capture get cap-ok -o - -n shop"
            || c.starts_with("exec -i --namespace kstall kstall-x7k2p -- kstall capture get cap-ok -o -")),
        "{calls:?}"
    );

    // Never over a file; -o names another.
    let (code, _, stderr, _) = plugin_in(dir.path(), &["capture", "get", "cap-ok", "--node", "node-a"]);
    assert_eq!(
        (code, stderr.as_str()),
        (Some(64), "kubectl kstall: capture get: cap-ok.tar.gz exists: give -o or remove it\n")
    );
    let (code, _, stderr, _) =
        plugin_in(dir.path(), &["capture", "get", "cap-ok", "-o", "case-1.tar.gz", "--node", "node-a"]);
    assert_eq!(code, Some(0), "{stderr}");
    assert_eq!(std::fs::read(dir.path().join("case-1.tar.gz")).unwrap(), b"bundle");

    // Cut on the way: nothing is kept, and it says so.
    let (code, _, stderr, _) = plugin_in(dir.path(), &["capture", "get", "cap-cut", "--node", "node-a"]);
    assert_eq!(code, Some(1));
    assert!(stderr.starts_with("kubectl kstall: capture cap-cut: sha256 mismatch (got "), "{stderr}");
    assert!(stderr.ends_with("): the download is incomplete, try again\n"), "{stderr}");
    // The agent's refusal, as it said it.
    let (code, _, stderr, _) = plugin_in(dir.path(), &["capture", "get", "cap-none", "--node", "node-a"]);
    assert_eq!(
        (code, stderr.as_str()),
        (
            Some(1),
            "kstall capture get: capture cap-none: no such capture on this node (kstall capture list)\n"
        )
    );
    let left: Vec<String> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".part") || n.starts_with("cap-cut") || n.starts_with("cap-none"))
        .collect();
    assert!(left.is_empty(), "{left:?}");
}
