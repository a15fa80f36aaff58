//! The healthy node (issue 37): traffic of every kind kstall watches, at realistic rates, from
//! pods that are well — and a real agent that must fire no incident. Three pods over veths to a
//! service namespace, as on a node:
//!
//! - **web-mesh**, in a mesh: Istio's own nat rules (the table `istio-iptables` writes for a
//!   default injection, as in its golden test data) and a live proxy (`mesh_proxy`, uid 1337)
//!   that relays outbound calls to :8080 and :2049 and inbound ones to the pod's app on :80, closes
//!   idle connections and resets the requests it rejects, and is restarted (killed, back within a
//!   second) every 40 s. Its clients: an HTTP-like one on keep-alive connections retrying refused
//!   connects at once, and an NFS-like one on one long connection, reconnecting as the kernel's
//!   client does (at once, then after 3 s, doubling).
//! - **ledger-ambient** and **ledger-linkerd**, in the other meshes, with their own rules
//!   (tests/data: istio-cni's in-pod rules for Istio ambient, Linkerd's proxy-init) and a live
//!   proxy each on their ports (ambient's ztunnel on 15001, its connections marked 0x539; Linkerd's
//!   on 4140 as uid 2102), restarted as the sidecar is; each with the same two clients.
//! - **scanner**: a port scan of the service, 2,000 closed ports a minute, and a client that a
//!   live server refuses (accepts and resets).
//! - **batch**: memory churn under its limit, writeback bursts with fsync, and, once, its worker
//!   container OOM-killed at its own limit: on cgroup v2 its three processes together, as the
//!   kubelet's `memory.oom.group` has it (v1 has no group kill: the one process).
//!
//! Every network namespace, cgroup, process and file made here is removed on drop.

use std::{
    collections::BTreeMap,
    io::{Read, Write},
    net::{Ipv4Addr, Shutdown, SocketAddr, TcpListener, TcpStream},
    path::Path,
    process::{Child, Command},
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    thread,
    time::{Duration, Instant},
};

use serde_json::Value;

use crate::{
    agent::{Agent, pod_json, write_pods_file},
    cgroup::{Cgroup, MemoryLimit, PodProcess},
    host::{cpu_ticks, memory_kib, wait_for},
    meshes::MeshRules,
    netns::NetNs,
    oom::{OOM_LIMIT, oom_kill},
    sidecar::SidecarProcess,
};

/// The nat table `istio-iptables` writes for a default sidecar injection (outbound capture of
/// every address, inbound capture of every port but Envoy's own, proxy uid and gid 1337), as its
/// golden test data shows it.
const ISTIO_NAT: &str = "*nat
-N ISTIO_INBOUND
-N ISTIO_REDIRECT
-N ISTIO_IN_REDIRECT
-N ISTIO_OUTPUT
-A ISTIO_INBOUND -p tcp --dport 15008 -j RETURN
-A ISTIO_REDIRECT -p tcp -j REDIRECT --to-ports 15001
-A ISTIO_IN_REDIRECT -p tcp -j REDIRECT --to-ports 15006
-A PREROUTING -p tcp -j ISTIO_INBOUND
-A ISTIO_INBOUND -p tcp --dport 15090 -j RETURN
-A ISTIO_INBOUND -p tcp --dport 15021 -j RETURN
-A ISTIO_INBOUND -p tcp --dport 15020 -j RETURN
-A ISTIO_INBOUND -p tcp -j ISTIO_IN_REDIRECT
-A OUTPUT -p tcp -j ISTIO_OUTPUT
-A ISTIO_OUTPUT -o lo -s 127.0.0.6/32 -j RETURN
-A ISTIO_OUTPUT -o lo ! -d 127.0.0.1/32 -p tcp ! --dport 15008 -m owner --uid-owner 1337 -j ISTIO_IN_REDIRECT
-A ISTIO_OUTPUT -o lo -m owner ! --uid-owner 1337 -j RETURN
-A ISTIO_OUTPUT -m owner --uid-owner 1337 -j RETURN
-A ISTIO_OUTPUT -o lo ! -d 127.0.0.1/32 -p tcp ! --dport 15008 -m owner --gid-owner 1337 -j ISTIO_IN_REDIRECT
-A ISTIO_OUTPUT -o lo -m owner ! --gid-owner 1337 -j RETURN
-A ISTIO_OUTPUT -m owner --gid-owner 1337 -j RETURN
-A ISTIO_OUTPUT -d 127.0.0.1/32 -j RETURN
-A ISTIO_OUTPUT -j ISTIO_REDIRECT
COMMIT
";

