//! NFS / SUNRPC client. Kernel half: `ebpf/src/probes/nfs.rs`; event: `common/src/nfs.rs`.
//!
//! sunrpc is a module loaded by the first NFS mount, possibly long after the agent started: the
//! programs are loaded with the agent and attached by [`attach_available`] once `/sys/module/sunrpc`
//! appears, with offsets read then from that module's BTF — or, before 5.11 (no module BTF), from
//! vmlinux's, which carries the sunrpc and NFS client structs too (vmlinux code uses them; same
//! headers and build, so the same layout). While the links exist the module cannot be unloaded
//! (the kernel holds a reference for them).

pub mod event;
mod latency;

pub use event::*;

use aya::{Ebpf, maps::Array, programs::RawTracePoint};
use kstall_common::{
    EventHeader,
    counter::Counter,
    kind,
    nfs::{
        NAME_LEN, NfsConfig, NfsCountKey, NfsEvent, NfsLatencyKey, WHAT_RETRANSMIT, WHAT_SERVER_RESPONDING,
        WHAT_SOCKET_CONNECT, WHAT_SOCKET_ERROR, WHAT_SOCKET_RESET, WHAT_STATE_MGR_FAILED, WHAT_TIMEOUT,
    },
    span::{NO_SPAN, SPAN_LEN},
};

use latency::{LatencyNames, decode_latency};

use super::{
    counters::CounterMap,
    error::ProbeError,
    kind::EventKind,
    payload::Payload,
    plan::{ProbeStatus, Unavailable},
    probe::{Clock, Completion, Counted, Counting, Decoding, Drained, Planned, Probe, Turn},
    settings::Settings,
};
use crate::{
    decode::{DecodeError, read_versioned},
    kernel_btf::{BtfError, KernelBtf},
};

pub const NAME: &str = "nfs";
pub const WAITING: &str =
    "unavailable: sunrpc not loaded (attaches by itself when the first NFS mount loads it)";

/// (program, raw tracepoint, module that defines it).
pub const PROGRAMS: &[(&str, &str, &str)] = &[
    ("nfs_xprt_retransmit", "xprt_retransmit", "sunrpc"),
    ("nfs_rpc_timeout_status", "rpc_timeout_status", "sunrpc"),
    ("nfs_rpc_socket_connect", "rpc_socket_connect", "sunrpc"),
    ("nfs_rpc_socket_error", "rpc_socket_error", "sunrpc"),
    ("nfs_rpc_socket_reset", "rpc_socket_reset_connection", "sunrpc"),
    ("nfs_xprt_lookup_rqst", "xprt_lookup_rqst", "sunrpc"),
    ("nfs_rpc_task_begin", "rpc_task_begin", "sunrpc"),
    ("nfs_rpc_stats_latency", "rpc_stats_latency", "sunrpc"),
    ("nfs_readpage_done", "nfs_readpage_done", "nfs"),
    ("nfs_writeback_done", "nfs_writeback_done", "nfs"),
    ("nfs_commit_done", "nfs_commit_done", "nfs"),
    ("nfs4_state_mgr_failed", "nfs4_state_mgr_failed", "nfsv4"),
];

/// Retransmits where the kernel has no `xprt_retransmit` (5.10): its second transmissions.
const RETRANSMIT_FALLBACK: (&str, &str, &str) = ("nfs_xprt_transmit", "xprt_transmit", "sunrpc");
const RETRANSMIT_FALLBACK_NOTE: &str =
    "retransmits: repeated sends that went out, seen by xprt_transmit (the kernel has no xprt_retransmit)";

/// Loads (not attaches) the programs: a verifier rejection shows now, not at the first mount.
pub fn load_programs(ebpf: &mut Ebpf) -> Result<(), String> {
    for (program, _, _) in PROGRAMS.iter().chain([&RETRANSMIT_FALLBACK]) {
        let p: &mut RawTracePoint = ebpf
            .program_mut(program)
            .ok_or_else(|| format!("program {program} missing from the eBPF object"))?
            .try_into()
            .map_err(|e| format!("{program}: {e}"))?;
        p.load().map_err(|e| ProbeError::bpf(format!("{program}: load"), &e, true).to_string())?;
    }
    Ok(())
}

