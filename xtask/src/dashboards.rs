//! `cargo xtask dashboards`: writes kstall's Grafana dashboards, deploy/grafana/*.json, from the
//! code below. The JSON is generated, never edited by hand; a unit test fails when a committed
//! file differs from what this makes.
//!
//! Panels that show what an alert fires on take the alert's `expr` from
//! deploy/prometheus/kstall-rules.yaml (whole for the incident alerts, the left side of the
//! comparison, with the comparison as the panel's threshold, for the agent's health alerts), so a
//! panel and its alert cannot drift apart. Every query is filtered by the dashboards' variables
//! where its metric has the label: `node` on every series — the scrape's target label, which the
//! deployment sets from the pod's node name (`docs/dashboards.md`) — and `namespace` and `pod` on
//! the event metrics and the incidents.

use std::{collections::BTreeMap, path::Path};

use anyhow::{Context as _, bail};
use kstall_common::metrics::{self, Scope};
use serde::Deserialize;
use serde_json::{Value, json};

use crate::build::workspace_root;

/// Where the dashboards go, relative to the workspace.
pub const DIR: &str = "deploy/grafana";
const RULES: &str = "deploy/prometheus/kstall-rules.yaml";
/// Grafana 12.0's dashboard schema; later versions migrate it when they load it.
const SCHEMA_VERSION: u32 = 41;
/// The default of the `runbooks` variable: where docs/runbooks/ is published. A placeholder until
/// the repository has a public address; a deployment sets it on the dashboard.
const RUNBOOKS_URL: &str = "https://git.example.com/kstall/blob/main/docs/runbooks";

pub fn run() -> anyhow::Result<()> {
    let root = workspace_root();
    let dir = root.join(DIR);
    std::fs::create_dir_all(&dir).with_context(|| format!("create {}", dir.display()))?;
    for (file, text) in generate(&root)? {
        let path = dir.join(&file);
        if std::fs::read_to_string(&path).ok().as_deref() == Some(text.as_str()) {
            println!("{DIR}/{file}: unchanged");
            continue;
        }
        std::fs::write(&path, text).with_context(|| format!("write {}", path.display()))?;
        println!("{DIR}/{file}: written");
    }
    Ok(())
}

/// Every dashboard as (file name, JSON text).
pub fn generate(root: &Path) -> anyhow::Result<Vec<(String, String)>> {
    let rules = Rules::load(&root.join(RULES))?;
    let dashboards = [
        incidents(&rules)?,
        fleet(&rules)?,
        nfs()?,
        tcp_resets(&rules)?,
        memory_oom(&rules)?,
        hung_tasks()?,
        agent(&rules)?,
    ];
    dashboards.into_iter().map(|d| Ok((format!("{}.json", d.uid), d.render()))).collect()
}

/// Which of the dashboards' variables can filter a metric.
/// The scope of a series the dashboards query: the agent's metric's, from the catalogue (a
/// histogram's `_sum` and `_count` are its own), or Prometheus's `up` for the agent-down alert.
fn scope_of(series: &str) -> Option<Scope> {
    if series == "up" {
        return Some(Scope::Node);
    }
    metrics::find(series).map(|m| m.scope)
}

fn matchers(scope: Scope) -> &'static str {
    match scope {
        Scope::Node => r#"node=~"$node""#,
        Scope::Pod => r#"node=~"$node",namespace=~"$namespace",pod=~"$pod""#,
        Scope::Incident => r#"node=~"$node",namespace=~"$namespace|",pod=~"$pod|""#,
    }
}

/// `expr` with the variables' matchers added to every selector of a metric in the catalogue.
/// PromQL's lexical structure is enough here: names outside strings, braces, brackets and label
/// lists that are known metrics are selectors (function names and keywords never are).
fn filter(expr: &str) -> anyhow::Result<String> {
    let chars: Vec<char> = expr.chars().collect();
    let (mut out, mut i, mut nesting) = (String::new(), 0, 0usize);
    let is_start = |c: char| c.is_ascii_alphabetic() || c == '_' || c == ':';
    let is_part = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == ':';
    while i < chars.len() {
        let c = chars[i];
        if matches!(c, '"' | '\'' | '`') {
            let start = i;
            i += 1;
            while i < chars.len() && chars[i] != c {
                i += if chars[i] == '\\' { 2 } else { 1 };
            }
            i = (i + 1).min(chars.len());
            out.extend(&chars[start..i]);
            continue;
        }
        let after_name_char = i > 0 && (is_part(chars[i - 1]) || chars[i - 1] == '$');
        if !is_start(c) || after_name_char {
            match c {
                '{' | '[' => nesting += 1,
                '}' | ']' => nesting = nesting.saturating_sub(1),
                _ => {}
            }
            out.push(c);
            i += 1;
            continue;
        }
        let start = i;
        while i < chars.len() && is_part(chars[i]) {
            i += 1;
        }
        let name: String = chars[start..i].iter().collect();
        out.push_str(&name);
        if nesting > 0 {
            continue;
        }
        // A label list: `by (...)`, `on (...)`, ...: copied as it is.
        if matches!(name.as_str(), "by" | "without" | "on" | "ignoring" | "group_left" | "group_right") {
            let open = chars[i..].iter().position(|c| !c.is_whitespace()).map(|p| i + p);
            if let Some(open) = open.filter(|&p| chars[p] == '(') {
                let close =
                    chars[open..].iter().position(|&c| c == ')').map_or(chars.len(), |p| open + p + 1);
                out.extend(&chars[i..close]);
                i = close;
            }
            continue;
        }
        let Some(scope) = scope_of(&name) else {
            if name.starts_with("kstall_") {
                bail!("{name} in `{expr}` is not in the metric catalogue (common/src/metrics.rs)");
            }
            continue;
        };
        let rest = chars[i..].iter().position(|c| !c.is_whitespace()).map(|p| i + p);
        match rest.filter(|&p| chars[p] == '{') {
            Some(brace) => {
                let inner = chars[brace + 1..].iter().find(|c| !c.is_whitespace());
                let sep = if inner == Some(&'}') { "" } else { "," };
                out.push_str(&format!("{{{}{sep}", matchers(scope)));
                i = brace + 1;
                nesting += 1;
            }
            None => out.push_str(&format!("{{{}}}", matchers(scope))),
        }
    }
    Ok(out)
}

/// The alerting rules, read for the expressions panels share with them.
#[derive(Deserialize)]
struct Rules {
    groups: Vec<Group>,
}

#[derive(Deserialize)]
struct Group {
    name: String,
    rules: Vec<Rule>,
}

#[derive(Deserialize)]
struct Rule {
    alert: String,
    expr: String,
    #[serde(rename = "for")]
    duration: Option<String>,
    #[serde(default)]
    annotations: BTreeMap<String, String>,
}