const HTTP_PORT: u16 = 8080;
const NFS_PORT: u16 = 2049;
/// A live server that resets every connection it accepts.
const REFUSING_PORT: u16 = 9000;
const APP_PORT: u16 = 80;
/// The proxy closes a connection idle this long.
const IDLE_TIMEOUT: Duration = Duration::from_secs(2);
const RESTART_EVERY: Duration = Duration::from_secs(40);
/// The restart's gap: connects meanwhile are refused.
const RESTART_GAP: Duration = Duration::from_millis(300);
const SCAN_PORTS: u16 = 2000;
/// 2,000 ports a minute.
const SCAN_PAUSE: Duration = Duration::from_millis(30);
const BATCH_MEMORY_LIMIT: u64 = 256 << 20;

/// What the soak did, what the agent saw, and what it cost.
#[derive(Debug)]
pub struct Report {
    pub length: Duration,
    pub work: BTreeMap<&'static str, u64>,
    /// Events the agent streamed, by kind.
    pub events: BTreeMap<String, u64>,
    pub resets: Resets,
    /// Resets the agent counted (exact, from the kernel's counters) received by the scanner pod:
    /// its scan's and the refusing server's.
    pub scanner_resets_counted: f64,
    /// Every incident the agent has, firing or resolved: none on a healthy node.
    pub incidents: Vec<Value>,
    /// What the events of each incident's pod were (its network namespace's resets, its kills).
    pub incident_events: Vec<Value>,
    pub cpu_percent: f64,
    pub rss_mib: f64,
}

/// The reset events, by what made them.
#[derive(Debug, Default)]
pub struct Resets {
    pub total: u64,
    /// Redirected to a port where nothing listened (the proxy restarting), to an NFS port.
    pub redirected_nfs: u64,
    /// Likewise, to another port (8080, the app's).
    pub redirected_other: u64,
    /// Sent by a socket (a proxy or a server resetting what it accepted).
    pub from_a_socket: u64,
    /// Sent to a closed port (the scan), received by the client.
    pub plain: u64,
}

impl Report {
    pub fn lines(&self) -> String {
        let events: Vec<String> = self.events.iter().map(|(k, n)| format!("{k} {n}")).collect();
        let work: Vec<String> = self.work.iter().map(|(k, n)| format!("{k} {n}")).collect();
        let r = &self.resets;
        format!(
            "healthy node, {:.0} s: {} incident(s)\n  work: {}\n  events: {}\n  reset events: {} ({} redirected NFS, {} redirected other, {} from a socket, {} plain); the scanner's counted: {}\n  agent: {:.2}% of a core, RSS {:.1} MiB\n",
            self.length.as_secs_f64(),
            self.incidents.len(),
            work.join(", "),
            events.join(", "),
            r.total,
            r.redirected_nfs,
            r.redirected_other,
            r.from_a_socket,
            r.plain,
            self.scanner_resets_counted,
            self.cpu_percent,
            self.rss_mib,
        )
    }
}

