//! Incident 4 end to end: a real agent against an API server that lists 360 pods of one CronJob
//! waiting in ImagePullBackOff and three pods stuck Terminating past their grace period, and a
//! kubelet that was well, then wedged: its healthz hangs and its TLS server takes connections
//! and never finishes a handshake. Stand-ins (tests/tests/cluster.rs runs the real kubelet,
//! stopped by SIGSTOP): 360 pods and a kubelet wedged this way are more than two cores can make
//! real in a test. kstall must raise `kubelet-degraded` with those counts and that owner, post it as
//! an Event on the Node, count the pods by state in `kstall_node_pods`, and resolve it when the
//! pods are gone and the kubelet answers again.

use std::time::Duration;

use kstall_tests::{agent::Agent, container::ApiServer, kernel_tests_can_run, kubelet::FakeKubelet};
use serde_json::{Value, json};

/// A pod the CronJob `batch/report` made (through its Job of one run), its image not pullable.
fn report_pod(i: usize) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {
            "name": format!("report-29420160-{i:05}"), "namespace": "batch",
            "uid": format!("00000000-0000-4000-8000-{i:012}"),
            "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": "report-29420160",
                                 "uid": "11111111-0000-4000-8000-000000000001", "controller": true}]
        },
        "spec": {"nodeName": "node-a", "containers": [{"name": "report", "image": "url"}]},
        "status": {"phase": "Pending", "containerStatuses": [{"name": "report", "image": "url", "imageID": "",
                   "ready": false, "restartCount": 0,
                   "state": {"waiting": {"reason": "ImagePullBackOff", "message": "Back-off pulling image \"url\""}}}]}
    })
}

/// A pod whose deletion was due `overdue_secs` ago (deletionTimestamp is the request's time plus
/// the grace period).
fn terminating_pod(i: usize, name: &str, overdue_secs: u64) -> Value {
    let deadline = jiff::Timestamp::now() - jiff::SignedDuration::from_secs(overdue_secs as i64);
    let deadline = deadline.strftime("%Y-%m-%dT%H:%M:%SZ").to_string();
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "db", "uid": format!("22222222-0000-4000-8000-{i:012}"),
                     "deletionTimestamp": deadline, "deletionGracePeriodSeconds": 30},
        "spec": {"nodeName": "node-a", "containers": [{"name": "db", "image": "postgres"}]},
        "status": {"phase": "Running"}
    })
}

