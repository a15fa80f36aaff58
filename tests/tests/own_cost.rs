//! The agent's own cost as the kernel counts it, on this host's kernel: each program's runs and
//! run time while `--program-stats on` holds the kernel's statistics on (and only while the agent
//! runs), the ring buffer's fill, and what `kstall status` says when nothing counts them.

use std::net::SocketAddr;

use kstall_tests::{
    START_WITHIN,
    agent::{Agent, COUNTED_WITHIN},
    bpf::program_runs_of,
    host::wait_for,
    kernel_tests_can_run,
    netns::{NetNs, refused_connects},
};

const RESETS: usize = 50;

fn stats_enabled() -> bool {
    std::fs::read_to_string("/proc/sys/kernel/bpf_stats_enabled").expect("bpf_stats_enabled").trim() != "0"
}

#[test]
fn the_programs_runs_and_time_are_counted_while_the_agent_holds_the_statistics_on() {
    if !kernel_tests_can_run("the_programs_runs_and_time_are_counted_while_the_agent_holds_the_statistics_on")
    {
        return;
    }
    let mut agent = Agent::start(&["--program-stats", "on"]);
    wait_for(START_WITHIN, || (agent.metric("kstall_program_stats_enabled")? == 1.0).then_some(()))
        .unwrap_or_else(|| panic!("the agent did not turn the kernel's statistics on:\n{}", agent.log()));
    let ns = NetNs::new("cost");
    ns.redirect_tcp("iptables", 2049, 15001);
    let resets = || ns.run_inside(|| refused_connects(SocketAddr::from(([127, 0, 0, 1], 2049)), RESETS));
    resets();
    // Two resets a connect (sent and received), each one run of a reset program at least.
    let runs = wait_for(COUNTED_WITHIN, || {
        let runs = agent.metric_sum("kstall_program_runs_total", &[]);
        (runs >= 2.0 * RESETS as f64).then_some(runs)
    })
    .unwrap_or_else(|| panic!("the programs' runs were not counted:\n{}", agent.metrics()));
    // The kernel's own figures, read after the agent's: as many runs or more.
    let kernel: u64 = program_runs_of(agent.pid()).iter().map(|p| p.runs).sum();
    assert!(kernel as f64 >= runs, "the kernel counted {kernel} runs, the agent {runs}");
    let seconds = agent.metric_sum("kstall_program_run_seconds_total", &[]);
    assert!(seconds > 0.0 && seconds < 1.0, "{runs} runs took {seconds} s in the kernel");
    assert_eq!(agent.metric("kstall_program_stats_enabled"), Some(1.0));
    assert_eq!(agent.metric("kstall_ring_buffer_size_bytes"), Some(f64::from(1u32 << 20)));
    // Quiet, every event wakes the reader: it found at least one record waiting.
    let most = agent.metric("kstall_ring_buffer_used_max_bytes").unwrap_or(0.0);
    assert!(most > 0.0 && most <= f64::from(1u32 << 20), "the ring's fill: {most}");
    let cost = &agent.status()["cost"];
    let programs = cost["programs"].as_str().unwrap_or_default();
    assert!(programs.starts_with("counted (--program-stats on, while the agent runs): "), "{cost}");
    assert!(cost["ring_buffer"].as_str().unwrap_or_default().contains("KiB of 1024 KiB unread"), "{cost}");
    agent.stop();
    // Once it exited, the kernel no longer counts (unless the node has them on): an agent that
    // did not ask for them sees its programs run uncounted.
    if !stats_enabled() {
        let agent = Agent::start(&[]);
        let events = agent.subscribe();
        resets();
        let redirected = |e: &serde_json::Value| e["kind"] == "tcp_reset" && e["original_dst_port"] == 2049;
        assert!(!events.collect(redirected, 1, COUNTED_WITHIN).is_empty(), "the second agent's programs ran");
        let counted: u64 = program_runs_of(agent.pid()).iter().map(|p| p.runs).sum();
        assert_eq!(counted, 0, "the kernel counts no runs once the first agent is gone");
    }
}

#[test]
fn without_the_statistics_on_the_status_says_the_runs_are_not_counted() {
    if !kernel_tests_can_run("without_the_statistics_on_the_status_says_the_runs_are_not_counted") {
        return;
    }
    let on = stats_enabled();
    let agent = Agent::start(&[]);
    assert_eq!(agent.metric("kstall_program_stats_enabled"), Some(if on { 1.0 } else { 0.0 }));
    let programs = agent.status()["cost"]["programs"].as_str().unwrap_or_default().to_string();
    let expected =
        if on { "counted (kernel.bpf_stats_enabled=1)" } else { "not counted: kernel.bpf_stats_enabled=0" };
    assert!(programs.starts_with(expected), "{programs}");
}
