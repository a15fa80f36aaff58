//! The Helm chart (deploy/helm/kstall) and the pinned tools that render it: helm v3.19.0 and
//! kubectl v1.34.5 in target/tools, which `cargo xtask bootstrap` installs (xtask/src/tools.rs) —
//! never the machine's PATH. helm runs with its caches and configuration in target/helm/home; as
//! root, `helm template` and `helm lint` run in a network namespace with no network at all.

use std::{
    path::{Path, PathBuf},
    process::{Command, Output},
};

use serde_json::Value;

use crate::deploy::{deploy_dir, is_root, yaml_documents};

/// The release name and namespace the chart is rendered with: `helm install kstall … -n kstall`
/// makes the kustomize packages' names and namespace.
pub const RELEASE: &str = "kstall";
pub const NAMESPACE: &str = "kstall";

pub fn tools_dir() -> PathBuf {
    crate::workspace().join("target/tools")
}

/// The pinned helm.
pub fn helm() -> PathBuf {
    tools_dir().join("helm")
}

/// The pinned kubectl (kustomize v5.7.1 inside).
pub fn kubectl() -> PathBuf {
    tools_dir().join("kubectl")
}

/// Why the pinned tools cannot run here, if they cannot: one line saying how to get them.
pub fn tools_missing() -> Option<String> {
    for (tool, args) in [(helm(), &["version", "--short"][..]), (kubectl(), &["version", "--client"][..])] {
        let ran = Command::new(&tool).args(args).output();
        match ran {
            Ok(out) if out.status.success() => {}
            Ok(out) => {
                return Some(format!(
                    "{} does not run: {} (`cargo xtask bootstrap` installs it)",
                    tool.display(),
                    String::from_utf8_lossy(&out.stderr).trim()
                ));
            }
            Err(e) => {
                return Some(format!(
                    "{} cannot run ({e}): `cargo xtask bootstrap` installs it",
                    tool.display()
                ));
            }
        }
    }
    None
}

pub fn chart_dir() -> PathBuf {
    deploy_dir().join("helm/kstall")
}

/// deploy/helm/values: the kustomize overlays as the chart's values, one file per overlay.
pub fn overlay_values_dir() -> PathBuf {
    deploy_dir().join("helm/values")
}

/// helm with `args`, its homes in target/helm/home, offline as root.
pub fn run(args: &[&str]) -> Output {
    let mut cmd = if is_root() { Command::new("unshare") } else { Command::new(helm()) };
    if is_root() {
        cmd.args(["--net", "--"]).arg(helm());
    }
    with_homes(&mut cmd).args(args).output().unwrap_or_else(|e| panic!("run {}: {e}", helm().display()))
}

/// `cmd` (helm, or what runs it: nsenter into a cluster's namespace) with helm's caches and
/// configuration in target/helm/home, not the user's home.
pub fn with_homes(cmd: &mut Command) -> &mut Command {
    let home = crate::workspace().join("target/helm/home");
    cmd.env("HELM_CACHE_HOME", home.join("cache"))
        .env("HELM_CONFIG_HOME", home.join("config"))
        .env("HELM_DATA_HOME", home.join("data"))
}

/// `helm template` of the chart as release kstall in namespace kstall, with `args` (`-f FILE`,
/// `--set k=v`, `--skip-tests`, ...): its objects, or helm's error (stderr) when it refuses.
pub fn template(args: &[&str]) -> Result<Vec<Value>, String> {
    template_text(args).map(|text| yaml_documents(&text))
}

/// As [`template`], the YAML as helm writes it.
pub fn template_text(args: &[&str]) -> Result<String, String> {
    let chart = chart_dir();
    let mut all = vec!["template", RELEASE, chart.to_str().expect("a UTF-8 path"), "--namespace", NAMESPACE];
    all.extend_from_slice(args);
    let out = run(&all);
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).into_owned())
    }
}

/// `helm lint --strict` of the chart with `args`: its output, or its output when it fails.
pub fn lint(args: &[&str]) -> Result<String, String> {
    let chart = chart_dir();
    let mut all = vec!["lint", "--strict", chart.to_str().expect("a UTF-8 path"), "--namespace", NAMESPACE];
    all.extend_from_slice(args);
    let out = run(&all);
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    if out.status.success() { Ok(text) } else { Err(text) }
}

/// The objects `kubectl kustomize dir` renders with the pinned kubectl.
pub fn kustomize(dir: &Path) -> Vec<Value> {
    crate::deploy::render_with(&kubectl(), dir)
}
