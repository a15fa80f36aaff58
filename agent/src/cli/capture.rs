//! `kstall capture`: a pod's network namespace captured into an evidence bundle (`.tar.gz`): its
//! packets (pcapng), its conntrack entries and events, rules, sockets, addresses and routes, and —
//! once the packets end — the NFS mounts and tasks in D state of its processes.
//!
//! - `start --pod NAME [-n NS]`, `list`, `get ID`, `stop ID`: through the agent's socket; the
//!   agent runs the capture on a thread of its own and keeps the bundle under
//!   `<state>/captures/`. Its refusals are one line and exit 1.
//! - `start --standalone --netns-file P -o DIR`: in this process, as root, into `DIR/<id>.tar.gz`
//!   (`capture::runner`), for nodes without an agent. Everything is checked before anything is
//!   written.
//!
//! The one line of a bad input exits 64.

use std::{
    fs::File,
    io::{BufRead as _, BufReader, Read as _, Write as _},
    os::unix::{fs::MetadataExt as _, fs::OpenOptionsExt as _, net::UnixStream},
    path::{Path, PathBuf},
    process::ExitCode,
    time::Duration,
};

use super::{EXIT_RUNTIME, EXIT_USAGE};
use crate::{
    capture::{
        self, bounded,
        bundle::{FilterFrom, Pod, Time, Trigger, TriggerKind},
        filter::{Link, Snaplen},
        nfs,
        packets::{Bounds, Stop, size, thousands},
        runner::{self, Outcome, Target},
        service::{Ask, Info},
        store::{self, Retention, Store},
    },
    config::DEFAULT_API_SOCKET,
    setting,
};

const DEFAULT_DURATION: Duration = Duration::from_secs(60);
const DEFAULT_MAX_BYTES: u64 = 64 << 20;
const DEFAULT_MAX_PACKETS: u64 = 1_000_000;

#[derive(Debug, clap::Args)]
pub struct CaptureArgs {
    #[command(subcommand)]
    pub command: CaptureCommand,
}

#[derive(Debug, clap::Subcommand)]
pub enum CaptureCommand {
    /// Capture a network namespace into DIR/<id>.tar.gz (packets as pcapng, its state, its
    /// processes' NFS mounts and stuck tasks), bounded; headers only unless asked.
    Start(Box<StartArgs>),
    /// The agent's captures: those kept, failed and running.
    List {
        /// text or json.
        #[arg(short = 'o', long, default_value = "text", value_parser = ["text", "json"])]
        output: String,
        #[command(flatten)]
        socket: Socket,
    },
    /// Download a finished capture's bundle, its size and sha256 checked.
    Get {
        /// The capture's id (kstall capture list).
        id: String,
        /// Where to: a file, created 0600 and never over an existing one, or - for stdout
        /// [default: ./ID.tar.gz].
        #[arg(short = 'o', long, value_name = "FILE|-")]
        output: Option<PathBuf>,
        #[command(flatten)]
        socket: Socket,
    },
    /// End a running capture now; its bundle is kept, cut.
    Stop {
        id: String,
        #[command(flatten)]
        socket: Socket,
    },
}

#[derive(Debug, clap::Args)]
pub struct Socket {
    /// The agent's API socket.
    #[arg(long, env = "KSTALL_API_SOCKET", default_value = DEFAULT_API_SOCKET, value_name = "PATH")]
    pub api_socket: PathBuf,
}