impl Rule {
    /// The runbook's file name in docs/runbooks/.
    fn runbook(&self) -> anyhow::Result<&str> {
        let path = self.annotations.get("runbook").map(String::as_str).unwrap_or_default();
        path.strip_prefix("docs/runbooks/")
            .with_context(|| format!("{}: runbook `{path}` is not in docs/runbooks/", self.alert))
    }

    /// The alert's condition in words, for a panel's description.
    fn condition(&self) -> String {
        let held = self.duration.as_ref().map(|d| format!(" for {d}")).unwrap_or_default();
        format!("Alert {} fires when `{}`{held}.", self.alert, self.expr)
    }
}

/// The comparison an alert applies to a series: the panel's threshold.
enum Comparison {
    /// `== 0` on a 0/1 gauge: 0 is bad.
    IsZero,
    /// `> v`: above v is bad.
    Above(f64),
}

impl Rules {
    fn load(path: &Path) -> anyhow::Result<Self> {
        let text = std::fs::read_to_string(path).with_context(|| format!("read {}", path.display()))?;
        serde_yaml_ng::from_str(&text).with_context(|| format!("parse {}", path.display()))
    }

    fn alert(&self, name: &str) -> anyhow::Result<&Rule> {
        self.groups
            .iter()
            .flat_map(|g| &g.rules)
            .find(|r| r.alert == name)
            .with_context(|| format!("no alert {name} in {RULES}"))
    }

    fn group(&self, name: &str) -> anyhow::Result<&[Rule]> {
        let group = self.groups.iter().find(|g| g.name == name);
        Ok(&group.with_context(|| format!("no group {name} in {RULES}"))?.rules)
    }

    /// The series an alert compares, and the comparison.
    fn compared(&self, name: &str) -> anyhow::Result<(&Rule, &str, Comparison)> {
        let rule = self.alert(name)?;
        let unsupported = || format!("{name}: `{}` does not end in `== 0` or `> <number>`", rule.expr);
        let (series, comparison) = if let Some(series) = rule.expr.strip_suffix(" == 0") {
            (series, Comparison::IsZero)
        } else {
            let (series, value) = rule.expr.rsplit_once(" > ").with_context(unsupported)?;
            (series, Comparison::Above(value.trim().parse().ok().with_context(unsupported)?))
        };
        Ok((rule, series.trim(), comparison))
    }
}

/// One dashboard: its panels are laid out left to right, top to bottom, on Grafana's 24-column
/// grid.
struct Dashboard {
    uid: &'static str,
    title: &'static str,
    description: &'static str,
    variables: Vec<Value>,
    panels: Vec<Panel>,
}

impl Dashboard {
    fn new(uid: &'static str, title: &'static str, description: &'static str) -> Self {
        Dashboard { uid, title, description, variables: standard_variables(), panels: Vec::new() }
    }

    fn panel(mut self, panel: Panel) -> Self {
        self.panels.push(panel);
        self
    }

    fn render(self) -> String {
        let (mut x, mut y, mut row_height) = (0, 0, 0);
        let mut panels = Vec::new();
        for (id, panel) in self.panels.into_iter().enumerate() {
            if x + panel.width > 24 {
                (x, y, row_height) = (0, y + row_height, 0);
            }
            let mut json = panel.json;
            json["id"] = json!(id + 1);
            json["gridPos"] = json!({"x": x, "y": y, "w": panel.width, "h": panel.height});
            panels.push(json);
            x += panel.width;
            row_height = row_height.max(panel.height);
        }
        let mut dashboard = json!({
            "uid": self.uid,
            "title": self.title,
            "description": self.description,
            "tags": ["kstall"],
            "schemaVersion": SCHEMA_VERSION,
            "version": 1,
            "editable": true,
            "graphTooltip": 1,
            "time": {"from": "now-6h", "to": "now"},
            "timepicker": {},
            "refresh": "30s",
            "timezone": "browser",
            "fiscalYearStartMonth": 0,
            "liveNow": false,
            "annotations": {"list": [{
                "builtIn": 1,
                "datasource": {"type": "grafana", "uid": "-- Grafana --"},
                "enable": true,
                "hide": true,
                "iconColor": "rgba(0, 211, 255, 1)",
                "name": "Annotations & Alerts",
                "type": "dashboard"
            }]},
            // The other kstall dashboards, keeping the time range and the variables.
            "links": [{
                "title": "kstall",
                "type": "dashboards",
                "tags": ["kstall"],
                "asDropdown": true,
                "includeVars": true,
                "keepTime": true,
                "icon": "external link",
                "targetBlank": false,
                "tooltip": "",
                "url": ""
            }],
            "templating": {"list": self.variables},
            "panels": panels,
        });
        // Sorted keys whatever serde_json's map is built with: the output must not change with
        // the features another crate enables.
        dashboard.sort_all_objects();
        serde_json::to_string_pretty(&dashboard).expect("JSON") + "\n"
    }
}

fn datasource() -> Value {
    json!({"type": "prometheus", "uid": "${datasource}"})
}

