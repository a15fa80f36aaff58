//! `kstall explain pod`'s read of a meshed pod's own NAT rules in the shipped DaemonSet (issue 56):
//! real pods whose network namespaces hold Istio ambient's in-pod rules and Linkerd's proxy-init
//! rules skipping the NFS ports, written by an init container as the meshes write them. Under the
//! default install (no SYS_ADMIN, no NET_ADMIN) explain names the opt-in in one line; with
//! deploy/overlays/pod-rules it enters each pod's namespace, runs the image's iptables-nft-save
//! there and says ambient's NFS ports go to 15001 by istio-cni's REDIRECT and Linkerd's are let
//! through by proxy-init's RETURN — and the kernel agrees (a connect from each pod). Both under
//! the shipped seccomp default, RuntimeDefault, and the read again under the shipped Localhost
//! profile, deploy/seccomp/kstall.json. The default install comes back when the test ends, passed
//! or not.

use std::time::Duration;

use kstall_tests::{
    cluster::{Cluster, POD_READY_WITHIN, is_ready},
    deploy::deploy_dir,
    host::wait_for,
    meshes::{MeshRules, linkerd_skipping_nfs_summary},
};
use serde_json::{Value, json};

use super::{Namespace, OVERLAY, RemovedOnDrop, SeccompBack, deployed, patch_seccomp};

const SELECTOR: &str = "app.kubernetes.io/name=kstall";
const NAMESPACE: &str = "tenant-pod-rules";
/// What the explain says when the DaemonSet cannot read a pod's rules.
const OPT_IN: &str = "deploy/components/pod-rules (Helm: --set podRules=true)";
/// The cluster's iptables image runs xtables-nft-multi as `iptables` (xtask/src/cluster/build.rs):
/// the rules are in nftables, read back by the agent's iptables-nft-save.
const BACKEND: &str = "iptables-nft";

