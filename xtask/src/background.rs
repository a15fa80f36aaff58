//! A step `cargo xtask test` runs beside the others: this program with other arguments at idle
//! priority (`nice -n 19`), its output in a log; whoever needs its result waits for it.

use std::{
    path::PathBuf,
    process::{Child, Command, Stdio},
    time::Instant,
};

use anyhow::{Context as _, bail};

pub struct Background {
    child: Child,
    log: PathBuf,
    /// What it does, as its messages name it ("cluster: the build").
    what: String,
}

impl Background {
    /// Starts `cargo xtask <args>` at idle priority, its output in `log`. It must install nothing
    /// with apt: two apt-gets at once would fight over dpkg's lock.
    pub fn start(args: &[&str], log: PathBuf, what: String) -> anyhow::Result<Self> {
        let mut cmd = Command::new("nice");
        cmd.args(["-n", "19"]).arg(std::env::current_exe().context("this program's path")?).args(args);
        Self::spawn(cmd, log, what)
    }

    fn spawn(mut cmd: Command, log: PathBuf, what: String) -> anyhow::Result<Self> {
        let file =
            std::fs::File::create(&log).with_context(|| format!("{what}: create {}", log.display()))?;
        let child = cmd
            .stdin(Stdio::null())
            .stdout(file.try_clone().with_context(|| format!("{what}: its log"))?)
            .stderr(file)
            .spawn()
            .with_context(|| format!("{what}: cannot start it"))?;
        Ok(Self { child, log, what })
    }

    /// Waits for it; a failure names its last line and its log.
    pub fn wait(mut self) -> anyhow::Result<()> {
        let (what, started) = (&self.what, Instant::now());
        let status = self.child.wait().with_context(|| format!("{what}: wait for it"))?;
        if !status.success() {
            let text = std::fs::read_to_string(&self.log).unwrap_or_default();
            let last = text.lines().rev().find(|l| !l.trim().is_empty()).unwrap_or_default().to_string();
            bail!("{what} failed ({status}): {last} (whole log: {})", self.log.display());
        }
        println!("{what} is done (waited {:.0} s for it)", started.elapsed().as_secs_f64());
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sh(script: &str, log: PathBuf) -> Background {
        let mut cmd = Command::new("sh");
        cmd.args(["-c", script]);
        Background::spawn(cmd, log, "test: the step".into()).unwrap()
    }

    #[test]
    fn a_failure_names_its_last_line_and_its_log() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("step.log");
        let err = sh("echo first; echo 'the last words' >&2; echo; exit 3", log.clone()).wait().unwrap_err();
        assert_eq!(
            err.to_string(),
            format!("test: the step failed (exit status: 3): the last words (whole log: {})", log.display())
        );
        assert!(sh("echo fine", dir.path().join("ok.log")).wait().is_ok());
    }

    #[test]
    fn it_is_this_program_at_idle_priority() {
        // This test binary, listing its tests.
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("list.log");
        Background::start(&["--list"], log.clone(), "test: the listing".into()).unwrap().wait().unwrap();
        assert!(std::fs::read_to_string(log).unwrap().contains("it_is_this_program_at_idle_priority: test"));
    }
}
