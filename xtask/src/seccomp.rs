//! `cargo xtask seccomp`: the agent's seccomp profile, `deploy/seccomp/kstall.json`, from the system
//! calls the agent was seen to make — not from a guess.
//!
//! `record` runs the host kernel test suite (every test that starts an agent: probes, storms,
//! incidents, the API, the containers) and then the kernel matrix (each guest, 5.10 to 7.3 and
//! arm64, running its incident scenarios: real NFS, real OOM kills, mesh redirects) with a
//! bpftrace recorder that follows every process started from a binary named `kstall` and its
//! children (what it runs: inside a container they are under the same filter) and counts their
//! system calls; a cluster running then (`cargo xtask cluster up`) has its agent's calls counted
//! too. The recorder starts what it watches once its probes are attached (bpftrace's `-c`), so
//! nothing runs unwatched. The names seen are merged into `deploy/seccomp/syscalls.txt`, and the
//! profile is written from that list.
//! `profile` only writes the profile from the list; a unit test fails when the committed one is
//! not what it writes.

use std::{
    collections::{BTreeMap, BTreeSet},
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context as _, bail};

use crate::{arch::Arch, bootstrap, build, vm};

const LIST: &str = "deploy/seccomp/syscalls.txt";
const PROFILE: &str = "deploy/seccomp/kstall.json";

/// Follows the agent's processes from their exec (and their children from their fork) and counts
/// their system calls by number. The `pid_t` define: bpftrace 0.17 cannot type the fork
/// tracepoint's `pid_t` fields on 5.10 from its BTF ("unknown type name 'pid_t'"), and the arm64
/// guests' root has no libc headers to include.
pub const RECORDER: &str = r#"
#define pid_t int
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
    // glibc renames with renameat where the kernel has it, as arm64 does (recorded in its guests).
    ("rename", "renameat"),
    ("rmdir", "unlinkat"),
    ("select", "pselect6"),
    ("stat", "newfstatat"),
    ("unlink", "unlinkat"),
    ("vfork", "clone"),
];

/// Which runs `record` watches.
#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Suites {
    /// The host kernel test suite, then the kernel matrix.
    All,
    /// The host kernel test suite (and a cluster running then).
    Host,
    /// The kernel matrix's scenarios, in each guest (5.10 to 7.3, amd64 and arm64).
    Vms,
}

pub fn record(suites: Suites, tests: &[String]) -> anyhow::Result<()> {
    if !bootstrap::is_root() {
        bail!("seccomp record: bpftrace and the kernel tests need root");
    }
    if !tests.is_empty() && suites != Suites::Host {
        bail!("seccomp record: --test names host test files: give --suites host");
    }
    let env = bootstrap::run()?;
    bootstrap::apt_install(&["bpftrace", "linux-libc-dev", "linux-libc-dev-arm64-cross"])?;
    let mut seen = BTreeSet::new();
    let mut failed = Vec::new();
    if suites != Suites::Vms {
        let (names, passed) = record_host(&env, tests)?;
        println!("seccomp: the host kernel test suite made {} distinct calls", names.len());
        seen.extend(names);
        if !passed {
            failed.push("the host kernel test suite".to_string());
        }
    }
    if suites != Suites::Host {
        let (recordings, passed) = record_vms(&env)?;
        for GuestRecording { boot, names } in recordings {
            println!("seccomp: guest {boot} made {} distinct calls", names.len());
            seen.extend(names);
        }
        if !passed {
            failed.push("the kernel matrix".to_string());
        }
    }
    merge(&seen)?;
    if !failed.is_empty() {
        // The calls are what is wanted, pass or fail: a failing test still made its calls.
        println!("seccomp: {} failed (their calls are recorded all the same)", failed.join(" and "));
    }
    Ok(())
}

