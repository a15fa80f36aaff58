//! The probe registry: each probe plans its programs from the running kernel's BTF, then loads and
//! attaches independently. A probe that cannot run here (missing tracepoint or BTF type, verifier
//! rejection) is reported down with its reason and the others run on.

pub mod cleared;
pub mod counters;
pub mod cpu_lockup;
pub mod error;
pub mod flags;
pub mod hung_task;
pub mod kind;
mod map_batch;
pub mod nfs;
pub mod oom;
pub mod packet_drop;
pub mod payload;
pub mod plan;
pub mod ports;
pub mod probe;
pub mod runs;
pub mod settings;
pub mod stuck_task;
mod task;
pub mod tcp_reset;
pub mod wait;

use aya::{
    Btf, Ebpf, EbpfLoader,
    maps::{Array, MapData, PerCpuArray, RingBuf},
    programs::{BtfTracePoint, FEntry, Iter, Program, ProgramError},
};

use std::sync::{Arc, Mutex, PoisonError};

use self::{
    error::ProbeError,
    plan::{Attach, Plan, ProbeStatus, ProgramSpec, Unavailable},
};
pub use self::{
    kind::{EventData, EventKind, FilterFields, Subject},
    payload::Payload,
    probe::{Clock, Completion, Decoding, Probe},
    settings::Settings,
};
use crate::kernel_btf::KernelBtf;

/// The kernel programs, built by build.rs (empty when built with `AYA_BUILD_SKIP=1`).
static OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/kstall"));

/// Every probe kstall has, in the order `kstall status` lists them.
pub const ALL: &[&dyn Probe] = &[
    &tcp_reset::TcpResetProbe,
    &hung_task::HungTaskProbe,
    &oom::OomProbe,
    &nfs::NfsProbe,
    &stuck_task::StuckTaskProbe,
    &cpu_lockup::CpuLockupProbe,
    &packet_drop::PacketDropProbe,
];

pub fn names() -> impl Iterator<Item = &'static str> {
    ALL.iter().map(|p| p.name())
}

/// Probe `name` of [`ALL`].
pub fn by_name(name: &str) -> Option<&'static dyn Probe> {
    ALL.iter().copied().find(|p| p.name() == name)
}

/// Where probe `name` is in [`ALL`].
pub fn position(name: &str) -> Option<usize> {
    ALL.iter().position(|p| p.name() == name)
}

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

/// Every event kind's description, by its JSON `kind` (a kind two probes emit is listed once).
pub fn event_kind(name: &str) -> Option<&'static EventKind> {
    ALL.iter().flat_map(|p| p.events()).find(|k| k.name == name)
}

/// The loaded kernel side: programs, the event ring buffer and the loss counters.
pub struct Loaded {
    ebpf: Option<Ebpf>,
    /// Attached programs, by name.
    attached: Vec<&'static str>,
    /// What probes do after loading, by their place in [`ALL`].
    completions: Vec<(usize, Box<dyn Completion>)>,
    pub decoding: Decoding,
    pub events: Option<RingBuf<MapData>>,
    /// The queued bytes at which the kernel wakes the ring's reader (`ebpf/src/maps.rs`), 0 (every
    /// event) until the pipeline sets it.
    pub wakeup: Option<Array<MapData, u64>>,
    pub lost: Option<PerCpuArray<MapData, u64>>,
    /// What the kernel says of the programs' runs.
    pub programs: Option<runs::Programs>,
    /// How full the event ring buffer is.
    pub ring_fill: Option<runs::RingFill>,
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
    let mut decoding =
        Decoding { critical_comms: settings.critical_comms.clone().into(), ..Default::default() };
    let nothing = |decoding: Decoding, statuses| {
        let loaded = Loaded {
            ebpf: None,
            attached: Vec::new(),
            completions: Vec::new(),
            decoding,
            events: None,
            wakeup: None,
            lost: None,
            programs: None,
            ring_fill: None,
            counters: None,
        };
        (loaded, statuses)
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
        return nothing(decoding, statuses);
    }
    let vmlinux = match KernelBtf::vmlinux_from_sys_fs() {
        Ok(btf) => btf,
        Err(e) => {
            mark_enabled_down(&mut statuses, &format!("no kernel BTF: {e}"));
            return nothing(decoding, statuses);
        }
    };
    let mut plans: Vec<(usize, Plan)> = Vec::new();
    let mut completions: Vec<(usize, Box<dyn Completion>)> = Vec::new();
    for (idx, probe) in ALL.iter().enumerate().filter(|(_, p)| enabled(p.name())) {
        match probe.plan(&vmlinux, settings, &mut decoding) {
            Ok(planned) => {
                plans.extend(planned.programs.map(|plan| (idx, plan)));
                completions.extend(planned.completion.map(|c| (idx, c)));
            }
            Err(e) => statuses[idx].reason = Some(e.to_string()),
        }
    }
    let run_offsets = runs::Offsets::of(&vmlinux);
    // Offsets are resolved; the parsed BTF is large, don't hold it through the load.
    drop(vmlinux);
    if plans.is_empty() && completions.is_empty() {
        return nothing(decoding, statuses);
    }
    let aya_btf = match Btf::from_sys_fs() {
        Ok(btf) => btf,
        Err(e) => {
            mark_enabled_down(&mut statuses, &format!("no kernel BTF: {e}"));
            return nothing(decoding, statuses);
        }
    };

