//! deploy/'s kustomize packages, validated offline: the base and every overlay rendered by the
//! real `kubectl kustomize`; every object checked against the Kubernetes API's schemas and the
//! Prometheus Operator's CRD models (tests/deploy/validate.py, installed into target/deploy-venv
//! on first use, run without a network); the DaemonSet still what the agent needs; the
//! PrometheusRule the rules file, accepted by promtool; both scrape paths giving job `kstall`.
//!
//! As root and in CI the tools are required: a missing one fails the test, it does not skip.

use std::{
    collections::BTreeSet,
    io::{Read as _, Write as _},
    net::{SocketAddr, TcpListener},
    path::{Path, PathBuf},
    process::Command,
    sync::OnceLock,
    time::{Duration, Instant},
};

use kstall_tests::{
    alerting,
    deploy::{
        deploy_dir, offline, relative, render, rendered_daemonset, runs_without, validate, validator_python,
        yaml_documents,
    },
};
use serde_json::{Value, json};

const OVERLAYS: [&str; 2] = ["plain-prometheus", "prometheus-operator"];
const IMAGE: &str = "localhost/kstall:0.1.0";

/// Whether kubectl (with kustomize 5) and promtool are here, and with `validator` the
/// validator's venv (installed on first use). When not: prints why and returns false, or panics
/// with that one line where the test is required.
fn can_run(test: &str, validator: bool) -> bool {
    runs_without(test, tools().err().or_else(|| if validator { validator_python().err() } else { None }))
}

fn tools() -> Result<(), String> {
    static TOOLS: OnceLock<Result<(), String>> = OnceLock::new();
    TOOLS
        .get_or_init(|| {
            let out = Command::new("kubectl")
                .args(["version", "--client", "-o", "json"])
                .output()
                .map_err(|e| format!("kubectl cannot run ({e}): it comes with the machine image"))?;
            let version: Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
            let kustomize = version["kustomizeVersion"].as_str().unwrap_or("none");
            let major: u32 =
                kustomize.trim_start_matches('v').split('.').next().and_then(|m| m.parse().ok()).unwrap_or(0);
            if major < 5 {
                return Err(format!(
                    "kubectl's kustomize is {kustomize}, not 5 or newer (components, patches)"
                ));
            }
            Command::new("promtool").arg("--version").output().map_err(|e| {
                format!("promtool cannot run ({e}): Debian package `prometheus`, from the bootstrap")
            })?;
            Ok(())
        })
        .clone()
}

/// tests/deploy/remediation-models (built on first use) on other projects' objects, as
/// [`validate`] runs validate.py.
fn validate_remediation(objects: &[(String, Value)]) -> (bool, String) {
    let here = Path::new(env!("CARGO_MANIFEST_DIR"));
    let target = here.join("../target/remediation-models");
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let built = Command::new(cargo)
        .args(["build", "--quiet", "--manifest-path"])
        .arg(here.join("deploy/remediation-models/Cargo.toml"))
        .arg("--target-dir")
        .arg(&target)
        .status()
        .expect("cargo build");
    assert!(built.success(), "building tests/deploy/remediation-models failed: {built}");
    offline(&target.join("debug/kstall-remediation-models"), &[], objects)
}

/// The base and every overlay, as (name, directory).
fn packages() -> Vec<(String, PathBuf)> {
    let mut overlays = subdirectories(&deploy_dir().join("overlays"));
    overlays.sort();
    let named = overlays
        .into_iter()
        .map(|dir| (format!("overlays/{}", dir.file_name().unwrap().to_string_lossy()), dir));
    std::iter::once(("base".to_string(), deploy_dir().join("base"))).chain(named).collect()
}

fn subdirectories(dir: &Path) -> Vec<PathBuf> {
    let entries = std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    entries.map(|e| e.unwrap().path()).filter(|p| p.is_dir()).collect()
}

/// The components a kustomization uses, as canonical paths.
fn components_of(dir: &Path) -> Vec<PathBuf> {
    let text = std::fs::read_to_string(dir.join("kustomization.yaml")).unwrap();
    let kustomization = yaml_documents(&text).remove(0);
    let components = kustomization["components"].as_array().cloned().unwrap_or_default();
    components.iter().map(|c| dir.join(c.as_str().unwrap()).canonicalize().unwrap()).collect()
}

