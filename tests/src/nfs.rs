//! A real NFS v4.1 server and client "pods" for the scenarios that run inside the kernel-matrix
//! VMs (`cargo xtask vm-test`): the host kernel has no NFS. The server listens on 10.55.0.1 (a
//! dummy interface of the VM's root namespace); each pod is a network namespace over a veth pair
//! routed to it, a kubepods container cgroup with a sandbox process, and a hard NFS mount made
//! from inside the namespace — as the kubelet's mount of a pod volume goes through the pod's network.

use std::{
    io::{BufRead as _, BufReader, Write as _},
    path::{Path, PathBuf},
    process::{Child, ChildStdin, Command, Stdio},
    sync::{OnceLock, mpsc},
    thread,
    time::{Duration, Instant},
};

use serde_json::Value;

use crate::{
    agent::pod_json,
    cgroup::{Cgroup, PodProcess},
    host::{run, wait_for},
    meshes::MeshRules,
    netns::NetNs,
    sidecar::SidecarProcess,
};

pub const SERVER: &str = "10.55.0.1";
const WORK: &str = "/tmp/kstall-nfs";
/// The export's path on the server, as an NFSv3 mount names it (v4 mounts its root, `/`).
pub const EXPORT_V3: &str = "/tmp/kstall-nfs/export";

/// Starts the NFS server for the first pod that needs it and leaves it running: the VM it runs
/// in is thrown away after the scenarios.
fn ensure_server() {
    static STARTED: OnceLock<()> = OnceLock::new();
    STARTED.get_or_init(set_up_server);
}

fn set_up_server() {
    run("modprobe", &["nfsd"]);
    run("modprobe", &["nfsv4"]);
    run("ip", &["link", "add", "kstall-nfs0", "type", "dummy"]);
    run("ip", &["addr", "add", &format!("{SERVER}/32"), "dev", "kstall-nfs0"]);
    run("ip", &["link", "set", "kstall-nfs0", "up"]);
    let export = Path::new(WORK).join("export");
    std::fs::create_dir_all(&export).expect("export dir");
    run("mount", &["-t", "tmpfs", "-o", "size=64m", "tmpfs", export.to_str().unwrap()]);
    // nfsd's state (the v4 recovery directory, etab) must be writable; the VM's /var may not be.
    run("mount", &["-t", "tmpfs", "tmpfs", "/var/lib/nfs"]);
    for dir in ["v4recovery", "rpc_pipefs"] {
        std::fs::create_dir_all(Path::new("/var/lib/nfs").join(dir)).expect("nfs state dir");
    }
    for file in ["etab", "rmtab"] {
        std::fs::write(Path::new("/var/lib/nfs").join(file), "").expect("nfs state file");
    }
    if !Path::new("/proc/fs/nfsd/threads").exists() {
        run("mount", &["-t", "nfsd", "nfsd", "/proc/fs/nfsd"]);
    }
    std::fs::write(
        "/etc/exports",
        format!("{} *(rw,fsid=0,no_root_squash,insecure,sync,no_subtree_check)\n", export.display()),
    )
    .expect("/etc/exports");
    // Both go to the background once ready. mountd on the port RHEL and Debian give it (20048),
    // for NFSv3 mounts (which ask rpcbind for it first).
    run("rpcbind", &["-w"]);
    run("rpc.mountd", &["-N", "2", "-u", "-p", "20048"]);
    run("exportfs", &["-ra"]);
    run("rpc.nfsd", &NFSD);
}

/// v3 and v4, with a 10 s lease and grace period: a client cut off for longer loses its lease,
/// and recovery and the first OPEN are quick.
const NFSD: [&str; 9] = ["-V", "3", "-V", "4", "-L", "10", "-G", "10", "4"];

/// The server restarts, as in a failover: nfsd forgets every client's state and comes back in its
/// grace period, so a client must establish a new client ID and session and reclaim what it held.
pub fn restart_server() {
    stop_nfsd();
    start_nfsd();
}

