//! NFS / SUNRPC client. Agent half: `agent/src/probes/nfs.rs`; event: `common/src/nfs.rs`.
//!
//! sunrpc and nfsv4 are modules, loaded at the first NFS mount: these are raw tracepoints (aya
//! cannot attach tp_btf in modules), loaded with the agent and attached when the agent sees the
//! module; the struct offsets come from the module's BTF at that moment, through `NFS_CONFIG`.
//! Hooks (match-proto, include/trace/events/sunrpc.h and fs/nfs/nfs4trace.h):
//!
//! - `xprt_retransmit`: `TP_PROTO(const struct rpc_rqst *rqst)`
//! - `xprt_transmit`: `TP_PROTO(const struct rpc_rqst *rqst, int status)` — where the kernel has no
//!   `xprt_retransmit` (5.10): it fires after each send, `rq_ntrans` already counting it (and
//!   taken back when the send failed), so a successful send with `rq_ntrans > 1` is a retransmit
//! - `rpc_timeout_status`: `TP_PROTO(const struct rpc_task *task)` — a major timeout, the
//!   kernel's "server ... not responding"
//! - `rpc_socket_connect`, `rpc_socket_error`, `rpc_socket_reset_connection`:
//!   `TP_PROTO(struct rpc_xprt *xprt, struct socket *socket, int error)`
//! - `xprt_lookup_rqst`: `TP_PROTO(const struct rpc_xprt *xprt, __be32 xid, int status)` — a reply
//!   arrived; reported only for a transport that had timed out ("server ... OK")
//! - `nfs4_state_mgr_failed`: `TP_PROTO(const struct nfs_client *clp, const char *section, int
//!   status)`
//!
//! - `rpc_task_begin`: `TP_PROTO(const struct rpc_task *task, const void *action)` — fired by
//!   `rpc_execute` in the task that starts the RPC, also for one rpciod runs (every READ/WRITE)
//! - `rpc_stats_latency`: `TP_PROTO(const struct rpc_task *task, ktime_t backlog, ktime_t rtt,
//!   ktime_t execute)` — an RPC with a reply ended (5.10 to 7.3; ns)
//! - `nfs_readpage_done`, `nfs_writeback_done`: `TP_PROTO(const struct rpc_task *task, const
//!   struct nfs_pgio_header *hdr)`; `nfs_commit_done`: `TP_PROTO(const struct rpc_task *task,
//!   const struct nfs_commit_data *data)` (the nfs module) — which superblock an RPC client serves
//!
//! Every event is counted in `NFS_COUNTS` by its series (netns, kind, server, error, section)
//! before it is sent; only the first of a key in an interval are sent (`kstall_common::counter`).
//! Every NFS RPC's execute time is counted in `NFS_LATENCY`, a histogram per caller's cgroup,
//! transport, procedure and RPC client; no event is sent for it.

use core::intrinsics::{AtomicOrdering, atomic_xadd};

use aya_ebpf::{
    helpers::bpf_get_current_cgroup_id,
    macros::{map, raw_tracepoint},
    maps::{Array, HashMap, LruHashMap, PerCpuArray, PerCpuHashMap},
    programs::RawTracePointContext,
};
use kstall_common::{
    EventHeader,
    counter::Counter,
    kind,
    nfs::{
        COUNT_KEYS, LATENCY_BOUNDS_NS, LATENCY_KEYS, NAME_LEN, NFS_PROGRAM, NfsConfig, NfsCountKey, NfsEvent,
        NfsLatency, NfsLatencyKey, NfsTransport, OPERATION_LEN, Operation, PROCEDURES, RPC_TASK_ASYNC,
        TRANSPORTS, VERSION, WHAT_RETRANSMIT, WHAT_SERVER_RESPONDING, WHAT_SOCKET_CONNECT, WHAT_SOCKET_ERROR,
        WHAT_SOCKET_RESET, WHAT_STATE_MGR_FAILED, WHAT_TIMEOUT,
    },
};

use crate::{
    maps::{self, Filtered},
    read::{Span, SpanBytes, field, string},
    task::stamp_current,
};

