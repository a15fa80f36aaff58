//! kstall as a cluster runs it: the image `cargo xtask image` built, under podman, with the
//! rendered DaemonSet's pod template — its capabilities, seccomp profile, read-only root, host
//! mounts, host PID and network — and what the kubelet adds to every pod: the node name from the
//! downward API, a service account token, the API server's address. The API server is
//! [`ApiServer`], speaking the list/watch the agent's pod source uses, over TLS as in a cluster.

use std::{
    net::SocketAddr,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::Duration,
};

use serde_json::{Value, json};

use crate::{alerting::http_get, host::wait_for};

/// Where the kubelet mounts a pod's service account.
const SERVICE_ACCOUNT: &str = "/var/run/secrets/kubernetes.io/serviceaccount";
/// The node the played pod pretends to run on (`spec.nodeName` through the downward API).
pub const NODE: &str = "node-a";
/// The DaemonSet's `--listen` (it binds the node's port 9700).
pub const METRICS: &str = "127.0.0.1:9700";

/// The image to run: `KSTALL_IMAGE` (set by `cargo xtask test`, which builds it), else the tag
/// `cargo xtask image` gives.
pub fn image() -> String {
    std::env::var("KSTALL_IMAGE").unwrap_or_else(|_| "localhost/kstall:0.1.0".into())
}

/// podman with this workplace's containers.conf (runc; ulimits this sandbox allows), written by
/// `cargo xtask image` into target/image/.
pub fn podman() -> Command {
    let mut cmd = Command::new("podman");
    let conf = Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/image/containers.conf");
    if std::env::var_os("CONTAINERS_CONF").is_none() && conf.exists() {
        cmd.env("CONTAINERS_CONF", conf);
    }
    cmd
}

/// Whether podman has `image`; the reason when not.
pub fn image_missing(image: &str) -> Option<String> {
    match podman().args(["image", "exists", image]).status() {
        Ok(s) if s.success() => None,
        Ok(_) => Some(format!("podman has no image {image} (run `cargo xtask image`)")),
        Err(e) => Some(format!("cannot run podman: {e}")),
    }
}

/// A TLS API server on 127.0.0.1 listing `pods` and holding watches open, with the CA, token and
/// namespace files the kubelet would mount into the agent's pod. Stopped on drop.
pub struct ApiServer {
    child: Child,
    pub port: u16,
    dir: tempfile::TempDir,
}

impl ApiServer {
    pub fn start(pods: &[Value]) -> Self {
        let dir = tempfile::tempdir().expect("api server dir");
        let d = dir.path();
        crate::tls::make_certificates(d);
        let account = d.join("serviceaccount");
        std::fs::create_dir(&account).unwrap();
        std::fs::copy(d.join("ca.crt"), account.join("ca.crt")).unwrap();
        std::fs::write(account.join("token"), "kstall-test-token").unwrap();
        std::fs::write(account.join("namespace"), "kstall").unwrap();
        let list = json!({"items": pods});
        std::fs::write(d.join("pods.json"), list.to_string()).unwrap();
        let script = d.join("apiserver.py");
        std::fs::write(&script, include_str!("apiserver.py")).unwrap();
        let port_file = d.join("port");
        let child = Command::new("python3")
            .arg(&script)
            .args([d.join("pods.json"), d.join("server.crt"), d.join("server.key"), port_file.clone()])
            .arg(d.join("events.jsonl"))
            .stdout(Stdio::null())
            .spawn()
            .expect("start the API server");
        let port =
            wait_for(Duration::from_secs(10), || std::fs::read_to_string(&port_file).ok()?.parse().ok())
                .expect("the API server did not start");
        ApiServer { child, port, dir }
    }

    /// The Event writes it took (`{"method", "path", "body"}`), in order.
    pub fn event_writes(&self) -> Vec<Value> {
        let text = std::fs::read_to_string(self.dir.path().join("events.jsonl")).unwrap_or_default();
        text.lines().filter_map(|l| serde_json::from_str(l).ok()).collect()
    }

