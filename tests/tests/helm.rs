//! The Helm chart (deploy/helm/kstall), offline, with the pinned helm and kubectl of target/tools
//! (`cargo xtask bootstrap`):
//!
//! - the kustomize packages are the source of truth: for deploy/base and every overlay,
//!   `helm template` with the overlay's values (deploy/helm/values/<overlay>.yaml) renders the same
//!   objects as `kubectl kustomize`, object by object — the one difference the Namespace, which
//!   `helm install --create-namespace` makes;
//! - `helm lint --strict` with every values file; every object of every combination the tests
//!   render validated as tests/tests/deploy.rs validates the packages (tests/deploy/validate.py);
//! - each value reaches the objects it is for; values.schema.json refuses an unknown key at every
//!   level and a value of the wrong type, helm's error naming it; the agent's settings file is
//!   the agent's keys, read by the agent itself, and a change of it rolls the agents;
//! - the `helm test` pod asks an agent for /healthz and its probes.
//!
//! As root and in CI the tools are required: a missing one fails the test, it does not skip.

use std::{
    collections::{BTreeMap, BTreeSet},
    path::{Path, PathBuf},
    process::Command,
};

use kstall_tests::{
    agent::agent_binary,
    deploy::{deploy_dir, required, runs_without, validate, validator_python, yaml_documents},
    helm::{self, NAMESPACE},
};
use serde_json::{Value, json};

/// Whether the pinned tools (and with `validator` the validator's venv) are here. When not: prints
/// why and returns false, or panics with that one line where the test is required.
fn can_run(test: &str, validator: bool) -> bool {
    runs_without(
        test,
        helm::tools_missing().or_else(|| if validator { validator_python().err() } else { None }),
    )
}

/// The agent binary, or why not (it is built by `cargo xtask test`); a panic where required.
fn agent(test: &str) -> Option<PathBuf> {
    let binary = agent_binary();
    if binary.exists() {
        return Some(binary);
    }
    let why = format!("no agent binary at {} (cargo xtask build)", binary.display());
    assert!(!required(), "{test}: required here, but {why}");
    println!("skipping {test}'s agent checks: {why}");
    None
}

