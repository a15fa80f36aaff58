//! The probe registry: each probe plans its programs from the running kernel's BTF, then loads and
//! attaches independently. A probe that cannot run here (missing tracepoint or BTF type, verifier
//! rejection) is reported down with its reason and the others run on.

pub mod counters;
pub mod hung_task;
pub mod nfs;
pub mod oom;
pub mod plan;
pub mod probe;
pub mod stuck_task;
mod task;
pub mod tcp_reset;
pub mod wait;

use aya::{
    Btf, Ebpf, EbpfLoader,
    maps::{Array, MapData, PerCpuArray, RingBuf},
    programs::{BtfTracePoint, FEntry, Iter, Program, ProgramError},
};
use kstall_common::{capture::CaptureFilter, tcp_reset::ConntrackOffsets};

use std::sync::{Arc, Mutex, PoisonError};

use self::plan::{Attach, Plan, ProbeStatus, ProgramSpec, Unavailable, error_chain, summarize};
pub use self::probe::{EventData, EventKind, FilterFields, Probe, Subject};
use crate::{kernel, kernel_btf::KernelBtf, symbols::Symbols};

/// The kernel programs, built by build.rs (empty when built with `AYA_BUILD_SKIP=1`).
static OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/kstall"));

/// Every probe kstall has, in the order `kstall status` lists them.
pub const ALL: &[&dyn Probe] = &[
    &tcp_reset::TcpResetProbe,
    &hung_task::HungTaskProbe,
    &oom::OomProbe,
    &nfs::NfsProbe,
    &stuck_task::StuckTaskProbe,
];

pub fn names() -> impl Iterator<Item = &'static str> {
    ALL.iter().map(|p| p.name())
}

/// Where probe `name` is in [`ALL`].
pub fn position(name: &str) -> Option<usize> {
    ALL.iter().position(|p| p.name() == name)
}

/// Every event kind's description, by its JSON `kind` (a kind two probes emit is listed once).
pub fn event_kind(name: &str) -> Option<&'static EventKind> {
    ALL.iter().flat_map(|p| p.events()).find(|k| k.name == name)
}

/// What the agent asks of its probes (part of the agent's configuration, validated there).
#[derive(Debug, Clone, PartialEq)]
pub struct Settings {
    /// Probes to load, by name; the others are reported "disabled by --probes".
    pub enabled: Vec<String>,
    pub ring_buffer_bytes: u32,
    /// Events of one counter key sent in full per CPU per interval; `u32::MAX`: all.
    pub sample_events: u32,
    pub tcp_reset_hook: tcp_reset::Hook,
    /// Process names whose OOM kill makes the victim node-critical.
    pub critical_comms: Vec<String>,
    /// Ports the reset counters keep by number besides [`tcp_reset::WELL_KNOWN_PORTS`].
    pub kept_ports: Vec<std::ops::RangeInclusive<u16>>,
    pub stuck_task: stuck_task::Settings,
    /// The in-kernel capture filter of a standalone `kstall trace`; all zero (everything) for the
    /// agent.
    pub capture: CaptureFilter,
}

impl Settings {
    pub const DEFAULT_RING_BUFFER_BYTES: u32 = 1 << 20;
    const MAX_RING_BUFFER_BYTES: u64 = 1 << 30;
    const PAGE_SIZE: u64 = 4096;
    /// `TASK_COMM_LEN - 1`.
    const MAX_COMM_BYTES: usize = 15;

    /// The probes named in `list`, once each, in its order; unknown names and an empty list are
    /// errors.
    pub fn probe_names(list: Vec<String>) -> Result<Vec<String>, String> {
        let valid = || names().collect::<Vec<_>>().join(", ");
        let mut out: Vec<String> = Vec::new();
        for name in list.iter().map(|s| s.trim()).filter(|s| !s.is_empty()) {
            if !names().any(|n| n == name) {
                return Err(format!("unknown probe {name:?} (valid: {})", valid()));
            }
            if !out.iter().any(|n| n == name) {
                out.push(name.to_string());
            }
        }
        if out.is_empty() {
            return Err(format!("no probe named (valid: {})", valid()));
        }
        Ok(out)
    }

    /// A ring buffer size the kernel takes (`text` is how it was given).
    pub fn ring_buffer_bytes(bytes: u64, text: &str) -> Result<u32, String> {
        if bytes < Self::PAGE_SIZE || !bytes.is_power_of_two() || bytes > Self::MAX_RING_BUFFER_BYTES {
            return Err(format!(
                "{text} is not a power of two between 4K and 1G (the kernel requires a power-of-two number of pages)"
            ));
        }
        Ok(bytes as u32)
    }

