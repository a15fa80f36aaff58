//! `--capture-on`: when an incident of a listed signature fires, a capture of its pod starts at
//! once — the redirect and the failing server keep retrying, so the case is still on the wire —
//! filtered to the peers and ports its evidence names. What happened (started, joined to the
//! pod's running capture, skipped and why) becomes the incident's `capture` evidence entry.

use std::{collections::BTreeSet, path::PathBuf, sync::Arc};

use super::{service::Captures, target};
use crate::{
    attribution::Index,
    incidents::{Incident, engine::CAPTURE, evaluator::Trigger},
};

pub struct OnIncident {
    captures: Arc<Captures>,
    proc: PathBuf,
}

impl OnIncident {
    /// The trigger, when the settings name signatures to capture on.
    pub fn new(captures: Arc<Captures>) -> Option<Self> {
        (!captures.settings().on.is_empty()).then(|| OnIncident { captures, proc: PathBuf::from("/proc") })
    }
}

impl Trigger for OnIncident {
    fn fired(&mut self, incident: &Incident, index: &Index) -> Option<(&'static str, serde_json::Value)> {
        if !self.captures.settings().on.contains(&incident.signature.as_str()) {
            return None;
        }
        let skipped = |why: String| Some((CAPTURE, serde_json::json!({ "skipped": why })));
        let Some(uid) = incident.pod_uid.as_deref() else {
            return skipped("the incident names no pod (a node-wide incident)".into());
        };
        let Some(pod) = target::known_pod(index, uid) else {
            return skipped(format!("kstall no longer knows pod {uid}"));
        };
        let target = match target::of_pod(index, pod, &self.proc) {
            Ok(target) => target,
            Err(why) => return skipped(why),
        };
        let filter = default_filter(&incident.evidence);
        let entry = self.captures.start_triggered(target, &incident.id, &incident.signature, filter);
        Some((CAPTURE, entry))
    }
}

/// The peers and ports an incident's evidence names, as a filter in libpcap's language: hosts
/// from `server`, `servers` and `peer`; ports from `nfs_port`, `nfs_ports`, `redirect_ports`,
/// `proxy_port` and `port`. `None` (every packet of the pod, headers only) when it names none.
pub fn default_filter(evidence: &serde_json::Value) -> Option<String> {
    let mut hosts = BTreeSet::new();
    let mut ports = BTreeSet::new();
    for key in ["server", "servers", "peer"] {
        for value in one_or_many(&evidence[key]) {
            if let Some(ip) = value.as_str().and_then(|s| s.parse::<std::net::IpAddr>().ok()) {
                hosts.insert(ip);
            }
        }
    }
    for key in ["nfs_port", "nfs_ports", "redirect_ports", "proxy_port", "port"] {
        for value in one_or_many(&evidence[key]) {
            if let Some(port) = value.as_u64().and_then(|p| u16::try_from(p).ok()).filter(|p| *p > 0) {
                ports.insert(port);
            }
        }
    }
    let terms: Vec<String> =
        hosts.iter().map(|h| format!("host {h}")).chain(ports.iter().map(|p| format!("port {p}"))).collect();
    (!terms.is_empty()).then(|| format!("tcp and ({})", terms.join(" or ")))
}

fn one_or_many(value: &serde_json::Value) -> Vec<&serde_json::Value> {
    match value {
        serde_json::Value::Array(values) => values.iter().collect(),
        serde_json::Value::Null => Vec::new(),
        one => vec![one],
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn the_filter_names_the_incidents_peers_and_ports() {
        // The sidecar redirect's evidence (nfs_sidecar_redirect.rs): server, its NFS ports, the
        // proxy's port.
        let redirect = json!({
            "netns": 4026532999u64, "server": "10.55.0.1", "nfs_port": 2049, "nfs_ports": [111, 2049],
            "redirect_ports": [15001], "proxy_port": 15001, "resets_total": 12, "stuck_tasks": [],
        });
        assert_eq!(
            default_filter(&redirect).as_deref(),
            Some("tcp and (host 10.55.0.1 or port 111 or port 2049 or port 15001)")
        );
        // An IPv6 server; no ports.
        let unreachable = json!({"server": "fd00::5", "nfs_timeouts": 3, "errors_by_pod": {}});
        assert_eq!(default_filter(&unreachable).as_deref(), Some("tcp and (host fd00::5)"));
        // Nothing to go on (a pod that cannot terminate): every packet, headers only.
        assert_eq!(default_filter(&json!({"stuck_tasks": [{"tid": 10}]})), None);
        // A server of null (the redirect before its first reply) and garbage are ignored.
        assert_eq!(default_filter(&json!({"server": null, "port": "x", "nfs_port": 70000})), None);
    }
}
