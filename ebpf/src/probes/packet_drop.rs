//! Packets the kernel dropped, by reason. Agent half: `agent/src/probes/packet_drop/`; record:
//! `common/src/packet_drop.rs`.
//!
//! Hook (match-proto, include/trace/events/skb.h): `tp_btf/kfree_skb`: `TP_PROTO(struct sk_buff
//! *skb, void *location, enum skb_drop_reason reason[, struct sock *rx_sk])` — reason from 5.17,
//! rx_sk from 6.12 (not read: it is NULL for every netfilter drop); before 5.17 `(skb,
//! location)`, and every drop is counted with `REASON_UNKNOWN`. Only network packets count: an skb
//! without a protocol is a local socket's message (netlink, unix), and its drops are not traffic's. A packet a socket sent has
//! `skb->sk` and, before routing, no device: its namespace is the socket's; an arriving packet has
//! a device and no socket: its namespace is the device's.
//!
//! Every drop is counted in `PACKET_DROP_COUNTS` by its series (netns, reason, protocol,
//! direction, destination port or its class); only the first of a key in an interval are sent in
//! full (`kstall_common::counter`).

use core::mem::MaybeUninit;

use aya_ebpf::{
    macros::{btf_tracepoint, map},
    maps::{PerCpuArray, PerCpuHashMap},
    programs::BtfTracePointContext,
};
use kstall_common::{
    EventHeader,
    counter::Counter,
    kind,
    packet_drop::{
        COUNT_KEYS, DIRECTION_EGRESS, DIRECTION_INGRESS, DropCountKey, FAMILY_INET, FAMILY_INET6,
        KEY_PORT_EPHEMERAL, KEY_PORT_OTHER, PROTOCOL_NOT_IP, PROTOCOL_OTHER_IP, PacketDropConfig,
        PacketDropEvent, REASON_UNKNOWN, VERSION,
    },
};

use crate::{
    maps::{self, Filtered, PortClass, emit},
    read::{field, typed},
    task::stamp_current,
    zero::{Zeroable, zeroed_in},
};

/// Filled by the agent from the running kernel's BTF before load.
#[unsafe(no_mangle)]
// SAFETY: plain integers; all zero means "not configured" (`valid == 0`).
static PACKET_DROP_CONFIG: PacketDropConfig = unsafe { core::mem::zeroed() };

/// Every drop, counted by its series' key (see `kstall_common::counter`).
#[map]
static PACKET_DROP_COUNTS: PerCpuHashMap<DropCountKey, Counter> =
    PerCpuHashMap::with_max_entries(COUNT_KEYS, 0);

/// Drops whose key found `PACKET_DROP_COUNTS` full.
#[map]
static PACKET_DROP_OVERFLOW: PerCpuArray<u64> = PerCpuArray::with_max_entries(1, 0);

const ETH_P_IP: u16 = 0x0800;
const ETH_P_IPV6: u16 = 0x86dd;
const IPPROTO_ICMP: u8 = 1;
const IPPROTO_TCP: u8 = 6;
const IPPROTO_UDP: u8 = 17;
const IPPROTO_ICMPV6: u8 = 58;

/// See `tcp_reset`'s: loaded field by field, each a constant to the verifier.
#[inline(always)]
fn config() -> &'static PacketDropConfig {
    let config = &raw const PACKET_DROP_CONFIG;
    unsafe { &*core::ptr::read_volatile(&config) }
}

#[btf_tracepoint(function = "kfree_skb")]
pub fn kfree_skb_drop(ctx: BtfTracePointContext) -> u32 {
    let cfg = config();
    if cfg.valid == 0 {
        return 0;
    }
    let reason: u32 = ctx.arg(2);
    if cfg.not_counted.contains(&reason) {
        return 0;
    }
    count_and_emit(&ctx, cfg, reason);
    0
}

/// Before 5.17: no reason to read (the argument does not exist), every drop counted.
#[btf_tracepoint(function = "kfree_skb")]
pub fn kfree_skb_drop_without_reason(ctx: BtfTracePointContext) -> u32 {
    let cfg = config();
    if cfg.valid != 0 {
        count_and_emit(&ctx, cfg, REASON_UNKNOWN);
    }
    0
}

#[inline(always)]
fn count_and_emit(ctx: &BtfTracePointContext, cfg: &PacketDropConfig, reason: u32) {
    let skb: *const u8 = ctx.arg(0);
    // A local socket's message (netlink, unix) is no network packet: its protocol is unset.
    let protocol = u16::from_be(typed(skb, cfg.skb_protocol));
    if protocol == 0 {
        return;
    }
    let mut slot = MaybeUninit::<PacketDropEvent>::uninit();
    let ev = zeroed_in(&mut slot);
    ev.reason = reason;
    read_packet(cfg, ev, skb, protocol);
    if counted_in_full(cfg, ev) {
        stamp_current(ctx, &mut ev.header, kind::PACKET_DROP, VERSION);
        ev.location = ctx.arg(1);
        emit(kind::PACKET_DROP, ev);
    }
}

