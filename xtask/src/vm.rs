//! `cargo xtask vm-test [--kernel 5.10 --kernel 7.3]`: the kernel matrix. Boots Debian's 5.10, 6.1,
//! 6.12 and 7.3 kernels under qemu (software emulation: this machine has no KVM) with virtme-ng, the
//! host's root file system shared read-only and what the guest runs of the checkout shared with it
//! explicitly (a checkout may be anywhere: [`guest`]), two one-CPU guests at a time, and in one
//! boot per kernel:
//! - runs the release agent and requires every probe to load and attach — a verifier rejection
//!   or a missing hook is a failure;
//! - runs the incident scenarios of `tests/tests/vm_scenarios.rs` (real NFS server and client,
//!   a real global OOM), which only a throw-away VM may run.
//!
//! Prints per kernel: boot seconds, each probe's hooks, each scenario's result, each incident's
//! time to name (first kernel signal to firing), wall time, and a line per failure naming the
//! scenario and its assertion. `--repeat N` runs it N times back to
//! back and ends with each run's wall time and the pass rate of every test that failed;
//! `--scenario FILTER` runs only the scenarios whose name contains FILTER. (The
//! host's 6.18 is the ordinary kernel tests'.) A full run that passes checks the kernel support
//! table (`docs/kernel-support.md`) against what the agents reported (`support.rs`) and writes
//! the times to name into `bench/results.md`.
//!
//! Installs what it needs first, idempotently: the bookworm-backports suite (a qemu matching the
//! preinstalled qemu-utils, the 6.12 kernel), the bullseye-security and trixie-backports suites
//! (pinned low: only the 5.10 and 7.3 kernels come from them), the kernels, the NFS server and
//! client, socat, bpftrace, a static busybox (virtme-ng needs it), and virtme-ng in a venv under
//! target/vm/.

use std::{
    os::unix::process::CommandExt as _,
    path::{Path, PathBuf},
    process::Command,
    time::{Duration, Instant},
};

use anyhow::{Context as _, bail};

use crate::{
    arch::Arch,
    background::Background,
    bootstrap::{self, BuildEnv},
    build, generated,
    libtest::{Failure, Results},
    lockup_module,
    repeat::Tally,
    seccomp, support,
};

mod guest;
mod guest_root;

/// One kernel of the matrix.
struct MatrixKernel {
    /// Version prefix (`--kernel` matches it).
    prefix: &'static str,
    arch: Arch,
    /// Where it comes from, for the kernel support table.
    label: &'static str,
    /// What installs it when no such kernel is installed (amd64: on this machine; arm64: in the
    /// guests' root file system, where a metapackage stands for the kernel it depends on).
    packages: &'static [&'static str],
    /// The Debian release it comes from, and the apt lines that reach its headers: the soft-lockup
    /// test module is built against them in a chroot of that release.
    release: &'static str,
    header_sources: &'static [&'static str],
}

/// 5.10 is Debian 11's (bullseye-security), 7.3 the newest Debian ships (trixie-backports, whose
/// split packages put `vmlinuz` in `/usr/lib/modules/<version>/`); both named exactly, so a run
/// boots what the kernel support table (`docs/kernel-support.md`) says was tested.
const KERNELS: &[MatrixKernel] = &[
    MatrixKernel {
        prefix: "5.10.",
        arch: Arch::Amd64,
        label: "Debian 11 bullseye-security",
        packages: &["linux-image-5.10.0-46-amd64"],
        release: "bullseye",
        header_sources: &[
            "deb http://deb.debian.org/debian bullseye main",
            "deb http://deb.debian.org/debian-security bullseye-security main",
        ],
    },
    MatrixKernel {
        prefix: "6.1.",
        arch: Arch::Amd64,
        label: "Debian 12",
        packages: &["linux-image-amd64"],
        release: "bookworm",
        header_sources: BOOKWORM,
    },
    MatrixKernel {
        prefix: "6.12.",
        arch: Arch::Amd64,
        label: "Debian 12 bookworm-backports",
        packages: &["linux-image-6.12.*+deb12-amd64"],
        release: "bookworm",
        header_sources: BOOKWORM,
    },
    MatrixKernel {
        prefix: "7.3.",
        arch: Arch::Amd64,
        label: "Debian 13 trixie-backports",
        packages: &["linux-binary-7.3.4+deb13-amd64", "linux-modules-7.3.4+deb13-amd64"],
        release: "trixie",
        header_sources: &[
            "deb http://deb.debian.org/debian trixie main",
            "deb http://deb.debian.org/debian trixie-backports main",
        ],
    },
    // arm64: the generic flavour of the same two Debian 12 kernels (Graviton's and Ampere's
    // instances boot it, or its -cloud sibling with the same BPF and BTF options).
    MatrixKernel {
        prefix: "6.1.",
        arch: Arch::Arm64,
        label: "Debian 12",
        packages: &["linux-image-arm64"],
        release: "bookworm",
        header_sources: BOOKWORM,
    },
    MatrixKernel {
        prefix: "6.12.",
        arch: Arch::Arm64,
        label: "Debian 12 bookworm-backports",
        packages: &["linux-image-6.12.*+deb12-arm64"],
        release: "bookworm",
        header_sources: BOOKWORM,
    },
];

/// Debian 12's kernels (and their headers) are in its point releases, its security suite and its
/// backports.
const BOOKWORM: &[&str] = &[
    "deb http://deb.debian.org/debian bookworm main",
    "deb http://deb.debian.org/debian bookworm-updates main",
    "deb http://deb.debian.org/debian-security bookworm-security main",
    "deb http://deb.debian.org/debian bookworm-backports main",
];

/// The suites the 5.10 and 7.3 kernels come from, pinned below the machine's own suites so that
/// nothing else is ever installed from them.
const KERNEL_SUITES: &str = "Types: deb\nURIs: http://deb.debian.org/debian-security\nSuites: bullseye-security\n\
    Components: main\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n\n\
    Types: deb\nURIs: http://deb.debian.org/debian\nSuites: trixie-backports\nComponents: main\n\
    Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg\n";
