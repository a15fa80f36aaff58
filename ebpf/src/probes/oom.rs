//! OOM kills. Agent half: `agent/src/probes/oom.rs`; event: `common/src/oom.rs`.
//!
//! Hooks (match-proto): `tp_btf/mark_victim`, called by `mark_oom_victim()` for every task the OOM
//! killer picks, in the context of the task that invoked it:
//!
//! - 6.9 and later (and some 6.1.y backports): `TP_PROTO(struct task_struct *task, uid_t uid)`,
//!   program `mark_victim`; everything about the victim is read from `task`.
//! - before: `TP_PROTO(int pid)`, program `mark_victim_pid`; only the victim's pid is known.
//!
//! In both, `current` is the invoking task; its kernel stack (`bpf_get_stack`) is the call path
//! that says whether a memory cgroup or the whole node ran out.
//!
//! Preferred where the kernel allows fentry (not on every kernel: refused on some): `fentry/
//! oom_kill_process`: `void oom_kill_process(struct oom_control *oc, const char *message)` —
//! `oc->chosen` is the victim, `oc->memcg` the cgroup that hit its limit (NULL: the node ran
//! out), `oc->totalpages` what the victim was weighed against. The agent attaches it instead of
//! `mark_victim` when it can.
//!
//! Every kill is counted in `OOM_KILL_COUNTS` by its series (the victim's cgroup and name, and the
//! scope where the hook knows it) before anything is sent; only the first of a key in an interval
//! are sent in full (`kstall_common::counter`).

use core::mem::MaybeUninit;

use aya_ebpf::{
    EbpfContext,
    helpers::{bpf_get_current_cgroup_id, bpf_get_stack, bpf_ktime_get_boot_ns},
    macros::{btf_tracepoint, fentry, map},
    maps::{PerCpuArray, PerCpuHashMap},
    programs::{BtfTracePointContext, FEntryContext},
};
use kstall_common::{
    EventHeader,
    counter::Counter,
    kind,
    oom::{
        COUNT_KEYS, FLAG_FROM_OOM_CONTROL, FLAG_HAS_MEMCG_PATH, FLAG_HAS_RSS, FLAG_HAS_SCORE_ADJ,
        FLAG_MEMCG_OOM, FLAG_VICTIM_PID_ONLY, MEMCG_PATH_LEVELS, OomConfig, OomCountKey, OomKillEvent,
        STACK_DEPTH, VERSION,
    },
};

use crate::{
    maps::{self, Filtered, reserve, submit},
    read::{at, field, string},
    task::{cgroup_id, current_comm, fill_header},
    zero::zeroed_in,
};

/// OOM kills by series, per CPU; read and emptied by the agent once per interval.
#[map]
static OOM_KILL_COUNTS: PerCpuHashMap<OomCountKey, Counter> = PerCpuHashMap::with_max_entries(COUNT_KEYS, 0);

/// Kills whose key found `OOM_KILL_COUNTS` full.
#[map]
static OOM_KILL_OVERFLOW: PerCpuArray<u64> = PerCpuArray::with_max_entries(1, 0);

/// Filled by the agent from the running kernel's BTF before load.
#[unsafe(no_mangle)]
// SAFETY: plain integers; all zero means "not configured" (`valid == 0`).
static OOM_CONFIG: OomConfig = unsafe { core::mem::zeroed() };

#[fentry(function = "oom_kill_process")]
pub fn oom_kill_process(ctx: FEntryContext) -> u32 {
    let oc: *const u8 = ctx.arg(0);
    emit_kill(&ctx, Victim::OomControl(oc));
    0
}

#[btf_tracepoint(function = "mark_victim")]
pub fn mark_victim(ctx: BtfTracePointContext) -> u32 {
    let task: *const u8 = ctx.arg(0);
    emit_kill(&ctx, Victim::Task(task));
    0
}

#[btf_tracepoint(function = "mark_victim")]
pub fn mark_victim_pid(ctx: BtfTracePointContext) -> u32 {
    let pid: i32 = ctx.arg(0);
    emit_kill(&ctx, Victim::Pid(pid as u32));
    0
}

#[derive(Clone, Copy)]
enum Victim {
    OomControl(*const u8),
    Task(*const u8),
    Pid(u32),
}

