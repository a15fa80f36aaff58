//! Packets the kernel dropped, by reason. Kernel half: `ebpf/src/probes/packet_drop.rs`; agent
//! half: `agent/src/probes/packet_drop/`.

use crate::header::EventHeader;

pub const VERSION: u32 = 1;

/// `direction`: the packet was leaving one of the namespace's sockets (it names the packet's
/// socket, and its source port is the socket's own).
pub const DIRECTION_EGRESS: u8 = 1;
/// Arriving (from a device, or owned by a socket it was delivered to).
pub const DIRECTION_INGRESS: u8 = 2;

/// `protocol`: the IP protocol number for TCP, UDP, ICMP and ICMPv6; these for the rest.
pub const PROTOCOL_OTHER_IP: u8 = 0xfe;
/// Not IPv4 or IPv6 (ARP, ...).
pub const PROTOCOL_NOT_IP: u8 = 0xff;

/// `reason` on kernels whose `kfree_skb` carries none (< 5.17).
pub const REASON_UNKNOWN: u32 = u32::MAX;

pub const FAMILY_INET: u8 = 4;
pub const FAMILY_INET6: u8 = 6;

/// `DropCountKey::flags` and `PacketDropEvent::flags`: the destination port is in the ephemeral
/// range (the key's `port` is 0).
pub const KEY_PORT_EPHEMERAL: u8 = 1 << 0;
/// The destination port is neither kept by number nor ephemeral (the key's `port` is 0).
pub const KEY_PORT_OTHER: u8 = 1 << 1;

/// One dropped packet, sent in full for the first drops of each key in an interval. Addresses
/// and ports are the packet's own (IPv4 in the first four bytes; ports in host order, 0 where the
/// protocol has none).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PacketDropEvent {
    pub header: EventHeader,
    /// Raw `enum skb_drop_reason` value (a subsystem's reason in the high 16 bits, 6.12+), or
    /// `REASON_UNKNOWN`.
    pub reason: u32,
    pub direction: u8,
    pub family: u8,
    pub protocol: u8,
    pub _pad: u8,
    pub src_port: u16,
    pub dst_port: u16,
    pub _pad2: u32,
    /// Where the kernel freed it (`kfree_skb`'s caller): which netfilter path, say.
    pub location: u64,
    pub src_addr: [u8; 16],
    pub dst_addr: [u8; 16],
}

const _: () = assert!(size_of::<PacketDropEvent>() == 112);

/// Kernel struct offsets and reason values, from the running kernel's BTF before load. `valid`
/// is 0 until then; the program does nothing until it is set.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PacketDropConfig {
    pub valid: u32,
    /// Reasons that are not drops, or say nothing: `SKB_NOT_DROPPED_YET`, `SKB_CONSUMED` (6.12+,
    /// else repeated) and `NOT_SPECIFIED` (a free that names no reason, many of them not drops).
    pub not_counted: [u32; 3],
    pub skb_sk: u32,
    pub skb_dev: u32,
    pub skb_head: u32,
    pub skb_network_header: u32,
    pub skb_protocol: u32,
    pub sk_net: u32,
    pub sk_num: u32,
    pub dev_nd_net: u32,
    pub net_ns_inum: u32,
    /// The node's ephemeral port range: a destination port in it that is not kept is counted as
    /// the class `ephemeral`.
    pub ephemeral_low: u16,
    pub ephemeral_high: u16,
}

/// A key of the in-kernel drop counters (`PACKET_DROP_COUNTS`): one `kstall_packet_drops_total`
/// series before attribution. `port` is the packet's destination port (the service it was for),
/// 0 when classed (`KEY_PORT_*`) or the protocol has none.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct DropCountKey {
    pub netns_ino: u32,
    pub reason: u32,
    pub port: u16,
    pub protocol: u8,
    pub direction: u8,
    pub flags: u8,
    /// See `crate::counter`.
    pub generation: u8,
    pub _pad: u16,
}

const _: () = assert!(size_of::<DropCountKey>() == 16);

/// Entries of `PACKET_DROP_COUNTS`: two intervals' keys. A drop whose key finds the map full is
/// counted in `PACKET_DROP_OVERFLOW` and not sent.
pub const COUNT_KEYS: u32 = 16_384;

#[cfg(feature = "user")]
mod user {
    // SAFETY: repr(C), only integer fields, no implicit padding (the padding is written out).
    unsafe impl aya::Pod for super::DropCountKey {}
    unsafe impl aya::Pod for super::PacketDropConfig {}
    unsafe impl aya::Pod for super::PacketDropEvent {}
}
