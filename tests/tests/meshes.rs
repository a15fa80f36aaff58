//! Incident 1 in each mesh's own rules, on the real kernel: a pod's network namespace holds the
//! redirect its mesh writes (`tests/data/`: Istio's classic sidecar, Istio ambient's in-pod rules,
//! Linkerd's proxy-init), on a veth to an NFS server's address, with nothing listening on the
//! proxy's port (the proxy, or ztunnel, gone). The pod's connects to :2049 are reset. kstall must
//! fire `nfs-sidecar-redirect` naming the mesh the pod and the port say — or no mesh, when they
//! do not agree — and the break-glass commands it prints, run as printed, must let the pod's
//! connects reach the server, after which the incident resolves.

use std::{
    net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream},
    process::Command,
    time::Duration,
};

use kstall_tests::{
    agent::{Agent, agent_binary, break_glass_commands, pod_json, run_as_printed, write_pods_file},
    cgroup::{Cgroup, PodProcess},
    host::wait_for,
    kernel_tests_can_run,
    meshes::{MeshRules, install_linkerd_skipping_nfs, linkerd_skipping_nfs_summary, mark},
    netns::{NetNs, NfsReconnects},
};
use serde_json::{Value, json};

const UID: &str = "6d3e0f1a-2b3c-4d5e-8f9a-0b1c2d3e4f5a";
const CONTAINER: &str = "7c6b5a4f3e2d1c0b9a8f7e6d5c4b3a2f1e0d9c8b7a6f5e4d3c2b1a0f9e8d7c6b";
const POD: &str = "reports-7f9c6d5b8-k2x4q";
const SERVER: Ipv4Addr = Ipv4Addr::new(10, 79, 0, 1);

/// What the pod is marked with, beyond its app container.
enum Marks {
    IstioSidecar,
    IstioNativeSidecar,
    Ambient,
    LinkerdNativeSidecar,
    /// Both Istio's and Linkerd's proxies: kstall must not pick one.
    IstioAndLinkerd,
}

/// What kstall must say of the redirect.
struct Expected {
    mesh: &'static str,
    proxy: Option<&'static str>,
    native_sidecar: Option<bool>,
    proxy_port: u16,
}

#[test]
fn a_classic_istio_sidecar_gone_is_named_and_incident_1s_steps_free_it() {
    let expected = Expected {
        mesh: "istio-sidecar",
        proxy: Some("istio-proxy"),
        native_sidecar: Some(false),
        proxy_port: 15001,
    };
    redirect_is_named_and_freed("istio_classic", MeshRules::IstioSidecar, Marks::IstioSidecar, &expected);
}

#[test]
fn a_native_istio_sidecar_is_named_with_the_order_its_termination_follows() {
    let expected = Expected {
        mesh: "istio-sidecar",
        proxy: Some("istio-proxy"),
        native_sidecar: Some(true),
        proxy_port: 15001,
    };
    let incident = redirect_is_named_and_freed(
        "istio_native",
        MeshRules::IstioSidecar,
        Marks::IstioNativeSidecar,
        &expected,
    );
    let order = incident["evidence"]["termination_order"].as_str().unwrap_or_default();
    assert!(
        order.starts_with("native sidecar: Kubernetes stops the proxy after the app containers"),
        "{incident:#}"
    );
}

#[test]
fn istio_ambient_without_ztunnel_is_named_and_its_steps_free_it() {
    let expected =
        Expected { mesh: "istio-ambient", proxy: Some("ztunnel"), native_sidecar: None, proxy_port: 15001 };
    let incident = redirect_is_named_and_freed("ambient", MeshRules::IstioAmbient, Marks::Ambient, &expected);
    let fix = incident["remediation"]["permanent"][0].as_str().unwrap_or_default();
    assert!(fix.contains("istio.io/dataplane-mode: none"), "ambient's way out, not a port annotation: {fix}");
}

#[test]
fn linkerd_without_its_proxy_is_named_and_its_steps_free_it() {
    let expected = Expected {
        mesh: "linkerd",
        proxy: Some("linkerd-proxy"),
        native_sidecar: Some(true),
        proxy_port: 4140,
    };
    let incident =
        redirect_is_named_and_freed("linkerd", MeshRules::Linkerd, Marks::LinkerdNativeSidecar, &expected);
    let fix = incident["remediation"]["permanent"][0].as_str().unwrap_or_default();
    assert!(fix.contains("config.linkerd.io/skip-outbound-ports: \"2049\""), "{fix}");
}