/// `datasource`, `node`, `namespace`, `pod`: each a multi-value list with "All" (`.*`, which also
/// matches the empty `pod` of node processes), each narrowed by the ones before it.
fn standard_variables() -> Vec<Value> {
    let query = |name: &str, label: &str, definition: &str| {
        json!({
            "name": name,
            "label": label,
            "type": "query",
            "datasource": datasource(),
            "definition": definition,
            "query": {"query": definition, "refId": "PrometheusVariableQueryEditor-VariableQuery"},
            "refresh": 2,
            "includeAll": true,
            "allValue": ".*",
            "multi": true,
            "current": {"text": ["All"], "value": ["$__all"]},
            "options": [],
            "regex": "",
            "sort": 1,
            "hide": 0
        })
    };
    vec![
        json!({
            "name": "datasource",
            "label": "Data source",
            "type": "datasource",
            "query": "prometheus",
            "current": {},
            "options": [],
            "refresh": 1,
            "regex": "",
            "includeAll": false,
            "multi": false,
            "hide": 0
        }),
        query("node", "Node", "label_values(kstall_build_info, node)"),
        query("namespace", "Namespace", r#"label_values({__name__=~"kstall_.+", node=~"$node"}, namespace)"#),
        query(
            "pod",
            "Pod",
            r#"label_values({__name__=~"kstall_.+", node=~"$node", namespace=~"$namespace"}, pod)"#,
        ),
    ]
}

/// A query drawn over the time range.
fn range(ref_id: &str, expr: &str, legend: &str) -> anyhow::Result<Value> {
    Ok(json!({
        "datasource": datasource(),
        "refId": ref_id,
        "expr": filter(expr)?,
        "legendFormat": legend,
        "range": true,
        "instant": false,
        "editorMode": "code"
    }))
}

/// A query at the end of the time range, as one value per series (for stat panels).
fn current(ref_id: &str, expr: &str, legend: &str) -> anyhow::Result<Value> {
    Ok(json!({
        "datasource": datasource(),
        "refId": ref_id,
        "expr": filter(expr)?,
        "legendFormat": legend,
        "range": false,
        "instant": true,
        "editorMode": "code"
    }))
}

/// A query at the end of the time range, as table rows (one column per label).
fn instant(ref_id: &str, expr: &str) -> anyhow::Result<Value> {
    Ok(json!({
        "datasource": datasource(),
        "refId": ref_id,
        "expr": filter(expr)?,
        "legendFormat": "__auto",
        "range": false,
        "instant": true,
        "format": "table",
        "editorMode": "code"
    }))
}

struct Panel {
    width: u32,
    height: u32,
    json: Value,
}

impl Panel {
    fn new(kind: &str, title: &str, description: &str, targets: Vec<Value>) -> Self {
        Panel {
            width: 12,
            height: 8,
            json: json!({
                "type": kind,
                "title": title,
                "description": description,
                "datasource": datasource(),
                "targets": targets,
                "fieldConfig": {"defaults": {}, "overrides": []},
                "options": {}
            }),
        }
    }

    /// Lines over time, stepped: counters and gauges change at scrapes, not in between.
    fn timeseries(title: &str, description: &str, unit: &str, targets: Vec<Value>) -> Self {
        let mut panel = Panel::new("timeseries", title, description, targets);
        panel.json["fieldConfig"]["defaults"] = json!({
            "unit": unit,
            "min": 0,
            "custom": {"drawStyle": "line", "lineInterpolation": "stepAfter", "fillOpacity": 10, "showPoints": "never", "spanNulls": false}
        });
        panel.json["options"] = json!({
            "legend": {"displayMode": "table", "placement": "bottom", "showLegend": true, "calcs": ["lastNotNull", "max"]},
            "tooltip": {"mode": "multi", "sort": "desc"}
        });
        panel
    }

    /// Rows of the instant queries' label sets and values; the queries' frames merged into one.
    fn table(title: &str, description: &str, targets: Vec<Value>) -> Self {
        let mut panel = Panel::new("table", title, description, targets);
        panel.json["options"] = json!({"showHeader": true, "cellHeight": "sm", "footer": {"show": false}});
        panel.json["transformations"] = json!([
            {"id": "merge", "options": {}},
            {"id": "organize", "options": {"excludeByName": {"Time": true}}}
        ]);
        panel
    }

    /// One big number per series.
    fn stat(title: &str, description: &str, unit: &str, targets: Vec<Value>) -> Self {
        let mut panel = Panel::new("stat", title, description, targets);
        panel.json["fieldConfig"]["defaults"]["unit"] = json!(unit);
        panel.json["options"] = json!({
            "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": false},
            "colorMode": "background",
            "graphMode": "none",
            "textMode": "value_and_name",
            "justifyMode": "auto",
            "orientation": "auto"
        });
        panel
    }

    /// One band per series, coloured by its value mappings.
    fn state_timeline(
        title: &str,
        description: &str,
        targets: Vec<Value>,
        states: &[(u8, &str, &str)],
    ) -> Self {
        let mut panel = Panel::new("state-timeline", title, description, targets);
        let options: serde_json::Map<String, Value> = states
            .iter()
            .enumerate()
            .map(|(index, (value, text, color))| {
                (value.to_string(), json!({"text": text, "color": color, "index": index}))
            })
            .collect();
        panel.json["fieldConfig"]["defaults"] = json!({
            "mappings": [{"type": "value", "options": options}],
            "color": {"mode": "fixed", "fixedColor": "text"},
            "custom": {"fillOpacity": 80, "lineWidth": 0}
        });
        panel.json["options"] = json!({
            "mergeValues": true,
            "showValue": "never",
            "rowHeight": 0.9,
            "alignValue": "left",
            "legend": {"displayMode": "list", "placement": "bottom", "showLegend": false},
            "tooltip": {"mode": "single", "sort": "none"}
        });
        panel
    }

    fn text(title: &str, markdown: &str) -> Self {
        let mut panel = Panel::new("text", title, "", Vec::new());
        let json = panel.json.as_object_mut().expect("object");
        for key in ["datasource", "targets", "fieldConfig"] {
            json.remove(key);
        }
        panel.json["options"] = json!({"mode": "markdown", "content": markdown});
        panel
    }

    fn size(mut self, width: u32, height: u32) -> Self {
        (self.width, self.height) = (width, height);
        self
    }

    /// Shown instead of "No data" by panels of counters that only exist once something went
    /// wrong: none is the good case.
    fn none_is_zero(mut self) -> Self {
        self.json["fieldConfig"]["defaults"]["noValue"] = json!("0");
        self
    }

    /// Red where `comparison` holds (an alert's, or what a panel calls bad), drawn as a threshold
    /// on time series.
    fn bad_when(mut self, comparison: &Comparison) -> Self {
        let steps = match comparison {
            Comparison::IsZero => json!([{"color": "red", "value": null}, {"color": "green", "value": 1}]),
            // Grafana's steps start at their value: "above 0" starts at the smallest value shown.
            Comparison::Above(v) => {
                let from = if *v == 0.0 { 0.001 } else { *v };
                json!([{"color": "green", "value": null}, {"color": "red", "value": from}])
            }
        };
        let timeseries = self.json["type"] == "timeseries";
        let defaults = &mut self.json["fieldConfig"]["defaults"];
        defaults["thresholds"] = json!({"mode": "absolute", "steps": steps});
        if timeseries {
            defaults["custom"]["thresholdsStyle"] = json!({"mode": "dashed"});
        } else {
            defaults["color"] = json!({"mode": "thresholds"});
        }
        self
    }

    /// A table column whose cells link to the runbook named by the cell's value.
    fn runbook_links(mut self, column: &str) -> Self {
        let link = json!({"title": "Runbook: ${__value.text}", "url": "${runbooks}/${__value.raw}.md", "targetBlank": true});
        self.json["fieldConfig"]["overrides"] = json!([{
            "matcher": {"id": "byName", "options": column},
            "properties": [{"id": "links", "value": [link]}]
        }]);
        self
    }

    /// Leaves out the merged tables' value columns (`Value #<refId>`) of these queries.
    fn hide_values(mut self, ref_ids: &[&str]) -> Self {
        for ref_id in ref_ids {
            self.json["transformations"][1]["options"]["excludeByName"][format!("Value #{ref_id}")] =
                json!(true);
        }
        self
    }

    /// Column headers for the merged tables' values (`Value #<refId>`).
    fn rename_values(mut self, names: &[(&str, &str)]) -> Self {
        let renames: serde_json::Map<String, Value> =
            names.iter().map(|(ref_id, name)| (format!("Value #{ref_id}"), json!(name))).collect();
        self.json["transformations"][1]["options"]["renameByName"] = Value::Object(renames);
        self
    }
}

