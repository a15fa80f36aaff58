//! Whose redirect it is and the way out of it. The mesh is named from the pod (its marks,
//! [`PodMesh`]) and the port its NFS connections were redirected to, which must agree; a pod with
//! no marks is named by the port only where one mesh alone uses it (Linkerd's 4140). Otherwise
//! the proxy is unknown and the way out is the mesh-neutral one — never one mesh's advice for
//! another's rules (docs/research/meshes.md).
//!
//! The break-glass steps enter the pod's network namespace through one of its tasks, check it is
//! the pod's and not the host's, check the mesh's redirect is there, and let NFS through it:
//! Istio's classic sidecar by deleting the jump to its redirect (as incident 1 did), the others by
//! inserting before the redirect the RETURN for the server's NFS port that the mesh's own
//! port exclusion would have written.

use std::{collections::BTreeSet, net::IpAddr};

use serde::Serialize;

use crate::{
    attribution::pods::mesh::{Mesh, PodMesh},
    incidents::{Remediation, Step},
    stuck::StuckTask,
};

/// Whose redirect sends the pod's NFS connections to a port where nothing listens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Proxy {
    Named {
        mesh: Mesh,
        /// `None` when the pod does not say (its mesh named by the port).
        native_sidecar: Option<bool>,
    },
    Unknown {
        why: String,
    },
}

impl Proxy {
    pub fn of(pod: Option<&PodMesh>, redirect_ports: &BTreeSet<u16>) -> Self {
        let ports = || redirect_ports.iter().map(u16::to_string).collect::<Vec<_>>().join(", ");
        match pod {
            Some(pod) if pod.meshes.len() > 1 => {
                let meshes: Vec<&str> = pod.meshes.iter().map(|m| m.name()).collect();
                Proxy::Unknown { why: format!("the pod carries the marks of {}", meshes.join(" and ")) }
            }
            Some(pod) => {
                let mesh = pod.meshes[0];
                if redirect_ports.iter().all(|&p| p == mesh.proxy_port()) {
                    let native = (mesh != Mesh::IstioAmbient).then_some(pod.native_sidecar);
                    Proxy::Named { mesh, native_sidecar: native }
                } else {
                    Proxy::Unknown {
                        why: format!(
                            "the pod is in {} (proxy port {}), but its NFS connections were redirected to port {}",
                            mesh.name(),
                            mesh.proxy_port(),
                            ports()
                        ),
                    }
                }
            }
            None => {
                let alone = match redirect_ports.iter().collect::<Vec<_>>()[..] {
                    [&port] => Mesh::alone_on(port),
                    _ => None,
                };
                match alone {
                    Some(mesh) => Proxy::Named { mesh, native_sidecar: None },
                    None => Proxy::Unknown {
                        why: format!(
                            "no mesh marks the pod, and port {} does not name one (15001 is Istio's sidecar's \
                             and ambient's, Kuma's and Consul's)",
                            ports()
                        ),
                    },
                }
            }
        }
    }

    pub fn evidence(&self) -> ProxyEvidence {
        match self {
            Proxy::Named { mesh, native_sidecar } => ProxyEvidence {
                mesh: mesh.name(),
                proxy: Some(mesh.proxy()),
                proxy_port: Some(mesh.proxy_port()),
                native_sidecar: *native_sidecar,
                termination_order: Some(termination_order(*mesh, *native_sidecar)),
                unknown_because: None,
            },
            Proxy::Unknown { why } => ProxyEvidence {
                mesh: "unknown",
                proxy: None,
                proxy_port: None,
                native_sidecar: None,
                termination_order: None,
                unknown_because: Some(why.clone()),
            },
        }
    }

    /// A sentence for the incident's summary.
    pub fn said(&self) -> String {
        match self {
            Proxy::Named { mesh: Mesh::IstioAmbient, .. } => {
                " The redirect is Istio ambient's: ztunnel, the node's \
                proxy, is not listening in the pod's network namespace."
                    .to_string()
            }
            Proxy::Named { mesh, .. } => {
                format!(
                    " The redirect is {}'s: its proxy container {} is not listening.",
                    mesh.name(),
                    mesh.proxy()
                )
            }
            Proxy::Unknown { why } => format!(" kstall cannot tell which proxy: {why}."),
        }
    }
}

