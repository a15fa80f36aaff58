//! One capture from start to bundle, the same for `kstall capture start --standalone` and the
//! agent: room reserved in the store, the conntrack listener and the state at the start, the
//! packet sockets, the packets until a bound or a stop, the state at the end, the processes' NFS
//! mounts and stuck tasks, then the staging dir packed as `<id>.tar.gz` with its manifest. A
//! failure leaves no staging dir behind.

use std::{
    fs::File,
    io::BufWriter,
    path::Path,
    sync::{Arc, Mutex, PoisonError},
};

use super::{
    FileNote, FileStatus,
    bundle::{FilterFrom, Interface, Limits, Manifest, Packets, Pod, Time, Times, Trigger},
    context::{self, Context},
    filter::{Link, Snaplen},
    net::Recorder,
    nfs,
    packets::{self, Bounds, OpenError, Outputs, PacketsReport, Stop},
    pcapng::{Section, Writer},
    store::{Store, Summary},
    tasks,
};
use crate::kernel;

/// What is captured.
pub struct Target {
    pub netns: File,
    /// The pod as the manifest names it (a bare namespace: only its inode).
    pub pod: Pod,
    /// The pod's processes: whose NFS mounts and stuck tasks are read.
    pub pids: Vec<u32>,
    /// Begins each interface's description: `pod shop/web-1`, `netns 4026532999`.
    pub label: String,
}

/// How, and why.
pub struct Plan {
    pub filter: Option<String>,
    pub filter_from: FilterFrom,
    pub snap: Snaplen,
    pub bounds: Bounds,
    pub trigger: Trigger,
    /// Incidents of the pod that fired while it ran: the manifest names them beside the
    /// trigger's.
    pub joined: Joined,
    pub requested: Time,
}

pub type Joined = Arc<Mutex<Vec<String>>>;

/// A capture done: its bundle and what it found.
pub struct Outcome {
    pub summary: Summary,
    pub found: Found,
}

pub struct Found {
    pub packets: PacketsReport,
    /// Interfaces not captured, with why.
    pub skipped_links: Vec<String>,
    pub processes: usize,
    pub nfs_mounts: usize,
    pub stuck_tasks: usize,
    /// Files that could not be read at all.
    pub failed_files: usize,
}

/// What the node gives every capture: its name, its `/proc`, and what the agent knows of its pods
/// (the standalone CLI knows nothing).
#[derive(Clone, Copy)]
pub struct Node<'a> {
    pub name: &'a str,
    pub proc: &'a Path,
    pub context: Option<&'a Context>,
}

/// Captures `target` into the store as bundle `id`; `stop` ends the packets early, as a cut.
pub fn run(
    store: &Store,
    id: &str,
    node: &Node,
    target: &Target,
    plan: &Plan,
    stop: &Stop,
) -> Result<Outcome, String> {
    let reservation = store.reserve(plan.bounds.max_bytes)?;
    let staging = store.staging(id)?;
    let captured = collect(&staging, id, node, target, plan, stop).and_then(|(manifest, notes, found)| {
        store.finish(reservation, &staging, &manifest, &notes).map(|summary| Outcome { summary, found })
    });
    if captured.is_err() {
        // What was staged is no evidence anyone can find: gone, as a crash's would be at the
        // next start.
        let _ = store.abandon(&staging);
    }
    captured
}

