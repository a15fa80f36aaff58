//! The TCP-reset probe against the real kernel: a SYN to NFS port 2049 redirected by iptables to
//! local port 15001, where nothing listens, answered with a RST — incident 1's signature.

use std::{
    io::{Read as _, Write as _},
    net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpListener, TcpStream},
    time::Duration,
};

use kstall_tests::{
    agent::{Agent, COUNTED_WITHIN},
    host::{Stopped, run, wait_for},
    kernel_tests_can_run,
    netns::{NetNs, closed_low_port, nat_rule_packets, own_netns_inode, refused_connects},
};
use serde_json::Value;

const CONNECTS: usize = 20;
const V4: IpAddr = IpAddr::V4(Ipv4Addr::LOCALHOST);
const V6: IpAddr = IpAddr::V6(Ipv6Addr::LOCALHOST);
const WAIT: Duration = Duration::from_secs(10);

fn is_sent_redirect(e: &Value, netns: u64) -> bool {
    e["kind"] == "tcp_reset"
        && e["direction"] == "sent"
        && e["netns"] == netns
        && e["local_port"] == 15001
        && e["original_dst_port"] == 2049
}

fn is_received_from_2049(e: &Value, netns: u64) -> bool {
    e["kind"] == "tcp_reset"
        && e["direction"] == "received"
        && e["netns"] == netns
        && e["remote_port"] == 2049
}