    /// `--sample-events`: a count, or `all` (every event sent, nothing counted in the kernel).
    pub fn sample_events(text: &str) -> Result<u32, String> {
        match text.trim() {
            "all" => Ok(u32::MAX),
            n => n
                .parse::<u32>()
                .ok()
                .filter(|&n| n < u32::MAX)
                .ok_or_else(|| format!("{text:?} is not a number of events (0 to 4294967294) or \"all\"")),
        }
    }

    /// `--metric-ports`: ports (`8080`) and ranges (`9000-9010`) counted by number.
    pub fn metric_ports(list: Vec<String>) -> Result<Vec<std::ops::RangeInclusive<u16>>, String> {
        let port = |text: &str| {
            text.trim()
                .parse::<u16>()
                .ok()
                .filter(|&p| p > 0)
                .ok_or_else(|| format!("{text:?} is not a port (1-65535)"))
        };
        let mut ranges = Vec::new();
        for item in list.iter().map(|s| s.trim()).filter(|s| !s.is_empty()) {
            let range = match item.split_once('-') {
                Some((low, high)) => port(low)?..=port(high)?,
                None => port(item)?..=port(item)?,
            };
            if range.is_empty() {
                return Err(format!("{item:?} is not a range (the low port first)"));
            }
            ranges.push(range);
        }
        Ok(ranges)
    }

    /// Process names whose OOM kill is node-critical: each must fit the kernel's process name,
    /// or it would never match.
    pub fn critical_comms(list: Vec<String>) -> Result<Vec<String>, String> {
        let comms: Vec<String> =
            list.iter().map(|s| s.trim().to_string()).filter(|s| !s.is_empty()).collect();
        if let Some(long) = comms.iter().find(|c| c.len() > Self::MAX_COMM_BYTES) {
            return Err(format!(
                "{long:?} is longer than the kernel's 15-byte process name and would never match"
            ));
        }
        Ok(comms)
    }
}

/// What decoding a probe's records needs from loading it: enum names read from BTF, the tick
/// rate, the OOM context, and the kernel symbols (kept current by the agent).
#[derive(Clone, Default)]
pub struct Decoding {
    pub tcp_reset: tcp_reset::Names,
    pub clock: hung_task::Clock,
    pub oom: oom::Context,
    pub symbols: std::sync::Arc<Symbols>,
}

/// The loaded kernel side: programs, the event ring buffer and the loss counters.
pub struct Loaded {
    ebpf: Option<Ebpf>,
    /// Attached programs, by name.
    attached: Vec<&'static str>,
    /// The NFS probe's programs attached so far, and whether it waits for a module.
    pub nfs: nfs::Attachment,
    /// tcp-reset runs without original destinations until nf_conntrack (a module) loads.
    pub conntrack_pending: bool,
    pub decoding: Decoding,
    pub events: Option<RingBuf<MapData>>,
    pub lost: Option<PerCpuArray<MapData, u64>>,
    /// The stuck-task sampler, for its sweep loop to take.
    pub sampler: Option<stuck_task::Sampler>,
    /// The kernel's counters, for the pipeline to drain; `None` with `--sample-events all`
    /// (nothing is counted in the kernel then).
    pub counters: Option<counters::Counters>,
}

