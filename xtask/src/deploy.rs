//! `cargo xtask deploy`: writes deploy/'s generated files from their one source each, so that
//! nothing is kept twice by hand:
//!
//! - the PrometheusRule of components/prometheus-operator, whose `spec` is
//!   deploy/prometheus/kstall-rules.yaml (the file promtool checks and unit-tests);
//! - grafana/kustomization.yaml, one ConfigMap per dashboard in deploy/grafana/*.json;
//! - the Helm chart's copies of both sources (deploy/helm/kstall/files/: the rules with a header
//!   saying so, the dashboards as they are — a chart reads only its own files) and its
//!   Chart.yaml's `version` and `appVersion`, the crate's.
//!
//! All are text transforms: the rules keep their comments, and no YAML library rewrites them. A
//! unit test fails when a committed file is not what this writes, or the chart holds a dashboard
//! deploy/grafana does not.

use std::path::Path;

use anyhow::{Context as _, bail};

use crate::build;

const RULES: &str = "deploy/prometheus/kstall-rules.yaml";
const PROMETHEUS_RULE: &str = "deploy/components/prometheus-operator/prometheusrule.yaml";
const GRAFANA: &str = "deploy/grafana";
const GRAFANA_COMPONENT: &str = "deploy/grafana/kustomization.yaml";
const CHART: &str = "deploy/helm/kstall/Chart.yaml";
const CHART_RULES: &str = "deploy/helm/kstall/files/kstall-rules.yaml";
const CHART_DASHBOARDS: &str = "deploy/helm/kstall/files/dashboards";
const COMMAND: &str = "cargo xtask deploy";

/// A generated file: its path in the workspace and the text it must have.
struct Generated {
    path: String,
    text: String,
}

pub fn run() -> anyhow::Result<()> {
    let root = build::workspace_root();
    for file in generated(&root)? {
        let path = root.join(&file.path);
        if std::fs::read_to_string(&path).ok().as_deref() == Some(file.text.as_str()) {
            println!("deploy: {} is up to date", file.path);
            continue;
        }
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).with_context(|| format!("deploy: create {}", dir.display()))?;
        }
        std::fs::write(&path, &file.text).with_context(|| format!("deploy: write {}", path.display()))?;
        println!("deploy: wrote {}", file.path);
    }
    for stale in stale_chart_dashboards(&root)? {
        std::fs::remove_file(root.join(&stale)).with_context(|| format!("deploy: remove {stale}"))?;
        println!("deploy: removed {stale} (no longer in {GRAFANA})");
    }
    Ok(())
}

/// Fails, naming the first file, unless every generated file is what this writes: for what
/// packages them (`cargo xtask helm package`).
pub fn check() -> anyhow::Result<()> {
    let root = build::workspace_root();
    for file in generated(&root)? {
        if std::fs::read_to_string(root.join(&file.path)).ok().as_deref() != Some(file.text.as_str()) {
            bail!("deploy: {} is not generated from its source: run `{COMMAND}`", file.path);
        }
    }
    if let Some(stale) = stale_chart_dashboards(&root)?.first() {
        bail!("deploy: {stale} is not in {GRAFANA}: run `{COMMAND}`");
    }
    Ok(())
}

fn generated(root: &Path) -> anyhow::Result<Vec<Generated>> {
    let rules = std::fs::read_to_string(root.join(RULES)).with_context(|| format!("deploy: read {RULES}"))?;
    let chart = std::fs::read_to_string(root.join(CHART)).with_context(|| format!("deploy: read {CHART}"))?;
    let dashboards = dashboards(root)?;
    let mut files = vec![
        Generated { path: PROMETHEUS_RULE.into(), text: prometheus_rule(&rules)? },
        Generated { path: GRAFANA_COMPONENT.into(), text: grafana_component(&dashboards)? },
        Generated { path: CHART.into(), text: chart_versioned(&chart, env!("CARGO_PKG_VERSION"))? },
        Generated { path: CHART_RULES.into(), text: chart_rules(&rules) },
    ];
    for name in dashboards {
        let source = format!("{GRAFANA}/{name}");
        let text =
            std::fs::read_to_string(root.join(&source)).with_context(|| format!("deploy: read {source}"))?;
        files.push(Generated { path: format!("{CHART_DASHBOARDS}/{name}"), text });
    }
    Ok(files)
}