    let mut loader = EbpfLoader::new();
    loader.btf(Some(&aya_btf));
    loader.map_max_entries("EVENTS", settings.ring_buffer_bytes);
    loader.override_global("CAPTURE", &settings.capture, true);
    loader.override_global("SAMPLE_EVENTS", &settings.sample_events, true);
    let kept_ports = ports::kept_ports(&settings.kept_ports);
    loader.override_global("KEPT_PORTS", &kept_ports, true);
    for (name, value) in plans.iter().filter_map(|(_, plan)| plan.config.as_ref()) {
        loader.override_global(name, value.as_slice(), true);
    }
    let mut ebpf = match loader.load(OBJECT) {
        Ok(ebpf) => ebpf,
        Err(e) => {
            let reason = ProbeError::bpf("loading the eBPF object failed", &e, true).to_string();
            // Those attaching their own too: their programs are in the same object.
            mark_enabled_down(&mut statuses, &reason);
            return nothing(decoding, statuses);
        }
    };
    let clocked = ALL.iter().any(|p| enabled(p.name()) && p.jiffies_field().is_some());
    let tick_rate = clocked.then(|| measure_tick_rate(&mut ebpf));
    decoding.clock = Clock { hz: tick_rate.clone().and_then(Result::ok) };
    // Each attached program, by the probe's place in ALL.
    let mut attached: Vec<(usize, &'static str)> = Vec::new();
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
                attached.extend(programs.iter().map(|p| (idx, p.program)));
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
                statuses[idx].reason = Some(e.to_string());
                statuses[idx].notes = notes;
            }
        }
    }
    for (idx, completion) in &mut completions {
        let was_up = statuses[*idx].up;
        completion.on_load(&mut ebpf, &mut statuses[*idx]);
        if was_up && !statuses[*idx].up {
            // Its completion found it cannot run: fully off, as a probe that failed to attach.
            for (_, program) in attached.iter().filter(|(of, _)| of == idx) {
                unload(&mut ebpf, program);
            }
            attached.retain(|(of, _)| of != idx);
        }
    }
    let attached = attached.into_iter().map(|(_, program)| program).collect();
    if let Some(rate) = &tick_rate {
        for (probe, status) in ALL.iter().zip(statuses.iter_mut()).filter(|(_, s)| s.up) {
            let Some(field) = probe.jiffies_field() else { continue };
            match rate {
                Ok(hz) => status
                    .notes
                    .push(format!("{field}: jiffies at {hz} Hz (measured with BPF_PROG_TEST_RUN)")),
                Err(e) => {
                    status.unavailable.push(Unavailable::new(field, format!("the tick rate is unknown: {e}")))
                }
            }
        }
    }
    let counters = if settings.sample_events == u32::MAX {
        None
    } else {
        let counting: Result<Vec<_>, String> = ALL
            .iter()
            .filter(|p| enabled(p.name()))
            .filter_map(|p| p.counting(&mut ebpf).transpose())
            .collect();
        match counting.and_then(|counting| counters::Counters::take(&mut ebpf, counting)) {
            Ok(counters) => Some(counters),
            Err(e) => {
                tracing::error!(error = %e, "cannot read the kernel's counters: event metrics stay at 0");
                None
            }
        }
    };
    let events = ebpf.take_map("EVENTS").and_then(|m| RingBuf::try_from(m).ok());
    let wakeup = ebpf.take_map("WAKEUP").and_then(|m| Array::try_from(m).ok());
    let lost = ebpf.take_map("LOST").and_then(|m| PerCpuArray::try_from(m).ok());
    let programs = runs::Programs::of(&ebpf, run_offsets);
    let ring_fill = events.as_ref().and_then(|ring| {
        runs::RingFill::of(std::os::fd::AsFd::as_fd(ring), u64::from(settings.ring_buffer_bytes))
            .inspect_err(|e| tracing::warn!(error = %e, "cannot map the ring buffer's positions; its fill is not shown"))
            .ok()
    });
    let loaded = Loaded {
        ebpf: Some(ebpf),
        attached,
        completions,
        decoding,
        events,
        wakeup,
        lost,
        programs,
        ring_fill,
        counters,
    };
    (loaded, statuses)
}

