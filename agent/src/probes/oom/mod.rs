//! OOM kills. Kernel half: `ebpf/src/probes/oom.rs`; event: `common/src/oom.rs`.
//!
//! Where the kernel allows fentry, `oom_kill_process(oc)` gives everything first-hand: the victim,
//! `oc->memcg` (the cgroup that hit its limit, NULL when the node ran out) and `oc->totalpages`.
//! Elsewhere `mark_victim` gives the victim, and the scope comes from the call path of the task
//! that invoked the OOM killer: `mem_cgroup_out_of_memory` is only on the memory-cgroup path,
//! `out_of_memory` without it only on the node-wide one; the OOMing cgroup is then unknown. With
//! no usable stack the scope is `unknown`: it is never guessed.

pub mod event;

pub use super::settings::DEFAULT_CRITICAL_COMMS;
pub use event::*;

use kstall_common::{
    EventHeader,
    counter::Counter,
    kind,
    oom::{
        FLAG_FROM_OOM_CONTROL, FLAG_HAS_MEMCG_PATH, FLAG_HAS_RSS, FLAG_HAS_SCORE_ADJ, FLAG_MEMCG_OOM,
        FLAG_VICTIM_PID_ONLY, MEMCG_NAME_LEN, MEMCG_PATH_LEVELS, OomConfig, OomCountKey, OomKillEvent,
    },
};

use aya::Ebpf;

use super::{
    counters::CounterMap,
    error::ProbeError,
    kind::EventKind,
    payload::Payload,
    plan::{Fallback, Plan, ProgramSpec, Unavailable},
    probe::{Counted, Counting, Decoding, Drained, Planned, Probe, Turn},
    settings::Settings,
};
use crate::{
    decode::{DecodeError, comm_string, read_versioned},
    kernel_btf::{BtfError, KernelBtf},
    symbols::Symbols,
};

pub const NAME: &str = "oom";
const GLOBAL: &str = "OOM_CONFIG";
const PROG_OOM_CONTROL: ProgramSpec = ProgramSpec::fentry("oom_kill_process", "oom_kill_process");
const PROG_TASK: ProgramSpec = ProgramSpec::tp_btf("mark_victim", "mark_victim");
const PROG_PID: ProgramSpec = ProgramSpec::tp_btf("mark_victim_pid", "mark_victim");

/// `enum { MM_FILEPAGES, MM_ANONPAGES, MM_SWAPENTS, MM_SHMEMPAGES }` (mm_types_task.h), unchanged
/// since 4.5.
const MM_FILEPAGES: usize = 0;
const MM_ANONPAGES: usize = 1;
const MM_SHMEMPAGES: usize = 3;

pub fn plan(vmlinux: &KernelBtf) -> Result<Plan, ProbeError> {
    let args = vmlinux.tracepoint_arg_count("mark_victim")?;
    let mut cfg = OomConfig { task: super::task::resolve(vmlinux)?, ..Default::default() };
    let victim_from_task = resolve_victim(vmlinux, &mut cfg);
    let mut notes = Vec::new();
    if let Err(e) = resolve_memcg_path(vmlinux, &mut cfg) {
        notes.push(format!("the victim's memory cgroup path is not read: {e}"));
    }
    let (program, hook, victim_unavailable) = match (&victim_from_task, args >= 2) {
        (Ok(()), true) => (PROG_TASK, "tp_btf/mark_victim (task, uid)", vec![]),
        _ => {
            let why = "mark_victim gives only the victim's pid before 6.9";
            (PROG_PID, "tp_btf/mark_victim (pid)", vec![Unavailable::new("victim comm, cgroup, rss", why)])
        }
    };
    // What the scope-from-the-call-path hook cannot say.
    let mut call_path_unavailable = victim_unavailable;
    call_path_unavailable.push(Unavailable::new(
        "oom_cgroup_id, totalpages_bytes",
        "only fentry/oom_kill_process sees the oom_control (scope comes from the call path)",
    ));
    cfg.valid = 1;
    // fentry on oom_kill_process when the kernel has the function and its oom_control layout.
    let oom_control = victim_from_task.and_then(|()| resolve_oom_control(vmlinux, &mut cfg));
    let (programs, hook, unavailable, fallback) = match oom_control {
        Ok(()) => {
            let fallback = Fallback {
                programs: vec![program],
                hook: format!("{hook} (scope from the OOM-invoking call path; OOMing cgroup unknown)"),
                unavailable: call_path_unavailable,
            };
            (vec![PROG_OOM_CONTROL], "fentry/oom_kill_process".to_string(), Vec::new(), Some(fallback))
        }
        Err(e) => {
            notes.push(format!("fentry/oom_kill_process not planned: {e}"));
            (vec![program], hook.to_string(), call_path_unavailable, None)
        }
    };
    Ok(Plan {
        config: Some((GLOBAL, crate::decode::bytes_of(&cfg))),
        programs,
        hook,
        notes,
        unavailable,
        fallback,
    })
}

