//! The socket's capture requests (`kstall capture`): the pod named is found in the attribution
//! index ([`explain::find`]), its network namespace opened through one of its processes
//! (`enter::open_netns`), and the capture handed to `capture::service`, which runs it on a thread
//! of its own. A wait polls; nothing here blocks the runtime for longer than a `/proc` read.

use std::{os::unix::fs::MetadataExt as _, path::Path, time::Duration};

use serde::{Deserialize, Serialize};

use super::explain;
use crate::{
    attribution::{Index, cgroup},
    capture::{
        runner::Target,
        service::{self, Info},
    },
    enter,
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

/// What is captured of pod `query` (name or UID, in `namespace` when given): its network
/// namespace opened, its processes (the namespace's witness, and every process of the pod's
/// cgroup), its metadata; or the one line saying why not.
pub fn target(index: &Index, query: &str, namespace: Option<&str>, proc: &Path) -> Result<Target, String> {
    let pod = explain::find(index, query, namespace)?;
    let label = format!("{}/{}", pod.namespace, pod.pod);
    let uid = pod.pod_uid.as_deref();
    let mut netns: Vec<u32> = index
        .by_netns
        .iter()
        .filter(|(_, a)| uid.is_some() && a.pod_uid.as_deref() == uid && !a.host)
        .map(|(n, _)| *n)
        .collect();
    netns.sort_unstable();
    if netns.is_empty() {
        return Err(match pod.host_network {
            true => format!(
                "pod {label} shares the node's network namespace (hostNetwork): capture it with --netns host and a --filter"
            ),
            false => {
                format!("pod {label}: kstall knows no network namespace of it on this node (is it running?)")
            }
        });
    }
    let mut pids: Vec<u32> = netns.iter().filter_map(|n| index.netns_witness.get(n).copied()).collect();
    if let Some((dir, _)) = index.pod_cgroups.iter().find(|(_, a)| a.pod_uid.as_deref() == uid) {
        pids.extend(pod_processes(dir));
    }
    let mut seen = std::collections::HashSet::new();
    pids.retain(|p| seen.insert(*p));
    let (file, _) = enter::open_netns(&netns, &pids, proc).ok_or_else(|| {
        format!("pod {label}: none of its processes leads to its network namespace any more (is it running?)")
    })?;
    let inode = file.metadata().map(|m| m.ino()).map_err(|e| format!("pod {label}: its namespace: {e}"))?;
    let ips = uid
        .and_then(|uid| index.pod_meta.get(uid))
        .map(|(meta, _)| meta.ips.iter().map(|ip| ip.to_string()).collect())
        .unwrap_or_default();
    Ok(Target {
        netns: file,
        pod: service::pod(&pod.namespace, &pod.pod, uid, &pod.workload, inode, ips),
        pids,
        label: format!("pod {label}"),
    })
}

/// The processes of a pod's cgroup and of its containers' (one level down), by their
/// `cgroup.procs`.
fn pod_processes(pod_cgroup: &Path) -> Vec<u32> {
    let mut pids = cgroup::procs(pod_cgroup);
    if let Ok(entries) = std::fs::read_dir(pod_cgroup) {
        for entry in entries.flatten().filter(|e| e.file_type().is_ok_and(|t| t.is_dir())).take(64) {
            pids.extend(cgroup::procs(&entry.path()));
        }
    }
    pids
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::attribution::Attribution;

    #[test]
    fn a_host_network_pod_is_refused_naming_the_way_to_capture_it() {
        let mut index = Index::default();
        let web = Attribution {
            namespace: "shop".into(),
            pod: "web-1".into(),
            pod_uid: Some("u-1".into()),
            host_network: true,
            ..Default::default()
        };
        index.by_cgroup.insert(10, Arc::new(web));
        index
            .by_netns
            .insert(1, Arc::new(Attribution { host: true, host_network: true, ..Default::default() }));
        let e = target(&index, "web-1", None, Path::new("/proc")).err().unwrap();
        assert_eq!(
            e,
            "pod shop/web-1 shares the node's network namespace (hostNetwork): capture it with --netns host and a --filter"
        );
        let e = target(&index, "web-2", None, Path::new("/proc")).err().unwrap();
        assert!(e.starts_with("kstall knows no pod \"web-2\""), "{e}");
    }
}
