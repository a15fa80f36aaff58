//! `kstall explain pod`: everything the agent knows about one pod now, gathered from what it
//! already keeps — the attribution index (cgroups, containers, network namespaces), the stuck
//! tasks, the pod's metric series (resets, RPC errors, OOM kills), the incidents — plus the next
//! step. One thing is read when asked, for a pod a mesh marks: whether its own network
//! namespace's NAT rules send its NFS connections to the mesh's proxy ([`nfs_mesh`]).

use std::collections::BTreeSet;

use serde::{Deserialize, Serialize};

use super::nfs_mesh::{self, NfsThroughMesh};
use crate::{
    attribution::{Attribution, Index},
    incidents::{Incident, State},
    kernel,
    probes::wait::WaitKind,
    state::{AgentState, lock},
    stuck::StuckTask,
};

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct PodExplanation {
    pub namespace: String,
    pub pod: String,
    pub pod_uid: String,
    pub workload: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub qos: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub phase: Option<String>,
    /// (name, runtime id) of each container kstall has seen a cgroup of.
    pub containers: Vec<(String, String)>,
    pub cgroup_ids: Vec<u64>,
    pub netns: Vec<u32>,
    pub stuck_tasks: Vec<StuckTaskNow>,
    /// This pod's event counters: `metric{labels} value`.
    pub activity: Vec<String>,
    pub incidents: Vec<Incident>,
    pub next_step: String,
    /// For a pod a mesh marks: does its network namespace redirect NFS (read from its NAT rules
    /// when asked)? `mesh: []` for a pod no mesh marks; absent from an older agent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nfs_through_mesh: Option<NfsThroughMesh>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StuckTaskNow {
    pub pid: u32,
    pub tid: u32,
    pub comm: String,
    pub wait: String,
    /// `uninterruptible` or `killable` (empty from an agent older than the sampler).
    #[serde(default)]
    pub wait_kind: String,
    /// The probes that reported it, the first first.
    #[serde(default)]
    pub sources: Vec<String>,
    pub blocked_secs: Option<u64>,
    /// When it last ran (as the incidents' evidence says too).
    #[serde(default)]
    pub blocked_since_unix_ns: u64,
    pub stack: Vec<String>,
}

/// What the agent knows of pod `query` (name or UID, in `namespace` when given), or the error
/// naming close matches; for a pod a mesh marks, with its NAT rules read and judged.
pub async fn pod(state: &AgentState, query: &str, namespace: Option<&str>) -> Result<PodExplanation, String> {
    let (mut explanation, check) = known(state, query, namespace)?;
    explanation.nfs_through_mesh = Some(match check {
        Some(check) => nfs_mesh::run(check).await,
        None => NfsThroughMesh::no_mesh(),
    });
    Ok(explanation)
}

/// What the agent holds of the pod, and what the mesh check needs of it (`None`: no mesh).
fn known(
    state: &AgentState,
    query: &str,
    namespace: Option<&str>,
) -> Result<(PodExplanation, Option<nfs_mesh::Check>), String> {
    let index = state.attribution.borrow().clone();
    let pod = find(&index, query, namespace)?;
    let incidents: Vec<_> = lock(&state.incidents)
        .incidents()
        .into_iter()
        .filter(|i| {
            i.pod_uid == pod.pod_uid
                || (!pod.pod.is_empty() && i.pod == pod.pod && i.namespace == pod.namespace)
        })
        .collect();
    let activity = state.metrics.pod_activity(&pod.namespace, &pod.pod);
    let stuck = match pod.pod_uid.as_deref() {
        Some(uid) => lock(&state.stuck).of_pod(uid, kernel::unix_now_ns()),
        None => Vec::new(),
    };
    let stuck_pids: Vec<u32> = stuck.iter().map(|t| t.pid).collect();
    let explanation = explain(&index, pod, stuck, activity, incidents);
    let check = mesh_check(&index, pod, &explanation.netns, stuck_pids, &state.nfs_ports);
    Ok((explanation, check))
}