#[derive(Debug, clap::Args)]
pub struct StartArgs {
    /// The pod to capture, by name or UID (through the agent).
    #[arg(long, value_name = "NAME", conflicts_with = "standalone")]
    pub pod: Option<String>,
    /// The pod's namespace.
    #[arg(short = 'n', long, value_name = "NAMESPACE", requires = "pod")]
    pub namespace: Option<String>,
    /// A network namespace by inode (a pod's is captured as the pod), or host: the node's (give a
    /// --filter: every pod's traffic crosses it) (through the agent).
    #[arg(long, value_name = "INODE|host", conflicts_with_all = ["pod", "standalone"])]
    pub netns: Option<String>,
    /// An incident's pod, filtered to the incident's peers and ports unless --filter says
    /// otherwise; the incident's evidence names the capture (through the agent).
    #[arg(long, value_name = "ID", conflicts_with_all = ["pod", "netns", "standalone"])]
    pub incident: Option<String>,
    /// Wait until the capture has ended, then say what it holds (through the agent).
    #[arg(long, conflicts_with = "standalone")]
    pub wait: bool,
    #[command(flatten)]
    pub socket: Socket,
    /// Capture in this process (root), not through the agent.
    #[arg(long)]
    pub standalone: bool,
    /// With --standalone, the network namespace: /run/netns/NAME, /proc/PID/ns/net.
    #[arg(long, value_name = "PATH", required_if_eq("standalone", "true"))]
    pub netns_file: Option<PathBuf>,
    /// Which packets, in libpcap's language (tcpdump's): addresses and port numbers, no names
    /// [default: every packet].
    #[arg(long, value_name = "FILTER")]
    pub filter: Option<String>,
    /// Stop after this long: 10s, 2m [default: 60s].
    #[arg(long, value_name = "DURATION")]
    pub duration: Option<String>,
    /// How much of each packet: headers (up to the end of the TCP/UDP header, no payload),
    /// full, or a number of bytes (64-262144).
    #[arg(long, default_value = "headers", value_name = "headers|N|full")]
    pub snaplen: String,
    /// Stop before the files grow past this: 4M, 1G [default: 64M].
    #[arg(long, value_name = "BYTES")]
    pub max_bytes: Option<String>,
    /// Stop after this many packets [default: 1000000].
    #[arg(long, value_name = "N")]
    pub max_packets: Option<u64>,
    /// A process of the pod besides those in the namespace (one whose NFS mounts or stuck tasks
    /// matter but which runs in another network namespace); repeatable.
    #[arg(long = "pid", value_name = "PID")]
    pub pids: Vec<u32>,
    /// With --standalone, the directory the bundle goes to, as `<id>.tar.gz` with its `<id>.json`
    /// summary (made if missing, 0700; files 0600).
    #[arg(short = 'o', long = "output-dir", value_name = "DIR", required_if_eq("standalone", "true"))]
    pub output_dir: Option<PathBuf>,
}

pub fn run(args: CaptureArgs) -> ExitCode {
    match args.command {
        CaptureCommand::Start(args) if args.standalone => start(*args),
        CaptureCommand::Start(args) => agent::start(*args),
        CaptureCommand::List { output, socket } => agent::list(&socket.api_socket, &output),
        CaptureCommand::Get { id, output, socket } => agent::get(&socket.api_socket, &id, output),
        CaptureCommand::Stop { id, socket } => agent::stop(&socket.api_socket, &id),
    }
}

/// What the command line asks, checked.
struct Plan {
    netns: File,
    netns_inode: u64,
    filter: Option<String>,
    snap: Snaplen,
    bounds: Bounds,
    pids: Vec<u32>,
}

fn validate(args: &StartArgs) -> Result<Plan, String> {
    let (Some(netns_file), Some(output_dir)) = (&args.netns_file, &args.output_dir) else {
        return Err("capture start --standalone needs --netns-file PATH and -o DIR".into());
    };
    let duration = match &args.duration {
        Some(text) => setting::duration("duration", text).map_err(|(_, why)| format!("--duration: {why}"))?,
        None => DEFAULT_DURATION,
    };
    let max_bytes = match &args.max_bytes {
        Some(text) => setting::bytes("max-bytes", text).map_err(|(_, why)| format!("--max-bytes: {why}"))?,
        None => DEFAULT_MAX_BYTES,
    };
    if max_bytes < 64 << 10 {
        return Err(format!("--max-bytes: {} is less than 64 KiB", size(max_bytes)));
    }
    let max_packets = args.max_packets.unwrap_or(DEFAULT_MAX_PACKETS);
    if max_packets == 0 {
        return Err("--max-packets: 0 would capture nothing".into());
    }
    let snap = Snaplen::parse(&args.snaplen)?;
    let filter = args.filter.as_deref().map(str::trim).filter(|f| !f.is_empty()).map(str::to_string);
    // The filter's mistakes are usage errors: compiled here, before anything is opened.
    crate::capture::filter::compile(filter.as_deref(), Link::Ethernet, snap).map_err(|e| e.to_string())?;
    let netns = File::open(netns_file).map_err(|e| format!("--netns-file {}: {e}", netns_file.display()))?;
    // NS_GET_NSTYPE (linux/nsfs.h): which kind of namespace the file is, if it is one.
    const NS_GET_NSTYPE: libc::c_ulong = 0xb703;
    // SAFETY: an ioctl without argument on a descriptor held open.
    if unsafe { libc::ioctl(std::os::fd::AsRawFd::as_raw_fd(&netns), NS_GET_NSTYPE) } != libc::CLONE_NEWNET {
        return Err(format!("--netns-file {}: not a network namespace", netns_file.display()));
    }
    let netns_inode = netns.metadata().map(|m| m.ino()).unwrap_or(0);
    if let Some(pid) = args.pids.iter().find(|pid| !Path::new(&format!("/proc/{pid}")).exists()) {
        return Err(format!("--pid {pid}: no such process"));
    }
    if output_dir.exists() && !output_dir.is_dir() {
        return Err(format!("-o {}: not a directory", output_dir.display()));
    }
    let bounds = Bounds { duration, max_bytes, max_packets };
    Ok(Plan { netns, netns_inode, filter, snap, bounds, pids: args.pids.clone() })
}

