//! `cargo xtask test`: the second README command and what CI runs. Bootstrap, build, format and
//! lint checks, every unit test, every kernel integration test, (as root) the tests on a real
//! Kubernetes (`cargo xtask cluster`), each fuzz target for a moment, and (as root) the kernel
//! matrix in VMs. `--repeat N` runs the tests N times back to back (the checks once) and ends with the
//! pass rate of every test that failed; `--no-matrix` leaves the VMs out.
//!
//! As root (always so in CI) the kernel tests are required: one that cannot run fails instead of
//! skipping.

use std::{
    io::{BufRead as _, BufReader},
    process::{Command, Stdio},
    sync::mpsc,
    time::Instant,
};

use anyhow::{Context as _, bail};

use crate::{
    arch::Arch, background::Background, bootstrap, build, cluster, fuzz, image, krew, libtest::Results,
    repeat::Tally, vm,
};

/// How long `cargo xtask test` runs each fuzz target: enough to catch what a change broke in a
/// parser; `cargo xtask fuzz --secs N` fuzzes for real.
const FUZZ_SECS: u64 = 20;

pub fn run(repeat: u32, with_matrix: bool) -> anyhow::Result<()> {
    let env = bootstrap::run()?;
    let required = bootstrap::is_root() || std::env::var_os("CI").is_some();
    // The real cluster's Kubernetes builds once per machine (about 10 minutes cold, seconds
    // cached), at idle priority beside the build and the host tests, which leave a core idle
    // most of the time; its tests wait for it.
    let cluster_build = if bootstrap::is_root() {
        println!("==> the real cluster's build, in the background (cargo xtask cluster build)");
        Some(cluster::build_in_background()?)
    } else {
        None
    };
    // The arm64 guests' binaries (cross-built) and root file system (mmdebstrap) take 10-15
    // minutes of mostly one core: at idle priority beside everything up to the matrix.
    let arm64_guests = if required && with_matrix && bootstrap::is_root() {
        println!(
            "==> the arm64 guests' preparation, in the background (cargo xtask vm-test --arch arm64 --prepare-only)"
        );
        Some(vm::prepare_in_background(Arch::Arm64)?)
    } else {
        None
    };
    build::release(&env)?;
    let root = build::workspace_root();

    step("cargo fmt --check", Command::new("cargo").args(["fmt", "--all", "--", "--check"]))?;
    let mut clippy = Command::new("cargo");
    // --all-features: the cluster tests too (the `cluster` feature of kstall-tests).
    clippy.args(["clippy", "--all-targets", "--all-features", "--", "-D", "warnings"]);
    env.apply(&mut clippy);
    step("cargo clippy", &mut clippy)?;
    // The kernel programs are outside default-members: lint them for their own target.
    let mut clippy_ebpf = Command::new("rustup");
    clippy_ebpf
        .args(["run", &env.ebpf_toolchain, "cargo", "clippy", "--package", "kstall-ebpf", "--release"])
        .args(["--target", "bpfel-unknown-none", "-Z", "build-std=core", "--", "-D", "warnings"]);
    step("cargo clippy (eBPF programs)", &mut clippy_ebpf)?;
    // The remediation examples' validator is a workspace of its own (tests/deploy/remediation-models).
    let models = root.join("tests/deploy/remediation-models/Cargo.toml");
    let mut fmt_models = Command::new("cargo");
    fmt_models.arg("fmt").arg("--manifest-path").arg(&models).args(["--", "--check"]);
    step("cargo fmt --check (remediation models)", &mut fmt_models)?;
    let mut clippy_models = Command::new("cargo");
    clippy_models.arg("clippy").arg("--manifest-path").arg(&models).arg("--target-dir");
    clippy_models.arg(root.join("target/remediation-models")).args(["--", "-D", "warnings"]);
    step("cargo clippy (remediation models)", &mut clippy_models)?;

    // The container tests run the image the README's install builds, from this build's binary.
    let image = if bootstrap::is_root() {
        bootstrap::apt_install(image::IMAGE_PACKAGES)?;
        println!("==> the agent's image (cargo xtask image)");
        let (tag, size_bytes) = image::build_image(&[Arch::Amd64])?.local.context("the amd64 image")?;
        println!("image: {tag} ({})", image::human_bytes(size_bytes));
        Some(tag)
    } else {
        None
    };
    // The kubectl plugin's krew archives: tests/tests/krew.rs and the cluster's tests install them
    // as krew does.
    println!("==> the kubectl plugin's krew archives (cargo xtask krew)");
    krew::archives()?;
    let mut tally = Tally::default();
    for run in 1..=repeat {
        if repeat > 1 {
            println!("==> tests, run {run} of {repeat}");
        }
        let started = Instant::now();
        let mut test = Command::new("cargo");
        // Every binary runs even after a failure: a run reports all its failures at once.
        test.args(["test", "--no-fail-fast", "--", "--test-threads=1"])
            .env("KSTALL_BIN", build::release_binary())
            .current_dir(&root);
        if required {
            test.env("KSTALL_KERNEL_TESTS", "require");
        }
        if let Some(image) = &image {
            test.env("KSTALL_IMAGE", image);
        }
        env.apply(&mut test);
        println!("==> cargo test (unit and kernel integration tests)");
        let results = tests(&mut test, true)?;
        for failure in &results.failed {
            println!("cargo test: FAILED {}: {}", failure.test, failure.why);
        }
        tally.record(started.elapsed(), results.passed, results.failed);
    }
    if repeat > 1 {
        print!("{}", tally.summary("cargo test"));
    }
    if !tally.all_passed() {
        bail!("cargo test failed: see the FAILED lines above");
    }
    // The cluster's tests mostly wait on the cluster, the fuzz targets' first build keeps both
    // cores busy: side by side, the cluster's output printed when it is done.
    let on_cluster = match cluster_build {
        Some(build) => {
            // Built now: beside the fuzz targets' build, cargo would wait on its locks.
            let binary = build::test_binary(&env, "cluster", &["cluster"], Arch::Amd64)?;
            println!(
                "==> the real cluster and its tests (cargo xtask cluster up; tests/tests/cluster.rs), beside the fuzz targets"
            );
            Some(ClusterStage::start(build, binary, repeat))
        }
        None => None,
    };
    // Every fuzz target, briefly: a crash in a parser of outside input fails the run.
    println!("==> the fuzz targets, {FUZZ_SECS} s each (cargo xtask fuzz)");
    let fuzzed = fuzz::run(FUZZ_SECS, &[]);
    let Some(stage) = on_cluster else {
        fuzzed?;
        return matrix(&env, arm64_guests, repeat);
    };
    let suite = stage.suite(repeat);
    // The healthy-node watch needs the node quiet, not the cores: beside the VMs.
    let go = suite.is_ok() && fuzzed.is_ok();
    if go {
        println!("==> the real cluster, 10 minutes of a healthy node ({HEALTHY_NODE_TEST}), beside the VMs");
    }
    let watch = stage.watch(go);
    let matrix = if go { matrix(&env, arm64_guests, repeat) } else { Ok(()) };
    let watched = watch.join().map_err(|_| anyhow::anyhow!("the cluster stage panicked"))?;
    suite?;
    fuzzed?;
    if let Some((wall, results, log)) = watched? {
        println!("==> {HEALTHY_NODE_TEST} (its output, {:.0} s)\n{log}", wall.as_secs_f64());
        for failure in &results.failed {
            println!("cluster tests: FAILED {}: {}", failure.test, failure.why);
        }
        if !results.failed.is_empty() || results.passed.is_empty() {
            bail!("the healthy-node watch failed: see the FAILED lines above");
        }
    }
    matrix
}

