//! The host the tests run on: commands, polling and sysctls.

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
}

impl Drop for Sysctl {
    fn drop(&mut self) {
        let _ = std::fs::write(&self.path, &self.previous);
    }
}
