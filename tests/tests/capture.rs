//! `kstall capture start --standalone` against the real kernel: a pod's network namespace whose
//! NAT rule redirects 2049 to 15001, where nothing listens, and a server namespace behind a veth.
//! The pcapng shows what a packet socket in the pod's namespace sees (the design's §0.1): the
//! SYN after the REDIRECT, to 127.0.0.1:15001 on `lo`, and the RST after conntrack undid it, from
//! the server's 2049 — on one client port; neither on `eth0`.

use std::{
    collections::BTreeSet,
    net::SocketAddr,
    path::Path,
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use kstall_tests::{
    agent::agent_binary,
    capture::{CaptureDisk, packet_sockets, ports, tcpdump, unpacked},
    host::wait_for,
    kernel_tests_can_run,
    netns::{NetNs, refused_connects},
    writeback::FreezableDisk,
};
use pcap_file::pcapng::{
    Block, PcapNgReader,
    blocks::{
        interface_description::InterfaceDescriptionOption, interface_statistics::InterfaceStatisticsOption,
    },
};

const CONNECTS: usize = 3;

/// The capture process, killed on drop if the test fails before it ends.
struct Capture(Child);

impl Drop for Capture {
    fn drop(&mut self) {
        if self.0.try_wait().ok().flatten().is_none() {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

/// The pod's namespace, redirecting 2049 to 15001, and the server's at 10.0.0.1 behind a veth:
/// no route leaves the two. Both go, with their rules, when dropped.
fn pod_and_server() -> (NetNs, NetNs) {
    let pod = NetNs::new("cap-pod");
    let server = NetNs::new("cap-srv");
    pod.veth_to(&server, ("eth0", "10.0.0.2/24"), ("eth0", "10.0.0.1/24"));
    pod.redirect_tcp("iptables", 2049, 15001);
    (pod, server)
}

/// `kstall capture start --standalone` on `pod` with `args`, into `out`, once its two packet
/// sockets (lo, eth0) are up in the namespace.
fn capture(pod: &NetNs, args: &[&str], out: &Path) -> Capture {
    let mut capture = Capture(
        Command::new(agent_binary())
            .args(["capture", "start", "--standalone", "--netns-file"])
            .arg(pod.path())
            .args(["--filter", "tcp and (host 10.0.0.1 or port 2049 or port 15001)"])
            .args(args)
            .arg("-o")
            .arg(out)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("kstall capture"),
    );
    // Up, or ended: a capture that refused or failed says why on stderr.
    let up = wait_for(Duration::from_secs(10), || {
        if packet_sockets(pod) == 2 {
            return Some(true);
        }
        capture.0.try_wait().expect("wait").map(|_| false)
    });
    match up {
        Some(true) => capture,
        Some(false) => panic!("the capture ended before its packet sockets showed: {}", capture.ended_with()),
        None => panic!("the capture's two packet sockets never showed in {}", pod.name),
    }
}

impl Capture {
    /// Waits for the end (within `limit`); its stdout, after checking it succeeded.
    fn ended(&mut self, limit: Duration) -> String {
        let status = wait_for(limit, || self.0.try_wait().expect("wait"))
            .unwrap_or_else(|| panic!("the capture did not end within {limit:?}"));
        let (stdout, stderr) = self.output();
        assert!(status.success(), "kstall capture: {status}: {stderr}");
        stdout
    }

    /// How an ended capture ended: its status and stderr.
    fn ended_with(&mut self) -> String {
        let status = self.0.wait().expect("wait");
        format!("{status}: {}", self.output().1)
    }

    fn output(&mut self) -> (String, String) {
        let (mut stdout, mut stderr) = (String::new(), String::new());
        std::io::Read::read_to_string(&mut self.0.stdout.take().unwrap(), &mut stdout).unwrap();
        std::io::Read::read_to_string(&mut self.0.stderr.take().unwrap(), &mut stderr).unwrap();
        (stdout, stderr)
    }
}

#[test]
fn packets_show_the_syn_to_15001_and_the_rst_from_2049_and_no_socket_is_left() {
    if !kernel_tests_can_run("packets_show_the_syn_to_15001_and_the_rst_from_2049_and_no_socket_is_left") {
        return;
    }
    let (pod, _server) = pod_and_server();
    let dir = CaptureDisk::new();
    let out = dir.path().join("capture");
    // A listener of the pod's, for sockets.txt: held by this process, bound in the namespace.
    let listener = pod.run_inside(|| std::net::TcpListener::bind("10.0.0.2:0").expect("listen"));
    let listening = listener.local_addr().unwrap();
    let started = Instant::now();
    // This process holds it from outside the namespace: named to the capture as the pod's.
    let holder = std::process::id().to_string();
    let mut capture = capture(&pod, &["--duration", "4s", "--pid", &holder], &out);
    let nfs: SocketAddr = "10.0.0.1:2049".parse().unwrap();
    pod.run_inside(move || refused_connects(nfs, CONNECTS));
    assert!(started.elapsed() < Duration::from_secs(3), "the connects ran past the capture's duration");
    let said = capture.ended(Duration::from_secs(10));
    assert!(!said.contains("cut:"), "{said}");
    let bundle = unpacked(&out);
    assert_eq!(packet_sockets(&pod), 0, "a packet socket is left in the namespace");

    let file = bundle.join("packets.pcapng");
    let (lines, header) = tcpdump(&file);
    assert!(header.contains("link-type EN10MB (Ethernet), snapshot length 256"), "{header}");
    let syns = ports(&lines, "IP 10.0.0.2.", " > 127.0.0.1.15001: Flags [S],");
    let rsts = ports(&lines, "IP 10.0.0.1.2049 > 10.0.0.2.", ": Flags [R.],");
    assert_eq!(syns.len(), CONNECTS, "one SYN per connect, loopback's outgoing copy left out:\n{lines}");
    assert_eq!(
        syns.iter().collect::<BTreeSet<_>>(),
        rsts.iter().collect::<BTreeSet<_>>(),
        "each SYN's client port has its RST:\n{lines}"
    );
    assert_eq!(lines.lines().count(), 2 * CONNECTS, "nothing else matches the filter:\n{lines}");

    // Read back independently: the interfaces by name, and headers only (Ethernet, IPv4, TCP
    // with the SYN's options: at most 74 bytes).
    let bytes = std::fs::read(&file).unwrap();
    let mut reader = PcapNgReader::new(&bytes[..]).expect("pcapng");
    let (mut names, mut caplens) = (BTreeSet::new(), Vec::new());
    while let Some(block) = reader.next_block() {
        match block.expect("block") {
            Block::InterfaceDescription(idb) => {
                assert_eq!(idb.snaplen, 256);
                for option in idb.options {
                    if let InterfaceDescriptionOption::IfName(name) = option {
                        names.insert(name.into_owned());
                    }
                }
            }
            Block::EnhancedPacket(epb) => caplens.push((epb.data.len(), epb.original_len)),
            _ => {}
        }
    }
    assert_eq!(names, BTreeSet::from(["eth0".to_string(), "lo".to_string()]));
    assert_eq!(caplens.len(), 2 * CONNECTS);
    for (caplen, original) in &caplens {
        assert!(*caplen <= 74 && *caplen as u32 <= *original, "{caplens:?}");
    }
    let mode = std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(&file).unwrap().permissions());
    assert_eq!(mode & 0o777, 0o600);

    // The namespace's state beside the packets (the design's §0.3): the redirect's conntrack
    // events, recorded for each connect the pcapng shows, link its 2049 to its 15001.
    let read = |name: &str| {
        let path = bundle.join(name);
        let mode = std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(&path).unwrap().permissions());
        assert_eq!(mode & 0o777, 0o600, "{name}");
        std::fs::read_to_string(path).unwrap()
    };
    let conntrack = read("net/conntrack.txt");
    let events = conntrack
        .split_once("# events during the capture")
        .and_then(|(_, rest)| rest.split_once("# at end"))
        .map(|(events, _)| events)
        .unwrap_or_else(|| panic!("no events section:\n{conntrack}"));
    for port in &syns {
        let orig = format!("src=10.0.0.2 dst=10.0.0.1 sport={port} dport=2049 ");
        let reply = format!("src=127.0.0.1 dst=10.0.0.2 sport=15001 dport={port}");
        for kind in ["[NEW]", "[DESTROY]"] {
            assert!(
                events.lines().any(|l| l.contains(kind) && l.contains(&orig) && l.contains(&reply)),
                "no {kind} event with {orig}and {reply}:\n{conntrack}"
            );
        }
    }
    let rules = read("net/rules.txt");
    assert!(
        rules.lines().any(|l| l.contains("-p tcp")
            && l.contains("--dport 2049")
            && l.contains("-j REDIRECT --to-ports 15001")),
        "{rules}"
    );
    let sockets = read("net/sockets.txt");
    assert!(
        sockets.lines().any(|l| l.starts_with("tcp LISTEN ")
            && l.contains(&format!(" {listening} 0.0.0.0:* "))
            && l.contains(&format!(",pid={holder},fd="))),
        "{listening} held by {holder}:\n{sockets}"
    );
    drop(listener);
    let addresses = read("net/addresses.txt");
    assert!(addresses.lines().any(|l| l == "eth0 inet 10.0.0.2/24 scope global"), "{addresses}");
    let routes = read("net/routes.txt");
    assert!(
        routes.lines().any(|l| l == "10.0.0.0/24 dev eth0 proto kernel scope link src 10.0.0.2 table main"),
        "{routes}"
    );
}

/// A native nftables table in the pod's namespace (made with nft, as kube-proxy's nftables mode or
/// a CNI would: no iptables-save shows it) is in `net/rules.txt` under `# nft list ruleset`, after
/// the iptables sections; iptables-nft's own nat table is there too (the whole ruleset, verbatim).
#[test]
fn a_native_nft_table_is_in_the_rules_file() {
    if !kernel_tests_can_run("a_native_nft_table_is_in_the_rules_file") {
        return;
    }
    // In the pod's namespace alone, gone with it.
    let (pod, _server) = pod_and_server();
    pod.exec("nft", &["add", "table", "inet", "kstall_test"]);
    pod.exec(
        "nft",
        &["add", "chain", "inet", "kstall_test", "out", "{ type nat hook output priority -100; }"],
    );
    pod.exec(
        "nft",
        &["add", "rule", "inet", "kstall_test", "out", "tcp", "dport", "2049", "redirect", "to", ":15001"],
    );
    let dir = CaptureDisk::new();
    let out = dir.path().join("capture");
    capture(&pod, &["--duration", "1s"], &out).ended(Duration::from_secs(10));
    let bundle = unpacked(&out);
    let rules = std::fs::read_to_string(bundle.join("net/rules.txt")).unwrap();
    println!("{rules}");
    let (iptables, nft) =
        rules.split_once("\n# nft list ruleset\n").unwrap_or_else(|| panic!("no nft section:\n{rules}"));
    assert!(iptables.contains("# iptables-nft-save\n") && !iptables.contains("kstall_test"), "{rules}");
    let table = nft
        .split_once("table inet kstall_test {\n")
        .map(|(_, table)| table.split_once("\n}\n").map_or(table, |(table, _)| table))
        .unwrap_or_else(|| panic!("no table inet kstall_test in the nft section:\n{rules}"));
    assert!(table.contains("chain out {") && table.contains("type nat hook output priority"), "{rules}");
    assert!(table.lines().any(|l| l.trim() == "tcp dport 2049 redirect to :15001"), "{rules}");
    // iptables-nft's REDIRECT (pod_and_server's) is an nf_tables table too: listed whole.
    assert!(nft.contains("table ip nat {") && nft.contains("redirect to :15001"), "{rules}");
}

/// The packet cap ends the capture at once, long before its duration, and says so: on stdout
/// and in the statistics blocks.
#[test]
fn the_packet_cap_ends_the_capture_and_says_so() {
    if !kernel_tests_can_run("the_packet_cap_ends_the_capture_and_says_so") {
        return;
    }
    let (pod, _server) = pod_and_server();
    let dir = CaptureDisk::new();
    let out = dir.path().join("capture");
    let started = Instant::now();
    let mut capture = capture(&pod, &["--duration", "60s", "--max-packets", "3"], &out);
    let nfs: SocketAddr = "10.0.0.1:2049".parse().unwrap();
    pod.run_inside(move || refused_connects(nfs, CONNECTS));
    let said = capture.ended(Duration::from_secs(10));
    assert!(started.elapsed() < Duration::from_secs(15), "{:?}", started.elapsed());
    assert!(said.contains("\ncut: packet cap 3 reached after "), "{said}");
    assert_eq!(packet_sockets(&pod), 0, "a packet socket is left in the namespace");
    let bundle = unpacked(&out);
    let manifest: serde_json::Value =
        serde_json::from_slice(&std::fs::read(bundle.join("manifest.json")).unwrap()).unwrap();
    let cut = manifest["cut"].as_array().unwrap();
    assert!(
        cut.len() == 1 && cut[0].as_str().unwrap().starts_with("packets: packet cap 3 reached after "),
        "{cut:?}"
    );
    assert_eq!(manifest["limits"]["max_packets"], 3);
    let packets =
        manifest["files"].as_array().unwrap().iter().find(|f| f["path"] == "packets.pcapng").unwrap();
    assert_eq!(packets["status"], "partial", "{packets}");
    let (lines, _) = tcpdump(&bundle.join("packets.pcapng"));
    assert_eq!(lines.lines().count(), 3, "{lines}");
    let bytes = std::fs::read(bundle.join("packets.pcapng")).unwrap();
    let mut reader = PcapNgReader::new(&bytes[..]).expect("pcapng");
    let mut comments = Vec::new();
    while let Some(block) = reader.next_block() {
        if let Block::InterfaceStatistics(isb) = block.expect("block") {
            for option in isb.options {
                if let InterfaceStatisticsOption::Comment(c) = option {
                    comments.push(c.into_owned());
                }
            }
        }
    }
    assert_eq!(comments.len(), 2, "one statistics block per interface: {comments:?}");
    assert!(comments.iter().all(|c| c.starts_with("cut: packet cap 3 reached after ")), "{comments:?}");
}

/// The byte cap ends the capture before a packet would take the files past it (the statistics
/// blocks' room kept), and says so.
#[test]
fn the_byte_cap_ends_the_capture_under_it_and_says_so() {
    if !kernel_tests_can_run("the_byte_cap_ends_the_capture_under_it_and_says_so") {
        return;
    }
    let (pod, _server) = pod_and_server();
    let dir = CaptureDisk::new();
    let out = dir.path().join("capture");
    let started = Instant::now();
    let mut capture = capture(&pod, &["--duration", "60s", "--max-bytes", "64K"], &out);
    // A SYN and its RST take about 240 bytes of file: 400 connects are past 64 KiB.
    let nfs: SocketAddr = "10.0.0.1:2049".parse().unwrap();
    pod.run_inside(move || refused_connects(nfs, 400));
    let said = capture.ended(Duration::from_secs(10));
    assert!(started.elapsed() < Duration::from_secs(20), "{:?}", started.elapsed());
    assert!(said.contains("\ncut: byte cap 64 KiB reached after "), "{said}");
    let bundle = unpacked(&out);
    let size = std::fs::metadata(bundle.join("packets.pcapng")).unwrap().len();
    assert!(size <= 64 << 10 && size > 60 << 10, "{size} bytes");
    let (lines, _) = tcpdump(&bundle.join("packets.pcapng"));
    assert!(lines.lines().count() > 400, "{}", lines.lines().count());
}

/// A fast flow — one TCP stream from the pod to the server as fast as the veth takes it, well past
/// 1 Gbit/s here — reaches the byte cap within a moment: the capture ends under it, and the
/// manifest says what cut it and marks the packets partial. Prints the flow's rate.
#[test]
fn a_fast_flow_is_cut_at_the_byte_cap_and_the_manifest_says_so() {
    if !kernel_tests_can_run("a_fast_flow_is_cut_at_the_byte_cap_and_the_manifest_says_so") {
        return;
    }
    let (pod, server) = pod_and_server();
    let listener = server.run_inside(|| std::net::TcpListener::bind("10.0.0.1:5001").expect("listen"));
    let sink = std::thread::spawn(move || {
        let (mut stream, _) = listener.accept().expect("accept");
        let mut buf = vec![0u8; 1 << 20];
        while std::io::Read::read(&mut stream, &mut buf).is_ok_and(|n| n > 0) {}
    });
    let dir = CaptureDisk::new();
    let out = dir.path().join("capture");
    let mut capture = capture(&pod, &["--duration", "60s", "--max-bytes", "256K"], &out);
    let mut stream =
        pod.run_inside(|| std::net::TcpStream::connect("10.0.0.1:5001").expect("connect the flow"));
    let chunk = vec![0x5au8; 1 << 20];
    let (started, mut sent) = (Instant::now(), 0u64);
    // The flow runs until the capture has ended on its own.
    while capture.0.try_wait().expect("wait").is_none() {
        std::io::Write::write_all(&mut stream, &chunk).expect("the flow");
        sent += chunk.len() as u64;
        assert!(started.elapsed() < Duration::from_secs(30), "the capture never reached its byte cap");
    }
    let took = started.elapsed();
    drop(stream);
    sink.join().unwrap();
    let said = capture.ended(Duration::ZERO);
    assert!(said.contains("\ncut: byte cap 256 KiB reached after "), "{said}");
    let bundle = unpacked(&out);
    let manifest: serde_json::Value =
        serde_json::from_slice(&std::fs::read(bundle.join("manifest.json")).unwrap()).unwrap();
    let cut = manifest["cut"].as_array().expect("cut");
    assert!(
        cut.len() == 1
            && cut[0].as_str().is_some_and(|c| c.starts_with("packets: byte cap 256 KiB reached after ")),
        "{manifest:#}"
    );
    let packets =
        manifest["files"].as_array().unwrap().iter().find(|f| f["path"] == "packets.pcapng").unwrap();
    assert_eq!(packets["status"], "partial", "{packets:#}");
    let size = std::fs::metadata(bundle.join("packets.pcapng")).unwrap().len();
    assert!(size <= 256 << 10, "{size} bytes");
    println!(
        "fast flow: {:.1} Gbit/s for {:.2} s ({} MiB) until the byte cap cut the capture at {} packets, {size} bytes",
        sent as f64 * 8.0 / took.as_secs_f64() / 1e9,
        took.as_secs_f64(),
        sent >> 20,
        manifest["packets"]["written"],
    );
}

/// Ctrl-C (SIGINT) ends a capture at once, with its files whole and its sockets closed.
#[test]
fn an_interrupted_capture_ends_whole() {
    if !kernel_tests_can_run("an_interrupted_capture_ends_whole") {
        return;
    }
    let (pod, _server) = pod_and_server();
    let dir = CaptureDisk::new();
    let out = dir.path().join("capture");
    let started = Instant::now();
    let mut capture = capture(&pod, &["--duration", "60s"], &out);
    let nfs: SocketAddr = "10.0.0.1:2049".parse().unwrap();
    pod.run_inside(move || refused_connects(nfs, 1));
    // SAFETY: a signal to the child this test started and has not reaped.
    assert_eq!(unsafe { libc::kill(capture.0.id() as i32, libc::SIGINT) }, 0);
    let said = capture.ended(Duration::from_secs(5));
    assert!(started.elapsed() < Duration::from_secs(15), "{:?}", started.elapsed());
    assert!(said.contains("\ncut: stopped after "), "{said}");
    assert_eq!(packet_sockets(&pod), 0, "a packet socket is left in the namespace");
    let bundle = unpacked(&out);
    let (lines, _) = tcpdump(&bundle.join("packets.pcapng"));
    assert_eq!(lines.lines().count(), 2, "{lines}");
}

/// A writer in the pod's namespace stuck in writeback, frozen on the disk under it.
struct StuckWriter<'a> {
    disk: &'a FreezableDisk,
    child: Child,
}

impl Drop for StuckWriter<'_> {
    fn drop(&mut self) {
        // Its I/O must end before it can: thaw first.
        self.disk.thaw();
        let _ = self.child.wait();
    }
}