#[test]
fn explain_pod_reads_a_meshed_pods_own_rules_only_with_the_pod_rules_opt_in() {
    let Some(cluster) =
        Cluster::running("explain_pod_reads_a_meshed_pods_own_rules_only_with_the_pod_rules_opt_in")
    else {
        return;
    };
    deployed(&cluster);
    let _restore = DefaultInstall(&cluster);
    let default = agent_pod(&cluster, false);
    assert_eq!(seccomp_of(&default), "RuntimeDefault", "{default}");
    let _cleanup = Namespace(&cluster, NAMESPACE);
    cluster.kubectl(&["create", "namespace", NAMESPACE]);
    let server_ip = nfs_port_server(&cluster);
    let ambient = meshed_pod(&cluster, "ledger", MeshRules::IstioAmbient);
    let linkerd = meshed_pod(&cluster, "reports", MeshRules::Linkerd);

    // The kernel's side first: ambient's connect to the NFS port goes to 15001, where nothing
    // listens; Linkerd's reaches the server.
    let connect = |pod: &str| {
        cluster.try_kubectl(&[
            "-n", NAMESPACE, "exec", pod, "-c", "app", "--", "nc", "-w", "5", &server_ip, "2049",
        ])
    };
    let refused = connect(&ambient);
    let said = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success() && said.contains("Connection refused"), "ambient's connect: {said}");
    let through = connect(&linkerd);
    assert!(through.status.success(), "Linkerd's connect: {}", String::from_utf8_lossy(&through.stderr));

    // The default install: one line naming the opt-in, for each pod.
    for (pod, mesh) in [(&ambient, "istio-ambient"), (&linkerd, "linkerd")] {
        let x = explained(&cluster, &default, pod);
        assert_eq!((&x["mesh"], &x["redirected"]), (&json!([mesh]), &Value::Null), "{x:#}");
        let summary = x["summary"].as_str().unwrap_or_default();
        assert_eq!(
            summary,
            format!(
                "cannot tell — entering the pod's network namespace was refused: the agent needs CAP_SYS_ADMIN \
                 for that and CAP_NET_ADMIN to read its rules, which {OPT_IN} grants"
            ),
            "{x:#}"
        );
        let text = explain(&cluster, &default, pod, "text");
        assert!(text.contains(&format!("NFS through the mesh: {summary}\n")), "{text}");
    }

    // The opt-in: a new agent with both capabilities, still under RuntimeDefault.
    cluster.apply_overlay("pod-rules");
    let opted = agent_pod(&cluster, true);
    assert_eq!(seccomp_of(&opted), "RuntimeDefault", "{opted}");
    let x = explained(&cluster, &opted, &ambient);
    assert_eq!((&x["mesh"], &x["redirected"]), (&json!(["istio-ambient"]), &json!(true)), "{x:#}");
    assert_eq!(x["rules_from"], json!([BACKEND]), "{x:#}");
    let expected = format!(
        "redirected — TCP to any server on 2049, 111, 20048 goes to port 15001 ({BACKEND} nat OUTPUT rule 1 → \
         ISTIO_OUTPUT rule 5); ambient has no port exclusion (istio#49829)"
    );
    assert!(x["summary"].as_str().unwrap_or_default().starts_with(&expected), "{x:#}");
    for verdict in x["verdicts"].as_array().unwrap() {
        assert_eq!(
            (&verdict["verdict"], &verdict["to_port"]),
            (&json!("redirected"), &json!(15001)),
            "{x:#}"
        );
        assert_eq!(
            verdict["rule"]["text"],
            "-A ISTIO_OUTPUT ! -d 127.0.0.1/32 -p tcp -m mark ! --mark 0x539/0xfff -j REDIRECT --to-ports 15001",
            "{x:#}"
        );
    }
    let ports: Vec<&Value> = x["verdicts"].as_array().unwrap().iter().map(|v| &v["port"]).collect();
    assert_eq!(ports, [&json!(2049), &json!(111), &json!(20048)], "{x:#}");
    let text = explain(&cluster, &opted, &ambient, "text");
    assert!(text.contains(&format!("MESH  istio-ambient\n  NFS through the mesh: {expected}")), "{text}");

    let x = explained(&cluster, &opted, &linkerd);
    assert_eq!((&x["mesh"], &x["redirected"]), (&json!(["linkerd"]), &json!(false)), "{x:#}");
    assert_eq!(x["summary"], linkerd_skipping_nfs_summary(BACKEND), "{x:#}");
    let text = explain(&cluster, &opted, &linkerd, "text");
    assert!(text.contains("MESH  linkerd\n  NFS through the mesh: not redirected — "), "{text}");

    // The same read under the shipped Localhost profile (placed where the kubelet reads
    // profiles, as a node's bootstrap would): the agent's setns and its iptables-nft-save child,
    // and the CLI kubectl exec runs, are under that filter too.
    let profiles = cluster.state_dir().join("run/kubelet/seccomp");
    std::fs::create_dir_all(&profiles).unwrap();
    let _profiles = RemovedOnDrop(profiles.clone());
    std::fs::copy(deploy_dir().join("seccomp/kstall.json"), profiles.join("kstall.json")).unwrap();
    let _profile_back = SeccompBack(&cluster);
    let localhost = json!({"type": "Localhost", "localhostProfile": "kstall.json"});
    patch_seccomp(&cluster, &localhost);
    let confined = wait_for(POD_READY_WITHIN, || {
        the_agent(&cluster, true)
            .filter(|p| p["spec"]["containers"][0]["securityContext"]["seccompProfile"] == localhost)
    })
    .unwrap_or_else(|| panic!("no Ready agent under kstall.json:\n{}", cluster.agent_logs()));
    let x = explained(&cluster, &confined, &ambient);
    assert_eq!(x["redirected"], json!(true), "under kstall.json: {x:#}");
    assert!(x["summary"].as_str().unwrap_or_default().starts_with(&expected), "under kstall.json: {x:#}");
    let x = explained(&cluster, &confined, &linkerd);
    assert_eq!(x["redirected"], json!(false), "under kstall.json: {x:#}");
}

