//! The service meshes' own redirect rules, as their sources write them (`tests/data/`, each with
//! its provenance): Istio's classic sidecar (istio-iptables), Istio ambient (istio-cni's in-pod
//! rules) and Linkerd (proxy-init). Run in a pod's network namespace as the mesh runs them.

use std::path::PathBuf;

use serde_json::{Value, json};

use crate::netns::NetNs;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MeshRules {
    IstioSidecar,
    IstioAmbient,
    Linkerd,
}

impl MeshRules {
    /// Each rule as `iptables` arguments, in the order the mesh runs them.
    pub fn commands(self) -> Vec<Vec<String>> {
        let words = |line: &str| line.split_whitespace().map(str::to_string).collect::<Vec<_>>();
        match self {
            MeshRules::IstioSidecar => istio_nat_rules()
                .iter()
                .map(|rule| [vec!["-t".into(), "nat".into()], words(rule)].concat())
                .collect(),
            MeshRules::IstioAmbient => file_commands("istio-iptables/ambient-default.golden"),
            MeshRules::Linkerd => file_commands("linkerd-proxy-init/outbound.rules"),
        }
    }

    /// Runs the rules in `netns` with this machine's `iptables`.
    pub fn install(self, netns: &NetNs) {
        for command in self.commands() {
            let args: Vec<&str> = command.iter().map(String::as_str).collect();
            netns.exec("iptables", &args);
        }
    }
}

/// Linkerd's rules for a pod annotated `config.linkerd.io/skip-outbound-ports: "2049,111,20048"`
/// (`tests/data/linkerd-proxy-init/skip-outbound-ports.rules`: its proxy-init's RETURN for those
/// ports before the redirect), run in `netns` with this machine's `iptables`.
pub fn install_linkerd_skipping_nfs(netns: &NetNs) {
    for command in linkerd_skipping_nfs_commands() {
        let args: Vec<&str> = command.iter().map(String::as_str).collect();
        netns.exec("iptables", &args);
    }
}

/// What explain pod says of a pod under [`linkerd_skipping_nfs_commands`]' rules, read back from
/// `backend` (`iptables-nft`, `iptables-legacy`).
pub fn linkerd_skipping_nfs_summary(backend: &str) -> String {
    format!(
        "not redirected — 2049, 111, 20048 excluded by -A PROXY_INIT_OUTPUT -p tcp -m multiport --dports \
         2049,111,20048 -m comment --comment \"proxy-init/ignore-port-2049,111,20048\" -j RETURN ({backend} nat \
         PROXY_INIT_OUTPUT rule 3)"
    )
}

/// The rules of [`install_linkerd_skipping_nfs`], each as `iptables` arguments.
pub fn linkerd_skipping_nfs_commands() -> Vec<Vec<String>> {
    file_commands("linkerd-proxy-init/skip-outbound-ports.rules")
}

/// A data file's `iptables …` command lines, each as `iptables` arguments.
fn file_commands(file: &str) -> Vec<Vec<String>> {
    let text = std::fs::read_to_string(data(file)).unwrap_or_else(|e| panic!("{file}: {e}"));
    let commands = text.lines().filter_map(|l| l.strip_prefix("iptables "));
    commands.map(|line| line.split_whitespace().map(str::to_string).collect()).collect()
}

/// Marks `pod` (as `pod_json` makes it) as `mesh`'s injector marks a pod whose rules are `mesh`'s:
/// its proxy container — an init container with `restartPolicy: Always` for a `native` sidecar —
/// and its annotations. Ambient has no proxy in the pod, only istio-cni's annotation.
pub fn mark(pod: &mut Value, mesh: MeshRules, native: bool) {
    let annotations = &mut pod["metadata"]["annotations"];
    let (proxy, init) = match mesh {
        MeshRules::IstioSidecar => {
            let (init, containers) = if native {
                (r#"["istio-init","istio-proxy"]"#, "null")
            } else {
                (r#"["istio-init"]"#, r#"["istio-proxy"]"#)
            };
            annotations["sidecar.istio.io/status"] =
                format!(r#"{{"initContainers":{init},"containers":{containers},"volumes":["istio-envoy"],"revision":"default"}}"#).into();
            ("istio-proxy", "istio-init")
        }
        MeshRules::IstioAmbient => {
            annotations["ambient.istio.io/redirection"] = "enabled".into();
            return;
        }
        MeshRules::Linkerd => {
            annotations["linkerd.io/proxy-version"] = "edge-26.8.3".into();
            ("linkerd-proxy", "linkerd-init")
        }
    };
    let spec = &mut pod["spec"];
    let mut inits = spec["initContainers"].as_array().cloned().unwrap_or_default();
    inits.push(json!({"name": init, "image": init}));
    if native {
        inits.push(json!({"name": proxy, "image": proxy, "restartPolicy": "Always"}));
    } else if let Some(containers) = spec["containers"].as_array_mut() {
        containers.push(json!({"name": proxy, "image": proxy}));
    }
    spec["initContainers"] = inits.into();
}

/// Istio's classic sidecar's nat rules, as its iptables golden test data has them: the lines of
/// the `nat` table, each an `iptables -t nat` command's arguments.
pub fn istio_nat_rules() -> Vec<String> {
    let golden = std::fs::read_to_string(data("istio-iptables/kube-virt-interfaces.golden"))
        .expect("the Istio golden file");
    golden
        .lines()
        .skip_while(|l| l.trim() != "* nat")
        .skip(1)
        .take_while(|l| l.trim() != "COMMIT")
        .map(str::to_string)
        .collect()
}

/// `tests/data/<file>` of the checkout, wherever a guest sees it (`KSTALL_WORKSPACE`).
fn data(file: &str) -> PathBuf {
    crate::workspace().join("tests/data").join(file)
}
