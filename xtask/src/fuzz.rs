//! `cargo xtask fuzz`: the libFuzzer targets of `agent/fuzz/` (cargo-fuzz, on the nightly the eBPF
//! programs are built with), each for `--secs` seconds, and a line per target: executions,
//! corpus, crash or not. Exits non-zero when a target crashed, naming the input that did it.
//!
//! Each target starts from its committed seeds (`agent/fuzz/corpus/<target>/`, read only) and
//! from what earlier runs here found (`agent/fuzz/target/corpus/<target>/`, where the new inputs
//! go): a run never changes the tree. The kstall library is built without its eBPF programs
//! (`AYA_BUILD_SKIP=1`): the targets only parse.

use std::{
    path::{Path, PathBuf},
    process::{Command, Stdio},
};

use anyhow::{Context as _, bail};

use crate::{bootstrap, build};

/// libFuzzer's limit for one input: a slow parse is a finding too (a `timeout-*` artifact).
const INPUT_TIMEOUT_SECS: u64 = 20;

pub fn run(secs: u64, only: &[String]) -> anyhow::Result<()> {
    let root = build::workspace_root();
    let fuzz_dir = root.join("agent/fuzz");
    let toolchain = nightly()?;
    cargo_fuzz()?;
    let all = targets(&toolchain, &fuzz_dir)?;
    let unknown: Vec<&String> = only.iter().filter(|t| !all.contains(t)).collect();
    if !unknown.is_empty() {
        bail!(
            "fuzz: no fuzz target {} (the targets: {})",
            unknown.iter().map(|t| t.as_str()).collect::<Vec<_>>().join(", "),
            all.join(", ")
        );
    }
    let chosen: Vec<&String> = all.iter().filter(|t| only.is_empty() || only.contains(t)).collect();

    println!("fuzz: building {} target(s) with {toolchain} (the first build takes minutes)", chosen.len());
    let mut cmd = cargo_fuzz_cmd(&toolchain, &fuzz_dir, "build");
    let status = cmd.status().context("fuzz: cannot run cargo fuzz build")?;
    if !status.success() {
        bail!("fuzz: building the fuzz targets failed ({status})");
    }

    let logs = fuzz_dir.join("target/logs");
    std::fs::create_dir_all(&logs).with_context(|| format!("fuzz: create {}", logs.display()))?;
    let mut crashed = Vec::new();
    for target in chosen {
        println!("fuzz: {target}: {secs} s");
        let found = fuzz_dir.join("target/corpus").join(target);
        std::fs::create_dir_all(&found).with_context(|| format!("fuzz: create {}", found.display()))?;
        let seeds = fuzz_dir.join("corpus").join(target);
        let log_path = logs.join(format!("{target}.log"));
        let log =
            std::fs::File::create(&log_path).with_context(|| format!("fuzz: {}", log_path.display()))?;
        let mut cmd = cargo_fuzz_cmd(&toolchain, &fuzz_dir, "run");
        // The first corpus directory is where libFuzzer writes what it finds.
        cmd.arg(target.as_str()).arg(&found);
        if seeds.is_dir() {
            cmd.arg(&seeds);
        }
        cmd.arg("--")
            .arg(format!("-max_total_time={secs}"))
            .arg(format!("-timeout={INPUT_TIMEOUT_SECS}"))
            .arg("-print_final_stats=1")
            .stdout(log.try_clone().context("fuzz: log")?)
            .stderr(log);
        let status = cmd.status().with_context(|| format!("fuzz: cannot run cargo fuzz run {target}"))?;
        let output = std::fs::read_to_string(&log_path).unwrap_or_default();
        let run = Run::parse(&output);
        let corpus = match run.corpus {
            Some((inputs, bytes)) => format!("corpus {inputs} inputs ({bytes})"),
            None => "corpus ?".to_string(),
        };
        let executions = run.executions.map_or("?".to_string(), |n| n.to_string());
        match (&run.artifact, status.success()) {
            (None, true) => println!("fuzz: {target}: {executions} executions, {corpus}, no crash"),
            (Some(artifact), _) => {
                let artifact = agent_dir(&fuzz_dir).join(artifact);
                let why = run.why.as_deref().unwrap_or("see the log");
                println!(
                    "fuzz: {target}: CRASHED after {executions} executions ({why}): {} (log {})",
                    artifact.display(),
                    log_path.display()
                );
                crashed.push(format!("{target} ({})", artifact.display()));
            }
            (None, false) => {
                println!("fuzz: {target}: FAILED ({status}) without an artifact: see {}", log_path.display());
                crashed.push(format!("{target} (no artifact; {})", log_path.display()));
            }
        }
    }
    if !crashed.is_empty() {
        bail!("fuzz: {} target(s) crashed: {}", crashed.len(), crashed.join(", "));
    }
    Ok(())
}