/// Offsets in sunrpc's structs (and the nfs module's when `nfs` is given, nfsv4's `nfs_client`
/// when `nfsv4` is).
pub fn resolve(
    sunrpc: &KernelBtf,
    nfs: Option<&KernelBtf>,
    nfsv4: Option<&KernelBtf>,
) -> Result<NfsConfig, BtfError> {
    let mut cfg = NfsConfig {
        rqst_task: sunrpc.offset_of("rpc_rqst", "rq_task")?,
        rqst_xid: sunrpc.offset_of("rpc_rqst", "rq_xid")?,
        rqst_ntrans: sunrpc.offset_of("rpc_rqst", "rq_ntrans")?,
        rqst_timeout: sunrpc.offset_of("rpc_rqst", "rq_timeout")?,
        task_client: sunrpc.offset_of("rpc_task", "tk_client")?,
        task_xprt: sunrpc.offset_of("rpc_task", "tk_xprt")?,
        task_owner: sunrpc.offset_of("rpc_task", "tk_owner")?,
        task_status: sunrpc.offset_of("rpc_task", "tk_status")?,
        task_rqstp: sunrpc.offset_of("rpc_task", "tk_rqstp")?,
        task_proc: sunrpc.offset_of("rpc_task", "tk_msg.rpc_proc")?,
        clnt_clid: sunrpc.offset_of("rpc_clnt", "cl_clid")?,
        clnt_program: sunrpc.offset_of("rpc_clnt", "cl_program")?,
        clnt_prog: sunrpc.offset_of("rpc_clnt", "cl_prog")?,
        task_flags: sunrpc.offset_of("rpc_task", "tk_flags")?,
        program_name: sunrpc.offset_of("rpc_program", "name")?,
        procinfo_name: sunrpc.offset_of("rpc_procinfo", "p_name")?,
        xprt_addr: sunrpc.offset_of("rpc_xprt", "addr")?,
        xprt_net: sunrpc.offset_of("rpc_xprt", "xprt_net")?,
        net_ns_inum: sunrpc.offset_of("net", "ns.inum")?,
        ..NfsConfig::default()
    };
    cfg.task_span = span(
        sunrpc,
        "rpc_task",
        &[(cfg.task_proc, 8), (cfg.task_client, 8), (cfg.task_xprt, 8), (cfg.task_flags, 2)],
    )?;
    if let Some(nfs) = nfs {
        cfg.pgio_inode = nfs.offset_of("nfs_pgio_header", "inode")?;
        cfg.commit_inode = nfs.offset_of("nfs_commit_data", "inode")?;
        cfg.inode_sb = nfs.offset_of("inode", "i_sb")?;
        cfg.sb_dev = nfs.offset_of("super_block", "s_dev")?;
        cfg.nfs_module = 1;
    }
    if let Some(nfsv4) = nfsv4 {
        cfg.nfs_client_addr = nfsv4.offset_of("nfs_client", "cl_addr")?;
        cfg.nfs_client = 1;
    }
    cfg.valid = 1;
    Ok(cfg)
}

/// Where one read of `SPAN_LEN` bytes of `struct_name` covers `fields` (offset, size) without
/// passing the struct's end (a KFENCE object ends at a guard page), 8-aligned so that each field
/// loads aligned from the copy; `NO_SPAN` where none does.
fn span(btf: &KernelBtf, struct_name: &str, fields: &[(u32, u32)]) -> Result<u32, BtfError> {
    let size = btf.struct_size(struct_name)?;
    let first = fields.iter().map(|(offset, _)| *offset).min().unwrap_or(0);
    let end = fields.iter().map(|(offset, size)| offset + size).max().unwrap_or(0);
    let start = end.saturating_sub(SPAN_LEN).next_multiple_of(8);
    Ok(if start <= first && start + SPAN_LEN <= size { start } else { NO_SPAN })
}

/// What the NFS probe has attached so far; sunrpc and nfsv4 load one after the other, so a
/// first look may see only part of it.
#[derive(Debug, Default)]
pub struct Attachment {
    /// Programs attached (by name).
    pub programs: Vec<&'static str>,
    /// A module the probe still needs may yet load: keep looking.
    pub pending: bool,
    /// The modules loaded at the last look: BTF is only parsed again when this changes.
    modules_seen: Vec<&'static str>,
}

/// The modules the probe hooks, in load order.
const MODULES: [&str; 3] = ["sunrpc", "nfs", "nfsv4"];

/// What the loaded modules' BTF gives, resolved while a parsed vmlinux is at hand (at start, the
/// one the other probes were planned with: a parse costs seconds on a small node).
pub struct Resolved {
    modules: Vec<&'static str>,
    /// Whether sunrpc has BTF of its own (5.11+), else the offsets came from vmlinux's.
    module_btf: bool,
    cfg: Result<NfsConfig, String>,
    /// Per loaded module, the tracepoints its BTF defines; `None` without module BTF (then a
    /// missing tracepoint shows as the attach's ENOENT).
    tracepoints: Vec<(&'static str, Option<Vec<&'static str>>)>,
}

/// The modules of [`MODULES`] loaded now.
fn loaded_modules() -> Vec<&'static str> {
    MODULES.into_iter().filter(|m| std::path::Path::new("/sys/module").join(m).exists()).collect()
}

/// A loaded module's own BTF, or vmlinux's where it has none (before 5.11).
fn or_vmlinux<'a>(module: &'a Option<Option<KernelBtf>>, vmlinux: &'a KernelBtf) -> Option<&'a KernelBtf> {
    module.as_ref().map(|btf| btf.as_ref().unwrap_or(vmlinux))
}

/// Resolves what the probe needs from the modules loaded now; `None` while sunrpc is not.
pub fn resolve_loaded(vmlinux: &KernelBtf) -> Option<Resolved> {
    let modules = loaded_modules();
    if !modules.contains(&"sunrpc") {
        return None;
    }
    let own_btf = |module: &str| modules.contains(&module).then(|| vmlinux.module_from_sys_fs(module).ok());
    let sunrpc = own_btf("sunrpc").flatten();
    let nfs = own_btf("nfs");
    let nfsv4 = own_btf("nfsv4");
    let module_btf = sunrpc.is_some();
    let cfg =
        resolve(sunrpc.as_ref().unwrap_or(vmlinux), or_vmlinux(&nfs, vmlinux), or_vmlinux(&nfsv4, vmlinux))
            .map_err(|e| {
                if module_btf {
                    e.to_string()
                } else {
                    format!("sunrpc has no BTF of its own and vmlinux's lacks its structs: {e}")
                }
            });
    let defined = |module: &str, btf: &Option<KernelBtf>| {
        btf.as_ref().map(|btf| {
            PROGRAMS
                .iter()
                .chain([&RETRANSMIT_FALLBACK])
                .filter(|(_, tp, m)| *m == module && btf.tracepoint_arg_count(tp).is_ok())
                .map(|(_, tp, _)| *tp)
                .collect()
        })
    };
    let mut tracepoints = vec![("sunrpc", defined("sunrpc", &sunrpc))];
    if let Some(nfs) = &nfs {
        tracepoints.push(("nfs", defined("nfs", nfs)));
    }
    if let Some(nfsv4) = &nfsv4 {
        tracepoints.push(("nfsv4", defined("nfsv4", nfsv4)));
    }
    Some(Resolved { modules, module_btf, cfg, tracepoints })
}