/// Runs the healthy node for `length` against a fresh agent; `proxy` is the `mesh_proxy` binary.
pub fn soak(proxy: &Path, length: Duration) -> Report {
    // On disk (writeback must reach one), and open to the proxy's user, who runs a copy from here.
    let scratch = tempfile::Builder::new().prefix("kstall-healthy-").tempdir_in("/var/tmp").expect("scratch");
    std::fs::set_permissions(scratch.path(), std::os::unix::fs::PermissionsExt::from_mode(0o755))
        .expect("chmod");
    let proxy_copy = scratch.path().join("mesh_proxy");
    std::fs::copy(proxy, &proxy_copy).expect("copy the proxy");
    let proxy = proxy_copy.as_path();
    let pods_file = scratch.path().join("pods.json");
    let _parents = Cgroup::at("kubepods.slice/kubepods-burstable.slice");
    let service = NetNs::new("svc");
    let mesh = Pod::new(1, "web-mesh", &service);
    let scanner = Pod::new(2, "scanner", &service);
    let batch = Pod::new(3, "batch", &service);
    let ambient = Pod::meshed(4, "ledger-ambient", &service, MeshRules::IstioAmbient);
    let linkerd = Pod::meshed(5, "ledger-linkerd", &service, MeshRules::Linkerd);
    let pods = [&mesh, &scanner, &batch, &ambient, &linkerd];
    write_pods_file(&pods_file, &pods.iter().map(|p| p.json.clone()).collect::<Vec<_>>());
    let agent = Agent::start(&["--pods-file", pods_file.to_str().unwrap()]);
    let attributed = wait_for(Duration::from_secs(30), || {
        (agent.status()["attribution"]["pod_namespaces"].as_u64() >= Some(pods.len() as u64)).then_some(())
    });
    assert!(attributed.is_some(), "the agent did not learn the pods: {}", agent.status());
    let events = agent.subscribe();

    let stop = Arc::new(AtomicBool::new(false));
    let work = Work::default();
    let mut threads = Vec::new();
    // The service: an HTTP-like and an NFS-like server, one that resets what it accepts.
    threads.push(service.spawn_inside(server(HTTP_PORT, stop.clone(), respond_http)));
    threads.push(service.spawn_inside(server(NFS_PORT, stop.clone(), respond_rpc)));
    threads.push(service.spawn_inside(server(REFUSING_PORT, stop.clone(), |stream| reset(&stream))));
    // The mesh pod: its rules, its proxy, its app, its clients; and a caller of its app.
    mesh.netns.exec_stdin("iptables-restore", &[], ISTIO_NAT);
    let mut sidecars = [
        Sidecar::start(proxy, &mesh, Proxy::ISTIO_SIDECAR),
        Sidecar::start(proxy, &ambient, Proxy::ZTUNNEL),
        Sidecar::start(proxy, &linkerd, Proxy::LINKERD),
    ];
    threads.push(mesh.netns.spawn_inside(server(APP_PORT, stop.clone(), respond_http)));
    let meshed = [
        (&mesh, "http_requests", "rpcs"),
        (&ambient, "http_requests_ambient", "rpcs_ambient"),
        (&linkerd, "http_requests_linkerd", "rpcs_linkerd"),
    ];
    for (pod, requests, rpcs) in meshed {
        threads.push(pod.netns.spawn_inside(http_client(
            pod.service,
            stop.clone(),
            work.counter(requests),
            work.counter("rejected_by_proxy"),
        )));
        threads.push(pod.netns.spawn_inside(rpc_client(
            pod.service,
            stop.clone(),
            work.counter(rpcs),
            work.counter("rpc_reconnects"),
        )));
    }
    threads.push(service.spawn_inside(app_caller(
        mesh.address,
        stop.clone(),
        work.counter("inbound_requests"),
    )));
    // The scanner: closed ports, a live server that refuses.
    threads.push(scanner.netns.spawn_inside(scan(
        scanner.service,
        stop.clone(),
        work.counter("scanned_closed_ports"),
    )));
    threads.push(scanner.netns.spawn_inside(refused(
        scanner.service,
        stop.clone(),
        work.counter("refused_by_server"),
    )));
    // The batch pod: memory churn and writeback bursts in its app container.
    let limit = MemoryLimit::new(&batch.cgroup, BATCH_MEMORY_LIMIT);
    let batch_procs = [batch.cgroup.procs(), limit.procs().to_path_buf()];
    let mut churn = Script::start(&batch_procs, MEMORY_CHURN, &[]);
    let burst = scratch.path().join("burst");
    let mut writeback = Script::start(&batch_procs, WRITEBACK, &[burst.to_str().unwrap()]);
    // Its worker container: on cgroup v2 three processes, killed together by the kubelet's
    // memory.oom.group; on v1 (no group kill) the one.
    let oom_container = Cgroup::kubepods_container("burstable", &batch.uid, &format!("{:064x}", 0xb0b));
    let oom_limit = MemoryLimit::new(&oom_container, OOM_LIMIT);
    let worker_procs = [oom_container.procs(), oom_limit.procs().to_path_buf()];
    let workers_too = if oom_limit.kill_as_a_group() { 2 } else { 0 };
    let mut workers: Vec<Script> = (0..workers_too)
        .map(|_| Script::start(&worker_procs, "import time; time.sleep(3600)", &[]))
        .collect();

    let started = Instant::now();
    let ticks_before = cpu_ticks(agent.pid());
    let mut next_restart = RESTART_EVERY / 2;
    let mut oom_done = false;
    while started.elapsed() < length {
        if started.elapsed() >= next_restart {
            for (sidecar, pod) in sidecars.iter_mut().zip([&mesh, &ambient, &linkerd]) {
                sidecar.restart(proxy, pod);
                work.add("proxy_restarts", 1);
            }
            next_restart += RESTART_EVERY;
        }
        if !oom_done && started.elapsed() >= length / 3 {
            oom_kill(&[worker_procs[0].as_path(), worker_procs[1].as_path()], |_| {});
            work.add("ooms", 1);
            work.add("oom_victims", 1 + workers.len() as u64);
            workers.iter_mut().for_each(Script::stop);
            oom_done = true;
        }
        thread::sleep(Duration::from_millis(100).min(length.saturating_sub(started.elapsed())));
    }
    let elapsed = started.elapsed();
    let ticks = cpu_ticks(agent.pid()) - ticks_before;
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    let cpu_percent = ticks / hz / elapsed.as_secs_f64() * 100.0;
    let rss_mib = memory_kib(agent.pid()).0 as f64 / 1024.0;
    stop.store(true, Ordering::Relaxed);
    for thread in threads {
        let _ = thread.join();
    }
    churn.stop();
    writeback.stop();
    work.add("memory_cycles", churn.lines());
    work.add("fsyncs", writeback.lines());
    drop(sidecars);
    // The last interval's counts (1 s) and the evaluation after them (1 s) are in only then:
    // waiting can only find more.
    thread::sleep(Duration::from_secs(3));
    let incidents = agent.incidents();
    let scanner_resets_counted =
        agent.metric_sum("kstall_tcp_resets_total", &[("pod", "scanner"), ("direction", "received")]);
    let streamed = events.collect(|_| true, usize::MAX, Duration::ZERO);
    let mut by_kind = BTreeMap::new();
    let mut resets = Resets::default();
    for e in &streamed {
        *by_kind.entry(e["kind"].as_str().unwrap_or("?").to_string()).or_default() += 1;
        if e["kind"] == "tcp_reset" {
            resets.add(e);
        }
    }
    let incident_events = streamed
        .iter()
        .filter(|e| incidents.iter().any(|i| i["pod"] == e["pod"] && e["pod"] != ""))
        .cloned()
        .collect();
    Report {
        length: elapsed,
        work: work.figures(),
        events: by_kind,
        resets,
        scanner_resets_counted,
        incidents,
        incident_events,
        cpu_percent,
        rss_mib,
    }
}