/// Plans, loads and attaches every enabled probe; the loaded side and each probe's status.
pub fn load(settings: &Settings) -> (Loaded, Vec<ProbeStatus>) {
    raise_memlock_limit();
    let mut statuses: Vec<ProbeStatus> = ALL
        .iter()
        .map(|p| {
            let reason = if settings.enabled.iter().any(|n| n == p.name()) {
                "not loaded"
            } else {
                "disabled by --probes"
            };
            ProbeStatus::down(p.name(), reason)
        })
        .collect();
    let loaded = |statuses| {
        let nothing = Loaded {
            ebpf: None,
            attached: Vec::new(),
            nfs: nfs::Attachment::default(),
            conntrack_pending: false,
            decoding: Decoding::default(),
            events: None,
            lost: None,
            sampler: None,
            counters: None,
        };
        (nothing, statuses)
    };
    let enabled = |name: &str| settings.enabled.iter().any(|n| n == name);
    let mark_enabled_down = |statuses: &mut Vec<ProbeStatus>, reason: &str| {
        for s in statuses.iter_mut().filter(|s| enabled(&s.name)) {
            s.reason = Some(reason.to_string());
        }
    };

    if OBJECT.is_empty() {
        mark_enabled_down(
            &mut statuses,
            "this kstall binary was built with AYA_BUILD_SKIP=1 and carries no eBPF programs",
        );
        return loaded(statuses);
    }
    let vmlinux = match KernelBtf::vmlinux_from_sys_fs() {
        Ok(btf) => btf,
        Err(e) => {
            mark_enabled_down(&mut statuses, &format!("no kernel BTF: {e}"));
            return loaded(statuses);
        }
    };

    let mut decoding = Decoding {
        oom: oom::Context { critical_comms: settings.critical_comms.clone(), ..Default::default() },
        ..Default::default()
    };
    let mut conntrack = tcp_reset::Conntrack::Unavailable;
    let mut plans: Vec<(usize, Plan)> = Vec::new();
    if enabled(tcp_reset::NAME) {
        let idx = index_of(tcp_reset::NAME);
        match tcp_reset::plan(&vmlinux, settings.tcp_reset_hook) {
            Ok((plan, names, ct)) => {
                decoding.tcp_reset = names;
                conntrack = ct;
                plans.push((idx, plan));
            }
            Err(e) => statuses[idx].reason = Some(e),
        }
    }
    if enabled(hung_task::NAME) {
        let idx = index_of(hung_task::NAME);
        match hung_task::plan(&vmlinux) {
            Ok(plan) => plans.push((idx, plan)),
            Err(e) => statuses[idx].reason = Some(e),
        }
    }
    if enabled(oom::NAME) {
        let idx = index_of(oom::NAME);
        match oom::plan(&vmlinux) {
            Ok(plan) => plans.push((idx, plan)),
            Err(e) => statuses[idx].reason = Some(e),
        }
    }
    if enabled(stuck_task::NAME) {
        let idx = index_of(stuck_task::NAME);
        match stuck_task::plan(&vmlinux, &settings.stuck_task) {
            Ok(plan) => plans.push((idx, plan)),
            Err(e) => statuses[idx].reason = Some(e),
        }
    }
    // NFS too when sunrpc is already loaded (an agent restarted on a node with mounts).
    let nfs_resolved = if enabled(nfs::NAME) { nfs::resolve_loaded(&vmlinux) } else { None };
    // Offsets are resolved; the parsed BTF is large, don't hold it through the load.
    drop(vmlinux);
    if plans.is_empty() && !enabled(nfs::NAME) {
        return loaded(statuses);
    }
    let aya_btf = match Btf::from_sys_fs() {
        Ok(btf) => btf,
        Err(e) => {
            mark_enabled_down(&mut statuses, &format!("no kernel BTF: {e}"));
            return loaded(statuses);
        }
    };

    let mut loader = EbpfLoader::new();
    loader.btf(Some(&aya_btf));
    loader.map_max_entries("EVENTS", settings.ring_buffer_bytes);
    let wakeup_bytes = u64::from(settings.ring_buffer_bytes / 4);
    loader.override_global("WAKEUP_BYTES", &wakeup_bytes, true);
    loader.override_global("CAPTURE", &settings.capture, true);
    loader.override_global("SAMPLE_EVENTS", &settings.sample_events, true);
    let kept_ports = tcp_reset::kept_ports(&settings.kept_ports);
    loader.override_global("KEPT_PORTS", &kept_ports, true);
    for (_, plan) in &plans {
        loader.override_global(plan.global, plan.global_value.as_slice(), true);
    }
    let mut ebpf = match loader.load(OBJECT) {
        Ok(ebpf) => ebpf,
        Err(e) => {
            let full = error_chain(&e);
            let reason =
                format!("loading the eBPF object failed: {full}{}", kernel::bpf_permission_hint(&full));
            // NFS too: its programs are in the same object.
            mark_enabled_down(&mut statuses, &reason);
            return loaded(statuses);
        }
    };
    let tick_rate = (enabled(hung_task::NAME) || enabled(nfs::NAME)).then(|| measure_tick_rate(&mut ebpf));
    decoding.clock = hung_task::Clock { hz: tick_rate.clone().and_then(Result::ok) };
    let mut attached: Vec<&'static str> = Vec::new();
    for (idx, plan) in plans {
        let mut notes = plan.notes;
        let mut unavailable = plan.unavailable;
        let mut result =
            attach(&mut ebpf, &plan.programs, &aya_btf).map(|()| (plan.programs, plan.hook.clone()));
        if let (Err(preferred), Some(fallback)) = (&result, plan.fallback) {
            notes.push(format!("preferred hook {} unavailable: {preferred}", plan.hook));
            unavailable.extend(fallback.unavailable);
            result =
                attach(&mut ebpf, &fallback.programs, &aya_btf).map(|()| (fallback.programs, fallback.hook));
        }
        match result {
            Ok((programs, hook)) => {
                tracing::info!(probe = ALL[idx].name(), hook = %hook, "probe attached");
                attached.extend(programs.iter().map(|p| p.program));
                statuses[idx] = ProbeStatus {
                    name: ALL[idx].name().to_string(),
                    up: true,
                    hook: Some(hook),
                    reason: None,
                    notes,
                    unavailable,
                };
            }
            Err(e) => {
                statuses[idx].reason = Some(e);
                statuses[idx].notes = notes;
            }
        }
    }
    let hung = &mut statuses[index_of(hung_task::NAME)];
    if let Some(rate) = &tick_rate
        && hung.up
    {
        match rate {
            Ok(hz) => hung
                .notes
                .push(format!("blocked times: jiffies at {hz} Hz (measured with BPF_PROG_TEST_RUN)")),
            Err(e) => hung
                .unavailable
                .push(Unavailable::new("blocked_secs", format!("the tick rate is unknown: {e}"))),
        }
    }
    let mut nfs_attachment = nfs::Attachment::default();
    if enabled(nfs::NAME) {
        let idx = index_of(nfs::NAME);
        statuses[idx] = match nfs::load_programs(&mut ebpf) {
            Err(e) => ProbeStatus::down(nfs::NAME, e),
            Ok(()) => nfs_resolved
                .and_then(|resolved| nfs::attach_resolved(&mut ebpf, &mut nfs_attachment, resolved))
                .unwrap_or_else(|| {
                    nfs_attachment.pending = true;
                    ProbeStatus::down(nfs::NAME, nfs::WAITING)
                }),
        };
    }
    let mut conntrack_pending = false;
    if statuses[index_of(tcp_reset::NAME)].up {
        match conntrack {
            tcp_reset::Conntrack::Ready(offsets) => {
                if let Err(e) = set_conntrack_offsets(&mut ebpf, offsets) {
                    statuses[index_of(tcp_reset::NAME)].notes.push(format!("original destination: {e}"));
                }
            }
            tcp_reset::Conntrack::WaitingForModule => conntrack_pending = true,
            tcp_reset::Conntrack::Unavailable => {}
        }
    }
    let mut sampler = None;
    let stuck = &mut statuses[index_of(stuck_task::NAME)];
    if stuck.up {
        match stuck_task::Sampler::new(&mut ebpf) {
            Ok(s) => sampler = Some(s),
            Err(e) => {
                unload(&mut ebpf, stuck_task::PROGRAM);
                *stuck = ProbeStatus {
                    notes: std::mem::take(&mut stuck.notes),
                    unavailable: std::mem::take(&mut stuck.unavailable),
                    ..ProbeStatus::down(stuck_task::NAME, e)
                };
            }
        }
    }
    let wanted = counters::Wanted {
        tcp_reset: statuses[index_of(tcp_reset::NAME)].up.then(|| decoding.tcp_reset.clone()),
        oom: statuses[index_of(oom::NAME)].up,
    };
    let counters = if settings.sample_events == u32::MAX {
        None
    } else {
        match counters::Counters::take(&mut ebpf, wanted) {
            Ok(counters) => Some(counters),
            Err(e) => {
                tracing::error!(error = %e, "cannot read the kernel's counters: event metrics stay at 0");
                None
            }
        }
    };
    let events = ebpf.take_map("EVENTS").and_then(|m| RingBuf::try_from(m).ok());
    let lost = ebpf.take_map("LOST").and_then(|m| PerCpuArray::try_from(m).ok());
    let loaded = Loaded {
        ebpf: Some(ebpf),
        attached,
        nfs: nfs_attachment,
        conntrack_pending,
        decoding,
        events,
        lost,
        sampler,
        counters,
    };
    (loaded, statuses)
}