    /// Lists `pods` from now on; open watches expire, so clients list again.
    pub fn set_pods(&self, pods: &[Value]) {
        let path = self.dir.path().join("pods.json");
        let tmp = path.with_extension("tmp");
        std::fs::write(&tmp, json!({"items": pods}).to_string()).unwrap();
        std::fs::rename(tmp, path).unwrap();
    }

    /// The server's certificate and key (for 127.0.0.1), for other test servers to present.
    pub fn certificate(&self) -> (PathBuf, PathBuf) {
        (self.dir.path().join("server.crt"), self.dir.path().join("server.key"))
    }

    /// A kubeconfig for this server, as `--kubeconfig` takes one: its CA and the token.
    pub fn kubeconfig(&self) -> PathBuf {
        let path = self.dir.path().join("kubeconfig");
        let ca = self.dir.path().join("ca.crt");
        let text = format!(
            "apiVersion: v1\nkind: Config\ncurrent-context: test\n\
             clusters: [{{name: test, cluster: {{server: 'https://127.0.0.1:{}', certificate-authority: '{}'}}}}]\n\
             contexts: [{{name: test, context: {{cluster: test, user: test}}}}]\n\
             users: [{{name: test, user: {{token: kstall-test-token}}}}]\n",
            self.port,
            ca.display()
        );
        std::fs::write(&path, text).unwrap();
        path
    }

    /// The directory to mount at the kubelet's service-account path.
    pub fn service_account(&self) -> PathBuf {
        self.dir.path().join("serviceaccount")
    }
}

impl Drop for ApiServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// What a test changes on top of the DaemonSet's settings.
#[derive(Clone, Default)]
pub struct Overrides {
    /// Capabilities to take out of the DaemonSet's `add` list (as spelled there, e.g. `SYSLOG`).
    pub without_capabilities: Vec<String>,
}

/// The agent's container, run by `podman run` with the DaemonSet's pod template translated
/// setting by setting; removed on drop. (`podman kube play` of the same spec would be the obvious
/// way, but podman 4.3 silently ignores `hostPID` and `seccompProfile` — checked — so the
/// translation is explicit, and a setting it does not know fails the test instead of being
/// dropped.)
pub struct AgentContainer {
    pub name: String,
    pub run_dir: tempfile::TempDir,
    /// The readiness probe's `httpGet` path.
    pub readiness_path: String,
}

impl AgentContainer {
    pub fn run(daemonset: &Value, api: &ApiServer, overrides: &Overrides) -> Self {
        let run_dir = tempfile::tempdir().expect("run dir");
        // As the kubelet makes an emptyDir: writable for a non-root agent too.
        std::fs::set_permissions(run_dir.path(), std::os::unix::fs::PermissionsExt::from_mode(0o777))
            .unwrap();
        // The `state` hostPath: the test's own, not the host's /var/lib/kstall.
        let state_dir = run_dir.path().join("state");
        std::fs::create_dir(&state_dir).unwrap();
        std::fs::set_permissions(&state_dir, std::os::unix::fs::PermissionsExt::from_mode(0o777)).unwrap();
        let name = format!("kstall-test-{}", std::process::id());
        let _ = podman().args(["rm", "--force", &name]).output();
        let translated =
            podman_run_args(&daemonset["spec"]["template"]["spec"], api, run_dir.path(), overrides);
        let out = podman()
            .args(["run", "--detach", "--name", &name])
            .args(&translated.args)
            .output()
            .expect("run podman");
        let container = AgentContainer { name, run_dir, readiness_path: translated.readiness_path };
        assert!(
            out.status.success(),
            "podman run {:?}: {}",
            translated.args,
            String::from_utf8_lossy(&out.stderr)
        );
        container
    }

    pub fn logs(&self) -> String {
        let out = podman().args(["logs", &self.name]).output().expect("podman logs");
        format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
    }

    /// `kstall <args>` inside the container, as `kubectl exec` runs it: stdout, or why it failed.
    pub fn exec_kstall(&self, args: &[&str]) -> Result<String, String> {
        let out =
            podman().args(["exec", &self.name, "kstall"]).args(args).output().map_err(|e| e.to_string())?;
        if out.status.success() {
            Ok(String::from_utf8_lossy(&out.stdout).into_owned())
        } else {
            Err(format!("exit {}: {}", out.status, String::from_utf8_lossy(&out.stderr)))
        }
    }

