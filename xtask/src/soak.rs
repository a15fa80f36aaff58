//! `cargo xtask soak`: the soak test long (root): 2,000 pods churned over 10 minutes by default,
//! with real cgroups, network namespaces, resets and OOM kills, the agent under the DaemonSet's
//! memory limit; prints the baseline, peak and after figures and fails if any did not return
//! within 10% (`tests/tests/soak.rs`, `tests/src/soak.rs`).

use std::process::Command;

use anyhow::{Context as _, bail};

use crate::{bootstrap, build};

pub fn run(pods: u64, secs: u64) -> anyhow::Result<()> {
    if !bootstrap::is_root() {
        bail!("the soak makes cgroups and network namespaces: run it as root");
    }
    let env = bootstrap::run()?;
    build::release(&env)?;
    let mut cmd = Command::new("cargo");
    cmd.args(["test", "--release", "--package", "kstall-tests", "--test", "soak", "--"])
        .args(["--test-threads=1", "--nocapture"])
        .env("KSTALL_BIN", build::release_binary())
        .env("KSTALL_KERNEL_TESTS", "require")
        .env("KSTALL_SOAK_PODS", pods.to_string())
        .env("KSTALL_SOAK_SECS", secs.to_string())
        .current_dir(build::workspace_root());
    env.apply(&mut cmd);
    if !cmd.status().context("cannot run the soak")?.success() {
        bail!("the soak failed: see its figures above");
    }
    Ok(())
}
