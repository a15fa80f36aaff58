//! `kstall capture start --standalone`: one capture of a network namespace, in this process, as
//! root, into the bundle `DIR/<id>.tar.gz` (`capture::runner`): its packets (pcapng), its
//! conntrack entries and events, rules, sockets, addresses and routes, and — once the packets end
//! — the NFS mounts and tasks in D state of its processes (and of those `--pid` names); for nodes
//! without an agent, and before the agent runs captures itself. Everything is checked before
//! anything is written; the one line of a bad input exits 64.

use std::{
    fs::File,
    os::unix::fs::MetadataExt as _,
    path::{Path, PathBuf},
    process::ExitCode,
    sync::atomic::{AtomicBool, Ordering},
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use super::{EXIT_RUNTIME, EXIT_USAGE};
use crate::{
    capture::{
        bounded,
        bundle::{FilterFrom, Pod, Time, Trigger, TriggerKind},
        filter::{Link, Snaplen},
        namespace_of, nfs,
        packets::{Bounds, size, thousands},
        runner::{self, Outcome, Target},
        store::{self, Retention, Store},
    },
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
    /// The directory the bundle goes to, as `<id>.tar.gz` with its `<id>.json` summary (made if
    /// missing, 0700; files 0600).
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
    if args.output_dir.exists() && !args.output_dir.is_dir() {
        return Err(format!("-o {}: not a directory", args.output_dir.display()));
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

fn capture(dir: &Path, plan: Plan) -> Result<(), String> {
    let requested = Time(now_ns());
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
        pids: processes(proc, plan.netns_inode, &plan.pids),
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
        requested,
    };
    let id = store::new_id(requested.0, None, plan.netns_inode);
    let Outcome { summary, found } = runner::run(&store, &id, &hostname(), &target, &run_plan, &STOP, proc)?;
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

fn now_ns() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64)
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
