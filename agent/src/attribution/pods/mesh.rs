//! Which service mesh captures a pod's outbound connections, read from the pod as the meshes mark
//! it (their sources, in docs/research/meshes.md): Istio's sidecar (a container `istio-proxy`, the
//! annotation `sidecar.istio.io/status`), Istio ambient (`ambient.istio.io/redirection`, set by
//! istio-cni once it wrote the pod's rules), Linkerd (a container `linkerd-proxy`, the annotation
//! `linkerd.io/proxy-version`). A sidecar may be an init container with `restartPolicy: Always`
//! (a native sidecar, Kubernetes ≥ 1.29, the default of both meshes on recent clusters), which
//! Kubernetes stops after the app containers. A pod carrying two meshes' marks names both: kstall
//! then names neither, rather than give one mesh's way out for another's rules.

use k8s_openapi::api::core::v1::Pod;
use serde::Serialize;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Mesh {
    IstioSidecar,
    IstioAmbient,
    Linkerd,
}

impl Mesh {
    pub fn name(self) -> &'static str {
        match self {
            Mesh::IstioSidecar => "istio-sidecar",
            Mesh::IstioAmbient => "istio-ambient",
            Mesh::Linkerd => "linkerd",
        }
    }

    /// The local port its rules redirect a pod's outbound TCP to.
    pub fn proxy_port(self) -> u16 {
        match self {
            Mesh::IstioSidecar | Mesh::IstioAmbient => 15001,
            Mesh::Linkerd => 4140,
        }
    }

    /// What should be listening there.
    pub fn proxy(self) -> &'static str {
        match self {
            Mesh::IstioSidecar => "istio-proxy",
            // ztunnel runs in a pod of its own (a DaemonSet) and opens its listeners in each
            // enrolled pod's network namespace.
            Mesh::IstioAmbient => "ztunnel",
            Mesh::Linkerd => "linkerd-proxy",
        }
    }

    /// The pod annotation that exempts outbound ports from its redirect, as a comma-separated list
    /// (istio-iptables' `-o`, proxy-init's `--outbound-ports-to-ignore`); Istio ambient has none
    /// (istio#49829).
    pub fn port_exclusion(self) -> Option<&'static str> {
        match self {
            Mesh::IstioSidecar => Some("traffic.sidecar.istio.io/excludeOutboundPorts"),
            Mesh::IstioAmbient => None,
            Mesh::Linkerd => Some("config.linkerd.io/skip-outbound-ports"),
        }
    }

    /// The mesh that alone redirects to `port`, if one does (15001 is Istio's sidecar's and
    /// ambient's, and Kuma's and Consul's too).
    pub fn alone_on(port: u16) -> Option<Mesh> {
        (port == Mesh::Linkerd.proxy_port()).then_some(Mesh::Linkerd)
    }
}

/// The meshes a pod is marked for, and how its sidecar runs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PodMesh {
    /// One, normally; two when the pod carries the marks of both Istio and Linkerd.
    pub meshes: Vec<Mesh>,
    /// The proxy is an init container with `restartPolicy: Always`.
    pub native_sidecar: bool,
}

