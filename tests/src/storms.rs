//! The storms `cargo xtask bench` drives through the real kernel and a real agent, each measured
//! beside a bpftrace one-liner counting on the same hooks in the same run; the storms smoke test
//! drives them small and checks that the agent counted every event. Each storm gets a fresh
//! agent, so its memory and series are that storm's alone, held to the DaemonSet's memory limit
//! from its first instruction, as the kubelet holds it.

use std::{
    net::{SocketAddr, TcpStream},
    path::Path,
    sync::atomic::{AtomicU64, Ordering},
    thread,
    time::{Duration, Instant},
};

use crate::{
    START_WITHIN,
    agent::{Agent, COUNTED_WITHIN, LimitedAgent, pod_json, write_pods_file},
    bpf::{ProgramRuns, program_runs_of},
    bpftrace::{Bpftrace, Counted},
    cgroup::{Cgroup, MemoryLimit, PodProcess},
    host::{PerThread, Sysctl, memory_kib, wait_for},
    json_lines::{Followed, Follower},
    netns::{NetNs, refused_connects},
    oom::{OOM_LIMIT, oom_kill},
    writeback::FreezableDisk,
};

/// One storm's figures: what was driven, what the agent and bpftrace made of it, and the cost.
#[derive(Debug)]
pub struct Row {
    pub scenario: String,
    /// What one driven event is: "resets", "kills", "stuck tasks".
    pub unit: &'static str,
    pub driven: u64,
    /// How long driving took.
    pub elapsed: Duration,
    /// From the storm's start until the agent had counted it: what its CPU is measured over.
    pub window: Duration,
    /// The counter's growth (the sum of its series).
    pub counted: f64,
    pub received: f64,
    pub lost: f64,
    pub suppressed: f64,
    pub agent_cpu_secs: f64,
    pub rss_kib: u64,
    /// The agent's peak resident size (VmHWM) since it started, start-up included.
    pub peak_kib: u64,
    /// The memory limit it ran under (the DaemonSet's), and the OOM kills there: 0, or it died.
    pub limit_bytes: u64,
    pub agent_oom_kills: u64,
    /// The counter's series after the storm.
    pub series: usize,
    /// Records the agent's `--export-events` stream dropped during the storm.
    pub export_dropped: f64,
    /// The agent's programs that ran during the storm.
    pub kstall: Vec<ProgramRuns>,
    pub bpftrace: Option<SideBySide>,
    /// Whether each driven event is one event from the kernel (a reset, a kill), so that those
    /// received, lost and suppressed must add up to what was driven. A stuck task is reported
    /// again at every detector check.
    pub one_event_each: bool,
    /// What else the storm measured, one sentence each.
    pub notes: Vec<String>,
    /// How often the agent's threads went to sleep and were woken again, per second (their
    /// voluntary context switches): measured for the idle row.
    pub wakeups_per_sec: Option<f64>,
}

/// bpftrace counting the same storm on the same hooks.
#[derive(Debug)]
pub struct SideBySide {
    pub counted: u64,
    pub programs: Vec<ProgramRuns>,
}

impl Row {
    pub fn rate(&self) -> f64 {
        self.driven as f64 / self.elapsed.as_secs_f64()
    }

    /// Whether the counter grew by exactly what was driven.
    pub fn exact(&self) -> bool {
        self.counted == self.driven as f64
    }

    /// Whether every event is accounted for: received, lost or suppressed.
    pub fn accounted(&self) -> bool {
        !self.one_event_each || self.received + self.lost + self.suppressed == self.driven as f64
    }

    /// Whether the agent lived through the storm within its memory limit.
    pub fn held_to_limit(&self) -> bool {
        self.agent_oom_kills == 0 && self.peak_kib << 10 < self.limit_bytes
    }

    /// kstall's and bpftrace's run time per run on the hooks both attach to, and their ratio.
    pub fn ratio(&self) -> Option<(f64, f64, f64)> {
        let theirs = &self.bpftrace.as_ref()?.programs;
        let ours: Vec<&ProgramRuns> =
            self.kstall.iter().filter(|p| theirs.iter().any(|t| t.same_hook(p))).collect();
        let per_run = |ps: &[&ProgramRuns]| {
            let runs: u64 = ps.iter().map(|p| p.runs).sum();
            (runs > 0).then(|| ps.iter().map(|p| p.run_time_ns).sum::<u64>() as f64 / runs as f64)
        };
        let (ours, theirs) = (per_run(&ours)?, per_run(&theirs.iter().collect::<Vec<_>>())?);
        Some((ours, theirs, ours / theirs))
    }
}

/// The counter a storm is counted by and the probes whose events it drives.
struct Counter {
    metric: &'static str,
    probes: &'static [&'static str],
    one_event_each: bool,
    /// A probe whose events the storm also waits for, as many as were driven: the kernel's
    /// hung-task detector, which reports a task some seconds after the sampler found it, and is
    /// what bpftrace counts.
    reported_by: Option<&'static str>,
    /// Only the series of this pod count: the kernel's own threads may get stuck behind a frozen
    /// disk too (its journal thread, say), and are counted, but were not driven.
    pod: Option<&'static str>,
}

const RESETS: Counter = Counter {
    metric: "kstall_tcp_resets_total",
    probes: &["tcp-reset"],
    one_event_each: true,
    reported_by: None,
    pod: None,
};
const OOM_KILLS: Counter = Counter {
    metric: "kstall_oom_kills_total",
    probes: &["oom"],
    one_event_each: true,
    reported_by: None,
    pod: None,
};
const DROPS: Counter = Counter {
    metric: "kstall_packet_drops_total",
    probes: &["packet-drop"],
    // One event a drop, but the probe's event totals are the node's: its own drops (a socket
    // closed with data unread) count there too. The pod's counter is the storm's alone.
    one_event_each: false,
    reported_by: None,
    // The storm's own: the host drops a packet now and then too.
    pod: Some(DROPPING_POD),
};
const STUCK_TASKS: Counter = Counter {
    metric: "kstall_stuck_tasks_total",
    probes: &["stuck-task", "hung-task"],
    one_event_each: false,
    reported_by: Some("hung-task"),
    pod: Some(WRITERS_POD),
};

