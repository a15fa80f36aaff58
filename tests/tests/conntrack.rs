//! `conntrack-table-full` against the real kernel: a pod whose namespace tracks connections (a
//! stateful rule, as a mesh's or a policy's) holds open connections; `nf_conntrack_max` is then
//! lowered to what it holds (restored when the test ends, also on failure), so the kernel drops
//! every new connection's SYN — the app times out. kstall must name the pod, count every packet
//! the kernel's own counter says it refused, not call it a NetworkPolicy, and resolve once the
//! limit is back and connections get through.

use std::{
    net::{Ipv4Addr, SocketAddr, TcpStream},
    time::Duration,
};

use kstall_tests::{
    agent::{Agent, COUNTED_WITHIN, pod_json, write_pods_file},
    cgroup::{Cgroup, PodProcess},
    host::Sysctl,
    kernel_tests_can_run,
    netns::{NetNs, conntrack_counts, held_connections, timed_out_connects},
};

const PORT: u16 = 9100;
/// Connections the pod holds: the table's size, and the limit it is given.
const HELD: usize = 4;
const REFUSED_CONNECTS: usize = 2;
const MAX: &str = "net.netfilter.nf_conntrack_max";

/// The namespace's conntrack counters as the kernel keeps them: (entries, drops less clashes).
fn kernels_counts(ns: &NetNs) -> (u64, u64) {
    conntrack_counts(&ns.exec("cat", &["/proc/net/stat/nf_conntrack"]))
}

#[test]
fn a_full_conntrack_table_names_the_pod_refused_and_resolves_when_raised() {
    if !kernel_tests_can_run("a_full_conntrack_table_names_the_pod_refused_and_resolves_when_raised") {
        return;
    }
    let (uid, container_id) = (
        format!("0000c7ac-7f3d-4c1a-9e8b-{:012x}", std::process::id()),
        format!("{:064x}", 0xc7ac_u64 << 32 | u64::from(std::process::id())),
    );
    let name = "api-6f9d8c7b5-ctfull";
    let dir = tempfile::tempdir().unwrap();
    let pods_file = dir.path().join("pods.json");
    write_pods_file(&pods_file, &[pod_json(&uid, name, &container_id)]);
    // Resolved 5 s after the last refused packet, not 60.
    let mut agent = Agent::start(&["--pods-file", pods_file.to_str().unwrap(), "--quiet-window", "5s"]);
    let container = Cgroup::kubepods_container("burstable", &uid, &container_id);
    let netns = NetNs::new("ctfull");
    let _sandbox = PodProcess::start(&netns, &container.procs());
    // A stateful rule: conntrack now tracks the namespace's connections.
    netns.exec(
        "iptables",
        &["-A", "INPUT", "-m", "conntrack", "--ctstate", "ESTABLISHED,RELATED", "-j", "ACCEPT"],
    );
    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, PORT));
    let held = held_connections(&netns, PORT, HELD);
    assert_eq!(kernels_counts(&netns).0, HELD as u64, "one entry per held connection");
    let pod = [("namespace", "shop"), ("pod", name)];
    // kstall has read the table before it fills: what it counts from here is all the kernel's.
    assert_eq!(
        agent.counted_with("kstall_conntrack_entries", &pod, HELD as f64),
        Some(HELD as f64),
        "{}",
        agent.metrics()
    );

    let limit = Sysctl::set(MAX, &HELD.to_string());
    netns.run_inside(move || timed_out_connects(addr, REFUSED_CONNECTS, Duration::from_millis(1500)));
    let (entries, refused) = kernels_counts(&netns);
    assert!(refused >= REFUSED_CONNECTS as u64, "the kernel refused {refused} packets");
    assert_eq!(entries, HELD as u64);

    let every_packet = |i: &serde_json::Value| {
        i["signature"] == "conntrack-table-full"
            && i["pod"] == name
            && i["evidence"]["refused_packets"] == refused
    };
    let incident = agent.wait_incident(every_packet, COUNTED_WITHIN).unwrap_or_else(|| {
        panic!("no conntrack-table-full with {refused} packets: {:#?}", agent.incidents())
    });
    let summary = incident["summary"].as_str().unwrap_or_default().to_string();
    let table = format!("shop/{name}'s network namespace is full ({HELD} entries, nf_conntrack_max {HELD})");
    assert!(summary.contains(&table), "{table} in {summary}");
    assert!(summary.contains(&format!("tcp 127.0.0.1 → 127.0.0.1:{PORT}")), "{summary}");
    assert_eq!(incident["evidence"]["refused_pods"], serde_json::json!([format!("shop/{name}")]));
    assert_eq!(incident["severity"], "warning");
    assert_eq!(
        agent.counted_with("kstall_conntrack_drops_total", &pod, refused as f64),
        Some(refused as f64)
    );
    assert_eq!(agent.metric("kstall_conntrack_max"), Some(HELD as f64));

    // The limit back: new connections get through, and the incident resolves.
    drop(limit);
    netns.run_inside(move || {
        TcpStream::connect_timeout(&addr, Duration::from_secs(2)).expect("connect after")
    });
    let resolved = agent.wait_incident(
        |i| i["signature"] == "conntrack-table-full" && i["state"] == "resolved",
        Duration::from_secs(30),
    );
    assert!(resolved.is_some(), "not resolved after the limit was raised: {:#?}", agent.incidents());
    // The packet-drop probe saw the same drops (NETFILTER_DROP): not a NetworkPolicy's.
    let policy: Vec<_> =
        agent.incidents().into_iter().filter(|i| i["signature"] == "network-policy-drops").collect();
    assert!(policy.is_empty(), "conntrack's drops called a policy's: {policy:#?}");
    println!("conntrack-table-full: the kernel refused {refused} packets; kstall said: {summary}");
    drop(held);
    assert_eq!(agent.stop(), Some(0));
}