/// The mesh-related part of the incident's evidence.
#[derive(Debug, Serialize)]
pub struct ProxyEvidence {
    /// `istio-sidecar`, `istio-ambient`, `linkerd` or `unknown`.
    pub mesh: &'static str,
    /// What should listen on the redirect port: the pod's proxy container, or `ztunnel`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub proxy: Option<&'static str>,
    /// The port it should listen on (the resets' local port: `redirect_ports`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub proxy_port: Option<u16>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub native_sidecar: Option<bool>,
    /// Which container order the pod's termination follows.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub termination_order: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub unknown_because: Option<String>,
}

fn termination_order(mesh: Mesh, native_sidecar: Option<bool>) -> &'static str {
    match (mesh, native_sidecar) {
        (Mesh::IstioAmbient, _) => {
            "no sidecar: ztunnel, a pod of its own on the node, serves the pod; the pod's container order does \
             not matter, ztunnel's health does"
        }
        (_, Some(true)) => {
            "native sidecar: Kubernetes stops the proxy after the app containers — unless the grace period runs \
             out, when every container is killed at once"
        }
        (_, Some(false)) => {
            "classic sidecar: Kubernetes stops the proxy together with the app containers, in no order, so it \
             can be gone before the app's last flush"
        }
        (_, None) => "unknown: the pod's containers are not known",
    }
}

/// What the remediation needs of the incident.
pub struct Case<'a> {
    pub proxy: &'a Proxy,
    /// The NFS ports to let through (an NFSv3 mount's rpcbind and mountd too, when it was at them).
    pub nfs_ports: &'a [u16],
    pub server: Option<IpAddr>,
    pub pod_uid: Option<&'a str>,
    pub stuck: Option<&'a StuckTask>,
}

pub fn remediation(case: &Case) -> Remediation {
    let Case { proxy, nfs_ports, .. } = *case;
    let port = nfs_ports.iter().map(u16::to_string).collect::<Vec<_>>().join(",");
    let csi =
        "Or mount the volume with a CSI driver (e.g. the EFS CSI driver): the mount is made by the node, \
               outside the pod's network namespace and its NAT rules."
            .to_string();
    let native_or_why = |native: Option<bool>| {
        match native {
        Some(true) => "The proxy already runs as a native sidecar, which Kubernetes stops after the app \
                       containers: it was gone early for another reason — the pod's grace period ran out (then \
                       every container is killed at once: give terminationGracePeriodSeconds room for the final \
                       flush), or the proxy crashed or was OOM-killed (its restarts are in the pod's status)."
            .to_string(),
        _ => "Or run the proxy as a native sidecar (an init container with restartPolicy: Always), which \
              Kubernetes stops after the app containers, so the final flush still reaches the server."
            .to_string(),
    }
    };
    let permanent = match proxy {
        Proxy::Named { mesh: Mesh::IstioSidecar, native_sidecar } => vec![
            format!(
                "Keep NFS out of the sidecar: annotate the pod template with \
                 traffic.sidecar.istio.io/excludeOutboundPorts: \"{port}\" (cheapest; the mesh then leaves \
                 the kernel's NFS connections alone)."
            ),
            csi,
            native_or_why(*native_sidecar),
        ],
        Proxy::Named { mesh: Mesh::IstioAmbient, .. } => vec![
            "Ambient has no port exclusion (the traffic.sidecar.istio.io annotations do nothing there, \
             istio#49829): take the pod out of the mesh with the label istio.io/dataplane-mode: none on its \
             template; istio-cni then removes the pod's redirect, even with ztunnel down."
                .to_string(),
            csi,
            "Keep ztunnel up on the node while pods mount NFS through it: find why it was not listening \
             (kubectl -n istio-system get pods -l app=ztunnel -o wide: restarted, evicted, not ready) — a new \
             ztunnel opens its listeners in every enrolled pod again."
                .to_string(),
        ],
        Proxy::Named { mesh: Mesh::Linkerd, native_sidecar } => vec![
            format!(
                "Keep NFS out of the proxy: annotate the pod template with config.linkerd.io/skip-outbound-ports: \
                 \"{port}\" (linkerd-init or linkerd-cni then leaves the kernel's NFS connections alone)."
            ),
            csi,
            native_or_why(*native_sidecar),
        ],
        Proxy::Unknown { why } => vec![
            format!(
                "kstall cannot tell which proxy redirects the pod's NFS ({why}). Exempt {port} in that \
                 mesh's own setting — Istio sidecar: traffic.sidecar.istio.io/excludeOutboundPorts; Linkerd: \
                 config.linkerd.io/skip-outbound-ports; Istio ambient has none (label the pod \
                 istio.io/dataplane-mode: none)."
            ),
            csi,
        ],
    };
    Remediation { permanent, break_glass: break_glass(case) }
}