/// The toolchain agent/build.rs builds the eBPF programs with: `KSTALL_EBPF_TOOLCHAIN`, else
/// `nightly` (cargo-fuzz needs a nightly for its sanitizer flags).
fn nightly() -> anyhow::Result<String> {
    let toolchain = std::env::var("KSTALL_EBPF_TOOLCHAIN").unwrap_or_else(|_| "nightly".to_string());
    let found = Command::new("rustup")
        .args(["run", &toolchain, "rustc", "--version"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !found {
        bail!(
            "fuzz: no Rust toolchain {toolchain:?} (cargo xtask bootstrap installs the project's nightly; \
             set KSTALL_EBPF_TOOLCHAIN to the one it names)"
        );
    }
    Ok(toolchain)
}

/// Installs cargo-fuzz when `cargo fuzz` is missing.
fn cargo_fuzz() -> anyhow::Result<()> {
    let installed = Command::new("cargo")
        .args(["fuzz", "--version"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if installed {
        return Ok(());
    }
    println!("fuzz: installing cargo-fuzz (cargo install cargo-fuzz --locked)");
    bootstrap::run_step(
        Command::new("cargo").args(["install", "cargo-fuzz", "--locked"]),
        "cargo install cargo-fuzz (no network to crates.io?)",
    )
}

/// `cargo +<toolchain> fuzz <subcommand> --fuzz-dir agent/fuzz`, run from agent/.
fn cargo_fuzz_cmd(toolchain: &str, fuzz_dir: &Path, subcommand: &str) -> Command {
    let mut cmd = Command::new("cargo");
    cmd.arg(format!("+{toolchain}"))
        .args(["fuzz", subcommand, "--fuzz-dir"])
        .arg(fuzz_dir)
        .current_dir(agent_dir(fuzz_dir))
        .env("AYA_BUILD_SKIP", "1")
        // The toolchain is the `+` argument's, not the one that runs xtask.
        .env_remove("RUSTUP_TOOLCHAIN")
        .env_remove("RUSTC");
    cmd
}

/// Where cargo fuzz runs, and what relative artifact paths are relative to.
fn agent_dir(fuzz_dir: &Path) -> &Path {
    fuzz_dir.parent().expect("agent/fuzz has a parent")
}

/// The targets `cargo fuzz list` names.
fn targets(toolchain: &str, fuzz_dir: &Path) -> anyhow::Result<Vec<String>> {
    let out = cargo_fuzz_cmd(toolchain, fuzz_dir, "list")
        .stderr(Stdio::inherit())
        .output()
        .context("fuzz: cannot run cargo fuzz list")?;
    if !out.status.success() {
        bail!("fuzz: cargo fuzz list failed ({})", out.status);
    }
    let targets: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .map(String::from)
        .collect();
    if targets.is_empty() {
        bail!("fuzz: {} has no fuzz targets", fuzz_dir.display());
    }
    Ok(targets)
}

/// What a libFuzzer run printed: how many inputs it ran, its corpus at the end (inputs, size as
/// libFuzzer gives it: `3474b`, `1021Kb`), and the input it saved on a crash, leak, timeout or
/// out-of-memory, with why.
#[derive(Debug, Default, PartialEq)]
struct Run {
    executions: Option<u64>,
    corpus: Option<(u64, String)>,
    artifact: Option<PathBuf>,
    why: Option<String>,
}

impl Run {
    fn parse(output: &str) -> Run {
        let mut run = Run::default();
        for line in output.lines() {
            let line = line.trim_end();
            // `stat::number_of_executed_units: 1234` (-print_final_stats=1): the exact count.
            if let Some(n) = line.strip_prefix("stat::number_of_executed_units:") {
                run.executions = n.trim().parse().ok().or(run.executions);
            }
            // `#1234\tDONE   cov: 56 ft: 78 corp: 9/345b ...`, and the progress lines before it.
            if let Some(rest) = line.strip_prefix('#')
                && let Some((count, status)) = rest.split_once(char::is_whitespace)
                && let Ok(count) = count.parse::<u64>()
            {
                if status.trim_start().starts_with("DONE") && run.executions.is_none() {
                    run.executions = Some(count);
                }
                if let Some(corp) = status.split_whitespace().skip_while(|w| *w != "corp:").nth(1)
                    && let Some((inputs, size)) = corp.split_once('/')
                    && let Ok(inputs) = inputs.parse()
                {
                    run.corpus = Some((inputs, size.to_string()));
                }
            }
            // `artifact_prefix='./artifacts/x/'; Test unit written to ./artifacts/x/crash-abc`
            if let Some((_, path)) = line.split_once("Test unit written to ") {
                run.artifact = Some(PathBuf::from(path.trim()));
            }
            if run.why.is_none() {
                run.why = why(line);
            }
        }
        // Before the fuzzer's own stats, the panic message is the better reason.
        if let Some(message) = panic_message(output) {
            run.why = Some(message);
        }
        run
    }
}

/// libFuzzer's and the sanitizers' one-line verdicts.
fn why(line: &str) -> Option<String> {
    let (_, verdict) = line.split_once("ERROR: ")?;
    let verdict = verdict.strip_prefix("libFuzzer: ").unwrap_or(verdict);
    Some(verdict.trim().to_string())
}

/// `thread '<unnamed>' panicked at src/x.rs:1:2:` and the message line after it.
fn panic_message(output: &str) -> Option<String> {
    let mut lines = output.lines();
    let at = lines.by_ref().find(|l| l.contains("panicked at "))?;
    let (_, location) = at.split_once("panicked at ")?;
    let location = location.trim().trim_end_matches(':');
    match lines.next().map(str::trim).filter(|m| !m.is_empty() && !m.starts_with("note:")) {
        Some(message) => Some(format!("panicked at {location}: {message}")),
        None => Some(format!("panicked at {location}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The end of a clean run, as libFuzzer prints it with -print_final_stats=1.
    const DONE: &str = "\
INFO: Running with entropic power schedule (0xFF, 100).
INFO: Seed: 1953216540
INFO:       12 files found in agent/fuzz/corpus/cgroup_paths
#13\tINITED cov: 312 ft: 480 corp: 11/1204b exec/s: 0 rss: 38Mb
#4096\tpulse  cov: 330 ft: 530 corp: 20/1810b lim: 43 exec/s: 2048 rss: 40Mb
#60123\tNEW    cov: 331 ft: 534 corp: 21/1850b lim: 4096 exec/s: 2003 rss: 41Mb L: 40/180 MS: 2 ChangeBit-CopyPart-
#1873421\tDONE   cov: 340 ft: 551 corp: 23/2017b lim: 4096 exec/s: 31223 rss: 45Mb
Done 1873421 runs in 61 second(s)
stat::number_of_executed_units: 1873422
stat::average_exec_per_sec:     31223
stat::new_units_added:          12
stat::slowest_unit_time_sec:    0
stat::peak_rss_mb:              45
";

    #[test]
    fn a_clean_run_gives_its_executions_and_corpus() {
        let run = Run::parse(DONE);
        assert_eq!(run.executions, Some(1873422), "the final stat, not the DONE line");
        assert_eq!(run.corpus, Some((23, "2017b".to_string())));
        assert_eq!((run.artifact, run.why), (None, None));
        // Without the final stats, the DONE line's count.
        let without_stats: String =
            DONE.lines().filter(|l| !l.starts_with("stat::")).map(|l| l.to_owned() + "\n").collect();
        assert_eq!(Run::parse(&without_stats).executions, Some(1873421));
    }

    #[test]
    fn a_crash_gives_its_artifact_and_panic() {
        let output = "\
#2\tINITED cov: 1024 ft: 1100 corp: 5/3Kb exec/s: 0 rss: 60Mb
#5012\tNEW    cov: 1030 ft: 1120 corp: 6/3150b lim: 68 exec/s: 5012 rss: 62Mb L: 56/68 MS: 1 CopyPart-

thread '<unnamed>' panicked at /work/main/agent/src/probes/nfs.rs:404:20:
attempt to multiply with overflow
note: run with `RUST_BACKTRACE=1` environment variable to display a backtrace
==4242== ERROR: libFuzzer: deadly signal
    #0 0x55d5c6f0 in __sanitizer_print_stack_trace
NOTE: libFuzzer has rudimentary signal handlers.
SUMMARY: libFuzzer: deadly signal
MS: 2 ChangeByte-InsertByte-; base unit: 0123456789abcdef
artifact_prefix='/work/main/agent/fuzz/artifacts/ring_buffer_records/'; Test unit written to /work/main/agent/fuzz/artifacts/ring_buffer_records/crash-da39a3ee5e6b4b0d3255bfef95601890afd80709
Base64: BAAAAAEAAAA=
stat::number_of_executed_units: 5013
stat::average_exec_per_sec:     5013
";
        let run = Run::parse(output);
        assert_eq!(run.executions, Some(5013));
        assert_eq!(run.corpus, Some((6, "3150b".to_string())));
        assert_eq!(
            run.artifact,
            Some(PathBuf::from(
                "/work/main/agent/fuzz/artifacts/ring_buffer_records/crash-da39a3ee5e6b4b0d3255bfef95601890afd80709"
            ))
        );
        assert_eq!(
            run.why.as_deref(),
            Some("panicked at /work/main/agent/src/probes/nfs.rs:404:20: attempt to multiply with overflow")
        );
    }

    #[test]
    fn a_timeout_and_a_leak_are_findings_too() {
        let timeout = "\
ALARM: working on the last Unit for 21 seconds
==77== ERROR: libFuzzer: timeout after 21 seconds
artifact_prefix='./artifacts/config_file/'; Test unit written to ./artifacts/config_file/timeout-0a1b
";
        let run = Run::parse(timeout);
        assert_eq!(run.artifact, Some(PathBuf::from("./artifacts/config_file/timeout-0a1b")));
        assert_eq!(run.why.as_deref(), Some("timeout after 21 seconds"));
        let leak = "==9==ERROR: LeakSanitizer: detected memory leaks\n\
                    artifact_prefix='a/'; Test unit written to a/leak-77\n";
        let run = Run::parse(leak);
        assert_eq!(run.why.as_deref(), Some("LeakSanitizer: detected memory leaks"));
        assert_eq!(run.artifact, Some(PathBuf::from("a/leak-77")));
    }

    #[test]
    fn output_without_libfuzzer_lines_gives_nothing() {
        assert_eq!(Run::parse("error: could not compile `kstall`\n#[derive(Debug)]\n"), Run::default());
    }
}
