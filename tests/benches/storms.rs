//! The storms, each beside a bpftrace one-liner counting on the same hooks in the same run: what
//! the agent counted, lost and suppressed, what it cost in CPU, memory and eBPF run time, and how
//! that compares. Real kernel, real agent (root). Prints one table; with `KSTALL_BENCH_RESULTS`
//! set (by `cargo xtask bench`), writes it there with the machine it ran on.
//! `KSTALL_BENCH_SECS` sets the reset storm's length, `KSTALL_BENCH_STORMS` picks storms, and the
//! idle row (an agent left alone) lasts `KSTALL_BENCH_IDLE_SECS` (60). The capture row is a pod's
//! TCP stream without a capture, under `kstall capture` and under tcpdump, in the same run.

use kstall_tests::{
    bpftrace::Tracefs,
    capture_cost::capture_cost,
    host::{Sysctl, run},
    kernel_tests_can_run,
    storms::{
        Detail, HUNG_ONE_LINER, HUNG_STACK_PRINTED_ONE_LINER, OOM_ONE_LINER, OOM_STACK_PRINTED_ONE_LINER,
        RESETS_BY_PORTS_ONE_LINER, RESETS_ONE_LINER, RESETS_PRINTED_ONE_LINER, Row, distinct_ports,
        drop_storm, drops_one_liner, hung_tasks, idle, oom_storm, otlp_reset_storm, reset_storm,
        streamed_reset_storm, table_with,
    },
};

fn main() {
    if !kernel_tests_can_run("storms") {
        return;
    }
    let secs: u64 = std::env::var("KSTALL_BENCH_SECS").ok().and_then(|s| s.parse().ok()).unwrap_or(10);
    // Per-program run time in the kernel; restored when the guard drops.
    let _stats = Sysctl::set("kernel.bpf_stats_enabled", "1");
    let _tracefs = Tracefs::mount();
    // `KSTALL_BENCH_STORMS=idle,resets,ports,drops,hung,oom,capture`: only these (all by default), to
    // iterate on one.
    let only = std::env::var("KSTALL_BENCH_STORMS").ok();
    let wanted = |name: &str| only.as_deref().is_none_or(|o| o.split(',').any(|w| w.trim() == name));
    let mut rows: Vec<Row> = Vec::new();
    if wanted("idle") {
        let secs = std::env::var("KSTALL_BENCH_IDLE_SECS").ok().and_then(|s| s.parse().ok()).unwrap_or(60);
        rows.push(idle(secs));
    }
    if wanted("resets") {
        rows.push(reset_storm(secs, Detail::Sampled, Some(RESETS_ONE_LINER)));
        rows.push(reset_storm(secs, Detail::Sampled, Some(RESETS_BY_PORTS_ONE_LINER)));
        rows.push(reset_storm(secs, Detail::Full, Some(RESETS_PRINTED_ONE_LINER)));
        // The same with the JSON stream on: its cost per event beside the row above.
        rows.push(streamed_reset_storm(secs, Detail::Sampled, |_| false).0);
        rows.push(streamed_reset_storm(secs, Detail::Full, |_| false).0);
        // And over OTLP to a receiver: its cost per event beside both.
        rows.push(otlp_reset_storm(secs, Detail::Sampled));
        rows.push(otlp_reset_storm(secs, Detail::Full));
    }
    if wanted("ports") {
        rows.push(distinct_ports(3000, Some(RESETS_BY_PORTS_ONE_LINER)));
        // Each reset a new series, which kstall sends in full: beside bpftrace keyed and printing
        // each, the same two jobs.
        rows.push(distinct_ports(3000, Some(RESETS_PRINTED_ONE_LINER)));
        // Two series a port: 10,000 live series.
        rows.push(distinct_ports(5000, Some(RESETS_BY_PORTS_ONE_LINER)));
    }
    if wanted("drops") {
        rows.push(drop_storm(secs, 1, Some(drops_one_liner())));
        rows.push(drop_storm(secs, 3000, None));
    }
    if wanted("hung") {
        rows.push(hung_tasks(50, Some(HUNG_ONE_LINER)));
        rows.push(hung_tasks(50, Some(HUNG_STACK_PRINTED_ONE_LINER)));
    }
    if wanted("oom") {
        rows.push(oom_storm(20, Some(OOM_ONE_LINER)));
        rows.push(oom_storm(20, Some(OOM_STACK_PRINTED_ONE_LINER)));
    }
    let mut more = Vec::new();
    if wanted("capture") {
        // Five rounds of three 5 s windows: no capture, kstall's, tcpdump's. The stream's rate
        // varies from window to window by more than a capture costs it on a busy machine.
        let cost = capture_cost(5, 5);
        assert!(
            cost.cuts().is_empty(),
            "capture: kstall's capture was cut inside its window: {:?}",
            cost.cuts()
        );
        more.push(cost.line());
    }
    let table = table_with(&rows, &more);
    println!("{table}");
    if let Ok(path) = std::env::var("KSTALL_BENCH_RESULTS") {
        std::fs::write(&path, format!("{}\n{table}", machine())).unwrap_or_else(|e| panic!("{path}: {e}"));
        println!("written to {path}");
    }
    for r in &rows {
        assert!(r.exact(), "{}: {} {} driven, {} counted", r.scenario, r.driven, r.unit, r.counted);
        assert!(r.accounted(), "{}: events received + lost + suppressed != {} driven", r.scenario, r.driven);
        assert!(r.held_to_limit(), "{}: the agent outgrew its {} MiB limit", r.scenario, r.limit_bytes >> 20);
    }
}

