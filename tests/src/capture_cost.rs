//! The capture row of `cargo xtask bench`: what a running capture costs a pod's traffic. One TCP
//! stream from a pod's network namespace over a veth to a server's, as fast as the machine sends
//! it, measured in windows of the same length, in rounds: with nothing capturing, while
//! `kstall capture start --standalone` captures the pod's namespace (headers only, its default),
//! and while tcpdump captures the same packets with the same filter from inside it. The order
//! turns each round, so that each takes each place once in three rounds. A capture's start and
//! end (its bundle written) are outside its window. With no capture running kstall holds no
//! packet socket at all: `an_agent_holds_no_packet_socket_until_asked` (tests/tests/capture_agent.rs).

use std::{
    io::{Read as _, Write as _},
    net::{TcpListener, TcpStream},
    path::Path,
    process::{Child, Command, Stdio},
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    thread,
    time::{Duration, Instant},
};

use crate::{
    agent::agent_binary,
    capture::{CaptureDisk, packet_sockets, unpacked},
    host::{cpu_ticks, memory_kib, wait_for},
    netns::NetNs,
    storms::{TableLine, grouped},
};

/// The stream's packets, for both capturers: its own TCP port between the two addresses.
const FILTER: &str = "tcp and host 10.0.0.1 and port 5001";
/// tcpdump's snapshot length: its cooked `any` header (20) and the IP and TCP headers with
/// timestamps (52) — as kstall's `headers`, a little payload besides.
const TCPDUMP_SNAPLEN: &str = "96";

/// One window's figures under a capture.
#[derive(Debug, Clone)]
pub struct Captured {
    pub gbits: f64,
    /// Packets the kernel's filter passed to the capture's sockets (tcpdump's "received by
    /// filter"), those it dropped included.
    pub accepted: u64,
    pub written: u64,
    pub dropped_by_kernel: u64,
    /// The capturing process's utime + stime over the window.
    pub cpu_secs: f64,
    /// Its VmRSS and VmHWM (start included) at the window's end, in KiB.
    pub rss_kib: u64,
    pub peak_kib: u64,
    /// What ended kstall's capture other than being stopped (its byte or packet cap).
    pub cut: Option<String>,
}

/// The row: each round's throughput without a capture, and its figures under each capturer.
#[derive(Debug)]
pub struct CaptureCost {
    pub window: Duration,
    pub baseline: Vec<f64>,
    pub kstall: Vec<Captured>,
    pub tcpdump: Vec<Captured>,
}

#[derive(Debug, Clone, Copy)]
enum Under {
    Nothing,
    Kstall,
    Tcpdump,
}

/// `rounds` rounds of three `secs`-second windows on one stream (see the module's doc).
pub fn capture_cost(secs: u64, rounds: usize) -> CaptureCost {
    let window = Duration::from_secs(secs);
    let pod = NetNs::new("cost-pod");
    let server = NetNs::new("cost-srv");
    pod.veth_to(&server, ("eth0", "10.0.0.2/24"), ("eth0", "10.0.0.1/24"));
    let flow = Flow::start(&pod, &server);
    // Past slow start and the socket buffers' growth: the first window measured was the slowest.
    thread::sleep(window);
    let mut cost = CaptureCost { window, baseline: Vec::new(), kstall: Vec::new(), tcpdump: Vec::new() };
    let order = [Under::Nothing, Under::Kstall, Under::Tcpdump];
    for round in 0..rounds {
        for i in 0..order.len() {
            match order[(round + i) % order.len()] {
                Under::Nothing => cost.baseline.push(flow.gbits_over(window)),
                Under::Kstall => cost.kstall.push(under_kstall(&pod, &flow, window)),
                Under::Tcpdump => cost.tcpdump.push(under_tcpdump(&pod, &flow, window)),
            }
        }
    }
    flow.stop();
    cost
}

/// One TCP stream from the pod to the server's 10.0.0.1:5001, 1 MiB writes back to back, the
/// bytes the server read counted, until stopped.
struct Flow {
    received: Arc<AtomicU64>,
    running: Arc<AtomicBool>,
    threads: Vec<thread::JoinHandle<()>>,
}