/// The agent's figures for one counter.
#[derive(Default)]
struct Tally {
    counted: f64,
    series: usize,
    received: f64,
    lost: f64,
    suppressed: f64,
    /// Events of the counter's `reported_by` probe.
    reports: f64,
    /// Records an `--export-events` stream dropped.
    export_dropped: f64,
}

impl Tally {
    fn of(agent: &Agent, counter: &Counter) -> Self {
        let metrics = agent.metrics();
        let series: Vec<f64> = metrics
            .lines()
            .filter(|l| l.strip_prefix(counter.metric).is_some_and(|rest| rest.starts_with('{')))
            .filter(|l| counter.pod.is_none_or(|pod| l.contains(&format!("pod=\"{pod}\""))))
            .filter_map(|l| l.rsplit_once(' ').and_then(|(_, v)| v.parse::<f64>().ok()))
            .collect();
        let of_probes = |name: &str| {
            counter
                .probes
                .iter()
                .map(|p| crate::agent::sample_with(&metrics, name, &[("probe", p)]).unwrap_or(0.0))
                .sum::<f64>()
        };
        Tally {
            counted: series.iter().sum(),
            series: series.len(),
            received: of_probes("kstall_events_total"),
            lost: of_probes("kstall_events_lost_total"),
            suppressed: of_probes("kstall_events_suppressed_total"),
            reports: counter
                .reported_by
                .and_then(|p| crate::agent::sample_with(&metrics, "kstall_events_total", &[("probe", p)]))
                .unwrap_or(0.0),
            export_dropped: crate::agent::samples_with(&metrics, "kstall_export_records_dropped_total", &[])
                .sum(),
        }
    }
}

/// Measures `drive` (which returns how many events it drove) with a fresh agent started with
/// `agent_args`, and with `bpftrace` (a script and what to read of its maps) beside it when given.
/// The counter is awaited until it reaches what was driven or `counted_within` passes.
fn measure(
    scenario: String,
    unit: &'static str,
    counter: &Counter,
    agent: (&[(&str, &str)], &[&str]),
    bpftrace: Option<OneLiner>,
    counted_within: Duration,
    drive: impl FnOnce() -> u64,
) -> Row {
    let (agent_env, agent_args) = agent;
    let agent = LimitedAgent::start_with_env("storm-agent", agent_env, agent_args);
    // Start-up's own work (a third of a second of CPU reading kernel symbols) is not the storm's.
    settle(&agent, &scenario);
    let before = Tally::of(&agent, counter);
    let programs_before = program_runs_of(agent.pid());
    let cpu_before = PerThread::cpu_ns(agent.pid());
    let side = bpftrace.map(|one| (Bpftrace::start(one.script), one.counted));
    let start = Instant::now();
    let driven = drive();
    let elapsed = start.elapsed();
    assert_eq!(agent.oom_kills(), 0, "{scenario}: the agent was OOM-killed at its memory limit");
    // Every event accounted for too: one still in the ring buffer when the count is complete is
    // neither received nor lost yet.
    let complete = |t: &Tally| {
        t.counted - before.counted >= driven as f64
            && (counter.reported_by.is_none() || t.reports - before.reports >= driven as f64)
            && (!counter.one_event_each
                || (t.received - before.received)
                    + (t.lost - before.lost)
                    + (t.suppressed - before.suppressed)
                    >= driven as f64)
    };
    // The agent reads the kernel's counters once a second: each scrape before that would only
    // add to the CPU it is charged with. The CPU is read before the scrape that finds the
    // counter complete.
    let deadline = Instant::now() + counted_within;
    let (after, cpu_after, window) = loop {
        thread::sleep(COUNTER_INTERVAL);
        let (cpu, window) = (PerThread::cpu_ns(agent.pid()), start.elapsed());
        let tally = Tally::of(&agent, counter);
        if complete(&tally) || Instant::now() >= deadline {
            break (tally, cpu, window);
        }
    };
    let kstall = program_runs_of(agent.pid())
        .iter()
        .map(|p| p.since(&programs_before))
        .filter(|p| p.runs > 0)
        .collect();
    let bpftrace = side.map(|(trace, read)| {
        let programs = trace.programs();
        SideBySide { counted: read(&trace.stop()), programs }
    });
    let (rss_kib, peak_kib) = memory_kib(agent.pid());
    Row {
        scenario,
        unit,
        driven,
        elapsed,
        window,
        counted: after.counted - before.counted,
        received: after.received - before.received,
        lost: after.lost - before.lost,
        suppressed: after.suppressed - before.suppressed,
        agent_cpu_secs: Duration::from_nanos(cpu_after.since(&cpu_before)).as_secs_f64(),
        rss_kib,
        peak_kib,
        limit_bytes: agent.limit_bytes(),
        agent_oom_kills: agent.oom_kills(),
        series: after.series,
        export_dropped: after.export_dropped - before.export_dropped,
        kstall,
        bpftrace,
        one_event_each: counter.one_event_each,
        notes: Vec::new(),
        wakeups_per_sec: None,
    }
}

/// Until `agent` is done starting: kernel symbols loaded, its first stuck-task sweep done.
fn settle(agent: &Agent, scenario: &str) {
    let settled = agent.log_once_it_has("loaded kernel symbols", START_WITHIN).is_some()
        && wait_for(START_WITHIN, || (agent.metric("kstall_stuck_task_sweeps_total")? >= 1.0).then_some(()))
            .is_some();
    assert!(settled, "{scenario}: the agent did not finish starting:\n{}", agent.log());
}