impl PodMesh {
    /// `None` for a pod no mesh marks.
    pub fn of(pod: &Pod) -> Option<Self> {
        let annotations = pod.metadata.annotations.as_ref();
        let annotated = |key: &str| annotations.is_some_and(|a| a.contains_key(key));
        let spec = pod.spec.as_ref();
        let containers = spec.into_iter().flat_map(|s| s.containers.iter());
        let init_containers = spec.into_iter().flat_map(|s| s.init_containers.iter().flatten());
        // A proxy container by name: (is it a native sidecar).
        let proxy = |name: &str| {
            let native = init_containers
                .clone()
                .find(|c| c.name == name)
                .map(|c| c.restart_policy.as_deref() == Some("Always"));
            native.or_else(|| containers.clone().any(|c| c.name == name).then_some(false))
        };
        let istio_proxy = proxy(Mesh::IstioSidecar.proxy());
        let linkerd_proxy = proxy(Mesh::Linkerd.proxy());
        let mut meshes = Vec::new();
        // istio-cni leaves a pod with a sidecar to the sidecar, whatever its ambient marks.
        if istio_proxy.is_some() || annotated("sidecar.istio.io/status") {
            meshes.push(Mesh::IstioSidecar);
        } else if annotations
            .and_then(|a| a.get("ambient.istio.io/redirection"))
            .is_some_and(|v| v == "enabled" || v == "pending")
        {
            meshes.push(Mesh::IstioAmbient);
        }
        if linkerd_proxy.is_some() || annotated("linkerd.io/proxy-version") {
            meshes.push(Mesh::Linkerd);
        }
        let native_sidecar = istio_proxy.unwrap_or(false) || linkerd_proxy.unwrap_or(false);
        (!meshes.is_empty()).then_some(PodMesh { meshes, native_sidecar })
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn pod(value: serde_json::Value) -> Pod {
        serde_json::from_value(value).unwrap()
    }

    fn mesh_of(value: serde_json::Value) -> Option<PodMesh> {
        PodMesh::of(&pod(value))
    }

    fn one(mesh: Mesh, native_sidecar: bool) -> Option<PodMesh> {
        Some(PodMesh { meshes: vec![mesh], native_sidecar })
    }

    const ISTIO_STATUS: &str = r#"{"initContainers":["istio-init"],"containers":["istio-proxy"],"volumes":["istio-envoy"],"imagePullSecrets":null,"revision":"default"}"#;

    /// As Istio's injector writes a classic sidecar pod (pkg/kube/inject/testdata).
    #[test]
    fn a_classic_istio_sidecar_pod() {
        let classic = json!({
            "metadata": {"annotations": {"sidecar.istio.io/status": ISTIO_STATUS}},
            "spec": {
                "initContainers": [{"name": "istio-init", "image": "docker.io/istio/proxyv2:1.28.0"}],
                "containers": [{"name": "app"}, {"name": "istio-proxy", "image": "docker.io/istio/proxyv2:1.28.0"}]
            }
        });
        assert_eq!(mesh_of(classic), one(Mesh::IstioSidecar, false));
    }

    /// Istio ≥ 1.28 on Kubernetes ≥ 1.33, and Linkerd since edge-26.5.2: the proxy is an init
    /// container with restartPolicy: Always, right after the mesh's own init container.
    #[test]
    fn native_sidecars_are_init_containers_that_always_restart() {
        let istio = json!({
            "metadata": {"annotations": {"sidecar.istio.io/status": ISTIO_STATUS.replace(
                r#""initContainers":["istio-init"],"containers":["istio-proxy"]"#,
                r#""initContainers":["istio-init","istio-proxy"],"containers":null"#)}},
            "spec": {
                "initContainers": [
                    {"name": "istio-init"},
                    {"name": "istio-proxy", "restartPolicy": "Always"},
                    {"name": "migrate-db"}
                ],
                "containers": [{"name": "app"}]
            }
        });
        assert_eq!(mesh_of(istio), one(Mesh::IstioSidecar, true));
        let linkerd = json!({
            "metadata": {"annotations": {"linkerd.io/proxy-version": "edge-26.8.3"}},
            "spec": {
                "initContainers": [{"name": "linkerd-init"}, {"name": "linkerd-proxy", "restartPolicy": "Always"}],
                "containers": [{"name": "app"}]
            }
        });
        assert_eq!(mesh_of(linkerd), one(Mesh::Linkerd, true));
        // An init container of that name that runs to completion is not a sidecar.
        let run_once =
            json!({"spec": {"initContainers": [{"name": "linkerd-proxy"}], "containers": [{"name": "app"}]}});
        assert_eq!(mesh_of(run_once), one(Mesh::Linkerd, false));
    }

    /// ambient.istio.io/redirection is istio-cni's: "enabled" once ztunnel took the pod,
    /// "pending" while its rules are written and no ztunnel accepted it.
    #[test]
    fn an_ambient_pod_is_named_by_istio_cnis_annotation() {
        let ambient = |state: &str| {
            json!({
                "metadata": {"annotations": {"ambient.istio.io/redirection": state},
                             "labels": {"istio.io/dataplane-mode": "ambient"}},
                "spec": {"containers": [{"name": "app"}]}
            })
        };
        assert_eq!(mesh_of(ambient("enabled")), one(Mesh::IstioAmbient, false));
        assert_eq!(mesh_of(ambient("pending")), one(Mesh::IstioAmbient, false));
        assert_eq!(mesh_of(ambient("disabled")), None);
        // A sidecar pod in an ambient namespace stays the sidecar's.
        let both = json!({
            "metadata": {"annotations": {"ambient.istio.io/redirection": "enabled", "sidecar.istio.io/status": ISTIO_STATUS}},
            "spec": {"containers": [{"name": "app"}, {"name": "istio-proxy"}]}
        });
        assert_eq!(mesh_of(both), one(Mesh::IstioSidecar, false));
    }

    #[test]
    fn two_meshes_marks_name_both_and_no_marks_none() {
        let two = json!({
            "metadata": {"annotations": {"linkerd.io/proxy-version": "stable-2.14.10"}},
            "spec": {"containers": [{"name": "app"}, {"name": "istio-proxy"}, {"name": "linkerd-proxy"}]}
        });
        let meshes = mesh_of(two).unwrap().meshes;
        assert_eq!(meshes, [Mesh::IstioSidecar, Mesh::Linkerd]);
        assert_eq!(mesh_of(json!({"spec": {"containers": [{"name": "envoy"}]}})), None);
        assert_eq!(mesh_of(json!({})), None);
    }

    #[test]
    fn only_linkerds_port_names_its_mesh_alone() {
        assert_eq!(Mesh::alone_on(4140), Some(Mesh::Linkerd));
        assert_eq!(Mesh::alone_on(15001), None, "Istio's sidecar and ambient, Kuma, Consul");
    }
}