const KERNEL_SUITES_PIN: &str = "Package: *\nPin: release n=bullseye-security\nPin-Priority: 100\n\n\
    Package: *\nPin: release n=trixie-backports\nPin-Priority: 100\n";
/// A qemu crash (6.1 hit an `iotlb_to_section` assertion one boot in six) gets one more boot.
const ATTEMPTS: u32 = 2;
/// The guest gives the scenarios this long (they take 3-5 min under emulation), the VM a little more.
const SCENARIOS_TIMEOUT_SECS: u32 = 1200;
const BOOT_TIMEOUT_SECS: u32 = SCENARIOS_TIMEOUT_SECS + 300;
/// A guest boots in 30-50 s under emulation; one that has not reached its script by then never
/// will.
const BOOT_WITHIN: Duration = Duration::from_secs(300);
/// Small, so the system-OOM scenario fills it quickly.
const VM_MEMORY: &str = "1G";
/// Two one-CPU guests on this two-core machine: a guest is busy on one CPU most of the time (it
/// waits on timers, NFS timeouts and leases), so one CPU each runs it about as fast as two, and the
/// pair takes ~60% of the time of one after the other (measured: 6.1 and 6.12 together in 410 s,
/// apart in 305 + 365 s). Two two-CPU guests at once ran half as fast each: no gain.
const GUESTS_AT_ONCE: usize = 2;
const VM_CPUS: &str = "1";
/// Scenarios that run in a guest of their own with two CPUs, and why: a soft lockup holds its CPU,
/// so on one alone the agent could not run until the spin ends, and RCU could start no grace period
/// for the stuck CPU to hold up (its kthread needs a CPU).
const TWO_CPU_SCENARIOS: &[&str] = &["a_soft_lockup_is_named_with_its_cpu_task_pod_and_stack"];
/// Drivers for the emulated q35 machine's hardware (KVM for its virtual CPU, SATA, the CD drive,
/// PS/2, the TCO watchdog, SMBus) and CPU-accelerated crypto, which udev's coldplug loads at
/// every boot and no scenario uses: loading them under emulation held the boot 15-55 s (5.10 the
/// longest) before the guest's script could start.
const UNUSED_MODULES: &str = "kvm,kvm_amd,kvm_intel,irqbypass,ccp,iTCO_wdt,iTCO_vendor_support,intel_pmc_bxt,\
    i2c_i801,i2c_smbus,lpc_ich,i6300esb,psmouse,pcspkr,serio_raw,evdev,sr_mod,cdrom,\
    sg,ahci,libahci,libata,aesni_intel,ghash_clmulni_intel,crct10dif_pclmul,\
    crc32_pclmul,qemu_fw_cfg";

pub fn run(kernels: &[String], arches: &[Arch], repeat: u32, scenario: Option<&str>) -> anyhow::Result<()> {
    if let Some(bad) = scenario.filter(|s| !s.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')) {
        bail!("--scenario {bad:?}: a part of a test name (letters, digits, _)");
    }
    let env = bootstrap::run()?;
    matrix(&env, kernels, arches, repeat, scenario, None, false)
}

/// `--prepare-only`: what `arches`' guests run, built, and nothing booted.
pub fn prepare(arches: &[Arch]) -> anyhow::Result<()> {
    let env = bootstrap::run()?;
    let vm_dir = build::workspace_root().join("target/vm");
    install(&vm_dir, arches)?;
    for &arch in arches {
        Guests::prepare(&env, &vm_dir, arch)?;
    }
    Ok(())
}

/// The scenarios `cargo xtask test` runs on arm64 (its CI budget has room for these beside the
/// amd64 matrix): incident 1's sidecar redirect, its other meshes' and NFSv3's, and both OOM
/// kinds. `cargo xtask vm-test --arch arm64` runs them all.
pub const ARM64_CI_SCENARIOS: &[&str] = &[
    "nfs_through_a_dead_sidecar_is_named_and_the_break_glass_steps_free_it",
    "nfs_mounts_through_each_meshs_redirect_are_named_and_their_way_out_frees_them",
    "the_global_oom_killer_taking_a_node_daemon_is_a_critical_system_oom",
    "a_pod_squeezed_under_its_memory_limit_is_named_before_it_is_oom_killed",
];

/// Starts `cargo xtask vm-test --arch <arch> --prepare-only` in the background (for `cargo
/// xtask test`, beside its host tests), its output in target/vm/prepare-<arch>.log, after
/// installing with apt what it needs.
pub fn prepare_in_background(arch: Arch) -> anyhow::Result<Background> {
    let vm_dir = build::workspace_root().join("target/vm");
    install(&vm_dir, &[arch])?;
    arch.bootstrap()?;
    Background::start(
        &["vm-test", "--arch", arch.name(), "--prepare-only"],
        vm_dir.join(format!("prepare-{}.log", arch.name())),
        format!("vm-test: the {} guests' preparation", arch.name()),
    )
}

/// What one architecture's guests run: its agent and scenario binaries and, for a foreign
/// architecture, a root file system of its own (an amd64 guest shares this machine's).
struct Guests {
    arch: Arch,
    kstall: PathBuf,
    scenarios: PathBuf,
    root: Option<PathBuf>,
}

impl Guests {
    /// Builds `arch`'s binaries (cross-built for arm64) and its guests' root.
    fn prepare(env: &BuildEnv, vm_dir: &Path, arch: Arch) -> anyhow::Result<Self> {
        build::release_for(env, arch)?;
        let scenarios = build::test_binary(env, "vm_scenarios", &[], arch)?;
        let root = if arch.is_host() {
            None
        } else {
            let packages: Vec<&str> =
                KERNELS.iter().filter(|m| m.arch == arch).flat_map(|m| m.packages.iter().copied()).collect();
            Some(guest_root::ensure(vm_dir, arch, &packages)?)
        };
        Ok(Guests { arch, kstall: build::release_binary_for(arch), scenarios, root })
    }
}