fn resolve_oom_control(btf: &KernelBtf, cfg: &mut OomConfig) -> Result<(), BtfError> {
    if !btf.has_function("oom_kill_process") {
        return Err(BtfError::Missing("function oom_kill_process".into()));
    }
    cfg.oc_chosen = btf.offset_of("oom_control", "chosen")?;
    cfg.oc_memcg = btf.offset_of("oom_control", "memcg")?;
    cfg.oc_totalpages = btf.offset_of("oom_control", "totalpages")?;
    cfg.memcg_css_cgroup = btf.offset_of("mem_cgroup", "css.cgroup")?;
    Ok(())
}

fn resolve_memcg_path(btf: &KernelBtf, cfg: &mut OomConfig) -> Result<(), BtfError> {
    let memory = btf
        .enum_values("cgroup_subsys_id")?
        .into_iter()
        .find_map(|(name, value)| (name == "memory_cgrp_id").then_some(value))
        .ok_or_else(|| BtfError::Missing("memory_cgrp_id (no memory controller)".into()))?;
    cfg.css_set_memory_css = btf.offset_of("css_set", &format!("subsys[{memory}]"))?;
    cfg.css_cgroup = btf.offset_of("cgroup_subsys_state", "cgroup")?;
    cfg.kernfs_node_name = btf.offset_of("kernfs_node", "name")?;
    // Renamed `__parent` in 6.15, when it became RCU-protected.
    cfg.kernfs_node_parent =
        btf.offset_of("kernfs_node", "__parent").or_else(|_| btf.offset_of("kernfs_node", "parent"))?;
    cfg.memcg_path = 1;
    Ok(())
}

fn resolve_victim(btf: &KernelBtf, cfg: &mut OomConfig) -> Result<(), BtfError> {
    cfg.task_mm = btf.offset_of("task_struct", "mm")?;
    cfg.task_signal = btf.offset_of("task_struct", "signal")?;
    cfg.signal_oom_score_adj = btf.offset_of("signal_struct", "oom_score_adj")?;
    cfg.mm_total_vm = btf.offset_of("mm_struct", "total_vm")?;
    // 6.2+: `struct percpu_counter rss_stat[]` (shared count in `.count`); before: `struct
    // mm_rss_stat { atomic_long_t count[]; }`.
    let rss = |i: usize| {
        btf.offset_of("mm_struct", &format!("rss_stat[{i}].count"))
            .or_else(|_| btf.offset_of("mm_struct", &format!("rss_stat.count[{i}]")))
    };
    cfg.mm_rss_file = rss(MM_FILEPAGES)?;
    cfg.mm_rss_anon = rss(MM_ANONPAGES)?;
    cfg.mm_rss_shmem = rss(MM_SHMEMPAGES)?;
    Ok(())
}

/// A key read back from the kernel's counters, before its scope is settled.
#[derive(Debug, Clone, PartialEq)]
pub struct CountedKills {
    /// The victim's cgroup (0 when unknown): what the count is attributed by.
    pub cgroup_id: u64,
    /// The victim's name: empty where the hook gives only its pid, `overflow` for kills counted
    /// without a key (the map was full).
    pub comm: String,
    /// What the hook knew; `None` where the scope comes from the call path, which only the
    /// key's events carry ([`Scopes`]).
    pub scope: Option<Scope>,
    pub kills: u64,
    pub suppressed: u64,
}

