//! The DaemonSet proven on this machine: the image `cargo xtask image` builds, under podman, with
//! exactly the rendered DaemonSet's pod settings (its capabilities and nothing else, its seccomp
//! profile, read-only root, its host mounts, host PID and network). Inside, every probe must come
//! up, a real redirected reset on the host must be counted with its pod, and a real hung task must
//! be reported with a symbolized stack, its wait class and its blocked time — with no warning in
//! the agent's log. Then each capability is taken away in turn, and the agent must name it.

use std::time::Duration;

use kstall_tests::{
    agent::{pod_json, sample_with, subscribe},
    cgroup::{Cgroup, PodProcess},
    container::{AgentContainer, ApiServer, NODE, Overrides, image, image_missing},
    deploy::rendered_daemonset,
    host::{Sysctl, wait_for},
    kernel_tests_can_run,
    kubelet::FakeKubelet,
    netns::{NetNs, NfsReconnects},
    writeback::FreezableDisk,
};
use serde_json::Value;

const UID: &str = "7b1d2c3e-4f5a-4b6c-8d7e-9f0a1b2c3d4e";
const CONTAINER: &str = "3c4d5e6f7a8b9c0d1e2f3a4b5c6d7e8f9a0b1c2d3e4f5a6b7c8d9e0f1a2b3c4d";
const POD: &str = "web-5d8c7b9f4-c0n7r";

/// False (with why) where kernel tests may skip; a panic where they are required.
fn can_run(test: &str) -> bool {
    if !kernel_tests_can_run(test) {
        return false;
    }
    match image_missing(&image()) {
        None => true,
        Some(why) if std::env::var("KSTALL_KERNEL_TESTS").as_deref() == Ok("require") => {
            panic!("{test}: required here, but {why}")
        }
        Some(why) => {
            println!("skipping {test}: {why}");
            false
        }
    }
}

/// The agent's log lines (JSON, as in a cluster: no terminal) at WARN or ERROR about itself: an
/// incident it reports is what it is for, not a fault.
fn warnings(logs: &str) -> Vec<String> {
    logs.lines()
        .filter(|l| {
            let Ok(line) = serde_json::from_str::<Value>(l) else { return l.contains("panicked") };
            matches!(line["level"].as_str(), Some("WARN" | "ERROR"))
                && !matches!(
                    line["fields"]["message"].as_str(),
                    Some("incident firing" | "incident resolved")
                )
        })
        .map(str::to_string)
        .collect()
}

#[test]
fn the_daemonset_runs_with_only_its_capabilities_and_loses_nothing() {
    if can_run("the_daemonset_runs_with_only_its_capabilities_and_loses_nothing") {
        loses_nothing("base");
    }
}

/// deploy/components/non-root: user 65534, its capabilities from the binary's file capabilities.
#[test]
fn as_a_non_root_user_with_file_capabilities_it_loses_nothing_either() {
    if can_run("as_a_non_root_user_with_file_capabilities_it_loses_nothing_either") {
        let daemonset = rendered_daemonset("non-root");
        assert_eq!(
            daemonset["spec"]["template"]["spec"]["containers"][0]["securityContext"]["runAsUser"],
            65534
        );
        loses_nothing("non-root");
    }
}