fn collect(
    staging: &Path,
    id: &str,
    node: &Node,
    target: &Target,
    plan: &Plan,
    stop: &Stop,
) -> Result<(Manifest, Vec<FileNote>, Found), String> {
    let Node { name: node, proc, context } = *node;
    let started = now();
    // Conntrack events are listened to before a packet socket opens: a connection the capture
    // sees has its events.
    let recorder = Recorder::open(&target.netns, target.pod.netns, proc, &target.pids)?;
    let describe = |name: &str| format!("{} {name}, netns {}, node {node}", target.label, target.pod.netns);
    let taps = match packets::open(&target.netns, plan.filter.as_deref(), plan.snap, &describe) {
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
    let section = Section {
        hardware: std::env::consts::ARCH.into(),
        os: format!("Linux {}", kernel::release()),
        application: format!("kstall {}", env!("CARGO_PKG_VERSION")),
        comment: Some(format!("kstall capture {id} of {} on {node}", target.label)),
    };
    let writer = |name: &str| -> Result<Writer<BufWriter<File>>, String> {
        let path = staging.join(name);
        let file = super::create_new(&path)?;
        Writer::new(BufWriter::with_capacity(256 << 10, file), &section)
            .map_err(|e| format!("{}: {e}", path.display()))
    };
    let has_ether = taps.taps.iter().any(|t| t.link == Link::Ethernet);
    let has_raw = taps.taps.iter().any(|t| t.link == Link::Raw);
    let mut ether = has_ether.then(|| writer(PACKETS)).transpose()?;
    let mut raw = has_raw.then(|| writer(PACKETS_RAW)).transpose()?;
    let skipped_links = taps.skipped.clone();
    let mut outputs = Outputs { ether: ether.as_mut(), raw: raw.as_mut() };
    let report = packets::run(taps, &mut outputs, plan.bounds, stop)
        .map_err(|e| format!("writing the capture: {e}"))?;
    let mut notes = Vec::new();
    for (name, writer, what) in [
        (PACKETS, ether, "the packets of the namespace's Ethernet and loopback interfaces (pcapng)"),
        (PACKETS_RAW, raw, "the packets of its bare-IP interfaces (tun, wireguard; pcapng)"),
    ] {
        let Some(writer) = writer else { continue };
        writer.finish().map_err(|e| format!("{name}: {e}"))?;
        let (status, error) = match &report.cut {
            Some(cut) => (FileStatus::Partial, Some(cut.clone())),
            None => (FileStatus::Complete, None),
        };
        notes.push(FileNote { path: name.into(), what: what.into(), status, error });
    }
    let packets_ended = now();
    notes.extend(recorder.finish(staging)?);
    // After the packets: what is stuck at the end is what the capture was for, in the processes
    // of the start and those in the namespace now.
    let pids = super::processes_in(proc, target.pod.netns, &target.pids);
    let nfs = nfs::collect(proc, &pids, staging)?;
    let stuck = tasks::collect(proc, &pids, staging)?;
    notes.extend(nfs.notes);
    notes.extend(stuck.notes);
    if let Some(context) = context {
        notes.extend(context::write(context, target.pod.uid.as_deref(), staging)?);
    }
    let failed_files = notes.iter().filter(|n| n.status == FileStatus::Failed).count();
    let manifest = Manifest {
        id: id.to_string(),
        node: node.to_string(),
        kernel: kernel::release(),
        kstall: env!("CARGO_PKG_VERSION").to_string(),
        trigger: {
            let mut trigger = plan.trigger.clone();
            trigger
                .incidents
                .extend(plan.joined.lock().unwrap_or_else(PoisonError::into_inner).iter().cloned());
            trigger
        },
        pod: target.pod.clone(),
        times: Times { requested: plan.requested, started, packets_ended, ended: now() },
        limits: Limits {
            duration_secs: plan.bounds.duration.as_secs(),
            max_bytes: plan.bounds.max_bytes,
            max_packets: plan.bounds.max_packets,
            snaplen: plan.snap,
            filter: plan.filter.clone(),
            filter_from: plan.filter_from,
        },
        cut: report.cut.iter().map(|cut| format!("packets: {cut}")).collect(),
        packets: Packets {
            interfaces: report
                .interfaces
                .iter()
                .map(|i| Interface {
                    name: i.name.clone(),
                    index: i.index,
                    linktype: i.linktype,
                    accepted: i.accepted,
                    dropped_by_kernel: i.dropped,
                    written: i.written,
                })
                .collect(),
            written: report.packets,
            file_bytes: report.file_bytes,
        },
        notes: skipped_links.iter().map(|s| format!("not captured: {s}")).collect(),
    };
    let found = Found {
        packets: report,
        skipped_links,
        processes: pids.len(),
        nfs_mounts: nfs.mounts,
        stuck_tasks: stuck.stuck,
        failed_files,
    };
    Ok((manifest, notes, found))
}

const PACKETS: &str = "packets.pcapng";
const PACKETS_RAW: &str = "packets-raw.pcapng";

fn now() -> Time {
    Time(kernel::unix_now_ns())
}
