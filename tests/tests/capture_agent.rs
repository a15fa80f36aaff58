//! `kstall capture` through a real agent: the pods file names a pod whose network namespace
//! redirects 2049 to 15001, where nothing listens. The agent finds the pod's namespace and
//! processes in its index, captures on a thread of its own while the pod's connects are refused,
//! and hands the bundle over its socket: it unpacks whole and holds the SYN to 15001 and the RST
//! from 2049. A second capture of the pod while the first runs is refused in one line, and the
//! agent holds no packet socket in the pod's namespace before or after.

use std::{
    collections::BTreeSet,
    net::SocketAddr,
    path::Path,
    process::{Command, Output},
    time::Duration,
};

use kstall_tests::{
    agent::{Agent, agent_binary, pod_json, sample_with, write_pods_file},
    capture::{CaptureDisk, manifest_of, opened, packet_sockets, ports, tcpdump, unpacked},
    cgroup::{Cgroup, PodProcess},
    host::wait_for,
    kernel_tests_can_run,
    netns::{NetNs, refused_connects},
};

const UID: &str = "5a4b3c2d-1e0f-4a9b-8c7d-6e5f4a3b2c1d";
const CONTAINER: &str = "1f2e3d4c5b6a79880f1e2d3c4b5a69788f9e0d1c2b3a49586f7e8d9c0b1a2f3e";
const POD: &str = "capture-web-5d8c7b9f4-t9r2p";
const CONNECTS: usize = 3;

