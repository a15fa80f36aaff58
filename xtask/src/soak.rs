//! `cargo xtask soak`: the soak test long (root): 2,000 pods churned over 10 minutes by default,
//! with real cgroups, network namespaces, resets and OOM kills, the agent under the DaemonSet's
//! memory limit; prints the baseline, peak and after figures and fails if any did not return
//! within 10% (`tests/tests/soak.rs`, `tests/src/soak.rs`). `--healthy`: the healthy node, which
//! fails on any incident.

use std::process::Command;

use anyhow::{Context as _, bail};

use crate::{bootstrap, build};

pub fn run(pods: u64, secs: u64) -> anyhow::Result<()> {
    test("soak", &[("KSTALL_SOAK_PODS", pods), ("KSTALL_SOAK_SECS", secs)])
}

/// The healthy node for `secs` (`tests/tests/healthy.rs`, `tests/src/healthy.rs`): prints what
/// it did and what the agent saw, and fails on any incident.
pub fn healthy(secs: u64) -> anyhow::Result<()> {
    test("healthy", &[("KSTALL_HEALTHY_SECS", secs)])
}

fn test(name: &str, settings: &[(&str, u64)]) -> anyhow::Result<()> {
    if !bootstrap::is_root() {
        bail!("the soak makes cgroups and network namespaces: run it as root");
    }
    let env = bootstrap::run()?;
    build::release(&env)?;
    let mut cmd = Command::new("cargo");
    cmd.args(["test", "--release", "--package", "kstall-tests", "--test", name, "--"])
        .args(["--test-threads=1", "--nocapture"])
        .env("KSTALL_BIN", build::release_binary())
        .env("KSTALL_KERNEL_TESTS", "require")
        .current_dir(build::workspace_root());
    for (variable, value) in settings {
        cmd.env(variable, value.to_string());
    }
    env.apply(&mut cmd);
    if !cmd.status().context("cannot run the soak")?.success() {
        bail!("the soak failed: see its figures above");
    }
    Ok(())
}