fn incidents(rules: &Rules) -> anyhow::Result<Dashboard> {
    let incident_alerts = rules.group("kstall-incidents")?;
    // Exactly the incident alerts' expressions: a row here is an alert firing.
    let firing: Vec<Value> =
        incident_alerts.iter().map(|r| instant(&r.alert, &r.expr)).collect::<anyhow::Result<_>>()?;
    let alert_names: Vec<&str> = incident_alerts.iter().map(|r| r.alert.as_str()).collect();
    let mut runbooks = String::from(
        "The runbook of every alert (docs/runbooks/ in the kstall repository; the dashboard's \
         `runbooks` variable says where they are published).\n\n| alert | runbook |\n|---|---|\n",
    );
    for group in &rules.groups {
        for rule in &group.rules {
            let file = rule.runbook()?;
            runbooks.push_str(&format!("| {} | [{file}](${{runbooks}}/{file}) |\n", rule.alert));
        }
    }
    let mut dashboard = Dashboard::new(
        "kstall-incidents",
        "kstall / Incidents",
        "What kstall's incident engine fires now and fired recently, by node and signature, with the runbooks.",
    );
    dashboard.variables.push(json!({
        "name": "runbooks",
        "label": "Runbooks URL",
        "type": "textbox",
        "query": RUNBOOKS_URL,
        "current": {"text": RUNBOOKS_URL, "value": RUNBOOKS_URL},
        "options": [{"selected": true, "text": RUNBOOKS_URL, "value": RUNBOOKS_URL}],
        "hide": 0
    }));
    Ok(dashboard
        .panel(
            Panel::table(
                "Alerts firing now",
                "One row per incident alert firing now: each query is that alert's expression in \
                 deploy/prometheus/kstall-rules.yaml, narrowed to the selection (a node's own \
                 incidents, which have no pod, show with any pod). The signature links to its \
                 runbook; `kstall incidents` on the node has the evidence and the way out.",
                firing,
            )
            .hide_values(&alert_names)
            .runbook_links("signature")
            .size(16, 9),
        )
        .panel(Panel::text("Runbooks", &runbooks).size(8, 9))
        .panel(
            Panel::state_timeline(
                "Incidents over time",
                "When each incident fired, per node, signature and pod (kstall_incident_active).",
                vec![range(
                    "A",
                    "max by (node, signature, namespace, pod) (kstall_incident_active)",
                    "{{node}} {{signature}} {{namespace}}/{{pod}}",
                )?],
                &[(1, "firing", "red")],
            )
            .size(24, 9),
        )
        .panel(
            Panel::table(
                "Fired in the time range",
                "Every incident that fired at some point in the dashboard's time range, resolved or not.",
                vec![instant(
                    "A",
                    "max by (node, signature, severity, namespace, pod) \
                     (max_over_time(kstall_incident_active[$__range]))",
                )?],
            )
            .runbook_links("signature")
            .size(12, 8),
        )
        .panel(
            Panel::table(
                "Incidents started, by node and signature",
                "Incidents that started firing since each node's agent started \
                 (kstall_incidents_total): compare nodes side by side.",
                vec![instant("A", "sum by (node, signature, severity) (kstall_incidents_total)")?],
            )
            .size(12, 8),
        ))
}

fn nfs() -> anyhow::Result<Dashboard> {
    let per_pod = "{{node}} {{server}} {{namespace}}/{{pod}}";
    Ok(Dashboard::new(
        "kstall-nfs",
        "kstall / NFS",
        "The kernel NFS client, per server and per pod: RPC latency, timeouts, retransmits, connect \
         errors, whether the server responds, and the tasks stuck waiting for it. Compare nodes \
         before blaming the server (incident 1).",
    )
    .panel(
        Panel::state_timeline(
            "Server responding",
            "0 after a major RPC timeout (the kernel's `nfs: server ... not responding`), 1 again \
             once a reply arrives (`server ... OK`), per server and pod.",
            vec![range("A", "min by (node, server, namespace, pod) (kstall_nfs_server_responding)", per_pod)?],
            &[(0, "not responding", "red"), (1, "OK", "green")],
        )
        .size(24, 7),
    )
    .panel(Panel::timeseries(
        "RPC latency p99",
        "How long 99% of each pod's NFS RPCs to each server took (queued, sent and answered), over the \
         rate interval: the slowness users feel with no error anywhere (nfs-slow fires past 500 ms \
         for a minute). The pod is the one whose process started the RPCs.",
        "s",
        vec![range(
            "A",
            "histogram_quantile(0.99, sum by (le, node, server, namespace, pod) \
             (rate(kstall_nfs_rpc_duration_seconds_bucket[$__rate_interval])))",
            per_pod,
        )?],
    ))
    .panel(Panel::timeseries(
        "Slowest operations (p99)",
        "The 99th percentile per server and procedure (READ, WRITE, COMMIT, GETATTR, ...) over the \
         selected pods: slow WRITE/COMMIT alone points at the server's storage, every operation slow \
         at the network or the server's CPU.",
        "s",
        vec![range(
            "A",
            "histogram_quantile(0.99, sum by (le, node, server, operation) \
             (rate(kstall_nfs_rpc_duration_seconds_bucket[$__rate_interval])))",
            "{{node}} {{server}} {{operation}}",
        )?],
    ))
    .panel(Panel::timeseries(
        "Major RPC timeouts",
        "Major RPC timeouts per second, per server and pod (`server not responding`).",
        "ops",
        vec![range(
            "A",
            "sum by (node, server, namespace, pod) (rate(kstall_nfs_rpc_timeouts_total[$__rate_interval]))",
            per_pod,
        )?],
    ))
    .panel(Panel::timeseries(
        "RPC retransmits",
        "RPC requests retransmitted per second, per server and pod.",
        "ops",
        vec![range(
            "A",
            "sum by (node, server, namespace, pod) (rate(kstall_nfs_rpc_retransmits_total[$__rate_interval]))",
            per_pod,
        )?],
    ))
    .panel(Panel::timeseries(
        "Connect errors",
        "Failed connects, socket errors and resets of RPC transports per second, per server, pod and \
         error. ECONNREFUSED while the server answers other nodes: the pod's own connections are \
         refused locally (see the TCP resets dashboard, original port 2049).",
        "ops",
        vec![range(
            "A",
            "sum by (node, server, namespace, pod, error) (rate(kstall_nfs_connect_errors_total[$__rate_interval]))",
            "{{node}} {{server}} {{namespace}}/{{pod}} {{error}}",
        )?],
    ))
    .panel(Panel::timeseries(
        "Tasks stuck in NFS waits",
        "Tasks stuck now (found by kstall's sampler or the kernel's hung-task detector) whose stack \
         waits on NFS, per pod: they will not finish, and their pod will not start or terminate, \
         until the server answers.",
        "short",
        vec![range(
            "A",
            r#"sum by (node, namespace, pod) (kstall_stuck_tasks{wait="nfs"})"#,
            "{{node}} {{namespace}}/{{pod}}",
        )?],
    ))
    .panel(
        Panel::table(
            "NFS errors by node",
            "Every selected node side by side over the time range (select All or several nodes): a \
             server at fault shows errors on every node that mounts it; errors on one node only point \
             at that node — the comparison that broke incident 1's wrong hypothesis.",
            vec![
                instant("A", "sum by (node) (increase(kstall_nfs_rpc_timeouts_total[$__range]))")?,
                instant("B", "sum by (node) (increase(kstall_nfs_rpc_retransmits_total[$__range]))")?,
                instant("C", "sum by (node) (increase(kstall_nfs_connect_errors_total[$__range]))")?,
            ],
        )
        .rename_values(&[("A", "major timeouts"), ("B", "retransmits"), ("C", "connect errors")]),
    )
    .panel(
        Panel::timeseries(
            "NFSv4 state recovery failures",
            "NFSv4 state recovery (lease, session) failures per second, per server and section: a \
             stuck recovery blocks every mount of that server on the node (incident 3).",
            "ops",
            vec![range(
                "A",
                "sum by (node, server, section) (rate(kstall_nfs_state_manager_failures_total[$__rate_interval]))",
                "{{node}} {{server}} {{section}}",
            )?],
        )
        .none_is_zero(),
    ))
}