/// What [`nfs_mesh::check`] needs of a pod a mesh marks, from the index.
pub fn mesh_check(
    index: &Index,
    pod: &Attribution,
    netns: &[u32],
    stuck_pids: Vec<u32>,
    nfs_ports: &[u16],
) -> Option<nfs_mesh::Check> {
    let mesh = pod.mesh.clone()?;
    let uid = pod.pod_uid.as_deref()?;
    let live: Vec<u32> = netns.iter().copied().filter(|n| index.by_netns.contains_key(n)).collect();
    let mut processes: Vec<u32> = live.iter().filter_map(|n| index.netns_witness.get(n).copied()).collect();
    processes.extend(stuck_pids);
    let meta = index.pod_meta.get(uid).map(|(meta, _)| meta);
    Some(nfs_mesh::Check {
        mesh: Some(mesh),
        netns: live,
        processes,
        pod_cgroup: index
            .pod_cgroups
            .iter()
            .find(|(_, a)| a.pod_uid.as_deref() == Some(uid))
            .map(|(dir, _)| dir.clone()),
        ports: nfs_ports.to_vec(),
        pod_ips: meta.map(|m| m.ips.clone()).unwrap_or_default(),
        kubelet_devices: index
            .by_nfs_mount
            .iter()
            .filter(|(_, a)| a.pod_uid.as_deref() == Some(uid))
            .map(|(device, _)| device.clone())
            .collect(),
    })
}

/// The pod `query` (name or UID, in `namespace` when given), or the error naming close matches.
pub fn find<'a>(index: &'a Index, query: &str, namespace: Option<&str>) -> Result<&'a Attribution, String> {
    let known = || index.by_cgroup.values().chain(index.by_netns.values()).filter(|a| a.pod_uid.is_some());
    let wanted = |a: &&std::sync::Arc<Attribution>| {
        (a.pod_uid.as_deref() == Some(query) || a.pod == query)
            && namespace.is_none_or(|ns| a.namespace == ns)
    };
    // A cgroup's attribution names the pod as well as a namespace's, and is there first.
    let hit = known().filter(wanted).max_by_key(|a| a.via == crate::attribution::Via::Cgroup);
    if let Some(a) = hit {
        return Ok(&**a);
    }
    let names: BTreeSet<String> = known()
        .map(|a| {
            if a.pod.is_empty() {
                a.pod_uid.clone().unwrap_or_default()
            } else {
                format!("{}/{}", a.namespace, a.pod)
            }
        })
        .collect();
    let stem = query.split('-').next().unwrap_or(query);
    let close: Vec<&String> =
        names.iter().filter(|n| n.contains(stem) || n.contains(query)).take(5).collect();
    let scope = namespace.map(|ns| format!(" in namespace {ns}")).unwrap_or_default();
    Err(match close.is_empty() {
        true => format!("kstall knows no pod {query:?}{scope} on this node ({} pods known)", names.len()),
        false => format!(
            "kstall knows no pod {query:?}{scope} on this node; close: {}",
            close.iter().map(|s| s.as_str()).collect::<Vec<_>>().join(", ")
        ),
    })
}