impl Resets {
    fn add(&mut self, e: &Value) {
        self.total += 1;
        let original = e["original_dst_port"].as_u64();
        match original {
            Some(port) if e["local_port"].as_u64() != Some(port) && port == u64::from(NFS_PORT) => {
                self.redirected_nfs += 1
            }
            Some(_) => self.redirected_other += 1,
            None if e["has_socket"] == true => self.from_a_socket += 1,
            None => self.plain += 1,
        }
    }
}

/// What the workloads did, counted as they go.
#[derive(Default, Clone)]
struct Work(Arc<std::sync::Mutex<BTreeMap<&'static str, Arc<AtomicU64>>>>);

impl Work {
    fn counter(&self, name: &'static str) -> Arc<AtomicU64> {
        self.0.lock().unwrap().entry(name).or_default().clone()
    }

    fn add(&self, name: &'static str, n: u64) {
        self.counter(name).fetch_add(n, Ordering::Relaxed);
    }

    fn figures(&self) -> BTreeMap<&'static str, u64> {
        self.0.lock().unwrap().iter().map(|(k, v)| (*k, v.load(Ordering::Relaxed))).collect()
    }
}

/// A pod: its network namespace on a veth to the service's, its app container's cgroup and its
/// sandbox process (what kstall learns the pod's namespace by).
struct Pod {
    uid: String,
    json: Value,
    /// Its address, and the service's as it reaches it.
    address: Ipv4Addr,
    service: Ipv4Addr,
    _sandbox: PodProcess,
    cgroup: Cgroup,
    netns: NetNs,
}