pub fn decode_count(key: &OomCountKey, counter: &Counter) -> CountedKills {
    let flags = u32::from(key.flags);
    CountedKills {
        cgroup_id: key.cgroup_id,
        comm: comm_string(&key.comm),
        scope: match (flags & FLAG_FROM_OOM_CONTROL != 0, flags & FLAG_MEMCG_OOM != 0) {
            (false, _) => None,
            (true, true) => Some(Scope::Memcg),
            (true, false) => Some(Scope::Global),
        },
        kills: counter.events,
        suppressed: counter.suppressed(),
    }
}

/// The kills counted without a key (the map was full).
pub fn overflow_count(kills: u64) -> CountedKills {
    CountedKills {
        cgroup_id: 0,
        comm: "overflow".into(),
        scope: Some(Scope::Unknown),
        kills,
        suppressed: kills,
    }
}

impl CountedKills {
    /// The count, its scope what the hook knew or else `seen` (what the key's events showed,
    /// `unknown` without them: never guessed), `critical` from the victim's name.
    pub fn settle(&self, seen: Option<Scope>, ctx: &Decoding) -> OomKillCount {
        OomKillCount {
            scope: self.scope.or(seen).unwrap_or(Scope::Unknown),
            scope_from_events: self.scope.is_none(),
            critical: !self.comm.is_empty() && ctx.critical_comms.contains(&self.comm),
            kills: self.kills,
            suppressed: self.suppressed,
        }
    }

    /// As the pipeline takes it: attributed by the victim's cgroup, its scope still to settle
    /// from its key's events where the hook did not know it.
    pub fn counted(&self, ctx: &Decoding) -> Counted {
        Counted {
            probe: NAME,
            netns: 0,
            cgroup_id: self.cgroup_id,
            comm: self.comm.clone(),
            payload: Payload::OomKillCount(self.settle(None, ctx)),
        }
    }
}

/// The kills counted in the kernel, by victim.
struct KillCounts(CounterMap<OomCountKey>);

impl Counting for KillCounts {
    fn drain(&mut self, turn: Turn, decoding: &Decoding, drained: &mut Drained) -> Result<(), String> {
        let mut counted = Vec::new();
        let result = self.0.drain(turn, &mut counted);
        drained
            .counts
            .extend(counted.iter().map(|(key, counter)| decode_count(key, counter).counted(decoding)));
        let overflow = result?.into_iter().filter(|&n| n > 0);
        drained.counts.extend(overflow.map(|n| overflow_count(n).counted(decoding)));
        Ok(())
    }
}

pub fn decode(ev: &OomKillEvent, symbols: &Symbols, ctx: &Decoding) -> Result<OomKill, DecodeError> {
    let mut stack = symbols.kernel_stack(&ev.invoker_stack, ev.stack_bytes);
    // The innermost frames are kstall's own program and the tracepoint glue.
    stack.trim_innermost(|name, module| module == Some("bpf") || name.starts_with("bpf_trace_run"));
    let has_rss = ev.flags & FLAG_HAS_RSS != 0;
    let bytes = |pages: u64| has_rss.then(|| pages.saturating_mul(ctx.page_size));
    let comm = comm_string(&ev.header.comm);
    let critical = ev.header.pid == ctx.agent_pid || (!comm.is_empty() && ctx.critical_comms.contains(&comm));
    Ok(OomKill {
        scope: if ev.flags & FLAG_FROM_OOM_CONTROL == 0 {
            scope_of(stack.names())
        } else if ev.flags & FLAG_MEMCG_OOM != 0 {
            Scope::Memcg
        } else {
            Scope::Global
        },
        critical,
        victim_pid_only: ev.flags & FLAG_VICTIM_PID_ONLY != 0,
        anon_rss_bytes: bytes(ev.anon_rss),
        file_rss_bytes: bytes(ev.file_rss),
        shmem_rss_bytes: bytes(ev.shmem_rss),
        total_vm_bytes: bytes(ev.total_vm),
        oom_score_adj: (ev.flags & FLAG_HAS_SCORE_ADJ != 0).then_some(ev.oom_score_adj),
        oom_cgroup_id: (ev.oom_cgroup_id != 0).then_some(ev.oom_cgroup_id),
        totalpages_bytes: (ev.totalpages != 0).then(|| ev.totalpages.saturating_mul(ctx.page_size)),
        victim_memcg: (ev.flags & FLAG_HAS_MEMCG_PATH != 0).then(|| memcg_path(&ev.victim_memcg)),
        invoker: Invoker {
            pid: ev.invoker_pid,
            tgid: ev.invoker_tgid,
            comm: comm_string(&ev.invoker_comm),
            cgroup_id: ev.invoker_cgroup_id,
        },
        invoker_stack: stack,
    })
}