static STOP: Stop = Stop::new();

extern "C" fn on_signal(_: libc::c_int) {
    STOP.ask();
}

fn start(args: StartArgs) -> ExitCode {
    let plan = match validate(&args) {
        Ok(plan) => plan,
        Err(e) => {
            eprintln!("kstall: {e}");
            return ExitCode::from(EXIT_USAGE);
        }
    };
    let dir = args.output_dir.clone().unwrap_or_default();
    match capture(&dir, plan) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("kstall: {e}");
            ExitCode::from(EXIT_RUNTIME)
        }
    }
}

fn capture(dir: &Path, plan: Plan) -> Result<(), String> {
    let requested = Time(crate::kernel::unix_now_ns());
    // Ctrl-C or SIGTERM from here on ends the capture with its bundle whole.
    // SAFETY: the handler only stores to an atomic.
    unsafe {
        libc::signal(libc::SIGINT, on_signal as *const () as libc::sighandler_t);
        libc::signal(libc::SIGTERM, on_signal as *const () as libc::sighandler_t);
    }
    // No count or budget of its own: the operator chose the directory; the filesystem's last 5%
    // still holds.
    let (store, _) = Store::open(dir, Retention { keep: usize::MAX, disk: u64::MAX })?;
    let proc = Path::new("/proc");
    let target = Target {
        pod: Pod { netns: plan.netns_inode, ..Pod::default() },
        pids: capture::processes_in(proc, plan.netns_inode, &plan.pids),
        label: format!("netns {}", plan.netns_inode),
        netns: plan.netns,
    };
    let run_plan = runner::Plan {
        filter_from: if plan.filter.is_some() { FilterFrom::Given } else { FilterFrom::None },
        filter: plan.filter,
        snap: plan.snap,
        bounds: plan.bounds,
        trigger: Trigger {
            kind: TriggerKind::Manual,
            incidents: vec![],
            signature: None,
            requested_by: "standalone".into(),
        },
        joined: runner::Joined::default(),
        requested,
    };
    let id = store::new_id(requested.0, None, plan.netns_inode);
    let hostname = crate::attribution::flags::hostname();
    let node = runner::Node { name: &hostname, proc, context: None };
    let Outcome { summary, found } = runner::run(&store, &id, &node, &target, &run_plan, &STOP)?;
    let per: Vec<String> = found
        .packets
        .interfaces
        .iter()
        .map(|i| {
            format!(
                "{} {} (kernel accepted {}, dropped {}; socket buffer {})",
                i.name,
                thousands(i.written),
                thousands(i.accepted),
                thousands(i.dropped),
                size(i.rcvbuf as u64)
            )
        })
        .collect();
    println!("{}: {}", store.dir().join(&summary.file).display(), size(summary.bytes));
    println!(
        "packets: {} ({}): {}",
        thousands(found.packets.packets),
        size(found.packets.file_bytes),
        per.join(", ")
    );
    if let Some(cut) = &found.packets.cut {
        println!("cut: {cut}");
    }
    for s in &found.skipped_links {
        println!("not captured: {s}");
    }
    let mut also = String::new();
    if found.failed_files > 0 {
        also.push_str(&format!("; {} files could not be read", found.failed_files));
    }
    if bounded::abandoned() > 0 {
        let after = nfs::WITHIN.as_secs();
        also.push_str(&format!("; {} /proc reads abandoned after {after} s", bounded::abandoned()));
    }
    println!(
        "{} processes, {} NFS mounts, {} stuck tasks{also}",
        found.processes, found.nfs_mounts, found.stuck_tasks
    );
    Ok(())
}

