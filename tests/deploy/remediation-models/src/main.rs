//! Validates other projects' objects offline, for tests/tests/deploy.rs, as tests/deploy/validate.py
//! does Kubernetes' and the Prometheus Operator's: reads a JSON list of `{"source", "object"}` on
//! stdin, prints `ok` or `FAIL` with the reason per object, exits 1 when any failed.
//!
//! - `remediation.medik8s.io/v1alpha1 NodeHealthCheck`: medik8s's bindings generated from the
//!   operator's CRD (types and required fields). They ignore unknown fields, so the object must
//!   also come back from them unchanged.
//! - `descheduler/v1alpha2 DeschedulerPolicy` (a config file, no CRD, no published schema): the
//!   descheduler's v1alpha2 types and RemovePodsViolatingNodeTaints' arguments as its Go source
//!   declares them, unknown fields refused, and the plugin's own validation rule.
//! - Any other kind fails: no schema, no pass.

use std::io::Read as _;

use kcr_remediation_medik8s_io::v1alpha1::nodehealthchecks::NodeHealthCheck;
use serde_json::Value;

fn main() {
    let mut input = String::new();
    std::io::stdin().read_to_string(&mut input).expect("stdin");
    let objects: Vec<Value> = serde_json::from_str(&input).expect("a JSON list of {source, object}");
    let mut failed = false;
    for entry in &objects {
        let object = &entry["object"];
        let name = format!(
            "{} {} {}",
            entry["source"].as_str().unwrap_or("?"),
            object["kind"].as_str().unwrap_or("?"),
            object["metadata"]["name"].as_str().unwrap_or("")
        );
        match validate(object) {
            Ok(by) => println!("ok {name}: {by}"),
            Err(why) => {
                failed = true;
                println!("FAIL {name}: {why}");
            }
        }
    }
    std::process::exit(i32::from(failed));
}

fn validate(object: &Value) -> Result<&'static str, String> {
    match (object["apiVersion"].as_str(), object["kind"].as_str()) {
        (Some("remediation.medik8s.io/v1alpha1"), Some("NodeHealthCheck")) => {
            let typed: NodeHealthCheck = serde_json::from_value(object.clone()).map_err(|e| e.to_string())?;
            let kept = serde_json::to_value(&typed).map_err(|e| e.to_string())?;
            let changed = changes("", object, &kept);
            if !changed.is_empty() {
                return Err(changed.join("; "));
            }
            Ok("medik8s's CRD bindings (kcr_remediation_medik8s_io)")
        }
        (Some("descheduler/v1alpha2"), Some("DeschedulerPolicy")) => {
            let policy: descheduler::Policy =
                serde_json::from_value(object.clone()).map_err(|e| e.to_string())?;
            policy.validate()?;
            Ok("the descheduler's v1alpha2 types")
        }
        (api_version, kind) => Err(format!("no schema for {api_version:?} {kind:?}")),
    }
}

/// Where `kept` (the object as the bindings gave it back) differs from `given`.
fn changes(path: &str, given: &Value, kept: &Value) -> Vec<String> {
    match (given, kept) {
        (Value::Object(given), Value::Object(kept)) => given
            .iter()
            .flat_map(|(key, value)| match kept.get(key) {
                None => vec![format!("{path}.{key}: unknown field")],
                Some(k) => changes(&format!("{path}.{key}"), value, k),
            })
            .collect(),
        (Value::Array(given), Value::Array(kept)) if given.len() == kept.len() => given
            .iter()
            .zip(kept)
            .enumerate()
            .flat_map(|(i, (g, k))| changes(&format!("{path}[{i}]"), g, k))
            .collect(),
        _ if given == kept => vec![],
        _ => vec![format!("{path}: {given} became {kept}")],
    }
}

/// The descheduler's policy file, v1alpha2 (sigs.k8s.io/descheduler pkg/api/v1alpha2), as far as
/// a policy of RemovePodsViolatingNodeTaints uses it. Fields only accepted, never read, are here so
/// that serde refuses every other one.
mod descheduler {
    use serde::{Deserialize, de::IgnoredAny};
    use serde_json::Value;