/// The captured directory names, innermost first, as a path from the outermost captured one
/// (the root's name is empty and drops out).
fn memcg_path(names: &[[u8; MEMCG_NAME_LEN]; MEMCG_PATH_LEVELS]) -> String {
    let names: Vec<String> = names.iter().rev().map(|n| comm_string(n)).filter(|n| !n.is_empty()).collect();
    names.join("/")
}

/// memcg when the memory-cgroup charge path is on the stack, global when the OOM killer was
/// entered without it, unknown without a usable stack.
pub fn scope_of<'a>(frames: impl Iterator<Item = &'a str> + Clone) -> Scope {
    let names = frames.map(|f| f.split(['+', ' ']).next().unwrap_or(f));
    const MEMCG: &[&str] = &[
        "mem_cgroup_out_of_memory",
        "mem_cgroup_oom",
        "try_charge_memcg",
        "try_charge",
        "mem_cgroup_oom_synchronize",
    ];
    const GLOBAL: &[&str] = &[
        "out_of_memory",
        "pagefault_out_of_memory",
        "__alloc_pages_may_oom",
        "__alloc_pages_slowpath",
        "moom_callback",
    ];
    if names.clone().any(|n| MEMCG.contains(&n)) {
        Scope::Memcg
    } else if names.clone().any(|n| GLOBAL.contains(&n)) {
        Scope::Global
    } else {
        Scope::Unknown
    }
}

/// The probe, as the registry lists it.
pub struct OomProbe;

