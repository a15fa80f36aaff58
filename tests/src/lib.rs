//! Helpers for kstall's kernel integration tests: they need root and a real kernel, trigger the
//! real thing, and assert on what a real `kstall agent` saw. Everything a test creates (network
//! namespaces, iptables rules inside them, the agent process) is owned by a guard that removes it
//! on drop, also when the test fails.

use std::{
    io::{BufRead as _, BufReader, Read as _, Write as _},
    net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream},
    os::{fd::AsRawFd as _, unix::net::UnixStream},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::{Arc, Mutex},
    thread,
    time::{Duration, Instant},
};

use serde_json::Value;

pub mod alerting;
pub mod container;
pub mod dashboards;
pub mod deploy;
pub mod nfs;
pub mod writeback;

/// Returns false (after printing why) when kernel tests cannot run here; panics instead when they
/// are required (`KSTALL_KERNEL_TESTS=require`, set by `cargo xtask test` as root and in CI).
pub fn kernel_tests_can_run(test: &str) -> bool {
    let required = std::env::var("KSTALL_KERNEL_TESTS").as_deref() == Ok("require");
    let reason = if unsafe { libc::geteuid() } != 0 {
        Some("needs root".to_string())
    } else if !Path::new("/sys/kernel/btf/vmlinux").exists() {
        Some("kernel has no BTF".to_string())
    } else if !agent_binary().exists() {
        Some(format!("no agent binary at {} (run `cargo xtask test`)", agent_binary().display()))
    } else {
        None
    };
    match reason {
        None => true,
        Some(reason) if required => panic!("{test}: kernel tests are required here but {reason}"),
        Some(reason) => {
            println!("skipping {test}: {reason}");
            false
        }
    }
}

/// The release agent: `KSTALL_BIN`, or target/release/kstall of this workspace.
pub fn agent_binary() -> PathBuf {
    std::env::var_os("KSTALL_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/release/kstall"))
}

pub fn run(cmd: &str, args: &[&str]) -> String {
    let out = Command::new(cmd).args(args).output().unwrap_or_else(|e| panic!("{cmd}: {e}"));
    assert!(out.status.success(), "{cmd} {args:?} failed: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A named network namespace (`ip netns add`), deleted on drop with everything in it (its
/// iptables rules and loopback).
pub struct NetNs {
    pub name: String,
}

impl NetNs {
    pub fn new(tag: &str) -> Self {
        let name = format!("kstall-{tag}-{}", std::process::id());
        run("ip", &["netns", "add", &name]);
        let ns = NetNs { name };
        ns.exec("ip", &["link", "set", "lo", "up"]);
        ns
    }

    pub fn exec(&self, cmd: &str, args: &[&str]) -> String {
        let mut full = vec!["netns", "exec", &self.name, cmd];
        full.extend_from_slice(args);
        run("ip", &full)
    }

    /// The sidecar's rule: nat OUTPUT REDIRECT of tcp/`from` to local port `to` (`iptables` or
    /// `ip6tables`).
    pub fn redirect_tcp(&self, iptables: &str, from: u16, to: u16) {
        let (from, to) = (from.to_string(), to.to_string());
        self.exec(
            iptables,
            &[
                "-t",
                "nat",
                "-A",
                "OUTPUT",
                "-p",
                "tcp",
                "--dport",
                &from,
                "-j",
                "REDIRECT",
                "--to-ports",
                &to,
            ],
        );
    }

    pub fn path(&self) -> PathBuf {
        Path::new("/run/netns").join(&self.name)
    }

    /// The namespace's inode: what kstall reports as `netns`.
    pub fn inode(&self) -> u64 {
        std::os::unix::fs::MetadataExt::ino(&std::fs::metadata(self.path()).expect("netns file"))
    }

    /// Runs `f` on a thread that has entered this namespace (setns is per thread).
    pub fn run_inside<T: Send + 'static>(&self, f: impl FnOnce() -> T + Send + 'static) -> T {
        self.spawn_inside(f).join().expect("netns thread")
    }

    /// Starts `f` on a thread that has entered this namespace, in the background.
    pub fn spawn_inside<T: Send + 'static>(
        &self,
        f: impl FnOnce() -> T + Send + 'static,
    ) -> thread::JoinHandle<T> {
        let file = std::fs::File::open(self.path()).expect("open netns");
        thread::spawn(move || {
            // SAFETY: valid fd; CLONE_NEWNET only affects this thread.
            let rc = unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) };
            assert_eq!(rc, 0, "setns: {}", std::io::Error::last_os_error());
            f()
        })
    }
}