#[map]
static NFS_CONFIG: Array<NfsConfig> = Array::with_max_entries(1, 0);

/// Transports (`struct rpc_xprt *`) that had a major timeout or a failed connection and have not
/// answered since: their next reply is the server answering again.
#[map]
static NFS_UNRESPONSIVE: HashMap<u64, u8> = HashMap::with_max_entries(1024, 0);

/// NFS events by series, per CPU; read and emptied by the agent once per interval.
#[map]
static NFS_COUNTS: PerCpuHashMap<NfsCountKey, Counter> = PerCpuHashMap::with_max_entries(COUNT_KEYS, 0);

/// Where an event's key is built (the event itself fills most of the 512-byte stack): a slot per
/// kind of event, so per program. Where tracepoints run their programs preemptibly (7.3), a
/// program preempted between building its key and counting it may see another program run on its
/// CPU — never itself (the kernel skips a program's nested run) — which must not overwrite its key:
/// with one shared slot, a retransmit was counted under another series' key.
#[map]
static NFS_KEY: PerCpuArray<NfsCountKey> = PerCpuArray::with_max_entries(WHAT_STATE_MGR_FAILED + 1, 0);

/// Events whose key found `NFS_COUNTS` full.
#[map]
static NFS_OVERFLOW: PerCpuArray<u64> = PerCpuArray::with_max_entries(1, 0);

/// The cgroup of the task that started each asynchronous RPC (`struct rpc_task *` -> cgroup
/// id): it ends in rpciod, whose cgroup is nobody's.
#[map]
static NFS_CALLER: LruHashMap<u64, u64> = LruHashMap::with_max_entries(16384, 0);

/// NFS RPC execute times by caller, transport, procedure and RPC client; read and emptied by the
/// agent once per interval. One value per key, added to atomically: a hash lookup is inlined by
/// every kernel, a per-CPU one only from 6.10 (before, a helper call on every RPC).
#[map]
static NFS_LATENCY: HashMap<NfsLatencyKey, NfsLatency> = HashMap::with_max_entries(LATENCY_KEYS, 0);

/// Where the latency program copies its span of the task.
#[map]
static NFS_TASK_SPAN: PerCpuArray<SpanBytes> = PerCpuArray::with_max_entries(1, 0);

/// The superblock each RPC client serves (`struct rpc_clnt *` -> `s_dev`): an NFS mount's
/// superblock has a client of its own, and its reads, writes and commits say which it is. The
/// agent reads it for the latency keys it drains.
#[map]
static NFS_CLIENT_DEV: LruHashMap<u64, u32> = LruHashMap::with_max_entries(4096, 0);

/// Each latency key's transport: its server and namespace, written as the key is first counted
/// in an interval.
#[map]
static NFS_TRANSPORTS: LruHashMap<u64, NfsTransport> = LruHashMap::with_max_entries(TRANSPORTS, 0);

/// Each latency key's procedure name, written as the key is first counted in an interval.
#[map]
static NFS_PROCEDURES: LruHashMap<u64, Operation> = LruHashMap::with_max_entries(PROCEDURES, 0);

/// RPCs whose key found `NFS_LATENCY` full.
#[map]
static NFS_LATENCY_OVERFLOW: PerCpuArray<u64> = PerCpuArray::with_max_entries(1, 0);

const AF_INET: u16 = 2;
const EINPROGRESS: i32 = 115;
const AF_INET6: u16 = 10;

#[inline(always)]
fn config() -> Option<NfsConfig> {
    let cfg = *NFS_CONFIG.get(0)?;
    (cfg.valid != 0).then_some(cfg)
}

#[raw_tracepoint(tracepoint = "xprt_retransmit")]
pub fn nfs_xprt_retransmit(ctx: RawTracePointContext) -> i32 {
    let Some(cfg) = config() else { return 0 };
    let rqst: *const u8 = ctx.arg(0);
    let mut ev = new_event(&ctx, WHAT_RETRANSMIT);
    fill_request(&cfg, &mut ev, rqst);
    fill_task(&cfg, &mut ev, field(rqst, cfg.rqst_task));
    count_and_emit(&ev);
    0
}