impl Pod {
    /// A pod in `mesh`: its rules in its namespace, its marks (a native sidecar for Linkerd, as
    /// its default is now).
    fn meshed(n: u8, name: &str, service: &NetNs, mesh: MeshRules) -> Self {
        let mut pod = Self::new(n, name, service);
        mesh.install(&pod.netns);
        crate::meshes::mark(&mut pod.json, mesh, mesh == MeshRules::Linkerd);
        pod
    }

    fn new(n: u8, name: &str, service: &NetNs) -> Self {
        let uid = format!("4ea17e11-0000-4000-8000-{n:012}");
        let container = format!("{:064x}", 0x4ea1_0000 + u64::from(n));
        let cgroup = Cgroup::kubepods_container("burstable", &uid, &container);
        let netns = NetNs::new(&format!("healthy{n}"));
        let (address, gateway) = (Ipv4Addr::new(10, 77, n, 2), Ipv4Addr::new(10, 77, n, 1));
        let (outer, inner) = (format!("khs{n}-{}", std::process::id() % 10_000), format!("khp{n}"));
        service.veth_to(&netns, (&outer, &format!("{gateway}/24")), (&inner, &format!("{address}/24")));
        let sandbox = PodProcess::start(&netns, &cgroup.procs());
        let json = pod_json(&uid, name, &container);
        Pod { uid, json, address, service: gateway, _sandbox: sandbox, cgroup, netns }
    }
}

/// A mesh's proxy as `mesh_proxy` plays it: its user, its outbound and inbound ports (0: none),
/// the mark on its own connections (0: none).
#[derive(Clone, Copy)]
struct Proxy {
    uid: u32,
    outbound: u16,
    inbound: u16,
    mark: u32,
}

impl Proxy {
    const ISTIO_SIDECAR: Proxy = Proxy { uid: 1337, outbound: 15001, inbound: 15006, mark: 0 };
    /// ztunnel's in-pod outbound listener; its connections carry the mark istio-cni's rules
    /// return (setting it takes CAP_NET_ADMIN, as ztunnel has).
    const ZTUNNEL: Proxy = Proxy { uid: 0, outbound: 15001, inbound: 0, mark: 0x539 };
    const LINKERD: Proxy = Proxy { uid: 2102, outbound: 4140, inbound: 0, mark: 0 };
}