/// The packet's namespace, direction, protocol, addresses and ports. Best-effort reads
/// ([`typed`], [`field`]: a failed one is zero); a packet that is not IP is counted as such.
#[inline(always)]
fn read_packet(cfg: &PacketDropConfig, ev: &mut PacketDropEvent, skb: *const u8, protocol: u16) {
    let sk: *const u8 = typed(skb, cfg.skb_sk);
    let net: *const u8 = if sk.is_null() {
        let dev: *const u8 = typed(skb, cfg.skb_dev);
        typed(dev, cfg.dev_nd_net)
    } else {
        typed(sk, cfg.sk_net)
    };
    ev.header.netns_ino = typed(net, cfg.net_ns_inum);
    read_headers(cfg, ev, skb, protocol);
    // A socket's packet is leaving, but one delivered to it: to its port, from another.
    let local_port: u16 = if sk.is_null() { 0 } else { typed(sk, cfg.sk_num) };
    let delivered = local_port != 0 && ev.dst_port == local_port && ev.src_port != local_port;
    ev.direction = if sk.is_null() || delivered { DIRECTION_INGRESS } else { DIRECTION_EGRESS };
}

#[inline(always)]
fn read_headers(cfg: &PacketDropConfig, ev: &mut PacketDropEvent, skb: *const u8, protocol: u16) {
    ev.protocol = PROTOCOL_NOT_IP;
    // `head` is a `char *`: an integer to the verifier, so the packet is read with the helper.
    let head: *const u8 = typed(skb, cfg.skb_head);
    if head.is_null() {
        return;
    }
    let network: u16 = typed(skb, cfg.skb_network_header);
    let ip = head.wrapping_add(network as usize);
    let (next, ports_at) = if protocol == ETH_P_IP {
        // Header length at 0, protocol at 9, source at 12, destination at 16.
        let header: [u8; 20] = field(ip, 0);
        ev.family = FAMILY_INET;
        ev.src_addr[..4].copy_from_slice(&header[12..16]);
        ev.dst_addr[..4].copy_from_slice(&header[16..20]);
        (header[9], usize::from(header[0] & 0x0f) * 4)
    } else if protocol == ETH_P_IPV6 {
        // Next header at 6, source at 8, destination at 24; extension headers are not walked.
        let header: [u8; 40] = field(ip, 0);
        ev.family = FAMILY_INET6;
        ev.src_addr.copy_from_slice(&header[8..24]);
        ev.dst_addr.copy_from_slice(&header[24..40]);
        (header[6], 40)
    } else {
        return;
    };
    ev.protocol = match next {
        IPPROTO_TCP | IPPROTO_UDP | IPPROTO_ICMP | IPPROTO_ICMPV6 => next,
        _ => PROTOCOL_OTHER_IP,
    };
    if next == IPPROTO_TCP || next == IPPROTO_UDP {
        let ports: [u8; 4] = field(ip.wrapping_add(ports_at), 0);
        ev.src_port = u16::from_be_bytes([ports[0], ports[1]]);
        ev.dst_port = u16::from_be_bytes([ports[2], ports[3]]);
    }
}

/// Counts the drop by its series' key; true when it is one of the key's drops sent in full.
#[inline(always)]
fn counted_in_full(cfg: &PacketDropConfig, ev: &PacketDropEvent) -> bool {
    let mut key = DropCountKey {
        netns_ino: ev.header.netns_ino,
        reason: ev.reason,
        port: ev.dst_port,
        protocol: ev.protocol,
        direction: ev.direction,
        flags: 0,
        generation: maps::generation(),
        _pad: 0,
    };
    // Destination ports as the metric labels them: a storm to random ports makes two keys.
    if ev.protocol == IPPROTO_TCP || ev.protocol == IPPROTO_UDP {
        match maps::port_class(key.port, cfg.ephemeral_low, cfg.ephemeral_high) {
            PortClass::Kept => {}
            PortClass::Ephemeral => (key.port, key.flags) = (0, KEY_PORT_EPHEMERAL),
            PortClass::Other => (key.port, key.flags) = (0, KEY_PORT_OTHER),
        }
    }
    maps::count(&PACKET_DROP_COUNTS, &PACKET_DROP_OVERFLOW, 0, &key)
}

impl Filtered for PacketDropEvent {
    fn header(&self) -> &EventHeader {
        &self.header
    }

    fn ports(&self) -> [u16; 3] {
        [self.src_port, self.dst_port, 0]
    }
}

// SAFETY: repr(C) integers and arrays only: all zero is a valid value.
unsafe impl Zeroable for PacketDropEvent {}