/// The kernel matrix, when the arm64 guests were being prepared for it: every amd64 scenario,
/// [`vm::ARM64_CI_SCENARIOS`] on arm64.
fn matrix(env: &bootstrap::BuildEnv, arm64_guests: Option<Background>, repeat: u32) -> anyhow::Result<()> {
    if let Some(arm64_guests) = arm64_guests {
        arm64_guests.wait()?;
        println!("==> the kernel matrix in VMs (cargo xtask vm-test; on arm64 a subset of the scenarios)");
        vm::matrix(env, &[], &Arch::ALL, repeat, None, Some(vm::ARM64_CI_SCENARIOS), false)?;
        // The arm64 binary the guests ran, in the image's arm64 manifest.
        println!("==> the multi-arch image (cargo xtask image --arch all)");
        let image = image::build_image(&Arch::ALL)?;
        println!(
            "image: OCI archive {} ({})",
            image.archive.display(),
            image::human_bytes(image.archive_bytes)
        );
    }
    Ok(())
}

/// The cluster test that runs alone, after the others, for 10 minutes.
const HEALTHY_NODE_TEST: &str = "a_healthy_node_stays_silent_for_ten_minutes";

type Run = (std::time::Duration, Results, String);

/// The real cluster in a thread of its own: up (once its build is done), the tests `repeat`
/// times, then — when told to go on — the healthy-node watch, then down.
struct ClusterStage {
    suite: mpsc::Receiver<anyhow::Result<Vec<Run>>>,
    go: mpsc::Sender<bool>,
    thread: std::thread::JoinHandle<anyhow::Result<Option<Run>>>,
}