/// The commands that go through the agent's socket.
mod agent {
    use super::*;
    use crate::api::{
        ErrorReply, Request,
        captures::{CaptureReply, CapturesReply},
    };

    /// What went wrong: a usage error (64) or a refusal or failure (1), in one line.
    enum Failure {
        Usage(String),
        Runtime(String),
    }

    fn exit(result: Result<(), Failure>) -> ExitCode {
        let (line, code) = match result {
            Ok(()) => return ExitCode::SUCCESS,
            Err(Failure::Usage(e)) => (e, EXIT_USAGE),
            Err(Failure::Runtime(e)) => (e, EXIT_RUNTIME),
        };
        // A line that names its command already (`kstall capture get: …`) needs no prefix.
        match line.starts_with("kstall ") {
            true => eprintln!("{line}"),
            false => eprintln!("kstall: {line}"),
        }
        ExitCode::from(code)
    }

    /// A connection that sent its request, read line by line (and then raw bytes).
    struct Conversation {
        reader: BufReader<UnixStream>,
        socket: PathBuf,
    }

    impl Conversation {
        fn open(socket: &Path, request: &Request, timeout: Option<Duration>) -> Result<Self, Failure> {
            let unreachable = |e| Failure::Runtime(crate::cli::status::unreachable(socket, e));
            let mut stream = UnixStream::connect(socket).map_err(unreachable)?;
            stream.set_read_timeout(timeout).map_err(unreachable)?;
            let mut line = serde_json::to_vec(request).expect("serializable");
            line.push(b'\n');
            stream.write_all(&line).map_err(unreachable)?;
            Ok(Conversation { reader: BufReader::new(stream), socket: socket.to_path_buf() })
        }

        /// The next document, or the agent's refusal as it said it.
        fn next<T: serde::de::DeserializeOwned>(&mut self) -> Result<T, Failure> {
            let mut line = String::new();
            let read = self.reader.read_line(&mut line).map_err(|e| match e.kind() {
                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut => Failure::Runtime(format!(
                    "the agent at {} did not answer in time (see its log)",
                    self.socket.display()
                )),
                _ => Failure::Runtime(crate::cli::status::unreachable(&self.socket, e)),
            })?;
            if read == 0 {
                return Err(Failure::Runtime(format!("the agent at {} hung up", self.socket.display())));
            }
            if let Ok(err) = serde_json::from_str::<ErrorReply>(&line) {
                return Err(Failure::Runtime(err.error));
            }
            serde_json::from_str(&line)
                .map_err(|e| Failure::Runtime(format!("unexpected answer from the agent: {e}")))
        }
    }

    const ANSWER: Option<Duration> = Some(Duration::from_secs(10));

    pub fn start(args: StartArgs) -> ExitCode {
        exit(start_(args))
    }