    #[derive(Deserialize)]
    #[serde(deny_unknown_fields, rename_all = "camelCase")]
    #[expect(dead_code, reason = "fields accepted, not read")]
    pub struct Policy {
        api_version: String,
        kind: String,
        profiles: Vec<Profile>,
        node_selector: Option<String>,
        max_no_of_pods_to_evict_per_node: Option<u32>,
        max_no_of_pods_to_evict_per_namespace: Option<u32>,
        max_no_of_pods_to_evict_total: Option<u32>,
        eviction_failure_event_notification: Option<bool>,
        metrics_collector: Option<IgnoredAny>,
        metrics_providers: Option<IgnoredAny>,
        grace_period_seconds: Option<i64>,
    }

    #[derive(Deserialize)]
    #[serde(deny_unknown_fields, rename_all = "camelCase")]
    struct Profile {
        name: String,
        plugin_config: Vec<PluginConfig>,
        plugins: Plugins,
    }

    #[derive(Deserialize)]
    #[serde(deny_unknown_fields)]
    struct PluginConfig {
        name: String,
        args: Value,
    }

    /// The extension points, by their (lower-case) names in the file.
    #[derive(Deserialize, Default)]
    #[serde(deny_unknown_fields, default)]
    struct Plugins {
        presort: PluginSet,
        sort: PluginSet,
        deschedule: PluginSet,
        balance: PluginSet,
        filter: PluginSet,
        preevictionfilter: PluginSet,
    }

    #[derive(Deserialize, Default)]
    #[serde(deny_unknown_fields, default)]
    struct PluginSet {
        enabled: Vec<String>,
        disabled: Vec<String>,
    }

    /// RemovePodsViolatingNodeTaints' arguments.
    #[derive(Deserialize)]
    #[serde(deny_unknown_fields, rename_all = "camelCase")]
    #[expect(dead_code, reason = "fields accepted, not read")]
    struct NodeTaintsArgs {
        namespaces: Option<Namespaces>,
        label_selector: Option<IgnoredAny>,
        include_prefer_no_schedule: Option<bool>,
        #[serde(default)]
        excluded_taints: Vec<String>,
        #[serde(default)]
        included_taints: Vec<String>,
    }

    #[derive(Deserialize)]
    #[serde(deny_unknown_fields)]
    #[expect(dead_code, reason = "fields accepted, not read")]
    struct Namespaces {
        include: Option<Vec<String>>,
        exclude: Option<Vec<String>>,
    }

    const NODE_TAINTS: &str = "RemovePodsViolatingNodeTaints";

    impl Policy {
        /// What the descheduler checks beyond the types: the plugin's own rule, and that it is
        /// enabled where it runs (a deschedule plugin) and nowhere else.
        pub fn validate(&self) -> Result<(), String> {
            for profile in &self.profiles {
                let p = &profile.name;
                for config in &profile.plugin_config {
                    if config.name != NODE_TAINTS {
                        return Err(format!("profile {p}: no model of plugin {}'s arguments", config.name));
                    }
                    let args: NodeTaintsArgs = serde_json::from_value(config.args.clone())
                        .map_err(|e| format!("profile {p}: {e}"))?;
                    if !args.included_taints.is_empty() && !args.excluded_taints.is_empty() {
                        return Err(format!(
                            "profile {p}: either includedTaints or excludedTaints, not both"
                        ));
                    }
                }
                let plugins = &profile.plugins;
                for (point, set) in [
                    ("presort", &plugins.presort),
                    ("sort", &plugins.sort),
                    ("balance", &plugins.balance),
                    ("filter", &plugins.filter),
                    ("preevictionfilter", &plugins.preevictionfilter),
                ] {
                    if set.enabled.iter().any(|n| n == NODE_TAINTS) {
                        return Err(format!(
                            "profile {p}: {NODE_TAINTS} is a deschedule plugin, not {point}"
                        ));
                    }
                }
                if !plugins.deschedule.enabled.iter().any(|n| n == NODE_TAINTS) {
                    return Err(format!("profile {p}: {NODE_TAINTS} configured but not enabled"));
                }
            }
            Ok(())
        }
    }
}