/// The host kernel test suite (or its files `tests`) under the recorder: the names seen, and
/// whether the tests passed.
fn record_host(env: &bootstrap::BuildEnv, tests: &[String]) -> anyhow::Result<(BTreeSet<String>, bool)> {
    build::release(env)?;
    let root = build::workspace_root();
    let dir = root.join("target/seccomp");
    std::fs::create_dir_all(&dir).context("seccomp: create target/seccomp")?;
    let _tracefs = Tracefs::mounted()?;
    let recorder = dir.join("recorder.bt");
    std::fs::write(&recorder, RECORDER).context("seccomp: write the recorder")?;
    let counts = dir.join("host.bt");
    let status = dir.join("host.status");
    let _ = std::fs::remove_file(&status);
    println!("==> the kernel test suite, with the agent's system calls recorded");
    // bpftrace starts the tests once its probes are attached (-c) and writes the counts when
    // they end; the tests' own exit status is lost there, so the shell keeps it.
    let files: String = tests.iter().map(|t| format!(" --test {t}")).collect();
    let tests = format!(
        "cargo test --package kstall-tests --no-fail-fast{files} -- --test-threads=1; echo $? > {}",
        status.display()
    );
    let mut bpftrace = Command::new("bpftrace");
    bpftrace
        .arg("-q")
        .arg("-o")
        .arg(&counts)
        .arg("-c")
        .arg(format!("/bin/sh {}", write_script(&dir.join("host.sh"), &tests)?.display()))
        .arg(&recorder)
        .env("KSTALL_BIN", build::release_binary())
        .env("KSTALL_KERNEL_TESTS", "require")
        .current_dir(&root);
    env.apply(&mut bpftrace);
    let ran = bpftrace.status().context("seccomp: cannot run bpftrace")?;
    if !ran.success() {
        bail!("seccomp: bpftrace failed ({ran}): its error is above");
    }
    let passed = std::fs::read_to_string(&status).is_ok_and(|s| s.trim() == "0");
    let names = names_of(&counts, X86_64_HEADER)?;
    Ok((names, passed))
}

/// The kernel matrix with the recorder in each guest: each boot's names, and whether it passed.
fn record_vms(env: &bootstrap::BuildEnv) -> anyhow::Result<(Vec<GuestRecording>, bool)> {
    let out = build::workspace_root().join("target/vm/out");
    // Only this run's boots: an earlier run's recordings would be merged as this one's.
    let _ = std::fs::remove_dir_all(&out);
    println!("==> the kernel matrix, with the agent's system calls recorded in each guest");
    let ran = vm::matrix(env, &[], &Arch::ALL, 1, None, Some(vm::ARM64_CI_SCENARIOS), true);
    if let Err(e) = &ran {
        println!("seccomp: the kernel matrix: {e:#}");
    }
    let mut boots: Vec<_> = std::fs::read_dir(&out)
        .with_context(|| format!("seccomp: read {}", out.display()))?
        .filter_map(Result::ok)
        .map(|e| e.path())
        .collect();
    boots.sort();
    let mut recordings = Vec::new();
    for boot in boots {
        let name = boot.file_name().expect("a boot").to_string_lossy().into_owned();
        let counts = boot.join("syscalls.bt");
        if !counts.exists() {
            bail!(
                "seccomp: guest {name} wrote no recording: its console is {}",
                boot.join("console.log").display()
            );
        }
        let machine = std::fs::read_to_string(boot.join("machine")).unwrap_or_default();
        let header = match machine.trim() {
            "x86_64" => X86_64_HEADER,
            "aarch64" => ARM64_HEADER,
            other => bail!("seccomp: guest {name} is a {other:?} machine, not x86_64 or aarch64"),
        };
        recordings.push(GuestRecording { names: names_of(&counts, header)?, boot: name });
    }
    if recordings.is_empty() {
        bail!("seccomp: no guest booted");
    }
    Ok((recordings, ran.is_ok()))
}

/// The calls one boot of the matrix saw the agent make.
struct GuestRecording {
    boot: String,
    names: BTreeSet<String>,
}

/// The x86-64 and arm64 system call numbers, from the kernel's headers (linux-libc-dev and
/// linux-libc-dev-arm64-cross).
const X86_64_HEADER: &str = "/usr/include/x86_64-linux-gnu/asm/unistd_64.h";
const ARM64_HEADER: &str = "/usr/aarch64-linux-gnu/include/asm-generic/unistd.h";

/// The names of the calls in a recording (bpftrace's map print), by `header`'s numbers.
fn names_of(counts: &Path, header: &str) -> anyhow::Result<BTreeSet<String>> {
    let text =
        std::fs::read_to_string(counts).with_context(|| format!("seccomp: read {}", counts.display()))?;
    let numbers = recorded(&text);
    if numbers.is_empty() {
        bail!("seccomp: {} holds no agent system call", counts.display());
    }
    let names = syscall_names(Path::new(header))?;
    numbers
        .keys()
        .map(|number| {
            names.get(number).cloned().with_context(|| {
                format!("seccomp: {} names no system call {number} ({})", header, counts.display())
            })
        })
        .collect()
}

