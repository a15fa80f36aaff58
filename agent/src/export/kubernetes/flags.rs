//! The Kubernetes writers' settings as users give them: one declaration each, at once the flag,
//! the `KSTALL_*` variable and the file's key (`config.rs` merges the layers).

use super::{conditions::Condition, taints::Holds};
use crate::setting::{Invalid, duration, on_off};

#[derive(Debug, Default, clap::Args, serde::Serialize, serde::Deserialize)]
#[serde(default)]
// A group id of its own: clap names a flattened struct's group after the type.
#[group(id = "kubernetes_settings")]
pub struct Flags {
    /// Post each incident as a Kubernetes Event on its pod (node-wide ones on the Node): on or
    /// off [default: on with the Kubernetes API pod source, else off].
    #[arg(long, env = "KSTALL_KUBERNETES_EVENTS", value_name = "on|off")]
    pub kubernetes_events: Option<String>,
    /// Node conditions kstall keeps on its Node (True while their incident fires): any of
    /// NFSClientStalled, KernelSystemOOM, KubeletDegraded, CPUSoftLockup, ConntrackTableFull, comma-separated, or none [default:
    /// none]. Needs the API pod source and patch on nodes/status.
    #[arg(long, env = "KSTALL_NODE_CONDITIONS", value_name = "LIST", value_delimiter = ',')]
    pub node_conditions: Option<Vec<String>>,
    /// NoSchedule taints kstall keeps on its Node while a node-wide signature fires (the same
    /// names as --node-conditions; the keys kstall.io/nfs-client-stalled, ...), comma-separated,
    /// or none [default: none]. Needs the API pod source and patch on nodes.
    #[arg(long, env = "KSTALL_NODE_TAINTS", value_name = "LIST", value_delimiter = ',')]
    pub node_taints: Option<Vec<String>>,
    /// How long a signature must fire without a break before its taint is added [default: 2m].
    #[arg(long, env = "KSTALL_NODE_TAINT_AFTER", value_name = "DURATION")]
    pub node_taint_after: Option<String>,
    /// How long it must stay quiet before its taint is removed [default: 5m].
    #[arg(long, env = "KSTALL_NODE_TAINT_CLEAR_AFTER", value_name = "DURATION")]
    pub node_taint_clear_after: Option<String>,
}

/// What kstall writes to the Kubernetes API.
#[derive(Debug, Clone, PartialEq)]
pub struct Settings {
    /// Incidents become Kubernetes Events.
    pub events: bool,
    /// The node conditions kstall keeps.
    pub node_conditions: Vec<Condition>,
    /// The taints kstall keeps, and when they come and go.
    pub node_taints: Vec<Condition>,
    pub taint_holds: Holds,
}

const NEEDS_API: &str = "needs the Kubernetes API pod source (--pod-metadata api, or a kubeconfig)";

impl Flags {
    /// The settings, given whether pods come from the API (`api`): both writers need it, and
    /// Events are on by default with it.
    pub fn settings(self, api: bool) -> Result<Settings, Invalid> {
        let events = match on_off("kubernetes_events", self.kubernetes_events)? {
            Some(true) if !api => return Err(("kubernetes_events", NEEDS_API.into())),
            Some(on) => on,
            None => api,
        };
        let node_conditions =
            node_conditions_of("node_conditions", self.node_conditions.unwrap_or_default())?;
        if !node_conditions.is_empty() && !api {
            return Err(("node_conditions", NEEDS_API.into()));
        }
        let node_taints = node_conditions_of("node_taints", self.node_taints.unwrap_or_default())?;
        if !node_taints.is_empty() && !api {
            return Err(("node_taints", NEEDS_API.into()));
        }
        let mut taint_holds = Holds::default();
        if let Some(text) = self.node_taint_after {
            taint_holds.add_after = duration("node_taint_after", &text)?;
        }
        if let Some(text) = self.node_taint_clear_after {
            taint_holds.remove_after = duration("node_taint_clear_after", &text)?;
        }
        Ok(Settings { events, node_conditions, node_taints, taint_holds })
    }
}

/// `NFSClientStalled,KubeletDegraded`, or `none`, for the setting `key`.
fn node_conditions_of(key: &'static str, names: Vec<String>) -> Result<Vec<Condition>, Invalid> {
    let mut conditions = Vec::new();
    for name in names.iter().map(|n| n.trim()).filter(|n| !n.is_empty() && *n != "none") {
        let condition = Condition::parse(name).ok_or_else(|| {
            let known: Vec<&str> = Condition::ALL.iter().map(|c| c.type_name()).collect();
            (key, format!("{name:?} is not one of {}, none", known.join(", ")))
        })?;
        if !conditions.contains(&condition) {
            conditions.push(condition);
        }
    }
    Ok(conditions)
}