/// A mesh pod's proxy process, in its network namespace and app container's cgroup. Killed with
/// its connections on drop.
struct Sidecar {
    proxy: Proxy,
    process: Option<SidecarProcess>,
}

impl Sidecar {
    fn start(program: &Path, pod: &Pod, proxy: Proxy) -> Self {
        Sidecar { proxy, process: Some(Self::process(program, pod, proxy)) }
    }

    fn process(program: &Path, pod: &Pod, proxy: Proxy) -> SidecarProcess {
        let Proxy { uid, outbound, inbound, mark } = proxy;
        let args = [
            IDLE_TIMEOUT.as_millis().to_string(),
            outbound.to_string(),
            inbound.to_string(),
            mark.to_string(),
        ];
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let ports: Vec<u16> = [outbound, inbound].into_iter().filter(|&p| p != 0).collect();
        let program = program.to_str().expect("a UTF-8 path");
        SidecarProcess::start(&pod.netns, &pod.cgroup.procs(), uid, program, &args, &ports)
    }

    /// Killed, and back after [`RESTART_GAP`], as a sidecar container restarted.
    fn restart(&mut self, program: &Path, pod: &Pod) {
        self.process = None;
        thread::sleep(RESTART_GAP);
        self.process = Some(Self::process(program, pod, self.proxy));
    }
}

/// Memory churn below the limit: 96 MiB taken (every page touched) and let go, twice a second.
const MEMORY_CHURN: &str = "import sys, time
while True:
    x = b'\\x01' * (96 << 20)
    del x
    print(1, flush=True)
    time.sleep(0.5)
";

/// Writeback bursts: 32 MiB written and fsynced every 2 s.
const WRITEBACK: &str = "import os, sys, time
block = os.urandom(1 << 20)
with open(sys.argv[1], 'wb') as f:
    while True:
        f.seek(0)
        for _ in range(32):
            f.write(block)
        f.flush()
        os.fsync(f.fileno())
        print(1, flush=True)
        time.sleep(2)
";

/// A python3 script run in the cgroups of `procs`, each line it prints one unit of work.
struct Script {
    child: Child,
    lines: Arc<AtomicU64>,
}

impl Script {
    fn start(procs: &[std::path::PathBuf], script: &str, args: &[&str]) -> Self {
        let joins: String = procs.iter().map(|p| format!("echo $$ > {} && ", p.display())).collect();
        let join = format!("{joins}exec python3 -c \"$0\" \"$@\"");
        let mut child = Command::new("sh")
            .args(["-c", &join, script])
            .args(args)
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("start python3");
        let lines = Arc::new(AtomicU64::new(0));
        let (out, count) = (child.stdout.take().unwrap(), lines.clone());
        thread::spawn(move || {
            for _ in std::io::BufRead::lines(std::io::BufReader::new(out)).map_while(Result::ok) {
                count.fetch_add(1, Ordering::Relaxed);
            }
        });
        Script { child, lines }
    }

    fn stop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    fn lines(&self) -> u64 {
        self.lines.load(Ordering::Relaxed)
    }
}

impl Drop for Script {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A server on `port` until `stop`, each connection handled by `handle` on its own thread.
fn server(port: u16, stop: Arc<AtomicBool>, handle: fn(TcpStream)) -> impl FnOnce() + Send + 'static {
    move || {
        let listener = TcpListener::bind((Ipv4Addr::UNSPECIFIED, port)).expect("listen");
        listener.set_nonblocking(true).expect("nonblocking");
        while !stop.load(Ordering::Relaxed) {
            match listener.accept() {
                Ok((stream, _)) => {
                    stream.set_nonblocking(false).ok();
                    stream.set_read_timeout(Some(Duration::from_secs(5))).ok();
                    thread::spawn(move || handle(stream));
                }
                Err(_) => thread::sleep(Duration::from_millis(20)),
            }
        }
    }
}

