//! The host the tests run on: commands, polling, sysctls and processes.

use std::{
    path::{Path, PathBuf},
    process::Command,
    thread,
    time::{Duration, Instant},
};

/// Runs `cmd` with `args` and returns its stdout; panics with its stderr when it fails.
pub fn run(cmd: &str, args: &[&str]) -> String {
    let out = Command::new(cmd).args(args).output().unwrap_or_else(|e| panic!("{cmd}: {e}"));
    assert!(out.status.success(), "{cmd} {args:?} failed: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Polls `f` every 250 ms until it returns something or `timeout` passes.
pub fn wait_for<T>(timeout: Duration, mut f: impl FnMut() -> Option<T>) -> Option<T> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = f() {
            return Some(v);
        }
        if Instant::now() >= deadline {
            return None;
        }
        thread::sleep(Duration::from_millis(250));
    }
}

/// Sets a sysctl for the guard's lifetime and restores the previous value on drop.
pub struct Sysctl {
    path: PathBuf,
    previous: String,
}

impl Sysctl {
    pub fn set(name: &str, value: &str) -> Self {
        let path = Path::new("/proc/sys").join(name.replace('.', "/"));
        let previous = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{name}: {e}"));
        std::fs::write(&path, value).unwrap_or_else(|e| panic!("set {name}={value}: {e}"));
        Sysctl { path, previous: previous.trim().to_string() }
    }

    /// Restores `name` on drop to the value it has now: for a sysctl the kernel changes itself
    /// (each report of the hung-task detector counts `kernel.hung_task_warnings` down).
    pub fn keep(name: &str) -> Self {
        let path = Path::new("/proc/sys").join(name.replace('.', "/"));
        let previous = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{name}: {e}"));
        Sysctl { path, previous: previous.trim().to_string() }
    }
}

impl Drop for Sysctl {
    fn drop(&mut self) {
        let _ = std::fs::write(&self.path, &self.previous);
    }
}

/// A process stopped with SIGSTOP until dropped (SIGCONT), also when the test fails.
pub struct Stopped(i32);

impl Stopped {
    pub fn new(pid: u32) -> Self {
        // SAFETY: signalling a process the test started.
        assert_eq!(unsafe { libc::kill(pid as i32, libc::SIGSTOP) }, 0);
        Stopped(pid as i32)
    }
}

impl Drop for Stopped {
    fn drop(&mut self) {
        // SAFETY: as in `new`.
        unsafe { libc::kill(self.0, libc::SIGCONT) };
    }
}

/// Pids of the running children of process `pid` (their parent pid in `/proc/<child>/stat`).
pub fn child_pids(pid: u32) -> Vec<u32> {
    let Ok(procs) = std::fs::read_dir("/proc") else { return Vec::new() };
    procs
        .filter_map(Result::ok)
        .filter_map(|entry| entry.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&child| {
            // The parent pid is the second field after the command name, which may hold spaces
            // and parentheses: it ends at the last ')'.
            let Ok(stat) = std::fs::read_to_string(format!("/proc/{child}/stat")) else { return false };
            let ppid = stat.rsplit_once(')').and_then(|(_, rest)| rest.split_whitespace().nth(1));
            ppid.and_then(|p| p.parse::<u32>().ok()) == Some(pid)
        })
        .collect()
}

/// A count each thread of a process keeps (by tid), read from `/proc/<pid>/task/*/`: its run time
/// in nanoseconds (`schedstat`; clock ticks in `/proc/<pid>/stat` are 10 ms, a tenth of what a
/// storm costs the agent), or how often it went to sleep of its own accord (one wakeup each).
#[derive(Debug, Clone, Default)]
pub struct PerThread(std::collections::BTreeMap<u32, u64>);

impl PerThread {
    pub fn cpu_ns(pid: u32) -> Self {
        Self::read(pid, "schedstat", |text| text.split_whitespace().next()?.parse().ok())
    }

    pub fn voluntary_switches(pid: u32) -> Self {
        Self::read(pid, "status", |text| {
            text.lines().find_map(|l| l.strip_prefix("voluntary_ctxt_switches:"))?.trim().parse().ok()
        })
    }

    fn read(pid: u32, file: &str, value: impl Fn(&str) -> Option<u64>) -> Self {
        let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).expect("the process's threads");
        let threads = tasks.filter_map(|task| {
            let task = task.ok()?;
            let tid = task.file_name().to_str()?.parse().ok()?;
            // A thread that ended between the listing and the read is not counted.
            Some((tid, value(&std::fs::read_to_string(task.path().join(file)).ok()?)?))
        });
        PerThread(threads.collect())
    }

    /// The count's growth since `before`: threads started meanwhile from 0. A thread that ended
    /// meanwhile is left out; the agent's threads end only after 10 s without work (tokio's
    /// blocking pool).
    pub fn since(&self, before: &PerThread) -> u64 {
        self.0.iter().map(|(tid, n)| n - before.0.get(tid).copied().unwrap_or(0).min(*n)).sum()
    }
}

/// utime + stime of `pid`, in clock ticks.
pub fn cpu_ticks(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("agent stat");
    // Fields after the parenthesised comm; utime and stime are fields 14 and 15.
    let rest = &stat[stat.rfind(')').expect("comm") + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    fields[11].parse::<f64>().unwrap() + fields[12].parse::<f64>().unwrap()
}

/// VmRSS and VmHWM of `pid`, in KiB.
pub fn memory_kib(pid: u32) -> (u64, u64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("agent status");
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    (field("VmRSS:"), field("VmHWM:"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_child_is_found_by_its_parent() {
        let mut child = Command::new("sleep").arg("30").spawn().expect("sleep");
        let children = child_pids(std::process::id());
        let _ = child.kill();
        let _ = child.wait();
        assert!(children.contains(&child.id()), "{} not among {children:?}", child.id());
        assert_eq!(child_pids(u32::MAX), Vec::<u32>::new());
    }
}
