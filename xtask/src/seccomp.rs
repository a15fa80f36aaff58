//! `cargo xtask seccomp`: the agent's seccomp profile, `deploy/seccomp/kstall.json`, from the system
//! calls the agent was seen to make — not from a guess.
//!
//! `record` runs the host kernel test suite (every test that starts an agent: probes, storms,
//! incidents, the API, the containers) with a bpftrace recorder beside it that follows every
//! process started from a binary named `kstall` and its children (what it runs: inside a
//! container they are under the same filter) and counts their system calls; a cluster running
//! then (`cargo xtask cluster up`) has its agent's calls counted too. The names seen are merged
//! into `deploy/seccomp/syscalls.txt`, and the profile is written from that list.
//! `profile` only writes the profile from the list; a unit test fails when the committed one is
//! not what it writes.

use std::{
    collections::{BTreeMap, BTreeSet},
    io::Read as _,
    path::Path,
    process::{Command, Stdio},
    time::Duration,
};

use anyhow::{Context as _, bail};

use crate::{bootstrap, build};

const LIST: &str = "deploy/seccomp/syscalls.txt";
const PROFILE: &str = "deploy/seccomp/kstall.json";

/// Follows the agent's processes from their exec (and their children from their fork) and counts
/// their system calls by number.
const RECORDER: &str = r#"
tracepoint:sched:sched_process_exec /comm == "kstall"/ { @agent[pid] = 1; }
tracepoint:sched:sched_process_fork /@agent[pid]/ { @agent[args->child_pid] = 1; }
tracepoint:raw_syscalls:sys_enter /@agent[pid]/ { @calls[args->id] = count(); }
tracepoint:sched:sched_process_exit /pid == tid && @agent[pid]/ { delete(@agent[pid]); }
END { clear(@agent); }
"#;

/// Calls made under the filter before the agent runs: with no-new-privileges (the DaemonSet's)
/// runc loads the filter as its last step, then checks that /proc/self/fd is procfs (`fstatfs`:
/// measured — without it runc fails "ensure /proc/self/fd is on procfs: operation not
/// permitted"), marks its descriptors close-on-exec and replaces itself with the agent. (Without
/// no-new-privileges — the non-root variant — runc loads the filter before it sets up the user,
/// and makes calls this profile does not cover: that variant is not for this profile.)
const BEFORE_THE_AGENT: &[&str] = &["execve", "fstatfs"];

/// Calls the x86-64 kernel has under an old name that arm64 (asm-generic) only has as their
/// successor, which glibc and Rust's std call there instead: the arm64 node's profile needs the
/// successor for each.
const ARM64_SUCCESSORS: &[(&str, &str)] = &[
    ("access", "faccessat"),
    ("chmod", "fchmodat"),
    ("dup2", "dup3"),
    ("epoll_create", "epoll_create1"),
    ("epoll_wait", "epoll_pwait"),
    ("fork", "clone"),
    ("getdents", "getdents64"),
    ("lstat", "newfstatat"),
    ("mkdir", "mkdirat"),
    ("open", "openat"),
    ("pipe", "pipe2"),
    ("poll", "ppoll"),
    ("readlink", "readlinkat"),
    ("rename", "renameat2"),
    ("rmdir", "unlinkat"),
    ("select", "pselect6"),
    ("stat", "newfstatat"),
    ("unlink", "unlinkat"),
    ("vfork", "clone"),
];

