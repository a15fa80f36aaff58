//! The real Kubernetes `cargo xtask cluster up` starts (API server, controller manager,
//! scheduler, containerd, kubelet), as the tests of `tests/tests/cluster.rs` reach it: `kubectl`
//! and everything else run inside its network namespace, which has no route out. `cargo xtask
//! test` brings it up and names it in `KSTALL_CLUSTER` (its state directory).

use std::{
    io::Write as _,
    path::{Path, PathBuf},
    process::{Command, Output, Stdio},
    time::Duration,
};

use serde_json::Value;

use crate::{
    deploy::{deploy_dir, relative},
    host::wait_for,
};

/// The node the cluster's kubelet registers.
pub const NODE: &str = "node1";
/// Where the DaemonSet's agent serves its API: the node's /run/kstall (a hostPath).
pub const AGENT_SOCKET: &str = "/run/kstall/kstall.sock";
/// A cluster's pod may take this long to start: images are local, but two cores run it all.
pub const POD_READY_WITHIN: Duration = Duration::from_secs(180);

pub struct Cluster {
    netns: PathBuf,
    kubeconfig: PathBuf,
    state: PathBuf,
}

impl Cluster {
    /// The cluster `cargo xtask test` started; panics where the tests are required and none
    /// runs, else `None` after saying why.
    pub fn running(test: &str) -> Option<Self> {
        let required = std::env::var("KSTALL_KERNEL_TESTS").as_deref() == Ok("require");
        let Some(state) = std::env::var_os("KSTALL_CLUSTER").map(PathBuf::from) else {
            assert!(
                !required,
                "{test}: required here, but KSTALL_CLUSTER names no cluster (cargo xtask test runs it)"
            );
            println!(
                "skipping {test}: no cluster (cargo xtask cluster up, then KSTALL_CLUSTER=/var/lib/kstall-cluster)"
            );
            return None;
        };
        let cluster = Self {
            netns: PathBuf::from("/run/netns/kstall-cluster"),
            kubeconfig: state.join("pki/admin.kubeconfig"),
            state: state.clone(),
        };
        assert!(
            cluster.netns.exists() && cluster.kubeconfig.exists(),
            "{test}: no cluster at {}",
            state.display()
        );
        Some(cluster)
    }

    /// `program` inside the cluster's network namespace.
    pub fn inside(&self, program: &str) -> Command {
        let mut cmd = Command::new("nsenter");
        cmd.arg(format!("--net={}", self.netns.display())).arg("--").arg(program);
        cmd
    }

    /// Where the cluster keeps its state (the kubelet's root is `run/kubelet/` in it).
    pub fn state_dir(&self) -> &Path {
        &self.state
    }

    /// The admin's kubeconfig, for a program that runs kubectl itself (the kubectl plugin).
    pub fn kubeconfig(&self) -> &Path {
        &self.kubeconfig
    }

    /// kubectl as the cluster's admin (the machine's kubectl: its kustomize reads deploy/).
    pub fn kubectl_command(&self, args: &[&str]) -> Command {
        let mut cmd = self.inside("kubectl");
        cmd.arg("--kubeconfig").arg(&self.kubeconfig).args(args);
        cmd
    }

    pub fn try_kubectl(&self, args: &[&str]) -> Output {
        self.kubectl_command(args).output().expect("run kubectl")
    }

    /// kubectl's output; panics with its error.
    pub fn kubectl(&self, args: &[&str]) -> String {
        kubectl_succeeded(self.try_kubectl(args), args)
    }

    pub fn json(&self, args: &[&str]) -> Value {
        let mut args = args.to_vec();
        args.extend(["-o", "json"]);
        serde_json::from_str(&self.kubectl(&args)).expect("kubectl's JSON")
    }