impl ClusterStage {
    fn start(build: Background, binary: std::path::PathBuf, repeat: u32) -> Self {
        let (suite_tx, suite) = mpsc::channel();
        let (go, go_rx) = mpsc::channel();
        let thread = std::thread::spawn(move || {
            let running = match cluster::start_for_tests(build) {
                Ok(running) => running,
                Err(e) => {
                    let _ = suite_tx.send(Err(e));
                    return Ok(None);
                }
            };
            let test = |args: &[&str]| -> anyhow::Result<Run> {
                let started = Instant::now();
                let mut test = Command::new(&binary);
                test.arg("--test-threads=1")
                    .args(args)
                    .env("KSTALL_CLUSTER", &running.state_dir)
                    .env("KSTALL_KERNEL_TESTS", "require")
                    .current_dir(build::workspace_root().join("tests"));
                let (results, output) = run_tests(&mut test, false)?;
                Ok((started.elapsed(), results, output))
            };
            let runs: anyhow::Result<Vec<Run>> = (0..repeat).map(|_| test(&[])).collect();
            let _ = suite_tx.send(runs);
            if go_rx.recv().unwrap_or(false) {
                test(&["--ignored", "--exact", HEALTHY_NODE_TEST]).map(Some)
            } else {
                Ok(None)
            }
        });
        Self { suite, go, thread }
    }

    /// Waits for the tests (not the watch) and prints their output and results.
    fn suite(&self, repeat: u32) -> anyhow::Result<()> {
        let runs = self.suite.recv().map_err(|_| anyhow::anyhow!("the cluster stage ended early"))??;
        let mut tally = Tally::default();
        for (wall, results, log) in runs {
            println!("==> the real cluster's tests (their output)\n{log}");
            for failure in &results.failed {
                println!("cluster tests: FAILED {}: {}", failure.test, failure.why);
            }
            tally.record(wall, results.passed, results.failed);
        }
        if repeat > 1 {
            print!("{}", tally.summary("cluster tests"));
        }
        if !tally.all_passed() {
            bail!("the cluster tests failed: see the FAILED lines above");
        }
        Ok(())
    }

    /// Runs the healthy-node watch (`go`) or not, then brings the cluster down.
    fn watch(self, go: bool) -> std::thread::JoinHandle<anyhow::Result<Option<Run>>> {
        let _ = self.go.send(go);
        self.thread
    }
}

/// Runs `cmd` (a `cargo test`), passing its output through, and reads the results from it. A
/// failed build or a crashed test binary with no failed test to show is a failure too.
fn tests(cmd: &mut Command, live: bool) -> anyhow::Result<Results> {
    run_tests(cmd, live).map(|(results, _)| results)
}

/// As [`tests`], with the output kept (and printed as it comes when `live`).
fn run_tests(cmd: &mut Command, live: bool) -> anyhow::Result<(Results, String)> {
    let mut child = cmd.stdout(Stdio::piped()).spawn().context("cannot run cargo test")?;
    let mut log = String::new();
    for line in BufReader::new(child.stdout.take().expect("piped")).lines() {
        let line = line.context("reading cargo test's output")?;
        if live {
            println!("{line}");
        }
        log.push_str(&line);
        log.push('\n');
    }
    let status = child.wait().context("cargo test")?;
    let mut results = Results::parse(&log);
    if !status.success() && results.failed.is_empty() {
        let test = results.unfinished.take().unwrap_or_else(|| "cargo test".into());
        let why = format!("exited with {status} (a build error, or a test binary that crashed)");
        results.failed.push(crate::libtest::Failure { test, why });
    }
    Ok((results, log))
}

fn step(what: &str, cmd: &mut Command) -> anyhow::Result<()> {
    println!("==> {what}");
    let status = cmd.status().with_context(|| format!("cannot run {what}"))?;
    if !status.success() {
        bail!("{what} failed");
    }
    Ok(())
}