fn tcp_resets(rules: &Rules) -> anyhow::Result<Dashboard> {
    let (nearly_full, table_use, comparison) = rules.compared("KstallConntrackTableNearlyFull")?;
    Ok(Dashboard::new(
        "kstall-tcp-resets",
        "kstall / TCP resets and dropped packets",
        "TCP resets by pod, direction, reason and port. A reset with an original port is a NAT-redirected \
         connection; original port 2049 with port 15001 is incident 1's sidecar redirect. Below them, the \
         packets the kernel dropped, by pod and drop reason: a reset is a refusal, a drop a timeout; and \
         the connection tracking tables, whose drops when full are timeouts too.",
    )
    .panel(
        Panel::stat(
            "Redirected NFS connections reset",
            "Resets of connections to an NFS port (2049, 111, 20048) that NAT redirected elsewhere, in \
             the time range, per pod: anything but 0 is a sidecar capturing the kernel NFS client.",
            "short",
            vec![current(
                "A",
                r#"sum by (node, namespace, pod) (increase(kstall_tcp_resets_total{original_port=~"2049|111|20048"}[$__range]))"#,
                "{{node}} {{namespace}}/{{pod}}",
            )?],
        )
        .bad_when(&Comparison::Above(0.0))
        .size(8, 8),
    )
    .panel(
        Panel::timeseries(
            "Redirected resets",
            "Resets per second of connections NAT redirected (original_port set), per pod, port and \
             original port.",
            "ops",
            vec![range(
                "A",
                r#"sum by (node, namespace, pod, direction, port, original_port) (rate(kstall_tcp_resets_total{original_port!=""}[$__rate_interval]))"#,
                "{{node}} {{namespace}}/{{pod}} {{direction}} {{original_port}} -> {{port}}",
            )?],
        )
        .size(16, 8),
    )
    .panel(
        Panel::timeseries(
            "Resets by pod, direction and reason",
            "Resets per second. sent: this node refused (reason: the kernel's, NO_SOCKET = nothing \
             listened); received: a local socket got one.",
            "ops",
            vec![range(
                "A",
                "sum by (node, namespace, pod, direction, reason) (rate(kstall_tcp_resets_total[$__rate_interval]))",
                "{{node}} {{namespace}}/{{pod}} {{direction}} {{reason}}",
            )?],
        )
        .size(24, 8),
    )
    .panel(
        Panel::table(
            "Resets by port and original port",
            "Resets in the time range. port: the local port that refused (sent) or the remote port \
             (received); original_port: the pre-NAT destination of a redirected connection.",
            vec![instant(
                "A",
                "sum by (node, namespace, pod, direction, port, original_port, reason) \
                 (increase(kstall_tcp_resets_total[$__range]))",
            )?],
        )
        .size(24, 8),
    )
    .panel(
        Panel::timeseries(
            "Dropped packets by pod and reason",
            "Packets per second the kernel dropped, by pod, direction and the kernel's drop reason. \
             NETFILTER_DROP in a pod is a firewall rule of its namespace (a NetworkPolicy: \
             network-policy-drops fires); empty reason: a kernel before 5.17.",
            "pps",
            vec![range(
                "A",
                "sum by (node, namespace, pod, direction, reason) (rate(kstall_packet_drops_total[$__rate_interval]))",
                "{{node}} {{namespace}}/{{pod}} {{direction}} {{reason}}",
            )?],
        )
        .size(24, 8),
    )
    .panel(
        Panel::table(
            "Dropped packets by protocol and port",
            "Packets dropped in the time range, by pod, reason, protocol, direction and destination port \
             (well-known ports by number, others ephemeral or other).",
            vec![instant(
                "A",
                "sum by (node, namespace, pod, reason, protocol, direction, port) \
                 (increase(kstall_packet_drops_total[$__range]))",
            )?],
        )
        .size(24, 8),
    )
    .panel(
        Panel::timeseries(
            "Conntrack table use",
            &format!(
                "Entries over net.netfilter.nf_conntrack_max, for the node's table (empty pod: forwarded and \
                 NATed traffic) and each pod namespace's in use. At 1 new connections are dropped \
                 (conntrack-table-full fires). {}",
                nearly_full.condition()
            ),
            "percentunit",
            vec![range("A", table_use, "{{node}} {{namespace}}/{{pod}}")?],
        )
        .bad_when(&comparison),
    )
    .panel(Panel::timeseries(
        "Packets conntrack dropped",
        "Packets per second dropped because their connection could not be tracked (the table full, or no \
         memory), per table: every one a connect that waits for its retransmission, or times out.",
        "pps",
        vec![range(
            "A",
            "sum by (node, namespace, pod) (rate(kstall_conntrack_drops_total[$__rate_interval]))",
            "{{node}} {{namespace}}/{{pod}}",
        )?],
    )))
}