    /// The agent's status document through `kstall status --output json` in the container, once
    /// the agent answers (`None` if it never does within `timeout`).
    pub fn status(&self, timeout: Duration) -> Option<Value> {
        wait_for(timeout, || {
            serde_json::from_str(&self.exec_kstall(&["status", "--output", "json"]).ok()?).ok()
        })
    }

    /// The agent's uid on the host, as the kernel has it.
    pub fn uid(&self) -> u32 {
        let out = podman()
            .args(["inspect", "--format", "{{.State.Pid}}", &self.name])
            .output()
            .expect("podman inspect");
        let pid = String::from_utf8_lossy(&out.stdout).trim().to_string();
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("the agent's status");
        let uids = status.lines().find_map(|l| l.strip_prefix("Uid:")).expect("Uid line");
        uids.split_whitespace().next().unwrap().parse().unwrap()
    }

    /// The API socket, as the host sees it through the `run` hostPath.
    pub fn socket(&self) -> PathBuf {
        self.run_dir.path().join("kstall.sock")
    }

    pub fn get(&self, path: &str) -> Option<String> {
        http_get(METRICS.parse::<SocketAddr>().unwrap(), path)
    }

    pub fn metrics(&self) -> Option<String> {
        self.get("/metrics")
    }
}

impl Drop for AgentContainer {
    fn drop(&mut self) {
        let _ = podman().args(["rm", "--force", "--time", "10", &self.name]).output();
    }
}

struct Translated {
    args: Vec<String>,
    readiness_path: String,
}

