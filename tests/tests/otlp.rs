//! OTLP logs (issue 40) on the real kernel, to a receiver built from the protocol's definitions
//! (tests/src/otlp.rs): incident 1 in a pod — its network namespace with the sidecar's REDIRECT of
//! tcp/2049, a hard-mounted client's reconnects reset — and the agent configured for OTLP only by
//! the `OTEL_EXPORTER_OTLP_*` variables, as an SDK is. Every record the receiver takes must carry
//! the resource of whom it is about (`k8s.pod.name`, `k8s.namespace.name`, `k8s.pod.uid`,
//! `k8s.node.name`, `service.name`); every record offered must arrive, or be counted as dropped.

use std::{collections::BTreeSet, time::Duration};

use kstall_tests::{
    agent::{Agent, COUNTED_WITHIN, pod_json, write_pods_file},
    cgroup::{Cgroup, PodProcess},
    host::wait_for,
    kernel_tests_can_run,
    netns::{NetNs, NfsReconnects},
    otlp::{Protocol, Receiver, Record, Tls},
    tls::make_certificates,
};

const UID: &str = "7b1d2e3f-4a5b-4c6d-8e7f-9a0b1c2d3e4f";
const CONTAINER: &str = "1f2e3d4c5b6a7f8e9d0c1b2a3f4e5d6c7b8a9f0e1d2c3b4a5f6e7d8c9b0a1f2e";
const POD: &str = "tenant-api-5d8c7b9f4-q7x2m";
const NODE: &str = "node-otlp-1";

/// The pod of incident 1, its reconnects reset, until dropped.
struct Incident1 {
    _client: NfsReconnects,
    _process: PodProcess,
    _netns: NetNs,
    _container: Cgroup,
}

impl Incident1 {
    fn start() -> Self {
        let container = Cgroup::kubepods_container("burstable", UID, CONTAINER);
        let netns = NetNs::new("otlp");
        let process = PodProcess::start(&netns, &container.procs());
        netns.redirect_tcp("iptables", 2049, 15001);
        let client = NfsReconnects::start(&netns);
        Self { _client: client, _process: process, _netns: netns, _container: container }
    }
}

/// The agent with the pod's metadata and `env`, incident 1 until its incident fires, and then
/// until it resolves; the agent stopped (its last records sent). What the receiver took, and the
/// agent's last metrics.
fn incident_through(receiver: &Receiver, env: &[(&str, &str)]) -> (Vec<Record>, String) {
    let dir = tempfile::tempdir().unwrap();
    let pods_file = dir.path().join("pods.json");
    write_pods_file(&pods_file, &[pod_json(UID, POD, CONTAINER)]);
    let pods = pods_file.to_str().unwrap();
    let mut args = vec!["--pods-file", pods, "--node-name", NODE, "--quiet-window", "5s"];
    args.extend(["--export-otlp", "on"]);
    let mut agent = Agent::start_with_env(env, &args);
    let incident = Incident1::start();
    let fired = |i: &serde_json::Value| i["signature"] == "nfs-sidecar-redirect" && i["state"] == "firing";
    agent
        .wait_incident(fired, Duration::from_secs(15))
        .unwrap_or_else(|| panic!("no nfs-sidecar-redirect: {:#?}\n{}", agent.incidents(), agent.log()));
    drop(incident);
    let resolved =
        |i: &serde_json::Value| i["signature"] == "nfs-sidecar-redirect" && i["state"] == "resolved";
    agent.wait_incident(resolved, Duration::from_secs(30)).expect("resolved once the reconnects stop");
    // Its resolution reaches the receiver: the last record offered before the agent stops.
    wait_for(COUNTED_WITHIN, || {
        receiver.records().iter().any(|r| r.record.event_name == "kstall.incident.resolved").then_some(())
    })
    .unwrap_or_else(|| panic!("the resolution did not arrive:\n{}\n{}", agent.metrics(), agent.log()));
    let metrics = agent.metrics();
    agent.stop();
    (receiver.records(), metrics)
}

