//! The Helm chart (deploy/helm/kstall) on the real cluster (issue 55), with the pinned helm and
//! kubectl (target/tools): `helm install` where the kustomize install was, `helm upgrade` turning
//! the node conditions on, `helm test`, `helm uninstall` — and what the uninstall leaves, each
//! removed by the command deploy/README.md gives for it. The kustomize install comes back when the
//! test ends, passed or not ([`Kustomized`]).

use std::{
    path::PathBuf,
    process::Output,
    time::{Duration, Instant},
};

use kstall_tests::{
    cluster::{
        Cluster, NODE, POD_READY_WITHIN, agent_incidents, agent_request, is_ready, kubectl_succeeded,
        probes_down,
    },
    deploy::deploy_dir,
    helm,
};
use serde_json::Value;

use super::{FIRES_WITHIN, Namespace, OVERLAY, deployed, events_about, firing, sidecar_redirect_job};

const RELEASE: &str = "kstall";
const NAMESPACE: &str = "kstall";
const SELECTOR: &str = "app.kubernetes.io/name=kstall";
/// The node conditions the chart's `nodeConditions` turns on (all five by default).
const CONDITIONS: [&str; 5] =
    ["NFSClientStalled", "KernelSystemOOM", "KubeletDegraded", "CPUSoftLockup", "ConntrackTableFull"];

/// The pinned helm as the cluster's admin, inside its network namespace.
fn helm(cluster: &Cluster, args: &[&str]) -> Output {
    let mut cmd = cluster.inside(helm::helm().to_str().expect("a UTF-8 path"));
    helm::with_homes(&mut cmd).args(args).arg("--kubeconfig").arg(cluster.kubeconfig());
    cmd.output().expect("run helm")
}

/// As [`helm`], its output; panics with its error.
fn helm_ok(cluster: &Cluster, args: &[&str]) -> String {
    let out = helm(cluster, args);
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "helm {}:\n{text}", args.join(" "));
    text
}

/// The pinned kubectl (1.34) as the cluster's admin: the commands deploy/README.md gives.
fn kubectl(cluster: &Cluster, args: &[&str]) -> Output {
    let mut cmd = cluster.inside(helm::kubectl().to_str().expect("a UTF-8 path"));
    cmd.arg("--kubeconfig").arg(cluster.kubeconfig()).args(args);
    cmd.output().expect("run kubectl")
}

fn kubectl_ok(cluster: &Cluster, args: &[&str]) -> String {
    kubectl_succeeded(kubectl(cluster, args), args)
}

fn chart() -> String {
    helm::chart_dir().display().to_string()
}