impl Drop for NetNs {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.name]).status();
    }
}

/// Inode of the root network namespace (the test process's own).
pub fn own_netns_inode() -> u64 {
    std::os::unix::fs::MetadataExt::ino(&std::fs::metadata("/proc/self/ns/net").expect("own netns"))
}

/// `n` TCP connects to `addr`, each of which must be refused (answered with a RST).
pub fn refused_connects(addr: SocketAddr, n: usize) {
    for i in 0..n {
        match TcpStream::connect_timeout(&addr, Duration::from_secs(2)) {
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => {}
            other => panic!("connect #{i} to {addr}: expected a refusal (RST), got {other:?}"),
        }
    }
}

/// A local TCP port nothing listens on, outside the ephemeral range (so kstall labels it).
pub fn closed_low_port() -> u16 {
    (20000..30000)
        .find(|&p| TcpListener::bind((Ipv4Addr::LOCALHOST, p)).is_ok())
        .expect("a free port between 20000 and 30000")
}

/// A running `kstall agent` with its own metrics port and API socket; SIGTERM (then SIGKILL) on
/// drop. Its log is kept for failure messages.
pub struct Agent {
    child: Child,
    pub socket: PathBuf,
    pub listen: SocketAddr,
    dir: PathBuf,
    log: Arc<Mutex<String>>,
    log_reader: Option<thread::JoinHandle<()>>,
}

