//! `cargo xtask deploy`: writes deploy/'s generated files from their one source each, so that
//! nothing is kept twice by hand:
//!
//! - the PrometheusRule of components/prometheus-operator, whose `spec` is
//!   deploy/prometheus/kstall-rules.yaml (the file promtool checks and unit-tests);
//! - grafana/kustomization.yaml, one ConfigMap per dashboard in deploy/grafana/*.json.
//!
//! Both are text transforms: the rules keep their comments, and no YAML library rewrites them. A
//! unit test fails when a committed file is not what this writes.

use std::path::Path;

use anyhow::{Context as _, bail};

use crate::build;

const RULES: &str = "deploy/prometheus/kstall-rules.yaml";
const PROMETHEUS_RULE: &str = "deploy/components/prometheus-operator/prometheusrule.yaml";
const GRAFANA: &str = "deploy/grafana";
const GRAFANA_COMPONENT: &str = "deploy/grafana/kustomization.yaml";
const COMMAND: &str = "cargo xtask deploy";

/// A generated file: its path in the workspace and the text it must have.
struct Generated {
    path: &'static str,
    text: String,
}

pub fn run() -> anyhow::Result<()> {
    let root = build::workspace_root();
    for file in generated(&root)? {
        let path = root.join(file.path);
        if std::fs::read_to_string(&path).ok().as_deref() == Some(file.text.as_str()) {
            println!("deploy: {} is up to date", file.path);
            continue;
        }
        std::fs::write(&path, &file.text).with_context(|| format!("deploy: write {}", path.display()))?;
        println!("deploy: wrote {}", file.path);
    }
    Ok(())
}

fn generated(root: &Path) -> anyhow::Result<Vec<Generated>> {
    let rules = std::fs::read_to_string(root.join(RULES)).with_context(|| format!("deploy: read {RULES}"))?;
    Ok(vec![
        Generated { path: PROMETHEUS_RULE, text: prometheus_rule(&rules)? },
        Generated { path: GRAFANA_COMPONENT, text: grafana_component(&dashboards(root)?)? },
    ])
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
            let committed = std::fs::read_to_string(root.join(file.path)).unwrap_or_default();
            assert!(
                committed == file.text,
                "{} is not generated from its source: run `{COMMAND}`",
                file.path
            );
        }
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
