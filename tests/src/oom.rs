//! Memcg OOM kills the tests cause.

use std::{
    io::Write as _,
    path::Path,
    process::{Command, Stdio},
    time::{Duration, Instant},
};

/// The memory limit of the cgroups tests OOM-kill in.
pub const OOM_LIMIT: u64 = 64 << 20;

/// A process that joins `procs`, waits for `ready` (called with its pid: on v1, say, until the
/// agent has learnt the process), then allocates until the memcg OOM killer kills it; returns its
/// pid.
pub fn oom_kill(procs: &[&Path], ready: impl FnOnce(u32)) -> u32 {
    oom_kill_as(procs, None, ready)
}

/// [`oom_kill`] of a victim that first renames itself `comm` (the name the kernel reports: a node
/// daemon's makes the kill node-critical to kstall).
pub fn oom_kill_as(procs: &[&Path], comm: Option<&str>, ready: impl FnOnce(u32)) -> u32 {
    let joins: String = procs.iter().map(|p| format!("echo $$ > {} && ", p.display())).collect();
    let rename = comm
        .map(|c| format!("import ctypes; ctypes.CDLL(None).prctl(15, b\"{c}\", 0, 0, 0); "))
        .unwrap_or_default();
    let script = format!(
        "{joins}exec python3 -c '{rename}import sys; sys.stdin.readline(); x = [bytearray(8 << 20) for _ in range(64)]'"
    );
    let mut victim =
        Command::new("sh").args(["-c", &script]).stdin(Stdio::piped()).spawn().expect("start the allocator");
    let pid = victim.id();
    if let Err(panic) = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| ready(pid))) {
        let _ = victim.kill();
        let _ = victim.wait();
        std::panic::resume_unwind(panic);
    }
    victim.stdin.take().unwrap().write_all(b"go\n").expect("start allocating");
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Some(status) = victim.try_wait().unwrap() {
            assert_eq!(
                std::os::unix::process::ExitStatusExt::signal(&status),
                Some(libc::SIGKILL),
                "OOM-killed: {status}"
            );
            return pid;
        }
        assert!(Instant::now() < deadline, "allocator still running after 60 s");
        std::thread::sleep(Duration::from_millis(50));
    }
}