impl Agent {
    pub fn start(extra_args: &[&str]) -> Self {
        let dir = std::env::temp_dir().join(format!("kstall-test-{}-{}", std::process::id(), unique()));
        std::fs::create_dir_all(&dir).expect("agent dir");
        let socket = dir.join("kstall.sock");
        let listen: SocketAddr = {
            let l = TcpListener::bind("127.0.0.1:0").expect("free port");
            l.local_addr().unwrap()
        };
        let mut child = Command::new(agent_binary())
            .arg("agent")
            .args(["--listen", &listen.to_string(), "--api-socket", socket.to_str().unwrap()])
            .args(["--log-format", "json"])
            .args(extra_args)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start kstall agent");
        let log = Arc::new(Mutex::new(String::new()));
        let stderr = child.stderr.take().unwrap();
        let sink = log.clone();
        let log_reader = thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                let mut log = sink.lock().unwrap();
                log.push_str(&line);
                log.push('\n');
            }
        });
        let mut agent = Agent { child, socket, listen, dir, log, log_reader: Some(log_reader) };
        agent.wait_ready();
        agent
    }

    fn wait_ready(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!("agent exited early ({status}):\n{}", self.log());
            }
            if self.request(r#"{"request":"status"}"#).is_ok() {
                return;
            }
            thread::sleep(Duration::from_millis(100));
        }
        panic!("agent not ready after 30 s:\n{}", self.log());
    }

    pub fn log(&self) -> String {
        self.log.lock().unwrap().clone()
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    fn request(&self, line: &str) -> std::io::Result<Value> {
        let mut stream = UnixStream::connect(&self.socket)?;
        stream.set_read_timeout(Some(Duration::from_secs(5)))?;
        stream.write_all(line.as_bytes())?;
        stream.write_all(b"\n")?;
        let mut answer = String::new();
        BufReader::new(stream).read_line(&mut answer)?;
        serde_json::from_str(&answer).map_err(std::io::Error::other)
    }

    pub fn status(&self) -> Value {
        self.request(r#"{"request":"status"}"#).expect("status")
    }

    /// The agent's incidents (firing first, then resolved).
    pub fn incidents(&self) -> Vec<Value> {
        let report = self
            .request(r#"{"request":"incidents"}"#)
            .unwrap_or_else(|e| panic!("incidents: {e}\n{}", self.log()));
        report["incidents"].as_array().cloned().unwrap_or_default()
    }

    /// Polls the incidents until one matches `pred` (or `timeout`).
    pub fn wait_incident(&self, pred: impl Fn(&Value) -> bool, timeout: Duration) -> Option<Value> {
        wait_for(timeout, || self.incidents().into_iter().find(|i| pred(i)))
    }

    /// Subscribes to the agent's event stream; events are collected in the background. Returns
    /// once the agent says it has subscribed: every event after that is in the stream.
    pub fn subscribe(&self) -> EventStream {
        subscribe(&self.socket, || self.log())
    }

    /// Body of an HTTP GET on the agent's metrics address.
    pub fn get(&self, path: &str) -> String {
        let mut stream = TcpStream::connect(self.listen).expect("metrics port");
        write!(stream, "GET {path} HTTP/1.0\r\nHost: localhost\r\n\r\n").unwrap();
        let mut response = String::new();
        stream.read_to_string(&mut response).unwrap();
        response.split_once("\r\n\r\n").map(|(_, body)| body.to_string()).unwrap_or_default()
    }

    pub fn metrics(&self) -> String {
        self.get("/metrics")
    }

    /// Value of the sample whose name and labels are exactly `series` (as Prometheus prints it).
    pub fn metric(&self, series: &str) -> Option<f64> {
        self.metrics().lines().find_map(|l| l.strip_prefix(series).and_then(|rest| rest.trim().parse().ok()))
    }

    /// Value of the first sample of `name` whose labels include every one of `labels`.
    pub fn metric_with(&self, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        sample_with(&self.metrics(), name, labels)
    }

    /// SIGTERM and wait; returns the exit status code. The whole log is readable afterwards.
    pub fn stop(&mut self) -> Option<i32> {
        let code = self.terminate();
        if let Some(reader) = self.log_reader.take() {
            let _ = reader.join();
        }
        code
    }

    fn terminate(&mut self) -> Option<i32> {
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(Some(status)) = self.child.try_wait() {
                return status.code();
            }
            thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        None
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            self.terminate();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Value of the first sample of `name` in a `/metrics` text whose labels include every one of
/// `labels`.
pub fn sample_with(metrics: &str, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    metrics.lines().find_map(|line| {
        let rest = line.strip_prefix(name)?.strip_prefix('{')?;
        let (set, value) = rest.split_once("} ")?;
        let set = format!(",{set}");
        labels
            .iter()
            .all(|(k, v)| set.contains(&format!(",{k}=\"{v}\"")))
            .then(|| value.trim().parse().ok())?
    })
}

/// Subscribes to the event stream of the agent serving `socket`; events are collected in the
/// background. Returns once the agent says it has subscribed: every event after that is in the
/// stream. `log` tells what the agent said, should it never start the stream.
pub fn subscribe(socket: &Path, log: impl Fn() -> String) -> EventStream {
    let mut stream = UnixStream::connect(socket).expect("API socket");
    stream.write_all(b"{\"request\":\"events\"}\n").expect("subscribe");
    let events = Arc::new(Mutex::new(Vec::new()));
    let sink = events.clone();
    let reader = stream.try_clone().expect("clone stream");
    let (started_tx, started) = std::sync::mpsc::channel();
    thread::spawn(move || {
        for line in BufReader::new(reader).lines().map_while(Result::ok) {
            let Ok(v) = serde_json::from_str::<Value>(&line) else { continue };
            if v["subscribed"] == true {
                let _ = started_tx.send(());
            } else {
                sink.lock().unwrap().push(v);
            }
        }
    });
    started
        .recv_timeout(Duration::from_secs(30))
        .unwrap_or_else(|_| panic!("the agent did not start the event stream\n{}", log()));
    EventStream { events, _stream: stream }
}

pub struct EventStream {
    events: Arc<Mutex<Vec<Value>>>,
    _stream: UnixStream,
}

impl EventStream {
    /// Waits until `count` events match `pred` (or `timeout`), then a little longer to catch any
    /// extra ones, and returns every matching event.
    pub fn collect(&self, pred: impl Fn(&Value) -> bool, count: usize, timeout: Duration) -> Vec<Value> {
        let deadline = Instant::now() + timeout;
        loop {
            let n = self.events.lock().unwrap().iter().filter(|e| pred(e)).count();
            if n >= count || Instant::now() >= deadline {
                break;
            }
            thread::sleep(Duration::from_millis(50));
        }
        thread::sleep(Duration::from_millis(500));
        self.events.lock().unwrap().iter().filter(|e| pred(e)).cloned().collect()
    }
}

/// Polls `f` every 250 ms until it returns something or `timeout` passes.
pub fn wait_for<T>(timeout: Duration, mut f: impl FnMut() -> Option<T>) -> Option<T> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = f() {
            return Some(v);
        }
        if Instant::now() >= deadline {
            return None;
        }
        thread::sleep(Duration::from_millis(250));
    }
}

fn unique() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

/// Packets that matched the nat OUTPUT rule for `--dport port` in `ns`: the kernel's own count of
/// redirected connections (only a connection's first packet traverses the nat table).
pub fn nat_rule_packets(ns: &NetNs, iptables: &str, port: u16) -> u64 {
    let listing = ns.exec(iptables, &["-t", "nat", "-L", "OUTPUT", "-v", "-x", "-n"]);
    listing
        .lines()
        .find(|l| l.contains("REDIRECT") && l.contains(&format!("dpt:{port}")))
        .and_then(|l| l.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no REDIRECT rule for port {port} in:\n{listing}"))
}

/// Sets a sysctl for the guard's lifetime and restores the previous value on drop.
pub struct Sysctl {
    path: PathBuf,
    previous: String,
}

impl Sysctl {
    pub fn set(name: &str, value: &str) -> Self {
        let path = Path::new("/proc/sys").join(name.replace('.', "/"));
        let previous = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{name}: {e}"));
        std::fs::write(&path, value).unwrap_or_else(|e| panic!("set {name}={value}: {e}"));
        Sysctl { path, previous: previous.trim().to_string() }
    }
}

impl Drop for Sysctl {
    fn drop(&mut self) {
        let _ = std::fs::write(&self.path, &self.previous);
    }
}

/// The agent's programs, by the 15 characters of their names the kernel keeps.
pub const AGENT_PROGRAMS: [&str; 11] = [
    "tcp_send_reset",
    "tcp_receive_res",
    "sched_process_h",
    "mark_victim",
    "nfs_xprt_retran",
    "nfs_rpc_timeout",
    "nfs_rpc_socket_",
    "nfs_rpc_socket_",
    "nfs_rpc_socket_",
    "nfs_xprt_lookup",
    "nfs4_state_mgr_",
];

/// Ids of the kernel's programs that carry the agent's program names.
pub fn agent_program_ids() -> std::collections::BTreeSet<u64> {
    bpf_programs(&AGENT_PROGRAMS).iter().filter_map(|p| p["id"].as_u64()).collect()
}

/// Which of `ids` are still loaded 5 s on (the kernel frees a released program after an RCU
/// grace period).
pub fn still_loaded_after_grace(ids: &std::collections::BTreeSet<u64>) -> Vec<u64> {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let left: Vec<u64> = agent_program_ids().intersection(ids).copied().collect();
        if left.is_empty() || Instant::now() > deadline {
            return left;
        }
        thread::sleep(Duration::from_millis(100));
    }
}

/// BPF programs whose (15-character) kernel name starts with one of `names`, as bpftool's JSON.
pub fn bpf_programs(names: &[&str]) -> Vec<Value> {
    let progs: Value =
        serde_json::from_str(&run("bpftool", &["prog", "show", "--json"])).expect("bpftool json");
    progs
        .as_array()
        .expect("bpftool prints an array")
        .iter()
        .filter(|p| names.iter().any(|n| p["name"].as_str().is_some_and(|s| s.starts_with(n))))
        .cloned()
        .collect()
}

/// A cgroup v2 directory made for a test (on the unified hierarchy, wherever it is mounted),
/// removed on drop with every parent directory the test created for it.
pub struct Cgroup {
    pub path: PathBuf,
    created: Vec<PathBuf>,
}

impl Cgroup {
    pub fn new(tag: &str) -> Self {
        Self::at(&format!("kstall-{tag}-{}", std::process::id()))
    }

    /// A container's cgroup as the kubelet's systemd driver and containerd lay it out: pod `uid`
    /// in QoS class `qos` (`burstable`, `besteffort`), container `container_id`.
    pub fn kubepods_container(qos: &str, uid: &str, container_id: &str) -> Self {
        Self::at(&format!(
            "kubepods.slice/kubepods-{qos}.slice/kubepods-{qos}-pod{}.slice/cri-containerd-{container_id}.scope",
            uid.replace('-', "_")
        ))
    }

    /// A cgroup at `relative` below the v2 root (e.g. a kubepods-style path), parents included.
    pub fn at(relative: &str) -> Self {
        let root = if Path::new("/sys/fs/cgroup/cgroup.controllers").exists() {
            PathBuf::from("/sys/fs/cgroup")
        } else {
            PathBuf::from("/sys/fs/cgroup/unified")
        };
        Self::under(root, relative)
    }

    /// A cgroup at `relative` in the cgroup v1 memory hierarchy (a kubelet on cgroup v1 puts
    /// pods there); panics on a host without one.
    pub fn v1_memory_at(relative: &str) -> Self {
        let root = PathBuf::from("/sys/fs/cgroup/memory");
        assert!(root.join("memory.limit_in_bytes").exists(), "this host has no cgroup v1 memory hierarchy");
        Self::under(root, relative)
    }

    fn under(root: PathBuf, relative: &str) -> Self {
        let mut path = root;
        let mut created = Vec::new();
        for part in relative.split('/').filter(|p| !p.is_empty()) {
            path.push(part);
            if !path.exists() {
                std::fs::create_dir(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
                created.push(path.clone());
            }
        }
        Cgroup { path, created }
    }

    /// What kstall reports as `cgroup_id`: the directory's inode.
    pub fn id(&self) -> u64 {
        std::os::unix::fs::MetadataExt::ino(&std::fs::metadata(&self.path).expect("cgroup dir"))
    }

    pub fn procs(&self) -> PathBuf {
        self.path.join("cgroup.procs")
    }
}

impl Drop for Cgroup {
    fn drop(&mut self) {
        // Processes still inside go back to the root first, or rmdir fails.
        if let (Ok(procs), Some(parent)) = (std::fs::read_to_string(self.procs()), self.path.parent()) {
            for pid in procs.lines() {
                let _ = std::fs::write(parent.join("cgroup.procs"), pid);
            }
        }
        for dir in self.created.iter().rev() {
            let _ = std::fs::remove_dir(dir);
        }
    }
}

/// A long-running process in a network namespace and a cgroup: what a pod's sandbox (pause)
/// process is to kstall. Killed on drop.
pub struct PodProcess {
    child: Child,
}

impl PodProcess {
    pub fn start(netns: &NetNs, procs: &Path) -> Self {
        let child = Command::new("nsenter")
            .arg(format!("--net={}", netns.path().display()))
            .args(["sleep", "600"])
            .spawn()
            .expect("start the pod process");
        let process = PodProcess { child };
        // nsenter enters the namespace a moment after it starts: join the pod's cgroup only then,
        // or a walk could learn the host's namespace for the pod, as no real pause process shows.
        let ns_link = format!("/proc/{}/ns/net", process.pid());
        let inside = wait_for(Duration::from_secs(5), || {
            (std::fs::metadata(&ns_link).ok().map(|m| std::os::unix::fs::MetadataExt::ino(&m))
                == Some(netns.inode()))
            .then_some(())
        });
        assert!(inside.is_some(), "the pod process did not enter {}", netns.name);
        std::fs::write(procs, process.pid().to_string())
            .unwrap_or_else(|e| panic!("join {}: {e}", procs.display()));
        process
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for PodProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A pod as `kubectl get pods -o json` prints it: a Deployment's, in namespace `shop`, on
/// `node-a`, whose container `app` has runtime id `container_id`.
pub fn pod_json(uid: &str, name: &str, container_id: &str) -> Value {
    serde_json::json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name, "namespace": "shop", "uid": uid,
            "labels": {"app": "web", "pod-template-hash": "5d8c7b9f4"},
            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web-5d8c7b9f4",
                                 "uid": "11111111-2222-3333-4444-555555555555", "controller": true}]
        },
        "spec": {"nodeName": "node-a", "containers": [{"name": "app", "image": "app"}]},
        "status": {"containerStatuses": [{"name": "app", "containerID": format!("containerd://{container_id}"),
                   "image": "app", "imageID": "", "ready": true, "restartCount": 0}]}
    })
}

