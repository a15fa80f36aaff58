//! The socket's capture requests (`kstall capture`): the pod named is found in the attribution
//! index ([`explain::find`]), its network namespace opened (`capture::target`), and the capture
//! handed to `capture::service`, which runs it on a thread of its own. A wait polls; nothing here
//! blocks the runtime for longer than a `/proc` read.

use std::{path::Path, time::Duration};

use serde::{Deserialize, Serialize};

use std::sync::{Arc, Mutex};

use super::explain;
use crate::{
    attribution::Index,
    capture::{
        self,
        service::{About, Ask, Captures, Info},
    },
    incidents::engine::{CAPTURE, Engine},
};

/// `{"capture": …}`: one capture.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct CaptureReply {
    pub capture: Info,
}

/// `{"captures": [...]}`: the bundles kept, the failed captures, the running ones.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct CapturesReply {
    pub captures: Vec<Info>,
}

/// How often a wait looks again.
pub const POLL: Duration = Duration::from_millis(250);

/// What `kstall capture start` names.
pub enum What {
    /// By name or UID, in `namespace` when given.
    Pod { pod: String, namespace: Option<String> },
    /// An inode, or `host`.
    Netns(String),
    /// An incident's id: its pod, filtered to its peers and ports.
    Incident(String),
}

pub const SAY_WHAT: &str = "say what to capture: a pod (--pod), a network namespace (--netns) or an incident (--incident), one of them";

/// Starts the capture `what` names: its target found in the index (an incident's pod through the
/// engine), the capture handed to the service; or the one line saying why not.
pub fn start(
    service: &Arc<Captures>,
    index: &Index,
    engine: &Mutex<Engine>,
    what: What,
    ask: &Ask,
    proc: &Path,
) -> Result<Info, String> {
    match what {
        What::Pod { pod, namespace } => {
            let target =
                capture::target::of_pod(index, explain::find(index, &pod, namespace.as_deref())?, proc)?;
            service.start(target, ask, None)
        }
        What::Netns(netns) => service.start(capture::target::of_netns(index, &netns, proc)?, ask, None),
        What::Incident(id) => {
            let incident = lock(engine).incidents().into_iter().find(|i| i.id == id).ok_or_else(|| {
                format!("no incident {id:?} on this node (kstall incidents --all lists them)")
            })?;
            let uid = incident.pod_uid.as_deref().ok_or_else(|| {
                format!(
                    "incident {id} is node-wide (no pod): capture the node with --netns host and a --filter"
                )
            })?;
            let pod = capture::target::known_pod(index, uid)
                .ok_or_else(|| format!("incident {id}: kstall no longer knows its pod {uid}"))?;
            let target = capture::target::of_pod(index, pod, proc)?;
            let about = About {
                id: incident.id.clone(),
                signature: incident.signature.clone(),
                filter: capture::trigger::default_filter(&incident.evidence),
            };
            let info = service.start(target, ask, Some(&about))?;
            // The incident's evidence follows it from now, as a triggered capture's does.
            lock(engine).annotate(&incident.id, CAPTURE, service.capturing(&info));
            Ok(info)
        }
    }
}

fn lock(engine: &Mutex<Engine>) -> std::sync::MutexGuard<'_, Engine> {
    engine.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unknown_pod_is_refused_naming_what_is_known() {
        let e = explain::find(&Index::default(), "web-2", None).err().unwrap();
        assert_eq!(e, "kstall knows no pod \"web-2\" on this node (0 pods known)");
    }
}