/// The image run with `overlay`'s DaemonSet: every probe up, a real redirected reset counted with
/// its pod, a real hung task with its symbolized stack, wait class and blocked time, `kstall` in
/// the container answering, a clean exposition, and no warning in the log.
fn loses_nothing(overlay: &str) {
    let daemonset = rendered_daemonset(overlay);
    let security = &daemonset["spec"]["template"]["spec"]["containers"][0]["securityContext"];
    assert_ne!(security["privileged"], true, "{security}");
    assert_eq!(security["capabilities"]["drop"], serde_json::json!(["ALL"]), "{security}");

    // The host's detector reports a task after 3 s (the agent in a pod cannot set it: /proc/sys
    // is read-only there); restored on drop.
    let _detector = Sysctl::set("kernel.hung_task_timeout_secs", "3");
    let _warnings = Sysctl::keep("kernel.hung_task_warnings");
    let container = Cgroup::kubepods_container("burstable", UID, CONTAINER);
    let netns = NetNs::new("container");
    let _sandbox = PodProcess::start(&netns, &container.procs());
    netns.redirect_tcp("iptables", 2049, 15001);
    let mut disk = FreezableDisk::new("container");
    let api = ApiServer::start(&[pod_json(UID, POD, CONTAINER)]);
    let (cert, key) = api.certificate();
    let _kubelet = FakeKubelet::start_well_on_the_kubelets_ports(&cert, &key);
    let agent = AgentContainer::run(&daemonset, &api, &Overrides::default());

    let status = agent
        .status(Duration::from_secs(60))
        .unwrap_or_else(|| panic!("`kstall status` in the container never answered:\n{}", agent.logs()));
    for probe in status["probes"].as_array().unwrap() {
        if probe["name"] == "nfs" {
            // This host's kernel has no NFS client: the probe waits for sunrpc, as on any node
            // without NFS mounts (the VM matrix attaches it).
            let reason = probe["reason"].as_str().unwrap_or("");
            assert!(reason.contains("sunrpc not loaded"), "{probe}");
        } else {
            assert_eq!(probe["up"], true, "{probe}\n{}", agent.logs());
        }
    }
    let user = security["runAsUser"].as_u64().unwrap_or(0);
    assert_eq!(u64::from(agent.uid()), user, "the agent runs as the DaemonSet's user");
    let ready = agent.get(&agent.readiness_path);
    assert_eq!(ready.as_deref(), Some("ok\n"), "the readiness probe's {}", agent.readiness_path);
    let attribution = &status["attribution"];
    assert_eq!(attribution["source"], format!("api (node {NODE})"), "{attribution}");
    let pods_known = wait_for(Duration::from_secs(30), || {
        let status = agent.status(Duration::ZERO)?;
        (status["attribution"]["up"] == true && status["attribution"]["pods"] == 1).then_some(())
    });
    assert!(pods_known.is_some(), "the pod source never listed the pod:\n{}", agent.logs());
    let events = subscribe(&agent.socket(), || agent.logs());
    // The kubelet checks' defaults reach the node's kubelet from the pod (hostNetwork).
    let kubelet_checked = wait_for(Duration::from_secs(30), || {
        let metrics = agent.metrics()?;
        let up = |check| sample_with(&metrics, "kstall_kubelet_check_up", &[("check", check)]);
        (up("healthz") == Some(1.0) && up("tls") == Some(1.0)).then_some(())
    });
    assert!(
        kubelet_checked.is_some(),
        "kubelet checks:\n{}\n{}",
        agent.metrics().unwrap_or_default(),
        agent.logs()
    );

    // Redirected resets: the pod's client retrying 2049, REDIRECTed to 15001 where nothing listens.
    let mut client = NfsReconnects::start(&netns);
    let counted = wait_for(Duration::from_secs(15), || {
        let labels = [("namespace", "shop"), ("pod", POD), ("direction", "sent"), ("original_port", "2049")];
        sample_with(&agent.metrics()?, "kstall_tcp_resets_total", &labels).filter(|&n| n >= 5.0)
    });
    assert!(
        counted.is_some(),
        "resets of {POD} not counted:\n{}\n{}",
        agent.metrics().unwrap_or_default(),
        agent.logs()
    );

    // The incident the redirect is (nfs-sidecar-redirect) becomes an Event on the pod, where
    // `kubectl describe pod` shows it: written with the service account, over TLS.
    let on_the_pod = |w: &Value| w["method"] == "POST" && w["body"]["regarding"]["uid"] == UID;
    let posted = wait_for(Duration::from_secs(30), || api.event_writes().into_iter().find(on_the_pod));
    let posted =
        posted.unwrap_or_else(|| panic!("no Event on {POD}: {:?}\n{}", api.event_writes(), agent.logs()));
    assert_eq!(posted["path"], "/apis/events.k8s.io/v1/namespaces/shop/events", "{posted}");
    assert_eq!(posted["code"], 201, "created, as a real API server's validation takes it: {posted}");
    let event = &posted["body"];
    assert_eq!(
        (&event["type"], &event["reason"], &event["regarding"]["kind"], &event["regarding"]["name"]),
        (&"Warning".into(), &"NFSSidecarRedirect".into(), &"Pod".into(), &POD.into()),
        "{event}"
    );
    client.stop();

    // A hung task of the pod: a writer stuck in writeback on a frozen disk.
    disk.freeze();
    let writer = disk.start_writer(&container.procs());
    let hung = events.collect(|e| e["kind"] == "hung_task" && e["pid"] == writer, 1, Duration::from_secs(60));
    assert_eq!(hung.len(), 1, "writer {writer} reported hung:\n{}", agent.logs());
    let e = &hung[0];
    assert_eq!((&e["namespace"], &e["pod"]), (&"shop".into(), &POD.into()), "{e}");
    assert_eq!(e["wait"], "writeback", "the wait class needs symbols (CAP_SYSLOG): {e}");
    assert!(e["blocked_secs"].as_u64().is_some_and(|s| s >= 3), "blocked time needs HZ: {e}");
    let stack: Vec<&str> = e["stack"].as_array().unwrap().iter().filter_map(|f| f.as_str()).collect();
    assert!(stack.iter().any(|f| f.starts_with("folio_wait")), "a symbolized stack: {stack:?}");
    let explained =
        agent.exec_kstall(&["explain", "pod", POD, "-n", "shop"]).expect("kstall explain in the container");
    assert!(explained.contains("writeback"), "{explained}");

    // The exposition a Prometheus scrapes, with every kind of series present, is clean.
    let metrics = agent.metrics().expect("/metrics");
    let complaints = kstall_tests::alerting::promtool_complaints(&metrics);
    assert!(complaints.is_empty(), "{complaints}");

    disk.thaw();
    disk.wait_writers(Duration::from_secs(30));
    let logs = agent.logs();
    assert_eq!(warnings(&logs), Vec::<String>::new(), "no feature degraded in the container:\n{logs}");
}