    /// `kubectl apply -f -` of `yaml`.
    pub fn apply(&self, yaml: &str) {
        let mut child = self
            .kubectl_command(&["apply", "-f", "-"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("kubectl apply");
        child.stdin.take().expect("stdin").write_all(yaml.as_bytes()).expect("to kubectl");
        let out = child.wait_with_output().expect("kubectl apply");
        assert!(
            out.status.success(),
            "kubectl apply: {}\n{yaml}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }

    /// `kubectl apply -k deploy/overlays/<overlay>`, as a user installs kstall.
    pub fn apply_overlay(&self, overlay: &str) {
        let dir = deploy_dir().join("overlays").join(overlay);
        self.kubectl(&["apply", "-k", &dir.display().to_string()]);
    }

    /// `deploy/overlays/<overlay>` with `args` added to the agent's, applied from a
    /// kustomization of the test's own that uses the overlay as a user's would.
    pub fn apply_overlay_with_args(&self, overlay: &str, args: &[&str]) {
        let dir = tempfile::tempdir().expect("a directory for the kustomization");
        let base = relative(dir.path(), &deploy_dir().join("overlays").join(overlay));
        let patches: String = args
            .iter()
            .map(|arg| {
                format!(
                    "      - {{op: add, path: /spec/template/spec/containers/0/args/-, value: \"{arg}\"}}\n"
                )
            })
            .collect();
        let kustomization = format!(
            "resources: [{}]\npatches:\n  - target: {{group: apps, kind: DaemonSet, name: kstall}}\n    patch: |-\n{patches}",
            base.display()
        );
        std::fs::write(dir.path().join("kustomization.yaml"), kustomization).expect("the kustomization");
        self.kubectl(&["apply", "-k", &dir.path().display().to_string()]);
    }

    /// The pod of `namespace` matching `selector` once its Ready condition is True.
    pub fn ready_pod(&self, namespace: &str, selector: &str) -> Option<Value> {
        wait_for(POD_READY_WITHIN, || {
            let pods = self.json(&["-n", namespace, "get", "pods", "-l", selector]);
            pods["items"].as_array()?.iter().find(|p| is_ready(p)).cloned()
        })
    }

    /// The pod of DaemonSet `namespace/name` that runs its current template, once Ready: not a
    /// pod of an earlier template, still Ready while its replacement starts (an apply returns
    /// before the rollout begins). The DaemonSet's template generation is in its
    /// `deprecated.daemonset.template.generation` annotation, and on its pods as the label
    /// `pod-template-generation`.
    pub fn current_daemon_pod(&self, namespace: &str, name: &str) -> Option<Value> {
        wait_for(POD_READY_WITHIN, || {
            let daemonset = self.json(&["-n", namespace, "get", "daemonset", name]);
            let generation =
                daemonset["metadata"]["annotations"]["deprecated.daemonset.template.generation"].as_str()?;
            let selector: Vec<String> = daemonset["spec"]["selector"]["matchLabels"]
                .as_object()?
                .iter()
                .map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or_default()))
                .collect();
            let pods = self.json(&["-n", namespace, "get", "pods", "-l", &selector.join(",")]);
            pods["items"]
                .as_array()?
                .iter()
                .find(|p| {
                    is_ready(p)
                        && p["metadata"]["deletionTimestamp"].is_null()
                        && p["metadata"]["labels"]["pod-template-generation"].as_str() == Some(generation)
                })
                .cloned()
        })
    }

    /// The pod `namespace/name` once `pred` holds of it.
    pub fn pod_when(&self, namespace: &str, name: &str, pred: impl Fn(&Value) -> bool) -> Option<Value> {
        wait_for(POD_READY_WITHIN, || {
            let out = self.try_kubectl(&["-n", namespace, "get", "pod", name, "-o", "json"]);
            let pod: Value = serde_json::from_slice(&out.stdout).ok()?;
            pred(&pod).then_some(pod)
        })
    }

    /// The agent's metrics, from inside the namespace its host-network pod shares.
    pub fn agent_metrics(&self) -> String {
        let out =
            self.inside("curl").args(["-fsS", "--max-time", "5", "http://127.0.0.1:9700/metrics"]).output();
        out.map(|o| String::from_utf8_lossy(&o.stdout).into_owned()).unwrap_or_default()
    }

    /// The DaemonSet pod's logs (its current container).
    pub fn agent_logs(&self) -> String {
        let out =
            self.try_kubectl(&["-n", "kstall", "logs", "-l", "app.kubernetes.io/name=kstall", "--tail=200"]);
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Network devices of the host's own namespace whose other end is in the cluster's.
    pub fn links_from_the_host(&self) -> Vec<String> {
        let ids = Command::new("ip").args(["-j", "netns", "list-id"]).output().expect("ip netns list-id");
        let ids: Value = serde_json::from_slice(&ids.stdout).unwrap_or(Value::Null);
        let id = ids
            .as_array()
            .into_iter()
            .flatten()
            .find(|n| n["name"] == "kstall-cluster")
            .map(|n| n["nsid"].clone());
        let links = Command::new("ip").args(["-j", "-d", "link", "show"]).output().expect("ip link");
        let links: Value = serde_json::from_slice(&links.stdout).expect("ip -j link");
        links
            .as_array()
            .into_iter()
            .flatten()
            .filter(|l| id.is_some() && l.get("link_netnsid") == id.as_ref())
            .map(|l| l["ifname"].as_str().unwrap_or("?").to_string())
            .collect()
    }

    /// The kubelet's pid (`cargo xtask cluster up` keeps it).
    pub fn kubelet_pid(&self) -> i32 {
        let pid =
            std::fs::read_to_string(self.state.join("run/kubelet.pid")).expect("the kubelet's pid file");
        pid.trim().parse().expect("a pid")
    }
}

/// The stdout of a kubectl run with `args` (whichever kubectl); panics with its error.
pub fn kubectl_succeeded(out: Output, args: &[&str]) -> String {
    assert!(
        out.status.success(),
        "kubectl {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr).trim()
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

pub fn is_ready(pod: &Value) -> bool {
    pod["status"]["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|c| c["type"] == "Ready" && c["status"] == "True")
}

/// One request to the DaemonSet agent's API socket (the node's /run/kstall).
/// The probes an agent's status reports down, but `nfs`: it waits for sunrpc, which this host's
/// kernel lacks.
pub fn probes_down(status: &Value) -> Vec<&Value> {
    let probes = status["probes"].as_array().map(Vec::as_slice).unwrap_or_default();
    probes.iter().filter(|p| p["up"] != true && p["name"] != "nfs").collect()
}

pub fn agent_request(line: &str) -> std::io::Result<Value> {
    crate::agent::request(Path::new(AGENT_SOCKET), line)
}

/// The agent's incidents, or none while it does not answer (starting, restarting).
pub fn agent_incidents() -> Vec<Value> {
    agent_request(r#"{"request":"incidents"}"#)
        .map(|r| r["incidents"].as_array().cloned().unwrap_or_default())
        .unwrap_or_default()
}