fn memory_oom(rules: &Rules) -> anyhow::Result<Dashboard> {
    let (overcommitted, ratio, comparison) = rules.compared("KstallMemoryLimitsOvercommitted")?;
    // OOM kills are counted since the agent started, not as increase(): a series begins at its
    // first kill, which increase() over a window would not count.
    Ok(Dashboard::new(
        "kstall-memory-oom",
        "kstall / Memory and OOM",
        "OOM kills: a container hitting its own limit (memcg) or the node running out (system, \
         incident 2), their victims, kills of node-critical processes, and the pods' memory limits \
         against the node's memory.",
    )
    .panel(
        Panel::timeseries(
            "Memory-limit overcommit per node",
            &format!(
                "Sum of the pods' memory limits over the node's memory: above 1 the limits cannot all \
                 be honoured and the node can run out (incident 2 ran at 1.29). {}",
                overcommitted.condition()
            ),
            "percentunit",
            vec![range("A", ratio, "{{node}}")?],
        )
        .bad_when(&comparison),
    )
    .panel(Panel::table(
        "Node-critical victims killed",
        "OOM kills of node-critical processes (kubelet, container runtime, node daemons, kstall) since \
         the agent started, by scope and victim.",
        vec![instant(
            "A",
            r#"sum by (node, scope, namespace, pod, comm) (kstall_oom_kills_total{critical="true"})"#,
        )?],
    ))
    .panel(
        Panel::timeseries(
            "Memory pressure by pod",
            "Share of time at least one task of the pod (or of the node: empty pod) waited for memory \
             (PSI some): reclaim under its limit, throttling above memory.high, refaults. Sustained above \
             20% memory-pressure fires; an OOM kill often follows.",
            "percentunit",
            vec![range(
                "A",
                r#"sum by (node, namespace, pod) (rate(kstall_pressure_stalled_seconds_total{resource="memory",kind="some"}[$__rate_interval]))"#,
                "{{node}} {{namespace}}/{{pod}}",
            )?],
        )
        .size(24, 8),
    )
    .panel(
        Panel::timeseries(
            "IO and CPU pressure by pod",
            "Share of time at least one task waited for IO or for a CPU (PSI some), per pod and the node's \
             (empty pod).",
            "percentunit",
            vec![range(
                "A",
                r#"sum by (node, namespace, pod, resource) (rate(kstall_pressure_stalled_seconds_total{resource=~"io|cpu",kind="some"}[$__rate_interval]))"#,
                "{{node}} {{namespace}}/{{pod}} {{resource}}",
            )?],
        )
        .size(24, 8),
    )
    .panel(
        Panel::timeseries(
            "OOM kills by scope",
            "OOM kills since the agent started (a step up is a kill): memcg = a container's own \
             limit, global = the node ran out of memory.",
            "short",
            vec![range("A", "sum by (node, scope) (kstall_oom_kills_total)", "{{node}} {{scope}}")?],
        )
        .size(24, 8),
    )
    .panel(Panel::table(
        "Container (memcg) OOM kills by pod and victim",
        "Kills by a cgroup's own memory limit since the agent started, per pod, container and victim.",
        vec![instant(
            "A",
            r#"sum by (node, namespace, pod, container, comm) (kstall_oom_kills_total{scope="memcg"})"#,
        )?],
    ))
    .panel(Panel::table(
        "System (global) OOM kills by victim",
        "Kills by the node-wide OOM killer since the agent started: the node ran out of memory. An \
         empty pod is a node process (critical: kubelet, runtime, node daemons).",
        vec![instant(
            "A",
            r#"sum by (node, namespace, pod, comm, critical) (kstall_oom_kills_total{scope="global"})"#,
        )?],
    )))
}

fn hung_tasks() -> anyhow::Result<Dashboard> {
    Ok(Dashboard::new(
        "kstall-hung-tasks",
        "kstall / Stuck tasks",
        "Tasks stuck in uninterruptible sleep (plain D, or killable: the sleeps the kernel's \
         hung-task detector skips), by pod, wait class (nfs, writeback, block_io, fs_lock, mm, \
         other) and kind, and how long the longest has been blocked; and the tasks that spin in the \
         kernel instead, holding a CPU (soft lockups).",
    )
    .panel(
        Panel::timeseries(
            "Tasks stuck now, by pod, wait class and kind",
            "Tasks asleep uninterruptibly and not run for --stuck-task-threshold (or reported by the \
             kernel's detector), per pod, wait class (from the task's kernel stack) and kind.",
            "short",
            vec![range(
                "A",
                "sum by (node, namespace, pod, wait, kind) (kstall_stuck_tasks)",
                "{{node}} {{namespace}}/{{pod}} {{wait}} {{kind}}",
            )?],
        )
        .size(16, 8),
    )
    .panel(
        Panel::timeseries(
            "Longest blocked, per node",
            "How long the longest-blocked task stuck now has been blocked, per node (the agent keeps \
             this per node, not per pod: `kstall explain pod` has each task's).",
            "s",
            vec![range("A", "max by (node) (kstall_stuck_task_longest_blocked_seconds)", "{{node}}")?],
        )
        .size(8, 8),
    )
    .panel(Panel::table(
        "Stuck now",
        "The tasks stuck now, per pod, container, wait class and kind.",
        vec![instant("A", "sum by (node, namespace, pod, container, wait, kind) (kstall_stuck_tasks)")?],
    ))
    .panel(Panel::table(
        "Tasks newly stuck, since the agent started",
        "Tasks found stuck since the agent started (each counts once however long it stays stuck), \
         per pod, wait class, kind and the probe that found it first.",
        vec![instant(
            "A",
            "sum by (node, namespace, pod, container, wait, kind, source) (kstall_stuck_tasks_total)",
        )?],
    ))
    .panel(Panel::table(
        "CPUs stuck in the kernel (soft lockups, RCU stalls)",
        "Reports of a stuck CPU by the kernel's soft-lockup watchdog (no other task ran for 2 x \
         kernel.watchdog_thresh) or RCU's stall detector since the agent started, per pod of the task \
         that spun there, detector and where its stack spins (nfs: the NFS client). Such a task is \
         running, never in D state: none of the panels above shows it (cpu-soft-lockup fires).",
        vec![instant(
            "A",
            "sum by (node, namespace, pod, container, detector, wait) (kstall_cpu_lockups_total)",
        )?],
    ))
    .panel(Panel::timeseries(
        "Sampler: kernel time per sweep",
        "The stuck-task sampler's own cost: CPU time of one sweep (the kernel walking every task and \
         running the sampler's program for each), per node. It grows with the node's task count \
         (measured: 6.7 ms for 10,000 tasks on a 2-core 6.18 machine, every 5 s by default).",
        "s",
        vec![range(
            "A",
            "sum by (node) (rate(kstall_stuck_task_sweep_kernel_seconds_sum[$__rate_interval])) / sum by (node) \
             (rate(kstall_stuck_task_sweep_kernel_seconds_count[$__rate_interval]))",
            "{{node}}",
        )?],
    ))
    .panel(Panel::timeseries(
        "Sampler: tasks per sweep",
        "Tasks the last sweep walked, and of those asleep uninterruptibly (stuck or not), per node. \
         A node whose asleep count stays high while nothing is reported stuck has tasks that sleep \
         in D briefly and often: slow I/O, not a stall.",
        "short",
        vec![
            range("A", "max by (node) (kstall_stuck_task_sweep_tasks)", "{{node}} walked")?,
            range("B", "max by (node) (kstall_stuck_task_sweep_uninterruptible)", "{{node}} asleep")?,
        ],
    )))
}