/// `GET <n>\n` answered with `OK <n>\n`, on one connection until it closes.
fn respond_http(mut stream: TcpStream) {
    let mut buf = [0u8; 256];
    while let Ok(n) = stream.read(&mut buf) {
        if n == 0 || stream.write_all(b"OK\n").is_err() {
            return;
        }
    }
}

/// A 4-byte length and a payload, echoed: an RPC and its reply.
fn respond_rpc(mut stream: TcpStream) {
    let mut len = [0u8; 4];
    while stream.read_exact(&mut len).is_ok() {
        let mut payload = vec![0u8; u32::from_be_bytes(len) as usize];
        if stream.read_exact(&mut payload).is_err()
            || stream.write_all(&len).and_then(|()| stream.write_all(&payload)).is_err()
        {
            return;
        }
    }
}

/// Closed with SO_LINGER 0: the kernel resets it.
fn reset(stream: &TcpStream) {
    let linger = libc::linger { l_onoff: 1, l_linger: 0 };
    // SAFETY: a valid socket and option of the right size.
    unsafe {
        libc::setsockopt(
            std::os::fd::AsRawFd::as_raw_fd(stream),
            libc::SOL_SOCKET,
            libc::SO_LINGER,
            (&linger as *const libc::linger).cast(),
            size_of::<libc::linger>() as libc::socklen_t,
        )
    };
}

/// Requests on keep-alive connections every 100 ms, a refused connect retried at once; every 50th
/// request rejected by the proxy (on its own connection), now and then a pause past the proxy's
/// idle timeout.
fn http_client(
    service: Ipv4Addr,
    stop: Arc<AtomicBool>,
    requests: Arc<AtomicU64>,
    rejected: Arc<AtomicU64>,
) -> impl FnOnce() + Send + 'static {
    move || {
        let to = SocketAddr::from((service, HTTP_PORT));
        let mut connection: Option<TcpStream> = None;
        let mut n = 0u64;
        while !stop.load(Ordering::Relaxed) {
            n += 1;
            if n.is_multiple_of(50) {
                if let Ok(mut c) = TcpStream::connect_timeout(&to, Duration::from_secs(1)) {
                    let _ = c.write_all(&[b"REJECT".as_slice(), &[b'x'; 64 << 10]].concat());
                    let _ = c.read(&mut [0u8; 16]);
                    rejected.fetch_add(1, Ordering::Relaxed);
                }
                continue;
            }
            if n.is_multiple_of(300) {
                thread::sleep(IDLE_TIMEOUT + Duration::from_secs(1));
            }
            let stream = match connection.take() {
                Some(c) => c,
                None => match TcpStream::connect_timeout(&to, Duration::from_secs(1)) {
                    Ok(c) => c,
                    Err(_) => {
                        thread::sleep(Duration::from_millis(100));
                        continue;
                    }
                },
            };
            let mut stream = stream;
            stream.set_read_timeout(Some(Duration::from_secs(2))).ok();
            let mut reply = [0u8; 16];
            if stream.write_all(b"GET /\n").is_ok() && stream.read(&mut reply).is_ok_and(|r| r > 0) {
                requests.fetch_add(1, Ordering::Relaxed);
                connection = Some(stream);
            }
            thread::sleep(Duration::from_millis(100));
        }
    }
}