/// The agent of a node where nothing happens: started as for the storms, settled (start-up done:
/// kernel symbols loaded, the first stuck-task sweep), then left alone for `secs` — no traffic,
/// no scrape. Its CPU (its threads') and its threads' wakeups over that time are the row; events
/// the host itself caused meanwhile are counted in its notes.
pub fn idle(secs: u64) -> Row {
    let agent = LimitedAgent::start("idle-agent", &[]);
    settle(&agent, "idle");
    let events = |agent: &Agent| {
        ["kstall_events_total", "kstall_events_lost_total", "kstall_events_suppressed_total"]
            .iter()
            .map(|name| agent.metric_sum(name, &[]))
            .sum::<f64>()
    };
    let events_before = events(&agent);
    let programs_before = program_runs_of(agent.pid());
    let (cpu_before, switches_before) =
        (PerThread::cpu_ns(agent.pid()), PerThread::voluntary_switches(agent.pid()));
    let start = Instant::now();
    // The measurement itself: nothing to await, the agent is left alone.
    thread::sleep(Duration::from_secs(secs));
    let (cpu_after, switches_after) =
        (PerThread::cpu_ns(agent.pid()), PerThread::voluntary_switches(agent.pid()));
    let window = start.elapsed();
    let arrived = events(&agent) - events_before;
    let kstall = program_runs_of(agent.pid())
        .iter()
        .map(|p| p.since(&programs_before))
        .filter(|p| p.runs > 0)
        .collect();
    let (rss_kib, peak_kib) = memory_kib(agent.pid());
    let wakeups = switches_after.since(&switches_before);
    let scenario = format!("idle (no events, {secs} s after start-up)");
    let mut notes = Vec::new();
    if arrived > 0.0 {
        notes.push(format!("{scenario}: {arrived} events from the host itself arrived meanwhile"));
    }
    Row {
        scenario,
        unit: "events",
        driven: 0,
        elapsed: window,
        window,
        counted: 0.0,
        received: arrived,
        lost: 0.0,
        suppressed: 0.0,
        agent_cpu_secs: Duration::from_nanos(cpu_after.since(&cpu_before)).as_secs_f64(),
        rss_kib,
        peak_kib,
        limit_bytes: agent.limit_bytes(),
        agent_oom_kills: agent.oom_kills(),
        series: 0,
        export_dropped: 0.0,
        kstall,
        bpftrace: None,
        one_event_each: false,
        notes,
        wakeups_per_sec: Some(wakeups as f64 / window.as_secs_f64()),
    }
}

/// A bpftrace one-liner counting a storm on kstall's hooks, and how to read its count.
#[derive(Clone, Copy)]
pub struct OneLiner {
    /// What it counts by, for the storm's name; empty for the plain count.
    by: &'static str,
    script: &'static str,
    counted: fn(&Counted) -> u64,
}

/// The yardstick: one count, no key.
pub const RESETS_ONE_LINER: OneLiner = OneLiner {
    by: "",
    script: "tracepoint:tcp:tcp_send_reset { @resets = count(); } \
             tracepoint:tcp:tcp_receive_reset { @resets = count(); }",
    counted: |c| c.total("resets"),
};

/// Counting by a key as kstall does — direction, the refusing port (sent) or the remote port
/// (received), and the reason; kstall adds netns and original port: a per-CPU hash lookup a
/// reset, the part of kstall's cost that a count without a key does not pay. The sent reset's
/// port is in its `sockaddr`, big-endian.
pub const RESETS_BY_PORTS_ONE_LINER: OneLiner = OneLiner {
    by: ", bpftrace counting by direction, port and reason",
    script: "tracepoint:tcp:tcp_send_reset { @sent[args->reason, (uint16)args->saddr[2] << 8 | args->saddr[3]] = count(); } \
             tracepoint:tcp:tcp_receive_reset { @received[args->dport] = count(); }",
    counted: |c| c.total("sent") + c.total("received"),
};

/// The yardstick of the row where kstall sends every reset in full: bpftrace keyed as above and
/// printing each reset as it goes (`printf`: a perf buffer record per reset, read by bpftrace and
/// written out), the same two jobs. What it counted is what it printed.
pub const RESETS_PRINTED_ONE_LINER: OneLiner = OneLiner {
    by: ", bpftrace counting by direction, port and reason and printing each reset",
    script: "tracepoint:tcp:tcp_send_reset { $port = (uint16)args->saddr[2] << 8 | args->saddr[3]; \
             @sent[args->reason, $port] = count(); printf(\"sent %d %d %d\\n\", pid, args->reason, $port); } \
             tracepoint:tcp:tcp_receive_reset { @received[args->dport] = count(); \
             printf(\"received %d %d\\n\", pid, args->dport); }",
    counted: |c| c.printed,
};

/// Distinct tasks the kernel's hung-task detector reported.
pub const HUNG_ONE_LINER: OneLiner = OneLiner {
    by: "",
    script: "tracepoint:sched:sched_process_hang { @stuck[args->pid] = count(); }",
    counted: |c| c.keys("stuck"),
};

/// As [`HUNG_ONE_LINER`], doing what kstall does at each report: a kernel stack walked
/// (`kstack`: bpftrace's `bpf_get_stackid`, khungtaskd's own stack; kstall's is the hung task's;
/// its map entry deleted at once, as an `END` probe is no program bpftrace attaches) and a record
/// sent to userspace (`printf`: a perf buffer record that wakes bpftrace). On a rare event these
/// two are the cost: the walk, and the wakeup (an interrupt raised on the CPU and the reader
/// woken, ~17 µs of an OOM kill's 35 on this virtualised machine: profiled by removing each part
/// of kstall's program in turn, issue 58).
pub const HUNG_STACK_PRINTED_ONE_LINER: OneLiner = OneLiner {
    by: ", bpftrace walking the kernel stack and printing each",
    script: "tracepoint:sched:sched_process_hang { @stuck[args->pid] = count(); @stack[0] = kstack; \
             delete(@stack[0]); printf(\"hung %d\\n\", args->pid); }",
    counted: |c| c.keys("stuck"),
};

