//! The running cluster: its network namespace, its six processes (each started in the namespace
//! by `nsenter --net`, in a session of its own so it outlives `cargo xtask cluster up`, with a
//! pid file and a log under the state directory), and their teardown.
//!
//! `nsenter --net`, not `ip netns exec`: the latter remounts /sys, which hides the cgroup mounts
//! from the kubelet. The namespace's only way out is a veth pair whose both ends are inside it.

use std::{
    os::unix::process::CommandExt as _,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context as _, bail};

use super::{
    NETNS, NODE, NODE_IP, POD_SUBNET,
    build::{Built, PAUSE_IMAGE},
    pki, state_dir,
};
use crate::build::workspace_root;

/// Started in this order, stopped in the reverse (an API server whose etcd went first hangs in
/// its shutdown).
const PROCESSES: &[&str] =
    &["etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "containerd", "kubelet"];
/// The host directories the DaemonSet's hostPath volumes create: removed at `down` when `up`
/// found them missing.
const HOST_PATHS: &[&str] = &["/run/kstall", "/var/lib/kstall"];
/// The run state's tmpfs: the images unpacked once per container (the native snapshotter), pods'
/// volumes and logs, etcd; a full cluster test run ends with 262 MiB in it.
const RUN_DISK_BYTES: u64 = 6 << 30;

fn netns_path() -> PathBuf {
    Path::new("/run/netns").join(NETNS)
}

fn pki_dir() -> PathBuf {
    state_dir().join("pki")
}

fn run_dir() -> PathBuf {
    state_dir().join("run")
}

pub fn admin_kubeconfig() -> PathBuf {
    pki_dir().join("admin.kubeconfig")
}

/// A command run inside the cluster's network namespace.
fn inside(program: impl AsRef<std::ffi::OsStr>) -> Command {
    let mut cmd = Command::new("nsenter");
    cmd.arg(format!("--net={}", netns_path().display())).arg("--").arg(program);
    cmd
}

/// The cluster's kubectl (v1.20.2), as admin, inside the namespace.
fn kubectl(built: &Built) -> Command {
    let mut cmd = inside(built.bin("kubectl"));
    cmd.arg("--kubeconfig").arg(admin_kubeconfig());
    cmd
}

pub fn up(built: &Built) -> anyhow::Result<()> {
    if alive("kube-apiserver").is_some() {
        bail!("cluster: already up (cargo xtask cluster down first)");
    }
    down()?;
    pki::ensure(&pki_dir())?;
    std::fs::create_dir_all(run_dir())?;
    mount_own_disk(&run_dir())?;
    let found: Vec<&str> = HOST_PATHS.iter().copied().filter(|p| Path::new(p).exists()).collect();
    std::fs::write(run_dir().join("host-paths-found"), found.join("\n"))?;
    netns()?;
    start_control_plane(built)?;
    start_node(built)?;
    Ok(())
}

/// A tmpfs of its own under the run state (containerd's images, the kubelet's root, etcd), so the
/// kubelet's disk accounting sees the cluster's bytes only. On the host's disk, a CI machine with
/// under 1% free made the kubelet's image GC (high threshold 100%) and its disk-pressure reclaim
/// delete every unused image, the pause image among them, before the first pod's sandbox.
fn mount_own_disk(dir: &Path) -> anyhow::Result<()> {
    let target = std::ffi::CString::new(dir.as_os_str().as_encoded_bytes())?;
    let options = format!("size={RUN_DISK_BYTES},mode=0755");
    let options = std::ffi::CString::new(options)?;
    // SAFETY: NUL-terminated strings that outlive the call.
    let mounted = unsafe {
        libc::mount(c"tmpfs".as_ptr(), target.as_ptr(), c"tmpfs".as_ptr(), 0, options.as_ptr().cast())
    };
    if mounted != 0 {
        bail!("cluster: mount a tmpfs on {}: {}", dir.display(), std::io::Error::last_os_error());
    }
    Ok(())
}

/// The namespace: loopback, the veth pair holding the node's address and the default route, and
/// the one rule kube-proxy would have made for in-cluster clients (the `kubernetes` Service's
/// 10.0.0.1:443 to the API server on loopback).
fn netns() -> anyhow::Result<()> {
    let ip = |args: &[&str]| sh(Command::new("ip").args(args), &format!("ip {}", args.join(" ")));
    ip(&["netns", "add", NETNS])?;
    let ns = |args: &[&str]| sh(inside("ip").args(args), &format!("ip {} (in {NETNS})", args.join(" ")));
    ns(&["link", "set", "lo", "up"])?;
    ns(&["link", "add", "kc0", "type", "veth", "peer", "name", "kc1"])?;
    ns(&["link", "set", "kc1", "up"])?;
    ns(&["addr", "add", &format!("{NODE_IP}/24"), "dev", "kc0"])?;
    ns(&["link", "set", "kc0", "up"])?;
    ns(&["route", "add", "default", "dev", "kc0"])?;
    sh(
        inside("iptables")
            .args(["-t", "nat", "-A", "OUTPUT", "-d", "10.0.0.1/32", "-p", "tcp", "--dport", "443"])
            .args(["-j", "DNAT", "--to-destination", "127.0.0.1:6443"]),
        "iptables DNAT for the kubernetes Service",
    )
}

fn start_control_plane(built: &Built) -> anyhow::Result<()> {
    let p = pki_dir();
    let r = run_dir();
    let pki = |f: &str| p.join(f).display().to_string();
    start(
        "etcd",
        inside("etcd").args([
            "--name",
            "kstall",
            "--data-dir",
            &r.join("etcd").display().to_string(),
            "--listen-client-urls",
            "http://127.0.0.1:2379",
            "--advertise-client-urls",
            "http://127.0.0.1:2379",
            "--listen-peer-urls",
            "http://127.0.0.1:2380",
            "--initial-advertise-peer-urls",
            "http://127.0.0.1:2380",
            "--initial-cluster",
            "kstall=http://127.0.0.1:2380",
        ]),
    )?;
    await_ok("etcd healthy", Duration::from_secs(30), || {
        inside("curl")
            .args(["-fs", "http://127.0.0.1:2379/health"])
            .output()
            .is_ok_and(|o| o.status.success())
    })?;
    start(
        "kube-apiserver",
        inside(built.bin("kube-apiserver")).args([
            "--etcd-servers=http://127.0.0.1:2379",
            "--bind-address=127.0.0.1",
            "--advertise-address=127.0.0.1",
            "--secure-port=6443",
            "--insecure-port=0",
            "--endpoint-reconciler-type=none",
            &format!("--tls-cert-file={}", pki("apiserver.crt")),
            &format!("--tls-private-key-file={}", pki("apiserver.key")),
            &format!("--client-ca-file={}", pki("ca.crt")),
            &format!("--service-account-key-file={}", pki("sa.pub")),
            &format!("--service-account-signing-key-file={}", pki("sa.key")),
            "--service-account-issuer=https://kubernetes.default.svc",
            "--service-cluster-ip-range=10.0.0.0/24",
            "--authorization-mode=Node,RBAC",
            "--enable-admission-plugins=NodeRestriction",
            &format!("--kubelet-client-certificate={}", pki("admin.crt")),
            &format!("--kubelet-client-key={}", pki("admin.key")),
            "--kubelet-preferred-address-types=InternalIP",
            "--allow-privileged=true",
            &format!("--cert-dir={}", r.join("apiserver-certs").display()),
        ]),
    )?;
    await_ok("the API server ready", Duration::from_secs(120), || {
        kubectl(built).args(["get", "--raw", "/readyz"]).output().is_ok_and(|o| o.status.success())
    })?;
    let kubeconfig = format!("--kubeconfig={}", admin_kubeconfig().display());
    // Without them no DaemonSet, Job or CronJob gets a pod, and no service account a token.
    start(
        "kube-controller-manager",
        inside(built.bin("kube-controller-manager")).args([
            &kubeconfig,
            "--leader-elect=false",
            &format!("--service-account-private-key-file={}", pki("sa.key")),
            &format!("--root-ca-file={}", pki("ca.crt")),
            "--use-service-account-credentials=true",
            "--bind-address=127.0.0.1",
            "--port=0",
            "--controllers=*,-nodeipam,-service,-route,-cloud-node-lifecycle",
        ]),
    )?;
    start(
        "kube-scheduler",
        inside(built.bin("kube-scheduler")).args([
            &kubeconfig,
            "--leader-elect=false",
            "--bind-address=127.0.0.1",
            "--port=0",
        ]),
    )
}

fn start_node(built: &Built) -> anyhow::Result<()> {
    let r = run_dir();
    let containerd_toml = r.join("containerd.toml");
    std::fs::write(&containerd_toml, containerd_config(&r))?;
    std::fs::create_dir_all(r.join("cni-conf"))?;
    std::fs::write(r.join("cni-conf/10-kstall.conflist"), cni_config(&r))?;
    let kubelet_config = r.join("kubelet-config.yaml");
    std::fs::write(&kubelet_config, kubelet_config_text(&r))?;
    start("containerd", inside("containerd").arg("--config").arg(&containerd_toml))?;
    let socket = r.join("containerd.sock");
    await_ok("containerd's socket", Duration::from_secs(30), || {
        ctr(&socket).arg("version").output().is_ok_and(|o| o.status.success())
    })?;
    let mut archives = built.images();
    let kstall = workspace_root().join(format!("target/image/kstall-{}.oci.tar", crate::image::VERSION));
    if kstall.exists() {
        archives.push(kstall);
    } else {
        println!("cluster: no kstall image yet ({}): cargo xtask image makes it", kstall.display());
    }
    for archive in archives {
        sh(
            ctr(&socket).args(["-n", "k8s.io", "images", "import", "--snapshotter", "native"]).arg(&archive),
            &format!("ctr images import {}", archive.display()),
        )?;
    }
    // Its credential provider would otherwise probe a cloud metadata address at start.
    let mut kubelet = inside(built.bin("kubelet"));
    kubelet
        .env("AWS_EC2_METADATA_DISABLED", "true")
        .arg(format!("--config={}", kubelet_config.display()))
        .arg(format!("--kubeconfig={}", pki_dir().join("kubelet.kubeconfig").display()))
        .args(["--container-runtime=remote"])
        .arg(format!("--container-runtime-endpoint=unix://{}", socket.display()))
        .arg(format!("--hostname-override={NODE}"))
        .arg(format!("--node-ip={NODE_IP}"))
        .arg(format!("--root-dir={}", r.join("kubelet").display()))
        // Localhost seccomp profiles: under the root dir (1.20's default is /var/lib/kubelet/seccomp
        // whatever the root), as a node's bootstrap would place kstall's.
        .arg(format!("--seccomp-profile-root={}", r.join("kubelet/seccomp").display()))
        .arg(format!("--cert-dir={}", r.join("kubelet/pki").display()))
        .arg("--v=2");
    start("kubelet", &mut kubelet)?;
    await_ok("the node Ready", Duration::from_secs(180), || {
        kubectl(built)
            .args(["get", "node", NODE, "-o", "jsonpath={.status.conditions[?(@.type==\"Ready\")].status}"])
            .output()
            .is_ok_and(|o| o.stdout == b"True")
    })
}

fn ctr(socket: &Path) -> Command {
    let mut cmd = Command::new("ctr");
    cmd.arg("--address").arg(socket);
    cmd
}

fn containerd_config(r: &Path) -> String {
    let r = r.display();
    format!(
        "version = 2\nroot = \"{r}/containerd/root\"\nstate = \"{r}/containerd/state\"\n[grpc]\n  address = \"{r}/containerd.sock\"\n\
         [plugins.\"io.containerd.grpc.v1.cri\"]\n  sandbox_image = \"{PAUSE_IMAGE}\"\n  disable_apparmor = true\n  \
         restrict_oom_score_adj = true\n  netns_mounts_under_state_dir = true\n  \
         [plugins.\"io.containerd.grpc.v1.cri\".containerd]\n    snapshotter = \"native\"\n    default_runtime_name = \"runc\"\n    \
         [plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.runc]\n      runtime_type = \"io.containerd.runc.v2\"\n      \
         [plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.runc.options]\n        SystemdCgroup = false\n  \
         [plugins.\"io.containerd.grpc.v1.cri\".cni]\n    bin_dir = \"/usr/lib/cni\"\n    conf_dir = \"{r}/cni-conf\"\n"
    )
}

fn cni_config(r: &Path) -> String {
    serde_json::json!({
        "cniVersion": "0.4.0",
        "name": "kstall-pods",
        "plugins": [
            {"type": "bridge", "bridge": "kcni0", "isGateway": true, "ipMasq": false, "hairpinMode": true,
             "ipam": {"type": "host-local", "dataDir": r.join("cni-ipam"),
                      "ranges": [[{"subnet": POD_SUBNET}]], "routes": [{"dst": "0.0.0.0/0"}]}},
            {"type": "loopback"}
        ]
    })
    .to_string()
}

/// The kubelet serves on the node's address only, as hardened nodes do; cgroupfs, as containerd.
fn kubelet_config_text(r: &Path) -> String {
    let ca = pki_dir().join("ca.crt");
    format!(
        "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\naddress: {NODE_IP}\nport: 10250\n\
         readOnlyPort: 0\nhealthzBindAddress: 127.0.0.1\nhealthzPort: 10248\nauthentication:\n  anonymous: {{enabled: false}}\n  \
         webhook: {{enabled: false}}\n  x509: {{clientCAFile: {}}}\nauthorization: {{mode: AlwaysAllow}}\ncgroupDriver: cgroupfs\n\
         failSwapOn: false\nstaticPodPath: {}\nnodeStatusUpdateFrequency: 10s\n\
         evictionHard: {{memory.available: \"100Mi\", nodefs.available: \"1%\", imagefs.available: \"1%\"}}\n\
         imageGCHighThresholdPercent: 100\nimageGCLowThresholdPercent: 99\n",
        ca.display(),
        r.join("manifests").display()
    )
}

/// Starts `cmd` in a session of its own (it outlives this program), its output in the log.
fn start(name: &str, cmd: &mut Command) -> anyhow::Result<()> {
    let logs = run_dir().join("logs");
    std::fs::create_dir_all(&logs)?;
    let log = std::fs::File::create(logs.join(format!("{name}.log")))?;
    // SAFETY: setsid is async-signal-safe.
    let child = unsafe {
        cmd.stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .pre_exec(|| {
                libc::setsid();
                Ok(())
            })
            .spawn()
    }
    .with_context(|| format!("cluster: cannot start {name}"))?;
    std::fs::write(run_dir().join(format!("{name}.pid")), child.id().to_string())?;
    println!("cluster: started {name} (pid {})", child.id());
    Ok(())
}

/// The pid of a cluster process that is running.
fn alive(name: &str) -> Option<i32> {
    let pid: i32 =
        std::fs::read_to_string(run_dir().join(format!("{name}.pid"))).ok()?.trim().parse().ok()?;
    // SAFETY: signal 0 only checks.
    (unsafe { libc::kill(pid, 0) } == 0).then_some(pid)
}

fn await_ok(what: &str, within: Duration, mut ok: impl FnMut() -> bool) -> anyhow::Result<()> {
    let started = Instant::now();
    while started.elapsed() < within {
        if ok() {
            println!("cluster: {what} after {:.1} s", started.elapsed().as_secs_f64());
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(250));
    }
    bail!("cluster: not {what} within {} s; logs in {}", within.as_secs(), run_dir().join("logs").display())
}

fn sh(cmd: &mut Command, what: &str) -> anyhow::Result<()> {
    let out = cmd.output().with_context(|| format!("cluster: cannot run {what}"))?;
    if !out.status.success() {
        bail!("cluster: {what} failed: {}", String::from_utf8_lossy(&out.stderr).trim());
    }
    Ok(())
}

/// Stops what runs (pods first, so the kubelet tears their sandboxes and networks down), then
/// unmounts the state directory's mounts, removes the namespace, the pods' cgroups and the
/// run state; keeps the certificates and the build.
pub fn down() -> anyhow::Result<()> {
    let built = Built::at(&super::cache_dir());
    if alive("kubelet").is_some() && alive("kube-apiserver").is_some() {
        let _ = kubectl(&built)
            .args(["delete", "pods", "--all", "-A", "--grace-period=1", "--wait=true", "--timeout=60s"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
    for name in PROCESSES.iter().rev() {
        let Some(pid) = alive(name) else { continue };
        // SAFETY: signalling a pid this cluster started.
        unsafe { libc::kill(pid, libc::SIGTERM) };
        let started = Instant::now();
        while alive(name).is_some() && started.elapsed() < Duration::from_secs(10) {
            std::thread::sleep(Duration::from_millis(100));
        }
        if let Some(pid) = alive(name) {
            // SAFETY: as above.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
        println!("cluster: stopped {name}");
    }
    let r = run_dir();
    // Shims, and the containers under them, of pods the kubelet did not get to.
    let socket = r.join("containerd.sock");
    let _ = Command::new("pkill")
        .arg("-9")
        .arg("-f")
        .arg(format!("containerd-shim-runc-v2 .*-address {}", socket.display()))
        .status();
    // Read before the run state's tmpfs goes.
    let found = std::fs::read_to_string(r.join("host-paths-found")).ok();
    unmount_under(&state_dir());
    if netns_path().exists() {
        sh(Command::new("ip").args(["netns", "delete", NETNS]), "ip netns delete")?;
    }
    remove_pod_cgroups();
    if let Some(found) = found {
        for path in HOST_PATHS.iter().filter(|p| !found.lines().any(|l| l == **p)) {
            let _ = std::fs::remove_dir_all(path);
        }
    }
    if r.exists() {
        std::fs::remove_dir_all(&r).with_context(|| format!("cluster: remove {}", r.display()))?;
    }
    Ok(())
}

fn unmount_under(dir: &Path) {
    let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap_or_default();
    let prefix = format!("{}/", dir.display());
    let mut points: Vec<&str> = mounts
        .lines()
        .filter_map(|l| l.split_whitespace().nth(1))
        .filter(|m| m.starts_with(&prefix))
        .collect();
    points.sort_by_key(|m| std::cmp::Reverse(m.len()));
    for point in points {
        let target = std::ffi::CString::new(point).expect("a mount point");
        // SAFETY: a NUL-terminated path; a busy mount is detached.
        if unsafe { libc::umount2(target.as_ptr(), 0) } != 0 {
            unsafe { libc::umount2(target.as_ptr(), libc::MNT_DETACH) };
        }
    }
}

/// The kubelet's `kubepods` cgroups, in every hierarchy (cgroupfs driver), deepest first.
fn remove_pod_cgroups() {
    let Ok(hierarchies) = std::fs::read_dir("/sys/fs/cgroup") else { return };
    for hierarchy in hierarchies.flatten() {
        let root = hierarchy.path().join("kubepods");
        if root.is_dir() {
            remove_tree(&root);
        }
    }
    if Path::new("/sys/fs/cgroup/kubepods").is_dir() {
        remove_tree(Path::new("/sys/fs/cgroup/kubepods"));
    }
}

fn remove_tree(dir: &Path) {
    if let Ok(entries) = std::fs::read_dir(dir) {
        for entry in entries.flatten() {
            if entry.file_type().is_ok_and(|t| t.is_dir()) {
                remove_tree(&entry.path());
            }
        }
    }
    let _ = std::fs::remove_dir(dir);
}

pub fn status(built: &Built) -> anyhow::Result<()> {
    for name in PROCESSES {
        match alive(name) {
            Some(pid) => println!("{name:<24} running (pid {pid})"),
            None => println!("{name:<24} not running"),
        }
    }
    if alive("kube-apiserver").is_none() {
        println!("cluster: down (cargo xtask cluster up)");
        return Ok(());
    }
    let _ = kubectl(built).args(["get", "nodes", "-o", "wide"]).status();
    print_how_to_reach(built);
    Ok(())
}

pub fn print_how_to_reach(built: &Built) {
    println!(
        "cluster: Kubernetes v1.20.2, node {NODE} ({NODE_IP}), in network namespace {NETNS} (no route out)\n\
         cluster: kubectl: nsenter --net={} {} --kubeconfig {} get pods -A\n\
         cluster: (or a newer kubectl with kustomize: nsenter --net={} kubectl --kubeconfig {} apply -k deploy/overlays/node-conditions)\n\
         cluster: logs in {}",
        netns_path().display(),
        built.bin("kubectl").display(),
        admin_kubeconfig().display(),
        netns_path().display(),
        admin_kubeconfig().display(),
        run_dir().join("logs").display()
    );
}