/// The chart's dashboards that deploy/grafana no longer has, as workspace paths.
fn stale_chart_dashboards(root: &Path) -> anyhow::Result<Vec<String>> {
    let sources = dashboards(root)?;
    let dir = root.join(CHART_DASHBOARDS);
    let Ok(entries) = std::fs::read_dir(&dir) else { return Ok(Vec::new()) };
    let mut stale = Vec::new();
    for entry in entries {
        let name =
            entry.context("deploy: list the chart's dashboards")?.file_name().to_string_lossy().into_owned();
        if !sources.contains(&name) {
            stale.push(format!("{CHART_DASHBOARDS}/{name}"));
        }
    }
    stale.sort();
    Ok(stale)
}

/// Chart.yaml with its `version` and `appVersion` lines saying `version`.
fn chart_versioned(chart: &str, version: &str) -> anyhow::Result<String> {
    let mut out = String::new();
    let (mut chart_version, mut app_version) = (false, false);
    for line in chart.lines() {
        if line.starts_with("version:") {
            out.push_str(&format!("version: {version}\n"));
            chart_version = true;
        } else if line.starts_with("appVersion:") {
            out.push_str(&format!("appVersion: \"{version}\"\n"));
            app_version = true;
        } else {
            out.push_str(line);
            out.push('\n');
        }
    }
    if !(chart_version && app_version) {
        bail!("deploy: {CHART} has no top-level `version:` or `appVersion:` line");
    }
    Ok(out)
}

/// The rules file as the chart carries it (its PrometheusRule's spec): a header, then the file.
fn chart_rules(rules: &str) -> String {
    format!(
        "# Generated from {RULES} by `{COMMAND}`; do not edit:\n\
         # change the rules there, then run `{COMMAND}`.\n{rules}"
    )
}

/// The PrometheusRule whose `spec` is the rules file, indented under it line by line: indenting
/// every line alike keeps each YAML node (block scalars included) and every comment as it was.
fn prometheus_rule(rules: &str) -> anyhow::Result<String> {
    if let Some(line) =
        rules.lines().find(|l| l.starts_with("---") || l.starts_with("...") || l.starts_with('%'))
    {
        bail!("deploy: {RULES} must be one YAML document without directives; it has {line:?}");
    }
    if !rules.lines().any(|l| l.starts_with("groups:")) {
        bail!("deploy: {RULES} has no top-level `groups:`");
    }
    let mut out = format!(
        "# Generated from {RULES} by `{COMMAND}`; do not edit:\n\
         # change the rules there, then run `{COMMAND}`.\n\
         apiVersion: monitoring.coreos.com/v1\n\
         kind: PrometheusRule\n\
         metadata:\n  name: kstall\n  namespace: kstall\n  labels: {{app.kubernetes.io/name: kstall}}\n\
         spec:\n"
    );
    for line in rules.lines() {
        if !line.is_empty() {
            out.push_str("  ");
            out.push_str(line);
        }
        out.push('\n');
    }
    Ok(out)
}

/// The dashboards' file names in deploy/grafana, sorted.
fn dashboards(root: &Path) -> anyhow::Result<Vec<String>> {
    let dir = root.join(GRAFANA);
    let mut names = Vec::new();
    for entry in std::fs::read_dir(&dir).with_context(|| format!("deploy: list {}", dir.display()))? {
        let name = entry.context("deploy: list deploy/grafana")?.file_name().to_string_lossy().into_owned();
        if name.ends_with(".json") {
            names.push(name);
        }
    }
    names.sort();
    Ok(names)
}

