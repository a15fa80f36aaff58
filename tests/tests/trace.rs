//! `kstall trace` against a running agent while incident 1's redirect runs in a pod's network
//! namespace: the capture holds exactly the pod's redirected NFS resets, filtered in the agent;
//! concurrent captures get everything while a client that never reads is cut off.

use std::{
    collections::BTreeSet,
    io::{BufRead as _, BufReader, Write as _},
    net::{Ipv4Addr, SocketAddr},
    os::unix::net::UnixStream,
    path::Path,
    process::Command,
    time::Duration,
};

use kstall_tests::{
    agent::{Agent, COUNTED_WITHIN, TraceCapture, agent_binary, pod_json, write_pods_file},
    bpf::{loaded_program_ids, program_ids_of, still_loaded_after_grace},
    cgroup::{Cgroup, PodProcess},
    host::{child_pids, wait_for},
    kernel_tests_can_run,
    netns::{NetNs, NfsReconnects, refused_connects},
};
use serde_json::Value;

const UID: &str = "7c2d3e4f-5a6b-4c7d-8e9f-0a1b2c3d4e5f";
const CONTAINER: &str = "1f2e3d4c5b6a79880f1e2d3c4b5a69788f9e0d1c2b3a49586f7e8d9c0b1a2f3e";
const POD: &str = "tenant-api-5d8c7b9f4-t9r2p";

