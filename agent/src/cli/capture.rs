//! `kstall capture start --standalone`: the packets of a network namespace into
//! `DIR/packets.pcapng` (and `DIR/packets-raw.pcapng` for bare-IP interfaces), in this process,
//! as root, with the namespace's conntrack entries and events, rules, sockets, addresses and
//! routes beside it (`capture::net`) — before the agent runs captures itself, and on nodes without an agent. Once the
//! packets end, the namespace's processes (and those `--pid` names) give the NFS side
//! (`DIR/nfs/`) and their tasks in D state (`DIR/tasks/`). Everything is checked before anything
//! is written; the one line of a bad input exits 64.

use std::{
    fs::File,
    io::BufWriter,
    os::unix::fs::MetadataExt as _,
    os::unix::fs::{DirBuilderExt as _, OpenOptionsExt as _},
    path::{Path, PathBuf},
    process::ExitCode,
    sync::atomic::{AtomicBool, Ordering},
    time::Duration,
};

use super::{EXIT_RUNTIME, EXIT_USAGE};
use crate::{
    capture::{
        FileStatus, bounded,
        filter::{Link, Snaplen},
        namespace_of,
        net::{self, Recorder},
        nfs,
        packets::{self, Bounds, OpenError, Outputs, size, thousands},
        pcapng::{Section, Writer},
        tasks,
    },
    kernel, setting,
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
    /// Capture a network namespace's packets into DIR (pcapng), bounded; headers only unless asked.
    Start(StartArgs),
}

#[derive(Debug, clap::Args)]
pub struct StartArgs {
    /// Capture in this process (root), not through the agent: the only way for now.
    #[arg(long)]
    pub standalone: bool,
    /// The network namespace: /run/netns/NAME, /proc/PID/ns/net.
    #[arg(long, value_name = "PATH")]
    pub netns_file: PathBuf,
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
    /// The directory the files go to (made if missing, 0700; files 0600; never overwritten).
    #[arg(short = 'o', long = "output-dir", value_name = "DIR")]
    pub output_dir: PathBuf,
}

pub fn run(args: CaptureArgs) -> ExitCode {
    match args.command {
        CaptureCommand::Start(args) => start(args),
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
    if !args.standalone {
        return Err("capture start needs --standalone: the agent does not run captures yet".into());
    }
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
    let netns = File::open(&args.netns_file)
        .map_err(|e| format!("--netns-file {}: {e}", args.netns_file.display()))?;
    // NS_GET_NSTYPE (linux/nsfs.h): which kind of namespace the file is, if it is one.
    const NS_GET_NSTYPE: libc::c_ulong = 0xb703;
    // SAFETY: an ioctl without argument on a descriptor held open.
    if unsafe { libc::ioctl(std::os::fd::AsRawFd::as_raw_fd(&netns), NS_GET_NSTYPE) } != libc::CLONE_NEWNET {
        return Err(format!("--netns-file {}: not a network namespace", args.netns_file.display()));
    }
    let netns_inode = netns.metadata().map(|m| m.ino()).unwrap_or(0);
    if let Some(pid) = args.pids.iter().find(|pid| !Path::new(&format!("/proc/{pid}")).exists()) {
        return Err(format!("--pid {pid}: no such process"));
    }
    let existing = ["packets.pcapng", "packets-raw.pcapng", "nfs", "tasks"].iter().chain(net::FILES.iter());
    if let Some(file) = existing.map(|f| args.output_dir.join(f)).find(|f| f.exists()) {
        return Err(format!("{} exists: a capture is never written over", file.display()));
    }
    let bounds = Bounds { duration, max_bytes, max_packets };
    Ok(Plan { netns, netns_inode, filter, snap, bounds, pids: args.pids.clone() })
}

static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: libc::c_int) {
    STOP.store(true, Ordering::Relaxed);
}

fn start(args: StartArgs) -> ExitCode {
    let plan = match validate(&args) {
        Ok(plan) => plan,
        Err(e) => {
            eprintln!("kstall: {e}");
            return ExitCode::from(EXIT_USAGE);
        }
    };
    match capture(&args.output_dir, plan) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("kstall: {e}");
            ExitCode::from(EXIT_RUNTIME)
        }
    }
}

fn create(path: &Path) -> Result<File, String> {
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .map_err(|e| format!("{}: {e}", path.display()))
}

