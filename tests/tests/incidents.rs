//! Incidents end to end on the real kernel: incident 1's sidecar redirect in a pod's network
//! namespace (a real iptables REDIRECT of tcp/2049 to a port where nothing listens) plus a real
//! task of that pod stuck in D state (a writer on a frozen disk). kstall must raise
//! `nfs-sidecar-redirect` and `pod-termination-blocked` for that pod, with the evidence and the way
//! out; push it to a real Alertmanager; a real Prometheus scraping kstall must fire the shipped
//! rule into the same Alertmanager alert; and all of it must resolve once the writer is released
//! and the rule deleted.

use std::time::Duration;

use kstall_tests::{
    agent::{Agent, pod_json, write_pods_file},
    alerting,
    cgroup::{Cgroup, v1_memory_limit},
    host::{Sysctl, wait_for},
    kernel_tests_can_run,
    oom::oom_kill,
    stuck_pod::RedirectedStuckPod,
    writeback::FreezableDisk,
};
use serde_json::Value;

const UID: &str = "5a0c1f2e-3b4d-4e5f-8a9b-0c1d2e3f4a5b";
const CONTAINER: &str = "9e8d7c6b5a4f3e2d1c0b9a8f7e6d5c4b3a2f1e0d9c8b7a6f5e4d3c2b1a0f9e8d";
const POD: &str = "tenant-api-5d8c7b9f4-q7x2m";

fn is(signature: &'static str, state: &'static str) -> impl Fn(&Value) -> bool {
    move |i: &Value| i["signature"] == signature && i["state"] == state && i["pod"] == POD
}