/// The kustomize Component turning each dashboard into a ConfigMap for Grafana's dashboard
/// sidecar (label grafana_dashboard: "1"). No hash suffix: a changed dashboard must replace its
/// ConfigMap in place, not leave the old one beside it for the sidecar to load too.
fn grafana_component(dashboards: &[String]) -> anyhow::Result<String> {
    let mut out = format!(
        "# Generated from the dashboards in {GRAFANA}/*.json by `{COMMAND}`; do not edit:\n\
         # add or remove a dashboard there, then run `{COMMAND}`. One ConfigMap per dashboard,\n\
         # labelled for Grafana's dashboard sidecar (grafana_dashboard: \"1\"); stable names, so that a\n\
         # changed dashboard replaces its ConfigMap.\n\
         apiVersion: kustomize.config.k8s.io/v1alpha1\n\
         kind: Component\n"
    );
    if dashboards.is_empty() {
        out.push_str("configMapGenerator: []\n");
        return Ok(out);
    }
    out.push_str("configMapGenerator:\n");
    let mut names = Vec::new();
    for file in dashboards {
        let stem = file.strip_suffix(".json").expect("a .json file");
        if stem.is_empty() || !stem.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        {
            bail!("deploy: dashboard {GRAFANA}/{file}: name it with a-z, 0-9 and '-' (it names a ConfigMap)");
        }
        let name = format!("kstall-dashboard-{}", stem.strip_prefix("kstall-").unwrap_or(stem));
        if names.contains(&name) {
            bail!("deploy: two dashboards in {GRAFANA} would both be ConfigMap {name}");
        }
        out.push_str(&format!(
            "  - name: {name}\n    namespace: kstall\n    files: [{file}]\n    options:\n      \
             disableNameSuffixHash: true\n      \
             labels: {{grafana_dashboard: \"1\", app.kubernetes.io/name: kstall}}\n"
        ));
        names.push(name);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn committed_files_are_what_the_generator_writes() {
        let root = build::workspace_root();
        for file in generated(&root).unwrap() {
            let committed = std::fs::read_to_string(root.join(&file.path)).unwrap_or_default();
            assert!(
                committed == file.text,
                "{} is not generated from its source: run `{COMMAND}`",
                file.path
            );
        }
        assert_eq!(stale_chart_dashboards(&root).unwrap(), Vec::<String>::new(), "run `{COMMAND}`");
        check().unwrap();
    }

    #[test]
    fn the_chart_is_the_crate_s_version_and_carries_the_rules() {
        let chart = "# why\napiVersion: v2\nname: kstall\nversion: 0.0.1\nappVersion: \"0.0.1\"\n";
        let versioned = chart_versioned(chart, "1.2.3").unwrap();
        assert_eq!(versioned, "# why\napiVersion: v2\nname: kstall\nversion: 1.2.3\nappVersion: \"1.2.3\"\n");
        assert!(chart_versioned("apiVersion: v2\nversion: 1\n", "1.2.3").is_err(), "no appVersion");
        assert!(chart_rules("groups: []\n").ends_with(
            "do not edit:\n# change the rules there, then run `cargo xtask deploy`.\ngroups: []\n"
        ));
    }

    #[test]
    fn the_rules_are_indented_under_spec_with_their_comments() {
        let rule = prometheus_rule("# why\ngroups:\n  - name: g\n\n    rules: []\n").unwrap();
        assert!(rule.starts_with(
            "# Generated from deploy/prometheus/kstall-rules.yaml by `cargo xtask deploy`; do not edit:\n"
        ));
        assert!(rule.ends_with("spec:\n  # why\n  groups:\n    - name: g\n\n      rules: []\n"), "{rule}");
        assert!(prometheus_rule("groups: []\n---\ngroups: []\n").is_err(), "a second document");
        assert!(prometheus_rule("- not: rules\n").is_err(), "no groups");
    }

    #[test]
    fn each_dashboard_is_one_configmap() {
        let component = grafana_component(&["kstall-incidents.json".into(), "nodes.json".into()]).unwrap();
        let incidents =
            "- name: kstall-dashboard-incidents\n    namespace: kstall\n    files: [kstall-incidents.json]\n";
        assert!(component.contains(incidents), "{component}");
        assert!(component.contains("  - name: kstall-dashboard-nodes\n"));
        assert_eq!(component.matches("labels: {grafana_dashboard: \"1\"").count(), 2);
        assert!(grafana_component(&[]).unwrap().ends_with("configMapGenerator: []\n"));
        assert!(grafana_component(&["Node Stalls.json".into()]).is_err());
        assert!(grafana_component(&["kstall-x.json".into(), "x.json".into()]).is_err());
    }
}