/// kstall's conditions on the Node, by type.
fn kstall_conditions(cluster: &Cluster) -> Vec<String> {
    let node = cluster.json(&["get", "node", NODE]);
    node["status"]["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|c| c["type"].as_str())
        .filter(|t| CONDITIONS.contains(t))
        .map(str::to_string)
        .collect()
}

/// deploy/README.md's command for the conditions a removed kstall leaves on a Node: a strategic
/// merge patch of its status deleting each by type (kubectl 1.24+ for `--subresource`; the API
/// server takes it from 1.20 on, which this runs against).
fn remove_conditions_command() -> Vec<String> {
    let deletes: Vec<String> =
        CONDITIONS.iter().map(|t| format!(r#"{{"$patch":"delete","type":"{t}"}}"#)).collect();
    let patch = format!(r#"{{"status":{{"conditions":[{}]}}}}"#, deletes.join(","));
    ["patch", "node", NODE, "--subresource=status", "-p", &patch].map(str::to_string).to_vec()
}

/// An object: "<resource> <namespace>/<name>".
fn id(resource: &str, object: &Value) -> String {
    format!(
        "{resource} {}/{}",
        object["metadata"]["namespace"].as_str().unwrap_or(""),
        object["metadata"]["name"].as_str().unwrap_or("?")
    )
}

/// Every object the API server lists (`kubectl api-resources --verbs=list`, events aside) that is
/// kstall's — named with `kstall`, labelled `app.kubernetes.io/name: kstall`, or annotated as
/// release kstall's — or lives in namespace kstall.
fn kstall_objects(cluster: &Cluster) -> Vec<String> {
    let resources = kubectl_ok(cluster, &["api-resources", "--verbs=list", "-o", "name"]);
    let resources: Vec<&str> = resources
        .lines()
        .filter(|r| !matches!(*r, "events" | "events.events.k8s.io" | "componentstatuses"))
        .collect();
    let mut found = Vec::new();
    for resource in resources {
        let out = kubectl(cluster, &["get", resource, "--all-namespaces", "-o", "json"]);
        assert!(out.status.success(), "list {resource}: {}", String::from_utf8_lossy(&out.stderr));
        let list: Value = serde_json::from_slice(&out.stdout).expect("kubectl's JSON");
        for object in list["items"].as_array().into_iter().flatten() {
            let meta = &object["metadata"];
            let name = meta["name"].as_str().unwrap_or_default();
            let ours = name.contains("kstall")
                || meta["labels"]["app.kubernetes.io/name"] == "kstall"
                || meta["annotations"]["meta.helm.sh/release-name"] == RELEASE
                || meta["namespace"] == NAMESPACE;
            if ours {
                found.push(id(resource, object));
            }
        }
    }
    found.sort();
    found
}

/// What `kstall_objects` finds once `want` holds of it (the garbage collector and the endpoints
/// controller remove the pods, ControllerRevisions and Endpoints after helm deleted their owners).
fn kstall_objects_when(cluster: &Cluster, want: impl Fn(&[String]) -> bool) -> Vec<String> {
    let mut last = Vec::new();
    let settled = kstall_tests::host::wait_for(Duration::from_secs(120), || {
        last = kstall_objects(cluster);
        want(&last).then(|| last.clone())
    });
    settled.unwrap_or_else(|| panic!("kstall's objects in the API:\n{}", last.join("\n")))
}

/// What namespace kstall holds once created: its service account, that account's token, and the
/// cluster's CA bundle (the root CA publisher's), all the namespace's own.
fn the_namespaces_own(objects: &[String]) -> bool {
    let expected = |o: &String| {
        o == "namespaces /kstall"
            || o == "serviceaccounts kstall/default"
            || o.starts_with("secrets kstall/default-token-")
            || o == "configmaps kstall/kube-root-ca.crt"
    };
    objects.iter().all(expected)
}

/// The agent pod once one is Ready, not on its way out, and `wanted` holds of it; its API then
/// answers.
fn ready_agent(cluster: &Cluster, wanted: impl Fn(&Value) -> bool) -> Value {
    let pod = kstall_tests::host::wait_for(POD_READY_WITHIN, || {
        let pods = cluster.json(&["-n", NAMESPACE, "get", "pods", "-l", SELECTOR]);
        pods["items"]
            .as_array()?
            .iter()
            .find(|p| is_ready(p) && p["metadata"]["deletionTimestamp"].is_null() && wanted(p))
            .cloned()
    })
    .unwrap_or_else(|| {
        panic!(
            "no Ready agent pod as wanted:\n{}",
            cluster.kubectl(&["-n", NAMESPACE, "get", "pods", "-o", "wide"])
        )
    });
    kstall_tests::host::wait_for(Duration::from_secs(30), || agent_request(r#"{"request":"status"}"#).ok())
        .unwrap_or_else(|| panic!("the agent's API does not answer:\n{}", cluster.agent_logs()));
    pod
}

fn args_of(pod: &Value) -> Vec<String> {
    pod["spec"]["containers"][0]["args"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|a| a.as_str().map(str::to_string))
        .collect()
}

/// Installs kstall back as the other tests have it, when dropped — also when the test failed
/// half-way: the release uninstalled (if any), the overlay applied once namespace kstall is not
/// on its way out, its agent Ready.
struct Kustomized<'a>(&'a Cluster);

impl Drop for Kustomized<'_> {
    fn drop(&mut self) {
        let cluster = self.0;
        let _ = helm(cluster, &["uninstall", RELEASE, "-n", NAMESPACE, "--ignore-not-found", "--wait"]);
        // A node debugger pod the test left (it failed before deleting it).
        let pods = cluster.try_kubectl(&["-n", "default", "get", "pods", "-o", "name"]);
        for pod in
            String::from_utf8_lossy(&pods.stdout).lines().filter(|p| p.starts_with("pod/node-debugger-"))
        {
            let _ = cluster.try_kubectl(&["-n", "default", "delete", pod]);
        }
        let overlay = deploy_dir().join("overlays").join(OVERLAY).display().to_string();
        let applied = kstall_tests::host::wait_for(Duration::from_secs(180), || {
            cluster.try_kubectl(&["apply", "-k", &overlay]).status.success().then_some(())
        });
        if applied.is_none() {
            eprintln!("could not apply deploy/overlays/{OVERLAY} back");
            return;
        }
        cluster.ready_pod(NAMESPACE, SELECTOR);
        let _ = kstall_tests::host::wait_for(Duration::from_secs(30), || {
            agent_request(r#"{"request":"status"}"#).ok()
        });
    }
}

/// Prints how long each step took, for the report.
struct Steps(Instant, Instant);

impl Steps {
    fn done(&mut self, step: &str) {
        println!("helm on the cluster: {step}: {:.1} s", self.1.elapsed().as_secs_f64());
        self.1 = Instant::now();
    }
}

/// `helm install` of the chart where the kustomize install was → the DaemonSet Ready, every probe
/// up, a redirect incident named for a real pod; `helm upgrade --reuse-values --set
/// nodeConditions.enabled=true` → a new pod, the incident still listed (the state directory), the
/// conditions on the Node; `helm test` passes; `helm uninstall` → nothing of kstall in the API
/// but what deploy/README.md says it leaves (the namespace, the conditions, the Events, the state
/// directory on the node), each then removed by the command the README gives.
#[test]
fn the_chart_installs_upgrades_tests_and_uninstalls_leaving_only_what_the_readme_says() {
    let test = "the_chart_installs_upgrades_tests_and_uninstalls_leaving_only_what_the_readme_says";
    let Some(cluster) = Cluster::running(test) else { return };
    if let Some(why) = helm::tools_missing() {
        panic!("{test}: {why}");
    }
    let mut steps = Steps(Instant::now(), Instant::now());
    deployed(&cluster);
    let _restore = Kustomized(&cluster);
    let chart = chart();
    // With one agent setting, so that the settings' ConfigMap is made (and read by the agent).
    let install = [
        "install",
        RELEASE,
        &chart,
        "-n",
        NAMESPACE,
        "--create-namespace",
        "--set",
        "config.log_level=info",
        "--wait",
        "--timeout",
        "5m",
    ];

    // Helm does not adopt what kubectl applied: the kustomize install goes first.
    let refused = helm(&cluster, &install);
    let why = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success(), "helm installed over the kustomize install");
    assert!(why.contains("exists and cannot be imported into the current release"), "{why}");
    let overlay = deploy_dir().join("overlays").join(OVERLAY).display().to_string();
    kubectl_ok(&cluster, &["delete", "-k", &overlay, "--wait=true", "--timeout=180s"]);
    assert!(!kubectl(&cluster, &["get", "namespace", NAMESPACE]).status.success(), "namespace kstall left");
    // The conditions the kustomize agent wrote stay: removed as the README says (no agent runs).
    kubectl_ok(&cluster, &remove_conditions_command().iter().map(String::as_str).collect::<Vec<_>>());
    assert_eq!(kstall_conditions(&cluster), Vec::<String>::new());
    steps.done("the kustomize install removed");

    // helm install.
    helm_ok(&cluster, &install);
    let installed = ready_agent(&cluster, |_| true);
    steps.done("helm install --wait");
    assert_eq!(installed["spec"]["nodeName"], NODE);
    let annotations =
        &cluster.json(&["-n", NAMESPACE, "get", "daemonset", "kstall"])["metadata"]["annotations"];
    assert_eq!(annotations["meta.helm.sh/release-name"], RELEASE, "{annotations}");
    assert!(
        !args_of(&installed).iter().any(|a| a.starts_with("--node-conditions")),
        "{:?}",
        args_of(&installed)
    );
    assert!(args_of(&installed).iter().any(|a| a.starts_with("--config=")), "{:?}", args_of(&installed));
    let status = agent_request(r#"{"request":"status"}"#).unwrap();
    let down = probes_down(&status);
    assert!(down.is_empty(), "probes down (nfs waits for sunrpc, which this host lacks): {down:?}");
    assert_eq!(status["attribution"]["source"], format!("api (node {NODE})"), "{status}");

    // A redirect incident for a real pod, as with the kustomize install.
    let tenant = "tenant-helm";
    let _tenant = Namespace(&cluster, tenant);
    let pod = sidecar_redirect_job(&cluster, tenant, "helm-report");
    let name = pod["metadata"]["name"].as_str().unwrap().to_string();
    let incident = kstall_tests::host::wait_for(FIRES_WITHIN, || {
        firing("nfs-sidecar-redirect", tenant, &name).filter(|i| i["container"] == "app")
    })
    .unwrap_or_else(|| panic!("nfs-sidecar-redirect not fired for {name}:\n{:#?}", agent_incidents()));
    assert_eq!(incident["pod_uid"], pod["metadata"]["uid"], "{incident}");
    kstall_tests::host::wait_for(Duration::from_secs(30), || {
        events_about(&cluster, tenant, &name).into_iter().next()
    })
    .unwrap_or_else(|| panic!("no Event on {name}:\n{}", cluster.agent_logs()));
    assert_eq!(kstall_conditions(&cluster), Vec::<String>::new(), "conditions without nodeConditions");
    steps.done("the redirect incident and its Event");

    // helm upgrade: the node conditions on.
    helm_ok(
        &cluster,
        &[
            "upgrade",
            RELEASE,
            &chart,
            "-n",
            NAMESPACE,
            "--reuse-values",
            "--set",
            "nodeConditions.enabled=true",
            "--wait",
            "--timeout",
            "5m",
        ],
    );
    let upgraded = ready_agent(&cluster, |p| p["metadata"]["uid"] != installed["metadata"]["uid"]);
    steps.done("helm upgrade --wait (the pods rolled)");
    let on = format!("--node-conditions={}", CONDITIONS.join(","));
    assert!(args_of(&upgraded).contains(&on), "{:?}", args_of(&upgraded));
    let carried = kstall_tests::host::wait_for(Duration::from_secs(60), || {
        agent_incidents().into_iter().find(|i| i["id"] == incident["id"])
    })
    .unwrap_or_else(|| panic!("the incident is not listed after the roll:\n{:#?}", agent_incidents()));
    assert_eq!(carried["first_seen_unix_ns"], incident["first_seen_unix_ns"], "the same incident: {carried}");
    let written = kstall_tests::host::wait_for(Duration::from_secs(60), || {
        let now = kstall_conditions(&cluster);
        (now.len() == CONDITIONS.len()).then_some(now)
    })
    .unwrap_or_else(|| {
        panic!("the conditions not written: {:?}\n{}", kstall_conditions(&cluster), cluster.agent_logs())
    });
    println!(
        "helm on the cluster: after the upgrade, conditions {written:?}, incident {} carried",
        incident["id"]
    );
    let history = helm_ok(&cluster, &["history", RELEASE, "-n", NAMESPACE]);
    assert_eq!(history.lines().filter(|l| l.contains("kstall-0.1.0")).count(), 2, "{history}");
    steps.done("the incident carried, the conditions written");

    // helm test. Without --logs: helm 3.19 deletes the succeeded test pod (hook-succeeded) before
    // --logs reads it and then fails (helm/helm#9098). Its log is read here while it runs: the
    // init container's `kstall status` is done before the container's 15 s `kstall trace` is.
    let mut cmd = cluster.inside(helm::helm().to_str().expect("a UTF-8 path"));
    helm::with_homes(&mut cmd)
        .args(["test", RELEASE, "-n", NAMESPACE, "--timeout", "3m", "--kubeconfig"])
        .arg(cluster.kubeconfig())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    let mut running = cmd.spawn().expect("run helm test");
    let mut status_log = String::new();
    while running.try_wait().expect("helm test").is_none() {
        let log = kubectl(&cluster, &["-n", NAMESPACE, "logs", "kstall-test", "-c", "status"]);
        if log.status.success() && !log.stdout.is_empty() {
            status_log = String::from_utf8_lossy(&log.stdout).into_owned();
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    let out = running.wait_with_output().expect("helm test");
    let tested = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "helm test:\n{tested}");
    let phase = tested.lines().find_map(|l| l.strip_prefix("Phase:")).map(str::trim);
    assert_eq!(phase, Some("Succeeded"), "{tested}");
    assert!(
        status_log.contains("PROBE") && status_log.contains("tcp-reset"),
        "the test pod's kstall status names no probes:\n{status_log}"
    );
    assert!(
        !kubectl(&cluster, &["-n", NAMESPACE, "get", "pod", "kstall-test"]).status.success(),
        "the succeeded test pod is deleted"
    );
    steps.done("helm test");

    // helm uninstall: nothing of kstall in the API but the namespace and what it always holds.
    let before = kstall_objects(&cluster);
    helm_ok(&cluster, &["uninstall", RELEASE, "-n", NAMESPACE, "--wait", "--timeout", "3m"]);
    let left = kstall_objects_when(&cluster, the_namespaces_own);
    steps.done("helm uninstall --wait, and the API settled");
    println!("helm on the cluster: installed, {} objects:\n  {}", before.len(), before.join("\n  "));
    println!("helm on the cluster: after helm uninstall:\n  {}", left.join("\n  "));
    for kind in [
        "daemonsets.apps kstall/kstall",
        "serviceaccounts kstall/kstall",
        "services kstall/kstall",
        "configmaps kstall/kstall-config",
    ] {
        assert!(before.iter().any(|o| o == kind), "{kind} was not there to be removed: {before:?}");
    }
    for kind in [
        "clusterroles.rbac.authorization.k8s.io /kstall",
        "clusterroles.rbac.authorization.k8s.io /kstall-node-conditions",
    ] {
        assert!(before.iter().any(|o| o == kind), "{kind} was not there to be removed: {before:?}");
    }
    assert!(before.iter().any(|o| o.starts_with("secrets kstall/sh.helm.release.v1.kstall.")), "{before:?}");
    // Left on purpose, each as the README says.
    assert!(left.iter().any(|o| o == "namespaces /kstall"), "--create-namespace's namespace stays: {left:?}");
    assert_eq!(kstall_conditions(&cluster).len(), CONDITIONS.len(), "the conditions stay on the Node");
    assert!(!events_about(&cluster, tenant, &name).is_empty(), "kstall's Events stay until they expire");
    let state = PathBuf::from("/var/lib/kstall");
    assert!(state.join("incidents.json").is_file(), "the state directory stays on the node");

    // Each removed by the README's command.
    kubectl_ok(&cluster, &remove_conditions_command().iter().map(String::as_str).collect::<Vec<_>>());
    assert_eq!(kstall_conditions(&cluster), Vec::<String>::new(), "the conditions removed");
    kubectl_ok(&cluster, &["delete", "events", "-A", "--field-selector", "reportingComponent=kstall"]);
    let events = cluster.json(&["get", "events", "-A", "--field-selector", "reportingComponent=kstall"]);
    assert_eq!(events["items"].as_array().map(Vec::len), Some(0), "kstall's Events left: {events}");
    // The test image links only some of busybox's applets (no `rm`): busybox itself runs it.
    let debug = kubectl(
        &cluster,
        &[
            "debug",
            &format!("node/{NODE}"),
            "--profile=general",
            "--image=kstall.test/busybox:1.35",
            "--",
            "busybox",
            "rm",
            "-rf",
            "/host/var/lib/kstall",
            "/host/run/kstall",
        ],
    );
    let said =
        format!("{}{}", String::from_utf8_lossy(&debug.stdout), String::from_utf8_lossy(&debug.stderr));
    assert!(debug.status.success(), "kubectl debug node: {said}");
    let debugger = said
        .split_whitespace()
        .find(|w| w.starts_with("node-debugger-"))
        .unwrap_or_else(|| panic!("kubectl debug names no pod: {said}"))
        .to_string();
    let done = cluster
        .pod_when("default", &debugger, |p| {
            matches!(p["status"]["phase"].as_str(), Some("Succeeded" | "Failed"))
        })
        .expect("the debugger pod done");
    assert_eq!(done["status"]["phase"], "Succeeded", "{}", done["status"]);
    assert!(!state.exists() && !std::path::Path::new("/run/kstall").exists(), "the host paths still there");
    kubectl_ok(&cluster, &["delete", "pod", "-n", "default", &debugger]);
    kubectl_ok(&cluster, &["delete", "namespace", NAMESPACE, "--wait=true", "--timeout=120s"]);
    let none = kstall_objects_when(&cluster, |o| o.is_empty());
    assert_eq!(none, Vec::<String>::new());
    steps.done("what uninstall leaves, removed");
    println!("helm on the cluster: {:.0} s in all", steps.0.elapsed().as_secs_f64());
}