#[raw_tracepoint(tracepoint = "xprt_transmit")]
pub fn nfs_xprt_transmit(ctx: RawTracePointContext) -> i32 {
    let Some(cfg) = config() else { return 0 };
    let rqst: *const u8 = ctx.arg(0);
    let status: i64 = ctx.arg(1);
    // Every RPC passes here: only a repeated transmission that went out is a retransmit.
    if status as i32 != 0 || field::<i32>(rqst, cfg.rqst_ntrans) < 2 {
        return 0;
    }
    let mut ev = new_event(&ctx, WHAT_RETRANSMIT);
    fill_request(&cfg, &mut ev, rqst);
    fill_task(&cfg, &mut ev, field(rqst, cfg.rqst_task));
    count_and_emit(&ev);
    0
}

#[raw_tracepoint(tracepoint = "rpc_timeout_status")]
pub fn nfs_rpc_timeout_status(ctx: RawTracePointContext) -> i32 {
    let Some(cfg) = config() else { return 0 };
    let task: *const u8 = ctx.arg(0);
    let mut ev = new_event(&ctx, WHAT_TIMEOUT);
    let xprt = fill_task(&cfg, &mut ev, task);
    ev.error = field(task, cfg.task_status);
    fill_request(&cfg, &mut ev, field(task, cfg.task_rqstp));
    if !xprt.is_null() {
        let _ = NFS_UNRESPONSIVE.insert(xprt as u64, 1, 0);
    }
    count_and_emit(&ev);
    0
}

#[raw_tracepoint(tracepoint = "rpc_socket_connect")]
pub fn nfs_rpc_socket_connect(ctx: RawTracePointContext) -> i32 {
    socket_event(&ctx, WHAT_SOCKET_CONNECT)
}

#[raw_tracepoint(tracepoint = "rpc_socket_error")]
pub fn nfs_rpc_socket_error(ctx: RawTracePointContext) -> i32 {
    socket_event(&ctx, WHAT_SOCKET_ERROR)
}

#[raw_tracepoint(tracepoint = "rpc_socket_reset_connection")]
pub fn nfs_rpc_socket_reset(ctx: RawTracePointContext) -> i32 {
    socket_event(&ctx, WHAT_SOCKET_RESET)
}

#[inline(always)]
fn socket_event(ctx: &RawTracePointContext, what: u32) -> i32 {
    let Some(cfg) = config() else { return 0 };
    let xprt: *const u8 = ctx.arg(0);
    let error: i64 = ctx.arg(2);
    let mut ev = new_event(ctx, what);
    ev.error = error as i32;
    fill_xprt(&cfg, &mut ev, xprt);
    // A failed connection marks the transport (every TCP connect first reports "in progress"):
    // the next reply says this client got through again, as after a server restart, which has no
    // major timeout and so no "server ... OK" from the kernel.
    let failed = what == WHAT_SOCKET_ERROR
        || (what == WHAT_SOCKET_CONNECT && ev.error != 0 && ev.error != -EINPROGRESS);
    if failed && !xprt.is_null() {
        let _ = NFS_UNRESPONSIVE.insert(xprt as u64, 1, 0);
    }
    count_and_emit(&ev);
    0
}

#[raw_tracepoint(tracepoint = "xprt_lookup_rqst")]
pub fn nfs_xprt_lookup_rqst(ctx: RawTracePointContext) -> i32 {
    let status: i64 = ctx.arg(2);
    let xprt: *const u8 = ctx.arg(0);
    let key = xprt as u64;
    // Every reply passes here: only a transport that had timed out is of interest.
    if status as i32 != 0 || unsafe { NFS_UNRESPONSIVE.get(key) }.is_none() {
        return 0;
    }
    let _ = NFS_UNRESPONSIVE.remove(key);
    let Some(cfg) = config() else { return 0 };
    let mut ev = new_event(&ctx, WHAT_SERVER_RESPONDING);
    let xid: u64 = ctx.arg(1);
    ev.xid = u32::from_be(xid as u32);
    fill_xprt(&cfg, &mut ev, xprt);
    count_and_emit(&ev);
    0
}