/// The one object of `kind` among `objects`.
fn one<'a>(objects: &'a [Value], kind: &str) -> &'a Value {
    let found: Vec<&Value> = objects.iter().filter(|o| o["kind"] == kind).collect();
    assert_eq!(found.len(), 1, "one {kind} expected, rendered {}", found.len());
    found[0]
}

/// Whether every key of the map `want` has the same value in the map `have`.
fn subset(want: &Value, have: &Value) -> bool {
    want.as_object().is_some_and(|want| want.iter().all(|(k, v)| have.get(k) == Some(v)))
}

fn promtool(args: &[&str], file: &Path) -> String {
    let out = Command::new("promtool").args(args).arg(file).output().expect("promtool");
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success() && text.contains("SUCCESS"), "promtool {args:?}:\n{text}");
    text
}

#[test]
fn every_package_renders_and_every_object_validates_offline() {
    if !can_run("every_package_renders_and_every_object_validates_offline", true) {
        return;
    }
    let packages = packages();
    for overlay in OVERLAYS {
        assert!(
            packages.iter().any(|(name, _)| *name == format!("overlays/{overlay}")),
            "no overlay {overlay}"
        );
    }
    // A component is validated through the overlays that use it: each must be in one.
    let used: BTreeSet<PathBuf> = packages.iter().flat_map(|(_, dir)| components_of(dir)).collect();
    for component in
        subdirectories(&deploy_dir().join("components")).into_iter().chain([deploy_dir().join("grafana")])
    {
        assert!(
            used.contains(&component.canonicalize().unwrap()),
            "{} is in no overlay",
            component.display()
        );
    }
    let objects: Vec<(String, Value)> =
        packages.iter().flat_map(|(name, dir)| render(dir).into_iter().map(|o| (name.clone(), o))).collect();
    let started = Instant::now();
    let (valid, report) = validate(&objects);
    assert!(valid, "invalid objects:\n{report}");
    let ok = report.lines().filter(|l| l.starts_with("ok ")).count();
    assert_eq!(ok, objects.len(), "one ok per object:\n{report}");
    println!("{report}validated {ok} objects in {:.1} s", started.elapsed().as_secs_f64());
}

/// deploy/remediation: a medik8s NodeHealthCheck on kstall's conditions and a descheduler policy
/// on its taints, for users who run those. Each validated offline by its own project's model (the
/// descheduler's in a ConfigMap, validated as Kubernetes' own kind), naming only conditions kstall
/// writes; a wrong field or a wrong rule in either is refused.
#[test]
fn the_remediation_examples_validate_offline_and_watch_what_kstall_writes() {
    if !can_run("the_remediation_examples_validate_offline_and_watch_what_kstall_writes", true) {
        return;
    }
    let dir = deploy_dir().join("remediation");
    let read = |file: &str| yaml_documents(&std::fs::read_to_string(dir.join(file)).unwrap()).remove(0);
    let (check, config_map) = (read("nodehealthcheck.yaml"), read("descheduler-policy.yaml"));
    let policy = yaml_documents(config_map["data"]["policy.yaml"].as_str().expect("policy.yaml")).remove(0);
    let (valid, report) = validate(&[("remediation/descheduler-policy.yaml".into(), config_map)]);
    assert!(valid && report.starts_with("ok "), "{report}");
    let objects = [
        ("remediation/nodehealthcheck.yaml".to_string(), check.clone()),
        ("remediation/descheduler-policy.yaml policy.yaml".to_string(), policy.clone()),
    ];
    let (valid, report) = validate_remediation(&objects);
    assert!(valid, "invalid examples:\n{report}");
    assert_eq!(report.lines().filter(|l| l.starts_with("ok ")).count(), 2, "{report}");
    println!("{report}");

    // The conditions it watches besides the kubelet's Ready are kstall's.
    let component =
        std::fs::read_to_string(deploy_dir().join("components/node-conditions/kustomization.yaml"));
    let component = component.unwrap();
    let written: BTreeSet<&str> = component
        .lines()
        .find_map(|l| l.trim().strip_prefix("value: --node-conditions="))
        .expect("the component's --node-conditions")
        .split(',')
        .collect();
    let watched = check["spec"]["unhealthyConditions"].as_array().unwrap();
    for condition in watched.iter().filter(|c| c["type"] != "Ready") {
        assert!(written.contains(condition["type"].as_str().unwrap()), "kstall writes no {condition}");
        assert_eq!(condition["status"], "True", "kstall's conditions are True while they fire: {condition}");
    }

    // Wrong in each model's way: refused, with the reason.
    let mut misspelt = check;
    misspelt["spec"]["minHealty"] = json!("80%");
    let mut both = policy.clone();
    both["profiles"][0]["pluginConfig"][0]["args"]["excludedTaints"] = json!(["example.com/x"]);
    let mut elsewhere = policy;
    elsewhere["profiles"][0]["plugins"] = json!({"balance": {"enabled": ["RemovePodsViolatingNodeTaints"]}});
    let wrong =
        [("misspelt", misspelt), ("both", both), ("elsewhere", elsewhere)].map(|(n, o)| (n.to_string(), o));
    let (valid, report) = validate_remediation(&wrong);
    assert!(!valid, "{report}");
    for reason in ["minHealty: unknown field", "either includedTaints or excludedTaints", "deschedule plugin"]
    {
        assert!(report.lines().any(|l| l.starts_with("FAIL ") && l.contains(reason)), "{reason}:\n{report}");
    }
}

