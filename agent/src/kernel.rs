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