/// deploy/base and each overlay: (name, the chart's values file for it, the kustomize directory).
/// Every overlay must have its values file, and every values file its overlay.
fn overlays() -> Vec<(String, Option<PathBuf>, PathBuf)> {
    let mut found = vec![("base".to_string(), None, deploy_dir().join("base"))];
    let mut names: Vec<String> = std::fs::read_dir(deploy_dir().join("overlays"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    for name in &names {
        let values = helm::overlay_values_dir().join(format!("{name}.yaml"));
        assert!(
            values.is_file(),
            "deploy/overlays/{name} has no deploy/helm/values/{name}.yaml: the chart must render it too"
        );
        found.push((name.clone(), Some(values), deploy_dir().join("overlays").join(name)));
    }
    for file in yaml_files(&helm::overlay_values_dir()) {
        let stem = file.file_stem().unwrap().to_string_lossy().into_owned();
        assert!(names.contains(&stem), "{} is no overlay's", file.display());
    }
    found
}

/// The values files of the tests' own combinations (tests/deploy/helm).
fn test_values() -> Vec<PathBuf> {
    yaml_files(&Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/helm"))
}

fn yaml_files(dir: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    files.sort();
    files
}

fn path_str(path: &Path) -> &str {
    path.to_str().expect("a UTF-8 path")
}

/// `helm template` with `args`; panics with helm's error.
fn template(args: &[&str]) -> Vec<Value> {
    helm::template(args).unwrap_or_else(|e| panic!("helm template {args:?}: {e}"))
}

/// `helm template`'s refusal of `args`; panics when it renders.
fn refusal(args: &[&str]) -> String {
    match helm::template(args) {
        Ok(_) => panic!("helm template {args:?} rendered; it must refuse"),
        Err(e) => e,
    }
}

/// An object's identity: apiVersion, kind, namespace, name.
fn identity(object: &Value) -> String {
    let text = |v: &Value| v.as_str().unwrap_or("").to_string();
    format!(
        "{} {} {}/{}",
        text(&object["apiVersion"]),
        text(&object["kind"]),
        text(&object["metadata"]["namespace"]),
        text(&object["metadata"]["name"])
    )
}

fn by_identity(objects: Vec<Value>) -> BTreeMap<String, Value> {
    let mut map = BTreeMap::new();
    for object in objects {
        let id = identity(&object);
        assert!(map.insert(id.clone(), object).is_none(), "{id} twice");
    }
    map
}

/// Where `a` and `b` differ, as paths with both values.
fn differences(path: &str, a: &Value, b: &Value) -> Vec<String> {
    match (a, b) {
        (Value::Object(x), Value::Object(y)) => {
            let keys: BTreeSet<&String> = x.keys().chain(y.keys()).collect();
            keys.into_iter()
                .flat_map(|k| {
                    differences(
                        &format!("{path}.{k}"),
                        x.get(k).unwrap_or(&Value::Null),
                        y.get(k).unwrap_or(&Value::Null),
                    )
                })
                .collect()
        }
        (Value::Array(x), Value::Array(y)) if x.len() == y.len() => x
            .iter()
            .zip(y)
            .enumerate()
            .flat_map(|(i, (a, b))| differences(&format!("{path}[{i}]"), a, b))
            .collect(),
        _ if a == b => Vec::new(),
        _ => vec![format!("{path}: kustomize {a}, helm {b}")],
    }
}

/// The one object of `kind` among `objects`.
fn one<'a>(objects: &'a [Value], kind: &str) -> &'a Value {
    let found: Vec<&Value> = objects.iter().filter(|o| o["kind"] == kind).collect();
    assert_eq!(found.len(), 1, "one {kind} expected, rendered {}", found.len());
    found[0]
}

fn strings(value: &Value) -> Vec<&str> {
    value.as_array().map(|a| a.iter().filter_map(Value::as_str).collect()).unwrap_or_default()
}

#[test]
fn each_overlay_is_the_chart_with_its_values_object_by_object() {
    if !can_run("each_overlay_is_the_chart_with_its_values_object_by_object", false) {
        return;
    }
    for (name, values, dir) in overlays() {
        let mut kustomized = by_identity(helm::kustomize(&dir));
        // `helm install --create-namespace` makes the namespace: the chart has no Namespace. Its
        // Pod Security level is the one thing it carries, labelled by hand with Helm.
        let namespace = kustomized.remove(&format!("v1 Namespace /{NAMESPACE}"));
        let privileged: serde_json::Map<String, Value> = ["enforce", "warn", "audit"]
            .iter()
            .map(|mode| (format!("pod-security.kubernetes.io/{mode}"), json!("privileged")))
            .collect();
        assert_eq!(
            namespace,
            Some(
                json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE, "labels": privileged}})
            ),
            "{name}: the Namespace is the one difference, and has nothing more to lose"
        );
        let mut args = vec!["--skip-tests"];
        if let Some(values) = &values {
            args.extend(["-f", path_str(values)]);
        }
        let charted = by_identity(template(&args));
        let (only_kustomize, only_helm): (Vec<&String>, Vec<&String>) = (
            kustomized.keys().filter(|k| !charted.contains_key(*k)).collect(),
            charted.keys().filter(|k| !kustomized.contains_key(*k)).collect(),
        );
        assert!(
            only_kustomize.is_empty() && only_helm.is_empty(),
            "{name}: only kustomize renders {only_kustomize:?}; only the chart {only_helm:?}"
        );
        for (id, object) in &kustomized {
            let found = differences("", object, &charted[id]);
            assert!(found.is_empty(), "{name}: {id} differs:\n{}", found.join("\n"));
        }
        println!("{name}: {} objects, the same from kustomize and from the chart", kustomized.len());
    }
}

#[test]
fn the_chart_lints_strictly_with_every_values_file() {
    if !can_run("the_chart_lints_strictly_with_every_values_file", false) {
        return;
    }
    let mut files: Vec<PathBuf> = overlays().into_iter().filter_map(|(_, values, _)| values).collect();
    files.extend(test_values());
    let mut runs: Vec<Vec<&str>> = vec![vec![]];
    runs.extend(files.iter().map(|f| vec!["-f", path_str(f)]));
    for args in runs {
        let text = helm::lint(&args).unwrap_or_else(|e| panic!("helm lint --strict {args:?}:\n{e}"));
        assert!(text.contains("1 chart(s) linted, 0 chart(s) failed"), "{args:?}:\n{text}");
        assert!(!text.contains("[WARNING]") && !text.contains("[ERROR]"), "{args:?}:\n{text}");
    }
}

#[test]
fn every_rendered_combination_validates_offline() {
    if !can_run("every_rendered_combination_validates_offline", true) {
        return;
    }
    let mut combinations: Vec<(String, Vec<String>)> = vec![("defaults".into(), vec![])];
    for (name, values, _) in overlays() {
        if let Some(values) = values {
            combinations.push((format!("values/{name}"), vec!["-f".into(), path_str(&values).into()]));
        }
    }
    for file in test_values() {
        let name = file.file_name().unwrap().to_string_lossy().into_owned();
        combinations.push((format!("tests/{name}"), vec!["-f".into(), path_str(&file).into()]));
    }
    let mut objects = Vec::new();
    for (name, args) in &combinations {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        // With the `helm test` pod: it is applied too.
        objects.extend(template(&args).into_iter().map(|o| (name.clone(), o)));
    }
    let (valid, report) = validate(&objects);
    assert!(valid, "invalid objects:\n{report}");
    let ok = report.lines().filter(|l| l.starts_with("ok ")).count();
    assert_eq!(ok, objects.len(), "one ok per object:\n{report}");
    println!("{report}validated {ok} objects of {} combinations", combinations.len());
}