#[test]
fn the_validator_rejects_what_the_api_server_would() {
    if !can_run("the_validator_rejects_what_the_api_server_would", true) {
        return;
    }
    let monitor = |spec: Value| {
        json!({"apiVersion": "monitoring.coreos.com/v1", "kind": "ServiceMonitor", "metadata": {"name": "m"},
            "spec": spec})
    };
    let cases = [
        (
            json!({"apiVersion": "apps/v1", "kind": "DaemonSet", "metadata": {"name": "d"}, "spec": {
                "selector": {}, "template": {"spec": {"hostPid": true, "containers": [{"name": "c"}]}}}}),
            "'hostPid' was unexpected",
        ),
        (
            json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "s"},
                "spec": {"ports": [{"port": "metrics"}]}}),
            "is not of type 'integer'",
        ),
        (
            monitor(json!({"jobLabels": "x", "selector": {}, "endpoints": [{"port": "m"}]})),
            "spec.jobLabels: unknown field",
        ),
        (
            monitor(json!({"selector": {}, "endpoints": [{"port": "m", "scheme": "ftp"}]})),
            "'http' or 'https'",
        ),
        (monitor(json!({"selector": {}})), "spec.endpoints Field required"),
        (
            monitor(json!({"selector": {}, "endpoints": [{"port": "m", "relabelings": [{"action": "x"}]}]})),
            "relabelings.0.action Input should be",
        ),
        (
            json!({"apiVersion": "monitoring.coreos.com/v1", "kind": "PrometheusRule",
                "metadata": {"name": "r"}, "spec": {"groups": [{"name": "g",
                    "rules": [{"alert": "A", "expr": "up", "for": "5 minutes"}]}]}}),
            "rules.0.for String should match pattern",
        ),
        (
            json!({"apiVersion": "monitoring.coreos.com/v1", "kind": "Podmonitor", "metadata": {}}),
            "no schema",
        ),
        (
            json!({"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w"}}),
            "find schema for kind Widget",
        ),
    ];
    let objects: Vec<(String, Value)> =
        cases.iter().map(|(object, _)| ("case".to_string(), object.clone())).collect();
    let (valid, report) = validate(&objects);
    assert!(!valid, "all passed:\n{report}");
    let lines: Vec<&str> = report.lines().collect();
    assert_eq!(lines.len(), cases.len(), "{report}");
    for ((_, why), line) in cases.iter().zip(lines) {
        assert!(
            line.starts_with("FAIL ") && line.contains(why),
            "expected a failure for {why:?}, got: {line}"
        );
    }
}