/// Boots each kernel of `arches`, `repeat` times over. A failure prints one line per failed
/// scenario or probe, naming the kernel, the test and the assertion.
pub fn matrix(
    env: &BuildEnv,
    kernels: &[String],
    arches: &[Arch],
    repeat: u32,
    scenario: Option<&str>,
    arm64_subset: Option<&[&str]>,
    record_syscalls: bool,
) -> anyhow::Result<()> {
    let vm_dir = build::workspace_root().join("target/vm");
    let vng = install(&vm_dir, arches)?;
    let guests =
        arches.iter().map(|&a| Guests::prepare(env, &vm_dir, a)).collect::<anyhow::Result<Vec<_>>>()?;
    let selected = KERNELS
        .iter()
        .filter(|m| arches.contains(&m.arch))
        .filter(|m| {
            kernels.is_empty()
                || kernels.iter().any(|k| m.prefix.starts_with(&format!("{k}.")) || m.prefix == k)
        })
        .map(|m| {
            let root = guests.iter().find(|g| g.arch == m.arch).and_then(|g| g.root.as_deref());
            installed_kernel(m, root.unwrap_or(Path::new("/")))
                .with_context(|| format!("no {}x {} kernel installed", m.prefix, m.arch.name()))
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    if selected.is_empty() {
        let known: Vec<&str> = KERNELS.iter().map(|m| m.prefix.trim_end_matches('.')).collect();
        bail!("--kernel {}: the matrix has {}", kernels.join(" --kernel "), known.join(", "));
    }
    for kernel in selected.iter().filter(|k| k.arch.is_host()) {
        lockup_module::build(&vm_dir, &kernel.version, kernel.release, kernel.header_sources)?;
    }
    let mut tally = Tally::default();
    for run in 1..=repeat {
        if repeat > 1 {
            println!("==> vm-test run {run} of {repeat}");
        }
        let started = Instant::now();
        let (mut passed, mut failed) = (Vec::new(), Vec::new());
        let mut tested = Vec::new();
        let mut times_to_name = Vec::new();
        let mut benches = Vec::new();
        let boots = boots(&selected, scenario, arm64_subset, record_syscalls);
        let mut runs = boot_all(&boots, |b| {
            let guests = guests.iter().find(|g| g.arch == b.kernel.arch).expect("prepared");
            boot_and_check(&vng, &vm_dir, guests, b)
        })?
        .into_iter();
        for booted in &selected {
            let version = &booted.version;
            // Its boots, in the order `boots` listed them: the main one first.
            let mut kernel = runs.next().expect("a run per boot");
            for _ in boots.iter().filter(|b| b.kernel.version == *version).skip(1) {
                kernel.add(runs.next().expect("a run per boot"));
            }
            if !kernel.failed.is_empty() && repeat > 1 {
                // The next run overwrites the logs: keep this run's.
                for boot in boots.iter().filter(|b| b.kernel.version == *version) {
                    let out = vm_dir.join("out").join(&boot.name);
                    let kept = vm_dir.join("out").join(format!("{}.failed-run{run}", boot.name));
                    let _ = std::fs::remove_dir_all(&kept);
                    if std::fs::rename(&out, &kept).is_ok() {
                        println!("vm-test {version}: this run's logs kept in {}", kept.display());
                    }
                }
            }
            passed.extend(kernel.passed.iter().map(|t| format!("{version} {t}")));
            failed.extend(
                kernel.failed.into_iter().map(|f| Failure { test: format!("{version} {}", f.test), ..f }),
            );
            tested.push((booted.label, booted.arch, kernel.status));
            times_to_name.push((version.clone(), kernel.times_to_name));
            benches.push((version.clone(), kernel.benches));
        }
        println!("vm-test: {} kernel(s) in {:.0} s", selected.len(), started.elapsed().as_secs_f64());
        print!("{}", time_to_name_summary(&times_to_name));
        let every_kernel = failed.is_empty() && kernels.is_empty() && arches.len() == Arch::ALL.len();
        let every_scenario = scenario.is_none() && arm64_subset.is_none();
        tally.record(started.elapsed(), passed, failed);
        if every_kernel && every_scenario {
            let results = build::workspace_root().join("bench/results.md");
            // Read once: the first section written leaves the checkout modified.
            let revision = build::revision();
            generated::write(&results, "time-to-name", &time_to_name_table(&times_to_name, &revision))?;
            generated::write(&results, "nfs-rpc-cost", &nfs_rpc_cost_table(&benches, &revision))?;
            println!("vm-test: the times to name and the NFS RPC cost are in {}", results.display());
        }
        // The table is the probes' (each kernel's first boot), whichever scenarios ran.
        if every_kernel {
            let tested: Vec<support::Tested> = tested
                .iter()
                .map(|(label, arch, status)| support::Tested { label, arch: *arch, status })
                .collect();
            if support::update_doc(&support::doc(), &support::table(&tested))? {
                bail!(
                    "{}'s kernel support table differed from what this run's agents reported: \
                     rewritten from this run, review and commit it",
                    support::DOC
                );
            }
            println!("vm-test: {}'s kernel support table is what this run saw", support::DOC);
        }
    }
    if repeat > 1 {
        print!("{}", tally.summary("vm-test"));
    }
    if !tally.all_passed() {
        bail!("vm-test failed: see the FAILED lines above");
    }
    Ok(())
}

/// An incident should be named within this long of its first kernel signal (issue 37).
const TIME_TO_NAME_GOAL_SECS: f64 = 30.0;

/// Each kernel's times to name, in kernel order: `(version, [(signature, seconds)])`.
type TimesToName = [(String, Vec<(String, f64)>)];

/// The signatures the scenarios fired, in the order they first fired.
fn signatures(times: &TimesToName) -> Vec<&str> {
    let mut seen: Vec<&str> = Vec::new();
    for (signature, _) in times.iter().flat_map(|(_, t)| t) {
        if !seen.contains(&signature.as_str()) {
            seen.push(signature);
        }
    }
    seen
}

/// The times past the goal, as `signature on version (N s)`.
fn past_the_goal(times: &TimesToName) -> Vec<String> {
    let mut past = Vec::new();
    for (version, kernel) in times {
        for (signature, secs) in kernel.iter().filter(|(_, secs)| *secs >= TIME_TO_NAME_GOAL_SECS) {
            past.push(format!("{signature} on {version} ({secs:.1} s)"));
        }
    }
    past
}

/// One line for the run's end: the slowest time to name and what missed the goal.
fn time_to_name_summary(times: &TimesToName) -> String {
    let slowest = times
        .iter()
        .flat_map(|(v, t)| t.iter().map(move |(s, secs)| (v, s, secs)))
        .max_by(|a, b| a.2.total_cmp(b.2));
    let Some((version, signature, secs)) = slowest else { return String::new() };
    let past = past_the_goal(times);
    let goal = if past.is_empty() {
        format!("every one under the {TIME_TO_NAME_GOAL_SECS:.0} s goal")
    } else {
        format!("past the {TIME_TO_NAME_GOAL_SECS:.0} s goal: {}", past.join(", "))
    };
    format!("vm-test: time to name: slowest {signature} on {version}, {secs:.1} s; {goal}\n")
}

/// `bench/results.md`'s time-to-name section: a row per incident, a column per kernel.
fn time_to_name_table(times: &TimesToName, revision: &str) -> String {
    let mut out = format!(
        "## Time to name\n\n\
         Written by `cargo xtask vm-test` after a full run that passed; every figure is from that run.\n\n\
         - When: {}\n- kstall: {}\n\n\
         From each incident's first kernel signal to kstall firing it, as the agent recorded both: the \
         incident's `first_seen_unix_ns` (the first redirected reset, NFS error or OOM kill, or when \
         the longest-stuck task began to wait) and `fired_unix_ns`, in the VM matrix's incident \
         scenarios (`tests/tests/vm_scenarios.rs`; one-CPU guests under software emulation). Goal: under \
         {TIME_TO_NAME_GOAL_SECS:.0} s.\n\n| incident |",
        utc_now(),
        revision,
    );
    for (version, _) in times {
        out.push_str(&format!(" {version} |"));
    }
    out.push_str(&format!("\n|---|{}\n", "---|".repeat(times.len())));
    for signature in signatures(times) {
        out.push_str(&format!("| {signature} |"));
        for (_, kernel) in times {
            let secs: Vec<String> = kernel
                .iter()
                .filter(|(s, _)| s == signature)
                .map(|(_, secs)| format!("{secs:.1} s"))
                .collect();
            out.push_str(&format!(" {} |", if secs.is_empty() { "—".to_string() } else { secs.join(", ") }));
        }
        out.push('\n');
    }
    let past = past_the_goal(times);
    out.push_str(&if past.is_empty() {
        format!("\nEvery one under {TIME_TO_NAME_GOAL_SECS:.0} s.\n")
    } else {
        format!("\nPast {TIME_TO_NAME_GOAL_SECS:.0} s: {}.\n", past.join(", "))
    });
    out
}

/// When a generated section was written.
fn utc_now() -> String {
    Command::new("date")
        .args(["-u", "+%Y-%m-%d %H:%M UTC"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default()
}

/// `bench/results.md`'s NFS RPC cost section: a row per kernel, from its `vm-bench nfs-rpc` line
/// (cells as the scenario printed them).
fn nfs_rpc_cost_table(benches: &[(String, Vec<(String, String)>)], revision: &str) -> String {
    let mut out = format!(
        "## NFS RPC timing cost\n\n\
         Written by `cargo xtask vm-test` after a full run that passed; every figure is from that run \
         (`nfs_rpc_timing_costs_beside_bpftrace` in `tests/tests/vm_scenarios.rs`).\n\n\
         - When: {}\n- kstall: {}\n\n\
         A pod `stat()`s a file on a `noac` NFS mount for 20 s (a GETATTR RPC each), while kstall times \
         every RPC and, on the same two hooks, bpftrace does what kstall does there: \
         `tracepoint:sunrpc:rpc_task_begin /args->flags & 1/ {{ @caller[args->task_id] = cgroup; }}` \
         keeps an asynchronous RPC's caller (a `stat()` waits for its GETATTR: in this storm only the \
         flags are tested, as in kstall's program) and `tracepoint:sunrpc:rpc_stats_latency \
         {{ @us[args->client_id] = hist(args->execute); @rpcs = count(); }}` is the classic one-liner. \
         eBPF run time is the kernel's own (`kernel.bpf_stats_enabled`) per run, on each hook (begin + \
         latency); the ratio is for both, then per hook. bpftrace's classic tracepoints run after the \
         kernel has copied the event's fields (the program and procedure names as strings, the times \
         converted to µs), which is outside their run time; kstall's raw tracepoints read what they use \
         inside theirs. Runs missed are the kernel's \
         `recursion_misses` (a program preempted on a CPU, as 7.3 allows): RPCs kstall could not time. Agent \
         CPU is utime + stime over the storm, beside the agent's pace over 6 s with the mount idle just \
         before; what the storm added above that pace, scaled to 10,000 RPCs/s, is the last column (the \
         agent's work is per series and interval, not per RPC). One-CPU guests under \
         software emulation (two at a time on the host): the figures compare kstall with bpftrace \
         on each kernel; on hardware every figure is many times smaller.\n\n\
         | kernel | RPCs | rate | kstall eBPF per RPC (begin + latency) | bpftrace per RPC (begin + latency) | kstall ÷ bpftrace (begin, latency) | agent CPU (idle) | agent CPU above idle, per 10,000 RPCs/s |\n\
         |---|---|---|---|---|---|---|---|\n",
        utc_now(),
        revision,
    );
    for (version, runs) in benches {
        for (_, figures) in runs.iter().filter(|(bench, _)| bench == "nfs-rpc") {
            out.push_str(&format!("| {version} | {figures} |\n"));
        }
    }
    out
}

/// One boot of a kernel: its guest's CPUs, the scenarios it runs, its output directory's name and
/// where it sees the checkout.
struct Boot<'a> {
    kernel: &'a Kernel,
    cpus: &'static str,
    /// The scenarios' filter, as libtest takes it.
    filter: String,
    name: String,
    /// Where the guest finds the checkout: here, or under one of [`CHECKOUT_ELSEWHERE`].
    checkout_under: Option<&'static str>,
    /// The agent's system calls counted in the guest ([`seccomp::RECORDER`]).
    record_syscalls: bool,
}

/// Where people put a quick try of a project, and virtme-ng's init hides under a tmpfs in the
/// guest (issue 54: a checkout there failed every boot of the matrix). The first amd64 kernels
/// booted are each given this checkout as if it were under one of them, so every full matrix
/// proves a checkout there works.
const CHECKOUT_ELSEWHERE: &[&str] = &["/tmp", "/var/tmp"];

/// Each kernel's boots, a kernel's main one first: the main one runs every scenario `scenario`
/// selects but the two-CPU ones (and checks the probes) — on arm64 only `arm64_subset`'s when
/// given; a second, with two CPUs, those of [`TWO_CPU_SCENARIOS`] it selects.
fn boots<'a>(
    kernels: &'a [Kernel],
    scenario: Option<&str>,
    arm64_subset: Option<&[&str]>,
    record_syscalls: bool,
) -> Vec<Boot<'a>> {
    let selected = |name: &str| scenario.is_none_or(|s| name.contains(s));
    let skipped: String = TWO_CPU_SCENARIOS.iter().map(|t| format!(" --skip {t}")).collect();
    let mut boots = Vec::new();
    let mut elsewhere = CHECKOUT_ELSEWHERE.iter().copied();
    for kernel in kernels {
        let filter = match arm64_subset.filter(|_| kernel.arch == Arch::Arm64) {
            Some(subset) => {
                let subset = subset.iter().filter(|t| selected(t)).copied().collect::<Vec<_>>();
                format!("{} --exact", subset.join(" "))
            }
            None => format!("{}{skipped}", scenario.unwrap_or("")),
        };
        boots.push(Boot {
            kernel,
            cpus: VM_CPUS,
            filter: filter.trim().to_string(),
            name: kernel.version.clone(),
            checkout_under: if kernel.arch.is_host() { elsewhere.next() } else { None },
            record_syscalls,
        });
        // The soft-lockup test module is built for the amd64 kernels only.
        for test in TWO_CPU_SCENARIOS.iter().filter(|t| selected(t) && kernel.arch.is_host()) {
            boots.push(Boot {
                kernel,
                cpus: "2",
                filter: format!("{test} --exact"),
                name: format!("{}.2cpus", kernel.version),
                checkout_under: None,
                record_syscalls,
            });
        }
    }
    boots
}

/// Boots `kernels` [`GUESTS_AT_ONCE`] at a time, the next kernel in the list into the first free
/// slot (the list is slowest first: 5.10 verifies longest), printing each kernel's report as it
/// finishes; returns the runs in the list's order.
fn boot_all(
    boots: &[Boot],
    boot: impl Fn(&Boot) -> anyhow::Result<KernelRun> + Sync,
) -> anyhow::Result<Vec<KernelRun>> {
    let next = std::sync::atomic::AtomicUsize::new(0);
    let runs: std::sync::Mutex<Vec<Option<anyhow::Result<KernelRun>>>> =
        std::sync::Mutex::new(boots.iter().map(|_| None).collect());
    std::thread::scope(|scope| {
        for _ in 0..GUESTS_AT_ONCE.min(boots.len()) {
            scope.spawn(|| {
                loop {
                    let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    let Some(b) = boots.get(i) else { break };
                    let run = boot(b);
                    if let Ok(run) = &run {
                        let mut report = run.report.clone();
                        for failure in &run.failed {
                            report.push_str(&format!(
                                "vm-test {}: FAILED {}: {}\n",
                                b.name, failure.test, failure.why
                            ));
                        }
                        print!("{report}");
                    }
                    runs.lock().unwrap()[i] = Some(run);
                }
            });
        }
    });
    runs.into_inner().unwrap().into_iter().map(|run| run.expect("every boot ran")).collect()
}

/// A kernel to boot: its version, its image and how the kernel support table names it.
struct Kernel {
    version: String,
    arch: Arch,
    image: PathBuf,
    label: &'static str,
    release: &'static str,
    header_sources: &'static [&'static str],
}

