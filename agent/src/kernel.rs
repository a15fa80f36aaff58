//! Facts about the running kernel and node the agent needs outside the probes: release, tick
//! rate, capabilities, the hung-task detector's setting, clocks, memory, the ephemeral port range.
//! A leaf: it knows nothing else of the agent.

use std::{
    ops::RangeInclusive,
    time::{Duration, Instant},
};

use aya::programs::{RawTracePoint, RawTracePointRunOptions, TestRun as _};

pub fn release() -> String {
    std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "unknown".into())
}

/// The kernel's tick rate (CONFIG_HZ), measured with `jiffies` (the kernel program
/// `kstall_jiffies`, run twice 200 ms apart with `BPF_PROG_TEST_RUN`) against the monotonic clock,
/// snapped to the rates kernels are built with. A program rather than `/proc/timer_list`, which
/// container runtimes mask (bind-mounted from /dev/null) in every unprivileged pod.
pub fn tick_rate(jiffies: &RawTracePoint) -> Result<u64, String> {
    let sample = || {
        jiffies
            .test_run(RawTracePointRunOptions::new())
            .map(|run| (Instant::now(), run.return_value))
            .map_err(|e| match std::error::Error::source(&e) {
                Some(cause) => format!("running kstall_jiffies: {e}: {cause}"),
                None => format!("running kstall_jiffies: {e}"),
            })
    };
    let (t0, j0) = sample()?;
    std::thread::sleep(Duration::from_millis(200));
    let (t1, j1) = sample()?;
    Ok(snap_tick_rate(f64::from(j1.wrapping_sub(j0)) / (t1 - t0).as_secs_f64()))
}

fn snap_tick_rate(measured: f64) -> u64 {
    [100u64, 250, 300, 1000].into_iter().min_by_key(|&c| (c as f64 - measured).abs() as u64).expect("rates")
}

/// A capability the agent uses, and what goes without it. In a container the agent gets exactly
/// the capabilities its manifest adds (deploy/base/daemonset.yaml), so a missing one is named at
/// start instead of surfacing as an unexplained EPERM.
pub struct Capability {
    pub name: &'static str,
    bit: u32,
    pub without: &'static str,
    /// Kernels before this (major, minor) need it; `None`: all do.
    needed_before: Option<(u32, u32)>,
}

const CAP_DAC_READ_SEARCH: u32 = 2;
const CAP_SYS_PTRACE: u32 = 19;
const CAP_SYS_ADMIN: u32 = 21;
const CAP_SYS_RESOURCE: u32 = 24;
const CAP_SYSLOG: u32 = 34;
const CAP_PERFMON: u32 = 38;
const CAP_BPF: u32 = 39;

pub const CAPABILITIES: &[Capability] = &[
    Capability {
        name: "CAP_BPF",
        bit: CAP_BPF,
        without: "no BPF map or program can be created: every probe is down",
        needed_before: None,
    },
    Capability {
        name: "CAP_PERFMON",
        bit: CAP_PERFMON,
        without: "no tracing program can be loaded: every probe is down",
        needed_before: None,
    },
    Capability {
        name: "CAP_SYSLOG",
        bit: CAP_SYSLOG,
        without: "/proc/kallsyms shows no addresses: kernel stacks stay unsymbolized and hung tasks have no wait class",
        needed_before: None,
    },
    Capability {
        name: "CAP_SYS_PTRACE",
        bit: CAP_SYS_PTRACE,
        without: "other processes' /proc/<pid>/ns/net cannot be read: resets and RPCs are not tied to pods",
        needed_before: None,
    },
    Capability {
        name: "CAP_DAC_READ_SEARCH",
        bit: CAP_DAC_READ_SEARCH,
        without: "a new cgroup cannot be opened by its id (open_by_handle_at): events of containers started since the last walk (5 s) go out unattributed",
        needed_before: None,
    },
    Capability {
        name: "CAP_SYS_RESOURCE",
        bit: CAP_SYS_RESOURCE,
        without: "RLIMIT_MEMLOCK cannot be raised, and before 5.11 BPF maps are charged to it: probes may fail to load (in Kubernetes: deploy/components/kernels-before-5.11)",
        needed_before: Some((5, 11)),
    },
];

/// Makes the permitted capabilities effective. A non-root agent gets its capabilities from the
/// binary's file capabilities (`cargo xtask image` sets them permitted, not effective: a file
/// whose effective bit is set fails to exec as soon as the runtime's bounding set lacks one of
/// them, where this way the agent starts and names what is missing). Root's are effective
/// already. Call before any thread starts: capabilities are per thread, inherited by new ones.
pub fn raise_permitted_capabilities() -> Result<(), String> {
    let permitted = caps::read(None, caps::CapSet::Permitted).map_err(|e| e.to_string())?;
    caps::set(None, caps::CapSet::Effective, &permitted).map_err(|e| e.to_string())
}

/// The capabilities of [`CAPABILITIES`] this process lacks on this kernel. CAP_SYS_ADMIN stands in
/// for CAP_BPF and CAP_PERFMON, as the kernel's `bpf_capable()`/`perfmon_capable()` allow.
pub fn missing_capabilities() -> Vec<&'static Capability> {
    let Some(effective) = effective_capabilities() else { return Vec::new() };
    missing_from(effective, kernel_version(&release()))
}

