//! Builds the release agent binary, kernel programs included.

use std::{path::PathBuf, process::Command};

use anyhow::{Context as _, bail};

use crate::{arch::Arch, bootstrap::BuildEnv};

pub fn release(env: &BuildEnv) -> anyhow::Result<()> {
    release_for(env, Arch::Amd64)
}

/// The release agent for `arch`: this machine's in target/release, another cross-built in
/// target/cross/<triple>/release (the eBPF programs are the same bytecode: aya-build builds
/// them for the target's architecture).
pub fn release_for(env: &BuildEnv, arch: Arch) -> anyhow::Result<()> {
    arch.bootstrap()?;
    let mut cmd = Command::new("cargo");
    cmd.args(["build", "--release", "--package", "kstall"]);
    cross(&mut cmd, arch);
    env.apply(&mut cmd);
    let status = cmd.status().context("cannot run cargo build")?;
    if !status.success() {
        bail!("building kstall for {} failed", arch.name());
    }
    Ok(())
}

pub fn workspace_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).parent().expect("xtask lives in the workspace").to_path_buf()
}

/// The checkout's revision (`git describe --always --dirty`), for the figures written from it.
pub fn revision() -> String {
    let described =
        Command::new("git").args(["describe", "--always", "--dirty"]).current_dir(workspace_root()).output();
    described.map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string()).unwrap_or_default()
}

pub fn release_binary() -> PathBuf {
    release_binary_for(Arch::Amd64)
}

pub fn release_binary_for(arch: Arch) -> PathBuf {
    let dir =
        if arch.is_host() { workspace_root().join("target") } else { cross_dir().join(arch.rust_target()) };
    dir.join("release/kstall")
}

/// Cross builds have a target directory of their own, so that one can run beside this
/// machine's builds (cargo locks a target directory while it builds).
fn cross_dir() -> PathBuf {
    workspace_root().join("target/cross")
}

fn cross(cmd: &mut Command, arch: Arch) {
    if !arch.is_host() {
        cmd.args(["--target", arch.rust_target()]).arg("--target-dir").arg(cross_dir());
    }
}

/// Builds one integration test of kstall-tests (`tests/tests/<name>.rs`) for `arch` with
/// `features`, without running it; returns its binary, to run where cargo would not (in a VM,
/// beside other builds).
pub fn test_binary(env: &BuildEnv, name: &str, features: &[&str], arch: Arch) -> anyhow::Result<PathBuf> {
    arch.bootstrap()?;
    let mut cmd = Command::new("cargo");
    cmd.args(["test", "--package", "kstall-tests", "--test", name, "--no-run"])
        .args(["--message-format", "json-render-diagnostics"])
        .current_dir(workspace_root())
        .stderr(std::process::Stdio::inherit());
    if !features.is_empty() {
        cmd.args(["--features", &features.join(",")]);
    }
    cross(&mut cmd, arch);
    env.apply(&mut cmd);
    let out = cmd.output().context("cannot run cargo test --no-run")?;
    if !out.status.success() {
        bail!("building the {name} tests failed");
    }
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .find(|m| m["target"]["name"] == name && m["executable"].is_string())
        .and_then(|m| m["executable"].as_str().map(PathBuf::from))
        .with_context(|| format!("cargo did not name the {name} test binary"))
}
