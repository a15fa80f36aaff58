//! `cargo xtask bench`: benchmarks that print their figures: the agent's per-event cost
//! (criterion, any machine) and a reset storm through the real kernel (root).

use std::process::Command;

use anyhow::{Context as _, bail};

use crate::{bootstrap, build};

pub fn run() -> anyhow::Result<()> {
    let env = bootstrap::run()?;
    build::release(&env)?;
    let mut cmd = Command::new("cargo");
    cmd.args(["bench", "--package", "kstall", "--package", "kstall-tests"])
        .env("KSTALL_BIN", build::release_binary());
    env.apply(&mut cmd);
    if !cmd.status().context("cannot run cargo bench")?.success() {
        bail!("benchmarks failed");
    }
    Ok(())
}