/// Each memcg OOM kill.
pub const OOM_ONE_LINER: OneLiner = OneLiner {
    by: "",
    script: "tracepoint:oom:mark_victim { @kills = count(); }",
    counted: |c| c.total("kills"),
};

/// As [`OOM_ONE_LINER`], doing what kstall does at each kill (see
/// [`HUNG_STACK_PRINTED_ONE_LINER`]): the OOM killer's call path walked, a record sent.
pub const OOM_STACK_PRINTED_ONE_LINER: OneLiner = OneLiner {
    by: ", bpftrace walking the kernel stack and printing each",
    script: "tracepoint:oom:mark_victim { @kills = count(); @stack[0] = kstack; delete(@stack[0]); \
             printf(\"kill %d\\n\", args->pid); }",
    counted: |c| c.total("kills"),
};

/// How often the agent reads the kernel's counters (`agent/src/probes/counters.rs`).
const COUNTER_INTERVAL: Duration = Duration::from_secs(1);

/// How many of a storm's resets the agent has the kernel send in full.
#[derive(Clone, Copy)]
pub enum Detail {
    /// The default: the first of a series per CPU per second, the rest only counted.
    Sampled,
    /// Every one, and counted too: what a reset costs on the full-detail path.
    Full,
}

impl Detail {
    fn agent_args(self) -> &'static [&'static str] {
        match self {
            Detail::Sampled => &[],
            // The largest budget short of `all`, which would stop the counting in the kernel.
            Detail::Full => &["--sample-events", "4294967294"],
        }
    }

    fn what(self) -> &'static str {
        match self {
            Detail::Sampled => "",
            Detail::Full => ", every reset sent in full",
        }
    }
}

/// Threads connecting from a network namespace to port 2049, redirected to the closed 15001 (a
/// sidecar's rule without its proxy), for `secs`: one sent and one received reset per connect.
/// Measured first without the agent, for the slowdown it causes.
pub fn reset_storm(secs: u64, detail: Detail, bpftrace: Option<OneLiner>) -> Row {
    reset_storm_with(secs, detail, (&[], &[]), "", bpftrace)
}

/// The reset storm with what the kernel sends of it written as JSON lines to a file that rotates
/// every 64 KiB (`--export-events`), followed as a log shipper follows it: the row (its notes say
/// what the stream carried), and what the follower read and kept.
pub fn streamed_reset_storm(
    secs: u64,
    detail: Detail,
    keep: fn(&serde_json::Value) -> bool,
) -> (Row, Followed) {
    let dir = tempfile::tempdir().expect("a directory for the events file");
    let path = dir.path().join("events.jsonl");
    let sink = format!("file:{}", path.display());
    // Enough rotated files that none is removed before the follower found it.
    let args =
        ["--export-events", &sink, "--export-events-max-bytes", "64K", "--export-events-max-files", "100"];
    let follower = Follower::start(&path, 100, keep);
    // The agent is stopped (and its stream flushed) when the row is made.
    let mut row = reset_storm_with(secs, detail, (&[], &args), ", as JSON lines to a rotating file", None);
    let followed = follower.finish();
    row.notes.push(format!(
        "{}: {} records read back from {} files, {} missing from seq; the agent counted {} dropped \
         by the time the storm was counted; {:.2} µs of agent CPU per event received",
        row.scenario,
        followed.seqs.len(),
        followed.files,
        followed.seq_gaps(),
        row.export_dropped,
        1e6 * row.agent_cpu_secs / row.received.max(1.0),
    ));
    (row, followed)
}