#[test]
fn sidecar_redirect_and_stuck_writer_fire_alert_and_resolve() {
    if !kernel_tests_can_run("sidecar_redirect_and_stuck_writer_fire_alert_and_resolve") {
        return;
    }
    let original = std::fs::read_to_string("/proc/sys/kernel/hung_task_timeout_secs").unwrap();
    let _restore = Sysctl::set("kernel.hung_task_timeout_secs", original.trim());
    let _warnings = Sysctl::keep("kernel.hung_task_warnings");
    let dir = tempfile::tempdir().unwrap();
    let pods_file = dir.path().join("pods.json");
    write_pods_file(&pods_file, &[pod_json(UID, POD, CONTAINER)]);
    let mut disk = FreezableDisk::new("incident");
    let alertmanager = alerting::alertmanager();
    let am_url = format!("http://{}", alertmanager.addr);
    let mut agent = Agent::start(&[
        "--alertmanager-url",
        &am_url,
        "--pods-file",
        pods_file.to_str().unwrap(),
        "--hung-task-timeout-secs",
        "3",
        "--termination-blocked-after",
        "3s",
        "--quiet-window",
        "5s",
    ]);

    // The pod with the sidecar's rule, its hard-mounted NFS client's reconnects (every half
    // second until the rule is deleted: SYNs to 2049, redirected to 15001, reset), and a task of
    // the pod that cannot finish its flush.
    let mut pod = RedirectedStuckPod::start("incident", UID, CONTAINER, &mut disk);
    let (netns, writer) = (&pod.netns, pod.writer);

    let redirect = agent
        .wait_incident(is("nfs-sidecar-redirect", "firing"), Duration::from_secs(15))
        .unwrap_or_else(|| panic!("no nfs-sidecar-redirect: {:#?}\n{}", agent.incidents(), agent.log()));
    assert_eq!(redirect["namespace"], "shop", "{redirect:#}");
    assert_eq!(redirect["workload"], "Deployment/web", "{redirect:#}");
    assert_eq!(redirect["pod_uid"], UID, "{redirect:#}");
    let evidence = &redirect["evidence"];
    assert_eq!(evidence["server"], "127.0.0.1", "{redirect:#}");
    assert_eq!(evidence["nfs_port"], 2049, "{redirect:#}");
    assert_eq!(evidence["redirect_ports"], serde_json::json!([15001]), "{redirect:#}");
    assert_eq!(evidence["netns"], netns.inode(), "{redirect:#}");
    assert!(evidence["resets_total"].as_u64().is_some_and(|n| n >= 2), "the threshold: {redirect:#}");
    // A bare REDIRECT in a pod no mesh marks: no mesh is named, the way out is the neutral one.
    assert_eq!(evidence["mesh"], "unknown", "{redirect:#}");
    let steps = redirect["remediation"]["break_glass"].to_string();
    assert!(
        steps.contains("iptables -t nat -I OUTPUT 1 -p tcp -d 127.0.0.1 --dport 2049 -j RETURN"),
        "{steps}"
    );
    assert!(steps.contains(&UID.replace('-', "_")), "the cgroup check names the pod UID: {steps}");

    let blocked = agent
        .wait_incident(is("pod-termination-blocked", "firing"), Duration::from_secs(30))
        .unwrap_or_else(|| panic!("no pod-termination-blocked: {:#?}\n{}", agent.incidents(), agent.log()));
    let task = &blocked["evidence"]["stuck_tasks"][0];
    assert_eq!(
        (&task["pid"], &task["comm"], &task["wait"]),
        (&writer.into(), &"dd".into(), &"writeback".into())
    );
    assert!(task["stack"].to_string().contains("folio_wait"), "{blocked:#}");
    assert_eq!(
        blocked["related"],
        serde_json::json!([redirect["id"]]),
        "explained by the redirect: {blocked:#}"
    );
    // One stuck-task set: kstall explain shows the task as the incident does — the same stack,
    // the same time it last ran — and /metrics counts from that time too.
    let explained = agent.explain(POD);
    let shown = explained["stuck_tasks"].as_array().into_iter().flatten().find(|t| t["pid"] == writer);
    let shown = shown.unwrap_or_else(|| panic!("explain shows the writer: {explained:#}"));
    assert_eq!(
        (&shown["stack"], &shown["blocked_since_unix_ns"], &shown["wait"]),
        (&task["stack"], &task["blocked_since_unix_ns"], &task["wait"]),
        "explain {shown:#} and the incident {task:#}"
    );
    let since_secs = task["blocked_since_unix_ns"].as_u64().unwrap() / 1_000_000_000;
    let now_secs = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs();
    let longest = agent.metric("kstall_stuck_task_longest_blocked_seconds").unwrap_or(0.0) as u64;
    assert!(
        (3..=now_secs - since_secs + 1).contains(&longest),
        "longest blocked {longest} s: at least the detector's 3 s, at most since {since_secs} (now {now_secs})"
    );

    // Prometheus and HTTP clients see the same.
    let node = redirect["node"].as_str().unwrap().to_string();
    let labels = [
        ("namespace", "shop"),
        ("node", node.as_str()),
        ("pod", POD),
        ("severity", "warning"),
        ("signature", "nfs-sidecar-redirect"),
    ];
    assert_eq!(agent.metric_with("kstall_incident_active", &labels), Some(1.0), "{}", agent.metrics());
    let http: Value = serde_json::from_str(&agent.get("/api/v1/incidents")).expect("JSON");
    assert!(http["incidents"].as_array().unwrap().iter().any(is("nfs-sidecar-redirect", "firing")));

    // Alertmanager got the agent's push...
    let am_alerts = |active: bool| -> Vec<Value> {
        let path = format!(
            "/api/v2/alerts?active={active}&silenced=false&inhibited=false&filter=alertname%3D%22KstallNfsSidecarRedirect%22"
        );
        alertmanager
            .get_json(&path)
            .as_array()
            .cloned()
            .unwrap_or_default()
            .into_iter()
            .filter(|a| a["labels"]["pod"] == POD)
            .collect()
    };
    let pushed =
        wait_for(Duration::from_secs(15), || am_alerts(true).into_iter().next()).unwrap_or_else(|| {
            panic!("Alertmanager has no pushed alert:\n{}\n{}", alertmanager.log(), agent.log())
        });
    for (label, value) in [
        ("signature", "nfs-sidecar-redirect"),
        ("severity", "warning"),
        ("namespace", "shop"),
        ("node", node.as_str()),
    ] {
        assert_eq!(pushed["labels"][label], value, "{pushed:#}");
    }
    assert!(
        agent
            .metric(&format!(r#"kstall_alertmanager_posts_total{{result="ok",url="{am_url}"}}"#))
            .unwrap_or(0.0)
            >= 1.0
    );
    // ...and Prometheus, scraping the agent, fires the shipped rule into the same alert.
    let rules =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/prometheus/kstall-rules.yaml");
    let prometheus = alerting::prometheus(agent.listen, &rules, alertmanager.addr);
    let rule_alert = wait_for(Duration::from_secs(30), || {
        let alerts = prometheus.get_json("/api/v1/alerts");
        alerts["data"]["alerts"]
            .as_array()?
            .iter()
            .find(|a| a["labels"]["alertname"] == "KstallNfsSidecarRedirect" && a["state"] == "firing")
            .cloned()
    })
    .unwrap_or_else(|| panic!("Prometheus did not fire the rule:\n{}", prometheus.log()));
    assert_eq!(rule_alert["labels"]["pod"], POD, "{rule_alert:#}");
    let from_prometheus = wait_for(Duration::from_secs(30), || {
        let alerts = am_alerts(true);
        // One alert, not two: Alertmanager deduped the push and the rule (same labels); the
        // rule's carries Prometheus's generator URL.
        (alerts.len() == 1 && alerts[0]["generatorURL"].as_str().is_some_and(|u| !u.is_empty()))
            .then(|| alerts[0].clone())
    });
    assert!(from_prometheus.is_some(), "Alertmanager: {:#?}\n{}", am_alerts(true), prometheus.log());

    // The break-glass step and the release: both resolve.
    assert!(pod.client.stop() >= 3, "the client's connects were refused");
    pod.netns.exec(
        "iptables",
        &[
            "-t",
            "nat",
            "-D",
            "OUTPUT",
            "-p",
            "tcp",
            "--dport",
            "2049",
            "-j",
            "REDIRECT",
            "--to-ports",
            "15001",
        ],
    );
    disk.thaw();
    disk.wait_writers(Duration::from_secs(30));
    for signature in ["nfs-sidecar-redirect", "pod-termination-blocked"] {
        let resolved = agent.wait_incident(is(signature, "resolved"), Duration::from_secs(30));
        assert!(resolved.is_some(), "{signature} resolved: {:#?}", agent.incidents());
    }
    assert_eq!(agent.metric_with("kstall_incident_active", &labels), None, "no longer active");
    // Prometheus's rule stops firing and Alertmanager's alert resolves.
    let quiet = wait_for(Duration::from_secs(30), || {
        let alerts = prometheus.get_json("/api/v1/alerts");
        let firing = alerts["data"]["alerts"]
            .as_array()?
            .iter()
            .any(|a| a["labels"]["alertname"] == "KstallNfsSidecarRedirect");
        (!firing && am_alerts(true).is_empty()).then_some(())
    });
    assert!(quiet.is_some(), "still active in Alertmanager: {:#?}", am_alerts(true));
    assert_eq!(agent.stop(), Some(0));
}

/// A container whose limit is below what it needs: real memcg OOM kills, three in a row, make one
/// `container-oom-loop` incident naming the pod and the container.
#[test]
fn repeated_oom_kills_of_one_container_are_a_loop() {
    if !kernel_tests_can_run("repeated_oom_kills_of_one_container_are_a_loop") {
        return;
    }
    let uid = "6b1d2e3f-4c5d-4e6f-9a0b-1c2d3e4f5a6b";
    let name = "worker-7c9d8e6f5-k2j4h";
    let dir = tempfile::tempdir().unwrap();
    let pods_file = dir.path().join("pods.json");
    write_pods_file(&pods_file, &[pod_json(uid, name, CONTAINER)]);
    let mut agent = Agent::start(&["--pods-file", pods_file.to_str().unwrap()]);
    let container = Cgroup::at(&format!("kubepods/burstable/pod{uid}/{CONTAINER}"));
    let limit = v1_memory_limit("oom-loop");
    for kill in 1..=3 {
        oom_kill(&[&container.procs(), limit.procs().as_path()], |_| {});
        if kill < 3 {
            std::thread::sleep(Duration::from_secs(2));
            let early = agent.incidents().into_iter().find(|i| i["signature"] == "container-oom-loop");
            assert!(early.is_none(), "fired after {kill} kills: {early:?}");
        }
    }
    let looping = agent
        .wait_incident(
            |i| i["signature"] == "container-oom-loop" && i["pod"] == name,
            Duration::from_secs(10),
        )
        .unwrap_or_else(|| panic!("no container-oom-loop: {:#?}\n{}", agent.incidents(), agent.log()));
    assert_eq!(
        (&looping["namespace"], &looping["container"]),
        (&"shop".into(), &"app".into()),
        "{looping:#}"
    );
    assert_eq!(looping["evidence"]["kills"].as_array().map(Vec::len), Some(3), "{looping:#}");
    assert_eq!(agent.stop(), Some(0));
}
