//! `--capture-on` on the real kernel: the pod of tests/tests/incidents.rs (a real iptables
//! REDIRECT of 2049 to 15001 where nothing listens, a hard mount's reconnects, a writer of the pod
//! stuck in D state). Its `nfs-sidecar-redirect` starts a capture at once, filtered to the
//! incident's peer and ports; its `pod-termination-blocked` joins that capture — two incidents,
//! one capture. Both incidents' evidence, the JSON stream and `kstall incidents` name the bundle;
//! once `kstall capture stop` ends it their evidence says complete, and the bundle holds the
//! redirected SYNs and their resets, names both incidents and has the stuck writer's stack.

use std::{collections::BTreeSet, process::Command, time::Duration};

use kstall_tests::{
    agent::{Agent, agent_binary, pod_json, write_pods_file},
    capture::{CaptureDisk, opened, ports, tcpdump},
    host::{Sysctl, wait_for},
    kernel_tests_can_run,
    stuck_pod::RedirectedStuckPod,
    writeback::FreezableDisk,
};
use serde_json::Value;

const UID: &str = "7b1d2c3e-4f5a-4b6c-9d7e-8f9a0b1c2d3e";
const CONTAINER: &str = "3c4d5e6f7a8b9c0d1e2f3a4b5c6d7e8f9a0b1c2d3e4f5a6b7c8d9e0f1a2b3c4d";
const POD: &str = "ledger-7f9c8d6b5-x2k4p";

fn firing(signature: &'static str) -> impl Fn(&Value) -> bool {
    move |i: &Value| i["signature"] == signature && i["state"] == "firing" && i["pod"] == POD
}