/// The newest kernel of `m` installed in `root`: `/boot/vmlinuz-<version>`, or
/// `/usr/lib/modules/<version>/vmlinuz` (Debian's split kernel packages, from 7.x).
fn installed_kernel(m: &MatrixKernel, root: &Path) -> Option<Kernel> {
    let in_boot = std::fs::read_dir(root.join("boot"))
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| Some((e.file_name().to_str()?.strip_prefix("vmlinuz-")?.to_string(), e.path())));
    let in_modules =
        std::fs::read_dir(root.join("usr/lib/modules")).into_iter().flatten().flatten().filter_map(|e| {
            let image = e.path().join("vmlinuz");
            image.exists().then(|| (e.file_name().to_string_lossy().into_owned(), image))
        });
    in_boot
        .chain(in_modules)
        .filter(|(version, _)| version.starts_with(m.prefix) && version.ends_with(m.arch.name()))
        .max_by_key(|(version, _)| version_key(version))
        .map(|(version, image)| Kernel {
            version,
            arch: m.arch,
            image,
            label: m.label,
            release: m.release,
            header_sources: m.header_sources,
        })
}

/// A version's numbers, for ordering (`6.12.117+deb12` after `6.12.9`).
fn version_key(version: &str) -> Vec<u64> {
    version.split(|c: char| !c.is_ascii_digit()).filter_map(|p| p.parse().ok()).collect()
}