impl Flow {
    fn start(pod: &NetNs, server: &NetNs) -> Self {
        let listener = server.run_inside(|| TcpListener::bind("10.0.0.1:5001").expect("listen"));
        let (received, running) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicBool::new(true)));
        let counted = received.clone();
        // The accepted socket is the server namespace's, whichever thread reads it.
        let sink = thread::spawn(move || {
            let (mut stream, _) = listener.accept().expect("accept the stream");
            let mut buf = vec![0u8; 1 << 20];
            while let Ok(n @ 1..) = stream.read(&mut buf) {
                counted.fetch_add(n as u64, Ordering::Relaxed);
            }
        });
        let sending = running.clone();
        let sender = pod.spawn_inside(move || {
            let mut stream = TcpStream::connect("10.0.0.1:5001").expect("connect the stream");
            let chunk = vec![0x5au8; 1 << 20];
            while sending.load(Ordering::Relaxed) {
                stream.write_all(&chunk).expect("the stream");
            }
        });
        Flow { received, running, threads: vec![sender, sink] }
    }

    /// The stream's throughput over the next `window`, in Gbit/s, as the server read it.
    fn gbits_over(&self, window: Duration) -> f64 {
        let (start, before) = (Instant::now(), self.received.load(Ordering::Relaxed));
        thread::sleep(window);
        let (elapsed, after) = (start.elapsed(), self.received.load(Ordering::Relaxed));
        (after - before) as f64 * 8.0 / elapsed.as_secs_f64() / 1e9
    }

    fn stop(mut self) {
        self.running.store(false, Ordering::Relaxed);
        // The sender closes its end, and the server reads to the end.
        for t in self.threads.drain(..) {
            t.join().expect("the stream's threads");
        }
    }
}

impl Drop for Flow {
    fn drop(&mut self) {
        // A failed row: the sender ends at its next write.
        self.running.store(false, Ordering::Relaxed);
    }
}

/// A capturing process, killed on drop if the row fails before it ends.
struct Capturer(Child);