/// Writes `pods` as a `kubectl get pods -o json` list to `path`, atomically (as a ConfigMap
/// update or `kubectl ... > tmp && mv` does).
pub fn write_pods_file(path: &Path, pods: &[Value]) {
    let tmp = path.with_extension("tmp");
    let list = serde_json::json!({"apiVersion": "v1", "kind": "List", "metadata": {"resourceVersion": ""}, "items": pods});
    std::fs::write(&tmp, list.to_string()).expect("write pods file");
    std::fs::rename(&tmp, path).expect("replace pods file");
}

/// The memory limit of the cgroups tests OOM-kill in.
pub const OOM_LIMIT: u64 = 64 << 20;

/// A process that joins `procs`, waits for `ready` (called with its pid: on v1, say, until the
/// agent has learnt the process), then allocates until the memcg OOM killer kills it; returns its
/// pid.
pub fn oom_kill(procs: &[&Path], ready: impl FnOnce(u32)) -> u32 {
    oom_kill_as(procs, None, ready)
}

/// [`oom_kill`] of a victim that first renames itself `comm` (the name the kernel reports: a node
/// daemon's makes the kill node-critical to kstall).
pub fn oom_kill_as(procs: &[&Path], comm: Option<&str>, ready: impl FnOnce(u32)) -> u32 {
    let joins: String = procs.iter().map(|p| format!("echo $$ > {} && ", p.display())).collect();
    let rename = comm
        .map(|c| format!("import ctypes; ctypes.CDLL(None).prctl(15, b\"{c}\", 0, 0, 0); "))
        .unwrap_or_default();
    let script = format!(
        "{joins}exec python3 -c '{rename}import sys; sys.stdin.readline(); x = [bytearray(8 << 20) for _ in range(64)]'"
    );
    let mut victim =
        Command::new("sh").args(["-c", &script]).stdin(Stdio::piped()).spawn().expect("start the allocator");
    let pid = victim.id();
    if let Err(panic) = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| ready(pid))) {
        let _ = victim.kill();
        let _ = victim.wait();
        std::panic::resume_unwind(panic);
    }
    victim.stdin.take().unwrap().write_all(b"go\n").expect("start allocating");
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Some(status) = victim.try_wait().unwrap() {
            assert_eq!(
                std::os::unix::process::ExitStatusExt::signal(&status),
                Some(libc::SIGKILL),
                "OOM-killed: {status}"
            );
            return pid;
        }
        assert!(Instant::now() < deadline, "allocator still running after 60 s");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A v1 memory cgroup with an `OOM_LIMIT` limit (on a hybrid host the limit for a v2 cgroup
/// lives there), removed on drop.
pub fn v1_memory_limit(tag: &str) -> Cgroup {
    let limit = Cgroup::v1_memory_at(&format!("kstall-{tag}-{}", std::process::id()));
    std::fs::write(limit.path.join("memory.limit_in_bytes"), OOM_LIMIT.to_string()).expect("v1 limit");
    limit
}

/// A memory cgroup with a limit, removed on drop: on cgroup v1 (hybrid hosts) under
/// `/sys/fs/cgroup/memory`, else the v2 `memory.max` of `v2` itself.
pub struct MemoryLimit {
    v1: Option<PathBuf>,
    procs: PathBuf,
}

impl MemoryLimit {
    pub fn new(v2: &Cgroup, bytes: u64) -> Self {
        let v1_root = Path::new("/sys/fs/cgroup/memory");
        if v1_root.join("memory.limit_in_bytes").exists() {
            let dir = v1_root.join(v2.path.file_name().expect("cgroup name"));
            std::fs::create_dir_all(&dir).expect("v1 memory cgroup");
            std::fs::write(dir.join("memory.limit_in_bytes"), bytes.to_string()).expect("v1 limit");
            MemoryLimit { procs: dir.join("cgroup.procs"), v1: Some(dir) }
        } else {
            std::fs::write(v2.path.join("memory.max"), bytes.to_string())
                .expect("v2 memory.max (is the memory controller enabled for the parent?)");
            MemoryLimit { procs: v2.procs(), v1: None }
        }
    }

    /// The `cgroup.procs` a process must join for the limit to apply to it.
    pub fn procs(&self) -> &Path {
        &self.procs
    }
}

impl Drop for MemoryLimit {
    fn drop(&mut self) {
        if let Some(dir) = &self.v1 {
            let _ = std::fs::remove_dir(dir);
        }
    }
}