/// nfsd stopped, its connections closed: the first half of a restart. A client that reconnects
/// before [`start_nfsd`] is refused.
pub fn stop_nfsd() {
    run("rpc.nfsd", &["0"]);
}

/// nfsd started again, in its grace period.
pub fn start_nfsd() {
    run("rpc.nfsd", &NFSD);
}

/// Makes the server unreachable from every pod: an iptables DROP of tcp/2049 in the VM's root
/// namespace, deleted when the guard drops.
pub fn block_server() -> ServerBlocked {
    run("iptables", &[&["-I"][..], &BLOCK].concat());
    ServerBlocked(())
}

const BLOCK: [&str; 7] = ["INPUT", "-p", "tcp", "--dport", "2049", "-j", "DROP"];

pub struct ServerBlocked(());

impl Drop for ServerBlocked {
    fn drop(&mut self) {
        let _ = Command::new("iptables").args([&["-D"][..], &BLOCK].concat()).status();
    }
}

/// RPCs of procedure `operation` (`WRITE`, ...) that the kernel counted for the mounts of
/// `pods`, as `/proc/self/mountstats` has them (served from memory: no RPC). The kernel counts
/// them where it fires `rpc_stats_latency`, so kstall must count as many.
pub fn rpcs_of(pods: &[&NfsPod], operation: &str) -> u64 {
    let stats = std::fs::read_to_string("/proc/self/mountstats").expect("mountstats");
    let mut counting = false;
    let mut total = 0;
    for line in stats.lines() {
        if line.starts_with("device ") {
            counting =
                pods.iter().any(|p| line.contains(&format!(" mounted on {} ", p.mountpoint.display())));
        } else if counting && let Some(counts) = line.trim_start().strip_prefix(&format!("{operation}:")) {
            total += counts.split_whitespace().next().and_then(|n| n.parse::<u64>().ok()).unwrap_or(0);
        }
    }
    total
}

/// Creates `file` at the export's root from the server's side: a client finds it by LOOKUP and
/// never OPENs it, so it never holds a delegation for it. Under a delegation a client answers
/// `stat()` from its cache even on a `noac` mount, and whether an OPEN brings one depends on how
/// far the server's callback probe has got.
pub fn create_on_server(file: &str, contents: &str) {
    ensure_server();
    std::fs::write(Path::new(WORK).join("export").join(file), contents).expect("a file on the export");
}

