//! The kubectl plugin installed as krew lays it out (tests/src/krew.rs, from the archive `cargo
//! xtask krew` builds and the committed manifest), run by the pinned kubectl (target/tools)
//! against the real cluster: `kubectl plugin list` finds it in `$KREW_ROOT/bin`, `kubectl kstall
//! incidents --all-nodes` asks every agent through the API server's pod proxy, and `kubectl kstall
//! status --node` runs `kstall status` in the node's agent.

use kstall_tests::{
    cluster::{Cluster, NODE},
    helm, krew,
};

use super::deployed;

#[test]
fn kubectl_kstall_from_krews_layout_asks_the_clusters_agents() {
    let test = "kubectl_kstall_from_krews_layout_asks_the_clusters_agents";
    let Some(cluster) = Cluster::running(test) else { return };
    if let Some(why) = helm::tools_missing() {
        panic!("{test}: {why}");
    }
    let (os, arch) = ("linux", if cfg!(target_arch = "aarch64") { "arm64" } else { "amd64" });
    let archive = krew::archive_path(os, arch);
    assert!(archive.is_file(), "{test}: no {} (cargo xtask krew builds it)", archive.display());
    deployed(&cluster);
    let root = tempfile::tempdir().unwrap();
    let installed = krew::install(root.path(), &krew::manifest_path(), &archive, os, arch)
        .unwrap_or_else(|e| panic!("{os}/{arch}: {e}"));
    // $KREW_ROOT/bin first, as krew's install tells one to set PATH; then the pinned kubectl,
    // which the plugin runs too.
    let path = format!(
        "{}:{}:/usr/sbin:/usr/bin:/sbin:/bin",
        root.path().join("bin").display(),
        helm::tools_dir().display()
    );
    let kubectl = |args: &[&str]| {
        let out = cluster
            .inside(helm::kubectl().to_str().unwrap())
            .args(args)
            .env("PATH", &path)
            .env("KUBECONFIG", cluster.kubeconfig())
            .output()
            .expect("run the pinned kubectl");
        let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
        (out.status.code(), text(&out.stdout), text(&out.stderr))
    };
    let (code, listed, err) = kubectl(&["plugin", "list"]);
    assert_eq!(code, Some(0), "{listed}{err}");
    assert!(listed.lines().any(|l| l == installed.link.to_str().unwrap()), "{listed}");

    let (code, table, err) = kubectl(&["kstall", "incidents", "--all-nodes"]);
    assert_eq!(code, Some(0), "kubectl kstall incidents --all-nodes: {table}{err}");
    let first = table.lines().next().unwrap_or_default();
    assert!(
        first.starts_with("NODE ") || first == "No incident on the 1 nodes that answered.",
        "not the agents' answer:\n{table}{err}"
    );
    assert!(
        first != "No incident on the 1 nodes that answered."
            || table.lines().skip(1).all(|l| l.starts_with(NODE)),
        "{table}"
    );
    println!("kubectl kstall incidents --all-nodes (krew layout):\n{table}");

    let (code, status, err) = kubectl(&["kstall", "status", "--node", NODE]);
    assert_eq!(code, Some(0), "kubectl kstall status --node {NODE}: {status}{err}");
    assert!(status.starts_with("kstall ") && status.contains("PROBE"), "not kstall status:\n{status}");
}
