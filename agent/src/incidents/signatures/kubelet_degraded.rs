//! `kubelet-degraded` (incident 4): a kubelet that still heartbeats but no longer does its job.
//! There, two CronJobs with a broken image piled 360+ `ImagePullBackOff` pods onto one node; its
//! kubelet sent Ready heartbeats but terminated no pod, and `:10250` timed out in TLS handshakes.
//! Mostly not a kernel signal: the evidence is the pods the agent already watches (the pile, by
//! owner; the pods past their deletion deadline), the kubelet's `healthz` and TLS handshake
//! ([`crate::kubelet`]), and kubelet or container-runtime tasks in the stuck-task set.
//!
//! Fires when a check fails for `kubelet_unhealthy_after`, a kubelet or runtime task is stuck,
//! the pile reaches `kubelet_image_pull_pods`, or `kubelet_stuck_terminating_pods` pods are
//! `kubelet_termination_overdue` past their deadline. Critical unless the pile alone fired it:
//! a pile is what comes before, a kubelet that cannot terminate pods is the incident.
//!
//! What healthy traffic looks like to it, and why none of it fires: a kubelet restart fails its
//! checks for seconds (under `kubelet_unhealthy_after`); a typo'd image leaves a pod or two in
//! `ImagePullBackOff` (under the pile's 20); pods terminating within their grace period are not
//! overdue; a pod's own process named `kubelet` (a kind node) is not the node's kubelet; a check
//! pointed at the wrong address never passed and fires nothing. See
//! `each_part_fires_alone_past_its_threshold_and_not_before` and the tests after it.

use serde::Serialize;

use super::{evidence, human_secs};
use crate::{
    attribution::{Attribution, pods::Terminating},
    incidents::{Finding, NodeView, Remediation, Settings, Severity, Signature, Step, ns},
    kubelet::Check,
    stuck::StuckTask,
};

pub const NAME: &str = "kubelet-degraded";
/// Owners and pods named in the summary; the evidence has more.
const NAMED: usize = 3;
const EVIDENCE_PODS: usize = 20;
/// What the kubelet and the container runtimes are called (`comm`, 15 characters at most).
const KUBELET_AND_RUNTIMES: [&str; 8] =
    ["kubelet", "containerd", "crio", "conmon", "dockerd", "cri-dockerd", "runc", "crun"];

pub struct KubeletDegraded {
    image_pull_pods: u32,
    overdue_secs: i64,
    stuck_terminating_pods: u32,
    unhealthy_after: u64,
}

impl KubeletDegraded {
    pub fn new(settings: &Settings) -> Self {
        Self {
            image_pull_pods: settings.kubelet_image_pull_pods,
            overdue_secs: settings.kubelet_termination_overdue.as_secs() as i64,
            stuck_terminating_pods: settings.kubelet_stuck_terminating_pods,
            unhealthy_after: ns(settings.kubelet_unhealthy_after),
        }
    }
}

/// A check that worked, then has failed for long enough, with since when. One that never
/// worked is a wrong address ([`crate::kubelet`] warns of it), not a degraded kubelet.
fn failing(check: &Option<Check>, now: u64, after: u64) -> Option<(&Check, u64)> {
    let check = check.as_ref().filter(|c| c.passed_once)?;
    let since = check.failing_since_unix_ns?;
    (now.saturating_sub(since) >= after).then_some((check, since))
}

fn is_kubelet_or_runtime(task: &StuckTask) -> bool {
    (task.who.host || task.who.pod_uid.is_none())
        // containerd's shims are containerd-shim-runc-v2, cut to 15 characters.
        && (KUBELET_AND_RUNTIMES.contains(&task.comm.as_str()) || task.comm.starts_with("containerd-shim"))
}

