//! Network namespaces (with the sidecar's iptables redirect) and the TCP connects tests make.

use std::{
    net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream},
    os::fd::AsRawFd as _,
    path::{Path, PathBuf},
    process::Command,
    thread,
    time::Duration,
};

use crate::host::run;

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

    /// [`NetNs::exec`] with `input` on its stdin (`iptables-restore`).
    pub fn exec_stdin(&self, cmd: &str, args: &[&str], input: &str) {
        let mut child = Command::new("ip")
            .args(["netns", "exec", &self.name, cmd])
            .args(args)
            .stdin(std::process::Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("{cmd}: {e}"));
        std::io::Write::write_all(&mut child.stdin.take().expect("stdin"), input.as_bytes())
            .expect("write stdin");
        let status = child.wait().expect("wait");
        assert!(status.success(), "{cmd} {args:?} in {} failed", self.name);
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

    /// A veth pair between this namespace (`here`: its name and address/prefix) and `peer`'s
    /// (`there`), both up. Made in the two namespaces at once: nothing is left in the host's if a
    /// step fails, and it goes with them.
    pub fn veth_to(&self, peer: &NetNs, here: (&str, &str), there: (&str, &str)) {
        let (here_if, there_if) = (here.0, there.0);
        let args = ["link", "add", here_if, "netns", &self.name, "type", "veth", "peer", "name", there_if];
        run("ip", &[&args[..], &["netns", &peer.name]].concat());
        for (ns, (name, address)) in [(self, here), (peer, there)] {
            ns.exec("ip", &["addr", "add", address, "dev", name]);
            ns.exec("ip", &["link", "set", name, "up"]);
        }
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

/// `n` TCP connects to `addr` that must time out (their SYNs dropped), each waiting `timeout`: a
/// SYN and its retransmissions within it.
pub fn timed_out_connects(addr: SocketAddr, n: usize, timeout: Duration) {
    for i in 0..n {
        match TcpStream::connect_timeout(&addr, timeout) {
            Err(e) if e.kind() == std::io::ErrorKind::TimedOut => {}
            other => panic!("connect #{i} to {addr}: expected a timeout (SYNs dropped), got {other:?}"),
        }
    }
}

/// `n` connections to a listener on `port`, both in `ns`, held open while the returned values
/// live: entries a connection tracking table keeps (established, so never evicted to make room).
pub fn held_connections(ns: &NetNs, port: u16, n: usize) -> (TcpListener, Vec<TcpStream>) {
    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    ns.run_inside(move || {
        let listener = TcpListener::bind(addr).expect("listen");
        let held = (0..n).map(|_| TcpStream::connect(addr).expect("connect")).collect();
        (listener, held)
    })
}

/// A namespace's conntrack counters as the kernel prints them (`/proc/net/stat/nf_conntrack`,
/// hex per CPU): its table's entries, and the packets dropped for want of room (`drop` less
/// the `insert_failed` clashes), summed over CPUs.
pub fn conntrack_counts(stat: &str) -> (u64, u64) {
    let mut lines = stat.lines();
    let header: Vec<&str> = lines.next().expect("header").split_whitespace().collect();
    let column = |name: &str| header.iter().position(|h| *h == name).expect(name);
    let (entries, drop, clash) = (column("entries"), column("drop"), column("insert_failed"));
    lines.fold((0, 0), |(_, dropped), line| {
        let v: Vec<u64> = line.split_whitespace().map(|x| u64::from_str_radix(x, 16).unwrap()).collect();
        (v[entries], dropped + v[drop] - v[clash])
    })
}

/// A local TCP port nothing listens on, outside the ephemeral range (so kstall labels it).
pub fn closed_low_port() -> u16 {
    (20000..30000)
        .find(|&p| TcpListener::bind((Ipv4Addr::LOCALHOST, p)).is_ok())
        .expect("a free port between 20000 and 30000")
}

/// `n` distinct local TCP ports nothing listens on, outside the ephemeral range: a port scan's
/// targets, each its own series.
pub fn closed_low_ports(n: usize) -> Vec<u16> {
    let ports: Vec<u16> =
        (20000..30000).filter(|&p| TcpListener::bind((Ipv4Addr::LOCALHOST, p)).is_ok()).take(n).collect();
    assert_eq!(ports.len(), n, "{n} free ports between 20000 and 30000");
    ports
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

/// A hard-mounted NFS client's reconnects from `netns`, every half second until stopped or
/// dropped: SYNs to 2049, redirected by the sidecar's rule to 15001 where nothing listens.
pub struct NfsReconnects {
    running: std::sync::Arc<std::sync::atomic::AtomicBool>,
    refused: std::sync::Arc<std::sync::atomic::AtomicU64>,
    connected: std::sync::Arc<std::sync::atomic::AtomicU64>,
    thread: Option<thread::JoinHandle<()>>,
}

impl NfsReconnects {
    /// To 127.0.0.1:2049.
    pub fn start(netns: &NetNs) -> Self {
        Self::to(netns, SocketAddr::from((Ipv4Addr::LOCALHOST, 2049)))
    }

    pub fn to(netns: &NetNs, nfs: SocketAddr) -> Self {
        use std::sync::{
            Arc,
            atomic::{AtomicBool, AtomicU64, Ordering},
        };
        let running = Arc::new(AtomicBool::new(true));
        let (refused, connected) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
        let (flag, refused_count, connected_count) = (running.clone(), refused.clone(), connected.clone());
        let thread = netns.spawn_inside(move || {
            while flag.load(Ordering::Relaxed) {
                match TcpStream::connect_timeout(&nfs, Duration::from_secs(1)) {
                    Ok(_) => connected_count.fetch_add(1, Ordering::Relaxed),
                    Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => {
                        refused_count.fetch_add(1, Ordering::Relaxed)
                    }
                    Err(_) => 0,
                };
                thread::sleep(Duration::from_millis(500));
            }
        });
        NfsReconnects { running, refused, connected, thread: Some(thread) }
    }

    /// The connects that got through.
    pub fn connected(&self) -> u64 {
        self.connected.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Stops them; how many were refused (reset) in all.
    pub fn stop(&mut self) -> u64 {
        self.running.store(false, std::sync::atomic::Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
        self.refused.load(std::sync::atomic::Ordering::Relaxed)
    }
}

impl Drop for NfsReconnects {
    fn drop(&mut self) {
        self.stop();
    }
}