/// What every test asks of the records: each of the pod's under its resource, the node-wide ones
/// under the node's, the incident's change twice, and every number from 1 to the last there.
fn check(records: &[Record], metrics: &str) {
    assert!(!records.is_empty());
    let mut seqs = BTreeSet::new();
    for r in records {
        assert_eq!(r.resource.get("service.name").map(String::as_str), Some("kstall"), "{r:?}");
        assert_eq!(r.resource.get("k8s.node.name").map(String::as_str), Some(NODE), "{r:?}");
        assert!(seqs.insert(r.int("kstall.seq").expect("kstall.seq")), "one record a number: {r:?}");
    }
    let of_pod: Vec<&Record> =
        records.iter().filter(|r| r.resource.get("k8s.pod.name").map(String::as_str) == Some(POD)).collect();
    for r in &of_pod {
        assert_eq!(r.resource.get("k8s.namespace.name").map(String::as_str), Some("shop"), "{r:?}");
        assert_eq!(r.resource.get("k8s.pod.uid").map(String::as_str), Some(UID), "{r:?}");
    }
    let resets: Vec<&&Record> = of_pod.iter().filter(|r| r.record.event_name == "kstall.tcp_reset").collect();
    assert!(resets.len() >= 2, "the pod's resets, under its resource: {}", resets.len());
    let body = resets[0].body();
    assert_eq!(
        (&body["event"]["original_dst_port"], &body["event"]["pod"]),
        (&2049.into(), &POD.into()),
        "{body}"
    );
    for name in ["kstall.incident.fired", "kstall.incident.resolved"] {
        let change = of_pod.iter().find(|r| r.record.event_name == name);
        let change = change.unwrap_or_else(|| panic!("no {name} under the pod's resource"));
        let incident = &change.body()["incident"];
        assert_eq!(incident["signature"], "nfs-sidecar-redirect");
        // A firing's severity is the incident's, a resolution is news, not a problem.
        let severity = match (name, incident["severity"].as_str()) {
            ("kstall.incident.resolved", _) => "INFO",
            (_, Some("critical")) => "ERROR",
            _ => "WARN",
        };
        assert_eq!(change.record.severity_text, severity, "{incident}");
    }
    // Nothing lost: the numbers run from 1 without a gap, and nothing was counted as dropped.
    let last = *seqs.last().unwrap();
    assert_eq!(seqs.len() as i64, last, "records missing among 1..={last}");
    let dropped = kstall_tests::agent::samples_with(
        metrics,
        "kstall_export_records_dropped_total",
        &[("output", "otlp")],
    );
    assert_eq!(dropped.sum::<f64>(), 0.0, "{metrics}");
    let written =
        kstall_tests::agent::samples_with(metrics, "kstall_export_records_total", &[("output", "otlp")]);
    assert!(written.sum::<f64>() >= 1.0, "{metrics}");
}

