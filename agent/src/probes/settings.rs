//! What the agent asks of its probes: one struct for the probes' part of the configuration, with
//! the rules of its values (the agent's configuration reads them from flags, environment and
//! file, and names the setting in its error).

use std::time::Duration;

use kstall_common::capture::CaptureFilter;

/// Processes whose death takes the node down with it (incident 2), unless configured otherwise.
pub const DEFAULT_CRITICAL_COMMS: &[&str] =
    &["kubelet", "containerd", "crio", "dockerd", "systemd", "sshd", "node_exporter", "alloy", "kstall"];

/// What the agent asks of its probes (part of the agent's configuration, validated there).
#[derive(Debug, Clone, PartialEq)]
pub struct Settings {
    /// Probes to load, by name; the others are reported "disabled by --probes".
    pub enabled: Vec<String>,
    pub ring_buffer_bytes: u32,
    /// Events of one counter key sent in full per CPU per interval; `u32::MAX`: all.
    pub sample_events: u32,
    pub tcp_reset_hook: Hook,
    /// Process names whose OOM kill makes the victim node-critical.
    pub critical_comms: Vec<String>,
    /// Ports the reset and drop counters keep by number besides [`super::ports::WELL_KNOWN_PORTS`].
    pub kept_ports: Vec<std::ops::RangeInclusive<u16>>,
    pub stuck_task: StuckTask,
    /// `kernel.hung_task_timeout_secs` while the hung-task probe runs; `None`: the node's.
    pub hung_task_timeout_secs: Option<u64>,
    /// Turn the kernel's run-time statistics on while the agent runs.
    pub program_stats: bool,
    /// The in-kernel capture filter of a standalone `kstall trace`; all zero (everything) for the
    /// agent.
    pub capture: CaptureFilter,
}

impl Settings {
    pub const DEFAULT_RING_BUFFER_BYTES: u32 = 1 << 20;
    const MAX_RING_BUFFER_BYTES: u64 = 1 << 30;
    const PAGE_SIZE: u64 = 4096;
    /// `TASK_COMM_LEN - 1`.
    const MAX_COMM_BYTES: usize = 15;

    /// A ring buffer size the kernel takes (`text` is how it was given).
    pub fn ring_buffer_bytes(bytes: u64, text: &str) -> Result<u32, String> {
        if bytes < Self::PAGE_SIZE || !bytes.is_power_of_two() || bytes > Self::MAX_RING_BUFFER_BYTES {
            return Err(format!(
                "{text} is not a power of two between 4K and 1G (the kernel requires a power-of-two number of pages)"
            ));
        }
        Ok(bytes as u32)
    }

    /// `--sample-events`: a count, or `all` (every event sent, nothing counted in the kernel).
    pub fn sample_events(text: &str) -> Result<u32, String> {
        match text.trim() {
            "all" => Ok(u32::MAX),
            n => n
                .parse::<u32>()
                .ok()
                .filter(|&n| n < u32::MAX)
                .ok_or_else(|| format!("{text:?} is not a number of events (0 to 4294967294) or \"all\"")),
        }
    }

    /// `--metric-ports`: ports (`8080`) and ranges (`9000-9010`) counted by number.
    pub fn metric_ports(list: Vec<String>) -> Result<Vec<std::ops::RangeInclusive<u16>>, String> {
        let port = |text: &str| {
            text.trim()
                .parse::<u16>()
                .ok()
                .filter(|&p| p > 0)
                .ok_or_else(|| format!("{text:?} is not a port (1-65535)"))
        };
        let mut ranges = Vec::new();
        for item in list.iter().map(|s| s.trim()).filter(|s| !s.is_empty()) {
            let range = match item.split_once('-') {
                Some((low, high)) => port(low)?..=port(high)?,
                None => port(item)?..=port(item)?,
            };
            if range.is_empty() {
                return Err(format!("{item:?} is not a range (the low port first)"));
            }
            ranges.push(range);
        }
        Ok(ranges)
    }

    /// Process names whose OOM kill is node-critical: each must fit the kernel's process name,
    /// or it would never match.
    pub fn critical_comms(list: Vec<String>) -> Result<Vec<String>, String> {
        let comms: Vec<String> =
            list.iter().map(|s| s.trim().to_string()).filter(|s| !s.is_empty()).collect();
        if let Some(long) = comms.iter().find(|c| c.len() > Self::MAX_COMM_BYTES) {
            return Err(format!(
                "{long:?} is longer than the kernel's 15-byte process name and would never match"
            ));
        }
        Ok(comms)
    }
}

/// Which hook sees resets without a socket: `Auto` picks `tcp_send_reset` where it carries a
/// reason (6.10+), else `kfree_skb`'s NO_SOCKET drops where drops have reasons (5.17+), else fentry
/// on `tcp_v{4,6}_send_reset`; the others force one (`--tcp-reset-hook`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Hook {
    Auto,
    TcpSendReset,
    KfreeSkb,
    SendResetFunction,
}

/// How the sampler sweeps (part of the agent's configuration, validated there).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StuckTask {
    pub interval: Duration,
    /// How long a task's switch count must stay still before it is reported.
    pub threshold: Duration,
    /// Reports per sweep at most; the rest are counted and come in later sweeps.
    pub max_reports: u32,
}

impl Default for StuckTask {
    fn default() -> Self {
        Self { interval: Duration::from_secs(5), threshold: Duration::from_secs(30), max_reports: 1000 }
    }
}

impl StuckTask {
    const MIN_INTERVAL: Duration = Duration::from_secs(1);
    const MAX_INTERVAL: Duration = Duration::from_secs(3600);
    /// More than the ring buffer could hold in one sweep at its smallest useful size is no limit.
    const MAX_REPORTS: u32 = 100_000;

    pub fn interval(d: Duration, text: &str) -> Result<Duration, String> {
        if d < Self::MIN_INTERVAL || d > Self::MAX_INTERVAL {
            return Err(format!("{text} is not between 1s and 1h"));
        }
        Ok(d)
    }

    pub fn threshold(d: Duration, text: &str) -> Result<Duration, String> {
        if d.is_zero() {
            return Err(format!("{text} is not a duration of at least 1s"));
        }
        Ok(d)
    }

    pub fn max_reports(n: Option<u32>, text: &str) -> Result<u32, String> {
        n.filter(|n| (1..=Self::MAX_REPORTS).contains(n))
            .ok_or_else(|| format!("{text:?} is not a whole number between 1 and {}", Self::MAX_REPORTS))
    }
}