/// Attaches what has become attachable since `att`: resolves offsets from the modules loaded now
/// and attaches as [`attach_resolved`]. `None` while sunrpc is not loaded or nothing changed.
pub fn attach_available(ebpf: &mut Ebpf, att: &mut Attachment) -> Option<ProbeStatus> {
    let modules = loaded_modules();
    if !modules.contains(&"sunrpc") || modules == att.modules_seen {
        return None;
    }
    match KernelBtf::vmlinux_from_sys_fs() {
        Ok(vmlinux) => attach_resolved(ebpf, att, resolve_loaded(&vmlinux)?),
        Err(e) => {
            att.modules_seen = modules;
            att.pending = false;
            Some(ProbeStatus::down(NAME, e.to_string()))
        }
    }
}

/// Hands the offsets to the programs and attaches each program whose tracepoint exists (and has
/// not been attached yet). `None` when the modules are those of the last look.
pub fn attach_resolved(ebpf: &mut Ebpf, att: &mut Attachment, resolved: Resolved) -> Option<ProbeStatus> {
    if resolved.modules == att.modules_seen {
        return None;
    }
    att.modules_seen = resolved.modules.clone();
    let result = (|| -> Result<ProbeStatus, String> {
        let cfg = resolved.cfg?;
        let mut notes = Vec::new();
        let mut unavailable = Vec::new();
        if !resolved.module_btf {
            notes.push(VMLINUX_LAYOUTS.to_string());
        }
        let mut map: Array<_, NfsConfig> =
            Array::try_from(ebpf.map_mut("NFS_CONFIG").ok_or("map NFS_CONFIG missing from the eBPF object")?)
                .map_err(|e| e.to_string())?;
        map.set(0, cfg, 0).map_err(|e| e.to_string())?;
        att.pending = false;
        let (fallback, fallback_tracepoint, _) = RETRANSMIT_FALLBACK;
        for &(program, tracepoint, module) in PROGRAMS {
            if att.programs.contains(&program) {
                continue;
            }
            if tracepoint == "xprt_retransmit" && att.programs.contains(&fallback) {
                notes.push(RETRANSMIT_FALLBACK_NOTE.into());
                continue;
            }
            let Some((_, defined)) = resolved.tracepoints.iter().find(|(m, _)| *m == module) else {
                att.pending = true;
                notes.push(format!("{tracepoint}: waiting for the {module} module (attaches when it loads)"));
                continue;
            };
            let defined = defined.as_deref();
            if attach_if_present(ebpf, defined, program, tracepoint)? {
                att.programs.push(program);
                continue;
            }
            if tracepoint == "xprt_retransmit"
                && attach_if_present(ebpf, defined, fallback, fallback_tracepoint)?
            {
                att.programs.push(fallback);
                notes.push(RETRANSMIT_FALLBACK_NOTE.into());
                continue;
            }
            unavailable.push(missing_tracepoint(tracepoint));
        }
        let hooks: Vec<&str> = PROGRAMS
            .iter()
            .chain([&RETRANSMIT_FALLBACK])
            .filter(|(p, _, _)| att.programs.contains(p))
            .map(|(_, tp, _)| *tp)
            .collect();
        Ok(ProbeStatus {
            name: NAME.into(),
            up: true,
            hook: Some(format!("raw_tracepoint/{{{}}}", hooks.join(","))),
            reason: None,
            notes,
            unavailable,
        })
    })();
    Some(result.unwrap_or_else(|reason| {
        att.pending = false;
        ProbeStatus::down(NAME, reason)
    }))
}

/// The events a tracepoint this kernel lacks would have given.
fn missing_tracepoint(tracepoint: &str) -> Unavailable {
    let events = match tracepoint {
        "xprt_retransmit" => "retransmit events",
        "nfs4_state_mgr_failed" => "state-manager failure events",
        "rpc_stats_latency" => "RPC latency (kstall_nfs_rpc_duration_seconds)",
        "rpc_task_begin" => "the caller of an RPC that rpciod runs (its latency goes to the kworker)",
        "nfs_readpage_done" | "nfs_writeback_done" | "nfs_commit_done" => {
            "the mount of an RPC a kernel thread started (writeback is not the volume's pod's)"
        }
        other => other,
    };
    Unavailable::new(events, format!("the kernel has no {tracepoint} tracepoint"))
}