/// Loads and attaches every program of `plan`; on failure unloads the ones already loaded, so a
/// probe is either fully on or fully off.
fn attach(ebpf: &mut Ebpf, programs: &[ProgramSpec], btf: &Btf) -> Result<(), ProbeError> {
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

fn attach_one(ebpf: &mut Ebpf, spec: &ProgramSpec, btf: &Btf) -> Result<(), ProbeError> {
    let refused = |what: &str, e: &(dyn std::error::Error + 'static)| {
        tracing::debug!(program = spec.program, error = %error::error_chain(e), "{what} failed");
        // An fentry's EPERM is the kernel refusing the trampoline, not a privilege missing.
        let what = format!("{} ({}): {what}", spec.target, spec.program);
        ProbeError::bpf(what, e, spec.attach != Attach::FEntry)
    };
    let program = ebpf.program_mut(spec.program).ok_or_else(|| {
        ProbeError::Missing(format!("program {} missing from the eBPF object", spec.program))
    })?;
    match spec.attach {
        Attach::FEntry => {
            let program: &mut FEntry = program.try_into().map_err(|e| refused("program type", &e))?;
            program.load(spec.target, btf).map_err(|e| refused("load", &e))?;
            program.attach().map_err(|e| refused("attach", &e))?;
        }
        Attach::TpBtf => {
            let program: &mut BtfTracePoint = program.try_into().map_err(|e| refused("program type", &e))?;
            program.load(spec.target, btf).map_err(|e| refused("load", &e))?;
            program.attach().map_err(|e| refused("attach", &e))?;
        }
        // Linked by its probe once loaded (its completion).
        Attach::TaskIter => {
            let program: &mut Iter = program.try_into().map_err(|e| refused("program type", &e))?;
            program.load("task", btf).map_err(|e| refused("load", &e))?;
        }
    }
    Ok(())
}

/// HZ, for the jiffies in hung-task and NFS records; why not (also warned: what is lost) when it
/// cannot be measured.
fn measure_tick_rate(ebpf: &mut Ebpf) -> Result<u64, String> {
    let measured = match ebpf.program_mut("kstall_jiffies") {
        Some(Program::RawTracePoint(program)) => program
            .load()
            .map_err(|e| ProbeError::bpf("loading kstall_jiffies", &e, true).to_string())
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
        programs.extend(self.completions.iter().flat_map(|(_, c)| c.attached()));
        for name in &programs {
            unload(ebpf, name);
        }
        programs.len()
    }

    /// Whether probe `name` waits for a kernel module (how a node without NFS mounts looks).
    /// The walks of every task of the probe that makes them, if it is up (taken once).
    pub fn take_task_sweeps(&mut self) -> Option<Box<dyn probe::TaskSweeps>> {
        self.completions.iter_mut().find_map(|(_, completion)| completion.take_task_sweeps())
    }

    pub fn waiting(&self, name: &str) -> bool {
        self.completions.iter().any(|(idx, c)| ALL[*idx].name() == name && c.waiting())
    }
}

/// How often to look for the kernel modules probes wait for (sunrpc, nfsv4, nf_conntrack).
const MODULE_WATCH_INTERVAL: std::time::Duration = std::time::Duration::from_secs(5);

/// Completes what waits for a kernel module (each probe's [`Completion`]): the NFS probe attaches
/// when sunrpc appears (the first NFS mount loads it), tcp-reset gets original destinations when
/// nf_conntrack loads (the first NAT rule). No restart needed. Each change is written to
/// `statuses` and passed to `changed`; the watch ends when nothing waits.
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
        let Loaded { ebpf, completions, .. } = &mut *probes;
        let Some(ebpf) = ebpf.as_mut() else { return };
        if !completions.iter().any(|(_, c)| c.waiting()) {
            return;
        }
        let mut all = statuses.lock().unwrap_or_else(PoisonError::into_inner);
        let mut any = false;
        for (idx, completion) in completions.iter_mut().filter(|(_, c)| c.waiting()) {
            any |= completion.on_modules(ebpf, &mut all[*idx]);
        }
        drop(probes);
        if any {
            changed(&all);
        }
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