#[test]
fn a_pod_with_two_meshes_proxies_gets_no_meshs_advice_and_the_neutral_steps_free_it() {
    let expected = Expected { mesh: "unknown", proxy: None, native_sidecar: None, proxy_port: 15001 };
    let incident =
        redirect_is_named_and_freed("two_meshes", MeshRules::IstioSidecar, Marks::IstioAndLinkerd, &expected);
    let said = incident["evidence"]["unknown_because"].as_str().unwrap_or_default();
    assert_eq!(said, "the pod carries the marks of istio-sidecar and linkerd", "{incident:#}");
    let way_out = incident["remediation"].to_string();
    for one_mesh in ["ISTIO_REDIRECT", "PROXY_INIT_OUTPUT", "excludeOutboundPorts: \\\"2049\\\""] {
        assert!(!way_out.contains(one_mesh), "no one mesh's way out ({one_mesh}): {way_out}");
    }
}

/// Before anything fails: `kstall explain pod` reads each meshed pod's own NAT rules (entering its
/// network namespace) and says whether its NFS connections are redirected — an Istio ambient pod's
/// are (to ztunnel's 15001), a Linkerd pod annotated `config.linkerd.io/skip-outbound-ports:
/// "2049,111,20048"` has its proxy-init's RETURN for them. What it says must be what the kernel
/// does: a connect from each pod to an NFS server's port 2049 is reset, or accepted.
#[test]
fn explain_pod_says_from_the_pods_own_rules_whether_its_nfs_is_redirected() {
    if !kernel_tests_can_run("explain_pod_says_from_the_pods_own_rules_whether_its_nfs_is_redirected") {
        return;
    }
    const AMBIENT: (&str, &str, &str) = (
        "2b1c0d9e-8f7a-4b6c-9d5e-3f2a1b0c9d8e",
        "ledger-6c8d7f5b9-q7w2e",
        "5e4d3c2b1a0f9e8d7c6b5a4f3e2d1c0b9a8f7e6d5c4b3a2f1e0d9c8b7a6f5e4d",
    );
    const LINKERD: (&str, &str, &str) = (
        "9a8b7c6d-5e4f-4a3b-8c2d-1e0f9a8b7c6d",
        "reports-84f7c9d6b-m3n5p",
        "1f2e3d4c5b6a7f8e9d0c1b2a3f4e5d6c7b8a9f0e1d2c3b4a5f6e7d8c9b0a1f2e",
    );
    let dir = tempfile::tempdir().unwrap();
    let pods_file = dir.path().join("pods.json");
    let mut ambient = pod_json(AMBIENT.0, AMBIENT.1, AMBIENT.2);
    mark(&mut ambient, MeshRules::IstioAmbient, false);
    let mut linkerd = pod_json(LINKERD.0, LINKERD.1, LINKERD.2);
    mark(&mut linkerd, MeshRules::Linkerd, true);
    write_pods_file(&pods_file, &[ambient, linkerd]);
    let agent = Agent::start(&["--pods-file", pods_file.to_str().unwrap()]);

    // An NFS server's namespace with a veth to each pod's.
    let server_ns = NetNs::new("xsrv");
    let ambient_ns = NetNs::new("xamb");
    let linkerd_ns = NetNs::new("xlnk");
    let tag = std::process::id() % 100_000;
    server_ns.veth_to(&ambient_ns, (&format!("kxa{tag}"), "10.81.0.1/24"), ("kxa0", "10.81.0.2/24"));
    server_ns.veth_to(&linkerd_ns, (&format!("kxl{tag}"), "10.82.0.1/24"), ("kxl0", "10.82.0.2/24"));
    let server =
        server_ns.run_inside(|| TcpListener::bind((Ipv4Addr::UNSPECIFIED, 2049)).expect("the server's port"));
    let mut pods = Vec::new();
    for (ns, (uid, _, container)) in [(&ambient_ns, AMBIENT), (&linkerd_ns, LINKERD)] {
        let cgroup = Cgroup::kubepods_container("burstable", uid, container);
        let process = PodProcess::start(ns, &cgroup.procs());
        pods.push((cgroup, process));
    }
    MeshRules::IstioAmbient.install(&ambient_ns);
    install_linkerd_skipping_nfs(&linkerd_ns);

    let explain = |pod: &str, output: &str| {
        let out = Command::new(agent_binary())
            .args(["explain", "pod", pod, "-n", "shop", "--output", output])
            .arg("--api-socket")
            .arg(&agent.socket)
            .output()
            .expect("kstall explain");
        assert!(out.status.success(), "explain {pod}: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    // The agent learns each pod's namespace from its process (its next walk): then it reads.
    let read = |pod: &str, netns: &NetNs| {
        let explained = wait_for(Duration::from_secs(20), || {
            let x: Value = serde_json::from_str(&explain(pod, "json")).expect("JSON");
            (x["netns"] == json!([netns.inode()])).then_some(x)
        });
        let x = explained.unwrap_or_else(|| panic!("{pod}'s namespace never known: {}", agent.log()));
        x["nfs_through_mesh"].clone()
    };
    // This machine's `iptables` wrote the rules: its backend is the one that holds them.
    let version = Command::new("iptables").arg("-V").output().expect("iptables -V");
    let backend = if String::from_utf8_lossy(&version.stdout).contains("nf_tables") {
        "iptables-nft"
    } else {
        "iptables-legacy"
    };

    let x = read(AMBIENT.1, &ambient_ns);
    assert_eq!((&x["mesh"], &x["redirected"]), (&json!(["istio-ambient"]), &json!(true)), "{x:#}");
    assert_eq!(x["rules_from"], json!([backend]), "{x:#}");
    let summary = x["summary"].as_str().unwrap_or_default();
    let expected = format!(
        "redirected — TCP to any server on 2049, 111, 20048 goes to port 15001 ({backend} nat OUTPUT rule 1 → \
         ISTIO_OUTPUT rule 5); ambient has no port exclusion (istio#49829)"
    );
    assert!(summary.starts_with(&expected), "{x:#}");
    let text = explain(AMBIENT.1, "text");
    assert!(text.contains(&format!("MESH  istio-ambient\n  NFS through the mesh: {expected}")), "{text}");

    let x = read(LINKERD.1, &linkerd_ns);
    assert_eq!((&x["mesh"], &x["redirected"]), (&json!(["linkerd"]), &json!(false)), "{x:#}");
    assert_eq!(x["summary"], linkerd_skipping_nfs_summary(backend), "{x:#}");
    assert!(explain(LINKERD.1, "text").contains("MESH  linkerd\n  NFS through the mesh: not redirected — "));

    // The kernel agrees: ambient's connect goes to 15001 (nothing there: refused), Linkerd's
    // reaches the server.
    let connect = |ns: &NetNs, to: Ipv4Addr| {
        ns.run_inside(move || {
            TcpStream::connect_timeout(&SocketAddr::from((to, 2049)), Duration::from_secs(5))
        })
    };
    let refused = connect(&ambient_ns, Ipv4Addr::new(10, 81, 0, 1)).map(|_| ()).unwrap_err();
    assert_eq!(refused.kind(), std::io::ErrorKind::ConnectionRefused, "{refused}");
    let _through =
        connect(&linkerd_ns, Ipv4Addr::new(10, 82, 0, 1)).expect("Linkerd's pod reaches the server");
    let (_, peer) = server.accept().expect("the server accepts");
    assert_eq!(peer.ip(), Ipv4Addr::new(10, 82, 0, 2), "straight from the pod");
    drop(pods);
}

/// The pod, its mesh's rules and a server; the incident kstall fires, checked against
/// `expected`; its break-glass commands run as printed; the pod's connects reaching the server
/// and the incident resolving. Returns the incident as it fired.
fn redirect_is_named_and_freed(test: &str, rules: MeshRules, marks: Marks, expected: &Expected) -> Value {
    if !kernel_tests_can_run(test) {
        return Value::Null;
    }
    let dir = tempfile::tempdir().unwrap();
    let pods_file = dir.path().join("pods.json");
    let mut pod = pod_json(UID, POD, CONTAINER);
    match marks {
        Marks::IstioSidecar => mark(&mut pod, MeshRules::IstioSidecar, false),
        Marks::IstioNativeSidecar => mark(&mut pod, MeshRules::IstioSidecar, true),
        Marks::Ambient => mark(&mut pod, MeshRules::IstioAmbient, false),
        Marks::LinkerdNativeSidecar => mark(&mut pod, MeshRules::Linkerd, true),
        Marks::IstioAndLinkerd => {
            mark(&mut pod, MeshRules::IstioSidecar, false);
            mark(&mut pod, MeshRules::Linkerd, false);
        }
    }
    write_pods_file(&pods_file, &[pod]);
    let agent = Agent::start(&["--pods-file", pods_file.to_str().unwrap(), "--quiet-window", "5s"]);

    // The NFS server's side, and the pod: its namespace on a veth to the server's, its mesh's
    // rules, a process in its namespace and cgroup (what kstall learns the namespace by).
    let server_ns = NetNs::new("meshsrv");
    let netns = NetNs::new("meshpod");
    let outer = format!("kms{}", std::process::id() % 100_000);
    server_ns.veth_to(&netns, (&outer, &format!("{SERVER}/24")), ("kmp0", "10.79.0.2/24"));
    let nfs = SocketAddr::from((SERVER, 2049));
    let server = server_ns.run_inside(move || TcpListener::bind(nfs).expect("the server's port"));
    let container = Cgroup::kubepods_container("burstable", UID, CONTAINER);
    let sandbox = PodProcess::start(&netns, &container.procs());
    rules.install(&netns);

    // A hard-mounted client's reconnects: redirected to the proxy's port, where nothing listens.
    let mut client = NfsReconnects::to(&netns, nfs);
    let named =
        |i: &Value| i["signature"] == "nfs-sidecar-redirect" && i["state"] == "firing" && i["pod"] == POD;
    let incident = agent
        .wait_incident(named, Duration::from_secs(30))
        .unwrap_or_else(|| panic!("no nfs-sidecar-redirect: {:#?}\n{}", agent.incidents(), agent.log()));
    let evidence = &incident["evidence"];
    assert_eq!(evidence["mesh"], expected.mesh, "{incident:#}");
    assert_eq!(evidence["proxy"], json!(expected.proxy), "{incident:#}");
    assert_eq!(evidence["native_sidecar"], json!(expected.native_sidecar), "{incident:#}");
    assert_eq!(evidence["redirect_ports"], json!([expected.proxy_port]), "{incident:#}");
    let named_port = (expected.mesh != "unknown").then_some(expected.proxy_port);
    assert_eq!(evidence["proxy_port"], json!(named_port), "{incident:#}");
    assert_eq!(evidence["server"], SERVER.to_string(), "{incident:#}");
    assert_eq!(client.connected(), 0, "every connect was reset");

    // The break-glass commands, as printed, entering through the pod's process.
    let task = format!("/proc/{0}/task/{0}/", sandbox.pid());
    let commands: Vec<String> =
        break_glass_commands(&incident).iter().map(|c| c.replace("/proc/<pid>/task/<tid>/", &task)).collect();
    let sh = run_as_printed;
    let [belongs, netns_check, redirect_check, edit, _confirm] = commands.as_slice() else {
        panic!("five break-glass commands: {commands:#?}")
    };
    assert!(sh(belongs).parse::<u32>().is_ok_and(|n| n >= 1), "check 1: {belongs}");
    // Where pid 1 is a sandbox's whose namespace links even root cannot read (this machine's),
    // the host's namespace is this test's own.
    let netns_check = match std::fs::read_link("/proc/1/ns/net") {
        Ok(_) => netns_check.clone(),
        Err(_) => netns_check.replace("/proc/1/ns/net", "/proc/self/ns/net"),
    };
    let namespaces: Vec<String> = sh(&netns_check).lines().map(String::from).collect();
    assert!(
        namespaces.len() == 2 && namespaces[0] != namespaces[1],
        "check 2: {netns_check}: {namespaces:?}"
    );
    let redirects: u32 = sh(redirect_check).parse().unwrap_or(0);
    if expected.mesh == "unknown" {
        assert!(redirects >= 1, "check 3: {redirect_check}");
    } else {
        assert_eq!(redirects, 1, "check 3: {redirect_check}");
    }
    sh(edit);
    server.set_nonblocking(true).unwrap();
    let peer = wait_for(Duration::from_secs(10), || server.accept().ok().map(|(_, peer)| peer));
    let peer = peer.unwrap_or_else(|| panic!("the pod's connects reach the server once this ran: {edit}"));
    assert_eq!(peer.ip(), Ipv4Addr::new(10, 79, 0, 2), "straight from the pod, not through a proxy");
    // Its connect returned before the server's accept, its count a moment after.
    let through = wait_for(Duration::from_secs(5), || (client.connected() > 0).then_some(()));
    assert!(through.is_some(), "the client saw its connect through");
    client.stop();
    let id = incident["id"].clone();
    let resolved =
        agent.wait_incident(|i| i["id"] == id && i["state"] == "resolved", Duration::from_secs(30));
    assert!(resolved.is_some(), "resolves once the resets stop: {:#?}", agent.incidents());
    incident
}