/// Installs what `arches`' guests need and is missing; returns the vng binary.
fn install(vm_dir: &Path, arches: &[Arch]) -> anyhow::Result<PathBuf> {
    let backports = Path::new("/etc/apt/sources.list.d/kstall-backports.sources");
    let has_backports = std::fs::read_dir("/etc/apt/sources.list.d")
        .into_iter()
        .flatten()
        .flatten()
        .any(|e| std::fs::read_to_string(e.path()).is_ok_and(|t| t.contains("bookworm-backports")));
    let mut updated = false;
    let apt_update = |updated: &mut bool| -> anyhow::Result<()> {
        if !*updated {
            bootstrap::run_step(
                Command::new("apt-get").args(["update", "-q"]).env("DEBIAN_FRONTEND", "noninteractive"),
                "apt-get update (no network to the Debian mirror?)",
            )?;
            *updated = true;
        }
        Ok(())
    };
    if !has_backports {
        println!("vm-test: adding the bookworm-backports suite ({})", backports.display());
        std::fs::write(
            backports,
            "Types: deb\nURIs: http://deb.debian.org/debian\nSuites: bookworm-backports\nComponents: main\n\
             Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg\n",
        )
        .context("write the backports source (needs root)")?;
    }
    let install = |packages: &[&str], backports: bool| -> anyhow::Result<()> {
        let mut cmd = Command::new("apt-get");
        cmd.args(["install", "-y", "-q", "--no-install-recommends"]);
        if backports {
            cmd.args(["-t", "bookworm-backports"]);
        }
        cmd.args(packages).env("DEBIAN_FRONTEND", "noninteractive");
        println!("vm-test: installing {}", packages.join(" "));
        bootstrap::run_step(&mut cmd, &format!("apt-get install {}", packages.join(" ")))
    };
    // Both from backports, to match its qemu-system-common; qemu-user runs the arm64 root's
    // maintainer scripts while mmdebstrap makes it.
    let qemu: &[&str] = if arches.contains(&Arch::Arm64) {
        &["qemu-system-x86", "qemu-system-arm", "qemu-user-static"]
    } else {
        &["qemu-system-x86"]
    };
    let qemu: Vec<&str> = qemu.iter().copied().filter(|p| !bootstrap::dpkg_installed(p)).collect();
    if !qemu.is_empty() {
        apt_update(&mut updated)?;
        install(&qemu, true)?;
    }
    let missing: Vec<&str> = [
        "busybox-static",
        "kmod",
        "zstd",
        "python3-venv",
        "nfs-kernel-server",
        "nfs-common",
        "socat",
        "iptables",
        "iproute2",
        "mmdebstrap",
        // mmdebstrap's check that it can run another architecture's programs.
        "arch-test",
        // The RPC timing scenario's one-liner beside kstall (amd64 guests run this machine's).
        "bpftrace",
    ]
    .into_iter()
    .filter(|p| !bootstrap::dpkg_installed(p))
    .collect();
    if !missing.is_empty() {
        apt_update(&mut updated)?;
        install(&missing, false)?;
    }
    let kernel_suites = Path::new("/etc/apt/sources.list.d/kstall-kernels.sources");
    if !kernel_suites.exists() {
        println!(
            "vm-test: adding the bullseye-security and trixie-backports suites for the 5.10 and 7.3 kernels"
        );
        std::fs::write(kernel_suites, KERNEL_SUITES).context("write the kernels' apt source (needs root)")?;
        std::fs::write("/etc/apt/preferences.d/kstall-kernels", KERNEL_SUITES_PIN)
            .context("write the kernels' apt pin")?;
        updated = false;
    }
    for m in KERNELS.iter().filter(|m| m.arch.is_host()) {
        if installed_kernel(m, Path::new("/")).is_none() {
            apt_update(&mut updated)?;
            let packages = m
                .packages
                .iter()
                .map(|p| if p.contains('*') { newest_package(p) } else { Ok(p.to_string()) })
                .collect::<anyhow::Result<Vec<_>>>()?;
            install(&packages.iter().map(String::as_str).collect::<Vec<_>>(), false)?;
        }
    }
    let venv = vm_dir.join("venv");
    let vng = venv.join("bin/vng");
    if !vng.exists() {
        println!("vm-test: installing virtme-ng (PyPI) into {}", venv.display());
        std::fs::create_dir_all(vm_dir).context("create target/vm")?;
        bootstrap::run_step(
            Command::new("/usr/bin/python3").args(["-m", "venv"]).arg(&venv),
            "python3 -m venv",
        )?;
        bootstrap::run_step(
            Command::new(venv.join("bin/pip")).args(["install", "-q", "virtme-ng"]),
            "pip install virtme-ng",
        )?;
    }
    Ok(vng)
}

