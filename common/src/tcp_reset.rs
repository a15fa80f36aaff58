//! TCP resets, sent and received. Kernel half: `ebpf/src/probes/tcp_reset.rs`; agent half:
//! `agent/src/probes/tcp_reset.rs`.

use crate::header::EventHeader;

pub const VERSION: u32 = 1;

pub const DIRECTION_SENT: u8 = 0;
pub const DIRECTION_RECEIVED: u8 = 1;

/// Which kernel hook produced the event; tells the agent which kernel enum `reason` belongs to.
pub const HOOK_TCP_SEND_RESET: u8 = 1;
pub const HOOK_TCP_RECEIVE_RESET: u8 = 2;
pub const HOOK_KFREE_SKB_NO_SOCKET: u8 = 3;
/// `fentry/tcp_v{4,6}_send_reset` with no socket (kernels without drop reasons): no reason.
pub const HOOK_SEND_RESET_FUNCTION: u8 = 4;

/// `flags` bits.
pub const FLAG_HAS_SOCKET: u8 = 1 << 0;
/// `orig_dst_*` and `redirect_port` are filled from the packet's conntrack entry.
pub const FLAG_HAS_CONNTRACK: u8 = 1 << 1;
/// `reason` is meaningful (the hook carries one).
pub const FLAG_HAS_REASON: u8 = 1 << 2;

pub const FAMILY_INET: u8 = 4;
pub const FAMILY_INET6: u8 = 6;

/// One reset. "Local" is this host's end of the connection: for a sent reset the end that refused
/// (after NAT: the redirect target), for a received reset the socket that got it. IPv4 addresses
/// use the first four bytes. Ports are in host byte order.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TcpResetEvent {
    pub header: EventHeader,
    pub direction: u8,
    pub hook: u8,
    pub family: u8,
    pub flags: u8,
    /// TCP state of the socket (kernel `TCP_*` numbering), 0 without one.
    pub state: u8,
    pub _pad: [u8; 3],
    /// Raw kernel enum value: `sk_rst_reason` for `HOOK_TCP_SEND_RESET`, `skb_drop_reason` for
    /// `HOOK_KFREE_SKB_NO_SOCKET`.
    pub reason: u32,
    pub _pad2: u32,
    pub local_port: u16,
    pub remote_port: u16,
    /// Pre-NAT destination port of the connection (conntrack ORIGINAL tuple).
    pub orig_dst_port: u16,
    /// Source port of the expected reply (conntrack REPLY tuple): the redirect target.
    pub redirect_port: u16,
    pub local_addr: [u8; 16],
    pub remote_addr: [u8; 16],
    pub orig_dst_addr: [u8; 16],
}

const _: () = assert!(size_of::<TcpResetEvent>() == 128);

/// Kernel struct offsets the programs need, resolved by the agent from the running kernel's BTF
/// (Rust eBPF has no CO-RE) and written into the program's read-only data before load. `valid` is
/// 0 until the agent has filled them; the programs do nothing until then.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TcpResetConfig {
    pub valid: u32,
    /// Fallback mode (kernels before 6.10): `tcp_send_reset` ignores socket-less calls, which the
    /// `kfree_skb` NO_SOCKET program reports instead.
    pub send_reset_skips_no_socket: u32,
    /// `SKB_DROP_REASON_NO_SOCKET` on this kernel.
    pub drop_reason_no_socket: u32,
    /// `sk_buff._nfct` (0 when the kernel has no conntrack at all).
    pub skb_nfct: u32,

    pub sk_family: u32,
    pub sk_state: u32,
    pub sk_num: u32,
    pub sk_dport: u32,
    pub sk_rcv_saddr: u32,
    pub sk_daddr: u32,
    pub sk_v6_rcv_saddr: u32,
    pub sk_v6_daddr: u32,
    pub sk_net: u32,
    pub net_ns_inum: u32,
    /// `inet_sock.inet_sport`: a full socket's source port, kept after `skc_num` is cleared (a
    /// socket closed with unread data releases its port, then sends its reset from it).
    pub inet_sport: u32,

    pub skb_head: u32,
    pub skb_network_header: u32,
    pub skb_transport_header: u32,
    pub skb_protocol: u32,
    pub skb_dev: u32,
    pub dev_nd_net: u32,
    /// The node's ephemeral port range (`net.ipv4.ip_local_port_range`): a port in it that is not
    /// kept is counted as the class `ephemeral`, so a client's random ports make no keys.
    pub ephemeral_low: u16,
    pub ephemeral_high: u16,
}

/// `struct nf_conn` offsets. In a map, not a global: where conntrack is a module, its BTF (and so
/// these offsets) may only exist after the agent started, when the first NAT rule loads it.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ConntrackOffsets {
    pub valid: u32,
    pub orig_dst_addr: u32,
    pub orig_dst_port: u32,
    pub reply_src_port: u32,
}

/// `ResetCountKey::flags`: the counted port is in the ephemeral range (`port` is 0).
pub const KEY_PORT_EPHEMERAL: u8 = 1 << 4;
/// The original destination port is in the ephemeral range (`orig_dst_port` is 0).
pub const KEY_ORIGINAL_EPHEMERAL: u8 = 1 << 5;
/// The counted port is neither kept ([`crate::counter::KeptPorts`]) nor ephemeral: the class
/// `other`.
pub const KEY_PORT_OTHER: u8 = 1 << 6;
/// The original destination port is of the class `other`.
pub const KEY_ORIGINAL_OTHER: u8 = 1 << 7;

/// A key of the in-kernel reset counters (`TCP_RESET_COUNTS`): one `kstall_tcp_resets_total`
/// series before attribution (its network namespace is attributed to a pod when the agent reads
/// it). `flags` has `FLAG_HAS_REASON`, `FLAG_HAS_CONNTRACK` (only for a rewritten destination)
/// and the `KEY_*` port classes (a classed port is 0).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct ResetCountKey {
    pub netns_ino: u32,
    /// Raw kernel enum value, as in the event.
    pub reason: u32,
    /// Sent: the refusing local port; received: the remote port.
    pub port: u16,
    /// Pre-NAT destination port of a redirected connection.
    pub orig_dst_port: u16,
    pub direction: u8,
    pub hook: u8,
    pub flags: u8,
    /// See `crate::counter`.
    pub generation: u8,
}

const _: () = assert!(size_of::<ResetCountKey>() == 16);

/// Entries of `TCP_RESET_COUNTS`: two intervals' keys. A reset whose key finds the map full is
/// counted in `TCP_RESET_OVERFLOW` (by direction) and not sent.
pub const COUNT_KEYS: u32 = 16_384;

#[cfg(feature = "user")]
mod user {
    unsafe impl aya::Pod for super::ResetCountKey {}
    // SAFETY: repr(C), only integer fields, no implicit padding (the padding is written out).
    unsafe impl aya::Pod for super::TcpResetConfig {}
    unsafe impl aya::Pod for super::ConntrackOffsets {}
    unsafe impl aya::Pod for super::TcpResetEvent {}
}