impl Signature for KubeletDegraded {
    fn name(&self) -> &'static str {
        NAME
    }

    fn evaluate(&mut self, now: u64, node: &NodeView) -> Vec<Finding> {
        let load = node.kubelet_load;
        let healthz = failing(&node.kubelet.healthz, now, self.unhealthy_after);
        let tls = failing(&node.kubelet.tls, now, self.unhealthy_after);
        let stuck: Vec<StuckTask> = node.stuck.all(now).into_iter().filter(is_kubelet_or_runtime).collect();
        let pulling: u32 = load.image_pull.values().sum();
        let mut owners: Vec<(&(String, String), &u32)> = load.image_pull.iter().collect();
        owners.sort_by(|a, b| b.1.cmp(a.1).then(a.0.cmp(b.0)));
        let now_secs = (now / 1_000_000_000) as i64;
        let overdue: Vec<&Terminating> = load
            .terminating
            .iter()
            .filter(|t| now_secs - t.deadline_unix_secs >= self.overdue_secs)
            .collect();
        // The named list stops at MAX_TERMINATING, oldest first: beyond it all are younger.
        let pile = pulling >= self.image_pull_pods;
        let stuck_terminating = overdue.len() as u32 >= self.stuck_terminating_pods;
        let unhealthy = healthz.is_some() || tls.is_some() || !stuck.is_empty();
        if !(pile || stuck_terminating || unhealthy) {
            return vec![];
        }

        let mut said = Vec::new();
        for (name, failed) in [("its healthz", healthz), ("the TLS handshake with its server", tls)] {
            if let Some((check, since)) = failed {
                said.push(format!(
                    "{name} ({}) failed for {}: {}",
                    check.target,
                    human_secs(now.saturating_sub(since) / 1_000_000_000),
                    check.error.as_deref().unwrap_or_default()
                ));
            }
        }
        for task in &stuck {
            said.push(format!(
                "{} (pid {}) is stuck in {} for {}",
                task.comm,
                task.pid,
                task.wait.as_str(),
                human_secs(task.blocked_secs)
            ));
        }
        if pulling > 0 {
            let top: Vec<String> = owners
                .iter()
                .take(NAMED)
                .map(|((ns, owner), n)| format!("{n} of {}", owner_name(ns, owner)))
                .collect();
            said.push(format!(
                "{pulling} pods wait for an image (ImagePullBackOff/ErrImagePull): {}",
                top.join(", ")
            ));
        }
        if !overdue.is_empty() {
            let most = now_secs - overdue[0].deadline_unix_secs;
            let named: Vec<&str> = overdue.iter().take(NAMED).map(|t| t.pod.as_str()).collect();
            said.push(format!(
                "{} pods are Terminating up to {} past their grace period ({}{})",
                overdue.len(),
                human_secs(most.max(0) as u64),
                named.join(", "),
                if overdue.len() > NAMED { ", …" } else { "" }
            ));
        }
        let mut todo = Vec::new();
        if let Some(((ns, owner), _)) = owners.first().filter(|_| pile) {
            todo.push(format!("{} {} and delete its waiting pods", stop_verb(owner), owner_name(ns, owner)));
        }
        if !overdue.is_empty() {
            todo.push("delete the pods stuck Terminating once their containers are gone".to_string());
        }
        if healthz.is_some() || tls.is_some() {
            todo.push("restart the kubelet".to_string());
        }
        let summary = format!(
            "The kubelet is degraded: {}.{}",
            said.join("; "),
            if todo.is_empty() { String::new() } else { format!(" {}.", capitalized(&todo.join(", then "))) }
        );

        let checks = [&node.kubelet.healthz, &node.kubelet.tls];
        let first_failure = checks.iter().filter_map(|c| c.as_ref()?.failing_since_unix_ns).min();
        let first_stuck = stuck.iter().map(|t| t.blocked_since_unix_ns).min();
        let first_seen = [first_failure, first_stuck, Some(now)].into_iter().flatten().min().unwrap_or(now);
        vec![Finding {
            key: "node".into(),
            severity: if unhealthy || stuck_terminating { Severity::Critical } else { Severity::Warning },
            who: std::sync::Arc::new(Attribution {
                host: true,
                unit: Some("kubelet.service".into()),
                ..Default::default()
            }),
            first_seen_unix_ns: first_seen,
            last_seen_unix_ns: now,
            summary,
            evidence: evidence(&Evidence {
                image_pull_pods: pulling,
                image_pull_owners: owners
                    .iter()
                    .take(EVIDENCE_PODS)
                    .map(|&((namespace, owner), &pods)| OwnerPods { namespace, owner, pods })
                    .collect(),
                terminating_pods: load.terminating_total,
                overdue_pods: overdue
                    .iter()
                    .take(EVIDENCE_PODS)
                    .map(|t| Overdue {
                        pod: &t.pod,
                        uid: &t.uid,
                        overdue_secs: now_secs - t.deadline_unix_secs,
                    })
                    .collect(),
                overdue_pods_total: overdue.len(),
                healthz: &node.kubelet.healthz,
                tls: &node.kubelet.tls,
                stuck_tasks: stuck
                    .iter()
                    .map(|t| Stuck {
                        pid: t.pid,
                        comm: &t.comm,
                        wait: t.wait.as_str(),
                        blocked_secs: t.blocked_secs,
                        stack: &t.stack,
                    })
                    .collect(),
            }),
            remediation: remediation(owners.first().filter(|_| pile).map(|(k, _)| *k), &overdue),
        }]
    }

    fn evicted(&self) -> u64 {
        0
    }
}

