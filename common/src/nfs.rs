//! NFS / SUNRPC client events. Kernel half: `ebpf/src/probes/nfs.rs`; agent half:
//! `agent/src/probes/nfs.rs`.

use crate::header::EventHeader;

pub const VERSION: u32 = 1;

/// `what`: which kernel event this is.
pub const WHAT_RETRANSMIT: u32 = 1;
/// A major timeout: the kernel's "server ... not responding".
pub const WHAT_TIMEOUT: u32 = 2;
pub const WHAT_SOCKET_CONNECT: u32 = 3;
pub const WHAT_SOCKET_ERROR: u32 = 4;
pub const WHAT_SOCKET_RESET: u32 = 5;
/// A reply arrived on a transport that had timed out (the kernel's "server ... OK") or failed to
/// connect.
pub const WHAT_SERVER_RESPONDING: u32 = 6;
/// NFSv4 state recovery failed (`nfs4_state_mgr_failed`): the stuck-recovery of incident 3.
pub const WHAT_STATE_MGR_FAILED: u32 = 7;

pub const NAME_LEN: usize = 32;

/// One RPC-level event of the kernel NFS client. The header's task is `current` (often a
/// kworker for writeback); `owner_pid` is the task that owns the RPC, when the event has one, and
/// `header.netns_ino` the transport's network namespace.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NfsEvent {
    pub header: EventHeader,
    pub what: u32,
    /// Status / error (negative errno), 0 when the event has none.
    pub error: i32,
    /// RPC transaction id (host order), 0 when the event has none.
    pub xid: u32,
    /// Transmissions of this request so far.
    pub ntrans: u32,
    pub client_id: u32,
    pub owner_pid: u32,
    /// The request's timeout in jiffies.
    pub timeout_jiffies: u64,
    /// Server address: `AF_INET` (2) or `AF_INET6` (10); port in host order; IPv4 in the first
    /// four bytes.
    pub server_family: u16,
    pub server_port: u16,
    pub _pad: u32,
    pub server_addr: [u8; 16],
    /// RPC program (`nfs`, `portmap`, ...) and procedure (`WRITE`, ...) names, NUL-padded; for a
    /// state-manager failure, `procedure` holds the failing section.
    pub program: [u8; NAME_LEN],
    pub procedure: [u8; NAME_LEN],
}

const _: () = assert!(size_of::<NfsEvent>() == 56 + 24 + 8 + 8 + 16 + 2 * NAME_LEN);

/// Offsets in the sunrpc (and nfsv4) modules' structs, resolved from their BTF once the module is
/// loaded; kept in a map, not a global, because that happens long after the programs load.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NfsConfig {
    pub valid: u32,
    /// 1 when the nfs_client offsets (nfsv4) are valid.
    pub nfs_client: u32,
    pub rqst_task: u32,
    pub rqst_xid: u32,
    pub rqst_ntrans: u32,
    pub rqst_timeout: u32,
    pub task_client: u32,
    pub task_xprt: u32,
    pub task_owner: u32,
    pub task_status: u32,
    pub task_rqstp: u32,
    pub task_proc: u32,
    pub clnt_clid: u32,
    pub clnt_program: u32,
    pub program_name: u32,
    pub procinfo_name: u32,
    pub xprt_addr: u32,
    pub xprt_net: u32,
    pub net_ns_inum: u32,
    pub nfs_client_addr: u32,
    /// `rpc_clnt.cl_prog`: the RPC program number, to time only NFS's RPCs.
    pub clnt_prog: u32,
    /// 1 when the nfs module's offsets below are valid: the superblock of an RPC client, learned
    /// from the data operations' completions (`nfs_pgio_header.inode`, `nfs_commit_data.inode`,
    /// then `inode.i_sb`, `super_block.s_dev`).
    pub nfs_module: u32,
    pub pgio_inode: u32,
    pub commit_inode: u32,
    pub inode_sb: u32,
    pub sb_dev: u32,
    /// `rpc_task.tk_flags` (`RPC_TASK_ASYNC`: rpciod will run it, not its caller).
    pub task_flags: u32,
    /// Where the latency program's span (`crate::span`) of an `rpc_task` starts: its procedure,
    /// client, transport and flags.
    pub task_span: u32,
}

/// `RPC_TASK_ASYNC` (include/linux/sunrpc/sched.h, the same from 5.10 to 7.3).
pub const RPC_TASK_ASYNC: u16 = 0x0001;

/// A key of the in-kernel NFS counters (`NFS_COUNTS`): one series of the NFS counters before
/// attribution (its network namespace is attributed to a pod when the agent reads it). Every
/// event kind is counted (and sampled); the metrics count retransmits, timeouts, failed
/// connects, socket errors and resets, and state-manager failures.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct NfsCountKey {
    pub netns_ino: u32,
    pub what: u32,
    /// As in the event, for the kinds whose series it splits (connects, socket errors,
    /// state-manager failures); 0 for the others, so that no series is split by a status no
    /// label shows.
    pub error: i32,
    pub server_family: u16,
    pub _pad: u16,
    pub server_addr: [u8; 16],
    /// The failing section of a state-manager failure (as the event's `procedure`), else zeros.
    pub section: [u8; NAME_LEN],
    /// See `crate::counter`.
    pub generation: u8,
    pub _pad2: [u8; 7],
}

