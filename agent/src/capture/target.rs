//! What a capture of a pod opens: its network namespace (through one of its processes), its
//! processes (whose NFS mounts and stuck tasks the bundle reads) and its metadata, from the
//! attribution index. The socket's `kstall capture start --pod` and an incident's trigger both
//! come here; nothing here blocks for longer than a `/proc` read.

use std::{os::unix::fs::MetadataExt as _, path::Path};

use super::{runner::Target, service};
use crate::{
    attribution::{Attribution, Index, cgroup},
    enter,
};

/// The pod of `pod_uid` as the index knows it (a cgroup's attribution first: it names the
/// container too).
pub fn known_pod<'a>(index: &'a Index, pod_uid: &str) -> Option<&'a Attribution> {
    index
        .by_cgroup
        .values()
        .chain(index.by_netns.values())
        .filter(|a| a.pod_uid.as_deref() == Some(pod_uid))
        .max_by_key(|a| a.via == crate::attribution::Via::Cgroup)
        .map(|a| &**a)
}

/// What is captured of `pod`: its network namespace opened, its processes (the namespace's
/// witness, and every process of the pod's cgroup), its metadata; or the one line saying why not.
pub fn of_pod(index: &Index, pod: &Attribution, proc: &Path) -> Result<Target, String> {
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

/// What is captured of a network namespace named by `what`: `host`, the node's (as the attribution
/// index knows it: pid 1's, or the agent's own), or an inode. A pod's namespace is captured as its
/// pod (with its metadata); any other through one of its processes, found in `/proc` by their
/// `ns/net` links.
pub fn of_netns(index: &Index, what: &str, proc: &Path) -> Result<Target, String> {
    let host = index.by_netns.iter().find(|(_, a)| a.host).map(|(n, _)| *n);
    let inode = match what {
        "host" => host
            .map(u64::from)
            .ok_or_else(|| "--netns host: kstall does not know the node's network namespace".to_string())?,
        _ => what.parse::<u64>().map_err(|_| {
            format!("--netns {what}: a network namespace's inode (kstall explain pod shows a pod's) or host")
        })?,
    };
    let key =
        u32::try_from(inode).map_err(|_| format!("--netns {what}: no network namespace has that inode"))?;
    if let Some(pod) = index.by_netns.get(&key).filter(|a| a.pod_uid.is_some() && !a.host) {
        return of_pod(index, pod, proc);
    }
    let node = host == Some(key);
    let label = if node { format!("netns {inode} (the node's)") } else { format!("netns {inode}") };
    // The index's witness for the node's: a scan of every process would open thousands of links.
    let pids = match index.netns_witness.get(&key) {
        Some(&witness) if node => vec![witness],
        _ => super::processes_in(proc, inode, &[]),
    };
    let (file, _) = enter::open_netns(&[key], &pids, proc)
        .ok_or_else(|| format!("--netns {what}: no process of this node is in network namespace {inode}"))?;
    Ok(Target {
        netns: file,
        pod: crate::capture::bundle::Pod { netns: inode, ..Default::default() },
        pids: if node { Vec::new() } else { pids },
        label,
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
        let pod = known_pod(&index, "u-1").expect("known by its uid");
        let e = of_pod(&index, pod, Path::new("/proc")).err().unwrap();
        assert_eq!(
            e,
            "pod shop/web-1 shares the node's network namespace (hostNetwork): capture it with --netns host and a --filter"
        );
        assert!(known_pod(&index, "u-2").is_none());
    }

    #[test]
    fn a_network_namespace_is_an_inode_or_host_and_one_no_process_is_in_is_refused() {
        let index = Index::default();
        let proc = tempfile::tempdir().unwrap();
        let refused = |what: &str| of_netns(&index, what, proc.path()).err().unwrap();
        assert_eq!(
            refused("web"),
            "--netns web: a network namespace's inode (kstall explain pod shows a pod's) or host"
        );
        assert_eq!(refused("host"), "--netns host: kstall does not know the node's network namespace");
        assert_eq!(refused("99999999999"), "--netns 99999999999: no network namespace has that inode");
        assert_eq!(
            refused("4026532999"),
            "--netns 4026532999: no process of this node is in network namespace 4026532999"
        );
    }
}