#[raw_tracepoint(tracepoint = "nfs4_state_mgr_failed")]
pub fn nfs4_state_mgr_failed(ctx: RawTracePointContext) -> i32 {
    let Some(cfg) = config() else { return 0 };
    if cfg.nfs_client == 0 {
        return 0;
    }
    let clp: *const u8 = ctx.arg(0);
    let section: *const u8 = ctx.arg(1);
    let status: i64 = ctx.arg(2);
    let mut ev = new_event(&ctx, WHAT_STATE_MGR_FAILED);
    ev.error = status as i32;
    fill_sockaddr(&mut ev, clp, cfg.nfs_client_addr);
    string(section, &mut ev.procedure);
    count_and_emit(&ev);
    0
}

#[raw_tracepoint(tracepoint = "rpc_task_begin")]
pub fn nfs_rpc_task_begin(ctx: RawTracePointContext) -> i32 {
    let Some(cfg) = config() else { return 0 };
    let task: *const u8 = ctx.arg(0);
    // A synchronous RPC ends in its caller, whose cgroup the latency program reads then.
    if is_async(field(task, cfg.task_flags)) {
        let _ = NFS_CALLER.insert(task as u64, unsafe { bpf_get_current_cgroup_id() }, 0);
    }
    0
}

/// Whether rpciod runs a task of these `tk_flags` to its end (every READ, WRITE and COMMIT), not
/// its caller.
#[inline(always)]
fn is_async(flags: u16) -> bool {
    flags & RPC_TASK_ASYNC != 0
}

#[raw_tracepoint(tracepoint = "rpc_stats_latency")]
pub fn nfs_rpc_stats_latency(ctx: RawTracePointContext) -> i32 {
    let Some(cfg) = config() else { return 0 };
    let task: *const u8 = ctx.arg(0);
    let execute_ns: u64 = ctx.arg(3);
    // Every NFS RPC passes here: the key is what the task points at, its fields copied with one
    // read (what they point to is read once per key and interval, in `describe`).
    let fields = Span::read(NFS_TASK_SPAN.get_ptr_mut(0), task, cfg.task_span);
    let clnt: *const u8 = fields.field(cfg.task_client);
    // rpcbind, lockd, mountd and the server's callbacks pass here too.
    if field::<u32>(clnt, cfg.clnt_prog) != NFS_PROGRAM {
        return 0;
    }
    let caller = if is_async(fields.field(cfg.task_flags)) {
        unsafe { NFS_CALLER.get(task as u64) }.copied()
    } else {
        None
    };
    let key = NfsLatencyKey {
        cgroup_id: caller.unwrap_or_else(|| unsafe { bpf_get_current_cgroup_id() }),
        transport: fields.field(cfg.task_xprt),
        procedure: fields.field(cfg.task_proc),
        client: clnt as u64,
        generation: maps::generation(),
        _pad: 0,
        _pad2: 0,
        _pad3: 0,
    };
    let mut bucket = LATENCY_BOUNDS_NS.len();
    for (i, bound) in LATENCY_BOUNDS_NS.iter().enumerate() {
        if execute_ns <= *bound {
            bucket = i;
            break;
        }
    }
    // Twice: another CPU may insert the key between this CPU's lookup and insert.
    for attempt in 0..2 {
        if let Some(latency) = NFS_LATENCY.get_ptr_mut(key) {
            // SAFETY: a live map value; other CPUs add to it too, atomically.
            let latency = unsafe { &mut *latency };
            add(&mut latency.rpcs, 1);
            add(&mut latency.sum_ns, execute_ns);
            if let Some(n) = latency.buckets.get_mut(bucket) {
                add(n, 1);
            }
            return 0;
        }
        if attempt == 0 {
            describe(&cfg, &key);
        }
        match NFS_LATENCY.insert(key, NfsLatency::default(), maps::BPF_NOEXIST) {
            Ok(()) => maps::note_insert(),
            Err(e) if e == -maps::EEXIST => {}
            Err(_) => break,
        }
    }
    if let Some(n) = NFS_LATENCY_OVERFLOW.get_ptr_mut(0) {
        unsafe { *n += 1 };
    }
    0
}