/// The one agent pod, Ready, not being deleted, and holding SYS_ADMIN and NET_ADMIN or neither
/// (the rollout from one overlay to the other has replaced the old pod).
fn agent_pod(cluster: &Cluster, opted_in: bool) -> Value {
    let found = wait_for(POD_READY_WITHIN, || the_agent(cluster, opted_in));
    found.unwrap_or_else(|| {
        panic!(
            "no Ready agent pod {} SYS_ADMIN and NET_ADMIN:\n{}\n{}",
            if opted_in { "with" } else { "without" },
            cluster.kubectl(&["-n", "kstall", "get", "pods", "-o", "wide"]),
            cluster.agent_logs()
        )
    })
}

fn the_agent(cluster: &Cluster, opted_in: bool) -> Option<Value> {
    let out = cluster.try_kubectl(&["-n", "kstall", "get", "pods", "-l", SELECTOR, "-o", "json"]);
    let pods: Value = serde_json::from_slice(&out.stdout).ok()?;
    let [pod] = pods["items"].as_array()?.as_slice() else { return None };
    let add = pod["spec"]["containers"][0]["securityContext"]["capabilities"]["add"].as_array()?;
    let holds = |cap: &str| add.iter().any(|c| c == cap);
    let ready = is_ready(pod) && pod["metadata"]["deletionTimestamp"].is_null();
    (ready && holds("SYS_ADMIN") == opted_in && holds("NET_ADMIN") == opted_in).then(|| pod.clone())
}

/// Puts the default install back when the test ends, passed or not, and waits for its agent
/// (the one pod, without the opt-in's capabilities) to be Ready.
struct DefaultInstall<'a>(&'a Cluster);

impl Drop for DefaultInstall<'_> {
    fn drop(&mut self) {
        self.0.apply_overlay(OVERLAY);
        if wait_for(POD_READY_WITHIN, || the_agent(self.0, false)).is_none() {
            eprintln!("the default install's agent is not Ready again");
        }
    }
}

fn seccomp_of(pod: &Value) -> &str {
    pod["spec"]["containers"][0]["securityContext"]["seccompProfile"]["type"].as_str().unwrap_or_default()
}

/// `kstall explain pod` run in the agent's pod by `kubectl exec`, as a user asks it.
fn explain(cluster: &Cluster, agent: &Value, pod: &str, output: &str) -> String {
    cluster.kubectl(&explain_args(agent, pod, output))
}

fn explain_args<'a>(agent: &'a Value, pod: &'a str, output: &'a str) -> [&'a str; 13] {
    let agent = agent["metadata"]["name"].as_str().unwrap();
    [
        "-n", "kstall", "exec", agent, "--", "kstall", "explain", "pod", pod, "-n", NAMESPACE, "--output",
        output,
    ]
}

/// The pod's `nfs_through_mesh`, once the agent knows the pod's namespace and a live process in
/// it to enter it by: a new agent learns them from the pod's processes on its next walk (every
/// 5 s), and one that took the mesh's init container as its witness takes another of the pod's
/// on its next check (every second) after that container exited.
fn explained(cluster: &Cluster, agent: &Value, pod: &str) -> Value {
    let x = wait_for(Duration::from_secs(60), || {
        let asked = cluster.try_kubectl(&explain_args(agent, pod, "json"));
        if !asked.status.success() {
            let said = String::from_utf8_lossy(&asked.stderr);
            // The agent learns a new pod from the API server's watch, on its own time.
            assert!(said.contains(&format!("kstall knows no pod \"{pod}\"")), "explain {pod}: {said}");
            return None;
        }
        let x: Value = serde_json::from_slice(&asked.stdout).expect("explain's JSON");
        let known = x["netns"].as_array().is_some_and(|n| !n.is_empty());
        let summary = x["nfs_through_mesh"]["summary"].as_str().unwrap_or_default();
        (known && !summary.contains("the pod's network namespace is gone")).then_some(x)
    });
    let x = x.unwrap_or_else(|| panic!("the agent never knew {pod}'s namespace:\n{}", cluster.agent_logs()));
    x["nfs_through_mesh"].clone()
}