/// Attaches `program` to the module's `tracepoint`; `false` when the kernel has no such tracepoint
/// (known from the module's BTF, `defined`, or without one from the attach's ENOENT).
fn attach_if_present(
    ebpf: &mut Ebpf,
    defined: Option<&[&str]>,
    program: &str,
    tracepoint: &str,
) -> Result<bool, String> {
    if defined.is_some_and(|d| !d.contains(&tracepoint)) {
        return Ok(false);
    }
    let p: &mut RawTracePoint =
        ebpf.program_mut(program).and_then(|p| p.try_into().ok()).ok_or(format!("{program} missing"))?;
    match p.attach(tracepoint) {
        Ok(_) => Ok(true),
        Err(e) if is_not_found(&e) => Ok(false),
        Err(e) => Err(format!("{tracepoint}: attach: {}", super::error::error_chain(&e))),
    }
}

/// The status note of a kernel without module BTF.
pub const VMLINUX_LAYOUTS: &str =
    "offsets: from vmlinux BTF (no module BTF before 5.11; sunrpc's structs are in vmlinux's)";

fn is_not_found(e: &aya::programs::ProgramError) -> bool {
    let mut source: Option<&dyn std::error::Error> = Some(e);
    while let Some(err) = source {
        if let Some(io) = err.downcast_ref::<std::io::Error>() {
            return io.raw_os_error() == Some(libc::ENOENT);
        }
        source = err.source();
    }
    false
}

pub fn decode_count(key: &NfsCountKey, counter: &Counter) -> Result<NfsCount, DecodeError> {
    let server_addr = server_addr(key.server_family, &key.server_addr);
    let section = name(&key.section);
    Ok(NfsCount {
        series: Nfs {
            what: what(key.what)?,
            server_addr,
            server_port: None,
            xid: None,
            ntrans: None,
            client_id: None,
            owner_pid: None,
            timeout_ms: None,
            program: None,
            procedure: section,
            error: (key.error != 0).then_some(key.error),
            error_name: errno_name(key.error),
        },
        events: counter.events,
        suppressed: counter.suppressed(),
    })
}

fn what(raw: u32) -> Result<What, DecodeError> {
    Ok(match raw {
        WHAT_RETRANSMIT => What::Retransmit,
        WHAT_TIMEOUT => What::Timeout,
        WHAT_SOCKET_CONNECT => What::SocketConnect,
        WHAT_SOCKET_ERROR => What::SocketError,
        WHAT_SOCKET_RESET => What::SocketReset,
        WHAT_SERVER_RESPONDING => What::ServerResponding,
        WHAT_STATE_MGR_FAILED => What::StateManagerFailed,
        other => return Err(DecodeError::BadField { field: "nfs.what", value: other.into() }),
    })
}

pub fn decode(ev: &NfsEvent, clock: Clock) -> Result<Nfs, DecodeError> {
    let what = what(ev.what)?;
    let server_addr = server_addr(ev.server_family, &ev.server_addr);
    let nonzero = |v: u32| (v != 0).then_some(v);
    Ok(Nfs {
        what,
        server_port: server_addr.map(|_| ev.server_port),
        server_addr,
        xid: nonzero(ev.xid),
        ntrans: nonzero(ev.ntrans),
        client_id: nonzero(ev.client_id),
        owner_pid: nonzero(ev.owner_pid),
        timeout_ms: clock.hz.filter(|&hz| hz > 0 && ev.timeout_jiffies > 0).map(|hz| {
            // In u128: a corrupt record's jiffies times 1000 overflows u64.
            u64::try_from(u128::from(ev.timeout_jiffies) * 1000 / u128::from(hz)).unwrap_or(u64::MAX)
        }),
        program: name(&ev.program),
        procedure: name(&ev.procedure),
        error: (ev.error != 0).then_some(ev.error),
        error_name: errno_name(ev.error),
    })
}

fn name(bytes: &[u8; NAME_LEN]) -> Option<String> {
    let text = crate::decode::comm_string(bytes);
    (!text.is_empty()).then_some(text)
}

/// The errnos the RPC client reports (negative), by name.
pub fn errno_name(error: i32) -> Option<&'static str> {
    // `checked_neg`: a corrupt record's i32::MIN has no negation (and is no errno).
    Some(match error.checked_neg()? {
        libc::ECONNREFUSED => "ECONNREFUSED",
        libc::ECONNRESET => "ECONNRESET",
        libc::ETIMEDOUT => "ETIMEDOUT",
        libc::EHOSTUNREACH => "EHOSTUNREACH",
        libc::ENETUNREACH => "ENETUNREACH",
        libc::EINPROGRESS => "EINPROGRESS",
        libc::EAGAIN => "EAGAIN",
        libc::EPIPE => "EPIPE",
        libc::ENOTCONN => "ENOTCONN",
        libc::ECONNABORTED => "ECONNABORTED",
        libc::EIO => "EIO",
        _ => return None,
    })
}

/// The probe, as the registry lists it.
pub struct NfsProbe;