fn index_of(name: &str) -> usize {
    position(name).expect("registered probe")
}

/// Loads and attaches every program of `plan`; on failure unloads the ones already loaded, so a
/// probe is either fully on or fully off.
fn attach(ebpf: &mut Ebpf, programs: &[ProgramSpec], btf: &Btf) -> Result<(), String> {
    for (i, spec) in programs.iter().enumerate() {
        if let Err(e) = attach_one(ebpf, spec, btf) {
            // The failed one too: it may be loaded and only the attach refused.
            for done in &programs[..=i] {
                unload(ebpf, done.program);
            }
            return Err(e);
        }
    }
    Ok(())
}

fn attach_one(ebpf: &mut Ebpf, spec: &ProgramSpec, btf: &Btf) -> Result<(), String> {
    let context = |what: &str, e: &dyn std::error::Error| {
        let full = error_chain(e);
        tracing::debug!(program = spec.program, error = %full, "{what} failed");
        let hint =
            if spec.attach == Attach::FEntry { String::new() } else { kernel::bpf_permission_hint(&full) };
        format!("{} ({}): {what}: {}{hint}", spec.target, spec.program, summarize(&full))
    };
    let program = ebpf
        .program_mut(spec.program)
        .ok_or_else(|| format!("program {} missing from the eBPF object", spec.program))?;
    match spec.attach {
        Attach::FEntry => {
            let program: &mut FEntry = program.try_into().map_err(|e| context("program type", &e))?;
            program.load(spec.target, btf).map_err(|e| context("load", &e))?;
            program.attach().map_err(|e| context("attach", &e))?;
        }
        Attach::TpBtf => {
            let program: &mut BtfTracePoint = program.try_into().map_err(|e| context("program type", &e))?;
            program.load(spec.target, btf).map_err(|e| context("load", &e))?;
            program.attach().map_err(|e| context("attach", &e))?;
        }
        // Linked by its probe once loaded (`stuck_task::Sampler`).
        Attach::TaskIter => {
            let program: &mut Iter = program.try_into().map_err(|e| context("program type", &e))?;
            program.load("task", btf).map_err(|e| context("load", &e))?;
        }
    }
    Ok(())
}