/// Merges `seen` into the list and writes the profile from it.
fn merge(seen: &BTreeSet<String>) -> anyhow::Result<()> {
    let list_path = build::workspace_root().join(LIST);
    let before = std::fs::read_to_string(&list_path).unwrap_or_default();
    let mut all: BTreeSet<String> = list(&before).into_iter().collect();
    let new: Vec<&String> = seen.iter().filter(|n| !all.contains(*n)).collect();
    println!("seccomp: {} calls seen, {} not in {LIST} before: {new:?}", seen.len(), new.len());
    all.extend(seen.iter().cloned());
    std::fs::write(&list_path, list_text(&all))?;
    profile()
}

fn write_script(path: &Path, text: &str) -> anyhow::Result<PathBuf> {
    std::fs::write(path, format!("{text}\n"))
        .with_context(|| format!("seccomp: write {}", path.display()))?;
    Ok(path.to_path_buf())
}

/// tracefs at /sys/kernel/tracing while the recorder runs (bpftrace attaches classic
/// tracepoints through it), unmounted after if it was mounted for it. The tests that mount it
/// themselves find it mounted and leave it.
struct Tracefs {
    mounted_here: bool,
}

impl Tracefs {
    fn mounted() -> anyhow::Result<Self> {
        if Path::new("/sys/kernel/tracing/events").exists() {
            return Ok(Tracefs { mounted_here: false });
        }
        bootstrap::run_step(
            Command::new("mount").args(["-t", "tracefs", "tracefs", "/sys/kernel/tracing"]),
            "mount tracefs",
        )?;
        Ok(Tracefs { mounted_here: true })
    }
}

impl Drop for Tracefs {
    fn drop(&mut self) {
        if self.mounted_here {
            let _ = Command::new("umount").arg("/sys/kernel/tracing").status();
        }
    }
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

/// Number -> name, from the kernel headers' `#define __NR_<name> <number>`. arm64's
/// (asm-generic) defines some 64-bit calls through an alias (`#define __NR_fstat __NR3264_fstat`),
/// the 64-bit name before the 32-bit one of the same number: the first name of a number wins.
fn syscall_names(header: &Path) -> anyhow::Result<BTreeMap<u32, String>> {
    let text =
        std::fs::read_to_string(header).with_context(|| format!("seccomp: read {}", header.display()))?;
    let defines: Vec<(&str, &str)> = text
        .lines()
        .filter_map(|l| {
            let mut words = l.strip_prefix("#define ")?.split_whitespace();
            Some((words.next()?, words.next()?))
        })
        .collect();
    let number = |value: &str| -> Option<u32> {
        value.parse().ok().or_else(|| defines.iter().find(|(n, _)| *n == value)?.1.parse().ok())
    };
    let mut names = BTreeMap::new();
    for (define, value) in &defines {
        let Some(name) = define.strip_prefix("__NR_").filter(|n| *n != "syscalls") else { continue };
        if let Some(number) = number(value) {
            names.entry(number).or_insert_with(|| name.to_string());
        }
    }
    Ok(names)
}

fn list(text: &str) -> Vec<String> {
    text.lines().map(str::trim).filter(|l| !l.is_empty() && !l.starts_with('#')).map(String::from).collect()
}

fn list_text(names: &BTreeSet<String>) -> String {
    let mut text = String::from(
        "# The system calls the agent and what it runs were seen to make, recorded by `cargo xtask\n\
         # seccomp record` over the host kernel test suite and the kernel matrix's guests (x86-64 and\n\
         # arm64, by their names); merged, never pruned by hand.\n\
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
    fn reads_arm64s_aliased_numbers_by_their_64_bit_names() {
        let dir = tempfile::tempdir().unwrap();
        let header = dir.path().join("unistd.h");
        let text = "#define __NR_io_setup 0\n__SC_COMP(__NR_io_setup, sys_io_setup)\n\
                    #define __NR3264_fstat 80\n#define __NR_bpf 280\n#define __NR_syscalls 463\n\
                    #if __BITS_PER_LONG == 64 && !defined(__SYSCALL_COMPAT)\n\
                    #define __NR_fstat __NR3264_fstat\n#else\n#define __NR_fstat64 __NR3264_fstat\n#endif\n";
        std::fs::write(&header, text).unwrap();
        let names = syscall_names(&header).unwrap();
        let expected = [(0, "io_setup"), (80, "fstat"), (280, "bpf")].map(|(n, s)| (n, s.to_string()));
        assert_eq!(names, BTreeMap::from(expected));
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