/// A process of the pod's namespace in a real D-state wait (an fsync on a frozen disk) is in
/// `tasks/stuck.txt` with its tid and its kernel stack; the host has no NFS mount, so `nfs/` has
/// nothing, and the capture says how many processes it found.
#[test]
fn a_stuck_writer_in_the_namespace_is_in_the_tasks_file_with_its_stack() {
    if !kernel_tests_can_run("a_stuck_writer_in_the_namespace_is_in_the_tasks_file_with_its_stack") {
        return;
    }
    let (pod, _server) = pod_and_server();
    let disk = FreezableDisk::new("capture");
    disk.freeze();
    let target = disk.mount_point().join("capture-writer");
    // `ip netns exec` becomes dd: its pid is the writer's, in the pod's network namespace.
    let child = Command::new("ip")
        .args([
            "netns",
            "exec",
            &pod.name,
            "dd",
            "if=/dev/zero",
            "bs=1M",
            "count=8",
            "conv=fsync",
            "status=none",
        ])
        .arg(format!("of={}", target.display()))
        .spawn()
        .expect("start dd");
    let writer = StuckWriter { disk: &disk, child };
    let pid = writer.child.id();
    let in_d = || {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        stat.rsplit_once(") ").is_some_and(|(_, rest)| rest.starts_with('D')).then_some(())
    };
    wait_for(Duration::from_secs(10), in_d).unwrap_or_else(|| panic!("dd ({pid}) never waited in D state"));
    let dir = CaptureDisk::new();
    let out = dir.path().join("capture");
    let said = capture(&pod, &["--duration", "1s"], &out).ended(Duration::from_secs(15));
    println!("{said}");
    let bundle = unpacked(&out);
    let stuck = std::fs::read_to_string(bundle.join("tasks/stuck.txt")).expect("tasks/stuck.txt");
    let mut lines =
        stuck.lines().skip_while(|l| !l.starts_with(&format!("pid {pid} tid {pid} comm \"dd\" state D ")));
    assert!(lines.next().is_some(), "no line for dd ({pid}):\n{stuck}");
    let frames: Vec<&str> = lines.take_while(|l| l.starts_with("    ")).collect();
    assert!(
        frames.iter().any(|f| f.contains("folio_wait") || f.contains("writeback")),
        "no writeback wait in dd's stack:\n{stuck}"
    );
    let json: serde_json::Value =
        serde_json::from_slice(&std::fs::read(bundle.join("tasks/stuck.json")).unwrap()).expect("stuck.json");
    assert!(json["tasks"].as_array().unwrap().iter().any(|t| t["tid"] == pid), "{json}");
    assert!(said.contains(" NFS mounts, "), "{said}");
    let processes: usize = said
        .lines()
        .find_map(|l| l.split_once(" processes, ")?.0.parse().ok())
        .unwrap_or_else(|| panic!("no processes line:\n{said}"));
    assert!(processes >= 1, "{said}");
    let mode = std::os::unix::fs::PermissionsExt::mode(
        &std::fs::metadata(bundle.join("tasks")).unwrap().permissions(),
    );
    assert_eq!(mode & 0o777, 0o700);
    drop(writer);
}