#[inline(always)]
fn emit_kill<C: EbpfContext>(ctx: &C, victim: Victim) {
    let cfg = unsafe { core::ptr::read_volatile(&OOM_CONFIG) };
    if cfg.valid == 0 {
        return;
    }
    // The victim, the OOMing cgroup where the hook has it, and what the hook knows: the key.
    let (task, memcg, flags) = match victim {
        Victim::OomControl(oc) => {
            let Ok(task) = at::<*const u8>(oc, cfg.oc_chosen) else { return };
            let memcg = at::<*const u8>(oc, cfg.oc_memcg).unwrap_or(core::ptr::null());
            let scope = if memcg.is_null() { 0 } else { FLAG_MEMCG_OOM };
            (task, memcg, FLAG_FROM_OOM_CONTROL | scope)
        }
        Victim::Task(task) => (task, core::ptr::null(), 0),
        Victim::Pid(_) => (core::ptr::null(), core::ptr::null(), FLAG_VICTIM_PID_ONLY),
    };
    let mut slot = MaybeUninit::uninit();
    let key: &mut OomCountKey = zeroed_in(&mut slot);
    key.flags = flags as u8;
    key.generation = maps::generation();
    if !task.is_null() {
        key.comm = field(task, cfg.task.comm);
        key.cgroup_id = cgroup_id(&cfg.task, task).unwrap_or(0);
    }
    if !maps::count(&OOM_KILL_COUNTS, &OOM_KILL_OVERFLOW, 0, key) {
        return;
    }
    let Some(mut entry) = reserve::<OomKillEvent>(kind::OOM_KILL) else { return };
    // SAFETY: the entry is zeroed, a valid event (plain integers).
    unsafe {
        let ev = entry.assume_init_mut();
        ev.header.kind = kind::OOM_KILL;
        ev.header.version = VERSION;
        ev.header.timestamp_ns = bpf_ktime_get_boot_ns();
        ev.invoker_pid = ctx.pid();
        ev.invoker_tgid = ctx.tgid();
        ev.invoker_cgroup_id = bpf_get_current_cgroup_id();
        current_comm(&mut ev.invoker_comm);
        ev.flags = flags;
        match victim {
            Victim::OomControl(oc) => {
                // An exiting victim has no nsproxy: that only leaves netns at 0.
                let _ = fill_header(&cfg.task, task, &mut ev.header);
                fill_rss(&cfg, task, ev);
                fill_memcg_path(&cfg, task, ev);
                ev.totalpages = at(oc, cfg.oc_totalpages).unwrap_or(0);
                if !memcg.is_null()
                    && let Ok(cgroup) = at::<*const u8>(memcg, cfg.memcg_css_cgroup)
                    && let Ok(kn) = at::<*const u8>(cgroup, cfg.task.cgroup_kn)
                {
                    ev.oom_cgroup_id = at(kn, cfg.task.kernfs_node_id).unwrap_or(0);
                }
            }
            Victim::Task(task) => {
                let _ = fill_header(&cfg.task, task, &mut ev.header);
                fill_rss(&cfg, task, ev);
                fill_memcg_path(&cfg, task, ev);
            }
            Victim::Pid(pid) => ev.header.pid = pid,
        }
        ev.stack_bytes =
            bpf_get_stack(ctx.as_ptr(), ev.invoker_stack.as_mut_ptr().cast(), (STACK_DEPTH * 8) as u32, 0);
    }
    submit(entry);
}

/// The names of the victim's memory cgroup and its parents, innermost first: who the victim was
/// is then in the event itself, also when its container and cgroup are gone by the time the
/// agent reads it. The memory controller's cgroup, not the v2 one the header has: on a node whose
/// kubelet uses cgroup v1 only that one is the pod's.
#[inline(always)]
fn fill_memcg_path(cfg: &OomConfig, task: *const u8, ev: &mut OomKillEvent) {
    if cfg.memcg_path == 0 {
        return;
    }
    let css_set: *const u8 = field(task, cfg.task.cgroups);
    let css: *const u8 = field(css_set, cfg.css_set_memory_css);
    let cgroup: *const u8 = field(css, cfg.css_cgroup);
    let mut kn: *const u8 = field(cgroup, cfg.task.cgroup_kn);
    if kn.is_null() {
        return;
    }
    for name in ev.victim_memcg.iter_mut().take(MEMCG_PATH_LEVELS) {
        // Above the root `parent` is NULL: the names stay zero.
        string(field::<*const u8>(kn, cfg.kernfs_node_name), name);
        kn = field(kn, cfg.kernfs_node_parent);
    }
    ev.flags |= FLAG_HAS_MEMCG_PATH;
}

#[inline(always)]
fn fill_rss(cfg: &OomConfig, task: *const u8, ev: &mut OomKillEvent) {
    if let Ok(signal) = at::<*const u8>(task, cfg.task_signal)
        && let Ok(adj) = at::<i16>(signal, cfg.signal_oom_score_adj)
    {
        ev.oom_score_adj = adj.into();
        ev.flags |= FLAG_HAS_SCORE_ADJ;
    }
    let Ok(mm) = at::<*const u8>(task, cfg.task_mm) else { return };
    // The kernel's own tracepoint reads the same counters (get_mm_counter: the shared count,
    // without per-CPU deltas since 6.2): negative transient values read as 0.
    let pages = |off: u32| at::<i64>(mm, off).map(|v| v.max(0) as u64);
    if let (Ok(anon), Ok(file), Ok(shmem), Ok(total_vm)) = (
        pages(cfg.mm_rss_anon),
        pages(cfg.mm_rss_file),
        pages(cfg.mm_rss_shmem),
        at::<u64>(mm, cfg.mm_total_vm),
    ) {
        ev.anon_rss = anon;
        ev.file_rss = file;
        ev.shmem_rss = shmem;
        ev.total_vm = total_vm;
        ev.flags |= FLAG_HAS_RSS;
    }
}

impl Filtered for OomKillEvent {
    fn header(&self) -> &EventHeader {
        &self.header
    }
}
