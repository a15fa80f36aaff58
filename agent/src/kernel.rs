//! Facts about the running kernel the agent needs outside the probes.

use std::path::Path;

const TRACEFS: &str = "/sys/kernel/tracing";

pub fn release() -> String {
    std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "unknown".into())
}

/// Classic tracepoints are attached through tracefs, which is not always mounted (checked on this
/// kind of machine). Mounting it is harmless; failing to is only a warning, since tp_btf programs
/// do not need it.
pub fn ensure_tracefs() {
    if Path::new(TRACEFS).join("events").exists() {
        return;
    }
    let mounted = std::process::Command::new("mount")
        .args(["-t", "tracefs", "tracefs", TRACEFS])
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    if mounted {
        tracing::info!(path = TRACEFS, "mounted tracefs");
    } else {
        tracing::warn!(
            path = TRACEFS,
            "tracefs is not mounted and mounting it failed; tracepoint probes may not attach"
        );
    }
}

/// The kernel's tick rate (CONFIG_HZ), measured from `/proc/timer_list` (root only), which prints
/// `jiffies` beside a nanosecond clock: two readings 200 ms apart, snapped to the rates kernels
/// are built with. `None` when it cannot be read.
pub fn tick_rate() -> Option<u64> {
    let sample = || -> Option<(u64, u64)> {
        let text = std::fs::read_to_string("/proc/timer_list").ok()?;
        let now_ns =
            text.lines().find_map(|l| l.strip_prefix("now at ")?.split_whitespace().next()?.parse().ok())?;
        let jiffies = text.lines().find_map(|l| l.trim().strip_prefix("jiffies: ")?.trim().parse().ok())?;
        Some((now_ns, jiffies))
    };
    let (t0, j0) = sample()?;
    std::thread::sleep(std::time::Duration::from_millis(200));
    let (t1, j1) = sample()?;
    let hz = (j1.checked_sub(j0)? as f64) / ((t1.checked_sub(t0)? as f64) / 1e9);
    [100u64, 250, 300, 1000].into_iter().min_by_key(|&c| (c as f64 - hz).abs() as u64)
}

const HUNG_TASK_TIMEOUT: &str = "/proc/sys/kernel/hung_task_timeout_secs";

pub fn hung_task_timeout_secs() -> Option<u64> {
    std::fs::read_to_string(HUNG_TASK_TIMEOUT).ok()?.trim().parse().ok()
}

/// `kernel.hung_task_timeout_secs` lowered on request (`--hung-task-timeout-secs`), put back on drop.
pub struct HungTaskTimeout {
    previous: u64,
}

impl HungTaskTimeout {
    pub fn set(secs: u64) -> std::io::Result<Self> {
        let previous = hung_task_timeout_secs().ok_or_else(|| std::io::Error::other("cannot read it"))?;
        std::fs::write(HUNG_TASK_TIMEOUT, secs.to_string())?;
        tracing::warn!(
            previous,
            now = secs,
            "set kernel.hung_task_timeout_secs as asked by --hung-task-timeout-secs; restored at exit"
        );
        Ok(Self { previous })
    }

    pub fn previous(&self) -> u64 {
        self.previous
    }
}

impl Drop for HungTaskTimeout {
    fn drop(&mut self) {
        match std::fs::write(HUNG_TASK_TIMEOUT, self.previous.to_string()) {
            Ok(()) => tracing::info!(value = self.previous, "restored kernel.hung_task_timeout_secs"),
            Err(e) => {
                tracing::error!(error = %e, value = self.previous, "cannot restore kernel.hung_task_timeout_secs")
            }
        }
    }
}