fn set_conntrack_offsets(ebpf: &mut Ebpf, offsets: ConntrackOffsets) -> Result<(), String> {
    let mut map: Array<_, ConntrackOffsets> =
        Array::try_from(ebpf.map_mut("CONNTRACK").ok_or("map CONNTRACK missing from the eBPF object")?)
            .map_err(|e| e.to_string())?;
    map.set(0, offsets, 0).map_err(|e| e.to_string())
}

/// HZ, for the jiffies in hung-task and NFS records; why not (also warned: what is lost) when it
/// cannot be measured.
fn measure_tick_rate(ebpf: &mut Ebpf) -> Result<u64, String> {
    let measured = match ebpf.program_mut("kstall_jiffies") {
        Some(Program::RawTracePoint(program)) => program
            .load()
            .map_err(|e| {
                let full = error_chain(&e);
                format!("loading kstall_jiffies: {}{}", summarize(&full), kernel::bpf_permission_hint(&full))
            })
            .and_then(|()| crate::kernel::tick_rate(program)),
        _ => Err("program kstall_jiffies missing from the eBPF object".into()),
    };
    unload(ebpf, "kstall_jiffies");
    match &measured {
        Ok(hz) => tracing::debug!(hz, "measured the kernel tick rate"),
        Err(e) => {
            tracing::warn!(error = %e, "cannot measure the kernel tick rate: hung-task blocked times and RPC timeouts unknown")
        }
    }
    measured
}

/// Detaches (drops the links) and unloads one program.
fn unload(ebpf: &mut Ebpf, name: &str) {
    let result = match ebpf.program_mut(name) {
        Some(Program::BtfTracePoint(p)) => p.unload(),
        Some(Program::FEntry(p)) => p.unload(),
        Some(Program::RawTracePoint(p)) => p.unload(),
        Some(Program::Iter(p)) => p.unload(),
        _ => Ok(()),
    };
    // A program the kernel refused (fentry where trampolines are off) was never loaded.
    if let Err(e) = result.or_else(|e| if matches!(e, ProgramError::NotLoaded) { Ok(()) } else { Err(e) }) {
        tracing::warn!(program = name, error = %e, "unload failed");
    }
}

