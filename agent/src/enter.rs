//! Entering a pod's network namespace, for the reads that must be made from inside it: a program
//! run there (the child calls `setns` before `exec`, and is killed at a deadline), a function run
//! on a short-lived thread that entered it ([`in_netns`]: sockets made there stay in it), the
//! namespace opened through one of the pod's processes, and the refusal's one line naming the
//! opt-in that grants it. Imports nothing of the agent.

use std::{
    fs::File,
    io::Read as _,
    os::{fd::AsRawFd as _, unix::fs::MetadataExt as _, unix::process::CommandExt as _},
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

/// How long the rule dumps may take, all of them: each is killed past it.
pub const READ_DEADLINE: Duration = Duration::from_secs(2);

/// What grants the read in Kubernetes: the DaemonSet holds neither capability unless asked.
pub const OPT_IN: &str = "deploy/components/pod-rules (Helm: --set podRules=true)";

/// An open `/proc/<pid>/ns/net` (a thread's when the leader's link is gone) of one of the pod's
/// namespaces `netns` (inodes), through one of its `processes`, and the pid it was found by. Its inode is checked: a pid reused by another
/// process since the index was made does not lead elsewhere.
pub fn open_netns(netns: &[u32], processes: &[u32], proc: &Path) -> Option<(File, u32)> {
    for &pid in processes {
        let dir = proc.join(pid.to_string());
        let threads = std::fs::read_dir(dir.join("task"))
            .into_iter()
            .flatten()
            .flatten()
            .map(|t| t.path().join("ns/net"))
            .take(64);
        for link in std::iter::once(dir.join("ns/net")).chain(threads) {
            let Ok(file) = File::open(&link) else { continue };
            let inode = file.metadata().map(|m| m.ino()).unwrap_or(0);
            if netns.iter().any(|&n| u64::from(n) == inode) {
                return Some((file, pid));
            }
        }
    }
    None
}

/// Runs `f` on a thread of its own that entered `netns` (setns is per thread), and ends it: the
/// caller's thread never changes namespace, and no pool thread is left in another one. What `f`
/// makes there (a socket) stays in that namespace. A panic in `f` goes on in the caller.
pub fn in_netns<T: Send>(netns: &File, f: impl FnOnce() -> T + Send) -> Result<T, String> {
    let fd = netns.as_raw_fd();
    std::thread::scope(|scope| {
        let thread = std::thread::Builder::new()
            .name("kstall-netns".into())
            .spawn_scoped(scope, move || {
                // SAFETY: a namespace file the caller holds open; CLONE_NEWNET changes this thread only.
                if unsafe { libc::setns(fd, libc::CLONE_NEWNET) } != 0 {
                    let e = std::io::Error::last_os_error();
                    return Err(match e.raw_os_error() {
                        Some(libc::EPERM) => refused(),
                        _ => format!("entering the network namespace: {e}"),
                    });
                }
                Ok(f())
            })
            .map_err(|e| format!("cannot start a thread to enter the network namespace: {e}"))?;
        thread.join().unwrap_or_else(|panic| std::panic::resume_unwind(panic))
    })
}

/// Whether the namespace has a legacy nat table: asking `iptables-legacy-save` for one it lacks
/// would create it (and load `iptable_nat`), so it is only run when `ip_tables_names` lists one.
pub fn legacy_has_nat(proc: &Path, pid: u32, v6: bool) -> bool {
    let names = if v6 { "ip6_tables_names" } else { "ip_tables_names" };
    std::fs::read_to_string(proc.join(pid.to_string()).join("net").join(names))
        .is_ok_and(|text| text.lines().any(|l| l.trim() == "nat"))
}

/// The program's path: on PATH, or in the sbin directories Debian installs iptables and nft to.
pub fn find_program(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(["/usr/sbin", "/sbin", "/usr/bin"].map(PathBuf::from))
        .map(|dir| dir.join(name))
        .find(|p| p.is_file())
}

/// Runs `program` in the network namespace `netns` (the child enters it before exec), its output
/// or one line saying why not; killed at `until`.
pub fn run_in(netns: &File, program: &Path, args: &[&str], until: Instant) -> Result<String, String> {
    let name = program.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let fd = netns.as_raw_fd();
    let mut command = Command::new(program);
    command.args(args).stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
    // SAFETY: between fork and exec only setns and setpgid, system calls; `fd` stays open in the
    // parent until the spawn returns. Its own process group: what it may start dies with it.
    unsafe {
        command.pre_exec(move || {
            if libc::setns(fd, libc::CLONE_NEWNET) != 0 || libc::setpgid(0, 0) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut child = command.spawn().map_err(|e| match e.raw_os_error() {
        Some(libc::EPERM) => refused(),
        _ => format!("{name}: {e}"),
    })?;
    let reader = |pipe: Option<Box<dyn std::io::Read + Send>>, limit: u64| {
        std::thread::spawn(move || {
            let mut text = Vec::new();
            if let Some(pipe) = pipe {
                let _ = pipe.take(limit).read_to_end(&mut text);
            }
            String::from_utf8_lossy(&text).into_owned()
        })
    };
    let stdout = reader(child.stdout.take().map(|p| Box::new(p) as _), 16 << 20);
    let stderr = reader(child.stderr.take().map(|p| Box::new(p) as _), 64 << 10);
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break Ok(status),
            Ok(None) if Instant::now() >= until => {
                // The group is the child's (not reaped yet: its pid is still its own).
                // SAFETY: a signal to a process group this function made.
                unsafe { libc::kill(-(child.id() as i32), libc::SIGKILL) };
                let _ = child.wait();
                break Err(format!("{name} did not finish within {} s: killed", READ_DEADLINE.as_secs()));
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(5)),
            Err(e) => break Err(format!("{name}: {e}")),
        }
    };
    let (out, err) = (stdout.join().unwrap_or_default(), stderr.join().unwrap_or_default());
    let status = status?;
    if !status.success() {
        let why = err.lines().find(|l| !l.trim().is_empty()).unwrap_or("no message").trim().to_string();
        // iptables-nft-save without CAP_NET_ADMIN: "Could not fetch rule set generation id:
        // Permission denied (you must be root)".
        if why.contains("Permission denied") || why.contains("Operation not permitted") {
            return Err(format!(
                "{name} was refused the pod's rules ({why}): reading them needs CAP_NET_ADMIN, which {OPT_IN} \
                 grants"
            ));
        }
        return Err(format!("{name} failed ({status}): {why}"));
    }
    Ok(out)
}

/// setns(CLONE_NEWNET) refused: the agent lacks CAP_SYS_ADMIN.
pub fn refused() -> String {
    format!(
        "entering the pod's network namespace was refused: the agent needs CAP_SYS_ADMIN for that and \
         CAP_NET_ADMIN to read its rules, which {OPT_IN} grants"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// In this process's own namespace: root enters it and reads, and a command past its deadline
    /// is killed; without CAP_SYS_ADMIN the one line says what is missing.
    #[test]
    fn a_command_runs_in_the_namespace_and_is_killed_at_its_deadline() {
        let own = File::open("/proc/self/ns/net").unwrap();
        let sh = find_program("sh").expect("sh");
        let soon = || Instant::now() + Duration::from_millis(300);
        let said = run_in(&own, &sh, &["-c", "echo in; echo out >&2"], soon());
        if unsafe { libc::geteuid() } != 0 {
            assert_eq!(
                said.unwrap_err(),
                "entering the pod's network namespace was refused: the agent needs CAP_SYS_ADMIN for that and \
                 CAP_NET_ADMIN to read its rules, which deploy/components/pod-rules (Helm: --set \
                 podRules=true) grants"
            );
            return;
        }
        assert_eq!(said.unwrap(), "in\n");
        // A dump refused for want of CAP_NET_ADMIN (iptables-nft-save's own words) names the opt-in.
        let denied = "echo 'iptables-nft-save v1.8.9 (nf_tables): Could not fetch rule set generation id: \
                      Permission denied (you must be root)' >&2; exit 4";
        assert_eq!(
            run_in(&own, &sh, &["-c", denied], soon()).unwrap_err(),
            "sh was refused the pod's rules (iptables-nft-save v1.8.9 (nf_tables): Could not fetch rule set \
             generation id: Permission denied (you must be root)): reading them needs CAP_NET_ADMIN, which \
             deploy/components/pod-rules (Helm: --set podRules=true) grants"
        );
        let started = Instant::now();
        let hung = run_in(&own, &sh, &["-c", "sleep 30"], soon()).unwrap_err();
        assert_eq!(hung, "sh did not finish within 2 s: killed");
        assert!(started.elapsed() < Duration::from_secs(5), "{:?}", started.elapsed());
        let failed = run_in(&own, &sh, &["-c", "echo nope >&2; exit 3"], soon()).unwrap_err();
        assert_eq!(failed, "sh failed (exit status: 3): nope");
    }

    /// A thread in another namespace sees it; the caller's thread stays where it was.
    #[test]
    fn a_function_runs_in_the_namespace_on_its_own_thread() {
        let inode = || std::fs::metadata("/proc/thread-self/ns/net").unwrap().ino();
        let before = inode();
        if unsafe { libc::geteuid() } != 0 {
            eprintln!(
                "skipping a_function_runs_in_the_namespace_on_its_own_thread: needs root (unshare, setns)"
            );
            return;
        }
        // A namespace of its own, made by a thread that leaves; the open file keeps it.
        let other = std::thread::spawn(|| {
            assert_eq!(
                unsafe { libc::unshare(libc::CLONE_NEWNET) },
                0,
                "{}",
                std::io::Error::last_os_error()
            );
            File::open("/proc/thread-self/ns/net").unwrap()
        })
        .join()
        .unwrap();
        let other_inode = other.metadata().unwrap().ino();
        assert_ne!(other_inode, before);
        let (seen, name) =
            in_netns(&other, || (inode(), std::thread::current().name().map(str::to_string))).unwrap();
        assert_eq!((seen, name.as_deref()), (other_inode, Some("kstall-netns")));
        assert_eq!(inode(), before, "the caller's thread changed namespace");
        // A file that is no network namespace: one line.
        let not = File::open("/proc/self/ns/uts").unwrap();
        assert_eq!(
            in_netns(&not, || ()).unwrap_err(),
            "entering the network namespace: Invalid argument (os error 22)"
        );
    }

    #[test]
    fn legacy_tables_are_read_only_when_the_namespace_has_a_nat_one() {
        let proc = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(proc.path().join("5/net")).unwrap();
        std::fs::write(proc.path().join("5/net/ip_tables_names"), "mangle\nnat\n").unwrap();
        std::fs::write(proc.path().join("5/net/ip6_tables_names"), "filter\n").unwrap();
        assert!(legacy_has_nat(proc.path(), 5, false));
        assert!(!legacy_has_nat(proc.path(), 5, true));
        assert!(!legacy_has_nat(proc.path(), 6, false));
    }
}
