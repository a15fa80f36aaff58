//! The packet-drop probe against the real kernel: a pod's NetworkPolicy as a CNI writes it, two
//! iptables DROP rules in the pod's network namespace — OUTPUT for its own connects to a
//! database, INPUT for connects to its web port. The apps see timeouts, never a reset; kstall
//! must count every packet the rules dropped, no more (the rules' own counters say how many),
//! with the kernel's reason, the direction and the port, attributed to the pod.

use std::{
    net::{Ipv4Addr, SocketAddr},
    time::Duration,
};

use kstall_tests::{
    agent::{Agent, COUNTED_WITHIN, pod_json, write_pods_file},
    cgroup::{Cgroup, PodProcess},
    kernel_tests_can_run,
    netns::{NetNs, timed_out_connects},
};
use serde_json::Value;

const DATABASE: u16 = 5432;
const WEB: u16 = 8080;
const CONNECTS: usize = 3;

/// Packets the filter table's DROP rule for `--dport port` in `chain` dropped: the kernel's own
/// count.
fn dropped_by_rule(ns: &NetNs, chain: &str, port: u16) -> u64 {
    let listing = ns.exec("iptables", &["-L", chain, "-v", "-x", "-n"]);
    listing
        .lines()
        .find(|l| l.contains("DROP") && l.contains(&format!("dpt:{port}")))
        .and_then(|l| l.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no DROP rule for port {port} in {chain}:\n{listing}"))
}

#[test]
fn drops_by_a_pods_network_policy_are_counted_with_their_reason_direction_and_pod() {
    if !kernel_tests_can_run("drops_by_a_pods_network_policy_are_counted_with_their_reason_direction_and_pod")
    {
        return;
    }
    let (uid, container_id) = (
        format!("0000d120-7f3d-4c1a-9e8b-{:012x}", std::process::id()),
        format!("{:064x}", 0xd120_u64 << 32 | u64::from(std::process::id())),
    );
    let name = "web-5d8c7b9f4-drops";
    let dir = tempfile::tempdir().unwrap();
    let pods_file = dir.path().join("pods.json");
    write_pods_file(&pods_file, &[pod_json(&uid, name, &container_id)]);
    // Resolved 5 s after the last drop, not 60.
    let mut agent = Agent::start(&["--pods-file", pods_file.to_str().unwrap(), "--quiet-window", "5s"]);
    let events = agent.subscribe();
    let container = Cgroup::kubepods_container("burstable", &uid, &container_id);
    let netns = NetNs::new("drop");
    let _sandbox = PodProcess::start(&netns, &container.procs());
    let database = DATABASE.to_string();
    let web = WEB.to_string();
    netns.exec("iptables", &["-A", "OUTPUT", "-o", "lo", "-p", "tcp", "--dport", &database, "-j", "DROP"]);
    netns.exec("iptables", &["-A", "INPUT", "-i", "lo", "-p", "tcp", "--dport", &web, "-j", "DROP"]);

    netns.run_inside(|| {
        for port in [DATABASE, WEB] {
            timed_out_connects(
                SocketAddr::from((Ipv4Addr::LOCALHOST, port)),
                CONNECTS,
                Duration::from_millis(1500),
            );
        }
    });
    // Each connect's SYN and its retransmissions until the timeout: the kernel's count.
    let (egress, ingress) =
        (dropped_by_rule(&netns, "OUTPUT", DATABASE), dropped_by_rule(&netns, "INPUT", WEB));
    assert!(
        egress >= CONNECTS as u64 && ingress >= CONNECTS as u64,
        "the rules dropped {egress} and {ingress}"
    );

    let ino = netns.inode();
    let dropped = |port: u16, direction: &'static str| {
        move |e: &Value| {
            e["kind"] == "packet_drop"
                && e["netns"] == ino
                && e["dst_port"] == port
                && e["direction"] == direction
        }
    };
    for (port, direction) in [(DATABASE, "egress"), (WEB, "ingress")] {
        let seen = events.collect(dropped(port, direction), 1, Duration::from_secs(10));
        let e =
            seen.first().unwrap_or_else(|| panic!("no {direction} drop to port {port}:\n{}", agent.log()));
        assert_eq!(e["reason"], "NETFILTER_DROP", "{e}");
        assert_eq!((e["protocol"].as_str(), e["src_addr"].as_str()), (Some("tcp"), Some("127.0.0.1")), "{e}");
        assert_eq!((e["pod"].as_str(), e["namespace"].as_str()), (Some(name), Some("shop")), "{e}");
        // iptables on nf_tables drops in the rule's chain; the legacy one in the hook.
        let location = e["location"].as_str().unwrap_or_default();
        assert!(location.starts_with("nft_do_chain") || location.starts_with("nf_hook_slow"), "{e}");
    }
    for (port, direction, expected) in [(DATABASE, "egress", egress), (WEB, "ingress", ingress)] {
        let series = format!(
            r#"kstall_packet_drops_total{{container="",direction="{direction}",host="false",namespace="shop",pod="{name}",port="{port}",protocol="tcp",reason="NETFILTER_DROP",workload="Deployment/web"}}"#
        );
        assert_eq!(agent.counted(&series, expected as f64), Some(expected as f64), "{}", agent.metrics());
    }
    // The incident: the pod, what it lost and from whom, every drop counted.
    let all_counted = |i: &Value| {
        i["signature"] == "network-policy-drops"
            && i["pod"] == name
            && i["evidence"]["drops_total"] == egress + ingress
    };
    let incident = agent
        .wait_incident(all_counted, COUNTED_WITHIN)
        .unwrap_or_else(|| panic!("no network-policy-drops with every drop: {:#?}", agent.incidents()));
    let summary = incident["summary"].as_str().unwrap_or_default().to_string();
    for lost in [
        format!("egress tcp port {DATABASE} (to 127.0.0.1): {egress}"),
        format!("ingress tcp port {WEB} (from 127.0.0.1): {ingress}"),
    ] {
        assert!(summary.contains(&lost), "{lost} in {summary}");
    }
    assert_eq!(
        (incident["severity"].as_str(), incident["namespace"].as_str()),
        (Some("warning"), Some("shop"))
    );
    let resolved = agent.wait_incident(
        |i| i["signature"] == "network-policy-drops" && i["state"] == "resolved",
        Duration::from_secs(30),
    );
    assert!(resolved.is_some(), "not resolved after the quiet window: {:#?}", agent.incidents());
    println!(
        "packet-drop: the pod's rules dropped {egress} egress and {ingress} ingress packets; kstall counted as many \
         and network-policy-drops said: {summary}"
    );
    assert_eq!(agent.metric(r#"kstall_events_lost_total{probe="packet-drop"}"#), Some(0.0));
    assert_eq!(agent.metric(r#"kstall_probe_up{probe="packet-drop"}"#), Some(1.0));
    assert_eq!(agent.stop(), Some(0));
}