#[derive(Serialize)]
struct Evidence<'a> {
    image_pull_pods: u32,
    image_pull_owners: Vec<OwnerPods<'a>>,
    terminating_pods: usize,
    overdue_pods: Vec<Overdue<'a>>,
    overdue_pods_total: usize,
    healthz: &'a Option<Check>,
    tls: &'a Option<Check>,
    stuck_tasks: Vec<Stuck<'a>>,
}

#[derive(Serialize)]
struct OwnerPods<'a> {
    namespace: &'a str,
    owner: &'a str,
    pods: u32,
}

#[derive(Serialize)]
struct Overdue<'a> {
    pod: &'a str,
    uid: &'a str,
    overdue_secs: i64,
}

#[derive(Serialize)]
struct Stuck<'a> {
    pid: u32,
    comm: &'a str,
    wait: &'static str,
    blocked_secs: u64,
    stack: &'a [String],
}

/// (`batch`, `CronJob/report`) -> `CronJob batch/report`.
fn owner_name(namespace: &str, owner: &str) -> String {
    let (kind, name) = owner.split_once('/').unwrap_or(("", owner));
    format!("{kind} {namespace}/{name}")
}

fn capitalized(text: &str) -> String {
    let mut chars = text.chars();
    chars.next().map(|c| c.to_uppercase().chain(chars).collect()).unwrap_or_default()
}

/// What stops an owner making more pods.
fn stop_verb(owner: &str) -> &'static str {
    match owner.split_once('/').map(|(kind, _)| kind) {
        Some("CronJob") => "suspend",
        Some("Deployment" | "StatefulSet" | "ReplicaSet") => "scale down or fix the image of",
        Some("Pod") => "delete",
        _ => "stop",
    }
}

