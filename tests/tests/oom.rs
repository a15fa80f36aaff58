//! The OOM probe against the real kernel: a process in a test memory cgroup allocates past the
//! cgroup's limit and is killed by the memcg OOM killer (never the node-wide one: the process
//! also stops by itself well before the host would run short).

use std::{
    process::Command,
    time::{Duration, Instant},
};

use kstall_tests::{Agent, Cgroup, MemoryLimit, kernel_tests_can_run};

const LIMIT: u64 = 64 << 20;

/// Runs a process in `cgroup` (with a `LIMIT` memory limit) that allocates until the memcg OOM
/// killer kills it; returns its pid.
fn oom_kill_in(cgroup: &Cgroup) -> u32 {
    let limit = MemoryLimit::new(cgroup, LIMIT);

    // Joins both hierarchies (attribution reads the v2 one), then allocates 8 MiB at a time up
    // to 512 MiB at most: far past the limit, far below what this machine has.
    let script = format!(
        "echo $$ > {v2} && echo $$ > {v1} && exec python3 -c 'x = [bytearray(8 << 20) for _ in range(64)]'",
        v2 = cgroup.procs().display(),
        v1 = limit.procs().display()
    );
    let mut victim = Command::new("sh").args(["-c", &script]).spawn().expect("start the allocator");
    let pid = victim.id();
    let deadline = Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(status) = victim.try_wait().unwrap() {
            break status;
        }
        assert!(Instant::now() < deadline, "allocator still running after 60 s");
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(
        std::os::unix::process::ExitStatusExt::signal(&status),
        Some(libc::SIGKILL),
        "OOM-killed: {status}"
    );
    pid
}

#[test]
fn memcg_oom_kill_is_reported_with_victim_cgroup_scope_and_rss() {
    if !kernel_tests_can_run("memcg_oom_kill_is_reported_with_victim_cgroup_scope_and_rss") {
        return;
    }
    let cgroup = Cgroup::new("oom");
    let mut agent = Agent::start(&[]);
    let events = agent.subscribe();
    let pid = oom_kill_in(&cgroup);

    let kills = events.collect(|e| e["kind"] == "oom_kill" && e["pid"] == pid, 1, Duration::from_secs(10));
    assert_eq!(kills.len(), 1, "{kills:#?}\n{}", agent.log());
    let k = &kills[0];
    assert_eq!(k["comm"], "python3", "{k}");
    assert_eq!(k["tgid"], pid, "{k}");
    assert_eq!(k["cgroup_id"], cgroup.id(), "{k}");
    assert_eq!(k["scope"], "memcg", "{k}");
    assert_eq!(k["critical"], false, "{k}");
    let anon = k["anon_rss_bytes"].as_u64().expect("rss");
    assert!((LIMIT / 2..=LIMIT).contains(&anon), "anon rss {anon} near the {LIMIT}-byte limit: {k}");
    assert!(
        k["invoker_stack"]
            .as_array()
            .unwrap()
            .iter()
            .any(|f| f.as_str().unwrap().starts_with("mem_cgroup_out_of_memory")),
        "{k}"
    );

    let series = r#"kstall_oom_kills_total{comm="python3",critical="false",scope="memcg"}"#;
    assert_eq!(agent.metric(series), Some(1.0), "{}", agent.metrics());
    assert_eq!(agent.stop(), Some(0));
}

const POD_UID: &str = "5a0c1f2e-3b4d-4e5f-8a9b-0c1d2e3f4a5b";
const CONTAINER: &str = "9e8d7c6b5a4f3e2d1c0b9a8f7e6d5c4b3a2f1e0d9c8b7a6f5e4d3c2b1a0f9e8d";

/// The victim's cgroup is a container of a pod in the systemd driver's layout, and in the
/// cgroupfs driver's: the event names pod UID, container id and QoS class.
#[test]
fn oom_victim_is_attributed_to_its_pod_and_container() {
    if !kernel_tests_can_run("oom_victim_is_attributed_to_its_pod_and_container") {
        return;
    }
    let uid_ = POD_UID.replace('-', "_");
    let layouts = [
        (
            format!(
                "kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{uid_}.slice/cri-containerd-{CONTAINER}.scope"
            ),
            "burstable",
        ),
        (format!("kubepods/besteffort/pod{POD_UID}/{CONTAINER}"), "best_effort"),
    ];
    let mut agent = Agent::start(&[]);
    let events = agent.subscribe();
    for (path, qos) in &layouts {
        let container = Cgroup::at(path);
        // The agent walks the hierarchy every 5 s: let it see the new pod first.
        std::thread::sleep(Duration::from_secs(6));
        let pid = oom_kill_in(&container);
        let kills =
            events.collect(|e| e["kind"] == "oom_kill" && e["pid"] == pid, 1, Duration::from_secs(10));
        assert_eq!(kills.len(), 1, "{path}: {kills:#?}");
        let w = &kills[0]["workload"];
        assert_eq!(w["type"], "container", "{path}: {}", kills[0]);
        assert_eq!(w["pod_uid"], POD_UID, "{path}");
        assert_eq!(w["container_id"], CONTAINER, "{path}");
        assert_eq!(w["qos"], *qos, "{path}");
    }
    assert_eq!(agent.stop(), Some(0));
}