#[test]
fn two_incidents_of_one_pod_make_one_capture_that_their_evidence_names() {
    if !kernel_tests_can_run("two_incidents_of_one_pod_make_one_capture_that_their_evidence_names") {
        return;
    }
    let original = std::fs::read_to_string("/proc/sys/kernel/hung_task_timeout_secs").unwrap();
    let _restore = Sysctl::set("kernel.hung_task_timeout_secs", original.trim());
    let _warnings = Sysctl::keep("kernel.hung_task_warnings");
    // The state, and with it the bundles, on the test's own disk (see CaptureDisk).
    let disk_of_state = CaptureDisk::new();
    let dir = disk_of_state.path();
    let pods_file = dir.join("pods.json");
    write_pods_file(&pods_file, &[pod_json(UID, POD, CONTAINER)]);
    let events = dir.join("events.jsonl");
    let mut disk = FreezableDisk::new("capon");
    let mut agent = Agent::start_with_state(
        Some(&dir.join("state")),
        &[
            "--pods-file",
            pods_file.to_str().unwrap(),
            "--hung-task-timeout-secs",
            "3",
            "--termination-blocked-after",
            "3s",
            "--capture-on",
            "nfs-sidecar-redirect,pod-termination-blocked",
            "--capture-duration",
            "60s",
            "--export-events",
            &format!("file:{}", events.display()),
        ],
    );

    let mut pod = RedirectedStuckPod::start("capon", UID, CONTAINER, &mut disk);
    let writer = pod.writer;

    let redirect = agent
        .wait_incident(firing("nfs-sidecar-redirect"), Duration::from_secs(15))
        .unwrap_or_else(|| panic!("no nfs-sidecar-redirect: {:#?}\n{}", agent.incidents(), agent.log()));
    let capture = redirect["evidence"]["capture"].clone();
    let id = capture["id"].as_str().unwrap_or_else(|| panic!("no capture started: {redirect:#}")).to_string();
    assert_eq!(capture["state"], "capturing", "{redirect:#}");
    assert_eq!(
        capture["filter"], "tcp and (host 127.0.0.1 or port 2049 or port 15001)",
        "the incident's peer and ports: {redirect:#}"
    );
    let path = dir.join("state/captures").join(format!("{id}.tar.gz"));
    assert_eq!(capture["path"], path.to_str().unwrap(), "{redirect:#}");

    let blocked = agent
        .wait_incident(firing("pod-termination-blocked"), Duration::from_secs(30))
        .unwrap_or_else(|| panic!("no pod-termination-blocked: {:#?}\n{}", agent.incidents(), agent.log()));
    let joined = &blocked["evidence"]["capture"];
    assert_eq!(
        (&joined["id"], &joined["joined"]),
        (&Value::from(id.as_str()), &Value::from(true)),
        "the pod's capture, joined: {blocked:#}"
    );

    // The JSON stream's fired record carries it; `kstall incidents` says where and how to get it.
    let streamed = std::fs::read_to_string(&events).unwrap_or_default();
    let fired = streamed
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .find(|r| r["transition"] == "fired" && r["incident"]["id"] == redirect["id"])
        .unwrap_or_else(|| panic!("no fired record in the stream:\n{streamed}"));
    assert_eq!(fired["incident"]["evidence"]["capture"]["path"], path.to_str().unwrap());
    let shown = Command::new(agent_binary())
        .args(["incidents", "--api-socket"])
        .arg(&agent.socket)
        .output()
        .expect("kstall incidents");
    let shown = String::from_utf8_lossy(&shown.stdout);
    assert!(shown.contains(&format!("$ kubectl kstall capture get {id} --node ")), "{shown}");

    // Ended by hand (the packets so far are the case): both incidents say complete, with the
    // bundle's size.
    let stop = Command::new(agent_binary())
        .args(["capture", "stop", &id, "--api-socket"])
        .arg(&agent.socket)
        .output()
        .expect("kstall capture stop");
    assert!(stop.status.success(), "{}", String::from_utf8_lossy(&stop.stderr));
    let complete = wait_for(Duration::from_secs(30), || {
        let all = agent.incidents();
        let done: Vec<&Value> = all
            .iter()
            .filter(|i| i["pod"] == POD && i["evidence"]["capture"]["state"] == "complete")
            .collect();
        (done.len() == 2).then(|| done[0]["evidence"]["capture"].clone())
    })
    .unwrap_or_else(|| panic!("the capture never completed: {:#?}\n{}", agent.incidents(), agent.log()));
    assert_eq!(complete["bytes"], std::fs::metadata(&path).expect("the bundle").len(), "{complete:#}");
    let list = Command::new(agent_binary())
        .args(["capture", "list", "-o", "json", "--api-socket"])
        .arg(&agent.socket)
        .output()
        .expect("kstall capture list");
    let list: Value = serde_json::from_slice(&list.stdout).expect("capture list -o json");
    assert_eq!(list.as_array().map(Vec::len), Some(1), "one capture: {list:#}");
    assert!(pod.client.stop() >= 3, "the client's connects were refused");

    // The bundle: both incidents, the incident's filter, the redirect on the wire, the writer.
    let bundle = opened(&path);
    let (top, manifest) = (&bundle.top, &bundle.manifest);
    assert_eq!(manifest["trigger"]["kind"], "incident", "{manifest:#}");
    assert_eq!(manifest["trigger"]["signature"], "nfs-sidecar-redirect", "{manifest:#}");
    let incidents: BTreeSet<&str> =
        manifest["trigger"]["incidents"].as_array().unwrap().iter().filter_map(|v| v.as_str()).collect();
    let both: BTreeSet<&str> = [&redirect["id"], &blocked["id"]].iter().filter_map(|v| v.as_str()).collect();
    assert_eq!(incidents, both, "{manifest:#}");
    assert_eq!(manifest["limits"]["filter_from"], "incident", "{manifest:#}");
    let (lines, _) = tcpdump(&top.join("packets.pcapng"));
    let syns = ports(&lines, "IP 127.0.0.1.", " > 127.0.0.1.15001: Flags [S],");
    // The reset leaves 15001; conntrack has undone the redirect by the time loopback shows it.
    let rsts = ports(&lines, "IP 127.0.0.1.2049 > 127.0.0.1.", ": Flags [R.],");
    // Each reset answers a SYN; each SYN is answered, but the last may have been cut by the stop.
    let answered = syns.iter().filter(|p| rsts.contains(p)).count();
    assert!(!rsts.is_empty() && rsts.iter().all(|p| syns.contains(p)), "{lines}");
    assert!(answered + 1 >= syns.len(), "{answered} of {} SYNs reset:\n{lines}", syns.len());
    let stuck = std::fs::read_to_string(top.join("tasks/stuck.txt")).expect("tasks/stuck.txt");
    let mut lines = stuck
        .lines()
        .skip_while(|l| !l.starts_with(&format!("pid {writer} tid {writer} comm \"dd\" state D ")));
    assert!(lines.next().is_some(), "no line for the writer ({writer}):\n{stuck}");
    assert!(
        lines
            .take_while(|l| l.starts_with("    "))
            .any(|f| f.contains("folio_wait") || f.contains("writeback")),
        "no writeback wait in the writer's stack:\n{stuck}"
    );
    // What kstall knew of the pod: both incidents with their evidence, and its resets — those
    // before the capture began (the incident's lead-up) among them.
    let known: Value = serde_json::from_slice(
        &std::fs::read(top.join("kstall/incidents.json")).expect("kstall/incidents.json"),
    )
    .unwrap();
    let ids: BTreeSet<&str> =
        known["incidents"].as_array().unwrap().iter().filter_map(|i| i["id"].as_str()).collect();
    assert_eq!(ids, both, "{known:#}");
    assert!(known["incidents"].as_array().unwrap().iter().all(|i| i["pod"] == POD), "{known:#}");
    let events = std::fs::read_to_string(top.join("kstall/events.jsonl")).expect("kstall/events.jsonl");
    let resets: Vec<Value> = events
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).expect("one JSON event a line"))
        .filter(|e| e["kind"] == "tcp_reset" && e["local_port"] == 15001)
        .collect();
    let began = manifest["times"]["started"]["unix_ns"].as_u64().expect("the capture's start");
    assert!(
        resets.iter().any(|e| e["time_unix_ns"].as_u64() < Some(began)),
        "no reset from before the capture in:\n{events}"
    );
    assert!(resets.iter().all(|e| e["pod"] == POD), "{events}");

    disk.thaw();
    disk.wait_writers(Duration::from_secs(30));
    assert_eq!(agent.stop(), Some(0));
}