fn break_glass(case: &Case) -> Vec<Step> {
    let uid = case.pod_uid.unwrap_or("<pod-uid>");
    let uid_systemd = uid.replace('-', "_");
    let (task_ns, where_) = match case.stuck {
        Some(t) => (
            format!("/proc/{}/task/{}/ns/net", t.pid, t.tid),
            format!(
                "the stuck task (pid {}, tid {}) — its leader may be a zombie whose own ns link is unreadable",
                t.pid, t.tid
            ),
        ),
        None => (
            "/proc/<pid>/task/<tid>/ns/net".to_string(),
            format!("any task of the pod: grep -l -e {uid} -e {uid_systemd} /proc/[0-9]*/task/*/cgroup"),
        ),
    };
    let cgroup = task_ns.replace("/ns/net", "/cgroup");
    let inside = |command: &str| format!("nsenter --net={task_ns} {command}");
    let to_server = case.server.map(|s| format!(" -d {s}")).unwrap_or_default();
    let to_ports = match case.nfs_ports {
        [port] => format!("--dport {port}"),
        ports => {
            format!(
                "-m multiport --dports {}",
                ports.iter().map(u16::to_string).collect::<Vec<_>>().join(",")
            )
        }
    };
    let let_nfs_through =
        |chain: &str| inside(&format!("iptables -t nat -I {chain} 1 -p tcp{to_server} {to_ports} -j RETURN"));
    let only_then = "Only if all three checks passed: let the NFS server's port through before the redirect (the \
                     rule the mesh's own port exclusion writes). The NFS client reconnects directly within \
                     seconds, the flush completes, the task exits and the pod terminates.";
    let (check, edit) = match case.proxy {
        Proxy::Named { mesh: Mesh::IstioSidecar, .. } => (
            Step::new(
                "Check 3: exactly one REDIRECT jump in the sidecar's output chain. Must print 1.",
                Some(inside("iptables -t nat -S ISTIO_OUTPUT | grep -c -- '-j ISTIO_REDIRECT'")),
            ),
            Step::new(
                "Only if all three checks passed: delete that one rule. The NFS client reconnects \
                 directly within seconds, the flush completes, the task exits and the pod terminates.",
                Some(inside("iptables -t nat -D ISTIO_OUTPUT -j ISTIO_REDIRECT")),
            ),
        ),
        Proxy::Named { mesh: Mesh::IstioAmbient, .. } => (
            Step::new(
                "Check 3: exactly one REDIRECT to ztunnel's port 15001 in the pod's ISTIO_OUTPUT chain (istio-cni's). \
                 Must print 1.",
                Some(inside("iptables -t nat -S ISTIO_OUTPUT | grep -c -- '--to-ports 15001'")),
            ),
            Step::new(only_then, Some(let_nfs_through("ISTIO_OUTPUT"))),
        ),
        Proxy::Named { mesh: Mesh::Linkerd, .. } => (
            Step::new(
                "Check 3: exactly one REDIRECT to the proxy's port 4140 in Linkerd's PROXY_INIT_OUTPUT chain. \
                 Must print 1 (Linkerd writes its rules with iptables-nft by default: if this prints 0, run it \
                 and the next step with iptables-legacy).",
                Some(inside("iptables -t nat -S PROXY_INIT_OUTPUT | grep -c -- '--to-ports 4140'")),
            ),
            Step::new(only_then, Some(let_nfs_through("PROXY_INIT_OUTPUT"))),
        ),
        Proxy::Unknown { .. } => (
            Step::new(
                "Check 3: a NAT rule of the pod's redirects. Must print 1 or more.",
                Some(inside("iptables-save -t nat | grep -c -- '-j REDIRECT'")),
            ),
            Step::new(
                "Only if all three checks passed: let the NFS server's port through at the head of the nat \
                 table's OUTPUT chain, before any mesh's jump. The NFS client reconnects directly within \
                 seconds, the flush completes, the task exits and the pod terminates.",
                Some(let_nfs_through("OUTPUT")),
            ),
        ),
    };
    vec![
        Step::new(format!("Enter the pod's network namespace through {where_}."), None),
        Step::new(
            "Check 1: the task belongs to this pod (its cgroup path holds the pod UID; the systemd \
             driver writes it with underscores). Must print 1 or more.",
            Some(format!("grep -c -e {uid} -e {uid_systemd} {cgroup}")),
        ),
        Step::new(
            "Check 2: its network namespace is not the host's. Must print two different values.",
            Some(format!("readlink {task_ns} /proc/1/ns/net")),
        ),
        check,
        edit,
        Step::new(
            format!(
                "Confirm: the kernel logs \"nfs: server {} OK\" and this incident resolves.",
                case.server.map(|s| s.to_string()).unwrap_or_else(|| "<server>".into())
            ),
            Some("dmesg | tail".to_string()),
        ),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ports(ports: &[u16]) -> BTreeSet<u16> {
        ports.iter().copied().collect()
    }

    fn pod(meshes: &[Mesh], native_sidecar: bool) -> PodMesh {
        PodMesh { meshes: meshes.to_vec(), native_sidecar }
    }

    #[test]
    fn the_pod_and_the_port_must_agree() {
        let linkerd = pod(&[Mesh::Linkerd], true);
        assert_eq!(
            Proxy::of(Some(&linkerd), &ports(&[4140])),
            Proxy::Named { mesh: Mesh::Linkerd, native_sidecar: Some(true) }
        );
        let Proxy::Unknown { why } = Proxy::of(Some(&linkerd), &ports(&[15001])) else { panic!() };
        assert_eq!(
            why,
            "the pod is in linkerd (proxy port 4140), but its NFS connections were redirected to port 15001"
        );
        let ambient = pod(&[Mesh::IstioAmbient], false);
        assert_eq!(
            Proxy::of(Some(&ambient), &ports(&[15001])),
            Proxy::Named { mesh: Mesh::IstioAmbient, native_sidecar: None },
            "ambient has no sidecar"
        );
        // A count's resets may not name the local port: the pod's marks stand alone.
        assert_eq!(
            Proxy::of(Some(&pod(&[Mesh::IstioSidecar], false)), &ports(&[])),
            Proxy::Named { mesh: Mesh::IstioSidecar, native_sidecar: Some(false) }
        );
    }

    /// A pod with two proxies' rules fails closed: no mesh's advice.
    #[test]
    fn two_meshes_or_an_ambiguous_port_name_no_mesh() {
        let two = pod(&[Mesh::IstioSidecar, Mesh::Linkerd], false);
        let proxy = Proxy::of(Some(&two), &ports(&[15001]));
        assert_eq!(
            proxy,
            Proxy::Unknown { why: "the pod carries the marks of istio-sidecar and linkerd".into() }
        );
        let Proxy::Unknown { why } = Proxy::of(None, &ports(&[15001])) else { panic!() };
        assert!(why.starts_with("no mesh marks the pod, and port 15001 does not name one"), "{why}");
        assert_eq!(
            Proxy::of(None, &ports(&[4140])),
            Proxy::Named { mesh: Mesh::Linkerd, native_sidecar: None }
        );
        let case = Case {
            proxy: &proxy,
            nfs_ports: &[2049],
            server: "10.55.0.1".parse().ok(),
            pod_uid: None,
            stuck: None,
        };
        let way_out = remediation(&case);
        let text = format!("{:?}", way_out);
        for advice in ["ISTIO_REDIRECT", "PROXY_INIT_OUTPUT", "-I ISTIO_OUTPUT"] {
            assert!(!text.contains(advice), "no one mesh's commands: {text}");
        }
        let commands: Vec<&str> = way_out.break_glass.iter().filter_map(|s| s.command.as_deref()).collect();
        assert!(commands.contains(&"nsenter --net=/proc/<pid>/task/<tid>/ns/net iptables -t nat -I OUTPUT 1 -p tcp -d 10.55.0.1 --dport 2049 -j RETURN"), "{commands:?}");
    }

    #[test]
    fn each_mesh_gets_its_own_exclusion_check_and_edit() {
        let edit = |mesh: Mesh| {
            let proxy = Proxy::Named { mesh, native_sidecar: Some(false) };
            let case = Case {
                proxy: &proxy,
                nfs_ports: &[2049],
                server: "10.55.0.1".parse().ok(),
                pod_uid: Some("u-1"),
                stuck: None,
            };
            let way_out = remediation(&case);
            let commands: Vec<String> =
                way_out.break_glass.iter().filter_map(|s| s.command.clone()).collect();
            (way_out.permanent[0].clone(), commands[2].clone(), commands[3].clone())
        };
        let (fix, check, delete) = edit(Mesh::IstioSidecar);
        assert!(fix.contains("traffic.sidecar.istio.io/excludeOutboundPorts: \"2049\""), "{fix}");
        assert!(
            check.ends_with("iptables -t nat -S ISTIO_OUTPUT | grep -c -- '-j ISTIO_REDIRECT'"),
            "{check}"
        );
        assert!(
            delete.ends_with("iptables -t nat -D ISTIO_OUTPUT -j ISTIO_REDIRECT"),
            "incident 1's: {delete}"
        );
        let (fix, check, insert) = edit(Mesh::IstioAmbient);
        assert!(fix.contains("istio.io/dataplane-mode: none") && fix.contains("istio#49829"), "{fix}");
        assert!(
            check.ends_with("iptables -t nat -S ISTIO_OUTPUT | grep -c -- '--to-ports 15001'"),
            "{check}"
        );
        assert!(
            insert.ends_with("iptables -t nat -I ISTIO_OUTPUT 1 -p tcp -d 10.55.0.1 --dport 2049 -j RETURN")
        );
        let (fix, check, insert) = edit(Mesh::Linkerd);
        assert!(fix.contains("config.linkerd.io/skip-outbound-ports: \"2049\""), "{fix}");
        assert!(
            check.ends_with("iptables -t nat -S PROXY_INIT_OUTPUT | grep -c -- '--to-ports 4140'"),
            "{check}"
        );
        assert!(
            insert.ends_with(
                "iptables -t nat -I PROXY_INIT_OUTPUT 1 -p tcp -d 10.55.0.1 --dport 2049 -j RETURN"
            )
        );
    }

    #[test]
    fn a_native_sidecar_is_told_why_its_proxy_was_gone_and_which_order_applied() {
        let native = Proxy::Named { mesh: Mesh::IstioSidecar, native_sidecar: Some(true) };
        let case = Case { proxy: &native, nfs_ports: &[2049], server: None, pod_uid: None, stuck: None };
        assert!(remediation(&case).permanent[2].starts_with("The proxy already runs as a native sidecar"));
        let order = native.evidence().termination_order.unwrap();
        assert!(
            order.starts_with("native sidecar: Kubernetes stops the proxy after the app containers"),
            "{order}"
        );
        let classic = Proxy::Named { mesh: Mesh::IstioSidecar, native_sidecar: Some(false) };
        assert!(classic.evidence().termination_order.unwrap().starts_with("classic sidecar"));
        let ambient = Proxy::Named { mesh: Mesh::IstioAmbient, native_sidecar: None };
        assert_eq!(ambient.evidence().proxy, Some("ztunnel"));
    }
}
