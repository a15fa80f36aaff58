//! What a trace client asks for: the agent filters before sending, so a capture of one pod's
//! resets on a busy node costs the socket only those.

use serde::{Deserialize, Serialize};

use crate::{
    attribution::{Attributed, Attribution},
    probes::FilterFields,
};

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TraceFilter {
    /// Probe names (`tcp-reset`, `hung-task`, `oom`, `nfs`); empty: all.
    pub probes: Vec<String>,
    pub namespace: Option<String>,
    /// A pod's name or UID.
    pub pod: Option<String>,
    /// A container's name or runtime id.
    pub container: Option<String>,
    /// A process or thread id.
    pub pid: Option<u32>,
    /// Any port of a reset (local, remote, original destination) or an NFS server's port.
    pub port: Option<u16>,
    /// An NFS server's address (also a reset's remote or original destination address).
    pub server: Option<String>,
}

impl TraceFilter {
    pub fn matches(&self, attributed: &Attributed) -> bool {
        let (event, who) = (&attributed.event, &*attributed.who);
        if !self.probes.is_empty() && !self.probes.iter().any(|p| p == event.header.probe) {
            return false;
        }
        let field = |get: fn(&Attribution) -> Vec<&str>, want: &Option<String>| match want {
            None => true,
            Some(want) => get(who).iter().any(|v| !v.is_empty() && v == want),
        };
        if !field(|a| vec![&a.namespace], &self.namespace)
            || !field(|a| vec![&a.pod, a.pod_uid.as_deref().unwrap_or("")], &self.pod)
            || !field(|a| vec![&a.container, a.container_id.as_deref().unwrap_or("")], &self.container)
        {
            return false;
        }
        if let Some(pid) = self.pid
            && event.header.tgid != pid
            && event.header.pid != pid
        {
            return false;
        }
        let FilterFields { ports, addrs } = event.payload.data().filter_fields();
        if self.port.is_some_and(|p| !ports.contains(&p)) {
            return false;
        }
        if self.server.as_ref().is_some_and(|s| !addrs.contains(s)) {
            return false;
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::{decode::bytes_of, events::Decoder, probes::tcp_reset::tests::redirected_syn_reset};

    fn reset() -> Attributed {
        let event = Decoder::default().decode(&bytes_of(&redirected_syn_reset())).unwrap();
        let who = Arc::new(Attribution {
            namespace: "shop".into(),
            pod: "web-1".into(),
            pod_uid: Some("u-1".into()),
            ..Default::default()
        });
        Attributed { event, who }
    }

    fn filter(json: &str) -> TraceFilter {
        serde_json::from_str(json).unwrap()
    }

    #[test]
    fn each_field_filters() {
        let e = reset();
        for yes in [
            "{}",
            r#"{"probes": ["tcp-reset"]}"#,
            r#"{"namespace": "shop", "pod": "web-1"}"#,
            r#"{"pod": "u-1"}"#,
            r#"{"port": 2049}"#,
            r#"{"port": 15001}"#,
        ] {
            assert!(filter(yes).matches(&e), "{yes}");
        }
        for no in [
            r#"{"probes": ["oom"]}"#,
            r#"{"namespace": "other"}"#,
            r#"{"pod": "web-2"}"#,
            r#"{"container": "app"}"#,
            r#"{"port": 443}"#,
            r#"{"pid": 999999}"#,
            r#"{"server": "10.9.9.9"}"#,
        ] {
            assert!(!filter(no).matches(&e), "{no}");
        }
    }

    #[test]
    fn unknown_fields_are_refused() {
        assert!(serde_json::from_str::<TraceFilter>(r#"{"pods": "x"}"#).is_err());
    }
}