/// An atomic add whose result is unused: BPF's XADD, which every kernel's verifier and JIT know.
#[inline(always)]
fn add(counter: &mut u64, n: u64) {
    // SAFETY: an aligned u64 of a live map value.
    unsafe { atomic_xadd::<u64, u64, { AtomicOrdering::Relaxed }>(counter, n) };
}

/// Writes what a new latency key's transport and procedure are, before the key is inserted: the
/// agent, which finds the key only after, finds them too. A transport freed and another made at
/// its address within one interval would share its key until the next.
#[inline(always)]
fn describe(cfg: &NfsConfig, key: &NfsLatencyKey) {
    let xprt = key.transport as *const u8;
    let server = SockAddr::read(xprt, cfg.xprt_addr);
    let transport = NfsTransport {
        server_addr: server.addr,
        server_family: server.family,
        _pad: 0,
        netns_ino: netns_of(cfg, xprt),
    };
    let _ = NFS_TRANSPORTS.insert(key.transport, transport, 0);
    let mut operation = [0; OPERATION_LEN];
    string(field(key.procedure as *const u8, cfg.procinfo_name), &mut operation);
    let _ = NFS_PROCEDURES.insert(key.procedure, operation, 0);
}

#[raw_tracepoint(tracepoint = "nfs_readpage_done")]
pub fn nfs_readpage_done(ctx: RawTracePointContext) -> i32 {
    learn_client_dev(&ctx, |cfg| cfg.pgio_inode)
}

#[raw_tracepoint(tracepoint = "nfs_writeback_done")]
pub fn nfs_writeback_done(ctx: RawTracePointContext) -> i32 {
    learn_client_dev(&ctx, |cfg| cfg.pgio_inode)
}

#[raw_tracepoint(tracepoint = "nfs_commit_done")]
pub fn nfs_commit_done(ctx: RawTracePointContext) -> i32 {
    learn_client_dev(&ctx, |cfg| cfg.commit_inode)
}

/// Remembers the superblock of the completed data operation's RPC client.
#[inline(always)]
fn learn_client_dev(ctx: &RawTracePointContext, inode_offset: fn(&NfsConfig) -> u32) -> i32 {
    let Some(cfg) = config() else { return 0 };
    if cfg.nfs_module == 0 {
        return 0;
    }
    let task: *const u8 = ctx.arg(0);
    let data: *const u8 = ctx.arg(1);
    let clnt: u64 = field(task, cfg.task_client);
    let inode: *const u8 = field(data, inode_offset(&cfg));
    let dev: u32 = field(field(inode, cfg.inode_sb), cfg.sb_dev);
    // Every read and write passes here: write only what changed.
    if dev != 0 && unsafe { NFS_CLIENT_DEV.get(clnt) }.copied() != Some(dev) {
        let _ = NFS_CLIENT_DEV.insert(clnt, dev, 0);
    }
    0
}

/// Counts `ev` by its series and sends it when it is among the first of its key.
#[inline(always)]
fn count_and_emit(ev: &NfsEvent) {
    let labelled_by_error =
        matches!(ev.what, WHAT_SOCKET_CONNECT | WHAT_SOCKET_ERROR | WHAT_STATE_MGR_FAILED);
    let Some(key) = NFS_KEY.get_ptr_mut(ev.what) else { return };
    // SAFETY: this CPU's scratch slot of this kind of event (the usual place for what does not fit
    // the stack), written whole before it is read.
    let key = unsafe { &mut *key };
    key.netns_ino = ev.header.netns_ino;
    key.what = ev.what;
    key.error = if labelled_by_error { ev.error } else { 0 };
    key.server_family = ev.server_family;
    key._pad = 0;
    key.server_addr = ev.server_addr;
    key.section = if ev.what == WHAT_STATE_MGR_FAILED { ev.procedure } else { [0; NAME_LEN] };
    key.generation = maps::generation();
    key._pad2 = [0; 7];
    if maps::count(&NFS_COUNTS, &NFS_OVERFLOW, 0, key) {
        maps::emit(kind::NFS, ev);
    }
}