/// Across nodes: what the fleet alerts fire on, and the counts they compare.
fn fleet(rules: &Rules) -> anyhow::Result<Dashboard> {
    let fleet_alerts = rules.group("kstall-fleet")?;
    let firing: Vec<Value> =
        fleet_alerts.iter().map(|r| instant(&r.alert, &r.expr)).collect::<anyhow::Result<_>>()?;
    let names: Vec<&str> = fleet_alerts.iter().map(|r| r.alert.as_str()).collect();
    Ok(Dashboard::new(
        "kstall-fleet",
        "kstall / Fleet",
        "One cause seen from many nodes: an NFS server several nodes cannot reach, a workload whose \
         pods all have their NFS redirected, a signature on a share of the fleet.",
    )
    .panel(
        Panel::table(
            "Fleet alerts firing now",
            "One row per fleet alert firing now: each query is that alert's expression in \
             deploy/prometheus/kstall-rules.yaml (group kstall-fleet). docs/runbooks/fleet.md says what \
             to do; the per-node alerts they sum up can wait (deploy/alertmanager/kstall-inhibit.yaml).",
            firing,
        )
        .hide_values(&names)
        .size(24, 6),
    )
    .panel(
        Panel::timeseries(
            "Nodes firing each signature",
            "How many nodes have at least one incident of each signature: a signature on many nodes at \
             once has a cause they share (KstallSignatureOnManyNodes).",
            "short",
            vec![range(
                "A",
                "count by (signature) (max by (signature, node) (kstall_incident_active))",
                "{{signature}}",
            )?],
        )
        .size(12, 8),
    )
    .panel(
        Panel::timeseries(
            "Nodes not reaching each NFS server",
            "For each NFS server, how many nodes report it not responding (a major RPC timeout, not yet \
             answered): two or more is the server's outage (KstallNfsServerUnreachableFromNodes).",
            "short",
            vec![range(
                "A",
                "sum by (server) (1 - min by (server, node) (kstall_nfs_server_responding))",
                "{{server}}",
            )?],
        )
        .size(12, 8),
    )
    .panel(
        Panel::timeseries(
            "Pods with NFS redirected, by workload",
            "Pods of each workload whose NFS connections a sidecar's rules redirect and reset \
             (nfs-sidecar-redirect): several pods of one workload is a rollout (KstallNfsSidecarRedirectRollout).",
            "short",
            vec![range(
                "A",
                "count by (namespace, workload) (max by (namespace, workload, pod) (kstall_incident_active{signature=\"nfs-sidecar-redirect\"}))",
                "{{namespace}} {{workload}}",
            )?],
        )
        .size(12, 8),
    )
    .panel(
        Panel::timeseries(
            "Agents reporting, by version",
            "Nodes whose kstall Prometheus scrapes, by kstall version: what the fleet alerts' shares are \
             of, and a kstall rollout's progress.",
            "short",
            vec![range("A", "count by (version) (kstall_build_info)", "{{version}}")?],
        )
        .size(12, 8),
    ))
}