impl Probe for NfsProbe {
    fn name(&self) -> &'static str {
        NAME
    }

    fn record_kind(&self) -> u32 {
        kind::NFS
    }

    fn events(&self) -> &'static [EventKind] {
        &[RPC, RPC_COUNT, RPC_LATENCY]
    }

    fn jiffies_field(&self) -> Option<&'static str> {
        Some("timeout_ms")
    }

    /// Its programs load with the object and attach when sunrpc is there: at once if it already
    /// is (an agent restarted on a node with mounts), else when the module watcher sees it.
    fn plan(&self, vmlinux: &KernelBtf, _: &Settings, _: &mut Decoding) -> Result<Planned, ProbeError> {
        let completion =
            ModuleAttachment { resolved: resolve_loaded(vmlinux), attachment: Attachment::default() };
        Ok(Planned { programs: None, completion: Some(Box::new(completion)) })
    }

    /// Taken whether or not sunrpc is loaded yet: the programs count once they attach.
    fn counting(&self, ebpf: &mut Ebpf) -> Result<Option<Box<dyn Counting>>, String> {
        Ok(Some(Box::new(RpcCounts {
            events: CounterMap::take(ebpf, "NFS_COUNTS", "NFS_OVERFLOW", 1)?,
            latency: CounterMap::take(ebpf, "NFS_LATENCY", "NFS_LATENCY_OVERFLOW", 1)?,
            names: LatencyNames::take(ebpf)?,
            warned_untimed: false,
        })))
    }

    fn decode(
        &self,
        header: &EventHeader,
        record: &[u8],
        decoding: &Decoding,
    ) -> Result<Payload, DecodeError> {
        let raw: NfsEvent = read_versioned(header, record, kstall_common::nfs::VERSION, "nfs event")?;
        Ok(Payload::Nfs(decode(&raw, decoding.clock)?))
    }

    #[cfg(test)]
    fn samples(&self) -> Vec<Payload> {
        let timeout = tests::event(WHAT_TIMEOUT, 0);
        let mut samples = vec![Payload::Nfs(decode(&timeout, Clock { hz: Some(250) }).expect("sample"))];
        for (what, error) in [
            (WHAT_RETRANSMIT, 0),
            (WHAT_TIMEOUT, 0),
            (WHAT_SOCKET_CONNECT, -libc::ECONNREFUSED),
            (WHAT_STATE_MGR_FAILED, -libc::EIO),
        ] {
            samples.push(Payload::NfsCount(tests::count_of(&tests::event(what, error), 2)));
        }
        samples.push(Payload::NfsLatency(tests::slow_writes()));
        samples
    }
}

/// The RPC events counted in the kernel, by series; those counted without a key carry no kind,
/// so they are only counted as suppressed. And the RPCs timed in the kernel, by caller.
struct RpcCounts {
    events: CounterMap<NfsCountKey>,
    latency: CounterMap<NfsLatencyKey, kstall_common::nfs::NfsLatency>,
    names: LatencyNames,
    warned_untimed: bool,
}

impl Counting for RpcCounts {
    fn drain(&mut self, turn: Turn, _: &Decoding, drained: &mut Drained) -> Result<(), String> {
        let mut timed = Vec::new();
        let latency_result = self.latency.drain(turn, &mut timed);
        self.names.new_drain();
        for (key, latency) in timed {
            let series = self.names.series(&key);
            drained.counts.push(Counted {
                probe: NAME,
                // Attributed by the caller's cgroup; the transport's namespace names the pod when
                // the caller was a kernel thread (`attribution::Index::resolve`).
                netns: series.transport.netns_ino,
                cgroup_id: key.cgroup_id,
                comm: String::new(),
                payload: Payload::NfsLatency(decode_latency(&series, &latency)),
            });
        }
        // RPCs the full map could not time are no events: they are warned of, not counted.
        let untimed = latency_result?.iter().fold(0u64, |sum, n| sum.saturating_add(*n));
        if untimed > 0 && !self.warned_untimed {
            self.warned_untimed = true;
            tracing::warn!(untimed, "NFS RPCs not timed: the kernel's latency map is full (warned once)");
        }
        let mut counted = Vec::new();
        let result = self.events.drain(turn, &mut counted);
        for (key, counter) in counted {
            match decode_count(&key, &counter) {
                Ok(count) => drained.counts.push(Counted {
                    probe: NAME,
                    netns: key.netns_ino,
                    cgroup_id: 0,
                    comm: String::new(),
                    payload: Payload::NfsCount(count),
                }),
                Err(e) => drained.errors.push(e),
            }
        }
        let overflow = result?.iter().fold(0u64, |sum, n| sum.saturating_add(*n));
        drained.uncounted.push((NAME, overflow));
        Ok(())
    }
}

/// The programs, loaded with the object, attached as sunrpc and nfsv4 load.
struct ModuleAttachment {
    /// What the modules loaded at start gave, to attach with at once.
    resolved: Option<Resolved>,
    attachment: Attachment,
}

impl Completion for ModuleAttachment {
    fn on_load(&mut self, ebpf: &mut Ebpf, status: &mut ProbeStatus) {
        *status = match load_programs(ebpf) {
            Err(e) => ProbeStatus::down(NAME, e),
            Ok(()) => self
                .resolved
                .take()
                .and_then(|resolved| attach_resolved(ebpf, &mut self.attachment, resolved))
                .unwrap_or_else(|| {
                    self.attachment.pending = true;
                    ProbeStatus::down(NAME, WAITING)
                }),
        };
    }

    fn waiting(&self) -> bool {
        self.attachment.pending
    }

    fn on_modules(&mut self, ebpf: &mut Ebpf, status: &mut ProbeStatus) -> bool {
        let Some(now) = attach_available(ebpf, &mut self.attachment) else { return false };
        match &now.reason {
            None => tracing::info!(hook = now.hook.as_deref().unwrap_or(""), "nfs probe attached"),
            Some(reason) => tracing::warn!(reason, "sunrpc appeared but the nfs probe cannot attach"),
        }
        *status = now;
        true
    }