/// An RPC every 250 ms on one connection; reconnects as the kernel's NFS client does: at once,
/// then after 3 s, doubling.
fn rpc_client(
    service: Ipv4Addr,
    stop: Arc<AtomicBool>,
    rpcs: Arc<AtomicU64>,
    reconnects: Arc<AtomicU64>,
) -> impl FnOnce() + Send + 'static {
    move || {
        let to = SocketAddr::from((service, NFS_PORT));
        let mut backoff = Duration::ZERO;
        while !stop.load(Ordering::Relaxed) {
            let Ok(mut stream) = TcpStream::connect_timeout(&to, Duration::from_secs(1)) else {
                backoff = (backoff * 2).clamp(Duration::from_secs(3), Duration::from_secs(300));
                let until = Instant::now() + backoff;
                while Instant::now() < until && !stop.load(Ordering::Relaxed) {
                    thread::sleep(Duration::from_millis(50));
                }
                continue;
            };
            reconnects.fetch_add(1, Ordering::Relaxed);
            backoff = Duration::ZERO;
            stream.set_read_timeout(Some(Duration::from_secs(5))).ok();
            let request = [&100u32.to_be_bytes()[..], &[7u8; 100]].concat();
            let mut reply = [0u8; 104];
            while !stop.load(Ordering::Relaxed)
                && stream.write_all(&request).is_ok()
                && stream.read_exact(&mut reply).is_ok()
            {
                rpcs.fetch_add(1, Ordering::Relaxed);
                thread::sleep(Duration::from_millis(250));
            }
            let _ = stream.shutdown(Shutdown::Both);
        }
    }
}

/// Calls the mesh pod's app every 500 ms, each on a new connection (the pod's rules send it
/// through the proxy's inbound port).
fn app_caller(
    pod: Ipv4Addr,
    stop: Arc<AtomicBool>,
    requests: Arc<AtomicU64>,
) -> impl FnOnce() + Send + 'static {
    move || {
        let to = SocketAddr::from((pod, APP_PORT));
        while !stop.load(Ordering::Relaxed) {
            if let Ok(mut c) = TcpStream::connect_timeout(&to, Duration::from_secs(1)) {
                c.set_read_timeout(Some(Duration::from_secs(2))).ok();
                if c.write_all(b"GET /\n").is_ok() && c.read(&mut [0u8; 16]).is_ok_and(|n| n > 0) {
                    requests.fetch_add(1, Ordering::Relaxed);
                }
            }
            thread::sleep(Duration::from_millis(500));
        }
    }
}

/// The service's ports 1..=2000 in turn, 2,000 a minute; each closed one answers with RST.
fn scan(service: Ipv4Addr, stop: Arc<AtomicBool>, closed: Arc<AtomicU64>) -> impl FnOnce() + Send + 'static {
    move || {
        for port in (1..=SCAN_PORTS).cycle() {
            if stop.load(Ordering::Relaxed) {
                return;
            }
            let refused =
                TcpStream::connect_timeout(&SocketAddr::from((service, port)), Duration::from_secs(1))
                    .is_err_and(|e| e.kind() == std::io::ErrorKind::ConnectionRefused);
            if refused {
                closed.fetch_add(1, Ordering::Relaxed);
            }
            thread::sleep(SCAN_PAUSE);
        }
    }
}

/// Connects every 250 ms to the server that accepts and resets.
fn refused(
    service: Ipv4Addr,
    stop: Arc<AtomicBool>,
    refused: Arc<AtomicU64>,
) -> impl FnOnce() + Send + 'static {
    move || {
        let to = SocketAddr::from((service, REFUSING_PORT));
        while !stop.load(Ordering::Relaxed) {
            let is_reset = |e: &std::io::Error| e.kind() == std::io::ErrorKind::ConnectionReset;
            // The server's RST can land before this thread wakes from the connect's poll: then
            // the connect itself reports the reset (SO_ERROR), not the read.
            let reset = match TcpStream::connect_timeout(&to, Duration::from_secs(1)) {
                Ok(mut c) => {
                    c.set_read_timeout(Some(Duration::from_secs(2))).ok();
                    c.read(&mut [0u8; 1]).is_err_and(|e| is_reset(&e))
                }
                Err(e) => is_reset(&e),
            };
            if reset {
                refused.fetch_add(1, Ordering::Relaxed);
            }
            thread::sleep(Duration::from_millis(250));
        }
    }
}