    fn start_(args: StartArgs) -> Result<(), Failure> {
        let usage = Failure::Usage;
        if args.pod.is_none() && args.netns.is_none() && args.incident.is_none() {
            return Err(usage(
                "kstall capture start: say what to capture: --pod NAME [-n NAMESPACE], --netns INODE|host, --incident ID, or --standalone --netns-file PATH -o DIR"
                    .into(),
            ));
        }
        if let Some(netns) = args.netns.as_deref().filter(|n| *n != "host" && n.parse::<u64>().is_err()) {
            return Err(usage(format!(
                "--netns {netns}: a network namespace's inode (kstall explain pod shows a pod's) or host"
            )));
        }
        if !args.pids.is_empty() {
            return Err(usage("--pid: only with --standalone (the agent finds the pod's processes)".into()));
        }
        let duration = match &args.duration {
            Some(text) => {
                let d = setting::parse_duration(text)
                    .ok_or_else(|| usage(format!("--duration {text}: not a duration like 10s, 2m")))?;
                crate::capture::flags::check_duration(&format!("--duration {text}"), d).map_err(usage)?;
                Some(d.as_secs())
            }
            None => None,
        };
        let max_bytes = match &args.max_bytes {
            Some(text) => Some(
                setting::bytes("max-bytes", text).map_err(|(_, why)| usage(format!("--max-bytes: {why}")))?,
            ),
            None => None,
        };
        Snaplen::parse(&args.snaplen).map_err(usage)?;
        let ask = Ask {
            filter: args.filter.clone(),
            duration_secs: duration,
            max_bytes,
            max_packets: args.max_packets,
            snaplen: Some(args.snaplen.clone()),
        };
        let request = Request::CaptureStart {
            pod: args.pod.clone(),
            namespace: args.namespace.clone(),
            netns: args.netns.clone(),
            incident: args.incident.clone(),
            filter: ask.filter,
            duration_secs: ask.duration_secs,
            max_bytes: ask.max_bytes,
            max_packets: ask.max_packets,
            snaplen: ask.snaplen,
            wait: args.wait,
        };
        let mut talk = Conversation::open(&args.socket.api_socket, &request, ANSWER)?;
        let CaptureReply { capture } = talk.next()?;
        let snap = match capture.snaplen.as_str() {
            "headers" => "headers only".to_string(),
            "full" => "whole packets".to_string(),
            n => format!("{n} bytes a packet"),
        };
        let filter = capture.filter.as_deref().map(|f| format!(", filter {f:?}")).unwrap_or_default();
        println!(
            "capturing {} (netns {}) for {} s, {snap}{filter}",
            capture.target, capture.netns, capture.duration_secs
        );
        if !args.wait {
            println!(
                "capture {} (when done: kstall capture list; kstall capture get {})",
                capture.id, capture.id
            );
            return Ok(());
        }
        // The capture's own bound, then the end snapshot and the bundle's packing.
        talk.reader
            .get_ref()
            .set_read_timeout(Some(Duration::from_secs(capture.duration_secs + 120)))
            .map_err(|e| Failure::Runtime(e.to_string()))?;
        let CaptureReply { capture } = talk.next()?;
        done(&capture)
    }

    /// What an ended capture says: its bundle, or why it failed.
    fn done(capture: &Info) -> Result<(), Failure> {
        if let Some(summary) = &capture.summary {
            let cut = if summary.cut.is_empty() {
                String::new()
            } else {
                format!("; cut: {}", summary.cut.join("; "))
            };
            println!(
                "capture {}: {} packets, bundle {}{cut} (kstall capture get {})",
                capture.id,
                thousands(summary.packets),
                size(summary.bytes),
                capture.id
            );
            return Ok(());
        }
        Err(Failure::Runtime(format!(
            "capture {} failed: {}",
            capture.id,
            capture.error.as_deref().unwrap_or("no bundle")
        )))
    }

    pub fn list(socket: &Path, output: &str) -> ExitCode {
        exit((|| {
            let CapturesReply { captures } =
                Conversation::open(socket, &Request::Captures, ANSWER)?.next()?;
            if output == "json" {
                println!("{}", serde_json::to_string_pretty(&captures).expect("serializable"));
                return Ok(());
            }
            print!("{}", table(&captures));
            Ok(())
        })())
    }

    /// ID, STATE, POD, STARTED, SIZE, CUT: one row a capture.
    pub(super) fn table(captures: &[Info]) -> String {
        let rows: Vec<[String; 6]> = captures
            .iter()
            .map(|c| {
                let started = jiff::Timestamp::from_nanosecond(i128::from(c.started.0))
                    .map(|t| t.strftime("%Y-%m-%dT%H:%M:%SZ").to_string())
                    .unwrap_or_default();
                let (bytes, cut) = match (&c.summary, &c.error) {
                    (Some(s), _) => {
                        (size(s.bytes), if s.cut.is_empty() { "-".into() } else { s.cut.join("; ") })
                    }
                    (None, Some(e)) => ("-".into(), e.clone()),
                    (None, None) => ("-".into(), "-".into()),
                };
                [c.id.clone(), c.state.clone(), c.target.clone(), started, bytes, cut]
            })
            .collect();
        let head = ["ID", "STATE", "POD", "STARTED", "SIZE", "CUT"].map(String::from);
        let mut width = [0; 6];
        for row in std::iter::once(&head).chain(&rows) {
            for (w, cell) in width.iter_mut().zip(row) {
                *w = (*w).max(cell.chars().count());
            }
        }
        let mut out = String::new();
        for row in std::iter::once(&head).chain(&rows) {
            let cells: Vec<String> =
                row[..5].iter().zip(width).map(|(cell, w)| format!("{cell:<w$}")).collect();
            out.push_str(&format!("{}  {}\n", cells.join("  "), row[5]));
        }
        out
    }