/// Runs the redirect scenario against an agent started with `agent_args` and checks every count
/// against the number of connects made and the kernel's own iptables rule counter.
fn redirect_scenario(test: &str, agent_args: &[&str], expected_hook: &str, loopback: IpAddr) {
    if !kernel_tests_can_run(test) {
        return;
    }
    let mut agent = Agent::start(agent_args);
    let events = agent.subscribe();
    let ns = NetNs::new("redirect");
    let iptables = if loopback.is_ipv4() { "iptables" } else { "ip6tables" };
    ns.redirect_tcp(iptables, 2049, 15001);
    let netns = ns.inode();

    ns.run_inside(move || refused_connects(SocketAddr::new(loopback, 2049), CONNECTS));

    let sent = events.collect(|e| is_sent_redirect(e, netns), CONNECTS, WAIT);
    let received = events.collect(|e| is_received_from_2049(e, netns), CONNECTS, WAIT);
    let log = agent.log();
    assert_eq!(sent.len(), CONNECTS, "sent resets seen for {CONNECTS} connects:\n{sent:#?}\n{log}");
    assert_eq!(received.len(), CONNECTS, "received resets:\n{received:#?}");
    for e in &sent {
        assert_eq!(e["redirect_port"], 15001, "{e}");
        assert_eq!(e["original_dst_addr"], loopback.to_string(), "{e}");
        assert_eq!(e["local_addr"], loopback.to_string(), "{e}");
        assert_eq!(e["reason"], "NO_SOCKET", "{e}");
        assert_eq!(e["hook"], expected_hook, "{e}");
        assert_eq!(e["has_socket"], false, "{e}");
    }
    // The kernel's own count of redirected connections.
    assert_eq!(nat_rule_packets(&ns, iptables, 2049), CONNECTS as u64);

    // A test namespace is no pod's: the pod labels are empty and host is false.
    let series = r#"kstall_tcp_resets_total{container="",direction="sent",host="false",namespace="",original_port="2049",pod="",port="15001",reason="NO_SOCKET",workload=""}"#;
    assert_eq!(agent.counted(series, CONNECTS as f64), Some(CONNECTS as f64), "{}", agent.metrics());
    let series = r#"kstall_tcp_resets_total{container="",direction="received",host="false",namespace="",original_port="",pod="",port="2049",reason="",workload=""}"#;
    assert_eq!(agent.counted(series, CONNECTS as f64), Some(CONNECTS as f64), "{}", agent.metrics());
    assert_eq!(agent.metric(r#"kstall_events_lost_total{probe="tcp-reset"}"#), Some(0.0));
    assert_eq!(agent.metric(r#"kstall_probe_up{probe="tcp-reset"}"#), Some(1.0));
    assert_eq!(agent.stop(), Some(0));
}

#[test]
fn redirected_syn_to_2049_is_reset_from_15001() {
    redirect_scenario("redirected_syn_to_2049_is_reset_from_15001", &[], "tcp_send_reset", V4);
}

/// Kernels before 6.10 do not fire tcp_send_reset for socket-less resets; the fallback hook
/// (kfree_skb, reason NO_SOCKET) must see the same thing. Forced here to run it on a real kernel.
#[test]
fn no_socket_fallback_hook_sees_the_same_resets() {
    redirect_scenario(
        "no_socket_fallback_hook_sees_the_same_resets",
        &["--tcp-reset-hook", "kfree-skb"],
        "kfree_skb",
        V4,
    );
}

#[test]
fn ipv6_redirect_is_seen_the_same_way() {
    redirect_scenario("ipv6_redirect_is_seen_the_same_way", &[], "tcp_send_reset", V6);
}

#[test]
fn ipv6_redirect_on_the_fallback_hook() {
    redirect_scenario(
        "ipv6_redirect_on_the_fallback_hook",
        &["--tcp-reset-hook", "kfree-skb"],
        "kfree_skb",
        V6,
    );
}

/// Incident 1's sidecar proxy listens on 15001 itself: a connection the redirect delivered to it,
/// reset by the proxy (as when it is killed with data unread), is the proxy's own reset — sent
/// with a socket, from 15001, with no original destination — not the redirect's, on either hook.
fn proxys_own_reset_scenario(test: &str, agent_args: &[&str]) {
    if !kernel_tests_can_run(test) {
        return;
    }
    let agent = Agent::start(agent_args);
    let events = agent.subscribe();
    let ns = NetNs::new("proxy");
    ns.redirect_tcp("iptables", 2049, 15001);
    let netns = ns.inode();
    let n = 3;
    ns.run_inside(move || {
        let proxy = TcpListener::bind((Ipv4Addr::LOCALHOST, 15001)).expect("the proxy listens");
        for _ in 0..n {
            let mut client =
                TcpStream::connect((Ipv4Addr::LOCALHOST, 2049)).expect("redirected to the proxy");
            let (conn, _) = proxy.accept().expect("accept");
            client.write_all(b"COMPOUND").expect("send");
            // Closed with the request unread: the kernel resets the connection.
            conn.peek(&mut [0; 8]).expect("the request arrived");
            drop(conn);
            let reset = client.read(&mut [0; 8]).map_err(|e| e.kind());
            assert_eq!(reset, Err(std::io::ErrorKind::ConnectionReset));
        }
    });
    let sent = events.collect(
        |e| {
            e["kind"] == "tcp_reset"
                && e["direction"] == "sent"
                && e["netns"] == netns
                && e["local_port"] == 15001
        },
        n,
        WAIT,
    );
    assert_eq!(
        sent.len(),
        n,
        "{sent:#?}\n{:#?}",
        events.collect(|e| e["netns"] == netns, 100, Duration::ZERO)
    );
    for e in &sent {
        assert_eq!((&e["has_socket"], &e["hook"]), (&true.into(), &"tcp_send_reset".into()), "{e}");
        assert!(e["original_dst_port"].is_null() && e["redirect_port"].is_null(), "not a redirect: {e}");
    }
    let counted = agent.counted_with(
        "kstall_tcp_resets_total",
        &[("direction", "sent"), ("port", "15001"), ("original_port", "")],
        n as f64,
    );
    assert_eq!(counted, Some(n as f64), "{}", agent.metrics());
}

#[test]
fn a_proxys_own_reset_is_a_plain_reset() {
    proxys_own_reset_scenario("a_proxys_own_reset_is_a_plain_reset", &[]);
}

/// As on 6.1, where the redirect's resets come from the fallback hook and the proxy's from
/// tcp_send_reset.
#[test]
fn a_proxys_own_reset_is_a_plain_reset_on_the_fallback_hook() {
    proxys_own_reset_scenario(
        "a_proxys_own_reset_is_a_plain_reset_on_the_fallback_hook",
        &["--tcp-reset-hook", "kfree-skb"],
    );
}

#[test]
fn plain_reset_in_root_netns_has_no_original_port() {
    if !kernel_tests_can_run("plain_reset_in_root_netns_has_no_original_port") {
        return;
    }
    // A port that is not well known, kept by number as configured (else it would be `other`).
    let port = closed_low_port();
    let agent = Agent::start(&["--metric-ports", &port.to_string()]);
    let events = agent.subscribe();
    let n = 7;
    refused_connects(SocketAddr::from(([127, 0, 0, 1], port)), n);

    let root = own_netns_inode();
    let sent = events.collect(
        |e| e["direction"] == "sent" && e["local_port"] == port && e["netns"] == root,
        n,
        WAIT,
    );
    assert_eq!(sent.len(), n, "{sent:#?}\n{}", agent.log());
    for e in &sent {
        assert!(e["original_dst_port"].is_null(), "not redirected: {e}");
    }
    // The host's namespace: "host network".
    let series = format!(
        r#"kstall_tcp_resets_total{{container="",direction="sent",host="true",namespace="",original_port="",pod="",port="{port}",reason="NO_SOCKET",workload=""}}"#
    );
    assert_eq!(agent.counted(&series, n as f64), Some(n as f64), "{}", agent.metrics());
}

#[test]
fn status_lists_the_probe_and_its_hook() {
    if !kernel_tests_can_run("status_lists_the_probe_and_its_hook") {
        return;
    }
    let agent = Agent::start(&[]);
    let out = run(
        kstall_tests::agent::agent_binary().to_str().unwrap(),
        &["status", "--api-socket", agent.socket.to_str().unwrap()],
    );
    let line = out.lines().find(|l| l.starts_with("tcp-reset")).unwrap_or_else(|| panic!("{out}"));
    assert!(line.contains(" up "), "{out}");
    assert!(line.contains("tp_btf/tcp_send_reset"), "{out}");
    assert!(out.contains("original destination: conntrack"), "{out}");
    assert_eq!(agent.get("/healthz"), "ok\n");
}

/// The issue-18 storm: the agent stopped (SIGSTOP) while a storm of redirected connects runs,
/// far more resets than the ring buffer holds. The resets are counted in the kernel, so the
/// metric is exact once the agent runs again; the events are the sampled detail, and every
/// reset is an event received, lost or suppressed.
#[test]
fn counters_are_exact_while_the_agent_is_stopped() {
    if !kernel_tests_can_run("counters_are_exact_while_the_agent_is_stopped") {
        return;
    }
    const STORM: usize = 75_000;
    let mut agent = Agent::start(&[]);
    let ns = NetNs::new("stopped");
    ns.redirect_tcp("iptables", 2049, 15001);
    let tcp = |name: &str| agent.metric(&format!(r#"{name}{{probe="tcp-reset"}}"#)).unwrap_or(0.0);
    let events_before =
        tcp("kstall_events_total") + tcp("kstall_events_lost_total") + tcp("kstall_events_suppressed_total");

    let stopped = Stopped::new(agent.pid());
    ns.run_inside(|| refused_connects(SocketAddr::from((Ipv4Addr::LOCALHOST, 2049)), STORM));
    drop(stopped);

    let sent = r#"kstall_tcp_resets_total{container="",direction="sent",host="false",namespace="",original_port="2049",pod="",port="15001",reason="NO_SOCKET",workload=""}"#;
    let received = r#"kstall_tcp_resets_total{container="",direction="received",host="false",namespace="",original_port="",pod="",port="2049",reason="",workload=""}"#;
    assert_eq!(agent.counted(sent, STORM as f64), Some(STORM as f64), "{}", agent.metrics());
    assert_eq!(agent.counted(received, STORM as f64), Some(STORM as f64), "{}", agent.metrics());
    assert_eq!(nat_rule_packets(&ns, "iptables", 2049), STORM as u64);
    let accounted = || {
        tcp("kstall_events_total") + tcp("kstall_events_lost_total") + tcp("kstall_events_suppressed_total")
            - events_before
    };
    let all = wait_for(COUNTED_WITHIN, || (accounted() == 2.0 * STORM as f64).then_some(()));
    assert!(
        all.is_some(),
        "received + lost + suppressed = {} of {}:\n{}",
        accounted(),
        2 * STORM,
        agent.metrics()
    );
    assert!(tcp("kstall_events_suppressed_total") > 0.0, "a storm is sampled: {}", agent.metrics());
    assert_eq!(agent.stop(), Some(0));
}