/// The reset storm with every record sent over OTLP/gRPC to a receiver on the host (tests/src/otlp.rs):
/// the row, its notes saying what the receiver took and what the agent counted as dropped.
pub fn otlp_reset_storm(secs: u64, detail: Detail) -> Row {
    let receiver = crate::otlp::Receiver::start(crate::otlp::Protocol::Grpc, None);
    let endpoint = receiver.endpoint(false);
    let env = [("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"), ("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint.as_str())];
    // The agent is stopped (its last batch sent) when the row is made.
    let mut row =
        reset_storm_with(secs, detail, (&env, &["--export-otlp", "on"]), ", as OTLP logs over gRPC", None);
    let records = receiver.records();
    row.notes.push(format!(
        "{}: {} records taken by the receiver in {} exports; the agent counted {} dropped by the time \
         the storm was counted; {:.2} µs of agent CPU per event received",
        row.scenario,
        records.len(),
        receiver.received().len(),
        row.export_dropped,
        1e6 * row.agent_cpu_secs / row.received.max(1.0),
    ));
    row
}

fn reset_storm_with(
    secs: u64,
    detail: Detail,
    (env, extra_args): (&[(&str, &str)], &[&str]),
    what: &str,
    bpftrace: Option<OneLiner>,
) -> Row {
    let ns = NetNs::new("storm");
    ns.redirect_tcp("iptables", 2049, 15001);
    let without = connect_storm(&ns, secs);
    let mut with = 0.0;
    let args: Vec<&str> = detail.agent_args().iter().chain(extra_args).copied().collect();
    let mut row = measure(
        format!(
            "reset storm (2049 redirected to 15001, in a netns){}{what}{}",
            detail.what(),
            bpftrace.map_or("", |b| b.by)
        ),
        "resets",
        &RESETS,
        (env, &args),
        bpftrace,
        COUNTED_WITHIN,
        || {
            let (connects, elapsed) = connect_storm(&ns, secs);
            with = connects as f64 / elapsed.as_secs_f64();
            2 * connects
        },
    );
    let without = without.0 as f64 / without.1.as_secs_f64();
    row.notes.push(format!(
        "{}: {without:.0} connects/s without the agent, {with:.0} with it: {:.1}% slower",
        row.scenario,
        100.0 * (1.0 - with / without)
    ));
    row
}

/// Connects from `THREADS` threads in `ns` to its port 2049 until `secs` pass; how many and for
/// how long.
fn connect_storm(ns: &NetNs, secs: u64) -> (u64, Duration) {
    const THREADS: usize = 2;
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
    (connects.into_inner(), start.elapsed())
}

/// One connect to each of `ports` distinct closed ports in a fresh network namespace (a port
/// scan, a misconfigured client), every one kept by number: two series per port. Beside it,
/// `bpftrace` when given: keyed by port as kstall is, a new key (a map insert) per port on both
/// sides.
pub fn distinct_ports(ports: u16, bpftrace: Option<OneLiner>) -> Row {
    let ns = NetNs::new("ports");
    measure(
        format!("resets to {ports} distinct ports{}", bpftrace.map_or("", |b| b.by)),
        "resets",
        &RESETS,
        // Every port kept by number and room for all: the cost of many live series.
        (&[], &["--metric-ports", "20000-29999", "--max-series-per-metric", "20000"]),
        bpftrace,
        COUNTED_WITHIN,
        || {
            // Every port is closed in a fresh namespace.
            ns.run_inside(move || {
                for port in 20000..20000 + ports {
                    refused_connects(SocketAddr::from(([127, 0, 0, 1], port)), 1);
                }
            });
            2 * u64::from(ports)
        },
    )
}

/// The pod whose network policy drops the drop storms' datagrams.
const DROPPING_POD: &str = "storm-dropped-5f6a";
const DROPPING_UID: &str = "6b1c2d3e-4f5a-4b6c-9d7e-8f9a0b1c2d3e";
const DROPPING_CONTAINER: &str = "d20bd20bd20bd20bd20bd20bd20bd20bd20bd20bd20bd20bd20bd20bd20bd20b";

/// UDP datagrams a pod sends for `secs` from two threads to ports its network policy drops (an
/// OUTPUT DROP rule in its namespace): to one well-known port, or spread over `ports` ports
/// outside the ephemeral range (a scan: the series budget's test). Driven is what the rule's own
/// counter says it dropped; bpftrace, when given, counts beside the agent (their run times, and
/// both exact). What the drops cost the sender: with bpftrace given, in rounds of windows with
/// nothing on the hook, kstall alone and bpftrace alone ([`drop_loss`]); without, one window
/// without the agent before the storm's.
pub fn drop_storm(secs: u64, ports: u16, bpftrace: Option<OneLiner>) -> Row {
    let dir = tempfile::tempdir().expect("a folder for the pods file");
    let pods_file = dir.path().join("pods.json");
    write_pods_file(&pods_file, &[pod_json(DROPPING_UID, DROPPING_POD, DROPPING_CONTAINER)]);
    let agent_args = ["--pods-file", pods_file.to_str().expect("a UTF-8 path")];
    let container = Cgroup::kubepods_container("burstable", DROPPING_UID, DROPPING_CONTAINER);
    let ns = NetNs::new("drops");
    let _sandbox = PodProcess::start(&ns, &container.procs());
    let first = if ports == 1 { DISCARD } else { SCANNED_FROM };
    let range = if ports == 1 { DISCARD.to_string() } else { format!("{first}:{}", first + ports - 1) };
    ns.exec("iptables", &["-A", "OUTPUT", "-p", "udp", "--dport", &range, "-j", "DROP"]);
    let storm = DropStorm { ns: &ns, first, ports };
    let without = bpftrace.is_none().then(|| storm.rate(secs));
    let mut with = 0.0;
    let scenario = match ports {
        1 => format!(
            "drop storm (a pod's UDP to port {DISCARD} dropped by its policy){}",
            bpftrace.map_or("", |b| b.by)
        ),
        n => format!("drops to {n} distinct ports (one policy rule)"),
    };
    let mut row = measure(scenario, "drops", &DROPS, (&[], &agent_args), bpftrace, COUNTED_WITHIN, || {
        let before = dropped_by_rule(&ns);
        let (sent, elapsed) = send_storm(&ns, secs, first, ports);
        with = sent as f64 / elapsed.as_secs_f64();
        dropped_by_rule(&ns) - before
    });
    let note = match (without, bpftrace) {
        (Some(without), _) => format!(
            "{}: {without:.0} datagrams/s without the agent, {with:.0} with it: {:.1}% slower",
            row.scenario,
            100.0 * (1.0 - with / without)
        ),
        (None, Some(one_liner)) => {
            drop_loss(&storm, &agent_args, one_liner, DROP_LOSS_WINDOW, DROP_LOSS_ROUNDS).line(&row.scenario)
        }
        (None, None) => unreachable!("measured without the agent when bpftrace is not given"),
    };
    row.notes.push(note);
    row
}

/// The drop storm's loss rounds: three windows each (nothing, kstall, bpftrace), their order
/// turned each round, so that each takes each place once; medians, since a busy machine's rate
/// drifts between windows by as much as the hook costs.
const DROP_LOSS_ROUNDS: usize = 3;
const DROP_LOSS_WINDOW: u64 = 5;

/// A pod's datagrams to `ports` ports from `first` on, all dropped by its rule.
struct DropStorm<'a> {
    ns: &'a NetNs,
    first: u16,
    ports: u16,
}

impl DropStorm<'_> {
    /// Datagrams a second over `secs`.
    fn rate(&self, secs: u64) -> f64 {
        let (sent, elapsed) = send_storm(self.ns, secs, self.first, self.ports);
        sent as f64 / elapsed.as_secs_f64()
    }
}