    pub fn stop(socket: &Path, id: &str) -> ExitCode {
        exit((|| {
            store::check_id(id).map_err(Failure::Usage)?;
            let request = Request::CaptureStop { id: id.to_string() };
            let CaptureReply { capture } = Conversation::open(socket, &request, ANSWER)?.next()?;
            match capture.state.as_str() {
                "running" => println!("stopping capture {}: its bundle is kept, cut", capture.id),
                state => println!("capture {}: already {state}", capture.id),
            }
            Ok(())
        })())
    }

    pub fn get(socket: &Path, id: &str, output: Option<PathBuf>) -> ExitCode {
        exit(get_(socket, id, output))
    }

    fn get_(socket: &Path, id: &str, output: Option<PathBuf>) -> Result<(), Failure> {
        let fail = |e: String| Failure::Runtime(format!("kstall capture get: {e}"));
        store::check_id(id).map_err(|e| Failure::Usage(format!("kstall capture get: {e}")))?;
        let path = output.unwrap_or_else(|| PathBuf::from(format!("{id}.tar.gz")));
        let stdout = path.as_os_str() == "-";
        let mut file = match stdout {
            true => None,
            false => Some(
                std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(&path).map_err(
                    |e| match e.kind() {
                        std::io::ErrorKind::AlreadyExists => Failure::Usage(format!(
                            "kstall capture get: {} exists: give -o or remove it",
                            path.display()
                        )),
                        _ => fail(format!("{}: {e}", path.display())),
                    },
                )?,
            ),
        };
        let fetched = (|| {
            let request = Request::CaptureGet { id: id.to_string() };
            let mut talk = Conversation::open(socket, &request, Some(Duration::from_secs(30)))?;
            let CaptureReply { capture } = talk.next()?;
            let summary = capture.summary.ok_or_else(|| fail(format!("{id}: no bundle yet")))?;
            let mut digest = ring::digest::Context::new(&ring::digest::SHA256);
            let mut out: Box<dyn std::io::Write> = match &mut file {
                Some(f) => Box::new(f),
                None => Box::new(std::io::stdout().lock()),
            };
            let mut body = (&mut talk.reader).take(summary.bytes);
            let mut buf = vec![0u8; 256 << 10];
            let mut got = 0u64;
            loop {
                let n = body.read(&mut buf).map_err(|e| fail(format!("{id}: reading the bundle: {e}")))?;
                if n == 0 {
                    break;
                }
                digest.update(&buf[..n]);
                out.write_all(&buf[..n]).map_err(|e| fail(format!("{}: {e}", path.display())))?;
                got += n as u64;
            }
            out.flush().map_err(|e| fail(format!("{}: {e}", path.display())))?;
            let sha256: String = digest.finish().as_ref().iter().map(|b| format!("{b:02x}")).collect();
            if got != summary.bytes {
                return Err(fail(format!("{id}: {got} of {} bytes came", summary.bytes)));
            }
            if sha256 != summary.sha256 {
                return Err(fail(format!(
                    "{id}: sha256 {sha256}, the agent's summary says {}",
                    summary.sha256
                )));
            }
            Ok(summary)
        })();
        match fetched {
            Ok(summary) => {
                match file {
                    Some(f) => {
                        f.sync_all().map_err(|e| fail(format!("{}: {e}", path.display())))?;
                        eprintln!(
                            "{}: {} (sha256 {}, checked)",
                            path.display(),
                            size(summary.bytes),
                            summary.sha256
                        );
                    }
                    // What a receiver at the other end of a pipe (`kubectl kstall capture get`)
                    // checks its copy against.
                    None => eprintln!("{id}: {} (sha256 {}, sent)", size(summary.bytes), summary.sha256),
                }
                Ok(())
            }
            Err(e) => {
                if !stdout {
                    let _ = std::fs::remove_file(&path);
                }
                Err(e)
            }
        }
    }
}