/// The newest package matching `pattern` (an apt-cache regex with `*` for the version).
fn newest_package(pattern: &str) -> anyhow::Result<String> {
    let regex = format!("^{}$", pattern.replace('.', "\\.").replace('+', "\\+").replace('*', ".*"));
    let out =
        Command::new("apt-cache").args(["search", "--names-only", &regex]).output().context("apt-cache")?;
    let mut names: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().next().map(String::from))
        .filter(|n| !n.contains("-unsigned") && !n.contains("-dbg"))
        .collect();
    names.sort_by_key(|n| version_key(n));
    names.pop().with_context(|| format!("no package matches {pattern}"))
}

/// One boot of one kernel: what to print, the scenarios that passed, what failed, and the agent's
/// status there (`kstall status --output json`).
struct KernelRun {
    report: String,
    passed: Vec<String>,
    failed: Vec<Failure>,
    status: serde_json::Value,
    /// Each incident's time from its first kernel signal to firing, in seconds.
    times_to_name: Vec<(String, f64)>,
    /// What the benchmarks run in the guest measured: `(bench, figures)`.
    benches: Vec<(String, String)>,
}

impl KernelRun {
    /// A boot that gave no result, and why.
    fn failed_to_boot(boot: &str, attempts: u32, why: String) -> Self {
        KernelRun {
            report: format!("vm-test {boot}: no result after {attempts} boot(s)\n"),
            passed: Vec::new(),
            failed: vec![Failure { test: "boot".into(), why }],
            status: serde_json::Value::Null,
            times_to_name: Vec::new(),
            benches: Vec::new(),
        }
    }

    /// Another boot's run of the same kernel (its report already printed): its scenarios and
    /// failures join this one's; the main boot's status stays the kernel's.
    fn add(&mut self, other: KernelRun) {
        self.passed.extend(other.passed);
        self.failed.extend(other.failed);
        self.times_to_name.extend(other.times_to_name);
        self.benches.extend(other.benches);
    }
}