#[test]
fn the_daemonset_keeps_what_the_agent_needs() {
    if !can_run("the_daemonset_keeps_what_the_agent_needs", false) {
        return;
    }
    let base =
        yaml_documents(&std::fs::read_to_string(deploy_dir().join("base/daemonset.yaml")).unwrap()).remove(0);
    let scrape_annotations = deploy_dir().join("components/scrape-annotations").canonicalize().unwrap();
    let non_root_component = deploy_dir().join("components/non-root").canonicalize().unwrap();
    let node_conditions = deploy_dir().join("components/node-conditions").canonicalize().unwrap();
    let node_taints = deploy_dir().join("components/node-taints").canonicalize().unwrap();
    let old_kernels_component = deploy_dir().join("components/kernels-before-5.11").canonicalize().unwrap();
    let pod_rules_component = deploy_dir().join("components/pod-rules").canonicalize().unwrap();
    let capture_component = deploy_dir().join("components/capture").canonicalize().unwrap();
    for (name, dir) in packages() {
        // deploy/components/non-root changes the user, the capabilities and the socket's volume
        // (tests/tests/container.rs proves it runs).
        let non_root = components_of(&dir).contains(&non_root_component);
        let objects = render(&dir);
        let daemonset = one(&objects, "DaemonSet");
        let namespace = &daemonset["metadata"]["namespace"];
        // Where deploy/kubectl-kstall looks for the agents.
        assert_eq!(namespace, "kstall", "{name}");
        assert_eq!(
            daemonset["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/name"], "kstall",
            "{name}"
        );
        let pod = &daemonset["spec"]["template"]["spec"];
        // The host's /proc (pods' processes, their network namespaces) and network namespace.
        assert_eq!(pod["hostPID"], true, "{name}: hostPID");
        assert_eq!(pod["hostNetwork"], true, "{name}: hostNetwork");
        assert_eq!(pod["dnsPolicy"], "ClusterFirstWithHostNet", "{name}: dnsPolicy");
        let containers = pod["containers"].as_array().unwrap();
        assert_eq!(containers.len(), 1, "{name}: one container");
        let agent = &containers[0];
        assert_eq!(agent["image"], IMAGE, "{name}: the image `cargo xtask image` builds");
        let args: Vec<&str> = agent["args"].as_array().unwrap().iter().filter_map(Value::as_str).collect();
        for arg in ["agent", "--listen=0.0.0.0:9700", "--pod-metadata=api"] {
            assert!(args.contains(&arg), "{name}: argument {arg} in {args:?}");
        }
        // The API source watches this node's pods only: its name from the downward API.
        let node_name = agent["env"].as_array().unwrap().iter().find(|e| e["name"] == "NODE_NAME");
        assert_eq!(
            node_name.map(|e| &e["valueFrom"]["fieldRef"]["fieldPath"]),
            Some(&json!("spec.nodeName")),
            "{name}"
        );
        let mounted = [
            ("/sys/kernel/btf", true),
            ("/sys/fs/cgroup", true),
            ("/run/kstall", false),
            ("/var/lib/kstall", false),
        ];
        for (path, read_only) in mounted {
            let mounts = agent["volumeMounts"].as_array().unwrap();
            let mount =
                mounts.iter().find(|m| m["mountPath"] == path).unwrap_or_else(|| panic!("{name}: no {path}"));
            assert_eq!(mount["readOnly"].as_bool().unwrap_or(false), read_only, "{name}: {path} read-only");
            let volume =
                pod["volumes"].as_array().unwrap().iter().find(|v| v["name"] == mount["name"]).unwrap();
            if non_root && path.ends_with("/kstall") {
                assert_eq!(
                    volume["emptyDir"],
                    json!({}),
                    "{name}: the non-root agent's socket and history are in the pod"
                );
            } else {
                assert_eq!(volume["hostPath"]["path"], path, "{name}: {path} is the host's");
            }
        }
        // The node's port 9700 (hostNetwork: a hostPort, if given, must be the same).
        let port = &agent["ports"][0];
        assert_eq!((&port["name"], &port["containerPort"]), (&json!("metrics"), &json!(9700)), "{name}");
        assert!(port["hostPort"].is_null() || port["hostPort"] == 9700, "{name}: {port}");
        assert_eq!(agent["readinessProbe"]["httpGet"]["path"], "/healthz", "{name}");
        // No overlay or component but non-root, kernels-before-5.11, pod-rules and capture touches
        // the capabilities: deploy/base/daemonset.yaml has them; kernels-before-5.11 adds
        // SYS_RESOURCE to them and nothing else, pod-rules SYS_ADMIN and NET_ADMIN, capture
        // exactly those and NET_RAW (root only: none is with non-root; capture is a superset of
        // pod-rules, so not with it).
        let security = &agent["securityContext"];
        let old_kernels = components_of(&dir).contains(&old_kernels_component);
        let pod_rules = components_of(&dir).contains(&pod_rules_component);
        let capture = components_of(&dir).contains(&capture_component);
        assert!(
            !(non_root && (old_kernels || pod_rules || capture)),
            "{name}: a root-only component with non-root"
        );
        assert!(!(pod_rules && capture), "{name}: capture grants what pod-rules does: one of the two");
        if old_kernels || pod_rules || capture {
            let mut expected = base["spec"]["template"]["spec"]["containers"][0]["securityContext"].clone();
            let add = expected["capabilities"]["add"].as_array_mut().unwrap();
            if old_kernels {
                add.push(json!("SYS_RESOURCE"));
            }
            if pod_rules {
                add.extend([json!("SYS_ADMIN"), json!("NET_ADMIN")]);
            }
            if capture {
                add.extend([json!("SYS_ADMIN"), json!("NET_ADMIN"), json!("NET_RAW")]);
            }
            assert_eq!(security, &expected, "{name}");
        } else if non_root {
            assert_eq!(
                (&security["runAsUser"], &security["runAsNonRoot"]),
                (&json!(65534), &json!(true)),
                "{name}"
            );
        } else {
            assert_eq!(
                security, &base["spec"]["template"]["spec"]["containers"][0]["securityContext"],
                "{name}"
            );
        }
        assert!(
            security["capabilities"]["add"].as_array().unwrap().contains(&json!("BPF")),
            "{name}: CAP_BPF"
        );
        let account = &pod["serviceAccountName"];
        let sa = one(&objects, "ServiceAccount");
        assert_eq!((&sa["metadata"]["name"], &sa["metadata"]["namespace"]), (account, namespace), "{name}");
        // Its service account is bound to kstall's role: pods read, Events created and patched
        // (deploy/README.md says why), nothing more; and with deploy/components/node-conditions
        // to a second role that patches Node status, and the flag that turns the conditions on.
        let with_conditions = components_of(&dir).contains(&node_conditions);
        let mut expected = vec![(
            "kstall",
            json!([
                {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]},
                {"apiGroups": ["events.k8s.io"], "resources": ["events"], "verbs": ["create", "patch"]},
            ]),
        )];
        if with_conditions {
            let rules = json!([{"apiGroups": [""], "resources": ["nodes/status"], "verbs": ["patch"]}]);
            expected.push(("kstall-node-conditions", rules));
        }
        // deploy/components/node-taints: a third that reads and patches Nodes, and its flag.
        let with_taints = components_of(&dir).contains(&node_taints);
        if with_taints {
            let rules = json!([{"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "patch"]}]);
            expected.push(("kstall-node-taints", rules));
        }
        let of_kind = |kind: &'static str| objects.iter().filter(move |o| o["kind"] == kind);
        assert_eq!(of_kind("ClusterRole").count(), expected.len(), "{name}");
        assert_eq!(of_kind("ClusterRoleBinding").count(), expected.len(), "{name}");
        let subject = json!({"kind": "ServiceAccount", "name": account, "namespace": namespace});
        for (role_name, rules) in expected {
            let role = of_kind("ClusterRole").find(|r| r["metadata"]["name"] == role_name);
            let role = role.unwrap_or_else(|| panic!("{name}: no ClusterRole {role_name}"));
            assert_eq!(role["rules"], rules, "{name}: {role_name}");
            let bound = of_kind("ClusterRoleBinding").any(|b| {
                b["roleRef"]["name"] == role_name && b["subjects"].as_array().unwrap().contains(&subject)
            });
            assert!(bound, "{name}: {role_name} is not bound to the agent's service account");
        }
        let flag = "--node-conditions=NFSClientStalled,KernelSystemOOM,KubeletDegraded,CPUSoftLockup,ConntrackTableFull";
        assert_eq!(args.contains(&flag), with_conditions, "{name}: {args:?}");
        let flag =
            "--node-taints=NFSClientStalled,KernelSystemOOM,KubeletDegraded,CPUSoftLockup,ConntrackTableFull";
        assert_eq!(args.contains(&flag), with_taints, "{name}: {args:?}");
        // The prometheus.io annotations come with their component only.
        let annotations = &daemonset["spec"]["template"]["metadata"]["annotations"];
        if components_of(&dir).contains(&scrape_annotations) {
            assert!(
                subset(&json!({"prometheus.io/scrape": "true", "prometheus.io/port": "9700"}), annotations),
                "{name}"
            );
        } else {
            assert!(annotations.get("prometheus.io/scrape").is_none(), "{name}: {annotations}");
        }
    }
}

#[test]
fn the_prometheus_rule_is_the_rules_file_and_promtool_accepts_it() {
    if !can_run("the_prometheus_rule_is_the_rules_file_and_promtool_accepts_it", false) {
        return;
    }
    let objects = render(&deploy_dir().join("overlays/prometheus-operator"));
    let rule = one(&objects, "PrometheusRule");
    let rules =
        yaml_documents(&std::fs::read_to_string(deploy_dir().join("prometheus/kstall-rules.yaml")).unwrap());
    // xtask's unit test compares the committed file's text; this, what kustomize made of it.
    assert!(
        rule["spec"] == rules[0],
        "the PrometheusRule's spec is not kstall-rules.yaml: run `cargo xtask deploy`"
    );
    let committed =
        std::fs::read_to_string(deploy_dir().join("components/prometheus-operator/prometheusrule.yaml"));
    let header = "# Generated from deploy/prometheus/kstall-rules.yaml by `cargo xtask deploy`; do not edit";
    assert!(committed.unwrap().starts_with(header), "the generated file says so");
    // What Prometheus gets from the operator: the spec as a rules file (JSON is YAML).
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("rules.yaml");
    std::fs::write(&file, rule["spec"].to_string()).unwrap();
    let checked = promtool(&["check", "rules"], &file);
    let alerts = rules[0]["groups"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| g["rules"].as_array().unwrap().len())
        .sum::<usize>();
    assert!(checked.contains(&format!("{alerts} rules found")), "{checked}");
}

#[test]
fn the_service_monitor_scrapes_every_agent_as_job_kstall() {
    if !can_run("the_service_monitor_scrapes_every_agent_as_job_kstall", false) {
        return;
    }
    let objects = render(&deploy_dir().join("overlays/prometheus-operator"));
    let (monitor, service, daemonset) =
        (one(&objects, "ServiceMonitor"), one(&objects, "Service"), one(&objects, "DaemonSet"));
    // Without a namespaceSelector it selects Services of its own namespace.
    assert!(monitor["spec"]["namespaceSelector"].is_null());
    assert_eq!(monitor["metadata"]["namespace"], service["metadata"]["namespace"]);
    assert!(
        subset(&monitor["spec"]["selector"]["matchLabels"], &service["metadata"]["labels"]),
        "{monitor}\n{service}"
    );
    assert!(monitor["spec"]["selector"]["matchExpressions"].is_null());
    // Headless: its endpoints are the agents themselves, one target each.
    assert_eq!(service["spec"]["clusterIP"], "None");
    assert!(
        subset(&service["spec"]["selector"], &daemonset["spec"]["template"]["metadata"]["labels"]),
        "{service}"
    );
    let endpoints = monitor["spec"]["endpoints"].as_array().unwrap();
    assert_eq!(endpoints.len(), 1);
    let endpoint = &endpoints[0];
    let ports = service["spec"]["ports"].as_array().unwrap();
    let port = ports.iter().find(|p| p["name"] == endpoint["port"]).unwrap_or_else(|| panic!("{service}"));
    let agent_ports = daemonset["spec"]["template"]["spec"]["containers"][0]["ports"].as_array().unwrap();
    let target =
        agent_ports.iter().find(|p| p["name"] == port["targetPort"]).unwrap_or_else(|| panic!("{port}"));
    assert_eq!(target["containerPort"], 9700);
    assert_eq!(endpoint["path"], "/metrics");
    // The operator's rule: job is the Service's label named by jobLabel, else the Service's name.
    let job = monitor["spec"]["jobLabel"]
        .as_str()
        .and_then(|label| service["metadata"]["labels"][label].as_str())
        .or(service["metadata"]["name"].as_str());
    assert_eq!(job, Some("kstall"), "KstallAgentDown expects up{{job=\"kstall\"}}");
    // The agent's own namespace and pod as target labels would rename its metrics' labels.
    let dropped =
        endpoint["relabelings"].as_array().unwrap().iter().find(|r| r["action"] == "labeldrop").unwrap();
    let dropped: Vec<&str> = dropped["regex"].as_str().unwrap().split('|').collect();
    assert!(dropped.contains(&"namespace") && dropped.contains(&"pod"), "{dropped:?}");
    assert!(
        !dropped.contains(&"job") && !dropped.contains(&"instance") && !dropped.contains(&"node"),
        "{dropped:?}"
    );
    // Every series labelled with its node (the dashboards' filter), an incident's own kept.
    assert_eq!(endpoint["honorLabels"], true);
    let node = json!({"sourceLabels": ["__meta_kubernetes_pod_node_name"], "targetLabel": "node"});
    assert!(endpoint["relabelings"].as_array().unwrap().contains(&node), "{endpoint}");
}

/// What Kubernetes' pod discovery gives a pod of `template` at `ip` on node `node` for its port
/// 9700: the `__meta_kubernetes_pod_*` labels (names sanitized as Prometheus does) of a target.
fn discovered(template: &Value, ip: &str, node: &str) -> Value {
    let sanitized = |name: &str| {
        name.chars().map(|c| if c.is_ascii_alphanumeric() { c } else { '_' }).collect::<String>()
    };
    let mut labels = json!({
        "__meta_kubernetes_namespace": "kstall",
        "__meta_kubernetes_pod_ip": ip,
        "__meta_kubernetes_pod_node_name": node,
    });
    for (kind, map) in
        [("label", &template["metadata"]["labels"]), ("annotation", &template["metadata"]["annotations"])]
    {
        for (name, value) in map.as_object().into_iter().flatten() {
            labels[format!("__meta_kubernetes_pod_{kind}_{}", sanitized(name))] = value.clone();
        }
    }
    json!({"targets": [format!("{ip}:9700")], "labels": labels})
}

/// A stand-in agent on a free local port, answering every request with `metrics` (for the life of
/// the test process).
fn serve_metrics(metrics: &'static str) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").expect("a free port");
    let addr = listener.local_addr().expect("its address");
    std::thread::spawn(move || {
        for mut stream in listener.incoming().flatten() {
            let mut request = [0; 4096];
            let _ = stream.read(&mut request);
            let _ = write!(stream, "HTTP/1.0 200 OK\r\nContent-Type: text/plain\r\n\r\n{metrics}");
        }
    });
    addr
}

#[test]
fn the_plain_prometheus_scrape_config_keeps_the_annotated_agents_as_job_kstall() {
    if !can_run("the_plain_prometheus_scrape_config_keeps_the_annotated_agents_as_job_kstall", false) {
        return;
    }
    let config =
        yaml_documents(&std::fs::read_to_string(deploy_dir().join("prometheus/scrape-config.yaml")).unwrap());
    let jobs = config[0]["scrape_configs"].as_array().unwrap();
    assert_eq!(jobs.len(), 1);
    let mut job = jobs[0].clone();
    assert_eq!(job["job_name"], "kstall");
    assert_eq!(job["kubernetes_sd_configs"], json!([{"role": "pod", "namespaces": {"names": ["kstall"]}}]));
    // Debian's Prometheus has no Kubernetes discovery: the job's relabeling runs on static targets
    // labelled as the discovery labels the plain-prometheus agent (its port annotation pointed at
    // a stand-in agent) and an unannotated one.
    let agent = serve_metrics(
        "kstall_build_info{version=\"0.1.0\"} 1\n\
         kstall_incident_active{signature=\"system-oom\",severity=\"critical\",node=\"node-b\",\
         namespace=\"\",pod=\"\"} 1\n",
    );
    let mut annotated = rendered_daemonset("plain-prometheus")["spec"]["template"].clone();
    annotated["metadata"]["annotations"]["prometheus.io/port"] = json!(agent.port().to_string());
    let unannotated = rendered_daemonset("prometheus-operator")["spec"]["template"].clone();
    job.as_object_mut().unwrap().remove("kubernetes_sd_configs");
    job["static_configs"] = json!([
        discovered(&annotated, "127.0.0.1", "node-a"),
        discovered(&unannotated, "127.0.0.2", "node-c")
    ]);
    let config = json!({"global": {"scrape_interval": "1s"}, "scrape_configs": [job]}).to_string();
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("prometheus.yml"), &config).unwrap();
    promtool(&["check", "config"], &dir.path().join("prometheus.yml"));
    let prometheus = alerting::prometheus_with_config(config);
    let deadline = Instant::now() + Duration::from_secs(30);
    let series = |metric: &str| {
        prometheus.get_json(&format!("/api/v1/query?query={metric}"))["data"]["result"].clone()
    };
    let (build, incident) = loop {
        let (build, incident) = (series("kstall_build_info"), series("kstall_incident_active"));
        if build.as_array().is_some_and(|r| !r.is_empty())
            && incident.as_array().is_some_and(|r| !r.is_empty())
        {
            break (build, incident);
        }
        assert!(Instant::now() < deadline, "nothing scraped after 30 s:\n{}", prometheus.log());
        std::thread::sleep(Duration::from_millis(200));
    };
    let targets = prometheus.get_json("/api/v1/targets")["data"].clone();
    assert_eq!(
        targets["activeTargets"].as_array().map(Vec::len),
        Some(1),
        "only the annotated agent: {targets}"
    );
    assert_eq!(targets["droppedTargets"].as_array().map(Vec::len), Some(1), "{targets}");
    // Job kstall, the agent's address, its node as `node` — and an incident's own labels kept.
    let instance = agent.to_string();
    let expected = json!({"__name__": "kstall_build_info", "instance": instance, "job": "kstall",
        "node": "node-a", "version": "0.1.0"});
    assert_eq!(build[0]["metric"], expected);
    let expected = json!({"__name__": "kstall_incident_active", "instance": instance, "job": "kstall",
        "node": "node-b", "signature": "system-oom", "severity": "critical"});
    assert_eq!(incident[0]["metric"], expected);
}

#[test]
fn each_grafana_dashboard_is_a_configmap_for_the_sidecar() {
    if !can_run("each_grafana_dashboard_is_a_configmap_for_the_sidecar", false) {
        return;
    }
    let grafana = deploy_dir().join("grafana");
    let mut dashboards: Vec<PathBuf> = std::fs::read_dir(&grafana)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
        .collect();
    dashboards.sort();
    let objects = render(&deploy_dir().join("overlays/prometheus-operator"));
    let maps: Vec<&Value> = objects
        .iter()
        .filter(|o| o["kind"] == "ConfigMap" && o["metadata"]["labels"]["grafana_dashboard"] == "1")
        .collect();
    assert_eq!(
        maps.len(),
        dashboards.len(),
        "one ConfigMap per deploy/grafana/*.json: run `cargo xtask deploy`"
    );
    for path in &dashboards {
        let file = path.file_name().unwrap().to_string_lossy();
        let text = std::fs::read_to_string(path).unwrap();
        serde_json::from_str::<Value>(&text).unwrap_or_else(|e| panic!("{file} is not JSON: {e}"));
        let map = maps
            .iter()
            .find(|m| m["data"].get(file.as_ref()).is_some())
            .unwrap_or_else(|| panic!("no {file}"));
        assert_eq!(map["data"][file.as_ref()], text.as_str(), "{file}: as it is");
        assert_eq!(map["metadata"]["namespace"], "kstall");
        // `kubectl apply` (client side) keeps the whole object in an annotation of at most 256 KiB.
        let size = map.to_string().len();
        assert!(size < 262_144, "{file}: its ConfigMap is {size} bytes, too big for `kubectl apply -k`");
    }
    if dashboards.is_empty() {
        println!("no dashboards in deploy/grafana yet");
    }
}

#[test]
fn an_overlay_of_yours_moves_the_image_and_the_namespace() {
    if !can_run("an_overlay_of_yours_moves_the_image_and_the_namespace", false) {
        return;
    }
    // As deploy/README.md says: the image by the name the base gave it, every object's namespace.
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let overlay = relative(dir.path(), &deploy_dir().join("overlays/prometheus-operator"));
    std::fs::write(
        dir.path().join("kustomization.yaml"),
        format!(
            "resources: [{}]\nnamespace: monitoring\n\
             images: [{{name: localhost/kstall, newName: registry.example.com/kstall, newTag: \"1.2.3\"}}]\n",
            overlay.display()
        ),
    )
    .unwrap();
    let objects = render(dir.path());
    let daemonset = one(&objects, "DaemonSet");
    assert_eq!(
        daemonset["spec"]["template"]["spec"]["containers"][0]["image"],
        "registry.example.com/kstall:1.2.3"
    );
    assert_eq!(one(&objects, "Namespace")["metadata"]["name"], "monitoring");
    assert_eq!(one(&objects, "ClusterRoleBinding")["subjects"][0]["namespace"], "monitoring");
    for object in objects.iter().filter(|o| {
        !["Namespace", "ClusterRole", "ClusterRoleBinding"].contains(&o["kind"].as_str().unwrap())
    }) {
        assert_eq!(object["metadata"]["namespace"], "monitoring", "{}", object["kind"]);
    }
}