#[test]
fn otlp_over_grpc_with_mutual_tls_carries_each_pods_records_under_its_resource() {
    if !kernel_tests_can_run("otlp_over_grpc_with_mutual_tls_carries_each_pods_records_under_its_resource") {
        return;
    }
    let certs = tempfile::tempdir().unwrap();
    make_certificates(certs.path());
    let file = |name: &str| certs.path().join(name);
    let (ca, client_cert, client_key) = (file("ca.crt"), file("client.crt"), file("client.key"));
    let (server_cert, server_key) = (file("server.crt"), file("server.key"));
    let tls = Tls { cert: &server_cert, key: &server_key, client_ca: Some(&ca) };
    let receiver = Receiver::start(Protocol::Grpc, Some(tls));
    let endpoint = receiver.endpoint(true);
    let env = [
        ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"),
        ("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint.as_str()),
        ("OTEL_EXPORTER_OTLP_HEADERS", "authorization=Bearer%20s3cret,x-scope-orgid=tenant-1"),
        ("OTEL_EXPORTER_OTLP_CERTIFICATE", ca.to_str().unwrap()),
        ("OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE", client_cert.to_str().unwrap()),
        ("OTEL_EXPORTER_OTLP_CLIENT_KEY", client_key.to_str().unwrap()),
    ];
    let (records, metrics) = incident_through(&receiver, &env);
    check(&records, &metrics);
    for received in receiver.received() {
        assert_eq!(received.headers.get("authorization").map(String::as_str), Some("Bearer s3cret"));
        assert_eq!(received.headers.get("x-scope-orgid").map(String::as_str), Some("tenant-1"));
    }
    println!("otlp grpc+mTLS: {} records in {} exports", records.len(), receiver.received().len());
}

#[test]
fn otlp_over_http_puts_v1_logs_under_the_endpoint_and_adds_the_users_resource() {
    if !kernel_tests_can_run("otlp_over_http_puts_v1_logs_under_the_endpoint_and_adds_the_users_resource") {
        return;
    }
    let receiver = Receiver::start(Protocol::Http, None);
    // The general endpoint is a base: the agent adds the logs' path.
    let base = format!("http://{}", receiver.addr);
    let env = [
        ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf"),
        ("OTEL_EXPORTER_OTLP_ENDPOINT", base.as_str()),
        ("OTEL_EXPORTER_OTLP_LOGS_HEADERS", "x-scope-orgid=tenant-2"),
        ("OTEL_RESOURCE_ATTRIBUTES", "deployment.environment=staging,k8s.cluster.name=eu-1"),
    ];
    let (records, metrics) = incident_through(&receiver, &env);
    check(&records, &metrics);
    for r in &records {
        assert_eq!(r.resource.get("k8s.cluster.name").map(String::as_str), Some("eu-1"), "{r:?}");
        assert_eq!(r.resource.get("deployment.environment").map(String::as_str), Some("staging"));
    }
    for received in receiver.received() {
        assert_eq!(received.headers.get("x-scope-orgid").map(String::as_str), Some("tenant-2"));
        assert_eq!(received.headers.get("content-type").map(String::as_str), Some("application/x-protobuf"));
    }
    println!("otlp http: {} records in {} exports", records.len(), receiver.received().len());
}

/// An endpoint that refuses: the agent goes on, and every record it could not send is counted,
/// numbered so the gap shows; once the endpoint takes records again, they flow.
#[test]
fn an_endpoint_that_refuses_costs_counted_records_never_the_agent() {
    if !kernel_tests_can_run("an_endpoint_that_refuses_costs_counted_records_never_the_agent") {
        return;
    }
    let receiver = Receiver::start(Protocol::Http, None);
    receiver.refuse(true);
    let endpoint = receiver.endpoint(false);
    let env = [("OTEL_EXPORTER_OTLP_LOGS_ENDPOINT", endpoint.as_str())];
    let mut agent = Agent::start_with_env(&env, &["--export-otlp", "on"]);
    let netns = NetNs::new("otlp-refused");
    netns.redirect_tcp("iptables", 2049, 15001);
    let dropped = |agent: &Agent| {
        kstall_tests::agent::samples_with(
            &agent.metrics(),
            "kstall_export_records_dropped_total",
            &[("output", "otlp")],
        )
        .sum::<f64>()
    };
    let client = NfsReconnects::start(&netns);
    wait_for(Duration::from_secs(30), || (dropped(&agent) >= 2.0).then_some(()))
        .unwrap_or_else(|| panic!("nothing counted as dropped:\n{}\n{}", agent.metrics(), agent.log()));
    assert!(agent.log().contains("the OTLP endpoint refused records"), "{}", agent.log());
    receiver.refuse(false);
    let lost = dropped(&agent);
    let taken = wait_for(Duration::from_secs(30), || {
        let records = receiver.records();
        (!records.is_empty()).then_some(records)
    })
    .unwrap_or_else(|| panic!("nothing taken once the endpoint is back:\n{}", agent.log()));
    drop(client);
    let first = taken.iter().filter_map(|r| r.int("kstall.seq")).min().unwrap();
    assert!(first as f64 > lost, "the first record taken ({first}) comes after the {lost} dropped");
    agent.stop();
}