#[test]
fn trace_captures_the_pods_redirected_nfs_resets_only() {
    if !kernel_tests_can_run("trace_captures_the_pods_redirected_nfs_resets_only") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let pods_file = dir.path().join("pods.json");
    write_pods_file(&pods_file, &[pod_json(UID, POD, CONTAINER)]);
    let mut agent = Agent::start(&["--pods-file", pods_file.to_str().unwrap()]);
    let container = Cgroup::at(&format!("kubepods/besteffort/pod{UID}/{CONTAINER}"));
    let netns = NetNs::new("trace");
    let _sandbox = PodProcess::start(&netns, &container.procs());
    netns.redirect_tcp("iptables", 2049, 15001);

    // Both end by their count; any event of another port would come first and be among them.
    let json = TraceCapture::of(
        &agent,
        &["--probe", "tcp-reset", "--port", "2049", "--count", "6", "--duration", "60s", "--output", "json"],
    );
    let text =
        TraceCapture::of(&agent, &["--pod", POD, "--port", "2049", "--count", "3", "--duration", "60s"]);
    // Connects to another closed port in the pod's namespace, then redirected NFS connects.
    netns.run_inside(|| {
        refused_connects(SocketAddr::from((Ipv4Addr::LOCALHOST, 2050)), 3);
        refused_connects(SocketAddr::from((Ipv4Addr::LOCALHOST, 2049)), 3);
    });

    let (code, events, stderr) = json.lines();
    assert_eq!(code, Some(0), "{stderr}");
    // Each redirected connect: one sent reset (15001, original 2049) and one received (remote 2049).
    assert_eq!(events.len(), 6, "{events:#?}");
    for line in &events {
        let e: Value = serde_json::from_str(line).expect("one JSON object per line");
        assert_eq!(
            (&e["probe"], &e["pod"], &e["namespace"]),
            (&"tcp-reset".into(), &POD.into(), &"shop".into()),
            "{e}"
        );
        assert_eq!(e["netns"], netns.inode(), "{e}");
        match e["direction"].as_str() {
            Some("sent") => {
                assert_eq!((&e["local_port"], &e["original_dst_port"]), (&15001.into(), &2049.into()), "{e}")
            }
            _ => assert_eq!(e["remote_port"], 2049, "{e}"),
        }
    }
    let (code, text, stderr) = text.lines();
    assert_eq!(code, Some(0), "--count ends the capture: {stderr}");
    assert_eq!(text.len(), 3, "{text:#?}");
    assert!(text[0].contains(&format!("shop/{POD}")) && text[0].contains("tcp-reset"), "{text:#?}");
    assert!(text.iter().any(|l| l.contains("(dialled 127.0.0.1:2049, redirected)")), "{text:#?}");

    // `kstall explain pod` puts it together: cgroups, namespace, the resets, the incident.
    // The pod's client goes on retrying: the redirect persists, and fires.
    let mut client = NfsReconnects::start(&netns);
    let fired = |i: &Value| i["signature"] == "nfs-sidecar-redirect" && i["state"] == "firing";
    assert!(agent.wait_incident(fired, Duration::from_secs(30)).is_some(), "{:#?}", agent.incidents());
    client.stop();
    let explain = |args: &[&str]| {
        let out = Command::new(agent_binary())
            .args(["explain", "pod", "--api-socket", agent.socket.to_str().unwrap()])
            .args(args)
            .output()
            .expect("kstall explain");
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    // The resets' series come from the kernel's counters: within two counter intervals.
    let counted = |json: &String| json.contains("kstall_tcp_resets_total");
    let explained = wait_for(COUNTED_WITHIN, || {
        Some(explain(&[POD, "-n", "shop", "--output", "json"])).filter(|r| counted(&r.1))
    });
    let (code, json, stderr) = explained.unwrap_or_else(|| explain(&[POD, "-n", "shop", "--output", "json"]));
    assert_eq!(code, Some(0), "{stderr}");
    let x: Value = serde_json::from_str(&json).expect("JSON");
    assert_eq!((&x["pod_uid"], &x["workload"]), (&UID.into(), &"Deployment/web".into()), "{x:#}");
    assert_eq!(x["containers"], serde_json::json!([["app", CONTAINER]]), "{x:#}");
    // The container's cgroup and the pod's own.
    let cgroups = x["cgroup_ids"].as_array().unwrap();
    assert!(cgroups.len() == 2 && cgroups.contains(&container.id().into()), "{x:#}");
    assert_eq!(x["netns"], serde_json::json!([netns.inode()]), "{x:#}");
    let activity = x["activity"].to_string();
    assert!(
        activity.contains(r#"original_port=\"2049\""#) && activity.contains("kstall_tcp_resets_total"),
        "{x:#}"
    );
    assert_eq!(x["incidents"][0]["signature"], "nfs-sidecar-redirect", "{x:#}");
    assert!(x["next_step"].as_str().unwrap().contains("excludeOutboundPorts"), "{x:#}");
    let (code, text, _) = explain(&[UID]);
    assert_eq!(code, Some(0));
    assert!(text.starts_with(&format!("POD shop/{POD}  uid {UID}  Deployment/web  best_effort")), "{text}");
    let (code, _, stderr) = explain(&["tenant-api-5d8c7b9f4-nosuch"]);
    assert_eq!(code, Some(1), "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(
        stderr.contains("kstall knows no pod") && stderr.contains(&format!("close: shop/{POD}")),
        "{stderr}"
    );
    assert_eq!(agent.stop(), Some(0));
}

#[test]
fn concurrent_captures_get_everything_while_a_stalled_client_is_cut_off() {
    if !kernel_tests_can_run("concurrent_captures_get_everything_while_a_stalled_client_is_cut_off") {
        return;
    }
    // Every reset sent in full: the point is the API's backpressure, not the kernel's sampling.
    let mut agent = Agent::start(&["--sample-events", "all"]);
    let netns = NetNs::new("trace-many");
    let ino = netns.inode().to_string();
    // A client that asks for everything and, once subscribed, never reads.
    let stalled = UnixStream::connect(&agent.socket).unwrap();
    (&stalled).write_all(b"{\"request\":\"trace\"}\n").unwrap();
    let mut stalled = BufReader::new(stalled);
    let mut started = String::new();
    stalled.read_line(&mut started).unwrap();
    assert_eq!(started.trim(), r#"{"subscribed":true}"#);
    // Each ends at its count: 2052's resets come first and would be counted if they got through.
    let captures: Vec<_> = (0..2)
        .map(|_| {
            TraceCapture::of(
                &agent,
                &[
                    "--probe",
                    "tcp-reset",
                    "--port",
                    "2051",
                    "--count",
                    "40",
                    "--duration",
                    "120s",
                    "--output",
                    "json",
                ],
            )
        })
        .collect();
    let events_total = || agent.metric(r#"kstall_events_total{probe="tcp-reset"}"#).unwrap_or(0.0);
    let before = events_total();
    // Enough resets (with their JSON) to fill the stalled client's socket many times over.
    netns.run_inside(|| {
        for _ in 0..8 {
            refused_connects(SocketAddr::from((Ipv4Addr::LOCALHOST, 2052)), 250);
        }
        refused_connects(SocketAddr::from((Ipv4Addr::LOCALHOST, 2051)), 20);
    });
    let current = wait_for(Duration::from_secs(30), || (events_total() - before >= 4040.0).then_some(()));
    assert!(current.is_some(), "metrics stay current: {before} -> {}", events_total());
    for capture in captures {
        let (code, events, stderr) = capture.lines();
        assert_eq!(code, Some(0), "{stderr}");
        let ours = events.iter().filter(|l| l.contains(&format!("\"netns\":{ino}"))).count();
        assert_eq!(ours, 40, "every 2051 reset (sent and received), none of 2052's: {}", events.len());
    }
    // The stalled client is cut off once the agent could not write to it for 5 s (reading
    // before that would unblock it); its connection then ends after what is buffered.
    let cut_off = wait_for(Duration::from_secs(30), || {
        agent.log().contains("API client stopped reading its event stream; cut off").then_some(())
    });
    assert!(cut_off.is_some(), "the stalled client was not cut off:\n{}", agent.log());
    stalled.get_ref().set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut line = String::new();
    let mut read = 0;
    while stalled.read_line(&mut line).map(|n| n > 0).unwrap_or(false) {
        read += 1;
        line.clear();
    }
    assert!(read < 4040, "the stalled client did not get everything ({read})");
    assert!(
        agent.metric(r#"kstall_api_events_dropped_total{stream="events"}"#).unwrap_or(0.0) >= 1.0,
        "its losses are counted: {}",
        agent.metrics()
    );
    assert_eq!(agent.stop(), Some(0));
}

/// No agent running: `kstall trace` loads the probes itself for the capture and unloads them
/// after — no program of kstall's is left in the kernel.
#[test]
fn a_standalone_capture_leaves_nothing_attached() {
    if !kernel_tests_can_run("a_standalone_capture_leaves_nothing_attached") {
        return;
    }
    let netns = NetNs::new("trace-alone");
    netns.redirect_tcp("iptables", 2049, 15001);
    // It ends at its count: 16 redirected NFS connects, a sent and a received reset each.
    let capture = TraceCapture::start(
        Path::new("/nonexistent/kstall.sock"),
        &[
            "--probe",
            "tcp-reset",
            "--port",
            "2049",
            "--count",
            "32",
            "--duration",
            "120s",
            "--output",
            "json",
        ],
    );
    // The capture's own agent loaded only the probe asked for, and drops other ports in the
    // kernel: of the resets below only 2049's reach it, 30 before the last connect.
    netns.run_inside(|| {
        for _ in 0..15 {
            refused_connects(SocketAddr::from((Ipv4Addr::LOCALHOST, 2050)), 1);
            refused_connects(SocketAddr::from((Ipv4Addr::LOCALHOST, 2049)), 1);
        }
        refused_connects(SocketAddr::from((Ipv4Addr::LOCALHOST, 2050)), 1);
    });
    let socket = std::env::temp_dir().join(format!("kstall-trace-{}/kstall.sock", capture.pid()));
    let ask_status = || {
        let mut status = UnixStream::connect(&socket).expect("the capture's agent");
        status.write_all(b"{\"request\":\"status\"}\n").unwrap();
        let mut answer = String::new();
        BufReader::new(status).read_line(&mut answer).unwrap();
        serde_json::from_str::<Value>(&answer).unwrap()
    };
    let received = |status: &Value| {
        let probes = status["probes"].as_array().unwrap();
        probes.iter().find(|p| p["name"] == "tcp-reset").unwrap()["events"].as_u64().unwrap()
    };
    let status = wait_for(Duration::from_secs(30), || {
        let status = ask_status();
        (received(&status) >= 30).then_some(status)
    })
    .unwrap_or_else(|| panic!("the capture's agent did not receive the 30 resets: {:#}", ask_status()));
    let up: Vec<&str> = status["probes"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["up"] == true)
        .filter_map(|p| p["name"].as_str())
        .collect();
    assert_eq!(up, ["tcp-reset"], "{status:#}");
    assert_eq!(received(&status), 30, "kernel-filtered: only 2049's of 62 resets reached the agent");
    // The capture's programs, taken while it runs: `kstall trace` holds them in the standalone
    // agent it started, its child.
    let trace = capture.pid();
    let held: BTreeSet<u64> =
        std::iter::once(trace).chain(child_pids(trace)).flat_map(program_ids_of).collect();
    assert!(held.len() >= up.len(), "the capture holds programs {held:?} for probes {up:?}");
    let unlisted: Vec<u64> = held.difference(&loaded_program_ids()).copied().collect();
    assert!(unlisted.is_empty(), "programs the capture holds that bpftool does not list: {unlisted:?}");
    netns.run_inside(|| refused_connects(SocketAddr::from((Ipv4Addr::LOCALHOST, 2049)), 1));
    let (code, events, stderr) = capture.lines();
    assert_eq!(code, Some(0), "{stderr}");
    assert_eq!(events.len(), 32, "{events:#?}");
    let sent: Vec<Value> = events
        .iter()
        .map(|l| serde_json::from_str::<Value>(l).expect("JSON"))
        .filter(|e| e["direction"] == "sent")
        .collect();
    assert_eq!(sent.len(), 16, "the standalone capture saw the redirected resets: {events:#?}\n{stderr}");
    for e in &sent {
        assert_eq!(
            (&e["local_port"], &e["original_dst_port"], &e["netns"]),
            (&15001.into(), &2049.into(), &netns.inode().into()),
            "{e}"
        );
    }
    let left = still_loaded_after_grace(&held);
    assert!(left.is_empty(), "programs left attached after the capture: {left:?}");
}