fn kstall(agent: &Agent, dir: &Path, args: &[&str]) -> Output {
    Command::new(agent_binary())
        .arg("capture")
        .args(args)
        .arg("--api-socket")
        .arg(&agent.socket)
        .current_dir(dir)
        .output()
        .expect("kstall capture")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// The agent, its pods file naming the pod, and the pod: its namespace on a veth to a server's,
/// the redirect, a process in its namespace and cgroup; once the agent knows the namespace.
fn agent_and_pod(dir: &Path) -> (Agent, NetNs, NetNs, Cgroup, PodProcess) {
    let pods_file = dir.join("pods.json");
    write_pods_file(&pods_file, &[pod_json(UID, POD, CONTAINER)]);
    // The state, and with it the captures, on the test's own disk (see CaptureDisk).
    let agent =
        Agent::start_with_state(Some(&dir.join("state")), &["--pods-file", pods_file.to_str().unwrap()]);
    let pod = NetNs::new("capa-pod");
    let server = NetNs::new("capa-srv");
    pod.veth_to(&server, ("eth0", "10.0.0.2/24"), ("eth0", "10.0.0.1/24"));
    pod.redirect_tcp("iptables", 2049, 15001);
    let container = Cgroup::kubepods_container("burstable", UID, CONTAINER);
    let process = PodProcess::start(&pod, &container.procs());
    let inode = pod.inode();
    let known = wait_for(Duration::from_secs(30), || {
        let x = agent.explain(POD);
        x["netns"].as_array().is_some_and(|n| n.iter().any(|n| n.as_u64() == Some(inode))).then_some(())
    });
    assert!(known.is_some(), "the agent never learnt the pod's namespace:\n{}", agent.log());
    (agent, pod, server, container, process)
}

#[test]
fn a_capture_through_the_agent_is_the_whole_case() {
    if !kernel_tests_can_run("a_capture_through_the_agent_is_the_whole_case") {
        return;
    }
    let dir = CaptureDisk::new();
    let (agent, pod, _server, _container, _process) = agent_and_pod(dir.path());
    assert_eq!(packet_sockets(&pod), 0, "a packet socket before any capture");

    let filter = "tcp and (host 10.0.0.1 or port 2049 or port 15001)";
    let mut start = Command::new(agent_binary())
        .args([
            "capture",
            "start",
            "--pod",
            POD,
            "-n",
            "shop",
            "--duration",
            "3s",
            "--wait",
            "--filter",
            filter,
        ])
        .arg("--api-socket")
        .arg(&agent.socket)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("kstall capture start");
    // Up, or the capture ended: a refused or failed one says why.
    let up = wait_for(Duration::from_secs(10), || {
        if packet_sockets(&pod) == 2 {
            return Some(true);
        }
        start.try_wait().expect("wait").map(|_| false)
    });
    match up {
        Some(true) => {}
        Some(false) => {
            let out = start.wait_with_output().expect("output");
            panic!(
                "the capture ended before its packet sockets showed: {}{}",
                text(&out.stdout),
                text(&out.stderr)
            )
        }
        None => panic!("the agent's two packet sockets never showed:\n{}", agent.log()),
    }

    // A second capture of the pod while the first runs: one line, exit 1.
    let second = kstall(&agent, dir.path(), &["start", "--pod", POD, "--duration", "3s"]);
    let refusal = text(&second.stderr);
    assert_eq!(second.status.code(), Some(1), "{refusal}");
    assert_eq!(refusal.lines().count(), 1, "{refusal}");
    assert!(refusal.starts_with(&format!("kstall: capture of shop/{POD} refused: ")), "{refusal}");
    assert!(refusal.contains(" is capturing it until "), "{refusal}");

    let nfs: SocketAddr = "10.0.0.1:2049".parse().unwrap();
    pod.run_inside(move || refused_connects(nfs, CONNECTS));
    let status = wait_for(Duration::from_secs(20), || start.try_wait().expect("wait"))
        .unwrap_or_else(|| panic!("the capture did not end:\n{}", agent.log()));
    let out = start.wait_with_output().expect("output");
    let said = text(&out.stdout);
    assert!(status.success(), "{said}{}", text(&out.stderr));
    assert!(said.starts_with(&format!("capturing shop/{POD} (netns {})", pod.inode())), "{said}");
    assert!(said.contains(" packets, bundle "), "{said}");
    assert_eq!(packet_sockets(&pod), 0, "a packet socket is left in the namespace");

    // The list, then the bundle over the socket into ./ID.tar.gz.
    let list = kstall(&agent, dir.path(), &["list", "-o", "json"]);
    let captures: serde_json::Value = serde_json::from_slice(&list.stdout).expect("list -o json");
    let id = captures[0]["id"].as_str().expect("an id").to_string();
    assert_eq!(captures[0]["state"], "done", "{captures:#}");
    let table = text(&kstall(&agent, dir.path(), &["list"]).stdout);
    assert!(table.starts_with("ID "), "{table}");
    assert!(table.lines().nth(1).is_some_and(|l| l.starts_with(&id) && l.contains(" done ")), "{table}");
    let bundles = dir.path().join("bundles");
    std::fs::create_dir(&bundles).unwrap();
    let got = kstall(&agent, &bundles, &["get", &id]);
    assert!(got.status.success(), "{}", text(&got.stderr));
    let again = kstall(&agent, &bundles, &["get", &id]);
    assert_eq!(
        text(&again.stderr),
        format!("kstall capture get: {id}.tar.gz exists: give -o or remove it\n")
    );
    // Counted, by trigger and result; none running now.
    let metrics = agent.metrics();
    let captures = |trigger: &str, result: &str| {
        sample_with(&metrics, "kstall_captures_total", &[("result", result), ("trigger", trigger)])
    };
    assert_eq!(
        (captures("manual", "complete"), captures("manual", "failed"), captures("incident", "complete")),
        (Some(1.0), Some(0.0), Some(0.0)),
        "{metrics}"
    );
    assert!(metrics.lines().any(|l| l == "kstall_captures_running 0"), "{metrics}");
    // Never on the metrics port.
    for path in [format!("/api/v1/captures/{id}"), "/api/v1/captures".into()] {
        let (status, body) = agent.get_with_status(&path);
        assert_eq!(status, 403, "{path}: {body}");
        assert!(
            body.starts_with(
                "captures are not served on the metrics port: on the node, kstall capture get ID"
            )
        );
    }
    let unknown = kstall(&agent, &bundles, &["get", "20261130T000000Z-none-0000"]);
    assert_eq!(unknown.status.code(), Some(1));
    assert_eq!(
        text(&unknown.stderr),
        "kstall: capture 20261130T000000Z-none-0000: no such capture on this node (kstall capture list)\n"
    );

    let top = unpacked(&bundles);
    let manifest = manifest_of(&top);
    assert_eq!(manifest["pod"]["name"], POD, "{manifest:#}");
    assert_eq!(manifest["pod"]["uid"], UID, "{manifest:#}");
    let (lines, _) = tcpdump(&top.join("packets.pcapng"));
    let syns = ports(&lines, "IP 10.0.0.2.", " > 127.0.0.1.15001: Flags [S],");
    let rsts = ports(&lines, "IP 10.0.0.1.2049 > 10.0.0.2.", ": Flags [R.],");
    assert_eq!(syns.len(), CONNECTS, "{lines}");
    assert_eq!(syns.iter().collect::<BTreeSet<_>>(), rsts.iter().collect::<BTreeSet<_>>(), "{lines}");
}

#[test]
fn an_agent_holds_no_packet_socket_until_asked() {
    if !kernel_tests_can_run("an_agent_holds_no_packet_socket_until_asked") {
        return;
    }
    let dir = CaptureDisk::new();
    let (agent, pod, _server, _container, _process) = agent_and_pod(dir.path());
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(packet_sockets(&pod), 0, "a packet socket before any capture");
    let started = kstall(&agent, dir.path(), &["start", "--pod", POD, "--duration", "1s", "--wait"]);
    assert!(started.status.success(), "{}", text(&started.stderr));
    assert_eq!(packet_sockets(&pod), 0, "a packet socket after the capture");
}

/// A capture running when the agent is told to stop (SIGTERM, as the kubelet sends it) is ended
/// and written before the agent exits: its bundle whole, its packets so far in it, its cut saying
/// why; no packet socket left in the pod's namespace.
#[test]
fn a_capture_running_at_shutdown_is_written_before_the_agent_exits() {
    if !kernel_tests_can_run("a_capture_running_at_shutdown_is_written_before_the_agent_exits") {
        return;
    }
    let dir = CaptureDisk::new();
    let (mut agent, pod, _server, _container, _process) = agent_and_pod(dir.path());
    let started = kstall(&agent, dir.path(), &["start", "--pod", POD, "--duration", "60s"]);
    let said = text(&started.stdout);
    assert!(started.status.success(), "{said}{}", text(&started.stderr));
    let id = said
        .lines()
        .find_map(|l| l.strip_prefix("capture ")?.split_once(' ').map(|(id, _)| id.to_string()))
        .unwrap_or_else(|| panic!("no capture id in:\n{said}"));
    let up = wait_for(Duration::from_secs(10), || (packet_sockets(&pod) == 2).then_some(()));
    assert!(up.is_some(), "the capture's sockets never opened:\n{}", agent.log());
    let nfs: SocketAddr = "10.0.0.1:2049".parse().unwrap();
    pod.run_inside(move || refused_connects(nfs, CONNECTS));

    assert_eq!(agent.stop(), Some(0), "{}", agent.log());
    assert_eq!(packet_sockets(&pod), 0, "a packet socket after the agent stopped");
    let bundle = dir.path().join(format!("state/captures/{id}.tar.gz"));
    assert!(bundle.is_file(), "no {} after the agent stopped:\n{}", bundle.display(), agent.log());
    let bundle = opened(&bundle);
    let (top, manifest) = (&bundle.top, &bundle.manifest);
    let cut: Vec<&str> = manifest["cut"].as_array().unwrap().iter().filter_map(|c| c.as_str()).collect();
    assert!(cut.len() == 1 && cut[0].starts_with("packets: the agent shut down after "), "{manifest:#}");
    let (lines, _) = tcpdump(&top.join("packets.pcapng"));
    assert_eq!(
        ports(&lines, "IP 10.0.0.2.", " > 127.0.0.1.15001: Flags [S],").len(),
        CONNECTS,
        "the connects before the shutdown:\n{lines}"
    );
}

/// `--netns`: a namespace of no pod by its inode (the server's), and the node's own with a
/// filter; the manifest names the namespace and no pod. A name that is neither is a usage error.
#[test]
fn a_network_namespace_is_captured_by_its_inode_and_the_nodes_as_host() {
    if !kernel_tests_can_run("a_network_namespace_is_captured_by_its_inode_and_the_nodes_as_host") {
        return;
    }
    let dir = CaptureDisk::new();
    let (agent, _pod, server, _container, _process) = agent_and_pod(dir.path());
    // A process of the server's namespace, which the agent finds it through (no pod's).
    let _resident = Resident(
        Command::new("nsenter")
            .arg(format!("--net={}", server.path().display()))
            .args(["sleep", "600"])
            .spawn()
            .expect("nsenter sleep"),
    );
    let inode = server.inode().to_string();
    let by_inode = kstall(&agent, dir.path(), &["start", "--netns", &inode, "--duration", "1s", "--wait"]);
    let said = text(&by_inode.stdout);
    assert!(by_inode.status.success(), "{said}{}", text(&by_inode.stderr));
    assert!(said.starts_with(&format!("capturing netns {inode} (netns {inode}) for 1 s")), "{said}");
    let host = kstall(
        &agent,
        dir.path(),
        &["start", "--netns", "host", "--filter", "tcp port 9", "--duration", "1s", "--wait"],
    );
    let said = text(&host.stdout);
    assert!(host.status.success(), "{said}{}", text(&host.stderr));
    assert!(said.contains(" (the node's) "), "{said}");
    let list = kstall(&agent, dir.path(), &["list", "-o", "json"]);
    let list: serde_json::Value = serde_json::from_slice(&list.stdout).expect("capture list -o json");
    let bundles = dir.path().join("state/captures");
    let first = list[0]["id"].as_str().expect("the first capture");
    let manifest = opened(&bundles.join(format!("{first}.tar.gz"))).manifest;
    assert_eq!(manifest["pod"], serde_json::json!({"netns": server.inode(), "ips": []}), "{manifest:#}");

    let bad = kstall(&agent, dir.path(), &["start", "--netns", "web"]);
    assert_eq!(bad.status.code(), Some(64));
    assert_eq!(
        text(&bad.stderr),
        "kstall: --netns web: a network namespace's inode (kstall explain pod shows a pod's) or host\n"
    );
}

/// `--incident ID`: the incident's pod, filtered to the peers and ports of its evidence, the
/// manifest naming it, and the incident's evidence following the capture to its end.
#[test]
fn a_capture_of_an_incident_is_of_its_pod_filtered_to_its_evidence() {
    if !kernel_tests_can_run("a_capture_of_an_incident_is_of_its_pod_filtered_to_its_evidence") {
        return;
    }
    let dir = CaptureDisk::new();
    let (agent, pod, _server, _container, _process) = agent_and_pod(dir.path());
    let nfs: SocketAddr = "10.0.0.1:2049".parse().unwrap();
    let redirect = |i: &serde_json::Value| i["signature"] == "nfs-sidecar-redirect" && i["pod"] == POD;
    let incident = wait_for(Duration::from_secs(30), || {
        pod.run_inside(move || refused_connects(nfs, 1));
        agent.incidents().into_iter().find(|i| redirect(i))
    })
    .unwrap_or_else(|| panic!("no nfs-sidecar-redirect: {:#?}\n{}", agent.incidents(), agent.log()));
    let id = incident["id"].as_str().unwrap().to_string();
    let started = kstall(&agent, dir.path(), &["start", "--incident", &id, "--duration", "2s"]);
    let said = text(&started.stdout);
    assert!(started.status.success(), "{said}{}", text(&started.stderr));
    assert!(
        said.contains(&format!("{POD} (netns {}) for 2 s, headers only, filter \"tcp and (host 10.0.0.1 or port 2049 or port 15001)\"", pod.inode())),
        "{said}"
    );
    let done = wait_for(Duration::from_secs(30), || {
        pod.run_inside(move || refused_connects(nfs, 1));
        agent
            .incidents()
            .into_iter()
            .find(|i| i["id"] == id.as_str() && i["evidence"]["capture"]["state"] == "complete")
    })
    .unwrap_or_else(|| {
        panic!("the incident's capture never completed: {:#?}\n{}", agent.incidents(), agent.log())
    });
    let bundle = std::path::PathBuf::from(done["evidence"]["capture"]["path"].as_str().unwrap());
    let manifest = opened(&bundle).manifest;
    assert_eq!(manifest["trigger"]["incidents"], serde_json::json!([id]), "{manifest:#}");
    assert_eq!(manifest["trigger"]["signature"], "nfs-sidecar-redirect", "{manifest:#}");
    assert_eq!(manifest["limits"]["filter_from"], "incident", "{manifest:#}");

    let unknown = kstall(&agent, dir.path(), &["start", "--incident", "nfs-x/node-a/p"]);
    assert_eq!(unknown.status.code(), Some(1));
    assert_eq!(
        text(&unknown.stderr),
        "kstall: no incident \"nfs-x/node-a/p\" on this node (kstall incidents --all lists them)\n"
    );
}

/// A child killed and reaped when the test ends, passed or not.
struct Resident(std::process::Child);

impl Drop for Resident {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}