fn capture(dir: &Path, plan: Plan) -> Result<(), String> {
    // Ctrl-C or SIGTERM from here on ends the capture with its files whole.
    // SAFETY: the handler only stores to an atomic.
    unsafe {
        libc::signal(libc::SIGINT, on_signal as *const () as libc::sighandler_t);
        libc::signal(libc::SIGTERM, on_signal as *const () as libc::sighandler_t);
    }
    let node = hostname();
    let describe = |name: &str| format!("{name}, netns {}, node {node}", plan.netns_inode);
    // Conntrack events are listened to before a packet socket opens: a connection the capture
    // sees has its events.
    let recorder = Recorder::open(&plan.netns)?;
    let taps = match packets::open(&plan.netns, plan.filter.as_deref(), plan.snap, &describe) {
        Ok(taps) => taps,
        Err(OpenError::Filter(e)) => return Err(e.to_string()),
        Err(OpenError::Other(e)) => return Err(e),
    };
    if taps.taps.is_empty() {
        return Err(format!(
            "no interface of the namespace is up to capture on ({})",
            taps.skipped.join("; ")
        ));
    }
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(|e| format!("{}: {e}", dir.display()))?;
    let section = Section {
        hardware: std::env::consts::ARCH.into(),
        os: format!("Linux {}", kernel::release()),
        application: format!("kstall {}", env!("CARGO_PKG_VERSION")),
        comment: Some(format!("kstall capture of netns {} on {node}", plan.netns_inode)),
    };
    let writer = |name: &str| -> Result<Writer<BufWriter<File>>, String> {
        let path = dir.join(name);
        let file = create(&path)?;
        Writer::new(BufWriter::with_capacity(256 << 10, file), &section)
            .map_err(|e| format!("{}: {e}", path.display()))
    };
    let mut ether = writer("packets.pcapng")?;
    let mut raw = match taps.taps.iter().any(|t| t.link == Link::Raw) {
        true => Some(writer("packets-raw.pcapng")?),
        false => None,
    };
    let has_ether = taps.taps.iter().any(|t| t.link == Link::Ethernet);
    let skipped = taps.skipped.clone();
    let mut outputs = Outputs { ether: has_ether.then_some(&mut ether), raw: raw.as_mut() };
    let report = packets::run(taps, &mut outputs, plan.bounds, &STOP)
        .map_err(|e| format!("writing the capture: {e}"))?;
    ether.finish().map_err(|e| format!("packets.pcapng: {e}"))?;
    if let Some(raw) = raw {
        raw.finish().map_err(|e| format!("packets-raw.pcapng: {e}"))?;
    }
    recorder.finish(dir)?;
    let per: Vec<String> = report
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
    println!(
        "{}: {} packets, {}: {}",
        dir.join("packets.pcapng").display(),
        thousands(report.packets),
        size(report.file_bytes),
        per.join(", ")
    );
    if let Some(cut) = &report.cut {
        println!("cut: {cut}");
    }
    for s in skipped {
        println!("not captured: {s}");
    }
    // After the packets: what is stuck at the end is what the capture was for.
    let proc = Path::new("/proc");
    let pids = processes(proc, plan.netns_inode, &plan.pids);
    let nfs = nfs::collect(proc, &pids, dir)?;
    let stuck = tasks::collect(proc, &pids, dir)?;
    let failed = nfs.notes.iter().chain(&stuck.notes).filter(|n| n.status == FileStatus::Failed).count();
    let mut also = String::new();
    if nfs.notes.iter().any(|n| n.status != FileStatus::Skipped) {
        also.push_str(&format!(", {}", dir.join("nfs").display()));
    }
    if failed > 0 {
        also.push_str(&format!("; {failed} files could not be read"));
    }
    if bounded::abandoned() > 0 {
        let after = nfs::WITHIN.as_secs();
        also.push_str(&format!("; {} /proc reads abandoned after {after} s", bounded::abandoned()));
    }
    println!(
        "{} processes, {} NFS mounts, {} stuck tasks: {}{also}",
        pids.len(),
        nfs.mounts,
        stuck.stuck,
        dir.join("tasks/stuck.txt").display()
    );
    Ok(())
}

/// The pod's processes: every process in the network namespace `netns` (by the `readlink` of
/// its `ns/net`, nothing opened), and `extra`; in order, each once.
fn processes(proc: &Path, netns: u64, extra: &[u32]) -> Vec<u32> {
    let mut pids: Vec<u32> = std::fs::read_dir(proc)
        .map(|dir| {
            dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
                .filter(|pid| namespace_of(&proc.join(format!("{pid}/ns/net"))) == Some(netns))
                .collect()
        })
        .unwrap_or_default();
    pids.extend_from_slice(extra);
    pids.sort_unstable();
    pids.dedup();
    pids
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname").map(|h| h.trim().to_string()).unwrap_or_default()
}