pub fn record() -> anyhow::Result<()> {
    if !bootstrap::is_root() {
        bail!("seccomp record: bpftrace and the kernel tests need root");
    }
    let env = bootstrap::run()?;
    bootstrap::apt_install(&["bpftrace", "linux-libc-dev"])?;
    build::release(&env)?;
    let root = build::workspace_root();
    // bpftrace attaches classic tracepoints through tracefs; left mounted for the tests that
    // mount it themselves (they unmount only what they mounted).
    if !Path::new("/sys/kernel/tracing/events").exists() {
        bootstrap::run_step(
            Command::new("mount").args(["-t", "tracefs", "tracefs", "/sys/kernel/tracing"]),
            "mount tracefs",
        )?;
    }
    let mut recorder = Command::new("bpftrace")
        .args(["-q", "-e", RECORDER])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .context("seccomp: cannot start bpftrace")?;
    // Attached once it has compiled the script: a second or two.
    std::thread::sleep(Duration::from_secs(5));
    if let Some(status) = recorder.try_wait()? {
        let mut said = String::new();
        recorder.stderr.take().map(|mut e| e.read_to_string(&mut said));
        bail!("seccomp: bpftrace exited ({status}): {}", said.trim());
    }
    println!("==> the kernel test suite, with the agent's system calls recorded");
    let mut tests = Command::new("cargo");
    tests
        .args(["test", "--package", "kstall-tests", "--no-fail-fast", "--", "--test-threads=1"])
        .env("KSTALL_BIN", build::release_binary())
        .env("KSTALL_KERNEL_TESTS", "require")
        .current_dir(&root);
    env.apply(&mut tests);
    // The calls are what is wanted, pass or fail: a failing test still made its calls.
    let passed = tests.status().context("seccomp: cannot run the tests")?.success();
    // SAFETY: signals the recorder this function started and has not reaped.
    unsafe { libc::kill(recorder.id() as i32, libc::SIGINT) };
    let out = recorder.wait_with_output()?;
    let numbers = recorded(&String::from_utf8_lossy(&out.stdout));
    if numbers.is_empty() {
        bail!(
            "seccomp: the recorder saw no agent system call: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    let names = syscall_names(Path::new("/usr/include/x86_64-linux-gnu/asm/unistd_64.h"))?;
    let mut seen = BTreeSet::new();
    for (number, count) in &numbers {
        let name = names.get(number).with_context(|| format!("seccomp: no name for system call {number}"))?;
        println!("seccomp: {name} ({count} calls)");
        seen.insert(name.clone());
    }
    let list_path = root.join(LIST);
    let before = std::fs::read_to_string(&list_path).unwrap_or_default();
    let mut all: BTreeSet<String> = list(&before).into_iter().collect();
    let new: Vec<&String> = seen.iter().filter(|n| !all.contains(*n)).collect();
    println!("seccomp: {} calls seen, {} not in {LIST} before: {new:?}", seen.len(), new.len());
    all.extend(seen);
    std::fs::write(&list_path, list_text(&all))?;
    profile()?;
    if !passed {
        println!("seccomp: some tests failed (their calls are recorded all the same)");
    }
    Ok(())
}

/// Writes the profile from the list.
pub fn profile() -> anyhow::Result<()> {
    let root = build::workspace_root();
    let text = std::fs::read_to_string(root.join(LIST)).with_context(|| format!("seccomp: read {LIST}"))?;
    std::fs::write(root.join(PROFILE), profile_json(&list(&text)))?;
    println!("seccomp: wrote {PROFILE}");
    Ok(())
}

/// `@calls[N]: count` lines of bpftrace's map print.
fn recorded(output: &str) -> BTreeMap<u32, u64> {
    output
        .lines()
        .filter_map(|l| {
            let (key, count) = l.strip_prefix("@calls[")?.split_once("]: ")?;
            Some((key.parse().ok()?, count.trim().parse().ok()?))
        })
        .collect()
}

/// Number -> name, from the kernel headers' `#define __NR_<name> <number>`.
fn syscall_names(header: &Path) -> anyhow::Result<BTreeMap<u32, String>> {
    let text =
        std::fs::read_to_string(header).with_context(|| format!("seccomp: read {}", header.display()))?;
    Ok(text
        .lines()
        .filter_map(|l| {
            let mut words = l.strip_prefix("#define __NR_")?.split_whitespace();
            let name = words.next()?;
            Some((words.next()?.parse().ok()?, name.to_string()))
        })
        .collect())
}

fn list(text: &str) -> Vec<String> {
    text.lines().map(str::trim).filter(|l| !l.is_empty() && !l.starts_with('#')).map(String::from).collect()
}

fn list_text(names: &BTreeSet<String>) -> String {
    let mut text = String::from(
        "# The system calls the agent and what it runs were seen to make (x86-64 names), recorded by\n\
         # `cargo xtask seccomp record` over the kernel test suite; merged, never pruned by hand.\n\
         # deploy/seccomp/kstall.json is written from this list.\n",
    );
    for name in names {
        text.push_str(name);
        text.push('\n');
    }
    text
}

/// The profile: every call in `seen`, what runs before the agent, and each arm64 successor of an
/// x86-64-only call; everything else refused with EPERM.
fn profile_json(seen: &[String]) -> String {
    let mut allowed: BTreeSet<&str> = seen.iter().map(String::as_str).collect();
    allowed.extend(BEFORE_THE_AGENT);
    for (old, successor) in ARM64_SUCCESSORS {
        if allowed.contains(old) {
            allowed.insert(successor);
        }
    }
    let profile = serde_json::json!({
        "defaultAction": "SCMP_ACT_ERRNO",
        "defaultErrnoRet": 1,
        "architectures": ["SCMP_ARCH_X86_64", "SCMP_ARCH_AARCH64"],
        "syscalls": [{"names": allowed, "action": "SCMP_ACT_ALLOW"}],
    });
    let mut text = serde_json::to_string_pretty(&profile).expect("JSON");
    text.push('\n');
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_committed_profile_is_what_the_list_makes() {
        let root = build::workspace_root();
        let list_text = std::fs::read_to_string(root.join(LIST)).expect(LIST);
        let committed = std::fs::read_to_string(root.join(PROFILE)).expect(PROFILE);
        assert!(
            committed == profile_json(&list(&list_text)),
            "{PROFILE} is stale: run `cargo xtask seccomp profile`"
        );
    }

    #[test]
    fn reads_bpftraces_map_and_the_headers_names() {
        let out = "Attaching 5 probes...\n@calls[0]: 12\n@calls[321]: 3\n\n@other[1]: 2\n";
        assert_eq!(recorded(out), BTreeMap::from([(0, 12), (321, 3)]));
        let dir = tempfile::tempdir().unwrap();
        let header = dir.path().join("unistd_64.h");
        std::fs::write(&header, "#define __NR_read 0\n#define __NR_bpf 321\n#ifndef X\n").unwrap();
        let names = syscall_names(&header).unwrap();
        assert_eq!((names[&0].as_str(), names[&321].as_str()), ("read", "bpf"));
    }

    #[test]
    fn the_profile_allows_the_arm64_successor_of_an_old_call() {
        let json: serde_json::Value =
            serde_json::from_str(&profile_json(&["epoll_wait".into(), "bpf".into()])).unwrap();
        let names = &json["syscalls"][0]["names"];
        let names: Vec<&str> = names.as_array().unwrap().iter().filter_map(|n| n.as_str()).collect();
        for name in ["bpf", "epoll_wait", "epoll_pwait", "execve", "fstatfs"] {
            assert!(names.contains(&name), "{name}: {names:?}");
        }
        assert!(!names.contains(&"open") && !names.contains(&"openat"), "only what was seen: {names:?}");
    }
}