/// `stat()`s of `file` on `pod`'s mount, in the pod's namespace and cgroup, for `length`: with
/// `noac`, each is a GETATTR RPC. Returns how many it did.
pub fn stat_storm(pod: &NfsPod, file: &str, length: Duration) -> u64 {
    const STORM: &str = r#"
import os, sys, time
end, n = time.monotonic() + float(sys.argv[2]), 0
while time.monotonic() < end:
    os.stat(sys.argv[1])
    n += 1
print(n)
"#;
    let out = pod
        .python(STORM)
        .arg(pod.mountpoint.join(file))
        .arg(length.as_secs_f64().to_string())
        .output()
        .expect("run the stat storm");
    assert!(out.status.success(), "the stat storm failed: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).trim().parse().expect("the storm's count")
}

/// The server's replies to `pod` delayed by `delay` (tc netem on the host end of its veth), as a
/// slow or congested server link; undone when the guard drops.
pub fn delay_replies(pod: &NfsPod, delay: Duration) -> RepliesDelayed {
    run("modprobe", &["sch_netem"]);
    let delay = format!("{}ms", delay.as_millis());
    run("tc", &["qdisc", "add", "dev", &pod.host_if, "root", "netem", "delay", &delay]);
    RepliesDelayed { host_if: pod.host_if.clone() }
}

pub struct RepliesDelayed {
    host_if: String,
}

impl Drop for RepliesDelayed {
    fn drop(&mut self) {
        let _ = Command::new("tc").args(["qdisc", "del", "dev", &self.host_if, "root"]).status();
    }
}

/// A pod with a hard NFS v4.1 mount of the server, made in the pod's network namespace.
pub struct NfsPod {
    pub name: String,
    /// Its address, in the pods file as the kubelet reports it (`status.podIP`).
    pub ip: String,
    /// The host end of the pod's veth pair: the server's replies leave through it.
    pub host_if: String,
    pub uid: String,
    pub container_id: String,
    pub mountpoint: PathBuf,
    // Dropped in this order: the mount goes (in `drop`) before the sidecar it may go through, and
    // both before the namespace they are in.
    mounted: bool,
    /// The mesh whose rules its namespace holds (and whether its proxy is a native sidecar): the
    /// pod carries that mesh's marks.
    mesh: std::sync::Mutex<Option<(MeshRules, bool)>>,
    sidecar: Option<Sidecar>,
    _sandbox: PodProcess,
    pub container: Cgroup,
    pub netns: NetNs,
}

impl NfsPod {
    /// Pod number `n` (1..=250; it picks the pod's subnet) named `name`, in namespace `shop`.
    pub fn new(n: u8, name: &str) -> Self {
        ensure_server();
        let uid = format!("{n:08x}-6e2f-4b1d-8c3a-{:012x}", std::process::id());
        let container_id = format!("{:064x}", u64::from(n) << 40 | u64::from(std::process::id()));
        let container = Cgroup::kubepods_container("besteffort", &uid, &container_id);
        let netns = NetNs::new(&format!("nfs{n}"));
        let (host_if, pod_if) = (format!("kst-h{n}"), format!("kst-p{n}"));
        run("ip", &["link", "add", &host_if, "type", "veth", "peer", "name", &pod_if]);
        run("ip", &["link", "set", &pod_if, "netns", &netns.name]);
        run("ip", &["addr", "add", &format!("10.56.{n}.1/24"), "dev", &host_if]);
        run("ip", &["link", "set", &host_if, "up"]);
        netns.exec("ip", &["addr", "add", &format!("10.56.{n}.2/24"), "dev", &pod_if]);
        netns.exec("ip", &["link", "set", &pod_if, "up"]);
        netns.exec("ip", &["route", "add", "default", "via", &format!("10.56.{n}.1")]);
        let sandbox = PodProcess::start(&netns, &container.procs());
        let mountpoint = Path::new(WORK).join(name);
        std::fs::create_dir_all(&mountpoint).expect("mount point");
        NfsPod {
            name: name.to_string(),
            ip: format!("10.56.{n}.2"),
            host_if,
            uid,
            container_id,
            mountpoint,
            mounted: false,
            mesh: None.into(),
            sidecar: None,
            _sandbox: sandbox,
            container,
            netns,
        }
    }

    /// `python3 -c script` (its arguments to add) as a process of the pod's container: in its
    /// network namespace and cgroup, as an app container's process is.
    pub fn python(&self, script: &str) -> Command {
        let mut command = Command::new("nsenter");
        command
            .arg(format!("--net={}", self.netns.path().display()))
            .args([
                "sh",
                "-c",
                &format!("echo $$ > {} && exec python3 -c \"$0\" \"$@\"", self.container.procs().display()),
            ])
            .arg(script);
        command
    }

    /// The pod as the pods file lists it.
    pub fn json(&self) -> Value {
        let mut json = pod_json(&self.uid, &self.name, &self.container_id);
        json["status"]["podIP"] = self.ip.clone().into();
        json["status"]["podIPs"] = serde_json::json!([{"ip": self.ip}]);
        if let Some((rules, native)) = *self.mesh.lock().unwrap() {
            crate::meshes::mark(&mut json, rules, native);
        }
        json
    }

    /// Mounts the export `hard` over TCP with a 1 s timeout and two retransmits, from inside the
    /// pod's namespace (`nsenter`, not `ip netns exec`, which would hide the mount in a new mount
    /// namespace).
    pub fn mount(&mut self) {
        self.mount_with("vers=4.1,hard,proto=tcp,timeo=10,retrans=2");
    }

    /// Mounts the export with `options` from inside the pod's namespace, as [`NfsPod::mount`].
    /// The mount runs under the pod's host name, in a UTS namespace of its own as a pod's is: the
    /// NFSv4 client's identity comes from it, and clients of one name in several namespaces
    /// take each other's lease over and over (seen here: a state recovery per write).
    pub fn mount_with(&mut self, options: &str) {
        let status = Command::new("timeout")
            .args(["90", "nsenter", &format!("--net={}", self.netns.path().display())])
            .args([
                "unshare",
                "--uts",
                "sh",
                "-c",
                "hostname \"$0\" && exec mount -t nfs4 -o \"$1\" \"$2\" \"$3\"",
            ])
            .args([&self.name, options, &format!("{SERVER}:/")])
            .arg(&self.mountpoint)
            .status()
            .expect("mount");
        assert!(status.success(), "mount the NFS export in pod {}: {status}", self.name);
        self.mounted = true;
    }

    /// Mounts where the kubelet mounts the pod's NFS volume (`<root>/pods/<uid>/volumes/
    /// kubernetes.io~nfs/<name>`, the root here under the scenarios' directory), from now on.
    pub fn as_kubelet_volume(&mut self) {
        self.mountpoint = Path::new(WORK)
            .join("kubelet/pods")
            .join(&self.uid)
            .join("volumes/kubernetes.io~nfs")
            .join(&self.name);
        std::fs::create_dir_all(&self.mountpoint).expect("the volume's mount point");
    }

    /// Mounts the pod's own directory of the export as the kubelet mounts a static NFS volume:
    /// `hard`, from the node's network namespace. Every such mount of the server shares the
    /// node's one NFSv4 client, its lease and its state recovery. Attributes are cached for 5
    /// minutes (`actimeo`, a common PV mount option): an open of a file looked up before goes
    /// straight to its OPEN, not to a revalidation of the directory first.
    pub fn mount_from_node(&mut self) {
        self.mount_from_node_with("vers=4.1,hard,proto=tcp,timeo=10,retrans=2,actimeo=300");
    }

    /// Mounts the pod's directory from the node's namespace with `options`, as
    /// [`NfsPod::mount_from_node`].
    pub fn mount_from_node_with(&mut self, options: &str) {
        std::fs::create_dir_all(self.on_server("")).expect("the pod's directory on the server");
        let status = Command::new("timeout")
            .args(["90", "mount", "-t", "nfs4", "-o", options])
            .arg(format!("{SERVER}:/{}", self.name))
            .arg(&self.mountpoint)
            .status()
            .expect("mount");
        assert!(status.success(), "mount pod {}'s volume from the node: {status}", self.name);
        self.mounted = true;
    }

    fn on_server(&self, file: &str) -> PathBuf {
        Path::new(WORK).join("export").join(&self.name).join(file)
    }

    /// The sidecar's rules, shaped as istio-iptables writes them: all of the pod's outgoing TCP
    /// jumps to ISTIO_OUTPUT, which returns the proxy's own (uid 65534 here, 1337 in Istio) and
    /// sends the rest through ISTIO_REDIRECT to the proxy's port 15001.
    pub fn add_sidecar_redirect(&self) {
        *self.mesh.lock().unwrap() = Some((MeshRules::IstioSidecar, false));
        let nat = |args: &[&str]| self.netns.exec("iptables", &[&["-t", "nat"][..], args].concat());
        nat(&["-N", "ISTIO_REDIRECT"]);
        nat(&["-A", "ISTIO_REDIRECT", "-p", "tcp", "-j", "REDIRECT", "--to-ports", "15001"]);
        nat(&["-N", "ISTIO_OUTPUT"]);
        nat(&["-A", "ISTIO_OUTPUT", "-m", "owner", "--uid-owner", "65534", "-j", "RETURN"]);
        nat(&["-A", "ISTIO_OUTPUT", "-d", "127.0.0.1/32", "-j", "RETURN"]);
        nat(&["-A", "ISTIO_OUTPUT", "-j", "ISTIO_REDIRECT"]);
        nat(&["-A", "OUTPUT", "-p", "tcp", "-j", "ISTIO_OUTPUT"]);
    }
}

impl NfsPod {
    /// `rules`, as the mesh writes them (tests/data), in the pod's namespace; the pod marked as the
    /// mesh marks it, its proxy a `native` sidecar or not. No proxy listens.
    pub fn add_mesh_rules(&self, rules: MeshRules, native: bool) {
        rules.install(&self.netns);
        *self.mesh.lock().unwrap() = Some((rules, native));
    }

    /// A process of the pod (its sandbox), to enter its namespace through.
    pub fn process(&self) -> u32 {
        self._sandbox.pid()
    }

    /// Starts `mount -t <fstype> -o <options> <server>:<export> <mount point>` in the pod's
    /// namespace as [`NfsPod::mount_with`] does, without waiting for it: mount.nfs retries a
    /// refused server for two minutes (its `retry=` default).
    pub fn start_mount(&mut self, fstype: &str, options: &str, export: &str) -> Mounting {
        let child = Command::new("nsenter")
            .arg(format!("--net={}", self.netns.path().display()))
            .args([
                "unshare",
                "--uts",
                "sh",
                "-c",
                "hostname \"$0\" && exec mount -t \"$1\" -o \"$2\" \"$3\" \"$4\"",
            ])
            .args([&self.name, fstype, options, &format!("{SERVER}:{export}")])
            .arg(&self.mountpoint)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start the mount");
        // Unmounted on drop whether it finished or not (a failed umount2 changes nothing).
        self.mounted = true;
        Mounting { child }
    }

    /// Starts the pod's sidecar: it relays the redirected NFS connections until
    /// [`NfsPod::stop_sidecar`], or until the pod's mount is gone.
    pub fn start_sidecar(&mut self) {
        let sidecar = Sidecar::start(self);
        self.sidecar = Some(sidecar);
    }

    /// The sidecar killed with its connections, as when its container is gone.
    pub fn stop_sidecar(&mut self) {
        self.sidecar = None;
    }
}

impl Drop for NfsPod {
    fn drop(&mut self) {
        if self.mounted {
            // Forced (pending RPCs end) and lazy, by the system call: umount(8) first resolves
            // the path, and the NFS root's attributes then wait for a server that may be gone (the
            // healthy scenario's teardown waited 2 × 180 s for a pod whose sidecar was gone).
            let path =
                std::ffi::CString::new(self.mountpoint.as_os_str().as_encoded_bytes()).expect("no NUL");
            // SAFETY: a NUL-terminated path that outlives the call.
            unsafe { libc::umount2(path.as_ptr(), libc::MNT_FORCE | libc::MNT_DETACH) };
        }
    }
}

/// A mount in progress ([`NfsPod::start_mount`]); killed on drop if still running.
pub struct Mounting {
    child: Child,
}

impl Mounting {
    /// Waits up to `timeout` for the mount to end; `Ok` once it succeeded, else what it said.
    pub fn finished(&mut self, timeout: Duration) -> Result<(), String> {
        match wait_for(timeout, || self.child.try_wait().ok().flatten()) {
            Some(status) if status.success() => Ok(()),
            Some(status) => {
                let mut said = String::new();
                if let Some(mut err) = self.child.stderr.take() {
                    let _ = std::io::Read::read_to_string(&mut err, &mut said);
                }
                Err(format!("mount failed ({status}): {said}"))
            }
            None => Err(format!("still mounting after {timeout:?}")),
        }
    }

    pub fn running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }
}

