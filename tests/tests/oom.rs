//! The OOM probe against the real kernel: a process in a test memory cgroup allocates past the
//! cgroup's limit and is killed by the memcg OOM killer (never the node-wide one: the process
//! also stops by itself well before the host would run short).

use std::{
    process::Command,
    time::{Duration, Instant},
};

use kstall_tests::{
    agent::{Agent, COUNTED_WITHIN},
    cgroup::{Cgroup, MemoryLimit},
    host::{Stopped, wait_for},
    kernel_tests_can_run,
    oom::oom_kill,
};

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
    // The memory cgroup the limit is in (v1 on a hybrid host), named by the kernel at the kill.
    let name = cgroup.path.file_name().unwrap().to_str().unwrap();
    assert!(k["victim_memcg"].as_str().is_some_and(|p| p.ends_with(&format!("/{name}")) || p == name), "{k}");
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

    // A test cgroup outside kubepods: a host process. Counted in the kernel, read within two
    // counter intervals.
    let series = r#"kstall_oom_kills_total{comm="python3",container="",critical="false",host="true",namespace="",pod="",scope="memcg",workload=""}"#;
    assert_eq!(agent.counted(series, 1.0), Some(1.0), "{}", agent.metrics());
    assert_eq!(agent.stop(), Some(0));
}

/// Kills the agent cannot take in while it is stopped: a ring buffer of one page holds 9 OOM
/// events, 15 kills happen. The count is the kernel's, exact; the events say what was lost.
#[test]
fn oom_kills_are_counted_exactly_while_the_agent_is_stopped() {
    if !kernel_tests_can_run("oom_kills_are_counted_exactly_while_the_agent_is_stopped") {
        return;
    }
    const KILLS: usize = 15;
    let cgroup = Cgroup::new("oom-stopped");
    let limit = MemoryLimit::new(&cgroup, LIMIT);
    let mut agent = Agent::start(&["--ring-buffer-bytes", "4K"]);
    let oom = |name: &str| agent.metric(&format!(r#"{name}{{probe="oom"}}"#)).unwrap_or(0.0);
    let accounted = || {
        oom("kstall_events_total") + oom("kstall_events_lost_total") + oom("kstall_events_suppressed_total")
    };
    let before = accounted();

    let stopped = Stopped::new(agent.pid());
    let procs = cgroup.procs();
    for _ in 0..KILLS {
        oom_kill(&[&procs, limit.procs()], |_| {});
    }
    drop(stopped);

    let labels = [("comm", "python3"), ("scope", "memcg"), ("host", "true")];
    let counted = agent.counted_with("kstall_oom_kills_total", &labels, KILLS as f64);
    assert_eq!(counted, Some(KILLS as f64), "{}", agent.metrics());
    let all = wait_for(COUNTED_WITHIN, || (accounted() - before == KILLS as f64).then_some(()));
    assert!(all.is_some(), "received + lost + suppressed = {} of {KILLS}", accounted() - before);
    assert!(oom("kstall_events_lost_total") > 0.0, "the ring buffer overflowed: {}", agent.metrics());
    assert_eq!(agent.stop(), Some(0));
}