/// The heading of the storms' section of `bench/results.md`: when, on what, and what was measured.
fn machine() -> String {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let model = cpuinfo
        .lines()
        .find_map(|l| l.strip_prefix("model name"))
        .map(|m| m.trim_start_matches([' ', '\t', ':']));
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    let mem_kib: u64 = meminfo
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0);
    format!(
        "## Storms\n\n\
         Written by `cargo xtask bench` (`tests/benches/storms.rs`); every figure is from one run.\n\n\
         - When: {}\n- kstall: {}\n- Machine: {} cores, {} ({:.0} GiB)\n- Kernel: {}\n- bpftrace: {}\n\
         - tcpdump: {}\n\n\
         eBPF run time is the kernel's own (`kernel.bpf_stats_enabled`), per run of each program that \
         ran during the storm; bpftrace counts the same storm on the same hooks with one-liners \
         (`count()`; distinct pids for hung tasks). The ratio compares run time per run on the hooks \
         both attach to. Agent CPU is its threads' run time (`/proc/<pid>/task/*/schedstat`, to the \
         nanosecond) over the storm, from an agent done starting (kernel symbols loaded, first sweep). The idle row \
         is an agent started as for the storms and left alone once started (no events, no scrape); \
         its wakeups are its threads' voluntary context switches (`/proc/<pid>/task/*/status`). \
         The capture row is one TCP stream from a pod's network namespace over a veth to a server's, as \
         fast as the machine sends it, measured (bytes the server read) in 5 s windows, five rounds whose \
         order turns: with no capture, while `kstall capture start --standalone` captures the pod's \
         namespace (headers only, its default; one socket on each interface, filter `tcp and host \
         10.0.0.1 and port 5001`), and while `tcpdump -i any -s 96 -w` captures the same with the same \
         filter from inside it, each writing to a tmpfs of its own and stopped with SIGINT after its \
         window (start and bundle outside it). Its columns: the stream's rate with no capture; under \
         kstall; the packets kstall's sockets accepted, the kernel dropped and kstall wrote (its \
         manifest); the capturing process's CPU (utime + stime over the window) and memory; tcpdump's \
         rate, packets written and dropped (what it says on exit) and CPU; kstall's CPU ÷ tcpdump's. The \
         kernel's share of either (the filter, the copy to the socket or ring) runs in the stream's own \
         softirqs: it is in the rate, not in the capturer's CPU. Medians of the rounds, each round in the \
         notes. With no capture running kstall holds no packet socket \
         (`an_agent_holds_no_packet_socket_until_asked`), so costs the stream nothing.\n",
        run("date", &["-u", "+%Y-%m-%d %H:%M UTC"]).trim(),
        std::env::var("KSTALL_BENCH_REVISION").unwrap_or_else(|_| "unknown revision".into()),
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        model.unwrap_or("unknown CPU"),
        mem_kib as f64 / (1 << 20) as f64,
        run("uname", &["-r"]).trim(),
        run("bpftrace", &["--version"]).trim(),
        run("tcpdump", &["--version"]).lines().next().unwrap_or_default(),
    )
}