/// The sender's rate with nothing on `kfree_skb`, under kstall alone (a fresh agent, started
/// and settled before its window, stopped after) and under `one_liner` alone, in each round.
fn drop_loss(
    storm: &DropStorm,
    agent_args: &[&str],
    one_liner: OneLiner,
    secs: u64,
    rounds: usize,
) -> DropLoss {
    let mut loss = DropLoss { secs, by: one_liner.by, ..DropLoss::default() };
    for round in 0..rounds {
        for place in 0..3 {
            match (round + place) % 3 {
                0 => loss.nothing.push(storm.rate(secs)),
                1 => {
                    let agent = LimitedAgent::start("drop-loss-agent", agent_args);
                    // As bpftrace's window starts once it has attached, not while it compiles.
                    settle(&agent, "drop loss");
                    loss.kstall.push(storm.rate(secs));
                }
                _ => {
                    let trace = Bpftrace::start(one_liner.script);
                    loss.bpftrace.push(storm.rate(secs));
                    trace.stop();
                }
            }
        }
    }
    loss
}

/// Datagrams a second in each window of [`drop_loss`].
#[derive(Debug, Default)]
struct DropLoss {
    secs: u64,
    by: &'static str,
    nothing: Vec<f64>,
    kstall: Vec<f64>,
    bpftrace: Vec<f64>,
}

impl DropLoss {
    /// The note under the storm's row: medians, each one's loss, kstall's above bpftrace's against
    /// the goal, and every window.
    fn line(&self, scenario: &str) -> String {
        let nothing = median(&self.nothing);
        let loss = |rates: &[f64]| 100.0 * (1.0 - median(rates) / nothing);
        let (kstall, bpftrace) = (loss(&self.kstall), loss(&self.bpftrace));
        let windows = |rates: &[f64]| rates.iter().map(|r| format!("{r:.0}")).collect::<Vec<_>>().join(", ");
        format!(
            "{scenario}: datagrams/s, medians of {} rounds of {} s windows: {nothing:.0} with nothing on \
             kfree_skb, {:.0} under kstall alone ({kstall:.1}% slower), {:.0} under bpftrace{} alone \
             ({bpftrace:.1}% slower): kstall's loss less bpftrace's is {:+.1} points (goal: at most +3); \
             each window: nothing {}; kstall {}; bpftrace {}",
            self.nothing.len(),
            self.secs,
            median(&self.kstall),
            median(&self.bpftrace),
            self.by.trim_start_matches(", bpftrace"),
            kstall - bpftrace,
            windows(&self.nothing),
            windows(&self.kstall),
            windows(&self.bpftrace),
        )
    }
}

fn median(values: &[f64]) -> f64 {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    match sorted.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => sorted[n / 2],
        n => (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0,
    }
}

/// The discard port: well-known, so counted by number.
const DISCARD: u16 = 9;
/// Where a scan's ports start: outside the ephemeral range, and none kept up to 3,000 on.
const SCANNED_FROM: u16 = 21000;

/// Datagrams from two threads in `ns` to `ports` ports from `first` on, round robin, until `secs`
/// pass; how many and for how long. Each is dropped on its way out (the send fails: EPERM).
fn send_storm(ns: &NetNs, secs: u64, first: u16, ports: u16) -> (u64, Duration) {
    const THREADS: usize = 2;
    let sent = AtomicU64::new(0);
    let start = Instant::now();
    let deadline = start + Duration::from_secs(secs);
    thread::scope(|s| {
        for _ in 0..THREADS {
            let sent = &sent;
            s.spawn(move || {
                let n = ns.run_inside(move || {
                    let socket = std::net::UdpSocket::bind("127.0.0.1:0").expect("a UDP socket");
                    let mut n = 0u64;
                    while Instant::now() < deadline {
                        let port = first + (n % u64::from(ports)) as u16;
                        let _ = socket.send_to(b"dropped", ("127.0.0.1", port));
                        n += 1;
                    }
                    n
                });
                sent.fetch_add(n, Ordering::Relaxed);
            });
        }
    });
    (sent.into_inner(), start.elapsed())
}