/// Each capability the DaemonSet adds, taken away alone: the agent must say which is missing and
/// what it costs. Prints the table deploy/README.md carries.
#[test]
fn each_capability_taken_away_is_named_by_the_agent() {
    if !can_run("each_capability_taken_away_is_named_by_the_agent") {
        return;
    }
    let daemonset = rendered_daemonset("base");
    let adds: Vec<String> =
        daemonset["spec"]["template"]["spec"]["containers"][0]["securityContext"]["capabilities"]["add"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c.as_str().unwrap().to_string())
            .collect();
    // A pod whose network namespace the agent learns from its process, as in the first test.
    let container = Cgroup::kubepods_container("burstable", UID, CONTAINER);
    let netns = NetNs::new("caps");
    let _sandbox = PodProcess::start(&netns, &container.procs());
    let api = ApiServer::start(&[pod_json(UID, POD, CONTAINER)]);
    let mut table = Vec::new();
    for capability in &adds {
        let overrides = Overrides { without_capabilities: vec![capability.clone()] };
        let agent = AgentContainer::run(&daemonset, &api, &overrides);
        let status = agent
            .status(Duration::from_secs(60))
            .unwrap_or_else(|| panic!("without {capability}: no status:\n{}", agent.logs()));
        let logs = agent.logs();
        let named = format!("CAP_{capability}");
        let warned: Vec<String> = warnings(&logs).into_iter().filter(|l| l.contains(&named)).collect();
        let down: Vec<String> = status["probes"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|p| p["up"] == false && !p["reason"].as_str().unwrap_or("").contains("sunrpc not loaded"))
            .map(|p| format!("{} down: {}", p["name"].as_str().unwrap(), p["reason"].as_str().unwrap_or("")))
            .collect();
        // What is measured, beside what the agent says.
        let pod_namespaces = status["attribution"]["pod_namespaces"].as_u64().unwrap_or(0);
        match capability.as_str() {
            "SYS_PTRACE" => {
                assert_eq!(pod_namespaces, 0, "no namespace links without {capability}: {status}")
            }
            "BPF" | "PERFMON" => {
                let probes = status["probes"].as_array().map_or(0, Vec::len);
                assert_eq!(down.len(), probes, "every probe down without {capability}: {down:?}")
            }
            "SYSLOG" => assert!(logs.contains("/proc/kallsyms shows no addresses"), "{logs}"),
            _ => assert!(pod_namespaces >= 1, "the pod's namespace learned without {capability}: {status}"),
        }
        assert!(!warned.is_empty(), "without {capability} the agent must name {named}:\n{logs}");
        for probe in &down {
            assert!(probe.contains(&named), "a probe down without {capability} names it: {probe}");
        }
        let effect = serde_json::from_str::<Value>(&warned[0]).map(|v| v["fields"]["message"].to_string());
        table.push(format!(
            "| `{capability}` | {} {} (pod namespaces learned: {pod_namespaces}) |",
            effect.unwrap_or_default(),
            down.join("; ")
        ));
    }
    println!("capability taken away | what the agent says\n{}", table.join("\n"));
}