    fn attached(&self) -> Vec<&'static str> {
        self.attachment.programs.clone()
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::kernel_btf::tests::{kernel, testdata};

    #[test]
    fn offsets_resolve_from_module_btf_on_debian_kernels() {
        let mut seen = Vec::new();
        for k in ["6.1", "6.12", "7.3"] {
            let vmlinux = kernel(k);
            let sunrpc = vmlinux.module_from_bytes(&testdata(k, "sunrpc")).unwrap();
            let nfs = vmlinux.module_from_bytes(&testdata(k, "nfs")).unwrap();
            let nfsv4 = vmlinux.module_from_bytes(&testdata(k, "nfsv4")).unwrap();
            let cfg = resolve(&sunrpc, Some(&nfs), Some(&nfsv4)).unwrap_or_else(|e| panic!("{k}: {e}"));
            assert!(cfg.valid == 1 && cfg.nfs_client == 1 && cfg.nfs_module == 1, "{k}");
            // The latency program's one read of the task covers what it reads of it.
            let within =
                |start: u32, offset: u32, size: u32| start <= offset && offset + size <= start + SPAN_LEN;
            assert!(
                [(cfg.task_proc, 8), (cfg.task_client, 8), (cfg.task_xprt, 8), (cfg.task_flags, 2)]
                    .iter()
                    .all(|(offset, size)| within(cfg.task_span, *offset, *size)),
                "{k}: {cfg:?}"
            );
            for (module, btf) in [("sunrpc", &sunrpc), ("nfs", &nfs), ("nfsv4", &nfsv4)] {
                for tracepoint in PROGRAMS.iter().filter(|p| p.2 == module).map(|p| p.1) {
                    btf.tracepoint_arg_count(tracepoint).unwrap_or_else(|e| panic!("{k}: {tracepoint}: {e}"));
                }
            }
            seen.push(cfg);
        }
        assert_ne!(seen[0], seen[1], "6.1 and 6.12 lay the RPC structs out differently");
        // 6.18 here has no sunrpc: its vmlinux alone cannot resolve them.
        assert!(resolve(&kernel("6.18"), None, None).is_err());
    }

    /// A span must cover every field it is for and end inside the struct; where none can, the
    /// program reads the fields one by one.
    #[test]
    fn a_span_that_cannot_cover_its_fields_inside_the_struct_is_none() {
        let vmlinux = kernel("6.1");
        let sunrpc = vmlinux.module_from_bytes(&testdata("6.1", "sunrpc")).unwrap();
        let size = sunrpc.struct_size("rpc_task").unwrap();
        // The end of the struct: the span ends there, not past it.
        assert_eq!(
            span(&sunrpc, "rpc_task", &[(size - 8, 8)]).unwrap(),
            (size - SPAN_LEN).next_multiple_of(8)
        );
        assert_eq!(span(&sunrpc, "rpc_task", &[(0, 8), (SPAN_LEN, 8)]).unwrap(), NO_SPAN, "too far apart");
        assert_eq!(span(&vmlinux, "list_head", &[(0, 8)]).unwrap(), NO_SPAN, "smaller than a span");
        assert!(span(&sunrpc, "no_such_struct", &[(0, 8)]).is_err());
    }

    /// 5.10 has no module BTF: the offsets come from vmlinux's, which describes the RPC and NFS
    /// client structs too. Where a kernel has both, they agree to the byte — what makes vmlinux's
    /// a sound source where the module's is missing.
    #[test]
    fn vmlinux_btf_gives_the_module_layouts_where_modules_have_no_btf() {
        let vmlinux = kernel("5.10");
        let cfg = resolve(&vmlinux, Some(&vmlinux), Some(&vmlinux)).unwrap();
        assert!(cfg.valid == 1 && cfg.nfs_client == 1 && cfg.nfs_module == 1);
        for k in ["6.1", "6.12", "7.3"] {
            let vmlinux = kernel(k);
            let Ok(from_vmlinux) = resolve(&vmlinux, Some(&vmlinux), Some(&vmlinux)) else { continue };
            let module = |name| vmlinux.module_from_bytes(&testdata(k, name)).unwrap();
            let (sunrpc, nfs, nfsv4) = (module("sunrpc"), module("nfs"), module("nfsv4"));
            assert_eq!(from_vmlinux, resolve(&sunrpc, Some(&nfs), Some(&nfsv4)).unwrap(), "{k}");
        }
        assert!(
            resolve(&kernel("7.3"), Some(&kernel("7.3")), Some(&kernel("7.3"))).is_ok(),
            "7.3's vmlinux describes them too"
        );
    }

    /// The count the kernel makes of `ev`'s series (as `ebpf/src/probes/nfs.rs` keys it), of
    /// `events` events, all sent.
    pub(crate) fn count_of(ev: &NfsEvent, events: u64) -> NfsCount {
        let by_error = matches!(ev.what, WHAT_SOCKET_CONNECT | WHAT_SOCKET_ERROR | WHAT_STATE_MGR_FAILED);
        let key = NfsCountKey {
            netns_ino: ev.header.netns_ino,
            what: ev.what,
            error: if by_error { ev.error } else { 0 },
            server_family: ev.server_family,
            server_addr: ev.server_addr,
            section: if ev.what == WHAT_STATE_MGR_FAILED { ev.procedure } else { [0; NAME_LEN] },
            ..Default::default()
        };
        decode_count(&key, &Counter { events, emitted: events }).unwrap()
    }