fn remediation(owner: Option<&(String, String)>, overdue: &[&Terminating]) -> Remediation {
    let mut break_glass = Vec::new();
    if let Some((ns, owner)) = owner {
        let (kind, name) = owner.split_once('/').unwrap_or(("", owner));
        let stop = match kind {
            "CronJob" => {
                Some(format!("kubectl -n {ns} patch cronjob {name} -p '{{\"spec\":{{\"suspend\":true}}}}'"))
            }
            "Deployment" | "StatefulSet" | "ReplicaSet" => {
                Some(format!("kubectl -n {ns} scale {} {name} --replicas=0", kind.to_ascii_lowercase()))
            }
            _ => None,
        };
        break_glass.push(Step::new(
            format!(
                "Stop {} from making more pods that cannot start (it owns most of the pile).",
                owner_name(ns, owner)
            ),
            stop,
        ));
        break_glass.push(Step::new(
            "Delete its pods that wait for the image (Pending on this node); each one still costs the kubelet a \
             pull back-off loop.",
            Some(format!(
                "kubectl -n {ns} get pods --field-selector spec.nodeName=<node>,status.phase=Pending -o name | grep '^pod/{name}-' | xargs -r kubectl -n {ns} delete --wait=false"
            )),
        ));
    }
    for t in overdue.iter().take(NAMED) {
        let (ns, name) = t.pod.split_once('/').unwrap_or(("default", &t.pod));
        break_glass.push(Step::new(
            format!(
                "{} is past its grace period: check on the node that its containers are gone, then remove the \
                 object (force only then: a forced delete of a pod whose containers still run leaves them running).",
                t.pod
            ),
            Some(format!(
                "crictl ps -a --pod \"$(crictl pods --name {name} --namespace {ns} -q)\"; kubectl -n {ns} delete pod {name} --grace-period=0 --force"
            )),
        ));
    }
    break_glass.push(Step::new(
        "If healthz or :10250 still do not answer, restart the kubelet (running containers keep running).",
        Some("systemctl restart kubelet && curl -sS --max-time 3 http://127.0.0.1:10248/healthz".into()),
    ));
    Remediation {
        permanent: vec![
            "Fix or remove the workload whose image cannot be pulled; give CronJobs concurrencyPolicy: Forbid, \
             startingDeadlineSeconds and a Job activeDeadlineSeconds, so a broken image cannot pile pods onto a node."
                .into(),
            "Alert on the kubelet's health from the node (this signature, or the KubeletDegraded node condition): \
             its Ready heartbeats alone did not show it in incident 4."
                .into(),
        ],
        break_glass,
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use std::sync::Arc;

    use super::*;
    use crate::{attribution::pods::KubeletLoad, incidents::signatures::tests::*, kubelet::Health};

    const NOW: u64 = 1_796_000_000 * SEC;

    fn load(pulling: &[(&str, &str, u32)], terminating: &[(&str, i64)]) -> KubeletLoad {
        KubeletLoad {
            image_pull: pulling
                .iter()
                .map(|(ns, owner, n)| ((ns.to_string(), owner.to_string()), *n))
                .collect(),
            terminating: terminating
                .iter()
                .map(|(pod, overdue)| Terminating {
                    pod: pod.to_string(),
                    uid: format!("uid-{pod}"),
                    deadline_unix_secs: (NOW / SEC) as i64 - overdue,
                })
                .collect(),
            terminating_total: terminating.len(),
        }
    }

    fn failed(target: &str, error: &str, for_secs: u64) -> Option<Check> {
        Some(Check {
            target: target.into(),
            error: Some(error.into()),
            failing_since_unix_ns: Some(NOW - for_secs * SEC),
            checked_unix_ns: NOW,
            passed_once: true,
            failures: (for_secs / 10) as u32,
        })
    }

    fn evaluate(load: &KubeletLoad, kubelet: &Health, stuck: &crate::stuck::StuckSet) -> Vec<Finding> {
        let mut s = KubeletDegraded::new(&Settings::default());
        s.evaluate(NOW, &NodeView { kubelet_load: load, kubelet, ..node(stuck) })
    }

    #[test]
    fn incident_4_a_cronjob_pile_a_wedged_kubelet_and_pods_that_do_not_terminate() {
        let load = load(
            &[("batch", "CronJob/report", 360), ("batch", "CronJob/cleanup", 12), ("shop", "Pod/typo", 1)],
            &[("db/postgres-0", 900), ("shop/web-1", 600), ("shop/web-2", 420), ("shop/new", 10)],
        );
        let kubelet = Health {
            healthz: failed("http://127.0.0.1:10248/healthz", "no answer within 3.0 s", 120),
            tls: failed("127.0.0.1:10250", "TLS handshake not finished within 3.0 s", 120),
        };
        let f = evaluate(&load, &kubelet, &stuck(&[]));
        assert_eq!((f.len(), f[0].key.as_str(), f[0].severity), (1, "node", Severity::Critical));
        let e = &f[0].evidence;
        assert_eq!(e["image_pull_pods"], 373);
        assert_eq!(
            e["image_pull_owners"][0],
            json!({"namespace": "batch", "owner": "CronJob/report", "pods": 360})
        );
        assert_eq!((&e["terminating_pods"], &e["overdue_pods_total"]), (&json!(4), &json!(3)));
        assert_eq!(
            e["overdue_pods"][0],
            json!({"pod": "db/postgres-0", "uid": "uid-db/postgres-0", "overdue_secs": 900})
        );
        let summary = &f[0].summary;
        for said in [
            "its healthz (http://127.0.0.1:10248/healthz) failed for 2 min: no answer within 3.0 s",
            "the TLS handshake with its server (127.0.0.1:10250) failed for 2 min: TLS handshake not finished",
            "373 pods wait for an image (ImagePullBackOff/ErrImagePull): 360 of CronJob batch/report, 12 of CronJob batch/cleanup, 1 of Pod shop/typo",
            "3 pods are Terminating up to 15 min past their grace period (db/postgres-0, shop/web-1, shop/web-2)",
            "Suspend CronJob batch/report and delete its waiting pods, then delete the pods stuck Terminating",
            "then restart the kubelet.",
        ] {
            assert!(summary.contains(said), "{said:?} not in {summary}");
        }
        let steps = &f[0].remediation.break_glass;
        assert_eq!(
            steps[0].command.as_deref(),
            Some(r#"kubectl -n batch patch cronjob report -p '{"spec":{"suspend":true}}'"#)
        );
        assert!(steps.iter().any(|s| {
            s.command.as_deref().is_some_and(|c| c.contains("delete pod postgres-0 --grace-period=0"))
        }));
        assert_eq!(f[0].first_seen_unix_ns, NOW - 120 * SEC, "since the checks started failing");
    }

    #[test]
    fn each_part_fires_alone_past_its_threshold_and_not_before() {
        let quiet = Health::default();
        let none = stuck(&[]);
        assert!(evaluate(&load(&[("batch", "CronJob/report", 19)], &[]), &quiet, &none).is_empty());
        let pile = evaluate(&load(&[("batch", "CronJob/report", 20)], &[]), &quiet, &none);
        assert_eq!(pile[0].severity, Severity::Warning, "a pile alone is a warning");
        let young = load(&[], &[("a/1", 299), ("a/2", 299), ("a/3", 299)]);
        assert!(evaluate(&young, &quiet, &none).is_empty(), "not yet overdue");
        let overdue = load(&[], &[("a/1", 300), ("a/2", 300), ("a/3", 300)]);
        assert_eq!(evaluate(&overdue, &quiet, &none)[0].severity, Severity::Critical);
        let briefly = Health { healthz: failed("h", "no answer", 29), tls: None };
        assert!(
            evaluate(&KubeletLoad::default(), &briefly, &none).is_empty(),
            "a kubelet restart takes seconds"
        );
        let long = Health { healthz: None, tls: failed("t", "TLS handshake not finished", 30) };
        assert_eq!(evaluate(&KubeletLoad::default(), &long, &none).len(), 1);
        let well = Health {
            healthz: Some(Check {
                target: "h".into(),
                error: None,
                failing_since_unix_ns: None,
                checked_unix_ns: NOW,
                passed_once: true,
                failures: 0,
            }),
            tls: None,
        };
        assert!(evaluate(&KubeletLoad::default(), &well, &none).is_empty());
    }

    /// Seen on a real cluster: the kubelet served on its node address only, the check dialled
    /// 127.0.0.1 and was refused from the start. A check that never worked is a wrong address
    /// (the checks warn of it), not a degraded kubelet, however long it fails.
    #[test]
    fn a_check_that_never_passed_fires_nothing() {
        let mut wrong = failed("127.0.0.1:10250", "connect: Connection refused (os error 111)", 600);
        wrong.as_mut().unwrap().passed_once = false;
        let kubelet = Health { healthz: None, tls: wrong };
        assert!(evaluate(&KubeletLoad::default(), &kubelet, &stuck(&[])).is_empty());
    }

    #[test]
    fn a_stuck_kubelet_task_fires_and_a_pods_task_of_the_same_name_does_not() {
        let host =
            Arc::new(Attribution { host: true, unit: Some("kubelet.service".into()), ..Default::default() });
        let stack = ["folio_wait_bit_common", "filemap_fault", "handle_mm_fault"];
        let set = stuck(&[sampled(NOW - 200 * SEC, 812, "kubelet", &stack, 200, &host)]);
        let f = evaluate(&KubeletLoad::default(), &Health::default(), &set);
        assert_eq!(f[0].evidence["stuck_tasks"][0]["pid"], 812);
        assert!(f[0].summary.contains("kubelet (pid 812) is stuck in"), "{}", f[0].summary);
        let in_a_pod =
            stuck(&[sampled(NOW - 200 * SEC, 813, "kubelet", &stack, 200, &pod("u1", "kind-node"))]);
        assert!(evaluate(&KubeletLoad::default(), &Health::default(), &in_a_pod).is_empty());
    }
}