/// A pod listening on the NFS port (no NFS: a connect is what is checked; busybox's `nc -ll`
/// serves one connection after another); its address.
fn nfs_port_server(cluster: &Cluster) -> String {
    let server = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "nfs-server", "namespace": NAMESPACE},
        "spec": {
            "terminationGracePeriodSeconds": 1,
            "containers": [{"name": "nfsd", "image": "kstall.test/busybox:1.35", "imagePullPolicy": "Never",
                            "command": ["nc", "-ll", "-p", "2049", "-e", "cat"]}],
        },
    });
    cluster.apply(&server.to_string());
    let server = cluster
        .pod_when(NAMESPACE, "nfs-server", |p| is_ready(p) && p["status"]["podIP"].is_string())
        .expect("the NFS-port pod Ready");
    server["status"]["podIP"].as_str().unwrap().to_string()
}

/// A pod whose network namespace holds `mesh`'s own rules (tests/data/: ambient's istio-cni rules,
/// Linkerd's proxy-init rules for `config.linkerd.io/skip-outbound-ports: "2049,111,20048"`),
/// written by an init container before the app starts, and the marks that mesh puts on it:
/// ambient istio-cni's annotation; Linkerd its proxy container (uid 2102, the rules' exempt user)
/// and its annotations. Its name, once the app runs.
fn meshed_pod(cluster: &Cluster, name: &str, mesh: MeshRules) -> String {
    let (commands, init, annotations) = match mesh {
        MeshRules::IstioAmbient => (
            MeshRules::IstioAmbient.commands(),
            "istio-cni",
            json!({"ambient.istio.io/redirection": "enabled"}),
        ),
        MeshRules::Linkerd => (
            kstall_tests::meshes::linkerd_skipping_nfs_commands(),
            "linkerd-init",
            json!({"linkerd.io/proxy-version": "edge-26.8.3", "config.linkerd.io/skip-outbound-ports": "2049,111,20048"}),
        ),
        MeshRules::IstioSidecar => unreachable!("not this test's"),
    };
    let script: Vec<String> = commands.iter().map(|c| format!("iptables {}", c.join(" "))).collect();
    let configmap = json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": format!("{name}-rules"), "namespace": NAMESPACE},
        "data": {"rules.sh": format!("set -e\n{}\n", script.join("\n"))},
    });
    cluster.apply(&configmap.to_string());
    // One long-lived process each (no short-lived children to be taken as the namespace's
    // witness); the grace period ends it.
    let sleeper = |name: &str, user: u32| {
        json!({"name": name, "image": "kstall.test/busybox:1.35", "imagePullPolicy": "Never",
               "command": ["sleep", "3600"], "securityContext": {"runAsUser": user}})
    };
    let mut containers = vec![sleeper("app", 1000)];
    if mesh == MeshRules::Linkerd {
        containers.push(sleeper("linkerd-proxy", 2102));
    }
    let pod = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": NAMESPACE, "annotations": annotations},
        "spec": {
            "terminationGracePeriodSeconds": 1,
            "initContainers": [{
                "name": init, "image": "kstall.test/iptables:1.8.9", "imagePullPolicy": "Never",
                "command": ["sh", "/rules/rules.sh"],
                "securityContext": {"capabilities": {"add": ["NET_ADMIN", "NET_RAW"]}, "runAsUser": 0},
                "volumeMounts": [{"name": "rules", "mountPath": "/rules"}],
            }],
            "containers": containers,
            "volumes": [{"name": "rules", "configMap": {"name": format!("{name}-rules")}}],
        },
    });
    cluster.apply(&pod.to_string());
    cluster.pod_when(NAMESPACE, name, is_ready).unwrap_or_else(|| {
        panic!("{name} not Ready:\n{}", cluster.kubectl(&["-n", NAMESPACE, "describe", "pod", name]))
    });
    name.to_string()
}