const _: () = assert!(size_of::<NfsCountKey>() == 72);

/// Entries of `NFS_COUNTS`: two intervals' keys. An event whose key finds the map full is counted
/// in `NFS_OVERFLOW` and not sent.
pub const COUNT_KEYS: u32 = 4096;

/// The RPC program number of NFS (RFC 1813, 7530): the RPCs whose latency is timed.
pub const NFS_PROGRAM: u32 = 100003;

/// Upper bounds (ns) of the RPC latency buckets, as the histogram's `le` bounds in seconds:
/// 0.5 ms (a LAN round trip) to 30 s (past every default timeout); a last bucket counts the rest.
pub const LATENCY_BOUNDS_NS: [u64; 15] = [
    500_000,
    1_000_000,
    2_500_000,
    5_000_000,
    10_000_000,
    25_000_000,
    50_000_000,
    100_000_000,
    250_000_000,
    500_000_000,
    1_000_000_000,
    2_500_000_000,
    5_000_000_000,
    10_000_000_000,
    30_000_000_000,
];

/// Buckets of [`NfsLatency`]: one per bound and one past the last.
pub const LATENCY_BUCKETS: usize = LATENCY_BOUNDS_NS.len() + 1;

/// A key of the in-kernel RPC latency histograms (`NFS_LATENCY`): who started the RPCs (the
/// cgroup of the task that ran `rpc_execute`, also for an RPC that rpciod completes), the
/// transport, the procedure and the RPC client. Every NFS RPC builds one, so it holds what the
/// task points at, not what those point to: the transport's server and namespace
/// (`NFS_TRANSPORTS`) and the procedure's name (`NFS_PROCEDURES`) are read when a key is first
/// counted in an interval, the client's superblock is learnt from its reads and writes
/// (`NFS_CLIENT_DEV`), and the agent looks the three up as it drains the key.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct NfsLatencyKey {
    pub cgroup_id: u64,
    /// `struct rpc_xprt *`: a key of `NFS_TRANSPORTS`.
    pub transport: u64,
    /// `const struct rpc_procinfo *`: a key of `NFS_PROCEDURES`.
    pub procedure: u64,
    /// `struct rpc_clnt *`: a key of `NFS_CLIENT_DEV`.
    pub client: u64,
    /// See `crate::counter`.
    pub generation: u8,
    // Padding as integers: an array of zeros is a call to memset in the program.
    pub _pad: u8,
    pub _pad2: u16,
    pub _pad3: u32,
}

const _: () = assert!(size_of::<NfsLatencyKey>() == 40);

/// A transport's server and network namespace (`NFS_TRANSPORTS`, by `struct rpc_xprt *`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NfsTransport {
    pub server_addr: [u8; 16],
    pub server_family: u16,
    pub _pad: u16,
    /// The pod's own when it mounted for itself, whose RPCs a kernel thread sends (state renewal,
    /// commits) are still that pod's.
    pub netns_ino: u32,
}

/// A procedure's name (`READ`, `WRITE`, `GETATTR`, ...), NUL-padded (`NFS_PROCEDURES`, by
/// `const struct rpc_procinfo *`).
pub type Operation = [u8; OPERATION_LEN];

pub const OPERATION_LEN: usize = 24;

/// Entries of `NFS_TRANSPORTS` and `NFS_PROCEDURES` (LRU: a key's entry is written again each
/// interval it is counted in).
pub const TRANSPORTS: u32 = 4096;
pub const PROCEDURES: u32 = 1024;

/// One key's RPCs in an interval: how many, their summed execute time (queued, sent,
/// answered: what the caller waited), and how many fell in each bucket.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NfsLatency {
    pub rpcs: u64,
    pub sum_ns: u64,
    pub buckets: [u64; LATENCY_BUCKETS],
}

/// Entries of `NFS_LATENCY`: two intervals' keys. An RPC whose key finds the map full is
/// counted in `NFS_LATENCY_OVERFLOW`.
pub const LATENCY_KEYS: u32 = 4096;

#[cfg(feature = "user")]
mod user {
    // SAFETY: repr(C), integers only, no implicit padding (the padding is written out).
    unsafe impl aya::Pod for super::NfsLatencyKey {}
    unsafe impl aya::Pod for super::NfsLatency {}
    unsafe impl aya::Pod for super::NfsTransport {}
    unsafe impl aya::Pod for super::NfsCountKey {}
    unsafe impl aya::Pod for super::NfsConfig {}
    unsafe impl aya::Pod for super::NfsEvent {}
}