fn agent(rules: &Rules) -> anyhow::Result<Dashboard> {
    let (agent_down, up, up_down) = rules.compared("KstallAgentDown")?;
    let (probe_down, probes, _) = rules.compared("KstallProbeDown")?;
    let (lost, lost_rate, lost_above) = rules.compared("KstallEventsLost")?;
    let (stale, metadata_up, metadata_down) = rules.compared("KstallPodMetadataStale")?;
    Ok(Dashboard::new(
        "kstall-agent",
        "kstall / Agent",
        "kstall itself: scraped, its probes attached, the events it receives and loses, and where \
         its pod names come from.",
    )
    .panel(
        Panel::stat(
            "Agent scraped",
            &format!("Prometheus reaches the agent (1) or not (0). {}", agent_down.condition()),
            "none",
            vec![current("A", up, "{{node}}")?],
        )
        .bad_when(&up_down)
        .size(6, 6),
    )
    .panel(
        Panel::stat(
            "Pod metadata current",
            &format!(
                "1 while the pod source (Kubernetes API or pods file) is current; 0: new pods' events \
                 carry UIDs, not names. {}",
                stale.condition()
            ),
            "none",
            vec![current("A", metadata_up, "{{node}}")?],
        )
        .bad_when(&metadata_down)
        .size(6, 6),
    )
    .panel(
        Panel::table(
            "Agent version",
            "kstall's version per node.",
            vec![instant("A", "max by (node, version) (kstall_build_info)")?],
        )
        .size(12, 6),
    )
    .panel(
        Panel::state_timeline(
            "Probes up",
            &format!(
                "Each probe attached (up) or not; `kstall status` on the node says why. {}",
                probe_down.condition()
            ),
            vec![range("A", probes, "{{node}} {{probe}}")?],
            &[(0, "down", "red"), (1, "up", "green")],
        )
        .size(24, 7),
    )
    .panel(Panel::timeseries(
        "Events received",
        "Records per second from the kernel, per probe (repeats included).",
        "ops",
        vec![range(
            "A",
            "sum by (node, probe) (rate(kstall_events_total[$__rate_interval]))",
            "{{node}} {{probe}}",
        )?],
    ))
    .panel(
        Panel::timeseries(
            "Events lost",
            &format!(
                "Events per second the kernel dropped because the ring buffer was full (raise \
                 --ring-buffer-bytes). {}",
                lost.condition()
            ),
            "ops",
            vec![range("A", lost_rate, "{{instance}} {{probe}}")?],
        )
        .bad_when(&lost_above),
    )
    .panel(
        Panel::timeseries(
            "Decode errors",
            "Ring-buffer records per second the agent could not decode, per error: should stay 0 (a \
             kernel/agent mismatch; report it).",
            "ops",
            vec![range(
                "A",
                "sum by (node, error) (rate(kstall_event_decode_errors_total[$__rate_interval]))",
                "{{node}} {{error}}",
            )?],
        )
        .none_is_zero()
        .size(8, 8),
    )
    .panel(
        Panel::timeseries(
            "API events dropped",
            "Events per second not delivered to an API client (kstall trace, a stream) that fell behind \
             or stopped reading.",
            "ops",
            vec![range(
                "A",
                "sum by (node, stream) (rate(kstall_api_events_dropped_total[$__rate_interval]))",
                "{{node}} {{stream}}",
            )?],
        )
        .none_is_zero()
        .size(8, 8),
    )
    .panel(
        Panel::timeseries(
            "eBPF CPU by program",
            "The share of one core the kernel spent in each of kstall's programs, as the kernel counts \
             it: only while run-time statistics are on (--program-stats on, or kernel.bpf_stats_enabled); \
             nothing is counted while they are off.",
            "percentunit",
            vec![range(
                "A",
                "sum by (node, program) (rate(kstall_program_run_seconds_total[$__rate_interval]))",
                "{{node}} {{program}}",
            )?],
        )
        .size(8, 8),
    )
    .panel(
        Panel::timeseries(
            "eBPF time per run",
            "Average time of one run of each program since the agent started (while counted): what one \
             hook firing costs the task or softirq it fired in.",
            "s",
            vec![range(
                "A",
                "sum by (node, program) (kstall_program_run_seconds_total) / sum by (node, program) (kstall_program_runs_total > 0)",
                "{{node}} {{program}}",
            )?],
        )
        .size(8, 8),
    )
    .panel(
        Panel::timeseries(
            "Ring buffer fill",
            "How full the kernel-to-agent ring buffer was when the reader last woke, and the most it \
             ever was: at 100% events are lost (raise --ring-buffer-bytes).",
            "percentunit",
            vec![
                range(
                    "A",
                    "max by (node) (kstall_ring_buffer_used_bytes / kstall_ring_buffer_size_bytes)",
                    "{{node}} when last read",
                )?,
                range(
                    "B",
                    "max by (node) (kstall_ring_buffer_used_max_bytes / kstall_ring_buffer_size_bytes)",
                    "{{node}} most since start",
                )?,
            ],
        )
        .size(8, 8),
    )
    .panel(
        Panel::timeseries(
            "Event stream (--export-events)",
            "Records per second the JSON lines stream wrote (events, incidents), and those it dropped \
             because its consumer or disk was behind (or writing failed): each dropped one is a gap in \
             the stream's seq. None when the stream is off.",
            "ops",
            vec![
                range(
                    "A",
                    "sum by (node, output, record) (rate(kstall_export_records_total[$__rate_interval]))",
                    "{{node}} {{output}} {{record}} written",
                )?,
                range(
                    "B",
                    "sum by (node, output, reason) (rate(kstall_export_records_dropped_total[$__rate_interval]))",
                    "{{node}} {{output}} dropped: {{reason}}",
                )?,
            ],
        )
        .none_is_zero()
        .size(8, 8),
    )
    .panel(
        Panel::timeseries(
            "Events without a pod",
            "Events per second sent without their pod or host known (a network namespace or cgroup of \
             no pod, or one already gone), per probe.",
            "ops",
            vec![range(
                "A",
                "sum by (node, probe) (rate(kstall_events_unattributed_total[$__rate_interval]))",
                "{{node}} {{probe}}",
            )?],
        )
        .none_is_zero()
        .size(8, 8),
    )
    .panel(
        Panel::timeseries(
            "Pods kstall can name",
            "Pods of the node kstall knows from its pod source: running, and deleted ones kept for the \
             retention time (their late events keep their names).",
            "short",
            vec![range("A", "sum by (node, state) (kstall_attribution_pods)", "{{node}} {{state}}")?],
        )
        .size(12, 7),
    )
    .panel(
        Panel::timeseries(
            "Pods by phase and waiting reason",
            "Pods the pod source lists on the node, by phase and by the reason their first waiting \
             container waits: a pile of ImagePullBackOff (a CronJob whose image is gone), pods stuck \
             in ContainerCreating. Incident 4 had 360 in ImagePullBackOff on one node.",
            "short",
            vec![range(
                "A",
                "sum by (node, phase, waiting_reason) (kstall_node_pods)",
                "{{node}} {{phase}} {{waiting_reason}}",
            )?],
        )
        .size(12, 7),
    )
    .panel(
        Panel::timeseries(
            "Kubelet checks",
            "1 when the last check of the node's kubelet passed: its healthz (:10248), a TLS \
             handshake with its server (:10250). Incident 4's kubelet sent Ready heartbeats while \
             :10250 timed out in TLS handshakes; 0 here with kubelet-degraded firing is that.",
            "short",
            vec![range("A", "min by (node, check) (kstall_kubelet_check_up)", "{{node}} {{check}}")?],
        )
        .size(12, 7),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_committed_dashboards_are_the_generated_ones() {
        let root = workspace_root();
        let generated = generate(&root).expect("generate");
        let fix = "run `cargo xtask dashboards` and commit the result";
        for (file, text) in &generated {
            let path = root.join(DIR).join(file);
            let committed = std::fs::read_to_string(&path).unwrap_or_default();
            assert!(committed == *text, "{DIR}/{file} is not what the generator makes: {fix}");
        }
        for entry in std::fs::read_dir(root.join(DIR)).expect("deploy/grafana") {
            let name = entry.unwrap().file_name().to_string_lossy().into_owned();
            if name.ends_with(".json") {
                assert!(generated.iter().any(|(f, _)| *f == name), "{DIR}/{name} is not generated: {fix}");
            }
        }
    }

    #[test]
    fn selectors_get_the_variables_of_their_metric() {
        let f = |e: &str| filter(e).unwrap();
        assert_eq!(f("kstall_probe_up == 0"), r#"kstall_probe_up{node=~"$node"} == 0"#);
        assert_eq!(
            f(r#"sum by (pod) (rate(kstall_tcp_resets_total{original_port!=""}[$__rate_interval]))"#),
            r#"sum by (pod) (rate(kstall_tcp_resets_total{node=~"$node",namespace=~"$namespace",pod=~"$pod",original_port!=""}[$__rate_interval]))"#
        );
        assert_eq!(f(r#"up{job="kstall"} == 0"#), r#"up{node=~"$node",job="kstall"} == 0"#);
        assert_eq!(
            f("kstall_stuck_tasks {}"),
            r#"kstall_stuck_tasks{node=~"$node",namespace=~"$namespace",pod=~"$pod"}"#
        );
        // Label names, strings and other metrics' names are left alone.
        assert_eq!(
            f(r#"sum by (up) (kstall_build_info{version="kstall_x"})"#),
            r#"sum by (up) (kstall_build_info{node=~"$node",version="kstall_x"})"#
        );
        assert_eq!(
            f("kstall_incident_active == 1"),
            r#"kstall_incident_active{node=~"$node",namespace=~"$namespace|",pod=~"$pod|"} == 1"#
        );
        assert!(filter("kstall_no_such_metric").is_err());
    }

    #[test]
    fn alert_comparisons_are_read_from_the_rules() {
        let rules = Rules::load(&workspace_root().join(RULES)).unwrap();
        let (_, series, comparison) = rules.compared("KstallMemoryLimitsOvercommitted").unwrap();
        assert_eq!(series, "kstall_node_memory_limit_overcommit_ratio");
        assert!(matches!(comparison, Comparison::Above(v) if v == 1.0));
        let (_, series, comparison) = rules.compared("KstallAgentDown").unwrap();
        assert_eq!((series, matches!(comparison, Comparison::IsZero)), (r#"up{job="kstall"}"#, true));
        assert!(rules.compared("KstallNoSuchAlert").is_err());
    }
}