impl Loaded {
    /// Detaches and unloads every program (stops intake); maps stay readable for the final drain.
    pub fn detach_all(&mut self) -> usize {
        let Some(ebpf) = self.ebpf.as_mut() else { return 0 };
        let mut programs = std::mem::take(&mut self.attached);
        programs.append(&mut self.nfs.programs);
        for name in &programs {
            unload(ebpf, name);
        }
        programs.len()
    }

    /// Hands tcp-reset the `nf_conn` layout once the nf_conntrack module has loaded; the status
    /// note to show then, or `None` while it has not.
    pub fn conntrack_if_loaded(&mut self) -> Option<String> {
        if !std::path::Path::new("/sys/kernel/btf/nf_conntrack").exists() {
            return None;
        }
        let ebpf = self.ebpf.as_mut()?;
        let vmlinux_result = KernelBtf::vmlinux_from_sys_fs();
        let result = match &vmlinux_result {
            Ok(vmlinux) => tcp_reset::conntrack_from_module(vmlinux)?,
            Err(e) => Err(e.to_string()),
        };
        self.conntrack_pending = false;
        Some(match result.and_then(|offsets| set_conntrack_offsets(ebpf, offsets)) {
            Ok(()) => format!("{} (nf_conntrack module BTF, loaded after start)", tcp_reset::CONNTRACK_NOTE),
            Err(e) => format!("original destination: unavailable ({e}); original_port stays empty"),
        })
    }

    /// Attaches the NFS programs whose modules have appeared since; the probe's new status, or
    /// `None` when no module came.
    pub fn attach_nfs_if_loaded(&mut self) -> Option<ProbeStatus> {
        let ebpf = self.ebpf.as_mut()?;
        nfs::attach_available(ebpf, &mut self.nfs)
    }
}

/// How often to look for the kernel modules probes wait for (sunrpc, nfsv4, nf_conntrack).
const MODULE_WATCH_INTERVAL: std::time::Duration = std::time::Duration::from_secs(5);

/// Completes what waits for a kernel module: the NFS probe attaches when sunrpc appears (the
/// first NFS mount loads it) and its nfsv4 hook when nfsv4 does; tcp-reset gets original
/// destinations when nf_conntrack loads (the first NAT rule). No restart needed. Each change is
/// written to `statuses` and passed to `changed`.
pub async fn watch_modules(
    loaded: Arc<Mutex<Loaded>>,
    statuses: Arc<Mutex<Vec<ProbeStatus>>>,
    changed: impl Fn(&[ProbeStatus]) + Send,
    stop: tokio_util::sync::CancellationToken,
) {
    let mut tick = tokio::time::interval(MODULE_WATCH_INTERVAL);
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tick.tick() => {}
        }
        // BTF parsing and attaching take a moment; nothing on the event path waits on this lock.
        let mut probes = loaded.lock().unwrap_or_else(PoisonError::into_inner);
        if !probes.nfs.pending && !probes.conntrack_pending {
            return;
        }
        let nfs = if probes.nfs.pending { probes.attach_nfs_if_loaded() } else { None };
        let conntrack = if probes.conntrack_pending { probes.conntrack_if_loaded() } else { None };
        drop(probes);
        let mut all = statuses.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(status) = nfs {
            match &status.reason {
                None => tracing::info!(hook = status.hook.as_deref().unwrap_or(""), "nfs probe attached"),
                Some(reason) => tracing::warn!(reason, "sunrpc appeared but the nfs probe cannot attach"),
            }
            if let Some(slot) = all.iter_mut().find(|s| s.name == status.name) {
                *slot = status;
            }
        }
        if let Some(note) = conntrack {
            tracing::info!(note, "nf_conntrack appeared");
            if let Some(tcp) = all.iter_mut().find(|s| s.name == tcp_reset::NAME) {
                tcp.notes.retain(|n| !n.starts_with("original destination"));
                tcp.notes.push(note);
            }
        }
        changed(&all);
    }
}

/// Below 5.11 BPF memory is charged to RLIMIT_MEMLOCK; on newer kernels (memcg accounting) a
/// failure here is harmless, and where CAP_SYS_RESOURCE is dropped it always fails.
fn raise_memlock_limit() {
    let rlim = libc::rlimit { rlim_cur: libc::RLIM_INFINITY, rlim_max: libc::RLIM_INFINITY };
    if unsafe { libc::setrlimit(libc::RLIMIT_MEMLOCK, &rlim) } != 0 {
        tracing::debug!(error = %std::io::Error::last_os_error(), "cannot raise RLIMIT_MEMLOCK; fine on kernels >= 5.11");
    }
}