impl Drop for Capturer {
    fn drop(&mut self) {
        if self.0.try_wait().ok().flatten().is_none() {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

impl Capturer {
    /// Once `sockets` packet sockets are up in `pod` (and a second more, for what the capturer
    /// does once they are: its filter set, its files opened), or panics with what it said.
    fn up(mut self, pod: &NetNs, sockets: usize, what: &str) -> Self {
        let up = wait_for(Duration::from_secs(20), || {
            if packet_sockets(pod) >= sockets {
                return Some(true);
            }
            self.0.try_wait().expect("wait").map(|_| false)
        });
        if up != Some(true) {
            let _ = self.0.kill();
            let (status, _, stderr) = self.ended();
            panic!("capture: {what} did not open its packet sockets in {}: {status}: {stderr}", pod.name);
        }
        thread::sleep(Duration::from_secs(1));
        self
    }

    /// The stream's throughput over `window`, and the capturer's CPU over it and memory at its end.
    fn measure(&self, flow: &Flow, window: Duration) -> (f64, f64, (u64, u64)) {
        let pid = self.0.id();
        let cpu_before = cpu_ticks(pid);
        let gbits = flow.gbits_over(window);
        let cpu = cpu_ticks(pid) - cpu_before;
        // SAFETY: sysconf has no preconditions.
        let ticks_per_sec = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
        (gbits, cpu / ticks_per_sec, memory_kib(pid))
    }

    /// SIGINT, as Ctrl-C: both end cleanly on it, their files whole.
    fn interrupt(&self) {
        // SAFETY: a signal to a child this process started and has not reaped.
        assert_eq!(unsafe { libc::kill(self.0.id() as i32, libc::SIGINT) }, 0);
    }

    /// Waits for the end (within a minute: kstall writes its bundle); its status, stdout and stderr.
    fn ended(&mut self) -> (std::process::ExitStatus, String, String) {
        let status = wait_for(Duration::from_secs(60), || self.0.try_wait().expect("wait"))
            .expect("the capture ended within a minute of its SIGINT");
        let (mut stdout, mut stderr) = (String::new(), String::new());
        if let Some(mut out) = self.0.stdout.take() {
            out.read_to_string(&mut stdout).expect("stdout");
        }
        if let Some(mut err) = self.0.stderr.take() {
            err.read_to_string(&mut stderr).expect("stderr");
        }
        (status, stdout, stderr)
    }
}

/// A window while `kstall capture start --standalone` captures the pod's namespace, bounded far
/// past what the window takes, stopped with SIGINT after it; its counts from the bundle's
/// manifest.
fn under_kstall(pod: &NetNs, flow: &Flow, window: Duration) -> Captured {
    let disk = CaptureDisk::new();
    let out = disk.path().join("capture");
    let child = Command::new(agent_binary())
        .args(["capture", "start", "--standalone", "--netns-file"])
        .arg(pod.path())
        .args(["--filter", FILTER, "--duration", "10m", "--max-bytes", "200M", "--max-packets", "100000000"])
        .arg("-o")
        .arg(&out)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("kstall capture");
    // One socket per interface: lo and eth0.
    let mut capture = Capturer(child).up(pod, 2, "kstall capture");
    let (gbits, cpu_secs, (rss_kib, peak_kib)) = capture.measure(flow, window);
    capture.interrupt();
    let (status, stdout, stderr) = capture.ended();
    assert!(status.success(), "kstall capture: {status}: {stderr}");
    let bundle = unpacked(&out);
    let manifest: serde_json::Value =
        serde_json::from_slice(&std::fs::read(bundle.join("manifest.json")).expect("manifest.json"))
            .expect("manifest.json");
    let interfaces = manifest["packets"]["interfaces"].as_array().expect("packets.interfaces");
    let sum = |field: &str| interfaces.iter().map(|i| i[field].as_u64().expect(field)).sum::<u64>();
    let cut = manifest["cut"].as_array().expect("cut");
    // Stopped is expected; a cap reached within the window is said.
    let cut = cut
        .iter()
        .filter_map(|c| c.as_str()?.strip_prefix("packets: "))
        .find(|c| !c.starts_with("stopped after "))
        .map(str::to_string);
    assert!(sum("written") > 0, "kstall captured none of the stream:\n{stdout}");
    Captured {
        gbits,
        accepted: sum("accepted"),
        written: sum("written"),
        dropped_by_kernel: sum("dropped_by_kernel"),
        cpu_secs,
        rss_kib,
        peak_kib,
        cut,
    }
}

/// A window while tcpdump, in the pod's namespace, captures the same on `any` with the same
/// filter into a file on a disk like kstall's; its counts from what it says on exit.
fn under_tcpdump(pod: &NetNs, flow: &Flow, window: Duration) -> Captured {
    let disk = CaptureDisk::new();
    let file = disk.path().join("tcpdump.pcap");
    // `ip netns exec` execs tcpdump: the child is tcpdump itself.
    let child = Command::new("ip")
        .args(["netns", "exec", &pod.name, "tcpdump", "-i", "any", "-s", TCPDUMP_SNAPLEN, "-w"])
        .arg(&file)
        .arg(FILTER)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("tcpdump (cargo xtask bootstrap)");
    let mut capture = Capturer(child).up(pod, 1, "tcpdump");
    let (gbits, cpu_secs, (rss_kib, peak_kib)) = capture.measure(flow, window);
    capture.interrupt();
    let (status, _, stderr) = capture.ended();
    assert!(status.success(), "tcpdump: {status}: {stderr}");
    let said =
        |what: &str| tcpdump_count(&stderr, what).unwrap_or_else(|| panic!("no {what:?} in:\n{stderr}"));
    let written = said("packets captured");
    assert!(written > 0, "tcpdump captured none of the stream:\n{stderr}");
    assert!(file_len(&file) > 0, "tcpdump wrote nothing to {}", file.display());
    Captured {
        gbits,
        accepted: said("packets received by filter"),
        written,
        dropped_by_kernel: said("packets dropped by kernel"),
        cpu_secs,
        rss_kib,
        peak_kib,
        cut: None,
    }
}

fn file_len(path: &Path) -> u64 {
    std::fs::metadata(path).map_or(0, |m| m.len())
}

/// The number on tcpdump's exit line `N <what>`.
fn tcpdump_count(stderr: &str, what: &str) -> Option<u64> {
    stderr.lines().find_map(|l| l.trim().strip_suffix(what)?.trim().parse().ok())
}

/// The median of `values` (the lower of the middle two for an even count).
fn median(values: impl IntoIterator<Item = f64>) -> f64 {
    let mut v: Vec<f64> = values.into_iter().collect();
    assert!(!v.is_empty(), "a median of nothing");
    v.sort_by(f64::total_cmp);
    v[(v.len() - 1) / 2]
}

impl CaptureCost {
    fn baseline_gbits(&self) -> f64 {
        median(self.baseline.iter().copied())
    }

    /// A capturer's medians: Gbit/s, loss against the baseline's median in %, packets written,
    /// dropped by the kernel, CPU seconds over a window.
    fn medians(&self, of: &[Captured]) -> (f64, f64, u64, u64, f64) {
        let gbits = median(of.iter().map(|c| c.gbits));
        let loss = 100.0 * (1.0 - gbits / self.baseline_gbits());
        let written = median(of.iter().map(|c| c.written as f64)) as u64;
        let dropped = median(of.iter().map(|c| c.dropped_by_kernel as f64)) as u64;
        (gbits, loss, written, dropped, median(of.iter().map(|c| c.cpu_secs)))
    }

    /// Caps that cut a kstall capture inside its window: its cost is then understated.
    pub fn cuts(&self) -> Vec<&str> {
        self.kstall.iter().filter_map(|c| c.cut.as_deref()).collect()
    }

    /// The row in the storms table's columns, and its notes.
    pub fn line(&self) -> TableLine {
        let secs = self.window.as_secs_f64();
        let rounds = self.baseline.len();
        let (k_gbits, k_loss, k_written, k_dropped, k_cpu) = self.medians(&self.kstall);
        let (t_gbits, t_loss, t_written, t_dropped, t_cpu) = self.medians(&self.tcpdump);
        let k_accepted = median(self.kstall.iter().map(|c| c.accepted as f64)) as u64;
        let rss = median(self.kstall.iter().map(|c| c.rss_kib as f64)) / 1024.0;
        let peak = median(self.kstall.iter().map(|c| c.peak_kib as f64)) / 1024.0;
        let scenario = format!(
            "capture (one TCP stream from a pod's netns over a veth, headers only; medians of {rounds} \
             rounds of {secs:.0} s)"
        );
        // The storms' columns: storm, driven, counted, received / lost / suppressed, agent CPU,
        // agent RSS, series, kstall eBPF, the yardstick, kstall ÷ the yardstick.
        let cells = [
            scenario.clone(),
            format!("1 TCP stream at {:.2} Gbit/s, no capture", self.baseline_gbits()),
            format!("{k_gbits:.2} Gbit/s under kstall capture ({})", loss(k_loss)),
            format!(
                "{} accepted / {} dropped by the kernel / {} written",
                grouped(k_accepted),
                grouped(k_dropped),
                grouped(k_written)
            ),
            format!(
                "kstall capture: {k_cpu:.2} s, {:.1}% of a core, {:.2} µs per packet",
                100.0 * k_cpu / secs,
                1e6 * k_cpu / k_written.max(1) as f64
            ),
            format!("{rss:.1} MiB (peak {peak:.1}, no limit)"),
            "-".into(),
            "- (a classic BPF socket filter)".into(),
            format!(
                "tcpdump -i any -s {TCPDUMP_SNAPLEN}: {t_gbits:.2} Gbit/s ({}), {} written / {} dropped, \
                 {t_cpu:.2} s, {:.1}% of a core",
                loss(t_loss),
                grouped(t_written),
                grouped(t_dropped),
                100.0 * t_cpu / secs
            ),
            if t_cpu > 0.0 { format!("{:.1}× CPU", k_cpu / t_cpu) } else { "-".into() },
        ];
        let row = format!("| {} |\n", cells.join(" | "));
        let mut notes = vec![format!(
            "{scenario}: {:.2} Gbit/s with no capture, {k_gbits:.2} under kstall ({}), {t_gbits:.2} under \
             tcpdump ({}); packets written {} by kstall and {} by tcpdump, dropped by the kernel {} and \
             {}; CPU {k_cpu:.2} s and {t_cpu:.2} s a {secs:.0} s window; with no capture running kstall \
             holds no packet socket (`an_agent_holds_no_packet_socket_until_asked`)",
            self.baseline_gbits(),
            loss(k_loss),
            loss(t_loss),
            grouped(k_written),
            grouped(t_written),
            grouped(k_dropped),
            grouped(t_dropped),
        )];
        let per_round: Vec<String> = (0..rounds)
            .map(|r| {
                let (k, t) = (&self.kstall[r], &self.tcpdump[r]);
                format!(
                    "{:.2} / {:.2} ({} written, {} dropped, {:.2} s) / {:.2} ({} written, {} dropped, {:.2} s)",
                    self.baseline[r],
                    k.gbits,
                    grouped(k.written),
                    grouped(k.dropped_by_kernel),
                    k.cpu_secs,
                    t.gbits,
                    grouped(t.written),
                    grouped(t.dropped_by_kernel),
                    t.cpu_secs,
                )
            })
            .collect();
        notes.push(format!(
            "{scenario}, each round as Gbit/s with no capture / under kstall / under tcpdump: {}",
            per_round.join("; ")
        ));
        for cut in self.cuts() {
            notes.push(format!("{scenario}: kstall's capture was cut inside its window: {cut}"));
        }
        TableLine { row, notes }
    }
}

/// "3.2% less", or "1.0% more" when the stream was faster under it (noise).
fn loss(percent: f64) -> String {
    if percent >= 0.0 { format!("{percent:.1}% less") } else { format!("{:.1}% more", -percent) }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn captured(gbits: f64, written: u64, cpu_secs: f64) -> Captured {
        Captured {
            gbits,
            accepted: written,
            written,
            dropped_by_kernel: 0,
            cpu_secs,
            rss_kib: 8192,
            peak_kib: 10240,
            cut: None,
        }
    }

    #[test]
    fn tcpdump_s_exit_counts_are_read() {
        let said = "tcpdump: listening on any, link-type LINUX_SLL2 (Linux cooked v2), snapshot length 96 bytes\n\
                    123456 packets captured\n123460 packets received by filter\n4 packets dropped by kernel\n";
        assert_eq!(tcpdump_count(said, "packets captured"), Some(123456));
        assert_eq!(tcpdump_count(said, "packets received by filter"), Some(123460));
        assert_eq!(tcpdump_count(said, "packets dropped by kernel"), Some(4));
        assert_eq!(tcpdump_count(said, "packets dropped by interface"), None);
    }

    #[test]
    fn the_row_shows_medians_and_each_capturer_s_loss_against_the_baseline() {
        let cost = CaptureCost {
            window: Duration::from_secs(5),
            baseline: vec![10.0, 9.0, 11.0],
            kstall: vec![
                captured(9.5, 100_000, 0.5),
                captured(9.0, 90_000, 0.4),
                captured(9.9, 110_000, 0.6),
            ],
            tcpdump: vec![captured(8.0, 80_000, 1.0), captured(9.0, 85_000, 1.2), captured(8.5, 82_000, 0.8)],
        };
        assert_eq!(cost.baseline_gbits(), 10.0);
        let TableLine { row, notes } = cost.line();
        assert!(row.starts_with("| capture (one TCP stream from a pod's netns over a veth, headers only; medians of 3 rounds of 5 s) | 1 TCP stream at 10.00 Gbit/s, no capture | 9.50 Gbit/s under kstall capture (5.0% less) | 100,000 accepted / 0 dropped by the kernel / 100,000 written | kstall capture: 0.50 s, 10.0% of a core, 5.00 µs per packet | 8.0 MiB (peak 10.0, no limit) | - |"), "{row}");
        assert!(row.ends_with("| tcpdump -i any -s 96: 8.50 Gbit/s (15.0% less), 82,000 written / 0 dropped, 1.00 s, 20.0% of a core | 0.5× CPU |\n"), "{row}");
        assert_eq!(row.matches(" | ").count(), 9, "ten columns: {row}");
        assert!(
            notes[0].contains(
                "10.00 Gbit/s with no capture, 9.50 under kstall (5.0% less), 8.50 under tcpdump (15.0% less)"
            ),
            "{notes:?}"
        );
        assert!(notes[1].ends_with("10.00 / 9.50 (100,000 written, 0 dropped, 0.50 s) / 8.00 (80,000 written, 0 dropped, 1.00 s); 9.00 / 9.00 (90,000 written, 0 dropped, 0.40 s) / 9.00 (85,000 written, 0 dropped, 1.20 s); 11.00 / 9.90 (110,000 written, 0 dropped, 0.60 s) / 8.50 (82,000 written, 0 dropped, 0.80 s)"), "{notes:?}");
        assert_eq!(notes.len(), 2);
        assert_eq!(loss(-1.04), "1.0% more");
    }
}