impl Drop for Mounting {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The envoy stand-in: relays the pod's local port 15001 to the NFS server, as uid 65534 (which
/// the redirect exempts), in the pod's namespace and cgroup. Killed with its connections on drop.
struct Sidecar {
    _process: SidecarProcess,
}

impl Sidecar {
    fn start(pod: &NfsPod) -> Self {
        let relay = format!("TCP:{SERVER}:2049");
        let args = ["TCP-LISTEN:15001,reuseaddr,fork", relay.as_str()];
        let process =
            SidecarProcess::start(&pod.netns, &pod.container.procs(), 65534, "socat", &args, &[15001]);
        Sidecar { _process: process }
    }
}

/// A process of a pod's init container: one command, in the pod's network namespace and cgroup.
/// Killed on drop if still running (it cannot die before its NFS call returns: not waited for).
pub struct InitContainer {
    child: Child,
}

impl InitContainer {
    pub fn start(pod: &NfsPod, command: &[&str]) -> Self {
        let child = Command::new("nsenter")
            .arg(format!("--net={}", pod.netns.path().display()))
            .args([
                "sh",
                "-c",
                &format!("echo $$ > {} && exec \"$@\"", pod.container.procs().display()),
                "sh",
            ])
            .args(command)
            .stdout(Stdio::null())
            .spawn()
            .expect("start the init container");
        InitContainer { child }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Waits up to `timeout` for the command to end; its exit status.
    pub fn finished(&mut self, timeout: Duration) -> Option<std::process::ExitStatus> {
        wait_for(timeout, || self.child.try_wait().ok().flatten())
    }
}

impl Drop for InitContainer {
    fn drop(&mut self) {
        let _ = self.child.kill();
    }
}

/// A process of a pod's container with a file open on NFS: each `sync` writes 1 MiB and fsyncs
/// it, each `rewrite` does so over the file's first MiB (a database's steady state: the file does
/// not grow), each `write` only writes it (dirty pages its exit must flush). Opened while the server is
/// reachable: an OPEN that cannot reach the server waits killable and the hung-task detector
/// would not report it; a flush waits uninterruptibly.
pub struct Writer {
    child: Child,
    stdin: ChildStdin,
    done: mpsc::Receiver<String>,
}

const WRITER: &str = r#"
import os, sys
fd = os.open(sys.argv[1], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
print("open", flush=True)
block = b"k" * (1 << 20)
for line in sys.stdin:
    command = line.strip()
    if command == "rewrite":
        os.lseek(fd, 0, os.SEEK_SET)
    os.write(fd, block)
    if command in ("sync", "rewrite"):
        os.fsync(fd)
    print("done", flush=True)
"#;

impl Writer {
    pub fn start(pod: &NfsPod, file: &str) -> Self {
        let path = pod.mountpoint.join(file);
        let mut child = pod
            .python(WRITER)
            .arg(&path)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("start the writer");
        let stdin = child.stdin.take().unwrap();
        let stdout = child.stdout.take().unwrap();
        let (tx, done) = mpsc::channel();
        thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let writer = Writer { child, stdin, done };
        // The first OPEN after the server started waits out its 10 s grace period.
        assert_eq!(
            writer.done.recv_timeout(Duration::from_secs(60)).as_deref(),
            Ok("open"),
            "open {}",
            path.display()
        );
        writer
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Asks for one more 1 MiB write and fsync, without waiting for it.
    pub fn request_sync(&mut self) {
        self.send("sync");
    }

    /// Waits up to `timeout` for the requested sync to finish.
    pub fn synced(&self, timeout: Duration) -> bool {
        self.done.recv_timeout(timeout).as_deref() == Ok("done")
    }

    /// One write and fsync that must finish within `timeout`.
    pub fn sync(&mut self, timeout: Duration) {
        self.request_sync();
        assert!(self.synced(timeout), "the writer's fsync did not finish within {timeout:?}");
    }

    /// The file's first MiB written again and fsynced, which must finish within `timeout`; how
    /// long it took.
    pub fn rewrite(&mut self, timeout: Duration) -> Duration {
        let started = Instant::now();
        self.send("rewrite");
        assert!(self.synced(timeout), "the writer's rewrite did not finish within {timeout:?}");
        started.elapsed()
    }

    /// 1 MiB written to the page cache, not flushed.
    pub fn write(&mut self) {
        self.send("write");
        assert!(self.synced(Duration::from_secs(10)), "the writer's write did not return");
    }

    fn send(&mut self, command: &str) {
        writeln!(self.stdin, "{command}").and_then(|()| self.stdin.flush()).expect("writer stdin");
    }

    /// SIGTERM, as the kubelet stops a container: the process exits, and its exit closes the file,
    /// which flushes what it wrote.
    pub fn terminate(&self) {
        // SAFETY: signals our own child, not yet reaped.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
    }

    /// Waits up to `timeout` for the process to be gone.
    pub fn exited(&mut self, timeout: Duration) -> bool {
        wait_for(timeout, || self.child.try_wait().ok().flatten()).is_some()
    }
}

impl Drop for Writer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        // A writer stuck in D state cannot die until its I/O ends: do not wait for it forever.
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline && matches!(self.child.try_wait(), Ok(None)) {
            thread::sleep(Duration::from_millis(100));
        }
    }
}

/// The pid of the NFSv4 client's state manager for the server (`<server>-manager`, a kernel
/// thread that exists while it recovers), when it is asleep in its recovery, as `/proc` shows it.
pub fn stuck_state_manager() -> Option<u32> {
    let name = format!("{SERVER}-manager");
    std::fs::read_dir("/proc").ok()?.flatten().find_map(|entry| {
        let pid: u32 = entry.file_name().to_str()?.parse().ok()?;
        let comm = std::fs::read_to_string(entry.path().join("comm")).ok()?;
        // The name is cut to 15 characters on kernels that do not keep a kernel thread's whole name.
        let named = name.starts_with(comm.trim()) && comm.trim().len() >= 15.min(name.len());
        let stat = std::fs::read_to_string(entry.path().join("stat")).ok()?;
        let asleep = stat.rsplit_once(')').is_some_and(|(_, rest)| rest.trim_start().starts_with('D'));
        let stack = std::fs::read_to_string(entry.path().join("stack")).unwrap_or_default();
        (named && asleep && stack.contains("nfs4_run_state_manager")).then_some(pid)
    })
}

/// The NFSv4 client's recovery as the kernel's own tracepoints show it, in a tracefs instance of
/// its own (removed on drop): the scenario's proof that the client did recover its state.
pub struct StateRecoveryTrace {
    instance: PathBuf,
}

const RECOVERY_EVENTS: [&str; 3] = ["nfs4_exchange_id", "nfs4_create_session", "nfs4_reclaim_complete"];

impl StateRecoveryTrace {
    pub fn start() -> Self {
        let instance = Path::new("/sys/kernel/tracing/instances/kstall-nfs-recovery").to_path_buf();
        let _ = std::fs::remove_dir(&instance);
        std::fs::create_dir(&instance).expect("a tracefs instance");
        let trace = StateRecoveryTrace { instance };
        for event in RECOVERY_EVENTS {
            std::fs::write(trace.instance.join("events/nfs4").join(event).join("enable"), "1")
                .unwrap_or_else(|e| panic!("enable nfs4:{event}: {e}"));
        }
        trace
    }

    /// The recovery steps that succeeded since the start, in order: `nfs4_exchange_id`, ...
    pub fn steps(&self) -> Vec<String> {
        let trace = std::fs::read_to_string(self.instance.join("trace")).expect("read the trace");
        trace
            .lines()
            .filter(|l| !l.starts_with('#') && l.contains("error=0 "))
            .filter_map(|l| {
                RECOVERY_EVENTS.iter().find(|e| l.contains(&format!(" {e}:"))).map(|e| e.to_string())
            })
            .collect()
    }
}

impl Drop for StateRecoveryTrace {
    fn drop(&mut self) {
        for event in RECOVERY_EVENTS {
            let _ = std::fs::write(self.instance.join("events/nfs4").join(event).join("enable"), "0");
        }
        let _ = std::fs::remove_dir(&self.instance);
    }
}
