//! Stuck-task sweep cost: the sampler walks every task of a node with 10,000 tasks, of which 0, 50
//! and 1,000 are stuck (threads in a real killable wait on a frozen disk). Prints, for each, the
//! kernel CPU time per sweep (the agent's own measurement, and the program's run time from
//! `bpf_stats`) and the agent's CPU per sweep and as a share of a core at the default 5 s
//! interval. Targets: under 5 ms of kernel time for 10,000 tasks and 0 stuck; the agent under 1%
//! of a core. Root; `KSTALL_BENCH_SWEEPS` sets the sweeps measured per case (default 4).

use std::{
    os::unix::fs::FileExt,
    sync::{Arc, Barrier, mpsc},
    thread,
    time::{Duration, Instant},
};

use kstall_tests::{
    agent::Agent,
    bpf::bpf_programs,
    host::{Sysctl, cpu_ticks, wait_for},
    kernel_tests_can_run,
    writeback::FreezableDisk,
};

const TASKS: usize = 10_000;
const INTERVAL_SECS: u64 = 5;

fn main() {
    if !kernel_tests_can_run("stuck_sweep") {
        return;
    }
    let sweeps: u64 = std::env::var("KSTALL_BENCH_SWEEPS").ok().and_then(|s| s.parse().ok()).unwrap_or(4);
    let disk = FreezableDisk::new("sweep-bench");
    disk.prepare_read_file();
    let file = Arc::new(disk.open_read_file());
    let mut agent = Agent::start(&[
        "--stuck-task-interval",
        &format!("{INTERVAL_SECS}s"),
        "--stuck-task-threshold",
        "2s",
        "--stuck-task-max-reports",
        "1000",
    ]);
    // Idle threads (asleep interruptibly) bring the node to 10,000 tasks.
    let (release_idle, idle_rx) = mpsc::channel::<()>();
    let idle_rx = Arc::new(std::sync::Mutex::new(idle_rx));
    let idle_count = TASKS.saturating_sub(tasks_now());
    let idle: Vec<_> = (0..idle_count)
        .map(|_| {
            let rx = idle_rx.clone();
            thread::Builder::new()
                .stack_size(64 << 10)
                .spawn(move || drop(rx.lock().map(|rx| rx.recv())))
                .unwrap()
        })
        .collect();
    println!("stuck-task sweep, {INTERVAL_SECS} s interval, {sweeps} sweeps a case");
    for stuck in [0usize, 50, 1_000] {
        disk.drop_read_cache();
        disk.freeze();
        let ready = Arc::new(Barrier::new(stuck + 1));
        let readers: Vec<_> = (0..stuck)
            .map(|_| {
                let (file, ready) = (file.clone(), ready.clone());
                thread::Builder::new()
                    .stack_size(64 << 10)
                    .spawn(move || {
                        ready.wait();
                        let mut page = [0u8; 4096];
                        // Waits killably for the page until the disk thaws.
                        let _ = file.read_at(&mut page, 0);
                    })
                    .unwrap()
            })
            .collect();
        ready.wait();
        let total = tasks_now();
        // Every stuck reader reported (the sweep after the threshold), then measured sweeps only.
        let reported = wait_for(Duration::from_secs(60), || {
            (agent.metric("kstall_stuck_task_sweep_uninterruptible").unwrap_or(0.0) >= stuck as f64
                && stuck_in_set(&agent) >= stuck as f64)
                .then_some(())
        });
        assert!(
            reported.is_some(),
            "{stuck} stuck readers reported: {} asleep uninterruptibly, {} in the set, {:?} over the limit",
            agent.metric("kstall_stuck_task_sweep_uninterruptible").unwrap_or(0.0),
            stuck_in_set(&agent),
            agent.metric("kstall_stuck_task_reports_over_limit_total"),
        );
        // Agent and kernel CPU with the kernel's per-program statistics off (they cost time).
        let (count0, sum0) = sweep_seconds(&agent);
        let cpu0 = cpu_ticks(agent.pid());
        let started = Instant::now();
        // Not polled meanwhile: a scrape costs the agent CPU too, which would be counted here.
        thread::sleep(Duration::from_secs(INTERVAL_SECS * sweeps) + Duration::from_millis(500));
        let elapsed = started.elapsed().as_secs_f64();
        let cpu = (cpu_ticks(agent.pid()) - cpu0) / unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
        let (count1, sum1) = sweep_seconds(&agent);
        let n = count1 - count0;
        assert!(n >= 1.0, "no sweep in {elapsed:.1} s");
        // Then the program's own share, with them on.
        let stats = Sysctl::set("kernel.bpf_stats_enabled", "1");
        let prog0 = program_time();
        thread::sleep(Duration::from_secs(INTERVAL_SECS * 2));
        let prog1 = program_time();
        drop(stats);
        let runs = (prog1.1 - prog0.1).max(1.0);
        println!(
            "{total:>6} tasks, {stuck:>5} stuck: kernel {:.2} ms a sweep (of which the program {:.2} ms, {:.0} ns a \
             task); agent {:.2} ms CPU a sweep, {:.2}% of a core",
            1e3 * (sum1 - sum0) / n,
            (prog1.0 - prog0.0) / 1e6 / (runs / total as f64).max(1.0),
            (prog1.0 - prog0.0) / runs,
            1e3 * cpu / n,
            100.0 * cpu / elapsed,
        );
        disk.thaw();
        for r in readers {
            r.join().unwrap();
        }
        let cleared = wait_for(Duration::from_secs(30), || (stuck_in_set(&agent) == 0.0).then_some(()));
        assert!(cleared.is_some(), "the readers cleared after the thaw");
    }
    drop(release_idle);
    for t in idle {
        t.join().unwrap();
    }
    assert_eq!(agent.stop(), Some(0), "{}", agent.log());
}

/// Tasks on the node now (every thread of every process).
fn tasks_now() -> usize {
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .map(|pid| std::fs::read_dir(format!("/proc/{pid}/task")).map_or(0, |d| d.count()))
        .sum()
}

/// (count, sum) of `kstall_stuck_task_sweep_kernel_seconds`.
fn sweep_seconds(agent: &Agent) -> (f64, f64) {
    let m = |name: &str| agent.metric(name).unwrap_or(0.0);
    (m("kstall_stuck_task_sweep_kernel_seconds_count"), m("kstall_stuck_task_sweep_kernel_seconds_sum"))
}

/// Stuck tasks the agent holds (any pod, any wait).
fn stuck_in_set(agent: &Agent) -> f64 {
    agent
        .metrics()
        .lines()
        .filter(|l| l.starts_with("kstall_stuck_tasks{"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// (run_time_ns, run_cnt) of the sampler's program.
fn program_time() -> (f64, f64) {
    bpf_programs(&["stuck_task_swee"])
        .iter()
        .map(|p| (p["run_time_ns"].as_f64().unwrap_or(0.0), p["run_cnt"].as_f64().unwrap_or(0.0)))
        .fold((0.0, 0.0), |a, b| (a.0 + b.0, a.1 + b.1))
}