/// The packets the storm's DROP rule dropped: the kernel's own count.
fn dropped_by_rule(ns: &NetNs) -> u64 {
    let listing = ns.exec("iptables", &["-L", "OUTPUT", "-v", "-x", "-n"]);
    listing
        .lines()
        .find(|l| l.contains("DROP"))
        .and_then(|l| l.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no DROP rule in:\n{listing}"))
}

/// The yardstick for the drop storm: bpftrace counting the kernel's `kfree_skb` drops by what
/// kstall keys them by — the packet's netns (its socket's, else its device's), reason, IP protocol
/// and destination port — skipping the reasons kstall does not count: those up to `NOT_SPECIFIED`
/// (`SKB_NOT_DROPPED_YET`, from 6.12 `SKB_CONSUMED`; its number on this kernel, from the
/// tracepoint's format). The port is read as the packet holds it (big-endian): a key needs no byte
/// order.
pub fn drops_one_liner() -> OneLiner {
    let format = std::fs::read_to_string("/sys/kernel/tracing/events/skb/kfree_skb/format")
        .expect("the kfree_skb tracepoint's format (tracefs mounted)");
    let not_specified = format
        .split('{')
        .find_map(|entry| entry.split_once(", \"NOT_SPECIFIED\"").map(|(n, _)| n.trim().to_string()))
        .expect("NOT_SPECIFIED in kfree_skb's reasons");
    let script = format!(
        "tracepoint:skb:kfree_skb /args->reason > {not_specified}/ {{ \
         $skb = (struct sk_buff *)args->skbaddr; \
         $netns = $skb->sk != 0 ? $skb->sk->__sk_common.skc_net.net->ns.inum : $skb->dev->nd_net.net->ns.inum; \
         $ip = $skb->head + $skb->network_header; \
         @drops[$netns, args->reason, *(uint8 *)($ip + 9), *(uint16 *)($ip + (*(uint8 *)$ip & 15) * 4 + 2)] = count(); }}"
    );
    OneLiner {
        by: ", bpftrace counting by netns, reason, protocol and port",
        script: Box::leak(script.into_boxed_str()),
        counted: |c| c.total("drops"),
    }
}

/// `tasks` writers in D at once, stuck in writeback on a frozen FUSE-backed disk, with the
/// kernel's detector at 3 s (and its warnings off, both restored after). Each task counts once.
pub fn hung_tasks(tasks: usize, bpftrace: Option<OneLiner>) -> Row {
    let _detector = Sysctl::set("kernel.hung_task_timeout_secs", "3");
    // The tracepoint fires whatever this says; only the console is spared 50 stack dumps.
    let _quiet = Sysctl::set("kernel.hung_task_warnings", "0");
    let dir = tempfile::tempdir().expect("a folder for the pods file");
    let pods_file = dir.path().join("pods.json");
    write_pods_file(&pods_file, &[pod_json(WRITERS_UID, WRITERS_POD, WRITERS_CONTAINER)]);
    let cgroup = Cgroup::kubepods_container("burstable", WRITERS_UID, WRITERS_CONTAINER);
    let mut disk = FreezableDisk::new("storm-hung");
    let row = measure(
        format!(
            "hung-task storm ({tasks} writers in D on a frozen FUSE disk){}",
            bpftrace.map_or("", |b| b.by)
        ),
        "stuck tasks",
        &STUCK_TASKS,
        (
            &[],
            &[
                "--pods-file",
                pods_file.to_str().expect("a UTF-8 path"),
                "--stuck-task-interval",
                "1s",
                "--stuck-task-threshold",
                "3s",
            ],
        ),
        bpftrace,
        // The sampler finds a task 3 s plus a sweep after it blocked, the detector 3-6 s.
        Duration::from_secs(30),
        || {
            disk.freeze();
            let pids: Vec<u32> = (0..tasks).map(|_| disk.start_writer(&cgroup.procs())).collect();
            let all_in_d = wait_for(Duration::from_secs(30), || pids.iter().all(|&p| in_d(p)).then_some(()));
            assert!(all_in_d.is_some(), "{tasks} writers in D on the frozen disk");
            tasks as u64
        },
    );
    disk.thaw();
    disk.wait_writers(Duration::from_secs(60));
    row
}

/// The pod the hung-task storm's writers run in.
const WRITERS_POD: &str = "storm-writers-7c9d";
const WRITERS_UID: &str = "5a0b1c2d-3e4f-4a5b-8c6d-7e8f9a0b1c2d";
const WRITERS_CONTAINER: &str = "7e57a11c0ffee0017e57a11c0ffee0017e57a11c0ffee0017e57a11c0ffee001";

/// Whether task `pid` is in D (uninterruptible sleep, killable or not).
fn in_d(pid: u32) -> bool {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    stat.rsplit_once(") ").is_some_and(|(_, rest)| rest.starts_with('D'))
}

/// `kills` processes, one after another, allocating past a 64 MiB memory cgroup's limit until the
/// memcg OOM killer kills them.
pub fn oom_storm(kills: usize, bpftrace: Option<OneLiner>) -> Row {
    let cgroup = Cgroup::new("storm-oom");
    let limit = MemoryLimit::new(&cgroup, OOM_LIMIT);
    // Both hierarchies on a hybrid host: attribution reads the v2 one, the limit is the v1 one.
    let v2 = cgroup.procs();
    let procs: [&Path; 2] = [&v2, limit.procs()];
    measure(
        format!(
            "memcg OOM storm ({kills} kills in a {} MiB cgroup){}",
            OOM_LIMIT >> 20,
            bpftrace.map_or("", |b| b.by)
        ),
        "kills",
        &OOM_KILLS,
        (&[], &[]),
        bpftrace,
        COUNTED_WITHIN,
        || {
            for _ in 0..kills {
                oom_kill(&procs, |_| {});
            }
            kills as u64
        },
    )
}

/// A row of the table made elsewhere (the capture row: `crate::capture_cost`), in its columns,
/// and its notes.
pub struct TableLine {
    /// `| … |` and its newline.
    pub row: String,
    pub notes: Vec<String>,
}

/// The rows as one markdown table, with each row's programs and notes below it.
pub fn table(rows: &[Row]) -> String {
    table_with(rows, &[])
}

/// [`table`], with `more` rows after the storms' and their notes after theirs.
pub fn table_with(rows: &[Row], more: &[TableLine]) -> String {
    let mut out = String::from(
        "| storm | driven | counted | events received / lost / suppressed | agent CPU (until counted) | agent RSS (peak of limit) | series | kstall eBPF ns/run | bpftrace ns/run (counted) | kstall ÷ bpftrace |\n\
         |---|---|---|---|---|---|---|---|---|---|\n",
    );
    for r in rows {
        let share = 100.0 * r.agent_cpu_secs / r.window.as_secs_f64();
        let (driven, cpu) = match r.wakeups_per_sec {
            Some(wakeups) => (
                format!("none for {:.0} s", r.window.as_secs_f64()),
                format!("{share:.2}% of a core, {wakeups:.1} wakeups/s"),
            ),
            None => (
                format!("{} {} at {}/s", grouped(r.driven), r.unit, grouped(r.rate() as u64)),
                format!(
                    "{share:.1}% of a core, {:.2} µs per {}",
                    1e6 * r.agent_cpu_secs / r.driven.max(1) as f64,
                    r.unit.trim_end_matches('s')
                ),
            ),
        };
        let programs = |ps: &[ProgramRuns]| {
            ps.iter().map(|p| format!("{} {:.0}", p.name, p.ns_per_run())).collect::<Vec<_>>().join(", ")
        };
        let (theirs, ratio) = match (&r.bpftrace, r.ratio()) {
            (Some(b), Some((_, _, ratio))) => {
                (format!("{} ({})", programs(&b.programs), grouped(b.counted)), format!("{ratio:.1}×"))
            }
            (Some(b), None) => (format!("{} ({})", programs(&b.programs), grouped(b.counted)), "-".into()),
            (None, _) => ("-".into(), "-".into()),
        };
        out.push_str(&format!(
            "| {} | {driven} | {} | {} / {} / {} | {cpu} | {:.1} MiB (peak {:.1} of {}) | {} | {} | {theirs} | {ratio} |\n",
            r.scenario,
            grouped(r.counted as u64),
            grouped(r.received as u64),
            grouped(r.lost as u64),
            grouped(r.suppressed as u64),
            r.rss_kib as f64 / 1024.0,
            r.peak_kib as f64 / 1024.0,
            r.limit_bytes >> 20,
            r.series,
            programs(&r.kstall),
        ));
    }
    for line in more {
        out.push_str(&line.row);
    }
    let notes: Vec<&String> =
        rows.iter().flat_map(|r| &r.notes).chain(more.iter().flat_map(|l| &l.notes)).collect();
    if !notes.is_empty() {
        out.push('\n');
        for n in notes {
            out.push_str(&format!("- {n}\n"));
        }
    }
    out
}

/// 1234567 as "1,234,567".
pub(crate) fn grouped(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn runs(id: u64, name: &str, run_time_ns: u64, runs: u64) -> ProgramRuns {
        ProgramRuns { id, name: name.into(), run_time_ns, runs }
    }

    #[test]
    fn the_drop_loss_compares_medians_of_each_windows_rate() {
        let loss = DropLoss {
            secs: 5,
            by: ", bpftrace counting by port",
            nothing: vec![110.0, 90.0, 100.0],
            kstall: vec![85.0, 80.0, 90.0],
            bpftrace: vec![70.0, 75.0, 80.0, 60.0],
        };
        let line = loss.line("drop storm");
        assert!(
            line.starts_with(
                "drop storm: datagrams/s, medians of 3 rounds of 5 s windows: 100 with nothing on kfree_skb, \
                 85 under kstall alone (15.0% slower), 72 under bpftrace counting by port alone (27.5% slower): \
                 kstall's loss less bpftrace's is -12.5 points (goal: at most +3); each window: nothing 110, 90, 100;"
            ),
            "{line}"
        );
    }

    #[test]
    fn numbers_are_grouped_in_thousands() {
        assert_eq!(grouped(0), "0");
        assert_eq!(grouped(999), "999");
        assert_eq!(grouped(1000), "1,000");
        assert_eq!(grouped(886484), "886,484");
        assert_eq!(grouped(1234567), "1,234,567");
    }

    #[test]
    fn the_ratio_compares_the_hooks_both_attach_to() {
        let row = Row {
            scenario: "s".into(),
            unit: "resets",
            driven: 100,
            elapsed: Duration::from_secs(1),
            window: Duration::from_secs(1),
            counted: 100.0,
            received: 0.0,
            lost: 0.0,
            suppressed: 100.0,
            agent_cpu_secs: 0.01,
            rss_kib: 2048,
            peak_kib: 4096,
            limit_bytes: 160 << 20,
            agent_oom_kills: 0,
            export_dropped: 0.0,
            series: 2,
            // kfree_skb is kstall's alone: not in the ratio.
            kstall: vec![
                runs(1, "tcp_send_reset", 30_000, 50),
                runs(2, "tcp_receive_res", 20_000, 50),
                runs(3, "kfree_skb_no_so", 90_000, 900),
            ],
            bpftrace: Some(SideBySide {
                counted: 100,
                programs: vec![runs(7, "tcp_send_reset", 5_000, 50), runs(8, "tcp_receive_reset", 5_000, 50)],
            }),
            one_event_each: true,
            notes: vec!["a note".into()],
            wakeups_per_sec: None,
        };
        assert_eq!(row.ratio(), Some((500.0, 100.0, 5.0)));
        assert!(row.exact() && row.accounted() && row.held_to_limit());
        let table = table(&[row]);
        assert!(table.contains("| s | 100 resets at 100/s | 100 | 0 / 0 / 100 | 1.0% of a core, 100.00 µs per reset | 2.0 MiB (peak 4.0 of 160) | 2 |"), "{table}");
        assert!(table.contains("tcp_send_reset 600, tcp_receive_res 400, kfree_skb_no_so 100 |"), "{table}");
        assert!(table.contains("| tcp_send_reset 100, tcp_receive_reset 100 (100) | 5.0× |"), "{table}");
        assert!(table.ends_with("\n- a note\n"), "{table}");
    }

    #[test]
    fn the_idle_row_shows_its_cpu_to_a_hundredth_and_its_wakeups() {
        let row = Row {
            scenario: "idle".into(),
            unit: "events",
            driven: 0,
            elapsed: Duration::from_secs(60),
            window: Duration::from_secs(60),
            counted: 0.0,
            received: 0.0,
            lost: 0.0,
            suppressed: 0.0,
            agent_cpu_secs: 0.09,
            rss_kib: 2048,
            peak_kib: 4096,
            limit_bytes: 160 << 20,
            agent_oom_kills: 0,
            export_dropped: 0.0,
            series: 0,
            kstall: vec![runs(3, "stuck_task_sweep", 1_200_000, 12)],
            bpftrace: None,
            one_event_each: false,
            notes: Vec::new(),
            wakeups_per_sec: Some(4.25),
        };
        assert!(row.exact() && row.accounted() && row.held_to_limit());
        let table = table(&[row]);
        assert!(table.contains("| idle | none for 60 s | 0 | 0 / 0 / 0 | 0.15% of a core, 4.2 wakeups/s | 2.0 MiB (peak 4.0 of 160) | 0 | stuck_task_sweep 100000 | - | - |"), "{table}");
    }

    #[test]
    fn same_hook_matches_cut_and_suffixed_names() {
        let tp = |n: &str| runs(0, n, 0, 0);
        assert!(tp("tcp_receive_res").same_hook(&tp("tcp_receive_reset")));
        assert!(tp("mark_victim_pid").same_hook(&tp("mark_victim")));
        assert!(!tp("tcp_send_reset").same_hook(&tp("tcp_receive_reset")));
    }
}
