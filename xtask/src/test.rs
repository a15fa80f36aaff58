//! `cargo xtask test`: the second README command and what CI runs. Bootstrap, build, format and
//! lint checks, every unit test, every kernel integration test, and (as root) the kernel matrix
//! in VMs.
//!
//! As root (always so in CI) the kernel tests are required: one that cannot run fails instead of
//! skipping.

use std::process::Command;

use anyhow::{Context as _, bail};

use crate::{bootstrap, build, vm};

pub fn run() -> anyhow::Result<()> {
    let env = bootstrap::run()?;
    build::release(&env)?;
    let root = build::workspace_root();

    step("cargo fmt --check", Command::new("cargo").args(["fmt", "--all", "--", "--check"]))?;
    let mut clippy = Command::new("cargo");
    clippy.args(["clippy", "--all-targets", "--", "-D", "warnings"]);
    env.apply(&mut clippy);
    step("cargo clippy", &mut clippy)?;
    // The kernel programs are outside default-members: lint them for their own target.
    let mut clippy_ebpf = Command::new("rustup");
    clippy_ebpf
        .args(["run", &env.ebpf_toolchain, "cargo", "clippy", "--package", "kstall-ebpf", "--release"])
        .args(["--target", "bpfel-unknown-none", "-Z", "build-std=core", "--", "-D", "warnings"]);
    step("cargo clippy (eBPF programs)", &mut clippy_ebpf)?;

    let mut test = Command::new("cargo");
    test.args(["test", "--", "--test-threads=1"])
        .env("KSTALL_BIN", build::release_binary())
        .current_dir(&root);
    if bootstrap::is_root() || std::env::var_os("CI").is_some() {
        test.env("KSTALL_KERNEL_TESTS", "require");
    }
    env.apply(&mut test);
    step("cargo test (unit and kernel integration tests)", &mut test)?;
    if bootstrap::is_root() || std::env::var_os("CI").is_some() {
        println!("==> the kernel matrix in VMs (cargo xtask vm-test)");
        vm::matrix(&env, &[])?;
    }
    Ok(())
}

fn step(what: &str, cmd: &mut Command) -> anyhow::Result<()> {
    println!("==> {what}");
    let status = cmd.status().with_context(|| format!("cannot run {what}"))?;
    if !status.success() {
        bail!("{what} failed");
    }
    Ok(())
}