#[test]
fn a_wedged_kubelet_under_a_cronjob_pile_fires_kubelet_degraded_and_resolves() {
    if !kernel_tests_can_run("a_wedged_kubelet_under_a_cronjob_pile_fires_kubelet_degraded_and_resolves") {
        return;
    }
    let mut pods: Vec<Value> = (0..360).map(report_pod).collect();
    let stuck = ["postgres-0", "postgres-1", "pgbouncer-7"];
    pods.extend(stuck.iter().enumerate().map(|(i, name)| terminating_pod(i, name, 900)));
    let api = ApiServer::start(&pods);
    let (cert, key) = api.certificate();
    let kubelet = FakeKubelet::start_well(&cert, &key);
    let kubeconfig = api.kubeconfig();
    let mut agent = Agent::start(&[
        "--kubeconfig",
        kubeconfig.to_str().unwrap(),
        "--node-name",
        "node-a",
        "--kubelet-healthz",
        &kubelet.healthz_url(),
        "--kubelet-server",
        &kubelet.server(),
        "--kubelet-unhealthy-after",
        "1s",
    ]);
    // Well first (a check that never passed is a wrong address, not a degraded kubelet), then wedged.
    let checked =
        |check: &str| agent.metric_with("kstall_kubelet_check_up", &[("check", check)]) == Some(1.0);
    kstall_tests::host::wait_for(Duration::from_secs(60), || {
        (checked("healthz") && checked("tls")).then_some(())
    })
    .unwrap_or_else(|| panic!("the checks did not pass against the well kubelet:\n{}", agent.metrics()));
    kubelet.wedge();
    let complete = |i: &Value| {
        let e = &i["evidence"];
        i["signature"] == "kubelet-degraded"
            && i["state"] == "firing"
            && e["image_pull_pods"] == 360
            && e["overdue_pods_total"] == 3
            && e["healthz"]["error"].is_string()
            && e["tls"]["error"].is_string()
    };
    let incident = agent
        .wait_incident(complete, Duration::from_secs(90))
        .unwrap_or_else(|| panic!("no complete kubelet-degraded: {:?}\n{}", agent.incidents(), agent.log()));
    let e = &incident["evidence"];
    assert_eq!(incident["severity"], "critical");
    assert_eq!(
        e["image_pull_owners"],
        json!([{"namespace": "batch", "owner": "CronJob/report", "pods": 360}])
    );
    assert_eq!(e["healthz"]["error"], "no answer within 3.0 s");
    assert_eq!(e["tls"]["error"], "TLS handshake not finished within 3.0 s");
    let overdue: Vec<&Value> = e["overdue_pods"].as_array().unwrap().iter().map(|p| &p["pod"]).collect();
    assert_eq!(overdue.len(), 3, "{e}");
    let summary = incident["summary"].as_str().unwrap();
    assert!(
        summary.contains(
            "360 pods wait for an image (ImagePullBackOff/ErrImagePull): 360 of CronJob batch/report"
        ),
        "{summary}"
    );
    assert!(summary.contains("Suspend CronJob batch/report"), "{summary}");
    let pile = agent
        .metric_with("kstall_node_pods", &[("phase", "Pending"), ("waiting_reason", "ImagePullBackOff")]);
    assert_eq!(pile, Some(360.0), "{}", agent.metrics());

    // The Event is on the Node, as `kubectl describe node` shows it.
    let posted = kstall_tests::host::wait_for(Duration::from_secs(30), || {
        api.event_writes().into_iter().find(|w| w["body"]["reason"] == "KubeletDegraded")
    })
    .unwrap_or_else(|| panic!("no KubeletDegraded Event: {:?}", api.event_writes()));
    assert_eq!(posted["path"], "/apis/events.k8s.io/v1/namespaces/kube-system/events");
    assert_eq!(
        posted["body"]["regarding"],
        json!({"apiVersion": "v1", "kind": "Node", "name": "node-a", "uid": "node-a"})
    );

    // The CronJob is suspended and its pods deleted, the stuck ones removed, the kubelet restarted.
    api.set_pods(&[]);
    kubelet.recover();
    let resolved = |i: &Value| i["signature"] == "kubelet-degraded" && i["state"] == "resolved";
    agent.wait_incident(resolved, Duration::from_secs(60)).unwrap_or_else(|| {
        panic!("kubelet-degraded did not resolve: {:?}\n{}", agent.incidents(), agent.log())
    });
    assert_eq!(agent.stop(), Some(0));
}

/// A kubelet checked where it does not serve (a wrong --kubelet-server, or the default
/// 127.0.0.1 on a node whose kubelet serves on its address only, as seen on a real cluster): one
/// warning naming the address tried, the node's address and the flag — and no incident, however
/// long: degraded means it worked, then stopped.
#[test]
fn a_kubelet_checked_at_the_wrong_address_is_one_warning_and_no_incident() {
    if !kernel_tests_can_run("a_kubelet_checked_at_the_wrong_address_is_one_warning_and_no_incident") {
        return;
    }
    let api = ApiServer::start(&[]);
    let (cert, key) = api.certificate();
    let kubelet = FakeKubelet::start_well(&cert, &key);
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
    let kubeconfig = api.kubeconfig();
    let agent = Agent::start(&[
        "--kubeconfig",
        kubeconfig.to_str().unwrap(),
        "--node-name",
        "node-a",
        "--node-ip",
        "198.51.100.10",
        "--kubelet-healthz",
        &kubelet.healthz_url(),
        "--kubelet-server",
        &closed.to_string(),
        "--kubelet-unhealthy-after",
        "1s",
    ]);
    let said = "the kubelet check has not passed since start";
    let log = agent
        .log_once_it_has(said, Duration::from_secs(90))
        .unwrap_or_else(|| panic!("no warning of the wrong address:\n{}", agent.log()));
    let line = log.lines().find(|l| l.contains(said)).unwrap();
    for named in [closed.to_string().as_str(), "198.51.100.10", "--kubelet-server", "Connection refused"] {
        assert!(line.contains(named), "{named:?} not in the warning: {line}");
    }
    // The warning comes at the third failed check (20 s in); a kubelet that had worked would
    // have fired 1 s after its first failure, and the evaluator runs every second.
    assert_eq!(agent.metric_with("kstall_kubelet_check_up", &[("check", "tls")]), Some(0.0));
    assert_eq!(agent.metric_with("kstall_kubelet_check_up", &[("check", "healthz")]), Some(1.0));
    let fired: Vec<Value> =
        agent.incidents().into_iter().filter(|i| i["signature"] == "kubelet-degraded").collect();
    assert!(fired.is_empty(), "kubelet-degraded on a kubelet never reached: {fired:?}");
    assert_eq!(log.matches(said).count(), 1, "{log}");
}
