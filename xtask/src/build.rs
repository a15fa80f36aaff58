//! Builds the release agent binary, kernel programs included.

use std::{path::PathBuf, process::Command};

use anyhow::{Context as _, bail};

use crate::bootstrap::BuildEnv;

pub fn release(env: &BuildEnv) -> anyhow::Result<()> {
    let mut cmd = Command::new("cargo");
    cmd.args(["build", "--release", "--package", "kstall"]);
    env.apply(&mut cmd);
    let status = cmd.status().context("cannot run cargo build")?;
    if !status.success() {
        bail!("building kstall failed");
    }
    Ok(())
}

pub fn workspace_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).parent().expect("xtask lives in the workspace").to_path_buf()
}

pub fn release_binary() -> PathBuf {
    workspace_root().join("target/release/kstall")
}