#[inline(always)]
fn new_event(ctx: &RawTracePointContext, what: u32) -> NfsEvent {
    let mut ev = NfsEvent {
        header: EventHeader::zeroed(),
        what,
        error: 0,
        xid: 0,
        ntrans: 0,
        client_id: 0,
        owner_pid: 0,
        timeout_jiffies: 0,
        server_family: 0,
        server_port: 0,
        _pad: 0,
        server_addr: [0; 16],
        program: [0; NAME_LEN],
        procedure: [0; NAME_LEN],
    };
    stamp_current(ctx, &mut ev.header, kind::NFS, VERSION);
    ev
}

// Every field below is best-effort and read without a branch (`read::field`): a NULL pointer
// on the way yields zeros, and the verifier walks one path instead of one per failed read.

/// xid, transmissions and timeout of a request.
#[inline(always)]
fn fill_request(cfg: &NfsConfig, ev: &mut NfsEvent, rqst: *const u8) {
    ev.xid = u32::from_be(field(rqst, cfg.rqst_xid));
    ev.ntrans = field::<i32>(rqst, cfg.rqst_ntrans) as u32;
    ev.timeout_jiffies = field(rqst, cfg.rqst_timeout);
}

/// Owner, client, program/procedure and transport of a task; returns the transport.
#[inline(always)]
fn fill_task(cfg: &NfsConfig, ev: &mut NfsEvent, task: *const u8) -> *const u8 {
    ev.owner_pid = field::<i32>(task, cfg.task_owner) as u32;
    let proc_info: *const u8 = field(task, cfg.task_proc);
    string(field(proc_info, cfg.procinfo_name), &mut ev.procedure);
    let clnt: *const u8 = field(task, cfg.task_client);
    ev.client_id = field(clnt, cfg.clnt_clid);
    let program: *const u8 = field(clnt, cfg.clnt_program);
    string(field(program, cfg.program_name), &mut ev.program);
    let xprt = field(task, cfg.task_xprt);
    fill_xprt(cfg, ev, xprt);
    xprt
}

/// Server address and network namespace of a transport.
#[inline(always)]
fn fill_xprt(cfg: &NfsConfig, ev: &mut NfsEvent, xprt: *const u8) {
    fill_sockaddr(ev, xprt, cfg.xprt_addr);
    ev.header.netns_ino = netns_of(cfg, xprt);
}

/// A transport's network namespace (its inode number).
#[inline(always)]
fn netns_of(cfg: &NfsConfig, xprt: *const u8) -> u32 {
    field(field(xprt, cfg.xprt_net), cfg.net_ns_inum)
}

#[inline(always)]
fn fill_sockaddr(ev: &mut NfsEvent, base: *const u8, offset: u32) {
    let server = SockAddr::read(base, offset);
    ev.server_family = server.family;
    ev.server_port = server.port;
    ev.server_addr = server.addr;
}

/// A `struct sockaddr_storage` holding a `sockaddr_in` or `sockaddr_in6`; another family leaves
/// the address zero.
struct SockAddr {
    family: u16,
    port: u16,
    addr: [u8; 16],
}

impl SockAddr {
    #[inline(always)]
    fn read(base: *const u8, offset: u32) -> Self {
        let family: u16 = field(base, offset);
        let mut addr = [0; 16];
        if family == AF_INET {
            addr[..4].copy_from_slice(&field::<[u8; 4]>(base, offset + 4));
        } else if family == AF_INET6 {
            addr = field(base, offset + 8);
        }
        Self { family, port: u16::from_be(field(base, offset + 2)), addr }
    }
}

impl Filtered for NfsEvent {
    fn header(&self) -> &EventHeader {
        &self.header
    }

    fn ports(&self) -> [u16; 3] {
        [self.server_port, 0, 0]
    }
}