fn missing_from(effective: u64, kernel: Option<(u32, u32)>) -> Vec<&'static Capability> {
    let has = |bit: u32| effective & (1 << bit) != 0;
    CAPABILITIES
        .iter()
        .filter(|c| !has(c.bit))
        .filter(|c| !(matches!(c.bit, CAP_BPF | CAP_PERFMON) && has(CAP_SYS_ADMIN)))
        .filter(|c| match (c.needed_before, kernel) {
            (Some(before), Some(running)) => running < before,
            _ => true,
        })
        .collect()
}

fn effective_capabilities() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let hex = status.lines().find_map(|l| l.strip_prefix("CapEff:"))?.trim();
    u64::from_str_radix(hex, 16).ok()
}

/// (major, minor) of a release string such as `6.1.0-57-amd64`.
fn kernel_version(release: &str) -> Option<(u32, u32)> {
    let mut parts = release.split(|c: char| !c.is_ascii_digit());
    Some((parts.next()?.parse().ok()?, parts.next()?.parse().ok()?))
}

/// The capabilities bpf() needs (CAP_BPF, CAP_PERFMON) that the agent lacks.
pub fn missing_bpf_capabilities() -> Vec<&'static str> {
    missing_capabilities().iter().filter(|c| matches!(c.bit, CAP_BPF | CAP_PERFMON)).map(|c| c.name).collect()
}

/// Wall-clock now, in the unit of `Header::time_unix_ns`.
pub fn unix_now_ns() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_nanos() as u64
}

/// `CLOCK_REALTIME - CLOCK_BOOTTIME`: turns `bpf_ktime_get_boot_ns` stamps into wall time.
pub fn boot_to_unix_offset_ns() -> i128 {
    fn now(clock: libc::clockid_t) -> i128 {
        let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
        // SAFETY: valid clock id and out pointer.
        unsafe { libc::clock_gettime(clock, &mut ts) };
        i128::from(ts.tv_sec) * 1_000_000_000 + i128::from(ts.tv_nsec)
    }
    now(libc::CLOCK_REALTIME) - now(libc::CLOCK_BOOTTIME)
}

/// The node's ephemeral port range (`net.ipv4.ip_local_port_range`), Linux's default if unreadable.
pub fn ephemeral_port_range() -> RangeInclusive<u16> {
    std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|s| parse_port_range(&s))
        .unwrap_or(32768..=60999)
}

fn parse_port_range(text: &str) -> Option<RangeInclusive<u16>> {
    let mut it = text.split_whitespace().map(str::parse::<u16>);
    let (lo, hi) = (it.next()?.ok()?, it.next()?.ok()?);
    (lo <= hi).then_some(lo..=hi)
}

/// `MemTotal` from `<proc>/meminfo`, in bytes (`proc` is `/proc` but for tests).
pub fn mem_total_bytes(proc: &std::path::Path) -> Option<u64> {
    meminfo_bytes(&std::fs::read_to_string(proc.join("meminfo")).ok()?, "MemTotal:")
}

/// The memory the node could give without swapping (`MemAvailable`) and its total, from one read
/// (the kernel sums every zone to write the file).
pub fn mem_available_and_total_bytes(proc: &std::path::Path) -> Option<(u64, u64)> {
    let text = std::fs::read_to_string(proc.join("meminfo")).ok()?;
    meminfo_bytes(&text, "MemAvailable:").zip(meminfo_bytes(&text, "MemTotal:"))
}

fn meminfo_bytes(meminfo: &str, field: &str) -> Option<u64> {
    let kib: u64 = meminfo
        .lines()
        .find_map(|l| l.strip_prefix(field))?
        .trim()
        .strip_suffix("kB")?
        .trim()
        .parse()
        .ok()?;
    Some(kib * 1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_capabilities_are_named_for_this_kernel() {
        let names = |effective: u64, kernel| -> Vec<&str> {
            missing_from(effective, kernel).iter().map(|c| c.name).collect()
        };
        let all = CAPABILITIES.iter().fold(0u64, |set, c| set | 1 << c.bit);
        assert!(names(all, Some((6, 18))).is_empty());
        assert_eq!(names(all & !(1 << CAP_SYSLOG), Some((6, 18))), ["CAP_SYSLOG"]);
        // SYS_ADMIN covers BPF and PERFMON, not SYSLOG.
        let admin_only = 1 << CAP_SYS_ADMIN | 1 << CAP_SYS_PTRACE | 1 << CAP_DAC_READ_SEARCH;
        assert_eq!(names(admin_only, Some((6, 18))), ["CAP_SYSLOG"]);
        // RLIMIT_MEMLOCK matters before 5.11 only.
        let no_resource = all & !(1 << CAP_SYS_RESOURCE);
        assert!(names(no_resource, Some((6, 1))).is_empty());
        assert_eq!(names(no_resource, Some((5, 10))), ["CAP_SYS_RESOURCE"]);
        assert_eq!(kernel_version("6.18.44-fc-v1045"), Some((6, 18)));
        assert_eq!(kernel_version("5.10.0-46-amd64"), Some((5, 10)));
    }

    #[test]
    fn a_measured_rate_snaps_to_the_nearest_config_hz() {
        // 200 ms at ±1 jiffy: the candidates stay apart at every rate.
        assert_eq!(snap_tick_rate(19.0 / 0.2), 100);
        assert_eq!(snap_tick_rate(51.0 / 0.2), 250);
        assert_eq!(snap_tick_rate(59.0 / 0.2), 300);
        assert_eq!(snap_tick_rate(201.0 / 0.2), 1000);
    }

    #[test]
    fn port_range_parsing() {
        assert_eq!(parse_port_range("32768\t60999\n"), Some(32768..=60999));
        assert_eq!(parse_port_range("x"), None);
        assert_eq!(parse_port_range("5 4"), None);
    }
}