    /// 10 WRITEs to 10.55.0.1 by cgroup 4242: 8 within 1 ms, 2 of 0.8 s.
    pub(crate) fn slow_writes() -> NfsLatency {
        let mut latency = kstall_common::nfs::NfsLatency { rpcs: 10, ..Default::default() };
        latency.buckets[1] = 8;
        latency.buckets[10] = 2;
        latency.sum_ns = 8 * 700_000 + 2 * 800_000_000;
        decode_latency(&latency::series_of([10, 55, 0, 1], "WRITE", 0), &latency)
    }

    #[test]
    fn a_latency_key_reads_back_as_its_histogram() {
        let writes = slow_writes();
        assert_eq!(writes.server_addr, Some("10.55.0.1".parse().unwrap()));
        assert_eq!((writes.operation.as_str(), writes.rpcs), ("WRITE", 10));
        assert!((writes.seconds_sum - 1.6056).abs() < 1e-9);
        assert_eq!(writes.buckets.len(), kstall_common::nfs::LATENCY_BUCKETS);
        let near = |q: f64, expected: f64| {
            let got = writes.quantile(q).unwrap();
            assert!((got - expected).abs() < 1e-9, "q{q}: {got}, not {expected}");
        };
        // As Prometheus's histogram_quantile: linear within the bucket.
        near(0.5, 0.0005 + 0.0005 * 5.0 / 8.0);
        near(0.8, 0.001);
        near(0.99, 0.5 + 0.5 * 1.9 / 2.0);
        let text = (RPC_LATENCY.text)(&crate::probes::kind::Fields(&serde_json::to_value(&writes).unwrap()));
        assert_eq!(text, "10 WRITE to 10.55.0.1 in 1 s, 160.6 ms mean");
        let past = NfsLatency { buckets: vec![0; 15].into_iter().chain([3]).collect(), rpcs: 3, ..writes };
        assert_eq!(past.quantile(0.99), Some(30.0), "past the last bound reads as the last");
        assert_eq!(NfsLatency { buckets: vec![0; 16], rpcs: 0, ..past }.quantile(0.99), None);
    }

    #[test]
    fn a_count_key_reads_back_as_its_series() {
        let ev = event(WHAT_SOCKET_CONNECT, -111);
        let key = NfsCountKey {
            what: WHAT_SOCKET_CONNECT,
            error: -111,
            server_family: 2,
            server_addr: ev.server_addr,
            ..Default::default()
        };
        let count = decode_count(&key, &Counter { events: 40, emitted: 32 }).unwrap();
        assert_eq!(count.series.what, What::SocketConnect);
        assert_eq!(count.series.server_addr, Some("10.55.0.1".parse().unwrap()));
        assert_eq!((count.series.error_name, count.events, count.suppressed), (Some("ECONNREFUSED"), 40, 8));
        assert!(count.series.connect_failed());
        assert!(decode_count(&NfsCountKey { what: 99, ..Default::default() }, &Counter::default()).is_err());
        let json = serde_json::to_value(&count).unwrap();
        assert_eq!((json["what"].as_str(), json["events"].as_u64()), (Some("socket_connect"), Some(40)));
    }

    pub(crate) fn event(what: u32, error: i32) -> NfsEvent {
        let mut header = kstall_common::EventHeader::zeroed();
        header.kind = kstall_common::kind::NFS;
        header.version = kstall_common::nfs::VERSION;
        header.netns_ino = 4026532300;
        let mut ev = NfsEvent {
            header,
            what,
            error,
            xid: 0x1234_5678,
            ntrans: 3,
            client_id: 7,
            owner_pid: 812,
            timeout_jiffies: 250,
            server_family: 2,
            server_port: 2049,
            _pad: 0,
            server_addr: [0; 16],
            program: [0; NAME_LEN],
            procedure: [0; NAME_LEN],
        };
        ev.server_addr[..4].copy_from_slice(&[10, 55, 0, 1]);
        ev.program[..3].copy_from_slice(b"nfs");
        ev.procedure[..5].copy_from_slice(b"WRITE");
        ev
    }

    /// Found by the fuzzer (agent/fuzz, ring_buffer_records): a record whose timeout in jiffies
    /// times 1000 overflows u64 panicked in the conversion to milliseconds.
    #[test]
    fn a_huge_timeout_in_jiffies_converts_without_overflow() {
        let mut ev = event(WHAT_SOCKET_CONNECT, -115);
        ev.timeout_jiffies = 14195346025471803392;
        // 2^64 ms and more: as many as u64 holds.
        assert_eq!(decode(&ev, Clock { hz: Some(250) }).unwrap().timeout_ms, Some(u64::MAX));
        // Jiffies times 1000 past u64, the milliseconds not: exact.
        ev.timeout_jiffies = u64::MAX / 100;
        assert_eq!(decode(&ev, Clock { hz: Some(1000) }).unwrap().timeout_ms, Some(u64::MAX / 100));
    }