impl Probe for OomProbe {
    fn name(&self) -> &'static str {
        NAME
    }

    fn record_kind(&self) -> u32 {
        kind::OOM_KILL
    }

    fn events(&self) -> &'static [EventKind] {
        &[KILL, KILL_COUNT]
    }

    fn plan(&self, vmlinux: &KernelBtf, _: &Settings, _: &mut Decoding) -> Result<Planned, ProbeError> {
        plan(vmlinux).map(Planned::from)
    }

    fn counting(&self, ebpf: &mut Ebpf) -> Result<Option<Box<dyn Counting>>, String> {
        Ok(Some(Box::new(KillCounts(CounterMap::take(ebpf, "OOM_KILL_COUNTS", "OOM_KILL_OVERFLOW", 1)?))))
    }

    fn counts_follow_events(&self) -> bool {
        true
    }

    /// A count whose hook did not know the scope (`mark_victim` does not) takes its key's kill's.
    fn settle_count(&self, count: &mut Payload, last_event: &Payload) {
        if let (Payload::OomKillCount(count), Payload::OomKill(kill)) = (count, last_event)
            && count.scope_from_events
        {
            count.scope = kill.scope;
        }
    }

    fn decode(
        &self,
        header: &EventHeader,
        record: &[u8],
        decoding: &Decoding,
    ) -> Result<Payload, DecodeError> {
        let raw: OomKillEvent =
            read_versioned(header, record, kstall_common::oom::VERSION, "oom_kill event")?;
        Ok(Payload::OomKill(decode(&raw, &decoding.symbols, decoding)?))
    }

    #[cfg(test)]
    fn samples(&self) -> Vec<Payload> {
        let ctx = Decoding::default();
        let kill = decode(&tests::victim_event(), &Symbols::default(), &ctx).expect("sample");
        let count = CountedKills {
            cgroup_id: 7,
            comm: "python3".into(),
            scope: Some(Scope::Memcg),
            kills: 3,
            suppressed: 2,
        };
        vec![Payload::OomKill(kill), Payload::OomKillCount(count.settle(None, &ctx))]
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use kstall_common::EventHeader;

    use kstall_common::kind;

    use super::*;
    use crate::{kernel_btf::tests::kernel, symbols::SymbolTable};

    #[test]
    fn scope_from_the_invoking_call_path() {
        let memcg = [
            "dump_stack_lvl+0x5d",
            "oom_kill_process+0x110",
            "out_of_memory+0x246",
            "mem_cgroup_out_of_memory+0x13c",
            "try_charge_memcg+0x3ea",
        ];
        assert_eq!(scope_of(memcg.iter().copied()), Scope::Memcg);
        let global = [
            "oom_kill_process+0x110",
            "out_of_memory+0x246",
            "__alloc_pages_slowpath+0xa1d",
            "__alloc_pages_noprof+0x2f0",
        ];
        assert_eq!(scope_of(global.iter().copied()), Scope::Global);
        assert_eq!(scope_of(["pagefault_out_of_memory+0x3c"].iter().copied()), Scope::Global);
        assert_eq!(scope_of([].iter().copied()), Scope::Unknown, "no stack, no guess");
        assert_eq!(
            scope_of(["0xffffffff81597b20"].iter().copied()),
            Scope::Unknown,
            "unsymbolized, no guess"
        );
    }

    #[test]
    fn a_count_key_says_the_scope_only_where_the_hook_knew_it() {
        use kstall_common::oom::OomCountKey;
        let mut key = OomCountKey { cgroup_id: 7, ..Default::default() };
        key.comm[..7].copy_from_slice(b"kubelet");
        let counter = Counter { events: 5, emitted: 2 };
        let counted = decode_count(&key, &counter);
        assert_eq!((counted.cgroup_id, counted.comm.as_str(), counted.scope), (7, "kubelet", None));
        assert_eq!((counted.kills, counted.suppressed), (5, 3));
        key.flags = FLAG_FROM_OOM_CONTROL as u8;
        assert_eq!(decode_count(&key, &counter).scope, Some(Scope::Global));
        key.flags = (FLAG_FROM_OOM_CONTROL | FLAG_MEMCG_OOM) as u8;
        assert_eq!(decode_count(&key, &counter).scope, Some(Scope::Memcg));
        let overflow = overflow_count(9);
        assert_eq!(
            (overflow.comm.as_str(), overflow.scope, overflow.suppressed),
            ("overflow", Some(Scope::Unknown), 9)
        );
    }

    #[test]
    fn a_count_takes_the_scope_the_hook_knew_or_its_events_showed() {
        let ctx = Decoding::default();
        let counted = |comm: &str, scope| CountedKills {
            cgroup_id: 7,
            comm: comm.into(),
            scope,
            kills: 3,
            suppressed: 0,
        };
        assert_eq!(counted("kubelet", None).settle(None, &ctx).scope, Scope::Unknown, "never guessed");
        let count = counted("kubelet", None).settle(Some(Scope::Global), &ctx);
        assert_eq!((count.scope, count.critical, count.kills), (Scope::Global, true, 3));
        assert!(!counted("python3", None).settle(None, &ctx).critical);
        assert_eq!(
            counted("kubelet", Some(Scope::Memcg)).settle(Some(Scope::Global), &ctx).scope,
            Scope::Memcg
        );
    }

    /// A memcg OOM kill of `python3`, as the kernel records it.
    pub fn victim_event() -> OomKillEvent {
        kill(b"python3", 42)
    }

    fn kill(comm: &[u8], pid: u32) -> OomKillEvent {
        let mut header = EventHeader::zeroed();
        header.kind = kind::OOM_KILL;
        header.version = kstall_common::oom::VERSION;
        header.pid = pid;
        header.comm[..comm.len()].copy_from_slice(comm);
        let mut ev = OomKillEvent {
            header,
            invoker_pid: 5,
            invoker_tgid: 5,
            invoker_cgroup_id: 77,
            invoker_comm: [0; 16],
            anon_rss: 1000,
            file_rss: 10,
            shmem_rss: 1,
            total_vm: 5000,
            oom_score_adj: -998,
            flags: FLAG_HAS_RSS | FLAG_HAS_SCORE_ADJ,
            oom_cgroup_id: 0,
            totalpages: 0,
            stack_bytes: 16,
            invoker_stack: [0; kstall_common::oom::STACK_DEPTH],
            victim_memcg: [[0; MEMCG_NAME_LEN]; MEMCG_PATH_LEVELS],
        };
        ev.invoker_stack[0] = 0xffffffff81597b30;
        ev.invoker_stack[1] = 0xffffffff8168b540;
        ev
    }

    #[test]
    fn decodes_a_memcg_kill_with_rss_in_bytes() {
        let symbols = Symbols::from_table(SymbolTable::parse(
            "ffffffff81597b20 T out_of_memory\nffffffff8168b530 t mem_cgroup_out_of_memory\n",
        ));
        let ctx = Decoding { page_size: 4096, agent_pid: 1, ..Decoding::default() };
        let k = decode(&kill(b"python3", 42), &symbols, &ctx).unwrap();
        assert_eq!(k.scope, Scope::Memcg);
        assert_eq!(k.anon_rss_bytes, Some(4_096_000));
        assert_eq!(k.oom_score_adj, Some(-998));
        assert_eq!(k.invoker.cgroup_id, 77);
        assert!(!k.critical);
        let stack: Vec<String> = k.invoker_stack.texts().collect();
        assert_eq!(stack, ["out_of_memory+0x10", "mem_cgroup_out_of_memory+0x10"]);
    }

    #[test]
    fn the_oom_control_hook_gives_scope_cgroup_and_totalpages_first_hand() {
        let ctx = Decoding { page_size: 4096, agent_pid: 1, ..Decoding::default() };
        let mut ev = kill(b"python3", 42);
        ev.stack_bytes = 0;
        ev.flags |= FLAG_FROM_OOM_CONTROL | FLAG_MEMCG_OOM;
        ev.oom_cgroup_id = 4711;
        ev.totalpages = 16384;
        let k = decode(&ev, &Symbols::default(), &ctx).unwrap();
        assert_eq!(
            (k.scope, k.oom_cgroup_id, k.totalpages_bytes),
            (Scope::Memcg, Some(4711), Some(64 << 20))
        );
        ev.flags &= !FLAG_MEMCG_OOM;
        ev.oom_cgroup_id = 0;
        let k = decode(&ev, &Symbols::default(), &ctx).unwrap();
        assert_eq!((k.scope, k.oom_cgroup_id), (Scope::Global, None), "oc->memcg NULL: the node ran out");
    }

    /// `ev` with the memory cgroup path's directory names, innermost first, as the kernel fills them.
    pub fn with_memcg_path(mut ev: OomKillEvent, innermost_first: &[&str]) -> OomKillEvent {
        for (slot, name) in ev.victim_memcg.iter_mut().zip(innermost_first) {
            slot[..name.len()].copy_from_slice(name.as_bytes());
        }
        ev.flags |= FLAG_HAS_MEMCG_PATH;
        ev
    }

    #[test]
    fn the_victims_memory_cgroup_path_is_read_outermost_first() {
        let ctx = Decoding::default();
        let id = "0123456789abcdef".repeat(4);
        let ev = with_memcg_path(
            kill(b"dd", 42),
            &[&id, "pod0b5e7b7e-7d45-4a8e-9c1e-2f4f1c0c9a11", "burstable", "kubepods"],
        );
        let k = decode(&ev, &Symbols::default(), &ctx).unwrap();
        assert_eq!(
            k.victim_memcg.as_deref(),
            Some(format!("kubepods/burstable/pod0b5e7b7e-7d45-4a8e-9c1e-2f4f1c0c9a11/{id}").as_str())
        );
        // Closer to the root than four levels: the root's empty name drops out.
        let shallow = with_memcg_path(kill(b"dd", 42), &["kstall-test", ""]);
        let k = decode(&shallow, &Symbols::default(), &ctx).unwrap();
        assert_eq!(k.victim_memcg.as_deref(), Some("kstall-test"));
        let k = decode(&kill(b"dd", 42), &Symbols::default(), &ctx).unwrap();
        assert_eq!(k.victim_memcg, None, "no path from the kernel, none made up");
    }

    #[test]
    fn the_memory_cgroup_path_resolves_on_every_kernel() {
        for k in ["5.10", "6.1", "6.12", "6.18", "7.3"] {
            let mut cfg = OomConfig::default();
            resolve_memcg_path(&kernel(k), &mut cfg).unwrap_or_else(|e| panic!("{k}: {e}"));
            assert_eq!(cfg.memcg_path, 1, "{k}");
            assert_ne!(cfg.kernfs_node_name, cfg.kernfs_node_parent, "{k}");
            assert!(plan(&kernel(k)).unwrap().notes.is_empty(), "{k}");
        }
    }

    #[test]
    fn critical_victims() {
        let ctx = Decoding { agent_pid: 4242, ..Decoding::default() };
        let symbols = Symbols::default();
        assert!(decode(&kill(b"kubelet", 42), &symbols, &ctx).unwrap().critical);
        assert!(decode(&kill(b"whatever", 4242), &symbols, &ctx).unwrap().critical, "the agent itself");
        assert!(!decode(&kill(b"kubelet-helper", 42), &symbols, &ctx).unwrap().critical, "exact names");
        let mut pid_only = kill(b"", 42);
        pid_only.flags = FLAG_VICTIM_PID_ONLY;
        let k = decode(&pid_only, &symbols, &ctx).unwrap();
        assert!(k.victim_pid_only && !k.critical && k.anon_rss_bytes.is_none() && k.oom_score_adj.is_none());
    }

    #[test]
    fn plans_both_tracepoint_forms() {
        // fentry first everywhere; the fallback is the task form: Debian's 6.1.0-57 carries the 6.9
        // mark_victim (backported), detected from BTF, not the version.
        // Debian's 5.10.0-46 has the backport too.
        for k in ["5.10", "6.1", "6.12", "6.18", "7.3"] {
            let p = plan(&kernel(k)).unwrap();
            assert_eq!(p.programs[0].program, "oom_kill_process", "{k}");
            assert_eq!(p.programs[0].attach, crate::probes::plan::Attach::FEntry, "{k}");
            assert!(p.unavailable.is_empty(), "{k}: {:?}", p.unavailable);
            let fallback = p.fallback.expect("a fallback");
            assert_eq!(fallback.programs[0].program, "mark_victim", "{k}");
            assert!(fallback.hook.starts_with("tp_btf/mark_victim (task, uid)"), "{k}: {}", fallback.hook);
            let fields: Vec<&str> = fallback.unavailable.iter().map(|u| u.field.as_str()).collect();
            assert_eq!(fields, ["oom_cgroup_id, totalpages_bytes"], "{k}");
        }
        // Both rss_stat layouts resolve (percpu_counter since 6.2, atomic_long_t before).
        for k in ["5.10", "6.1", "6.12", "6.18", "7.3"] {
            let mut cfg = OomConfig::default();
            resolve_victim(&kernel(k), &mut cfg).unwrap_or_else(|e| panic!("{k}: {e}"));
            let stride = cfg.mm_rss_anon - cfg.mm_rss_file;
            assert_eq!(
                cfg.mm_rss_shmem - cfg.mm_rss_anon,
                2 * stride,
                "{k}: counters 0, 1 and 3 of one array"
            );
        }
    }
}
