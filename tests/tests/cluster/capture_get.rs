//! `kubectl kstall capture` on the real cluster (issue 57): with deploy/overlays/capture, the
//! plugin starts a capture of a pod whose NFS connects a dead sidecar's REDIRECT resets, and
//! `kubectl kstall capture get` brings its bundle here through the API server (`kubectl exec`,
//! the user's own RBAC), whole and checked; the agent's metrics port, which the API server's pod
//! proxy reaches with no identity of the user's, refuses the same bundle. The default install
//! comes back when the test ends, passed or not.

use std::path::{Path, PathBuf};

use kstall_tests::{
    capture::{CaptureDisk, manifest_of, ports, tcpdump, unpacked},
    cluster::{Cluster, NODE},
};
use serde_json::Value;

use super::{Namespace, OVERLAY, deployed, ready_agent_where, sidecar_redirect_job};

const NAMESPACE: &str = "tenant-capture";
/// Where the DaemonSet's `state` hostPath keeps the agent's bundles on the node.
const CAPTURES_ON_THE_NODE: &str = "/var/lib/kstall/captures";

#[test]
fn kubectl_kstall_capture_get_brings_a_pods_bundle_and_the_pod_proxy_is_refused_it() {
    let Some(cluster) =
        Cluster::running("kubectl_kstall_capture_get_brings_a_pods_bundle_and_the_pod_proxy_is_refused_it")
    else {
        return;
    };
    deployed(&cluster);
    // A disk of the test's own under the agent's hostPath before the capture agent starts (its
    // container's bind of the hostPath takes it in), so the node's free space plays no part.
    let _disk = CaptureDisk::at(Path::new(CAPTURES_ON_THE_NODE));
    let _restore = DefaultInstall(&cluster);
    cluster.apply_overlay("capture");
    let agent = ready_agent_where(&cluster, holds_net_raw);
    let agent = agent["metadata"]["name"].as_str().unwrap().to_string();
    let _cleanup = Namespace(&cluster, NAMESPACE);
    let pod = sidecar_redirect_job(&cluster, NAMESPACE, "report");
    let name = pod["metadata"]["name"].as_str().unwrap().to_string();
    let ip = pod["status"]["podIP"].as_str().unwrap().to_string();
    let server = cluster.json(&["-n", NAMESPACE, "get", "pod", "nfs-server"]);
    let server = server["status"]["podIP"].as_str().expect("the NFS-port pod's IP").to_string();

    // Started by the plugin on the pod's node, as a user does; the app connects every second.
    let (code, said, err) = plugin(
        &cluster,
        None,
        &["capture", "start", "--pod", &name, "-n", NAMESPACE, "--duration", "6s", "--wait"],
    );
    assert_eq!(code, Some(0), "kubectl kstall capture start: {said}{err}");
    let id = said
        .lines()
        .find_map(|l| l.strip_prefix("capture ")?.split_once(": ").map(|(id, _)| id.to_string()))
        .unwrap_or_else(|| panic!("no capture id in:\n{said}"));

    let here = tempfile::tempdir().unwrap();
    let (code, said, err) = plugin(&cluster, Some(here.path()), &["capture", "get", &id, "--node", NODE]);
    assert_eq!(code, Some(0), "kubectl kstall capture get: {said}{err}");
    let file = here.path().join(format!("{id}.tar.gz"));
    let size =
        std::fs::metadata(&file).map(|m| m.len()).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
    assert!(
        err.starts_with(&format!("{id}.tar.gz: {size} bytes from node {NODE} (sha256 "))
            && err.contains(", checked)"),
        "{err}"
    );
    // The same bundle the node keeps, byte for byte, and whole by its own manifest.
    let kept = PathBuf::from(CAPTURES_ON_THE_NODE).join(format!("{id}.tar.gz"));
    assert_eq!(std::fs::read(&file).unwrap(), std::fs::read(&kept).unwrap(), "{}", kept.display());
    let top = unpacked(here.path());
    let manifest = manifest_of(&top);
    assert_eq!(
        (&manifest["node"], &manifest["pod"]["name"]),
        (&NODE.into(), &name.as_str().into()),
        "{manifest:#}"
    );
    // The app's SYNs to the server's 2049 as they left for the proxy's port, and their resets,
    // which the pod sees from the server.
    let (lines, _) = tcpdump(&top.join("packets.pcapng"));
    let syns = ports(&lines, &format!("IP {ip}."), " > 127.0.0.1.15001: Flags [S],");
    let rsts = ports(&lines, &format!("IP {server}.2049 > {ip}."), ": Flags [R.],");
    assert!(!syns.is_empty() && !rsts.is_empty(), "the app's redirected SYNs and their resets:\n{lines}");
    assert!(rsts.iter().all(|p| syns.contains(p)), "{lines}");
    let conntrack = std::fs::read_to_string(top.join("net/conntrack.txt")).unwrap();
    let port = rsts[0];
    let (orig, reply) = (
        format!("src={ip} dst={server} sport={port} dport=2049 "),
        format!("src=127.0.0.1 dst={ip} sport=15001 dport={port}"),
    );
    assert!(
        conntrack.lines().any(|l| l.contains("[NEW]") && l.contains(&orig) && l.contains(&reply)),
        "no [NEW] with {orig}and {reply}:\n{conntrack}"
    );
    let rules = std::fs::read_to_string(top.join("net/rules.txt")).unwrap();
    assert!(rules.contains("-j REDIRECT --to-ports 15001"), "{rules}");

    // The API server's pod proxy to the metrics port: the agent refuses it the bundle and the list.
    for path in [format!("api/v1/captures/{id}"), "api/v1/captures".to_string()] {
        let raw = format!("/api/v1/namespaces/kstall/pods/{agent}:9700/proxy/{path}");
        let out = cluster.try_kubectl(&["get", "--raw", &raw]);
        let said = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && out.stdout.is_empty(), "{raw} was served:\n{said}");
        assert!(said.contains("Forbidden") || said.contains("403"), "{raw}: {said}");
    }
}

/// deploy/kubectl-kstall run by the cluster's kubectl, from `cwd` (where `capture get` writes).
fn plugin(cluster: &Cluster, cwd: Option<&Path>, args: &[&str]) -> (Option<i32>, String, String) {
    let plugin = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/kubectl-kstall");
    let mut command = cluster.inside("sh");
    command.arg(plugin).args(args).env("KUBECONFIG", cluster.kubeconfig());
    if let Some(dir) = cwd {
        command.current_dir(dir);
    }
    let out = command.output().expect("sh deploy/kubectl-kstall");
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    (out.status.code(), text(&out.stdout), text(&out.stderr))
}

fn holds_net_raw(pod: &Value) -> bool {
    let add = &pod["spec"]["containers"][0]["securityContext"]["capabilities"]["add"];
    add.as_array().is_some_and(|caps| caps.iter().any(|c| c == "NET_RAW"))
}

/// Puts the default install back when the test ends, passed or not, and waits for its agent.
struct DefaultInstall<'a>(&'a Cluster);

impl Drop for DefaultInstall<'_> {
    fn drop(&mut self) {
        self.0.apply_overlay(OVERLAY);
        ready_agent_where(self.0, |p| !holds_net_raw(p));
    }
}
