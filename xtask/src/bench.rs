//! `cargo xtask bench`: benchmarks that print their figures: the agent's per-event cost
//! (criterion, any machine), the stuck-task sampler's sweep, and the idle agent and the storms
//! through the real kernel beside bpftrace (root), whose table goes to `bench/results.md` (its
//! storms section);
//! `--storm <row>` runs only those rows of that table, to iterate on one.

use std::process::Command;

use anyhow::{Context as _, bail};

use crate::{bootstrap, build, generated};

/// Every benchmark, or only the storm table's rows named in `storms` (printed, not written).
pub fn run(storms: &[String]) -> anyhow::Result<()> {
    let env = bootstrap::run()?;
    // The yardstick the storms are measured against, on the same hooks in the same run.
    bootstrap::apt_install(&["bpftrace"])?;
    build::release(&env)?;
    let results = build::workspace_root().join("bench/results.md");
    // The storms' part of it, spliced in once the benchmarks pass.
    let storms_table = build::workspace_root().join("target/bench/storms.md");
    std::fs::create_dir_all(storms_table.parent().expect("a file in a folder"))?;
    let _ = std::fs::remove_file(&storms_table);
    let mut cmd = Command::new("cargo");
    cmd.env("KSTALL_BIN", build::release_binary()).env("KSTALL_BENCH_REVISION", build::revision());
    if storms.is_empty() {
        cmd.args(["bench", "--package", "kstall", "--package", "kstall-tests"])
            .env("KSTALL_BENCH_RESULTS", &storms_table);
    } else {
        cmd.args(["bench", "--package", "kstall-tests", "--bench", "storms"])
            .env("KSTALL_BENCH_STORMS", storms.join(","));
    }
    env.apply(&mut cmd);
    if !cmd.status().context("cannot run cargo bench")?.success() {
        bail!("benchmarks failed");
    }
    if storms.is_empty() {
        let table = std::fs::read_to_string(&storms_table)
            .with_context(|| format!("the storms bench wrote no {}", storms_table.display()))?;
        generated::write(&results, "storms", &table)?;
        println!("bench: the storms are in {}", results.display());
    }
    Ok(())
}
