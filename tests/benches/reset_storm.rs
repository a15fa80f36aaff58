//! Reset storm: how many TCP resets per second the agent takes without loss, what it costs in CPU
//! and memory, and how much it slows the traffic it watches. Real kernel, real agent, real
//! iptables REDIRECT (root). Prints its figures; `KSTALL_BENCH_SECS` sets each phase's length.

use std::{
    net::{SocketAddr, TcpStream},
    sync::atomic::{AtomicU64, Ordering},
    thread,
    time::{Duration, Instant},
};

use kstall_tests::{
    agent::{Agent, COUNTED_WITHIN, sample_with},
    bpf::{bpf_programs, verified_instructions_of},
    host::{Sysctl, cpu_ticks, memory_kib, wait_for},
    kernel_tests_can_run,
    netns::NetNs,
};

const THREADS: usize = 2;

fn main() {
    if !kernel_tests_can_run("reset_storm") {
        return;
    }
    let secs: u64 = std::env::var("KSTALL_BENCH_SECS").ok().and_then(|s| s.parse().ok()).unwrap_or(10);
    let ns = NetNs::new("bench");
    ns.redirect_tcp("iptables", 2049, 15001);

    let baseline = storm(&ns, secs);
    println!("without agent: {:.0} refused connects/s", baseline.rate());

    let agent = Agent::start(&[]);
    // Per-program run time in the kernel; restored when the guard drops.
    let _stats = Sysctl::set("kernel.bpf_stats_enabled", "1");
    let before = Tally::of(&agent);
    let cpu_before = cpu_ticks(agent.pid());
    let run = storm(&ns, secs);
    let cpu_ticks_used = cpu_ticks(agent.pid()) - cpu_before;
    let expected = 2 * run.connects; // one sent and one received reset per connect
    // The kernel's counts reach the metric within two counter intervals.
    let counted = wait_for(COUNTED_WITHIN, || {
        Some(Tally::of(&agent).minus(&before)).filter(|t| t.counted == expected as f64)
    });
    let tally = counted.unwrap_or_else(|| Tally::of(&agent).minus(&before));
    let (rss, hwm) = memory_kib(agent.pid());
    let ticks_per_sec = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    let cpu_secs = cpu_ticks_used / ticks_per_sec;

    println!("with agent:    {:.0} refused connects/s ({:.0} reset events/s)", run.rate(), 2.0 * run.rate());
    println!(
        "traffic slowdown with the agent attached: {:.1}%",
        100.0 * (1.0 - run.rate() / baseline.rate())
    );
    println!(
        "resets: {expected} driven, {:.0} counted (kstall_tcp_resets_total); events: {:.0} received, {:.0} lost, {:.0} suppressed",
        tally.counted, tally.received, tally.lost, tally.suppressed
    );
    println!(
        "agent CPU: {:.1}% of one core, {:.2} us per reset",
        100.0 * cpu_secs / run.elapsed.as_secs_f64(),
        1e6 * cpu_secs / expected as f64
    );
    println!("agent memory: VmRSS {rss} KiB, VmHWM {hwm} KiB");
    let verified = verified_instructions_of(agent.pid());
    for p in bpf_programs(&["tcp_send_reset", "tcp_receive_res"]) {
        let (ns, runs) = (p["run_time_ns"].as_f64().unwrap_or(0.0), p["run_cnt"].as_f64().unwrap_or(0.0));
        // What the verifier walked to load it (kernel 5.16+): its cost at every agent start.
        let verified = p["id"].as_u64().and_then(|id| verified.get(&id));
        let verified = verified.map(|n| format!(", {n} instructions verified")).unwrap_or_default();
        println!(
            "kernel program {}: {:.0} ns per run over {runs:.0} runs{verified}",
            p["name"],
            ns / runs.max(1.0)
        );
    }
    assert_eq!(tally.counted, expected as f64, "every reset is counted");
    assert_eq!(
        tally.received + tally.lost + tally.suppressed,
        expected as f64,
        "every reset is an event received, lost or suppressed"
    );
}

/// The agent's figures for tcp-reset.
struct Tally {
    counted: f64,
    received: f64,
    lost: f64,
    suppressed: f64,
}

impl Tally {
    fn of(agent: &Agent) -> Self {
        let metrics = agent.metrics();
        let probe = |name: &str| sample_with(&metrics, name, &[("probe", "tcp-reset")]).unwrap_or(0.0);
        let counted = metrics
            .lines()
            .filter(|l| l.starts_with("kstall_tcp_resets_total{"))
            .filter_map(|l| l.rsplit_once(' ').and_then(|(_, v)| v.parse::<f64>().ok()))
            .sum();
        Tally {
            counted,
            received: probe("kstall_events_total"),
            lost: probe("kstall_events_lost_total"),
            suppressed: probe("kstall_events_suppressed_total"),
        }
    }

    fn minus(&self, before: &Tally) -> Tally {
        Tally {
            counted: self.counted - before.counted,
            received: self.received - before.received,
            lost: self.lost - before.lost,
            suppressed: self.suppressed - before.suppressed,
        }
    }
}

struct Storm {
    connects: u64,
    elapsed: Duration,
}

impl Storm {
    fn rate(&self) -> f64 {
        self.connects as f64 / self.elapsed.as_secs_f64()
    }
}

/// `THREADS` threads in the namespace connecting to the redirected port for `secs` seconds.
fn storm(ns: &NetNs, secs: u64) -> Storm {
    let connects = AtomicU64::new(0);
    let start = Instant::now();
    let deadline = start + Duration::from_secs(secs);
    thread::scope(|s| {
        for _ in 0..THREADS {
            let connects = &connects;
            s.spawn(move || {
                let n = ns.run_inside(move || {
                    let addr = SocketAddr::from(([127, 0, 0, 1], 2049));
                    let mut n = 0u64;
                    while Instant::now() < deadline {
                        let refused = TcpStream::connect(addr)
                            .is_err_and(|e| e.kind() == std::io::ErrorKind::ConnectionRefused);
                        assert!(refused, "connect to the redirected port must be refused");
                        n += 1;
                    }
                    n
                });
                connects.fetch_add(n, Ordering::Relaxed);
            });
        }
    });
    Storm { connects: connects.into_inner(), elapsed: start.elapsed() }
}