pub fn explain(
    index: &Index,
    pod: &Attribution,
    stuck: Vec<StuckTask>,
    activity: Vec<String>,
    incidents: Vec<Incident>,
) -> PodExplanation {
    let uid = pod.pod_uid.clone().unwrap_or_default();
    let mine = |a: &Attribution| a.pod_uid.as_deref() == Some(uid.as_str());
    let mut containers: BTreeSet<(String, String)> = BTreeSet::new();
    let mut cgroup_ids: Vec<u64> = Vec::new();
    for (id, a) in index.by_cgroup.iter().filter(|(_, a)| mine(a)) {
        cgroup_ids.push(*id);
        if let Some(cid) = &a.container_id {
            containers.insert((a.container.clone(), cid.clone()));
        }
    }
    cgroup_ids.sort_unstable();
    let mut netns: Vec<u32> = index
        .by_netns
        .iter()
        .chain(index.departed_netns.iter())
        .filter(|(_, a)| mine(a))
        .map(|(n, _)| *n)
        .collect();
    netns.sort_unstable();
    netns.dedup();
    let stuck_tasks: Vec<StuckTaskNow> = stuck
        .into_iter()
        .map(|task| StuckTaskNow {
            pid: task.pid,
            tid: task.tid,
            comm: task.comm,
            wait: task.wait.as_str().to_string(),
            wait_kind: task.wait_kind.as_str().to_string(),
            sources: task.sources.iter().map(|s| s.to_string()).collect(),
            blocked_secs: Some(task.blocked_secs),
            blocked_since_unix_ns: task.blocked_since_unix_ns,
            stack: task.stack.to_vec(),
        })
        .collect();
    let firing: Vec<&Incident> = incidents.iter().filter(|i| i.state == State::Firing).collect();
    let next_step = match (firing.first(), stuck_tasks.first()) {
        (Some(i), _) => format!(
            "{} incident(s) firing; start with {} ({}): kstall incidents. {}",
            firing.len(),
            i.id,
            i.signature,
            i.remediation.permanent.first().cloned().unwrap_or_default()
        ),
        (None, Some(t)) if t.wait_kind == WaitKind::Killable.as_str() => format!(
            "Task {} (pid {} tid {}) is stuck in {} (a killable sleep): read its stack below; SIGKILL ends \
             it, but what it waits for stays stuck for the next task.",
            t.comm, t.pid, t.tid, t.wait
        ),
        (None, Some(t)) => format!(
            "Task {} (pid {} tid {}) is stuck in {}: read its stack below; it cannot be killed, only unblocked.",
            t.comm, t.pid, t.tid, t.wait
        ),
        (None, None) => "Nothing kstall sees is holding this pod.".to_string(),
    };
    PodExplanation {
        namespace: pod.namespace.clone(),
        pod: pod.pod.clone(),
        pod_uid: uid,
        workload: pod.workload.clone(),
        qos: pod.qos.map(|q| {
            serde_json::to_value(q).ok().and_then(|v| v.as_str().map(String::from)).unwrap_or_default()
        }),
        phase: pod.pod_phase.map(|p| {
            serde_json::to_value(p).ok().and_then(|v| v.as_str().map(String::from)).unwrap_or_default()
        }),
        containers: containers.into_iter().collect(),
        cgroup_ids,
        netns,
        stuck_tasks,
        activity,
        incidents,
        next_step,
        nfs_through_mesh: None,
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::attribution::Via;

    fn index() -> Index {
        let container = Arc::new(Attribution {
            namespace: "shop".into(),
            pod: "web-1".into(),
            container: "app".into(),
            pod_uid: Some("u-1".into()),
            container_id: Some("c1".into()),
            via: Via::Cgroup,
            ..Default::default()
        });
        let netns = Arc::new(Attribution {
            container: String::new(),
            container_id: None,
            via: Via::Netns,
            ..(*container).clone()
        });
        let mut index = Index::default();
        index.by_cgroup.insert(10, container.clone());
        index.by_cgroup.insert(
            11,
            Arc::new(Attribution { container_id: None, container: String::new(), ..(*container).clone() }),
        );
        index.by_netns.insert(4026532999, netns);
        index
    }

    #[test]
    fn finds_by_name_or_uid_and_suggests_close_names() {
        let index = index();
        assert_eq!(find(&index, "web-1", None).unwrap().pod_uid.as_deref(), Some("u-1"));
        assert_eq!(find(&index, "u-1", None).unwrap().pod, "web-1");
        assert!(find(&index, "web-1", Some("other")).is_err());
        let e = find(&index, "web-2", None).unwrap_err();
        assert!(e.contains("close: shop/web-1"), "{e}");
        let e = find(&index, "db-0", None).unwrap_err();
        assert!(e.ends_with("(1 pods known)"), "{e}");
    }

    #[test]
    fn gathers_what_is_known() {
        let index = index();
        let pod = find(&index, "web-1", None).unwrap();
        let x = explain(&index, pod, vec![], vec!["kstall_tcp_resets_total{...} 3".into()], vec![]);
        assert_eq!(x.containers, [("app".to_string(), "c1".to_string())]);
        assert_eq!((x.cgroup_ids.as_slice(), x.netns.as_slice()), (&[10, 11][..], &[4026532999][..]));
        assert_eq!(x.next_step, "Nothing kstall sees is holding this pod.");
    }
}
