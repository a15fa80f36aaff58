//! A real `kstall agent` run by a test, and what it answers: status, incidents, metrics, events,
//! the programs it holds; the pods file it reads pod names from.

use std::{
    collections::BTreeSet,
    io::{BufRead as _, BufReader, ErrorKind, Read as _, Write as _},
    net::{SocketAddr, TcpListener, TcpStream},
    os::unix::net::UnixStream,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::{Arc, Mutex},
    thread,
    time::{Duration, Instant},
};

use serde_json::Value;

use crate::{
    START_WITHIN, bpf,
    cgroup::{Cgroup, MemoryLimit},
    host::wait_for,
};

/// The release agent: `KSTALL_BIN`, or target/release/kstall of this workspace.
pub fn agent_binary() -> PathBuf {
    std::env::var_os("KSTALL_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| crate::workspace().join("target/release/kstall"))
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
    /// An agent with its own state directory, removed with it.
    pub fn start(extra_args: &[&str]) -> Self {
        Self::start_with_state(None, extra_args)
    }

    /// An agent whose incident history is kept in `state` (which outlives it), or in its own
    /// directory.
    pub fn start_with_state(state: Option<&Path>, extra_args: &[&str]) -> Self {
        Self::spawn(state, None, &[], extra_args)
    }

    /// An agent with `env` in its environment besides the test's (what the OpenTelemetry
    /// variables configure).
    pub fn start_with_env(env: &[(&str, &str)], extra_args: &[&str]) -> Self {
        Self::spawn(None, None, env, extra_args)
    }

    fn spawn(
        state: Option<&Path>,
        cgroup_procs: Option<&Path>,
        env: &[(&str, &str)],
        extra_args: &[&str],
    ) -> Self {
        let dir = std::env::temp_dir().join(format!("kstall-test-{}-{}", std::process::id(), unique()));
        std::fs::create_dir_all(&dir).expect("agent dir");
        let state = state.map_or_else(|| dir.join("state"), Path::to_path_buf);
        let socket = dir.join("kstall.sock");
        let listen: SocketAddr = {
            let l = TcpListener::bind("127.0.0.1:0").expect("free port");
            l.local_addr().unwrap()
        };
        let mut command = Command::new(agent_binary());
        if let Some(procs) = cgroup_procs {
            let procs = std::ffi::CString::new(procs.as_os_str().as_encoded_bytes()).expect("a path");
            // SAFETY: between fork and exec only async-signal-safe calls (open, write, close).
            unsafe {
                std::os::unix::process::CommandExt::pre_exec(&mut command, move || {
                    let fd = libc::open(procs.as_ptr(), libc::O_WRONLY);
                    if fd < 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    // "0": the writing process itself.
                    let written = libc::write(fd, b"0".as_ptr().cast(), 1);
                    libc::close(fd);
                    if written != 1 {
                        return Err(std::io::Error::last_os_error());
                    }
                    Ok(())
                });
            }
        }
        let mut child = command
            .arg("agent")
            .args(["--listen", &listen.to_string(), "--api-socket", socket.to_str().unwrap()])
            .args(["--log-format", "json"])
            .arg("--state-dir")
            .arg(&state)
            .args(extra_args)
            .envs(env.iter().copied())
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

    /// Until the agent answers on its socket, or exits ([`START_WITHIN`] stops a hung start).
    fn wait_ready(&mut self) {
        let deadline = Instant::now() + START_WITHIN;
        while Instant::now() < deadline {
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!("agent exited early ({status}):\n{}", self.log());
            }
            if self.request(r#"{"request":"status"}"#).is_ok() {
                return;
            }
            thread::sleep(Duration::from_millis(100));
        }
        panic!("agent not ready after {} s:\n{}", START_WITHIN.as_secs(), self.log());
    }

    pub fn log(&self) -> String {
        self.log.lock().unwrap().clone()
    }

    /// The log once it has a line containing `text` (its reader may be behind the agent), or
    /// `None` within `within`.
    pub fn log_once_it_has(&self, text: &str, within: Duration) -> Option<String> {
        wait_for(within, || {
            let log = self.log();
            log.contains(text).then_some(log)
        })
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Ids of the BPF programs the agent holds (see [`bpf::program_ids_of`]).
    pub fn program_ids(&self) -> BTreeSet<u64> {
        bpf::program_ids_of(self.pid())
    }

    fn request(&self, line: &str) -> std::io::Result<Value> {
        request(&self.socket, line)
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

    /// What the agent knows of pod `name` (`kstall explain pod`, as JSON).
    pub fn explain(&self, name: &str) -> Value {
        let request = serde_json::json!({"request": "explain_pod", "pod": name}).to_string();
        self.request(&request).unwrap_or_else(|e| panic!("explain {name}: {e}\n{}", self.log()))
    }

    /// Polls the incidents until one matches `pred` (or `timeout`). A poll the agent did not answer
    /// within the request's timeout saw nothing yet (in a global OOM on a one-CPU emulated guest
    /// the agent's pages come back slowly from the shared root file system); the deadline is
    /// `timeout`'s. Any other error fails.
    pub fn wait_incident(&self, pred: impl Fn(&Value) -> bool, timeout: Duration) -> Option<Value> {
        wait_for(timeout, || match self.request(r#"{"request":"incidents"}"#) {
            Ok(report) => report["incidents"].as_array().into_iter().flatten().find(|i| pred(i)).cloned(),
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => None,
            Err(e) => panic!("incidents: {e}\n{}", self.log()),
        })
    }

    /// Subscribes to the agent's event stream; events are collected in the background. Returns
    /// once the agent says it has subscribed: every event after that is in the stream.
    pub fn subscribe(&self) -> EventStream {
        subscribe(&self.socket, || self.log())
    }

    /// Body of an HTTP GET on the agent's metrics address.
    pub fn get(&self, path: &str) -> String {
        self.get_with_status(path).1
    }

    /// Status code and body of an HTTP GET on the agent's metrics address.
    pub fn get_with_status(&self, path: &str) -> (u16, String) {
        let mut stream = TcpStream::connect(self.listen).expect("metrics port");
        write!(stream, "GET {path} HTTP/1.0\r\nHost: localhost\r\n\r\n").unwrap();
        let mut response = String::new();
        stream.read_to_string(&mut response).unwrap();
        let status = response.split(' ').nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
        (status, response.split_once("\r\n\r\n").map(|(_, body)| body.to_string()).unwrap_or_default())
    }

    pub fn metrics(&self) -> String {
        self.get("/metrics")
    }

    /// Value of the sample whose name and labels are exactly `series` (as Prometheus prints it).
    pub fn metric(&self, series: &str) -> Option<f64> {
        self.metrics().lines().find_map(|l| l.strip_prefix(series).and_then(|rest| rest.trim().parse().ok()))
    }

    /// The sample `series` once it is `expected`, else (after [`COUNTED_WITHIN`]) its last value:
    /// event counters come from the kernel's counters, which reach `/metrics` within two
    /// counter intervals.
    pub fn counted(&self, series: &str, expected: f64) -> Option<f64> {
        wait_for(COUNTED_WITHIN, || self.metric(series).filter(|&v| v == expected))
            .or_else(|| self.metric(series))
    }

    /// As [`Agent::counted`], for the first sample of `name` with every one of `labels`.
    pub fn counted_with(&self, name: &str, labels: &[(&str, &str)], expected: f64) -> Option<f64> {
        wait_for(COUNTED_WITHIN, || self.metric_with(name, labels).filter(|&v| v == expected))
            .or_else(|| self.metric_with(name, labels))
    }

    /// Value of the first sample of `name` whose labels include every one of `labels`.
    pub fn metric_with(&self, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        sample_with(&self.metrics(), name, labels)
    }

    /// The sum of every series of `name` that has `labels` (0 when there is none).
    pub fn metric_sum(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        samples_with(&self.metrics(), name, labels).sum()
    }

    /// SIGTERM and wait; returns the exit status code. The whole log is readable afterwards.
    /// SIGTERM, then the exit code; fails the test if any program the agent held is still
    /// loaded after it exited (so every test that stops an agent checks the programs it loaded,
    /// whichever hooks this kernel and its flags chose).
    pub fn stop(&mut self) -> Option<i32> {
        let held = self.program_ids();
        let code = self.terminate();
        if let Some(reader) = self.log_reader.take() {
            let _ = reader.join();
        }
        let left = bpf::still_loaded_after_grace(&held);
        assert!(left.is_empty(), "programs {left:?} still loaded after the agent exited:\n{}", self.log());
        code
    }

    /// SIGKILL, as the OOM killer or a node's crash would: nothing the agent does at exit runs.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if let Some(reader) = self.log_reader.take() {
            let _ = reader.join();
        }
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

/// An agent held to the DaemonSet's memory limit from its first instruction, as the kubelet holds
/// it: its start (the BTF parse is its peak) and all it does after must fit.
pub struct LimitedAgent {
    // Declared first, so stopped first: the cgroup is empty when it is removed.
    agent: Agent,
    limit: MemoryLimit,
    limit_bytes: u64,
    _cgroup: Cgroup,
}

impl LimitedAgent {
    pub fn start(tag: &str, extra_args: &[&str]) -> Self {
        Self::start_with_env(tag, &[], extra_args)
    }

    /// As [`LimitedAgent::start`], with `env` in the agent's environment.
    pub fn start_with_env(tag: &str, env: &[(&str, &str)], extra_args: &[&str]) -> Self {
        let limit_bytes = crate::deploy::agent_memory_limit();
        let cgroup = Cgroup::new(tag);
        let limit = MemoryLimit::new(&cgroup, limit_bytes);
        let agent = Agent::spawn(None, Some(limit.procs()), env, extra_args);
        LimitedAgent { agent, limit, limit_bytes, _cgroup: cgroup }
    }

    pub fn limit_bytes(&self) -> u64 {
        self.limit_bytes
    }

    /// Processes the OOM killer killed at the limit: the agent is the only one there.
    pub fn oom_kills(&self) -> u64 {
        self.limit.oom_kills()
    }
}

impl std::ops::Deref for LimitedAgent {
    type Target = Agent;

    fn deref(&self) -> &Agent {
        &self.agent
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

/// How long a count takes at most to reach `/metrics` (two 1 s counter intervals), with room.
pub const COUNTED_WITHIN: Duration = Duration::from_secs(10);

/// Value of the first sample of `name` in a `/metrics` text whose labels include every one of
/// `labels`.
pub fn sample_with(metrics: &str, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    samples_with(metrics, name, labels).next()
}

/// The value of every series of `name` that has `labels`.
pub fn samples_with<'a>(
    metrics: &'a str,
    name: &'a str,
    labels: &'a [(&str, &str)],
) -> impl Iterator<Item = f64> + 'a {
    metrics.lines().filter_map(move |line| {
        let rest = line.strip_prefix(name)?.strip_prefix('{')?;
        let (set, value) = rest.split_once("} ")?;
        let set = format!(",{set}");
        labels
            .iter()
            .all(|(k, v)| set.contains(&format!(",{k}=\"{v}\"")))
            .then(|| value.trim().parse().ok())?
    })
}

/// One request line to the agent serving `socket`, and its one-line JSON answer.
pub fn request(socket: &Path, line: &str) -> std::io::Result<Value> {
    let mut stream = UnixStream::connect(socket)?;
    stream.set_read_timeout(Some(Duration::from_secs(5)))?;
    stream.write_all(line.as_bytes())?;
    stream.write_all(b"\n")?;
    let mut answer = String::new();
    BufReader::new(stream).read_line(&mut answer)?;
    serde_json::from_str(&answer).map_err(std::io::Error::other)
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
        .recv_timeout(START_WITHIN)
        .unwrap_or_else(|_| panic!("the agent did not start the event stream\n{}", log()));
    EventStream { events, _stream: stream }
}

/// The events of a [`subscribe`]d stream, collected in the background.
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

    /// Waits up to `timeout` until `found` finds what it looks for in the events so far.
    pub fn wait_until<T>(
        &self,
        timeout: Duration,
        mut found: impl FnMut(&[Value]) -> Option<T>,
    ) -> Option<T> {
        wait_for(timeout, || found(&self.events.lock().unwrap()))
    }
}

fn unique() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    NEXT.fetch_add(1, Ordering::Relaxed)
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

/// An incident's break-glass commands, in their order.
pub fn break_glass_commands(incident: &Value) -> Vec<String> {
    let steps = incident["remediation"]["break_glass"].as_array().into_iter().flatten();
    steps.filter_map(|s| s["command"].as_str().map(String::from)).collect()
}

/// Runs `command` as an operator pastes it (`sh -c`, as root); its output, trimmed. Panics naming
/// the command and its error if it fails.
pub fn run_as_printed(command: &str) -> String {
    let out = Command::new("sh").args(["-c", command]).output().expect("sh");
    assert!(out.status.success(), "{command}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// Writes `pods` as a `kubectl get pods -o json` list to `path`, atomically (as a ConfigMap
/// update or `kubectl ... > tmp && mv` does).
pub fn write_pods_file(path: &Path, pods: &[Value]) {
    let tmp = path.with_extension("tmp");
    let list = serde_json::json!({"apiVersion": "v1", "kind": "List", "metadata": {"resourceVersion": ""}, "items": pods});
    std::fs::write(&tmp, list.to_string()).expect("write pods file");
    std::fs::rename(&tmp, path).expect("replace pods file");
}

/// `kstall trace` as a user runs it, once it says it is capturing: from then on nothing is missed.
pub struct TraceCapture {
    child: Child,
    stderr: thread::JoinHandle<String>,
}

impl TraceCapture {
    pub fn start(socket: &Path, args: &[&str]) -> Self {
        let mut child = Command::new(agent_binary())
            .arg("trace")
            .arg("--api-socket")
            .arg(socket)
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("kstall trace");
        let mut stderr = BufReader::new(child.stderr.take().unwrap());
        let mut before = String::new();
        loop {
            let mut line = String::new();
            if stderr.read_line(&mut line).unwrap_or(0) == 0 {
                panic!("kstall trace ended before capturing: {before}");
            }
            if line.starts_with("kstall: capturing ") {
                break;
            }
            before.push_str(&line);
        }
        let stderr = thread::spawn(move || {
            let mut rest = before;
            let _ = stderr.read_to_string(&mut rest);
            rest
        });
        TraceCapture { child, stderr }
    }

    pub fn of(agent: &Agent, args: &[&str]) -> Self {
        Self::start(&agent.socket, args)
    }

    /// The `kstall trace` process.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Waits for the end of the capture: exit code, stdout lines, stderr.
    pub fn lines(self) -> (Option<i32>, Vec<String>, String) {
        let out = self.child.wait_with_output().expect("trace output");
        let stdout = String::from_utf8_lossy(&out.stdout).lines().map(String::from).collect();
        (out.status.code(), stdout, self.stderr.join().unwrap_or_default())
    }
}