#[test]
fn each_value_reaches_the_objects_it_is_for() {
    if !can_run("each_value_reaches_the_objects_it_is_for", false) {
        return;
    }
    let file = Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/helm/service-monitor-with-everything.yaml");
    let objects = template(&["-f", path_str(&file)]);
    let daemonset = one(&objects, "DaemonSet");
    assert_eq!(daemonset["metadata"]["name"], "kstall-agents", "fullnameOverride");
    let pod = &daemonset["spec"]["template"];
    let spec = &pod["spec"];
    let agent = &spec["containers"][0];
    assert_eq!(agent["image"], "registry.example.com/kstall:0.1.0-rc1");
    assert_eq!(agent["imagePullPolicy"], "IfNotPresent");
    assert_eq!(spec["imagePullSecrets"], json!([{"name": "registry-credentials"}]));
    assert!(spec.get("priorityClassName").is_none(), "\"\" for none: {spec}");
    assert_eq!(spec["tolerations"][0]["key"], "dedicated");
    assert_eq!(spec["nodeSelector"], json!({"kubernetes.io/os": "linux"}));
    assert!(spec["affinity"]["nodeAffinity"].is_object());
    assert_eq!(agent["resources"]["limits"]["memory"], "256Mi");
    assert_eq!(
        daemonset["spec"]["updateStrategy"],
        json!({"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 2}})
    );
    assert_eq!(pod["metadata"]["labels"], json!({"app.kubernetes.io/name": "kstall", "team": "sre"}));
    assert_eq!(daemonset["spec"]["selector"]["matchLabels"], json!({"app.kubernetes.io/name": "kstall"}));
    let annotations = &pod["metadata"]["annotations"];
    assert_eq!(annotations["example.com/owner"], "sre");
    for (key, value) in
        [("prometheus.io/scrape", "true"), ("prometheus.io/port", "9710"), ("prometheus.io/scheme", "https")]
    {
        assert_eq!(annotations[key], value, "{annotations}");
    }
    let args = strings(&agent["args"]);
    let expected = [
        "agent",
        "--listen=0.0.0.0:9710",
        "--pod-metadata=api",
        "--pod-labels=app",
        "--node-conditions=NFSClientStalled,KernelSystemOOM",
        "--node-taints=KernelSystemOOM",
        "--config=/etc/kstall/config/config.toml",
        "--web-config-file=/etc/kstall/web/web.yml",
        "--alertmanager-url=https://alertmanager-0.monitoring:9093,https://alertmanager-1.monitoring:9093",
        "--alertmanager-ca-file=/etc/kstall/alertmanager/ca/ca.crt",
        "--alertmanager-bearer-token-file=/etc/kstall/alertmanager/bearer-token/token",
        "--export-events=file:/var/log/kstall/events.jsonl",
        "--export-otlp=on",
        "--log-format=json",
    ];
    assert_eq!(args, expected);
    let env = agent["env"].as_array().unwrap();
    let env_var =
        |name: &str| env.iter().find(|e| e["name"] == name).unwrap_or_else(|| panic!("no {name}: {env:?}"));
    assert_eq!(env_var("OTEL_EXPORTER_OTLP_ENDPOINT")["value"], "https://otel.example.com:4317");
    assert_eq!(env_var("OTEL_EXPORTER_OTLP_PROTOCOL")["value"], "grpc");
    assert_eq!(
        env_var("OTEL_EXPORTER_OTLP_HEADERS")["valueFrom"],
        json!({"secretKeyRef": {"name": "otlp-headers", "key": "headers"}})
    );
    assert_eq!(env_var("TZ")["value"], "UTC");
    assert_eq!(env.last().unwrap()["name"], "OTEL_RESOURCE_ATTRIBUTES", "extraEnv last");
    // Every file a flag names is on a mount of the volume that holds it.
    let mounts = agent["volumeMounts"].as_array().unwrap();
    let volumes = spec["volumes"].as_array().unwrap();
    for (mount, source) in [
        ("/etc/kstall/config", json!({"configMap": {"name": "kstall-agents-config"}})),
        ("/etc/kstall/web", json!({"secret": {"secretName": "kstall-web"}})),
        (
            "/etc/kstall/alertmanager/ca",
            json!({"secret": {"secretName": "alertmanager-ca", "items": [{"key": "ca.crt", "path": "ca.crt"}]}}),
        ),
        (
            "/etc/kstall/alertmanager/bearer-token",
            json!({"secret": {"secretName": "alertmanager-token", "items": [{"key": "token", "path": "token"}]}}),
        ),
        ("/var/log/kstall", json!({"hostPath": {"path": "/var/log/kstall", "type": "DirectoryOrCreate"}})),
    ] {
        let found =
            mounts.iter().find(|m| m["mountPath"] == mount).unwrap_or_else(|| panic!("no mount {mount}"));
        let mut volume = volumes.iter().find(|v| v["name"] == found["name"]).unwrap().clone();
        volume.as_object_mut().unwrap().remove("name");
        assert_eq!(volume, source, "{mount}");
    }
    let security = &agent["securityContext"];
    assert_eq!(
        security["capabilities"]["add"],
        json!(["BPF", "PERFMON", "SYSLOG", "SYS_PTRACE", "DAC_READ_SEARCH", "SYS_RESOURCE"])
    );
    assert_eq!(
        security["seccompProfile"],
        json!({"type": "Localhost", "localhostProfile": "profiles/kstall.json"})
    );
    assert_eq!(
        agent["readinessProbe"]["httpGet"],
        json!({"path": "/healthz", "port": 9710, "scheme": "HTTPS"})
    );
    assert_eq!(agent["ports"], json!([{"name": "metrics", "containerPort": 9710}]));
    assert_eq!(one(&objects, "Service")["spec"]["ports"][0]["port"], 9710);
    // The opt-in RBAC, bound to the renamed service account.
    let roles: BTreeSet<&str> = objects
        .iter()
        .filter(|o| o["kind"] == "ClusterRole")
        .filter_map(|o| o["metadata"]["name"].as_str())
        .collect();
    assert_eq!(
        roles,
        BTreeSet::from(["kstall-agents", "kstall-agents-node-conditions", "kstall-agents-node-taints"])
    );
    for binding in objects.iter().filter(|o| o["kind"] == "ClusterRoleBinding") {
        assert_eq!(
            binding["subjects"],
            json!([{"kind": "ServiceAccount", "name": "kstall-agents", "namespace": NAMESPACE}])
        );
    }
    // The Prometheus Operator's objects.
    let monitor = one(&objects, "ServiceMonitor");
    assert_eq!(
        monitor["metadata"]["labels"],
        json!({"app.kubernetes.io/name": "kstall", "release": "prometheus"})
    );
    let endpoint = &monitor["spec"]["endpoints"][0];
    assert_eq!((&endpoint["interval"], &endpoint["scrapeTimeout"]), (&json!("30s"), &json!("10s")));
    assert_eq!(endpoint["scheme"], "https");
    assert_eq!(endpoint["tlsConfig"]["serverName"], "kstall");
    assert_eq!(endpoint["basicAuth"]["username"], json!({"name": "kstall-scrape", "key": "user"}));
    let relabelings = endpoint["relabelings"].as_array().unwrap();
    assert_eq!(relabelings.len(), 3, "the chart's two, then the value's");
    assert_eq!(relabelings[2]["targetLabel"], "team");
    assert_eq!(endpoint["metricRelabelings"][0]["action"], "drop");
    let rule = one(&objects, "PrometheusRule");
    assert_eq!(rule["metadata"]["labels"]["release"], "prometheus");
    let dashboards: Vec<&Value> = objects
        .iter()
        .filter(|o| o["kind"] == "ConfigMap" && o["metadata"]["labels"]["dashboards"] == "kstall")
        .collect();
    assert!(!dashboards.is_empty());
    for map in dashboards {
        assert_eq!(map["metadata"]["namespace"], "monitoring");
        assert_eq!(map["metadata"]["annotations"], json!({"grafana_folder": "kstall"}));
        assert_eq!(map["metadata"]["labels"]["grafana_dashboard"], "1");
    }

    // The other combination: non-root, a PodMonitor, basic auth to Alertmanager, stdout.
    let file = Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/helm/pod-monitor-non-root.yaml");
    let objects = template(&["-f", path_str(&file)]);
    assert!(
        objects.iter().all(|o| o["kind"] != "ServiceMonitor" && o["kind"] != "Pod"),
        "no test pod for nonRoot"
    );
    let monitor = one(&objects, "PodMonitor");
    assert_eq!(monitor["spec"]["jobLabel"], "app.kubernetes.io/name", "job kstall");
    let endpoint = &monitor["spec"]["podMetricsEndpoints"][0];
    assert_eq!((&endpoint["port"], &endpoint["interval"]), (&json!("metrics"), &json!("1m")));
    assert_eq!(endpoint["relabelings"].as_array().unwrap().len(), 3);
    let daemonset = one(&objects, "DaemonSet");
    assert_eq!(
        daemonset["spec"]["updateStrategy"],
        json!({"type": "OnDelete"}),
        "no rollingUpdate with OnDelete"
    );
    let agent = &daemonset["spec"]["template"]["spec"]["containers"][0];
    let digest = yaml_documents(&std::fs::read_to_string(&file).unwrap())[0]["image"]["digest"].clone();
    assert_eq!(agent["image"], format!("localhost/kstall@{}", digest.as_str().unwrap()));
    assert_eq!(agent["securityContext"]["runAsUser"], 65534);
    assert_eq!(agent["securityContext"]["seccompProfile"], json!({"type": "RuntimeDefault"}));
    let args = strings(&agent["args"]);
    for arg in [
        "--alertmanager-url=http://alertmanager.monitoring:9093",
        "--alertmanager-basic-auth-user=kstall",
        "--alertmanager-basic-auth-password-file=/etc/kstall/alertmanager/password/pass",
        "--export-events=stdout",
        "--export-otlp=on",
    ] {
        assert!(args.contains(&arg), "{arg} in {args:?}");
    }
    let otel: Vec<&Value> = agent["env"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["name"].as_str().unwrap().starts_with("OTEL_"))
        .collect();
    assert!(otel.is_empty(), "the SDKs' defaults: {otel:?}");
}

#[test]
fn the_schema_refuses_a_misspelt_key_and_a_wrong_type_naming_it() {
    if !can_run("the_schema_refuses_a_misspelt_key_and_a_wrong_type_naming_it", false) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let typo = dir.path().join("typo.yaml");
    std::fs::write(&typo, "priorityClasName: system-cluster-critical\n").unwrap();
    let schema = "values don't meet the specifications of the schema(s)";
    let cases: [(Vec<&str>, &[&str]); 8] = [
        (vec!["--set", "imagee.tag=x"], &["at '': additional properties 'imagee' not allowed"]),
        (vec!["-f", path_str(&typo)], &["at '': additional properties 'priorityClasName' not allowed"]),
        (
            vec!["--set", "serviceMonitor.intervall=30s"],
            &["at '/serviceMonitor': additional properties 'intervall' not allowed"],
        ),
        (
            vec!["--set", "config.sampel_events=64"],
            &["at '/config': additional properties 'sampel_events' not allowed"],
        ),
        // A setting the chart drives has its own value: refused in the file, not overridden silently.
        (
            vec!["--set", "config.listen=0.0.0.0:9800"],
            &["at '/config': additional properties 'listen' not allowed"],
        ),
        (vec!["--set", "metrics.port=nine"], &["at '/metrics/port': got string, want integer"]),
        (
            vec!["--set", "config.memory_pressure_some=high"],
            &["at '/config/memory_pressure_some': got string, want integer"],
        ),
        (
            vec!["--set", "nodeConditions.conditions={NFSClientStaled}"],
            &["at '/nodeConditions/conditions/0'"],
        ),
    ];
    for (args, wanted) in cases {
        let error = refusal(&args);
        assert!(error.contains(schema), "{args:?}: {error}");
        for want in wanted {
            assert!(error.contains(want), "{args:?}: helm's error does not say {want:?}:\n{error}");
        }
        println!(
            "{args:?}: {}",
            error.lines().filter(|l| l.starts_with("- at")).collect::<Vec<_>>().join("; ")
        );
    }
    // `helm install` and `upgrade` validate as template and lint do.
    let linted = helm::lint(&["-f", path_str(&typo)]).expect_err("lint must fail");
    assert!(linted.contains("'priorityClasName' not allowed"), "{linted}");

    // What the schema cannot say: combinations, each refused with its values named.
    let combinations: [(&[&str], &str); 8] = [
        (&["--set", "nonRoot=true,kernelsBefore511=true"], "nonRoot and kernelsBefore511"),
        (&["--set", "nonRoot=true,podRules=true"], "nonRoot and podRules"),
        (&["--set", "nonRoot=true,capture.enabled=true"], "nonRoot and capture.enabled"),
        (
            &["--set", "serviceMonitor.enabled=true,podMonitor.enabled=true"],
            "serviceMonitor.enabled and podMonitor.enabled",
        ),
        (&["--set", "seccompProfile.type=Localhost"], "/seccompProfile/localhostProfile"),
        (
            &["--set", "metrics.webConfig.tls=true"],
            "metrics.webConfig.tls needs metrics.webConfig.secretName",
        ),
        (&["--set", "alertmanager.bearerTokenSecret.name=t"], "without alertmanager.urls"),
        (
            &["--set", "alertmanager.urls={http://a:9093},alertmanager.basicAuth.user=u"],
            "alertmanager.basicAuth needs both",
        ),
    ];
    for (args, want) in combinations {
        let error = refusal(args);
        assert!(error.contains(want), "{args:?}: {error}");
    }
}

/// What the schema must say of every object of the chart's own: an unknown key is refused (a
/// typo fails at `helm install`, not at 3 a.m.). Maps of the user's are typed (labels, quantities);
/// Kubernetes' own types passed through (affinity's parts, an env var's source, a volume) are
/// named so, and left to the API server.
#[test]
fn every_object_of_the_schema_refuses_unknown_keys() {
    let text = std::fs::read_to_string(helm::chart_dir().join("values.schema.json")).unwrap();
    let schema: Value = serde_json::from_str(&text).unwrap();
    fn walk(path: &str, node: &Value, passed_through: &mut Vec<String>) {
        let Some(map) = node.as_object() else { return };
        if map.contains_key("properties") {
            assert_eq!(map.get("additionalProperties"), Some(&json!(false)), "{path} takes unknown keys");
        } else if node["type"] == "object" {
            let typed_map = map.get("additionalProperties").is_some_and(Value::is_object);
            let description = node["description"].as_str().unwrap_or("");
            let foreign = description.starts_with("Kubernetes' ") || description.starts_with("Helm's ");
            assert!(typed_map || foreign, "{path}: an object with neither its keys nor a type for them");
            if foreign {
                passed_through.push(path.to_string());
            }
        }
        for (key, child) in map {
            let child_path = match key.as_str() {
                // Conditions on an object's values (seccompProfile's), not objects.
                "if" | "then" | "else" => continue,
                "properties" | "definitions" => {
                    for (name, grandchild) in child.as_object().unwrap() {
                        walk(&format!("{path}/{name}"), grandchild, passed_through);
                    }
                    continue;
                }
                "items" => format!("{path}[]"),
                _ => format!("{path}/{key}"),
            };
            walk(&child_path, child, passed_through);
        }
    }
    let mut passed_through = Vec::new();
    walk("", &schema, &mut passed_through);
    println!("passed through as Kubernetes' or Helm's own: {passed_through:?}");
}

/// The agent's settings the chart drives through values of its own, or the DaemonSet fixes: the
/// schema's `config` refuses them (values.yaml says which value to use instead).
const CHART_DRIVEN: [&str; 19] = [
    "listen",
    "web_config_file",
    "pod_labels",
    "node_conditions",
    "node_taints",
    "alertmanager_url",
    "alertmanager_ca_file",
    "alertmanager_bearer_token_file",
    "alertmanager_basic_auth_user",
    "alertmanager_basic_auth_password_file",
    "export_events",
    "export_otlp",
    "api_socket",
    "state_dir",
    "pod_metadata",
    "pods_file",
    "kubeconfig",
    "node_name",
    "node_ip",
];

#[test]
fn the_config_keys_are_the_agent_s_settings() {
    let Some(binary) = agent("the_config_keys_are_the_agent_s_settings") else { return };
    let help = Command::new(&binary).args(["agent", "--help"]).output().expect("kstall agent --help");
    let help = String::from_utf8_lossy(&help.stdout);
    // The file's keys are the flags' names in snake_case (agent/src/config.rs), but --config.
    let agent_keys: BTreeSet<String> = help
        .lines()
        .filter_map(|l| l.strip_prefix("      --"))
        .map(|l| l.split([' ', '=']).next().unwrap().replace('-', "_"))
        .filter(|k| k != "config" && k != "help")
        .collect();
    let text = std::fs::read_to_string(helm::chart_dir().join("values.schema.json")).unwrap();
    let schema: Value = serde_json::from_str(&text).unwrap();
    let config: BTreeSet<String> =
        schema["properties"]["config"]["properties"].as_object().unwrap().keys().cloned().collect();
    let driven: BTreeSet<String> = CHART_DRIVEN.iter().map(|k| k.to_string()).collect();
    assert!(
        config.is_disjoint(&driven),
        "the chart drives {:?}",
        config.intersection(&driven).collect::<Vec<_>>()
    );
    let known: BTreeSet<String> = config.union(&driven).cloned().collect();
    let missing: Vec<&String> = agent_keys.difference(&known).collect();
    let gone: Vec<&String> = known.difference(&agent_keys).collect();
    assert!(
        missing.is_empty() && gone.is_empty(),
        "values.schema.json's config: add {missing:?} (settings of `kstall agent --help`), remove {gone:?} (no longer settings)"
    );
    println!(
        "{} agent settings: {} in the chart's config, {} driven by the chart",
        agent_keys.len(),
        config.len(),
        driven.len()
    );
}

/// The DaemonSet's pod-template annotations and the ConfigMap's file when rendered with `args`.
fn config_render(args: &[&str]) -> (Value, Option<String>) {
    let objects = template(&["--skip-tests"].iter().chain(args).copied().collect::<Vec<_>>());
    let daemonset = one(&objects, "DaemonSet");
    let maps: Vec<&Value> = objects.iter().filter(|o| o["kind"] == "ConfigMap").collect();
    assert!(maps.len() <= 1, "{maps:?}");
    let file = maps.first().map(|m| m["data"]["config.toml"].as_str().expect("config.toml").to_string());
    let args = strings(&daemonset["spec"]["template"]["spec"]["containers"][0]["args"]).join(" ");
    assert_eq!(args.contains("--config=/etc/kstall/config/config.toml"), file.is_some(), "{args}");
    (daemonset["spec"]["template"].clone(), file)
}

fn sha256(text: &str) -> String {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("f");
    std::fs::write(&file, text).unwrap();
    let out = Command::new("sha256sum").arg(&file).output().expect("sha256sum");
    String::from_utf8_lossy(&out.stdout).split_whitespace().next().unwrap().to_string()
}

#[test]
fn a_changed_setting_rolls_the_agents_and_the_agent_reads_the_file() {
    if !can_run("a_changed_setting_rolls_the_agents_and_the_agent_reads_the_file", false) {
        return;
    }
    let (none, no_file) = config_render(&[]);
    assert!(no_file.is_none() && none["metadata"].get("annotations").is_none(), "no config, no file: {none}");
    let (a, file_a) = config_render(&["--set", "config.sample_events=64,config.redirect_window=5m"]);
    let (b, file_b) = config_render(&["--set", "config.sample_events=128,config.redirect_window=5m"]);
    let (file_a, file_b) = (file_a.unwrap(), file_b.unwrap());
    let checksum = |template: &Value| {
        template["metadata"]["annotations"]["checksum/config"].as_str().unwrap().to_string()
    };
    // The annotation is the file's checksum: a change of the file is a change of the pod template.
    assert_eq!(checksum(&a), sha256(&file_a));
    assert_eq!(checksum(&b), sha256(&file_b));
    assert_ne!(checksum(&a), checksum(&b), "a changed setting must roll the agents");
    let (mut a_rest, mut b_rest) = (a.clone(), b.clone());
    a_rest["metadata"]["annotations"].as_object_mut().unwrap().remove("checksum/config");
    b_rest["metadata"]["annotations"].as_object_mut().unwrap().remove("checksum/config");
    assert_eq!(a_rest, b_rest, "the checksum is the only difference in the pod template");

    // The file as TOML: each value in its type, switches as on/off, strings escaped.
    let dir = tempfile::tempdir().unwrap();
    let values = dir.path().join("config.yaml");
    std::fs::write(
        &values,
        "config:\n  sample_events: 64\n  ring_buffer_bytes: 2M\n  nfs_ports: [2049, \"111\"]\n  kubernetes_events: off\n  \
         program_stats: \"on\"\n  log_level: 'kstall=debug,\"x\"\\'\n  stuck_task_interval: 10\n",
    )
    .unwrap();
    let (_, file) = config_render(&["-f", path_str(&values)]);
    let file = file.unwrap();
    let expected = "# kstall agent's settings (kstall agent --help): from the chart's `config` value.\n\
        kubernetes_events = \"off\"\n\
        log_level = \"kstall=debug,\\\"x\\\"\\\\\"\n\
        nfs_ports = [2049, \"111\"]\n\
        program_stats = \"on\"\n\
        ring_buffer_bytes = \"2M\"\n\
        sample_events = 64\n\
        stuck_task_interval = 10\n";
    assert_eq!(file, expected);
    // The agent reads the files: with a good one, its first complaint is the bad flag given
    // beside it (so it never starts); the escaped string comes back to it as it was written in
    // the values — not a filter it takes, which it says quoting it.
    let Some(binary) = agent("a_changed_setting_rolls_the_agents_and_the_agent_reads_the_file") else {
        return;
    };
    let refusal = |name: &str, text: &str| {
        let path = dir.path().join(format!("{name}.toml"));
        std::fs::write(&path, text).unwrap();
        let out = Command::new(&binary)
            .args(["agent", "--probes=no-such-probe", "--config"])
            .arg(&path)
            .output()
            .expect("kstall agent");
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        assert_eq!(out.status.code(), Some(64), "{stderr}");
        (path, stderr)
    };
    let (path, stderr) = refusal("a", &file_a);
    assert!(
        stderr.contains("--probes: unknown probe") && !stderr.contains(path_str(&path)),
        "the agent refused the chart's file:\n{file_a}\n{stderr}"
    );
    let (path, stderr) = refusal("escaped", &file);
    let written = format!(
        "{} line 3, log_level: {:?}: invalid filter directive",
        path.display(),
        "kstall=debug,\"x\"\\"
    );
    assert!(stderr.contains(&written), "the agent read another string than the values':\n{file}\n{stderr}");
}

#[test]
fn the_helm_test_pod_asks_a_node_s_agent_for_healthz_and_its_probes() {
    if !can_run("the_helm_test_pod_asks_a_node_s_agent_for_healthz_and_its_probes", false) {
        return;
    }
    for (args, port, scheme) in [
        (vec![], 9700, None),
        (
            vec!["--set", "metrics.port=9710,metrics.webConfig.secretName=web,metrics.webConfig.tls=true"],
            9710,
            Some("HTTPS"),
        ),
    ] {
        let objects = template(&args);
        let test = one(&objects, "Pod");
        let daemonset = one(&objects, "DaemonSet");
        let agent_pod = &daemonset["spec"]["template"]["spec"];
        assert_eq!(test["metadata"]["annotations"]["helm.sh/hook"], "test");
        let spec = &test["spec"];
        assert_eq!(spec["restartPolicy"], "Never");
        // The node's network: the kubelet's probe of this pod reaches the node's agent.
        assert_eq!(spec["hostNetwork"], true);
        assert_eq!(spec["tolerations"], agent_pod["tolerations"], "it may land where the agents run");
        let run = agent_pod["volumes"].as_array().unwrap().iter().find(|v| v["name"] == "run").unwrap();
        assert_eq!(
            spec["volumes"][0]["hostPath"]["path"], run["hostPath"]["path"],
            "the agents' socket directory"
        );
        let image = &agent_pod["containers"][0]["image"];
        let status = &spec["initContainers"][0];
        assert_eq!((&status["image"], &status["args"]), (image, &json!(["status"])));
        let answers = &spec["containers"][0];
        assert_eq!(&answers["image"], image);
        assert_eq!(answers["args"][0], "trace");
        let probe = &answers["startupProbe"];
        let mut get = json!({"path": "/healthz", "port": port});
        if let Some(scheme) = scheme {
            get["scheme"] = json!(scheme);
        }
        assert_eq!(probe["httpGet"], get);
        assert_eq!(probe["httpGet"]["port"], agent_pod["containers"][0]["ports"][0]["containerPort"]);
        assert_eq!(probe["periodSeconds"], 1);
        let fails_after =
            probe["failureThreshold"].as_u64().unwrap() * probe["periodSeconds"].as_u64().unwrap();
        assert!(fails_after < 15, "it fails before the trace ends (15 s): {probe}");
        for container in [status, answers] {
            assert_eq!(container["securityContext"]["capabilities"], json!({"drop": ["ALL"]}));
        }
    }
}

/// deploy/README.md's values table has a row for each value of values.yaml.
#[test]
fn the_readme_lists_every_value() {
    let values_text = std::fs::read_to_string(helm::chart_dir().join("values.yaml")).unwrap();
    let values = yaml_documents(&values_text).remove(0);
    let schema: Value =
        serde_json::from_str(&std::fs::read_to_string(helm::chart_dir().join("values.schema.json")).unwrap())
            .unwrap();
    // A value is a row unless it is a group of the chart's own values (an object of known keys),
    // but for these, whose parts are one Kubernetes value or the agent's settings.
    const ONE_ROW: [&str; 4] = ["resources", "updateStrategy", "affinity", "config"];
    fn rows(prefix: &str, value: &Value, schema: &Value, out: &mut Vec<String>) {
        for (key, child) in value.as_object().unwrap() {
            let path = if prefix.is_empty() { key.clone() } else { format!("{prefix}.{key}") };
            let node = &schema["properties"][key];
            if child.is_object() && node.get("properties").is_some() && !ONE_ROW.contains(&path.as_str()) {
                rows(&path, child, node, out);
            } else {
                out.push(path);
            }
        }
    }
    let mut paths = Vec::new();
    rows("", &values, &schema, &mut paths);
    let readme = std::fs::read_to_string(deploy_dir().join("README.md")).unwrap();
    let missing: Vec<&String> =
        paths.iter().filter(|p| !readme.lines().any(|l| l.starts_with(&format!("| `{p}` |")))).collect();
    assert!(missing.is_empty(), "deploy/README.md's values table has no row for {missing:?}");
    println!("{} values, each in deploy/README.md's table", paths.len());
}
