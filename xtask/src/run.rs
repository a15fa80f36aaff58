//! `cargo xtask run`: the first README command. Starts the agent in the foreground with its
//! embedded defaults (no Kubernetes, no config file, metrics on 127.0.0.1:9700).

use std::{os::unix::process::CommandExt as _, process::Command};

use anyhow::bail;

use crate::{bootstrap, build};

pub fn run(agent_args: &[String]) -> anyhow::Result<()> {
    let env = bootstrap::run()?;
    build::release(&env)?;
    if !bootstrap::is_root() {
        bail!("kstall agent needs root (CAP_BPF, CAP_PERFMON, CAP_SYS_ADMIN): run `cargo xtask run` as root");
    }
    let binary = build::release_binary();
    println!("starting {} agent {} (Ctrl-C stops it)", binary.display(), agent_args.join(" "));
    // exec: the agent gets the terminal's signals directly and its exit code is ours.
    let err = Command::new(&binary).arg("agent").args(agent_args).exec();
    bail!("cannot start {}: {err}", binary.display())
}