/// Boots `version` and reads what the guest left. Errs only when the VM cannot be started at all.
fn boot_and_check(vng: &Path, vm_dir: &Path, guests: &Guests, boot: &Boot) -> anyhow::Result<KernelRun> {
    let kernel = boot.kernel;
    let version = &boot.name;
    let out = vm_dir.join("out").join(version);
    let checkout = match boot.checkout_under {
        Some(dir) => guest::Checkout::under(dir, version)?,
        None => guest::Checkout::here(),
    };
    let started = Instant::now();
    let mut attempt = 0;
    loop {
        attempt += 1;
        let _ = std::fs::remove_dir_all(&out);
        std::fs::create_dir_all(&out).context("create the output directory")?;
        let run = guest::Run {
            kstall: &guests.kstall,
            scenarios: &guests.scenarios,
            timeout_secs: SCENARIOS_TIMEOUT_SECS,
            filter: &boot.filter,
            syscall_recorder: boot.record_syscalls.then_some(seccomp::RECORDER),
        };
        let command = guest::prepare(&out, &checkout, &run)?;
        let vm = |dry_run: bool| -> anyhow::Result<Command> {
            let mut vm = Command::new("timeout");
            vm.arg(BOOT_TIMEOUT_SECS.to_string());
            checkout.enter(&mut vm);
            // vng runs virtme-run, its sibling in the venv; from / (the guest is told its
            // working directory on the kernel command line).
            let path = format!(
                "{}:{}",
                vng.parent().map(|p| p.display().to_string()).unwrap_or_default(),
                std::env::var("PATH").unwrap_or_default()
            );
            vm.arg(vng).env("PATH", path).current_dir("/");
            if dry_run {
                vm.arg("--dry-run");
            }
            vm.args(["--disable-kvm", "--memory", VM_MEMORY, "--cpus", boot.cpus]);
            match &guests.root {
                None => vm.args(["--append", &format!("module_blacklist={UNUSED_MODULES}")]),
                Some(root) => vm.args(["--arch", guests.arch.name(), "--root"]).arg(root),
            };
            checkout.share(&mut vm, &out, guests.root.as_deref())?;
            vm.arg("--run").arg(&kernel.image).arg("--exec").arg(&command);
            Ok(vm)
        };
        let dry_run = vm(true)?.output().context("vng --dry-run")?;
        if let Some(why) = guest::command_line_too_long(&String::from_utf8_lossy(&dry_run.stdout)) {
            return Ok(KernelRun::failed_to_boot(version, attempt, why));
        }
        let console = std::fs::File::create(out.join("console.log")).context("console log")?;
        let mut vm = vm(false)?
            .stdout(console.try_clone()?)
            .stderr(console)
            // Its own group: a guest that never boots is killed with its qemu.
            .process_group(0)
            .spawn()
            .context("run vng")?;
        let booting = Instant::now();
        let ran = loop {
            if let Some(status) = vm.try_wait().context("wait for vng")? {
                break status.to_string();
            }
            // The guest writes boot_secs first thing; without it the kernel hung in its boot (seen
            // in one of the first three 7.3 boots here: qemu spinning, the console empty).
            if !out.join("boot_secs").exists() && booting.elapsed() > BOOT_WITHIN {
                // SAFETY: kill(2) on the process group this spawn created.
                unsafe { libc::kill(-(vm.id() as i32), libc::SIGKILL) };
                let _ = vm.wait();
                break format!("no boot within {} s", BOOT_WITHIN.as_secs());
            }
            std::thread::sleep(Duration::from_secs(1));
        };
        if out.join("done").exists() {
            break;
        }
        // What the guest could not see stays unseen at the next boot: say it now.
        let console = std::fs::read_to_string(out.join("console.log")).unwrap_or_default();
        let unseen = guest::unseen(&console);
        if !unseen.is_empty() {
            let why = format!("the guest could not see {} (not shared with it)", unseen.join(", "));
            return Ok(KernelRun::failed_to_boot(version, attempt, why));
        }
        if attempt >= ATTEMPTS {
            let why = format!("the guest did not finish ({ran}); see {}", out.join("console.log").display());
            return Ok(KernelRun::failed_to_boot(version, attempt, why));
        }
        println!("vm-test {version}: the VM did not finish ({ran}), booting again");
    }
    let boot_secs: f64 = std::fs::read_to_string(out.join("boot_secs"))
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(0.0);
    let status = std::fs::read_to_string(out.join("status.json")).unwrap_or_default();
    let status: serde_json::Value = serde_json::from_str(&status).unwrap_or_default();
    let mut report = format!(
        "vm-test {version}: kernel {} · booted in {boot_secs:.0} s · wall {:.0} s · attempts {attempt}\n",
        status["kernel"].as_str().unwrap_or("?"),
        started.elapsed().as_secs_f64()
    );
    if let Some(at) = checkout.elsewhere() {
        report.push_str(&format!("  checkout: seen at {}\n", at.display()));
    }
    let mut failed = Vec::new();
    if status["probes"].as_array().is_none() {
        let why = format!("the agent gave no status; see {}", out.join("agent.log").display());
        failed.push(Failure { test: "agent status".into(), why });
    }
    for p in status["probes"].as_array().into_iter().flatten() {
        let name = p["name"].as_str().unwrap_or("?");
        if p["up"] == true {
            report.push_str(&format!("  {name:<10} up    {}\n", p["hook"].as_str().unwrap_or("")));
            for note in p["notes"].as_array().into_iter().flatten().filter_map(|n| n.as_str()) {
                report.push_str(&format!("  {:<10}       {note}\n", ""));
            }
            for missing in p["unavailable"].as_array().into_iter().flatten() {
                let (field, why) =
                    (missing["field"].as_str().unwrap_or("?"), missing["why"].as_str().unwrap_or("?"));
                report.push_str(&format!("  {:<10}       unavailable: {field} ({why})\n", ""));
            }
        } else {
            let reason = p["reason"].as_str().unwrap_or("?");
            report.push_str(&format!("  {name:<10} DOWN  {reason}\n"));
            failed.push(Failure { test: format!("probe {name}"), why: reason.to_string() });
        }
    }
    let log_path = out.join("scenarios.log");
    let log = std::fs::read_to_string(&log_path).unwrap_or_default();
    let results = Results::parse(&log);
    report.push_str(&format!(
        "  scenarios: {} passed, {} failed ({:.0} s; log {})\n",
        results.passed.len(),
        results.failed.len(),
        std::fs::read_to_string(out.join("scenarios_secs"))
            .unwrap_or_default()
            .trim()
            .parse::<f64>()
            .unwrap_or(0.0),
        log_path.display()
    ));
    for line in &results.reports {
        report.push_str(&format!("    {line}\n"));
    }
    if !results.times_to_name.is_empty() {
        let times: Vec<String> = results
            .times_to_name
            .iter()
            .map(|(signature, secs)| format!("{signature} {secs:.1} s"))
            .collect();
        report.push_str(&format!("  time to name: {}\n", times.join(", ")));
    }
    for (bench, figures) in &results.benches {
        report.push_str(&format!("  bench {bench}: {figures}\n"));
    }
    failed.extend(results.failed);
    let rc = std::fs::read_to_string(out.join("scenarios.rc")).unwrap_or_default();
    if let Some(test) = results.unfinished {
        let why =
            format!("did not finish within the scenarios' {SCENARIOS_TIMEOUT_SECS} s (exit {})", rc.trim());
        failed.push(Failure { test, why });
    } else if results.passed.is_empty() || (failed.is_empty() && rc.trim() != "0") {
        let why = format!("did not run to the end (exit {}); see {}", rc.trim(), log_path.display());
        failed.push(Failure { test: "scenarios".into(), why });
    }
    Ok(KernelRun {
        report,
        passed: results.passed,
        failed,
        status,
        times_to_name: results.times_to_name,
        benches: results.benches,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn times() -> Vec<(String, Vec<(String, f64)>)> {
        let named = |t: &[(&str, f64)]| t.iter().map(|(s, secs)| (s.to_string(), *secs)).collect();
        vec![
            ("5.10.0-46-amd64".into(), named(&[("nfs-sidecar-redirect", 4.25), ("system-oom", 31.0)])),
            ("6.1.0-44-amd64".into(), named(&[("nfs-sidecar-redirect", 3.0), ("nfs-node-wide-stall", 12.5)])),
        ]
    }

    #[test]
    fn the_two_cpu_scenarios_boot_a_guest_of_their_own_when_selected() {
        let kernel = |version: &str| Kernel {
            version: version.into(),
            arch: if version.ends_with("arm64") { Arch::Arm64 } else { Arch::Amd64 },
            image: PathBuf::from("/boot/vmlinuz"),
            label: "Debian",
            release: "bookworm",
            header_sources: BOOKWORM,
        };
        let kernels = [kernel("6.1.0-57-amd64"), kernel("7.3.4+deb13-amd64"), kernel("6.12.118+deb12-arm64")];
        let shown = |scenario| {
            boots(&kernels, scenario, None, false)
                .iter()
                .map(|b| format!("{} {} {}", b.name, b.cpus, b.filter))
                .collect::<Vec<_>>()
        };
        let lockup = TWO_CPU_SCENARIOS[0];
        assert_eq!(
            shown(None),
            [
                format!("6.1.0-57-amd64 1 --skip {lockup}"),
                format!("6.1.0-57-amd64.2cpus 2 {lockup} --exact"),
                format!("7.3.4+deb13-amd64 1 --skip {lockup}"),
                format!("7.3.4+deb13-amd64.2cpus 2 {lockup} --exact"),
                format!("6.12.118+deb12-arm64 1 --skip {lockup}"),
            ],
            "the lockup module is built for amd64 kernels only"
        );
        let under: Vec<Option<&str>> =
            boots(&kernels, None, None, false).iter().map(|b| b.checkout_under).collect();
        assert_eq!(
            under,
            [Some("/tmp"), None, Some("/var/tmp"), None, None],
            "the first two amd64 kernels' main boots see the checkout under /tmp and /var/tmp"
        );
        assert_eq!(
            shown(Some("nfs_slow")),
            [
                format!("6.1.0-57-amd64 1 nfs_slow --skip {lockup}"),
                format!("7.3.4+deb13-amd64 1 nfs_slow --skip {lockup}"),
                format!("6.12.118+deb12-arm64 1 nfs_slow --skip {lockup}"),
            ]
        );
        assert_eq!(shown(Some("soft_lockup"))[1], format!("6.1.0-57-amd64.2cpus 2 {lockup} --exact"));
        let subset = boots(&kernels, None, Some(&["nfs_a", "oom_b"]), false);
        let filters: Vec<&str> = subset.iter().map(|b| b.filter.as_str()).collect();
        assert_eq!(filters[0], format!("--skip {lockup}"), "amd64 runs every scenario");
        assert_eq!(filters[4], "nfs_a oom_b --exact", "arm64 only the subset");
    }

    #[test]
    fn a_row_per_incident_a_column_per_kernel_and_what_missed_the_goal() {
        let table = time_to_name_table(&times(), "abc1234");
        let rows: Vec<&str> = table.lines().filter(|l| l.starts_with('|')).collect();
        assert_eq!(
            rows,
            [
                "| incident | 5.10.0-46-amd64 | 6.1.0-44-amd64 |",
                "|---|---|---|",
                "| nfs-sidecar-redirect | 4.2 s | 3.0 s |",
                "| system-oom | 31.0 s | — |",
                "| nfs-node-wide-stall | — | 12.5 s |",
            ]
        );
        assert!(table.ends_with("\nPast 30 s: system-oom on 5.10.0-46-amd64 (31.0 s).\n"), "{table}");
        assert_eq!(
            time_to_name_summary(&times()),
            "vm-test: time to name: slowest system-oom on 5.10.0-46-amd64, 31.0 s; past the 30 s goal: \
             system-oom on 5.10.0-46-amd64 (31.0 s)\n"
        );
        assert_eq!(time_to_name_summary(&[]), "", "nothing fired, nothing to say");
    }
}
