//! `kstall explain pod`'s one read, for a pod a mesh marks: does the pod's own network namespace
//! redirect its NFS connections, before anything fails? The pod's NAT rules are read by running
//! `iptables-legacy-save` and `iptables-nft-save` entered into the namespace (setns in the child,
//! through a process of the pod), bounded by a deadline and killed past it; the NFS servers and
//! their option ports from the `/proc/<pid>/mountinfo` of the pod's processes (text only: no mount
//! is touched, a hung NFS mount cannot hang the read). [`crate::nat_rules`] then walks the rules
//! for each server and port as the kernel would. Done when asked, on a blocking thread, never on
//! the event path.

use std::{
    fs::File,
    net::IpAddr,
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use serde::{Deserialize, Serialize};

use crate::{
    attribution::{
        mounts::nfs_mounts,
        pods::mesh::{Mesh, PodMesh},
    },
    enter::{OPT_IN, READ_DEADLINE, find_program, legacy_has_nat, open_netns, run_in},
    nat_rules::{Connection, Dump, RuleRef, Verdict},
};

/// What the read needs of the pod, taken from the agent's index.
#[derive(Debug, Clone, Default)]
pub struct Check {
    pub mesh: Option<PodMesh>,
    /// The pod's live network namespaces.
    pub netns: Vec<u32>,
    /// Processes to enter the namespace by (each namespace's witness, the stuck tasks).
    pub processes: Vec<u32>,
    /// The pod's own cgroup v2 directory: its containers' processes, whose mount tables hold
    /// the NFS mounts the app made.
    pub pod_cgroup: Option<PathBuf>,
    /// The ports NFS uses (the agent's `--nfs-ports`); a mount's `port=`/`mountport=` join them.
    pub ports: Vec<u16>,
    pub pod_ips: Vec<IpAddr>,
    /// NFS devices (`major:minor`) the kubelet mounted as the pod's volumes: made in the node's
    /// namespace, their connections never meet the pod's rules.
    pub kubelet_devices: Vec<String>,
}

/// The answer, as `explain pod` shows it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct NfsThroughMesh {
    /// The meshes the pod's marks name; empty: no mesh (nothing was read).
    pub mesh: Vec<String>,
    /// Some NFS port is redirected (`true`), none is (`false`), or kstall cannot tell (`null`).
    #[serde(default)]
    pub redirected: Option<bool>,
    /// One line: `redirected — TCP to … goes to port 15001 (…); exclude them: …`.
    pub summary: String,
    /// How to exempt the redirected ports, in the mesh's own setting.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub way_out: Option<String>,
    /// The NFS servers checked (from the pod's mounts); empty: any address.
    #[serde(default)]
    pub servers: Vec<String>,
    #[serde(default)]
    pub ports: Vec<u16>,
    /// The iptables backends that held nat rules (`iptables-nft`, `iptables-legacy`, `ip6tables-…`).
    #[serde(default)]
    pub rules_from: Vec<String>,
    #[serde(default)]
    pub verdicts: Vec<PortVerdict>,
    #[serde(default)]
    pub notes: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PortVerdict {
    /// `None`: any address.
    pub server: Option<String>,
    pub port: u16,
    /// The backend whose rules decided; empty when none held rules.
    pub backend: String,
    #[serde(flatten)]
    pub verdict: Verdict,
}

impl NfsThroughMesh {
    pub fn no_mesh() -> Self {
        NfsThroughMesh { summary: "no mesh".into(), ..Default::default() }
    }

    fn cannot_tell(mesh: Vec<String>, why: String) -> Self {
        NfsThroughMesh { mesh, summary: format!("cannot tell — {why}"), ..Default::default() }
    }
}

/// Runs [`check`] on the blocking pool, bounded.
pub async fn run(check: Check) -> NfsThroughMesh {
    let mesh = mesh_names(check.mesh.as_ref());
    let read = tokio::task::spawn_blocking(move || self::check(&check, Path::new("/proc"), READ_DEADLINE));
    match tokio::time::timeout(READ_DEADLINE + Duration::from_secs(1), read).await {
        Ok(Ok(answer)) => answer,
        Ok(Err(e)) => NfsThroughMesh::cannot_tell(mesh, format!("the read failed: {e}")),
        Err(_) => NfsThroughMesh::cannot_tell(
            mesh,
            format!("reading the pod's rules and mounts took longer than {} s", READ_DEADLINE.as_secs() + 1),
        ),
    }
}

fn mesh_names(mesh: Option<&PodMesh>) -> Vec<String> {
    mesh.map(|m| m.meshes.iter().map(|m| m.name().to_string()).collect()).unwrap_or_default()
}

/// The pod's rules and mounts, read from `proc`, judged. Blocking.
pub fn check(check: &Check, proc: &Path, deadline: Duration) -> NfsThroughMesh {
    let until = Instant::now() + deadline;
    let mesh = mesh_names(check.mesh.as_ref());
    let mut notes = Vec::new();
    let (servers, ports) = nfs_targets(check, proc, &mut notes);
    let families: Vec<bool> = {
        // IPv6 or not: the servers', else the pod's addresses', else IPv4.
        let of = |ips: &[IpAddr]| {
            let mut v: Vec<bool> = ips.iter().map(IpAddr::is_ipv6).collect();
            v.sort_unstable();
            v.dedup();
            v
        };
        let families = if servers.is_empty() { of(&check.pod_ips) } else { of(&servers) };
        if families.is_empty() { vec![false] } else { families }
    };
    let Some((netns, via)) = open_netns(&check.netns, &check.processes, proc) else {
        return NfsThroughMesh::cannot_tell(
            mesh,
            "the pod's network namespace is gone: no process of the pod is left to enter it by".into(),
        );
    };
    let mut dumps: Vec<Rules> = Vec::new();
    let mut installed = false;
    let mut errors = Vec::new();
    for &v6 in &families {
        for backend in [Backend::Legacy, Backend::Nft] {
            let name = backend.name(v6);
            let program = format!("{name}-save");
            let path = find_program(&program);
            installed |= path.is_some();
            if backend == Backend::Legacy && !legacy_has_nat(proc, via, v6) {
                continue;
            }
            let Some(path) = path else {
                if backend == Backend::Legacy {
                    errors.push(format!(
                        "the namespace holds legacy nat rules, but {program} is not installed where the agent runs"
                    ));
                }
                continue;
            };
            match run_in(&netns, &path, &[], until) {
                Ok(text) => {
                    let dump = Dump::parse(&text);
                    if dump.has_nat_rules() {
                        dumps.push(Rules { backend: name, v6, dump });
                    }
                }
                Err(e) => errors.push(e),
            }
        }
    }
    if !installed {
        return NfsThroughMesh::cannot_tell(
            mesh,
            format!(
                "iptables-save is not installed where the agent runs (neither iptables-legacy-save nor \
                 iptables-nft-save on PATH, /usr/sbin or /sbin): kstall's image carries both, and \
                 {OPT_IN} grants the read"
            ),
        );
    }
    if let Some(error) = errors.first().filter(|_| dumps.is_empty()).cloned() {
        return NfsThroughMesh::cannot_tell(mesh, error);
    }
    notes.extend(errors);
    let unevaluated = native_nftables(&netns, until, &mut notes);
    let read = Read { rules: dumps, servers, ports, v6: families[0], notes, unevaluated };
    judge(check.mesh.as_ref(), &check.pod_ips, read)
}

/// What was read of the pod.
struct Read {
    rules: Vec<Rules>,
    servers: Vec<IpAddr>,
    ports: Vec<u16>,
    /// The family to check when no server is known.
    v6: bool,
    notes: Vec<String>,
    /// nftables tables kstall does not evaluate.
    unevaluated: Vec<String>,
}

/// Each server and port walked through the rules, and the answer worded.
fn judge(mesh: Option<&PodMesh>, pod_ips: &[IpAddr], read: Read) -> NfsThroughMesh {
    let targets: Vec<(Option<IpAddr>, bool)> = if read.servers.is_empty() {
        vec![(None, read.v6)]
    } else {
        read.servers.iter().map(|s| (Some(*s), s.is_ipv6())).collect()
    };
    let mut verdicts = Vec::new();
    for (server, v6) in &targets {
        let rules: Vec<&Rules> = read.rules.iter().filter(|r| r.v6 == *v6).collect();
        for &port in &read.ports {
            let connection = Connection { server: *server, port, pod_ips: pod_ips.to_vec() };
            let (backend, verdict) = decide(&rules, &connection);
            verdicts.push(PortVerdict { server: server.map(|s| s.to_string()), port, backend, verdict });
        }
    }
    let mut answer = NfsThroughMesh {
        mesh: mesh_names(mesh),
        servers: read.servers.iter().map(IpAddr::to_string).collect(),
        ports: read.ports,
        rules_from: read.rules.iter().map(|r| r.backend.to_string()).collect(),
        verdicts,
        notes: read.notes,
        ..Default::default()
    };
    summarize(&mut answer, mesh, read.unevaluated);
    answer
}

/// One backend's rules of one family, when it holds nat rules.
struct Rules {
    backend: &'static str,
    v6: bool,
    dump: Dump,
}

/// The verdict of the backends that hold rules, each walked on its own: the kernel runs both
/// backends' nat hooks, and an exclusion in one does not stop the other's redirect.
fn decide(rules: &[&Rules], connection: &Connection) -> (String, Verdict) {
    let verdicts: Vec<(String, Verdict)> =
        rules.iter().map(|r| (r.backend.to_string(), r.dump.verdict(connection))).collect();
    let first = |wanted: fn(&Verdict) -> bool| verdicts.iter().find(|(_, v)| wanted(v)).cloned();
    first(|v| matches!(v, Verdict::CannotTell { .. }))
        .or_else(|| first(Verdict::redirected))
        .or_else(|| first(|v| matches!(v, Verdict::Excluded { .. })))
        .or_else(|| verdicts.first().cloned())
        .unwrap_or((String::new(), Verdict::NotTouched))
}

/// The NFS servers the pod mounted itself and the ports to check (`--nfs-ports`, then the
/// mounts' option ports), from the mount tables of the pod's processes.
fn nfs_targets(check: &Check, proc: &Path, notes: &mut Vec<String>) -> (Vec<IpAddr>, Vec<u16>) {
    let mut pids = check.processes.clone();
    if let Some(dir) = &check.pod_cgroup {
        pids.extend(container_processes(dir));
    }
    dedup(&mut pids);
    let mut servers: Vec<IpAddr> = Vec::new();
    let mut kubelets: Vec<IpAddr> = Vec::new();
    let mut ports = check.ports.clone();
    for pid in pids.into_iter().take(32) {
        let Ok(text) = std::fs::read_to_string(proc.join(pid.to_string()).join("mountinfo")) else {
            continue;
        };
        for mount in nfs_mounts(&text) {
            let Some(server) = mount.server else { continue };
            if check.kubelet_devices.iter().any(|d| d == mount.device) {
                kubelets.push(server);
                continue;
            }
            servers.push(server);
            ports.extend(&mount.ports);
        }
    }
    dedup(&mut servers);
    dedup(&mut kubelets);
    dedup(&mut ports);
    kubelets.retain(|k| !servers.contains(k));
    if !kubelets.is_empty() {
        let list: Vec<String> = kubelets.iter().map(IpAddr::to_string).collect();
        notes.push(format!(
            "{} mounted by the kubelet as the pod's volume: made in the node's network namespace, never \
             through the pod's rules",
            list.join(", ")
        ));
    }
    if servers.is_empty() {
        notes.push("no NFS mount made in the pod: checked for a server at any address".into());
    }
    (servers, ports)
}

/// One process of each of the pod's containers (and the pod's own cgroup's).
fn container_processes(pod_cgroup: &Path) -> Vec<u32> {
    let first = |dir: &Path| {
        std::fs::read_to_string(dir.join("cgroup.procs")).ok()?.lines().next()?.trim().parse::<u32>().ok()
    };
    let mut pids: Vec<u32> = first(pod_cgroup).into_iter().collect();
    if let Ok(entries) = std::fs::read_dir(pod_cgroup) {
        for entry in entries.flatten().filter(|e| e.file_type().is_ok_and(|t| t.is_dir())).take(32) {
            pids.extend(first(&entry.path()));
        }
    }
    pids
}

fn dedup<T: PartialEq + Clone>(items: &mut Vec<T>) {
    let mut seen = Vec::new();
    items.retain(|item| {
        let new = !seen.contains(item);
        if new {
            seen.push(item.clone());
        }
        new
    });
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Backend {
    Legacy,
    Nft,
}

impl Backend {
    fn name(self, v6: bool) -> &'static str {
        match (self, v6) {
            (Backend::Legacy, false) => "iptables-legacy",
            (Backend::Nft, false) => "iptables-nft",
            (Backend::Legacy, true) => "ip6tables-legacy",
            (Backend::Nft, true) => "ip6tables-nft",
        }
    }
}

/// nftables tables of the namespace that are not iptables-nft's own (Istio's `nativeNftables`
/// writes `inet istio-proxy-nat`): kstall does not evaluate them.
fn native_nftables(netns: &File, until: Instant, notes: &mut Vec<String>) -> Vec<String> {
    let Some(nft) = find_program("nft") else {
        notes.push(
            "nft is not installed where the agent runs: native nftables rules (Istio's nativeNftables) were \
             not looked at"
                .into(),
        );
        return Vec::new();
    };
    let text = match run_in(netns, &nft, &["list", "tables"], until) {
        Ok(text) => text,
        Err(e) => {
            notes.push(e);
            return Vec::new();
        }
    };
    let iptables_own = ["nat", "filter", "mangle", "raw", "security"];
    text.lines()
        .filter_map(|l| l.trim().strip_prefix("table "))
        .filter(|t| {
            let mut words = t.split_whitespace();
            let (family, name) = (words.next().unwrap_or_default(), words.next().unwrap_or_default());
            !(matches!(family, "ip" | "ip6") && iptables_own.contains(&name))
        })
        .map(str::to_string)
        .collect()
}

/// The one line, and the way out for what is redirected.
fn summarize(answer: &mut NfsThroughMesh, mesh: Option<&PodMesh>, unevaluated: Vec<String>) {
    let to_of = |verdicts: &[&PortVerdict]| {
        let mut servers: Vec<String> = verdicts.iter().filter_map(|v| v.server.clone()).collect();
        dedup(&mut servers);
        if servers.is_empty() { "any server".to_string() } else { servers.join(", ") }
    };
    let ports_of = |verdicts: &[&PortVerdict]| {
        let mut ports: Vec<u16> = verdicts.iter().map(|v| v.port).collect();
        dedup(&mut ports);
        ports.iter().map(u16::to_string).collect::<Vec<_>>().join(", ")
    };
    // Verdicts alike but for the port, in order of first appearance.
    let mut groups: Vec<(String, Vec<&PortVerdict>)> = Vec::new();
    for v in &answer.verdicts {
        let key = match &v.verdict {
            Verdict::Redirected { to_port, to_destination, rule, .. } => {
                format!("r {to_port:?} {to_destination:?} {} {} {}", v.backend, rule.chain, rule.number)
            }
            Verdict::Excluded { rule } => format!("e {} {}", v.backend, rule.text),
            Verdict::NotTouched => "n".into(),
            Verdict::CannotTell { rule, why } => format!("c {why} {:?}", rule.as_ref().map(|r| &r.text)),
        };
        match groups.iter_mut().find(|(k, _)| *k == key) {
            Some((_, members)) => members.push(v),
            None => groups.push((key, vec![v])),
        }
    }
    let mut phrases = Vec::new();
    let mut redirected_ports: Vec<u16> = Vec::new();
    let mut redirect_port = None;
    for (_, members) in &groups {
        let (ports, to) = (ports_of(members), to_of(members));
        let backend = &members[0].backend;
        phrases.push(match &members[0].verdict {
            Verdict::Redirected { to_port, to_destination, rule, via } => {
                redirected_ports.extend(members.iter().map(|m| m.port));
                redirect_port = redirect_port.or(*to_port);
                let path: Vec<String> =
                    via.iter().chain([rule]).map(|r| format!("{} rule {}", r.chain, r.number)).collect();
                let goes_to = match (to_port, to_destination) {
                    (Some(port), _) => format!("port {port}"),
                    (None, Some(to)) => format!("{to} (DNAT)"),
                    (None, None) => "elsewhere".into(),
                };
                format!("TCP to {to} on {ports} goes to {goes_to} ({backend} nat {})", path.join(" → "))
            }
            Verdict::Excluded { rule } => {
                format!("{ports} excluded by {} ({backend} {})", rule.text, place(rule))
            }
            Verdict::NotTouched if backend.is_empty() => {
                format!("{ports}: the pod's network namespace holds no NAT rule")
            }
            Verdict::NotTouched => format!("no NAT rule rewrites TCP to {to} on {ports}"),
            Verdict::CannotTell { rule, why } => match rule {
                Some(rule) => format!("{ports}: {why}, at {} ({backend} {})", rule.text, place(rule)),
                None => format!("{ports}: {why}"),
            },
        });
    }
    let cannot = answer.verdicts.iter().any(|v| matches!(v.verdict, Verdict::CannotTell { .. }));
    let (redirected, head) = if !redirected_ports.is_empty() {
        (Some(true), "redirected")
    } else if cannot {
        (None, "cannot tell")
    } else if !unevaluated.is_empty() {
        phrases.push(format!(
            "but the namespace also holds nftables tables kstall does not evaluate: {}",
            unevaluated.join(", ")
        ));
        (None, "cannot tell")
    } else {
        (Some(false), "not redirected")
    };
    answer.redirected = redirected;
    answer.summary = format!("{head} — {}", phrases.join("; "));
    if !redirected_ports.is_empty() {
        redirected_ports.sort_unstable();
        redirected_ports.dedup();
        let way_out = way_out(mesh, redirect_port, &redirected_ports);
        answer.summary.push_str(&format!("; {way_out}"));
        answer.way_out = Some(way_out);
    }
}

fn place(rule: &RuleRef) -> String {
    format!("{} {} rule {}", rule.table, rule.chain, rule.number)
}

/// How to exempt `ports` from the redirect to `port`, in the setting of the mesh that wrote it:
/// the pod's mesh whose proxy listens there (one of two, if the pod carries two meshes' marks).
fn way_out(mesh: Option<&PodMesh>, port: Option<u16>, ports: &[u16]) -> String {
    let list = ports.iter().map(u16::to_string).collect::<Vec<_>>().join(",");
    let meshes = mesh.map(|m| m.meshes.as_slice()).unwrap_or_default();
    let owner = match meshes {
        [only] if port.is_none_or(|p| p == only.proxy_port()) => Some(*only),
        _ => {
            let owners: Vec<&Mesh> = meshes.iter().filter(|m| Some(m.proxy_port()) == port).collect();
            match owners[..] {
                [one] => Some(*one),
                _ => None,
            }
        }
    };
    match owner {
        Some(mesh) => match mesh.port_exclusion() {
            Some(annotation) => format!("exclude them: {annotation}: \"{list}\" on the pod template"),
            None => "ambient has no port exclusion (istio#49829): label the pod istio.io/dataplane-mode: none, or \
                     mount the volume with a CSI driver (made in the node's namespace)"
                .into(),
        },
        None => format!(
            "exclude ports {list} in the setting of the mesh that wrote the rule (Istio sidecar: \
             traffic.sidecar.istio.io/excludeOutboundPorts; Linkerd: config.linkerd.io/skip-outbound-ports)"
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ISTIO_SIDECAR: &str =
        include_str!("../../../tests/data/istio-iptables/kube-virt-interfaces.golden");
    const ISTIO_EXCLUDING: &str =
        include_str!("../../../tests/data/istio-iptables/exclude-outbound-ports.iptables-save");
    const AMBIENT: &str = include_str!("../../../tests/data/istio-iptables/ambient-default.iptables-save");
    const LINKERD_SKIPPING: &str =
        include_str!("../../../tests/data/linkerd-proxy-init/skip-outbound-ports.iptables-save");
    const NFS_PORTS: [u16; 3] = [2049, 111, 20048];

    fn marked(meshes: &[Mesh]) -> PodMesh {
        PodMesh { meshes: meshes.to_vec(), native_sidecar: false }
    }

    fn rules(dumps: &[&str]) -> Vec<Rules> {
        let dump = |text: &str| Rules { backend: "iptables-nft", v6: false, dump: Dump::parse(text) };
        dumps.iter().map(|text| dump(text)).filter(|r| r.dump.has_nat_rules()).collect()
    }

    fn judged(meshes: &[Mesh], dumps: &[&str], server: Option<&str>) -> NfsThroughMesh {
        let read = Read {
            rules: rules(dumps),
            servers: server.map(|s| s.parse().unwrap()).into_iter().collect(),
            ports: NFS_PORTS.to_vec(),
            v6: false,
            notes: vec![],
            unevaluated: vec![],
        };
        judge(Some(&marked(meshes)), &[], read)
    }

    #[test]
    fn a_classic_sidecar_pod_is_told_its_nfs_is_redirected_and_the_annotation_that_exempts_it() {
        let x = judged(&[Mesh::IstioSidecar], &[ISTIO_SIDECAR], Some("10.55.0.1"));
        assert_eq!(x.redirected, Some(true));
        assert_eq!(
            x.summary,
            "redirected — TCP to 10.55.0.1 on 2049, 111, 20048 goes to port 15001 (iptables-nft nat OUTPUT rule 1 \
             → ISTIO_OUTPUT rule 9 → ISTIO_REDIRECT rule 1); exclude them: \
             traffic.sidecar.istio.io/excludeOutboundPorts: \"111,2049,20048\" on the pod template"
        );
        assert_eq!(
            (x.mesh, x.rules_from),
            (vec!["istio-sidecar".to_string()], vec!["iptables-nft".to_string()])
        );
        assert_eq!(x.verdicts.len(), 3);
        // With the annotation's rules: not redirected, each port named with its rule.
        let x = judged(&[Mesh::IstioSidecar], &[ISTIO_EXCLUDING], None);
        assert_eq!(x.redirected, Some(false));
        assert_eq!(
            x.summary,
            "not redirected — 2049 excluded by -A ISTIO_OUTPUT -p tcp -m tcp --dport 2049 -j RETURN (iptables-nft \
             nat ISTIO_OUTPUT rule 3); 111 excluded by -A ISTIO_OUTPUT -p tcp -m tcp --dport 111 -j RETURN \
             (iptables-nft nat ISTIO_OUTPUT rule 1); 20048 excluded by -A ISTIO_OUTPUT -p tcp -m tcp --dport 20048 \
             -j RETURN (iptables-nft nat ISTIO_OUTPUT rule 5)"
        );
        assert_eq!(x.way_out, None);
    }

    #[test]
    fn linkerds_skip_outbound_ports_rule_is_named_and_ambient_gets_its_own_way_out() {
        let x = judged(&[Mesh::Linkerd], &[LINKERD_SKIPPING], Some("10.55.0.1"));
        assert_eq!(x.redirected, Some(false));
        assert_eq!(
            x.summary,
            "not redirected — 2049, 111, 20048 excluded by -A PROXY_INIT_OUTPUT -p tcp -m multiport --dports \
             2049,111,20048 -m comment --comment \"proxy-init/ignore-port-2049,111,20048\" -j RETURN (iptables-nft nat \
             PROXY_INIT_OUTPUT rule 3)"
        );
        let x = judged(&[Mesh::IstioAmbient], &[AMBIENT], None);
        assert_eq!(x.redirected, Some(true));
        assert!(
            x.summary.starts_with(
                "redirected — TCP to any server on 2049, 111, 20048 goes to port 15001 (iptables-nft nat OUTPUT rule \
                 1 → ISTIO_OUTPUT rule 5); ambient has no port exclusion (istio#49829)"
            ),
            "{}",
            x.summary
        );
    }

    /// A pod with both meshes' marks: the advice is the mesh whose proxy the redirect goes to.
    #[test]
    fn with_two_meshes_the_way_out_is_the_redirecting_meshs() {
        let linkerd_nat = LINKERD_SKIPPING
            .lines()
            .filter(|l| l.starts_with("-A "))
            .map(|l| l.replace("2049,111,20048", "4567,4568"))
            .collect::<Vec<_>>()
            .join("\n");
        let both = |istio: &str| istio.replace("COMMIT", &format!("{linkerd_nat}\nCOMMIT"));
        let two = [Mesh::IstioSidecar, Mesh::Linkerd];
        let x = judged(&two, &[&both(ISTIO_SIDECAR)], None);
        assert!(x.way_out.unwrap().contains("traffic.sidecar.istio.io/excludeOutboundPorts"));
        let x = judged(&two, &[&both(ISTIO_EXCLUDING)], None);
        assert!(x.summary.contains("goes to port 4140"), "{}", x.summary);
        assert_eq!(
            x.way_out.unwrap(),
            "exclude them: config.linkerd.io/skip-outbound-ports: \"111,2049,20048\" on the pod template"
        );
        // A redirect to a port neither mesh's proxy uses: no one mesh's advice.
        let elsewhere = ISTIO_SIDECAR.replace("--to-ports 15001", "--to-ports 15999");
        let way_out = judged(&two, &[&elsewhere], None).way_out.unwrap();
        assert!(
            way_out
                .starts_with("exclude ports 111,2049,20048 in the setting of the mesh that wrote the rule")
        );
    }

    #[test]
    fn cannot_tell_names_the_rule_and_no_rules_are_no_redirect() {
        let unknown = ISTIO_SIDECAR.replacen(
            "-A OUTPUT -j ISTIO_OUTPUT",
            "-A OUTPUT -p tcp -m statistic --mode random --probability 0.5 -j RETURN\n-A OUTPUT -j ISTIO_OUTPUT",
            1,
        );
        let x = judged(&[Mesh::IstioSidecar], &[&unknown], None);
        assert_eq!(x.redirected, None);
        assert_eq!(
            x.summary,
            "cannot tell — 2049, 111, 20048: kstall does not evaluate `-m statistic`, at -A OUTPUT -p tcp -m \
             statistic --mode random --probability 0.5 -j RETURN (iptables-nft nat OUTPUT rule 1)"
        );
        let x = judged(&[Mesh::Linkerd], &["*nat\n:OUTPUT ACCEPT [0:0]\nCOMMIT\n"], None);
        assert_eq!(x.redirected, Some(false));
        assert_eq!(
            x.summary,
            "not redirected — 2049, 111, 20048: the pod's network namespace holds no NAT rule"
        );
        // nftables tables kstall does not read leave "not redirected" unsaid.
        let read = Read {
            rules: vec![],
            servers: vec![],
            ports: vec![2049],
            v6: false,
            notes: vec![],
            unevaluated: vec!["inet istio-proxy-nat".into()],
        };
        let x = judge(Some(&marked(&[Mesh::IstioSidecar])), &[], read);
        assert_eq!(x.redirected, None);
        assert!(
            x.summary.ends_with("nftables tables kstall does not evaluate: inet istio-proxy-nat"),
            "{}",
            x.summary
        );
    }

    /// The servers and ports come from the pod's processes' mount tables; the kubelet's mounts
    /// (the node's namespace) are not the pod's rules' business.
    #[test]
    fn servers_and_ports_from_the_pods_mount_tables() {
        let proc = tempfile::tempdir().unwrap();
        let table = |pid: u32, text: &str| {
            std::fs::create_dir_all(proc.path().join(pid.to_string())).unwrap();
            std::fs::write(proc.path().join(format!("{pid}/mountinfo")), text).unwrap();
        };
        table(
            7,
            "40 22 0:60 / /data rw - nfs 10.55.0.1:/export rw,vers=3,hard,proto=tcp,port=2049,mountaddr=10.55.0.1,\
             mountport=20049,addr=10.55.0.1\n\
             41 22 0:61 / /volume rw - nfs4 10.55.0.9:/ rw,vers=4.1,addr=10.55.0.9\n",
        );
        table(8, "42 22 0:62 / /more rw - nfs4 10.55.0.1:/b rw,vers=4.2,port=3049,addr=10.55.0.1\n");
        let check = Check {
            processes: vec![7, 8, 9],
            ports: NFS_PORTS.to_vec(),
            kubelet_devices: vec!["0:61".into()],
            ..Default::default()
        };
        let mut notes = Vec::new();
        let (servers, ports) = nfs_targets(&check, proc.path(), &mut notes);
        assert_eq!(servers, ["10.55.0.1".parse::<IpAddr>().unwrap()]);
        assert_eq!(ports, [2049, 111, 20048, 20049, 3049]);
        assert_eq!(notes.len(), 1);
        assert!(notes[0].starts_with("10.55.0.9 mounted by the kubelet as the pod's volume"), "{notes:?}");
        let (servers, _) =
            nfs_targets(&Check { processes: vec![9], ..Default::default() }, proc.path(), &mut notes);
        assert!(servers.is_empty());
        assert_eq!(notes[1], "no NFS mount made in the pod: checked for a server at any address");
    }

    #[test]
    fn a_pod_whose_processes_are_gone_has_no_namespace_to_read() {
        let proc = tempfile::tempdir().unwrap();
        let check = Check {
            mesh: Some(marked(&[Mesh::Linkerd])),
            netns: vec![4026532999],
            processes: vec![4242],
            ports: vec![2049],
            ..Default::default()
        };
        let x = self::check(&check, proc.path(), Duration::from_secs(1));
        assert_eq!((x.mesh, x.redirected), (vec!["linkerd".to_string()], None));
        assert_eq!(
            x.summary,
            "cannot tell — the pod's network namespace is gone: no process of the pod is left to enter it by"
        );
    }
}
