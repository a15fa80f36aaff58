//! The Grafana dashboards (deploy/grafana/*.json, written by `cargo xtask dashboards`) against real
//! data: a real agent and a real Prometheus scraping it, while this host's kernel does what the
//! panels are about — a pod's NFS connections redirected by a sidecar's rule and reset, a task of
//! the pod stuck in writeback, its container OOM-killed again and again (one victim named like a
//! node daemon), its connects to a database dropped by its network policy, events of a namespace of no pod and an API client that stops reading — and the
//! incidents these fire. Every query of every panel, with the variables set to that node, namespace
//! and pod, must return data, except the ones listed as fed by the VM scenarios (this host has no
//! NFS client and must not run out of memory) or by none. A test without root checks that every
//! query is valid PromQL (promtool).

use std::{
    io::{BufRead as _, BufReader, Write as _},
    net::{Ipv4Addr, SocketAddr},
    os::unix::net::UnixStream,
    path::Path,
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use kstall_tests::{
    agent::{Agent, pod_json, write_pods_file},
    cgroup::{Cgroup, MemoryLimit, PodProcess},
    dashboards::{
        Key, Panels, Query, Selection, Variables, dashboards, described, fed_by_the_vm_scenarios, queries,
        select, variable_queries,
    },
    host::{Sysctl, wait_for},
    kernel_tests_can_run,
    kubelet::FakeKubelet,
    netns::{NetNs, NfsReconnects, closed_low_ports, held_connections, refused_connects, timed_out_connects},
    oom::{OOM_LIMIT, oom_kill_as},
    workspace,
    writeback::FreezableDisk,
};
use serde_json::Value;

const UID: &str = "7d2e3f4a-5b6c-4d7e-8f9a-0b1c2d3e4f5a";
const CONTAINER: &str = "4c3b2a1f0e9d8c7b6a5f4e3d2c1b0a9f8e7d6c5b4a3f2e1d0c9b8a7f6e5d4c3b";
const POD: &str = "tenant-api-5d8c7b9f4-d4sh1";
const NAMESPACE: &str = "shop";
const NODE: &str = "node-a";

/// Queries no scenario feeds, and why: what they count happens only when something is broken in
/// a way no test reproduces (their panels show 0 when empty). The ones only the VMs can feed are
/// `dashboards::fed_by_the_vm_scenarios()`, and vm_scenarios.rs shows they do.
const FED_BY_NO_SCENARIO: &[(Key, &str)] = &[
    (("kstall-nfs", "NFSv4 state recovery failures", "A"), "a failed NFSv4 state recovery: not reproduced"),
    (
        ("kstall-fleet", "Fleet alerts firing now", "KstallNfsServerUnreachableFromNodes"),
        "several nodes: one agent here; promtool's tests of the rules prove it",
    ),
    (
        ("kstall-fleet", "Fleet alerts firing now", "KstallNfsSidecarRedirectRollout"),
        "three pods of one workload redirected: promtool's tests of the rules prove it",
    ),
    (
        ("kstall-fleet", "Fleet alerts firing now", "KstallSignatureOnManyNodes"),
        "three nodes with one signature: promtool's tests of the rules prove it",
    ),
    (
        ("kstall-agent", "Event stream (--export-events)", "B"),
        "a stream's consumer falling behind: the json_lines unit tests and the bench's storm cause it",
    ),
];

/// This test's node, namespace and pod, selected on the dashboards.
fn selection() -> Selection {
    Selection { node: NODE.into(), namespace: Some(NAMESPACE.into()), pod: Some(POD.into()) }
}

#[test]
fn every_dashboard_has_the_variables_and_runs_its_queries_on_the_chosen_data_source() {
    for (name, dashboard) in dashboards() {
        let list = dashboard["templating"]["list"].as_array().unwrap();
        let variable = |n: &str| list.iter().find(|v| v["name"] == n);
        let source = variable("datasource").unwrap_or_else(|| panic!("{name}: no datasource variable"));
        assert_eq!(
            (&source["type"], &source["query"]),
            (&"datasource".into(), &"prometheus".into()),
            "{name}"
        );
        for v in ["node", "namespace", "pod"] {
            let v = variable(v).unwrap_or_else(|| panic!("{name}: no {v} variable"));
            assert_eq!((&v["includeAll"], &v["allValue"]), (&true.into(), &".*".into()), "{name}: {v}");
        }
        let chosen = serde_json::json!({"type": "prometheus", "uid": "${datasource}"});
        for panel in dashboard["panels"].as_array().unwrap() {
            for target in panel["targets"].as_array().into_iter().flatten() {
                assert_eq!(target["datasource"], chosen, "{name} / {}", panel["title"]);
            }
            // A text panel's links point at runbooks that exist.
            let content = panel["options"]["content"].as_str().unwrap_or_default();
            for link in content.split("](${runbooks}/").skip(1) {
                let file = link.split(')').next().unwrap();
                assert!(workspace().join("docs/runbooks").join(file).exists(), "{name}: no runbook {file}");
            }
        }
    }
}

#[test]
fn every_query_is_valid_promql() {
    let dashboards = dashboards();
    let selection = selection();
    let vars = Variables { selection: &selection, range_secs: 3600, rate_interval_secs: 60 };
    // Each query (and each variable's selector) as a recording rule: promtool parses them all.
    let mut exprs: Vec<(String, String)> =
        queries(&dashboards).iter().map(|q| (q.name(), vars.apply(&q.expr))).collect();
    for (dashboard, json) in &dashboards {
        for (name, selector, _) in variable_queries(json) {
            exprs.push((format!("{dashboard} / variable {name}"), vars.apply(&selector)));
        }
    }
    let check = |exprs: &[(String, String)]| -> Result<(), String> {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("queries.yaml");
        let mut rules = String::from("groups:\n  - name: dashboards\n    rules:\n");
        for (i, (_, expr)) in exprs.iter().enumerate() {
            // A JSON string is a YAML double-quoted scalar.
            rules.push_str(&format!(
                "      - record: dashboard_query_{i}\n        expr: {}\n",
                Value::from(expr.as_str())
            ));
        }
        std::fs::write(&file, rules).unwrap();
        let out = std::process::Command::new("promtool")
            .args(["check", "rules"])
            .arg(&file)
            .output()
            .expect("promtool (Debian package `prometheus`; `cargo xtask test` installs it)");
        let text =
            format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        if out.status.success() { Ok(()) } else { Err(text) }
    };
    if check(&exprs).is_err() {
        // One line per bad query.
        let bad: Vec<String> = exprs
            .iter()
            .filter_map(|q| {
                check(std::slice::from_ref(q)).err().map(|e| format!("{}: `{}`: {}", q.0, q.1, e.trim()))
            })
            .collect();
        panic!("queries that are not valid PromQL:\n{}", bad.join("\n"));
    }
}

/// An API client that subscribes to the event stream and never reads it.
fn stalled_client(socket: &Path) -> UnixStream {
    let mut stream = UnixStream::connect(socket).expect("API socket");
    stream.write_all(b"{\"request\":\"events\"}\n").expect("subscribe");
    // Up to the agent's {"subscribed":true}: every event after it is for this client.
    let mut subscribed = String::new();
    BufReader::new(stream.try_clone().unwrap()).read_line(&mut subscribed).expect("subscribed");
    assert!(subscribed.contains("subscribed"), "{subscribed}");
    stream
}

#[test]
fn every_panel_shows_data_of_a_real_agent_on_this_kernel() {
    if !kernel_tests_can_run("every_panel_shows_data_of_a_real_agent_on_this_kernel") {
        return;
    }
    let test_started = Instant::now();
    let dashboards = dashboards();
    let queries = queries(&dashboards);
    let vm_fed: Vec<Key> = fed_by_the_vm_scenarios().collect();
    let not_fed: Vec<Key> = FED_BY_NO_SCENARIO.iter().map(|(key, _)| *key).collect();
    let listed: Vec<&Query> = select(&queries, &[&vm_fed[..], &not_fed[..]].concat());
    let proven_here: Vec<&Query> =
        queries.iter().filter(|q| !listed.iter().any(|l| l.key() == q.key())).collect();

    // The agent lowers the hung-task timeout itself and restores it; so does this guard, should
    // the agent die first.
    let original = std::fs::read_to_string("/proc/sys/kernel/hung_task_timeout_secs").unwrap();
    let _restore = Sysctl::set("kernel.hung_task_timeout_secs", original.trim());
    let _warnings = Sysctl::keep("kernel.hung_task_warnings");
    let dir = tempfile::tempdir().unwrap();
    let pods_file = dir.path().join("pods.json");
    write_pods_file(&pods_file, &[pod_json(UID, POD, CONTAINER)]);
    // The pod's container cgroup, in the systemd driver's layout; made before the disk so that it
    // goes after it, also on a failure: the disk's writer must have left it.
    let container = Cgroup::kubepods_container("burstable", UID, CONTAINER);
    let mut disk = FreezableDisk::new("dashboards");
    // The node's kubelet: well at first (only a check that passed can be degraded), wedged below.
    kstall_tests::tls::make_certificates(dir.path());
    let kubelet = FakeKubelet::start_well(&dir.path().join("server.crt"), &dir.path().join("server.key"));
    let mut agent = Agent::start(&[
        "--pods-file",
        pods_file.to_str().unwrap(),
        "--node-name",
        NODE,
        // The stalled client's ports below, each its own series.
        "--metric-ports",
        "20000-29999",
        "--hung-task-timeout-secs",
        "3",
        "--termination-blocked-after",
        "3s",
        "--kubelet-checks",
        "on",
        "--kubelet-healthz",
        &kubelet.healthz_url(),
        "--kubelet-server",
        &kubelet.server(),
        "--kubelet-unhealthy-after",
        "1s",
        // What fired stays firing until every panel was queried (the conntrack table is full
        // only for a moment).
        "--quiet-window",
        "10m",
        "--export-events",
        &format!("file:{}", dir.path().join("events.jsonl").display()),
        "--program-stats",
        "on",
    ]);
    let panels = Panels::scrape(agent.listen, NODE);
    let checked =
        |check: &str| agent.metric_with("kstall_kubelet_check_up", &[("check", check)]) == Some(1.0);
    wait_for(Duration::from_secs(60), || (checked("healthz") && checked("tls")).then_some(()))
        .unwrap_or_else(|| panic!("the kubelet checks did not pass:\n{}", agent.metrics()));
    kubelet.wedge();

    // The pod's own network namespace with the sidecar's rule, its sandbox process in it and the
    // container cgroup; its NFS client reconnecting, redirected.
    let netns = NetNs::new("dashboards");
    let _sandbox = PodProcess::start(&netns, &container.procs());
    netns.redirect_tcp("iptables", 2049, 15001);
    let reconnecting = NfsReconnects::start(&netns);
    // Its network policy drops its connects to a database: each times out.
    netns.exec("iptables", &["-A", "OUTPUT", "-p", "tcp", "--dport", "5432", "-j", "DROP"]);
    netns.run_inside(|| {
        timed_out_connects(SocketAddr::from((Ipv4Addr::LOCALHOST, 5432)), 3, Duration::from_millis(1500))
    });
    // Its namespace's connection tracking table (the sidecar's NAT rules make it track) full for a
    // moment: the limit under what it holds, a connect refused, the limit back.
    let held = held_connections(&netns, 9100, 4);
    wait_for(Duration::from_secs(30), || {
        agent.metric_with("kstall_conntrack_entries", &[("pod", POD)]).filter(|n| *n >= 4.0)
    })
    .unwrap_or_else(|| panic!("the pod's conntrack table was not read:\n{}", agent.metrics()));
    let full = Sysctl::set("net.netfilter.nf_conntrack_max", "1");
    netns.run_inside(|| {
        timed_out_connects(SocketAddr::from((Ipv4Addr::LOCALHOST, 9100)), 1, Duration::from_millis(1500))
    });
    let table_full = |i: &Value| i["signature"] == "conntrack-table-full" && i["pod"] == POD;
    let fired = agent.wait_incident(table_full, Duration::from_secs(30));
    assert!(fired.is_some(), "no conntrack-table-full: {:#?}\n{}", agent.incidents(), agent.log());
    drop((full, held));
    // A task of the pod that cannot finish its flush.
    disk.freeze();
    disk.start_writer(&container.procs());
    // Its container OOM-killed three times (a loop), the last victim named like a node daemon.
    let limit = MemoryLimit::new(&container, OOM_LIMIT);
    for comm in [None, None, Some("node_exporter")] {
        oom_kill_as(&[container.procs().as_path(), limit.procs()], comm, |_| {});
    }
    // Resets in a namespace of no pod: events kstall cannot attribute.
    let stray = NetNs::new("dashboards-stray");
    stray.run_inside(|| refused_connects(SocketAddr::from((Ipv4Addr::LOCALHOST, 2050)), 3));
    let unattributed = r#"kstall_events_unattributed_total{probe="tcp-reset"}"#;
    let counted = wait_for(Duration::from_secs(10), || agent.metric(unattributed));
    assert!(
        counted.is_some(),
        "the stray namespace's resets are not unattributed:\n{}\n{}",
        agent.metrics(),
        agent.log()
    );
    // An API client that stops reading, and enough events to fill its socket: cut off, counted.
    let stalled = stalled_client(&agent.socket);
    // 500 ports, each its own series: every reset is sent in full (no series passes its sample).
    for port in closed_low_ports(500) {
        refused_connects(SocketAddr::from((Ipv4Addr::LOCALHOST, port)), 1);
    }
    let dropped = r#"kstall_api_events_dropped_total{stream="events"}"#;
    let cut_off = wait_for(Duration::from_secs(30), || agent.metric(dropped).filter(|n| *n >= 1.0));
    assert!(cut_off.is_some(), "the stalled client's events were not dropped:\n{}", agent.metrics());
    drop(stalled);

    for signature in [
        "nfs-sidecar-redirect",
        "pod-termination-blocked",
        "container-oom-loop",
        "network-policy-drops",
        "conntrack-table-full",
    ] {
        let firing = agent.wait_incident(
            |i| i["signature"] == signature && i["state"] == "firing" && i["pod"] == POD,
            Duration::from_secs(60),
        );
        assert!(firing.is_some(), "no {signature}: {:#?}\n{}", agent.incidents(), agent.log());
    }
    let degraded = |i: &Value| i["signature"] == "kubelet-degraded" && i["state"] == "firing";
    let kubelet = agent.wait_incident(degraded, Duration::from_secs(60));
    assert!(kubelet.is_some(), "no kubelet-degraded: {:#?}\n{}", agent.incidents(), agent.log());

    // Every query, as Grafana runs it for this node, namespace and pod.
    let selection = selection();
    let (shown, mut failures) = panels.await_data(&proven_here, &selection, Duration::from_secs(60));
    failures.extend(panels.await_variables(&dashboards, &selection, Duration::from_secs(10)));
    for (query, series) in &shown {
        println!("dashboards: {query}: {}", described(series));
    }
    // Every signature a runbook link was shown for has its runbook.
    let signatures: std::collections::BTreeSet<&str> = shown
        .iter()
        .flat_map(|(_, series)| series)
        .filter_map(|s| s["metric"]["signature"].as_str())
        .collect();
    for signature in &signatures {
        if !workspace().join(format!("docs/runbooks/{signature}.md")).exists() {
            failures.push(format!(
                "signature {signature} links to docs/runbooks/{signature}.md, which is missing"
            ));
        }
    }
    let end = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs();
    for q in &listed {
        let series = panels.run(q, &selection, end).unwrap_or_else(|e| {
            failures.push(e);
            Vec::new()
        });
        let why = FED_BY_NO_SCENARIO
            .iter()
            .find(|(key, _)| q.key() == (key.0, key.1, key.2))
            .map_or("fed by the VM scenarios".to_string(), |(_, why)| format!("fed by no scenario: {why}"));
        let here = if series.is_empty() { "no data here" } else { "has data here too" };
        println!("dashboards: {}: {why} ({here})", q.name());
    }
    assert!(failures.is_empty(), "dashboards:\n{}\nagent:\n{}", failures.join("\n"), agent.log());
    println!(
        "dashboards: {} of {} queries showed data for {NAMESPACE}/{POD} on {NODE} ({} runbook links), in {:.0?}",
        proven_here.len(),
        queries.len(),
        signatures.len(),
        test_started.elapsed()
    );

    drop(reconnecting);
    disk.thaw();
    disk.wait_writers(Duration::from_secs(30));
    assert_eq!(agent.stop(), Some(0), "{}", agent.log());
}