/// `podman run` arguments for the pod spec `spec`, plus what the kubelet adds to every pod (the
/// downward API's node name, the service account, the API server's address); the `run` hostPath
/// goes to `run_dir` and the `state` one to its `state`, so that the test's agent has its own
/// socket and incident history. Panics on a setting it does
/// not translate.
fn podman_run_args(spec: &Value, api: &ApiServer, run_dir: &Path, overrides: &Overrides) -> Translated {
    let mut args: Vec<String> = Vec::new();
    let object = spec.as_object().expect("a pod spec");
    for (key, value) in object {
        match key.as_str() {
            "hostPID" if value == true => flag(&mut args, "--pid", "host".into()),
            "hostNetwork" if value == true => flag(&mut args, "--network", "host".into()),
            // Scheduling and DNS: nothing the container runs with (the agent resolves no names).
            "serviceAccountName" | "dnsPolicy" | "priorityClassName" | "tolerations" => {}
            "containers" | "volumes" => {}
            _ => panic!("podman translation: pod setting {key}: {value} not translated"),
        }
    }
    assert_eq!(spec["containers"].as_array().map(Vec::len), Some(1), "one container");
    let container = &spec["containers"][0];
    let volumes = spec["volumes"].as_array().expect("volumes");
    let mut readiness_path = String::new();
    let mut image_and_args = Vec::new();
    for (key, value) in container.as_object().expect("a container") {
        match key.as_str() {
            "name" => {}
            "image" => {}
            "args" => {
                image_and_args =
                    value.as_array().expect("args").iter().map(|a| a.as_str().unwrap().to_string()).collect()
            }
            "env" => {
                for var in value.as_array().expect("env") {
                    let value = match (&var["value"], &var["valueFrom"]["fieldRef"]["fieldPath"]) {
                        (Value::String(v), _) => v.clone(),
                        (_, f) if f == "spec.nodeName" => NODE.to_string(),
                        // The played node's address: loopback, where its stand-in kubelet serves.
                        (_, f) if f == "status.hostIP" => "127.0.0.1".to_string(),
                        _ => panic!("podman translation: env {var} not translated"),
                    };
                    flag(&mut args, "--env", format!("{}={value}", var["name"].as_str().unwrap()));
                }
            }
            // With host networking a port declares nothing at run time (the agent binds the
            // node's port itself); podman refuses port mappings there.
            "ports" => {}
            "readinessProbe" => {
                readiness_path = value["httpGet"]["path"].as_str().expect("an httpGet probe").to_string()
            }
            "resources" => {
                if let Some(memory) = value["limits"]["memory"].as_str() {
                    let mib = memory.strip_suffix("Mi").expect("a limit in Mi");
                    flag(&mut args, "--memory", format!("{mib}m"));
                }
            }
            "securityContext" => {
                for (key, value) in value.as_object().expect("securityContext") {
                    match key.as_str() {
                        "capabilities" => {
                            for drop in value["drop"].as_array().into_iter().flatten() {
                                flag(&mut args, "--cap-drop", drop.as_str().unwrap().to_string());
                            }
                            for add in value["add"].as_array().into_iter().flatten() {
                                let add = add.as_str().unwrap();
                                if !overrides.without_capabilities.iter().any(|w| w == add) {
                                    flag(&mut args, "--cap-add", add.to_string());
                                }
                            }
                        }
                        "readOnlyRootFilesystem" if value == true => args.push("--read-only".into()),
                        "allowPrivilegeEscalation" if value == true => {}
                        "runAsNonRoot" if value == true => {
                            assert!(
                                value_of(container, "runAsUser").is_some_and(|u| u != 0),
                                "runAsNonRoot needs a user"
                            )
                        }
                        "runAsUser" => {
                            let group = value_of(container, "runAsGroup").unwrap_or(0);
                            flag(&mut args, "--user", format!("{value}:{group}"))
                        }
                        "runAsGroup" => {}
                        "allowPrivilegeEscalation" if value == false => {
                            flag(&mut args, "--security-opt", "no-new-privileges".into())
                        }
                        "seccompProfile" if value["type"] == "Unconfined" => {
                            flag(&mut args, "--security-opt", "seccomp=unconfined".into())
                        }
                        // Podman 4.3's default profile refuses bpf() without SYS_ADMIN, where
                        // containerd's allows it with BPF: under podman the agent runs under
                        // kstall's own profile, as deploy/README.md tells podman and CRI-O users —
                        // which covers runc only where it loads the filter last (no new
                        // privileges); the non-root variant runs unconfined.
                        "seccompProfile" if value["type"] == "RuntimeDefault" => {
                            let profile = crate::deploy::deploy_dir().join("seccomp/kstall.json");
                            let profile = if container["securityContext"]["allowPrivilegeEscalation"] == false
                            {
                                format!("seccomp={}", profile.display())
                            } else {
                                "seccomp=unconfined".into()
                            };
                            flag(&mut args, "--security-opt", profile)
                        }
                        _ => panic!("podman translation: securityContext {key}: {value} not translated"),
                    }
                }
            }
            "volumeMounts" => {
                for mount in value.as_array().expect("volumeMounts") {
                    let volume =
                        volumes.iter().find(|v| v["name"] == mount["name"]).expect("the mount's volume");
                    let host = match volume["name"].as_str() {
                        Some("run") => run_dir.to_str().unwrap().to_string(),
                        Some("state") => run_dir.join("state").to_str().unwrap().to_string(),
                        _ => volume["hostPath"]["path"].as_str().expect("a hostPath volume").to_string(),
                    };
                    let mode = if mount["readOnly"] == true { ":ro" } else { "" };
                    flag(
                        &mut args,
                        "--volume",
                        format!("{host}:{}{mode}", mount["mountPath"].as_str().unwrap()),
                    );
                }
            }
            _ => panic!("podman translation: container setting {key}: {value} not translated"),
        }
    }
    // What the kubelet gives every pod with a service account.
    flag(&mut args, "--env", "KUBERNETES_SERVICE_HOST=127.0.0.1".into());
    flag(&mut args, "--env", format!("KUBERNETES_SERVICE_PORT={}", api.port));
    flag(&mut args, "--volume", format!("{}:{SERVICE_ACCOUNT}:ro", api.service_account().display()));
    args.push(image());
    args.extend(image_and_args);
    Translated { args, readiness_path }
}

fn flag(args: &mut Vec<String>, name: &str, value: String) {
    args.push(name.into());
    args.push(value);
}

fn value_of(container: &Value, security_setting: &str) -> Option<u64> {
    container["securityContext"][security_setting].as_u64()
}