    #[test]
    fn decodes_a_timeout() {
        let n = decode(&event(WHAT_TIMEOUT, -110), Clock { hz: Some(250) }).unwrap();
        assert_eq!(n.what, What::Timeout);
        assert_eq!(n.server_addr, Some("10.55.0.1".parse().unwrap()));
        assert_eq!(n.server_port, Some(2049));
        assert_eq!(
            (n.xid, n.ntrans, n.client_id, n.owner_pid),
            (Some(0x1234_5678), Some(3), Some(7), Some(812))
        );
        assert_eq!(n.timeout_ms, Some(1000));
        assert_eq!((n.program.as_deref(), n.procedure.as_deref()), (Some("nfs"), Some("WRITE")));
        assert_eq!((n.error, n.error_name), (Some(-110), Some("ETIMEDOUT")));
    }

    #[test]
    fn unknown_what_and_family() {
        assert!(matches!(
            decode(&event(99, 0), Clock::default()),
            Err(DecodeError::BadField { field: "nfs.what", .. })
        ));
        let mut ev = event(WHAT_SOCKET_ERROR, -111);
        ev.server_family = 1;
        let n = decode(&ev, Clock::default()).unwrap();
        assert_eq!((n.server_addr, n.server_port, n.timeout_ms), (None, None, None));
    }

    /// Records kstall wrote on real kernels (testdata/README.md), decoded by this probe (the
    /// header checks are `events.rs`'s, tested there).
    fn recorded(kernel: &str) -> Vec<Nfs> {
        let path =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("testdata/nfs/{kernel}.raw"));
        std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
            .lines()
            .map(|line| {
                let (kind, hex) = line.split_once(' ').expect("<kind> <hex>");
                assert_eq!(kind, kstall_common::kind::NFS.to_string(), "{kernel}: not an NFS event: {line}");
                let bytes: Vec<u8> = (0..hex.len())
                    .step_by(2)
                    .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap())
                    .collect();
                let raw: NfsEvent = crate::decode::read_record(&bytes, "nfs event").unwrap();
                assert_eq!(raw.header.version, kstall_common::nfs::VERSION, "{kernel}: {line}");
                decode(&raw, Clock::default()).unwrap_or_else(|e| panic!("{kernel}: {e}: {line}"))
            })
            .collect()
    }

    #[test]
    fn recorded_samples_decode_on_6_1_and_6_12() {
        // (kernel, socket_connect, timeout, socket_error, retransmit, server_responding) as counted
        // by the recording run's own event stream.
        for (kernel, counts) in [("6.1", [20, 35, 16, 1, 2]), ("6.12", [40, 36, 35, 1, 2])] {
            let events = recorded(kernel);
            let count = |what: What| events.iter().filter(|e| e.what == what).count();
            let seen = [
                What::SocketConnect,
                What::Timeout,
                What::SocketError,
                What::Retransmit,
                What::ServerResponding,
            ]
            .map(count);
            assert_eq!(seen, counts, "{kernel}");
            let server: std::net::IpAddr = "10.55.0.1".parse().unwrap();
            for e in events.iter().filter(|e| matches!(e.what, What::Timeout | What::Retransmit)) {
                assert_eq!((e.server_addr, e.server_port), (Some(server), Some(2049)), "{kernel}: {e:?}");
                assert_eq!(e.program.as_deref(), Some("nfs"), "{kernel}: {e:?}");
                assert!(e.xid.is_some() && e.owner_pid.is_some(), "{kernel}: {e:?}");
                assert!(matches!(e.procedure.as_deref(), Some("OPEN" | "SEQUENCE")), "{kernel}: {e:?}");
                assert!(e.client_id.is_some(), "{kernel}: {e:?}");
            }
            // The retransmit is of a request that had timed out: same xid, second transmission.
            let retransmit = events.iter().find(|e| e.what == What::Retransmit).unwrap();
            assert_eq!(retransmit.ntrans, Some(2), "{kernel}");
            assert!(events.iter().any(|e| e.what == What::Timeout && e.xid == retransmit.xid), "{kernel}");
            // The DROP gave ETIMEDOUT, the killed sidecar forwarder ECONNREFUSED.
            let errors: Vec<_> =
                events.iter().filter(|e| e.what == What::SocketError).filter_map(|e| e.error_name).collect();
            assert!(
                errors.contains(&"ETIMEDOUT") && errors.contains(&"ECONNREFUSED"),
                "{kernel}: {errors:?}"
            );
            for e in events.iter().filter(|e| e.what == What::ServerResponding) {
                assert_eq!(e.server_addr, Some(server), "{kernel}");
            }
        }
    }

    /// Found by the fuzzer (agent/fuzz, ring_buffer_records): a counter key (or an event) whose
    /// error is i32::MIN panicked negating it to look its name up.
    #[test]
    fn the_most_negative_error_has_no_name_and_decodes() {
        assert_eq!(errno_name(i32::MIN), None);
        let key = NfsCountKey { netns_ino: 2, what: WHAT_RETRANSMIT, error: i32::MIN, ..Default::default() };
        let count = decode_count(&key, &Counter { events: 1, emitted: 1 }).unwrap();
        assert_eq!((count.series.error, count.series.error_name), (Some(i32::MIN), None));
        let n = decode(&event(WHAT_SOCKET_ERROR, i32::MIN), Clock::default()).unwrap();
        assert_eq!((n.error, n.error_name), (Some(i32::MIN), None));
    }

    #[test]
    fn errno_names() {
        assert_eq!(errno_name(-111), Some("ECONNREFUSED"));
        assert_eq!(errno_name(0), None);
        assert_eq!(errno_name(-4242), None);
    }
}