/// A bad filter, a name, a missing namespace or process: one line, exit 64, nothing written.
#[test]
fn bad_input_is_one_line_and_nothing_is_written() {
    if !agent_binary().exists() {
        assert_ne!(
            std::env::var("KSTALL_KERNEL_TESTS").as_deref(),
            Ok("require"),
            "no {}",
            agent_binary().display()
        );
        println!("skipping bad_input_is_one_line_and_nothing_is_written: no {}", agent_binary().display());
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let out = dir.path().join("capture");
    let cases: [(&[&str], &str); 7] = [
        (
            &["--netns-file", "/proc/self/ns/uts"],
            "kstall: --netns-file /proc/self/ns/uts: not a network namespace",
        ),
        (
            &["--netns-file", "/proc/self/ns/net", "--filter", "host nfs-server"],
            "kstall: filter: \"nfs-server\" is a name, and the agent looks nothing up: give its address (host \
             10.55.0.1) or the port number",
        ),
        (
            &["--netns-file", "/proc/self/ns/net", "--snaplen", "10"],
            "kstall: --snaplen \"10\": headers (the default: no payload), full, or a number of bytes from 64 to 262144",
        ),
        (
            &["--netns-file", "/proc/self/ns/net", "--duration", "soon"],
            "kstall: --duration: \"soon\" is not a duration like 500ms, 90s, 30m, 1h",
        ),
        (
            &["--netns-file", "/run/netns/kstall-no-such-namespace"],
            "kstall: --netns-file /run/netns/kstall-no-such-namespace: No such file or directory (os error 2)",
        ),
        (
            &["--netns-file", "/proc/self/ns/net", "--pid", "4294967295"],
            "kstall: --pid 4294967295: no such process",
        ),
        (
            &["--filter", "tcp"],
            "kstall: the following required arguments were not provided: (see kstall --help)",
        ),
    ];
    for (args, said) in cases {
        let output = Command::new(agent_binary())
            .args(["capture", "start", "--standalone"])
            .args(args)
            .arg("-o")
            .arg(&out)
            .output()
            .expect("kstall capture");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(64), "{args:?}: {stderr}");
        assert_eq!(stderr.lines().count(), 1, "{args:?}: {stderr}");
        if said.contains("required arguments") {
            assert!(
                stderr.starts_with("kstall: the following required arguments were not provided"),
                "{stderr}"
            );
        } else {
            assert_eq!(stderr.trim_end(), said, "{args:?}");
        }
        assert!(!out.exists(), "{args:?} wrote {}", out.display());
    }
}
