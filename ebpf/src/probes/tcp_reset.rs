//! TCP resets. Agent half: `agent/src/probes/tcp_reset.rs`; event: `common/src/tcp_reset.rs`.
//!
//! Hooks (match-proto, grep the kernel for these):
//! - `tp_btf/tcp_send_reset`: `TP_PROTO(const struct sock *sk, const struct sk_buff *skb,
//!   const enum sk_rst_reason reason)` (>= 6.10; fires also with `sk == NULL`, the no-listener
//!   reset). Before 6.10 `TP_PROTO(const struct sock *sk, const struct sk_buff *skb)`, full
//!   sockets only (`tcp_send_reset_sk_only`): the agent then attaches `kfree_skb` too.
//! - `tp_btf/kfree_skb`: `TP_PROTO(struct sk_buff *skb, void *location, enum skb_drop_reason
//!   reason[, struct sock *rx_sk])` (reason >= 5.17): a TCP segment dropped with NO_SOCKET that is
//!   not itself a RST was answered with a RST by `tcp_v{4,6}_send_reset(NULL, skb)`.
//! - `fentry/tcp_v4_send_reset`, `fentry/tcp_v6_send_reset`: `(const struct sock *sk, struct
//!   sk_buff *skb[, enum sk_rst_reason reason])`, kernels whose `kfree_skb` has no drop reason
//!   (< 5.17): the function that sends every reset, called with `sk == NULL` for the no-socket
//!   case; only those calls are reported (the tracepoint has the ones with a socket).
//! - `tp_btf/tcp_receive_reset`: `TP_PROTO(struct sock *sk)` (>= 4.15): the client side; its
//!   `skc_dport` is the destination the application dialled (NAT is invisible to it).

use core::mem::MaybeUninit;

use aya_ebpf::{
    EbpfContext,
    macros::{btf_tracepoint, fentry, map},
    maps::{Array, PerCpuArray, PerCpuHashMap},
    programs::{BtfTracePointContext, FEntryContext},
};
use kstall_common::{
    EventHeader,
    counter::Counter,
    kind,
    tcp_reset::{
        COUNT_KEYS, ConntrackOffsets, DIRECTION_RECEIVED, DIRECTION_SENT, FAMILY_INET, FAMILY_INET6,
        FLAG_HAS_CONNTRACK, FLAG_HAS_REASON, FLAG_HAS_SOCKET, HOOK_KFREE_SKB_NO_SOCKET,
        HOOK_SEND_RESET_FUNCTION, HOOK_TCP_RECEIVE_RESET, HOOK_TCP_SEND_RESET, KEY_ORIGINAL_EPHEMERAL,
        KEY_ORIGINAL_OTHER, KEY_PORT_EPHEMERAL, KEY_PORT_OTHER, ResetCountKey, TcpResetConfig, TcpResetEvent,
        VERSION,
    },
};

use crate::{
    maps::{self, Filtered, PortClass, emit},
    read::{field, typed},
    task::stamp_current,
    zero::zeroed_in,
};

/// Filled by the agent from the running kernel's BTF before load.
#[unsafe(no_mangle)]
// SAFETY: plain integers; all zero means "not configured" (`valid == 0`).
static TCP_RESET_CONFIG: TcpResetConfig = unsafe { core::mem::zeroed() };

/// Written by the agent once `struct nf_conn`'s layout is known (see `ConntrackOffsets`).
#[map]
static CONNTRACK: Array<ConntrackOffsets> = Array::with_max_entries(1, 0);

/// Every reset, counted by its series' key (see `kstall_common::counter`).
#[map]
static TCP_RESET_COUNTS: PerCpuHashMap<ResetCountKey, Counter> =
    PerCpuHashMap::with_max_entries(COUNT_KEYS, 0);

/// Resets whose key found `TCP_RESET_COUNTS` full, by direction.
#[map]
static TCP_RESET_OVERFLOW: PerCpuArray<u64> = PerCpuArray::with_max_entries(2, 0);

const AF_INET: u16 = 2;
const AF_INET6: u16 = 10;
const ETH_P_IP: u16 = 0x0800;
const ETH_P_IPV6: u16 = 0x86dd;
const IPPROTO_TCP: u8 = 6;
const TCP_FLAG_RST: u8 = 0x04;
const TCP_TIME_WAIT: u8 = 6;
const TCP_NEW_SYN_RECV: u8 = 12;
/// `skb->transport_header` when unset.
const HEADER_UNSET: u16 = 0xffff;
/// `IP_CT_IS_REPLY`: ctinfo values from here on are reply-direction packets.
const IP_CT_IS_REPLY: usize = 3;
const IP_CT_UNTRACKED: usize = 7;
const NFCT_INFOMASK: usize = 7;

/// The configuration, loaded field by field from .rodata where used: each load is then a
/// constant to the verifier (frozen read-only data), as [`typed`] loads need their offsets to be.
#[inline(always)]
fn config() -> &'static TcpResetConfig {
    // Through a volatile copy of its address: the compiler must not fold the zeroed initializer.
    let config = &raw const TCP_RESET_CONFIG;
    unsafe { &*core::ptr::read_volatile(&config) }
}

/// >= 6.10: `(sk, skb, reason)`, fires also without a socket.
#[btf_tracepoint(function = "tcp_send_reset")]
pub fn tcp_send_reset(ctx: BtfTracePointContext) -> u32 {
    let reason: u32 = ctx.arg(2);
    send_reset(&ctx, Some(reason))
}

/// Before 6.10: `(sk, skb)`, full sockets only. A separate program because the verifier rejects
/// any access to a third argument the tracepoint does not have, even on a path never taken.
#[btf_tracepoint(function = "tcp_send_reset")]
pub fn tcp_send_reset_sk_only(ctx: BtfTracePointContext) -> u32 {
    send_reset(&ctx, None)
}

/// Every program does the same in two steps: the reads the counter's key needs (the fast path,
/// taken for every reset), then, only for a reset sent in full, the rest of the event.
#[inline(always)]
fn send_reset(ctx: &BtfTracePointContext, reason: Option<u32>) -> u32 {
    let cfg = config();
    if cfg.valid == 0 {
        return 0;
    }
    let sk: *const u8 = ctx.arg(0);
    let skb: *const u8 = ctx.arg(1);
    if sk.is_null() && cfg.send_reset_skips_no_socket != 0 {
        return 0;
    }
    let mut slot = MaybeUninit::uninit();
    let ev = new_event(&mut slot, DIRECTION_SENT, HOOK_TCP_SEND_RESET);
    if let Some(reason) = reason {
        ev.reason = reason;
        ev.flags |= FLAG_HAS_REASON;
    }
    let segment = if !skb.is_null() { read_incoming_skb(cfg, ev, skb).ok() } else { None };
    if !sk.is_null() {
        ev.flags |= FLAG_HAS_SOCKET;
        if read_sock(cfg, ev, sk, segment.is_none()).is_err() && segment.is_none() {
            return 0;
        }
    } else if segment.is_none() {
        return 0;
    }
    if !counted_in_full(cfg, ev) {
        return 0;
    }
    stamp(ctx, ev);
    if !sk.is_null() {
        read_sock_detail(cfg, ev, sk, segment.is_none());
    }
    if !skb.is_null() && segment.is_some() {
        read_redirect_port(cfg, ev, skb);
    }
    emit(kind::TCP_RESET, ev);
    0
}

#[btf_tracepoint(function = "kfree_skb")]
pub fn kfree_skb_no_socket(ctx: BtfTracePointContext) -> u32 {
    let cfg = config();
    if cfg.valid == 0 {
        return 0;
    }
    let reason: u32 = ctx.arg(2);
    if reason != cfg.drop_reason_no_socket {
        return 0;
    }
    let skb: *const u8 = ctx.arg(0);
    let mut slot = MaybeUninit::uninit();
    let ev = new_event(&mut slot, DIRECTION_SENT, HOOK_KFREE_SKB_NO_SOCKET);
    ev.reason = reason;
    ev.flags |= FLAG_HAS_REASON;
    match read_incoming_skb(cfg, ev, skb) {
        // A RST is never answered with a RST.
        Ok(tcp_flags) if tcp_flags & TCP_FLAG_RST == 0 => emit_segment_reset(&ctx, cfg, ev, skb),
        _ => {}
    }
    0
}

#[fentry(function = "tcp_v4_send_reset")]
pub fn tcp_v4_send_reset(ctx: FEntryContext) -> u32 {
    send_reset_without_socket(&ctx)
}

#[fentry(function = "tcp_v6_send_reset")]
pub fn tcp_v6_send_reset(ctx: FEntryContext) -> u32 {
    send_reset_without_socket(&ctx)
}

/// The reset a segment without a socket gets (the REDIRECT to a port where nothing listens).
#[inline(always)]
fn send_reset_without_socket(ctx: &FEntryContext) -> u32 {
    let cfg = config();
    let sk: *const u8 = ctx.arg(0);
    if cfg.valid == 0 || !sk.is_null() {
        return 0;
    }
    let skb: *const u8 = ctx.arg(1);
    let mut slot = MaybeUninit::uninit();
    let ev = new_event(&mut slot, DIRECTION_SENT, HOOK_SEND_RESET_FUNCTION);
    match read_incoming_skb(cfg, ev, skb) {
        // The function returns without sending when the segment is itself a RST.
        Ok(tcp_flags) if tcp_flags & TCP_FLAG_RST == 0 => emit_segment_reset(ctx, cfg, ev, skb),
        _ => {}
    }
    0
}

/// A reset seen only through the segment that provoked it: counted, and sent in full if sampled.
#[inline(always)]
fn emit_segment_reset<C: EbpfContext>(ctx: &C, cfg: &TcpResetConfig, ev: &mut TcpResetEvent, skb: *const u8) {
    if counted_in_full(cfg, ev) {
        stamp(ctx, ev);
        read_redirect_port(cfg, ev, skb);
        emit(kind::TCP_RESET, ev);
    }
}

#[btf_tracepoint(function = "tcp_receive_reset")]
pub fn tcp_receive_reset(ctx: BtfTracePointContext) -> u32 {
    let cfg = config();
    if cfg.valid == 0 {
        return 0;
    }
    let sk: *const u8 = ctx.arg(0);
    let mut slot = MaybeUninit::uninit();
    let ev = new_event(&mut slot, DIRECTION_RECEIVED, HOOK_TCP_RECEIVE_RESET);
    ev.flags |= FLAG_HAS_SOCKET;
    if read_sock(cfg, ev, sk, true).is_ok() && counted_in_full(cfg, ev) {
        stamp(&ctx, ev);
        read_sock_detail(cfg, ev, sk, true);
        emit(kind::TCP_RESET, ev);
    }
    0
}

#[inline(always)]
fn new_event(slot: &mut MaybeUninit<TcpResetEvent>, direction: u8, hook: u8) -> &mut TcpResetEvent {
    let ev = zeroed_in(slot);
    ev.direction = direction;
    ev.hook = hook;
    ev
}

/// The header of an event sent in full: `current` and the time (the netns is the event's own).
#[inline(always)]
fn stamp<C: EbpfContext>(ctx: &C, ev: &mut TcpResetEvent) {
    stamp_current(ctx, &mut ev.header, kind::TCP_RESET, VERSION);
}

/// Counts the reset by its series' key; true when it is one of the key's resets sent in full.
#[inline(always)]
fn counted_in_full(cfg: &TcpResetConfig, ev: &TcpResetEvent) -> bool {
    let mut key = ResetCountKey {
        netns_ino: ev.header.netns_ino,
        reason: ev.reason,
        port: if ev.direction == DIRECTION_SENT { ev.local_port } else { ev.remote_port },
        orig_dst_port: 0,
        direction: ev.direction,
        hook: ev.hook,
        flags: ev.flags & FLAG_HAS_REASON,
        generation: maps::generation(),
    };
    if ev.flags & FLAG_HAS_CONNTRACK != 0 && rewritten(ev) {
        key.flags |= FLAG_HAS_CONNTRACK;
        key.orig_dst_port = ev.orig_dst_port;
    }
    // Port classes as the metric labels them, here so that a port scan makes two keys, not one
    // a port: kept ports by number, the rest `ephemeral` or `other`.
    let class = |port: u16, ephemeral_flag: u8, other_flag: u8| match maps::port_class(
        port,
        cfg.ephemeral_low,
        cfg.ephemeral_high,
    ) {
        PortClass::Kept => 0,
        PortClass::Ephemeral => ephemeral_flag,
        PortClass::Other => other_flag,
    };
    let port_class = class(key.port, KEY_PORT_EPHEMERAL, KEY_PORT_OTHER);
    if port_class != 0 {
        key.port = 0;
        key.flags |= port_class;
    }
    if key.flags & FLAG_HAS_CONNTRACK != 0 {
        let original_class = class(key.orig_dst_port, KEY_ORIGINAL_EPHEMERAL, KEY_ORIGINAL_OTHER);
        if original_class != 0 {
            key.orig_dst_port = 0;
            key.flags |= original_class;
        }
    }
    maps::count(&TCP_RESET_COUNTS, &TCP_RESET_OVERFLOW, u32::from(ev.direction), &key)
}

/// Whether NAT rewrote the destination (an untouched conntrack destination is the local end).
#[inline(always)]
fn rewritten(ev: &TcpResetEvent) -> bool {
    ev.orig_dst_port != ev.local_port || ev.orig_dst_addr != ev.local_addr
}

/// The fast path's reads of a socket (`sock_common` is the first member of full, request and
/// timewait sockets alike, so this is valid for all three): its netns, and with `ports` its
/// family and ports. Reads are best-effort ([`field`]: a failed one is zero, without a branch
/// for the verifier to walk); only the family decides whether there is an event.
#[inline(always)]
fn read_sock(cfg: &TcpResetConfig, ev: &mut TcpResetEvent, sk: *const u8, ports: bool) -> Result<(), i32> {
    let net: *const u8 = typed(sk, cfg.sk_net);
    ev.header.netns_ino = typed(net, cfg.net_ns_inum);
    if !ports {
        return Ok(());
    }
    let family: u16 = typed(sk, cfg.sk_family);
    ev.family = match family {
        AF_INET => FAMILY_INET,
        AF_INET6 => FAMILY_INET6,
        _ => return Err(-1),
    };
    ev.remote_port = u16::from_be(typed(sk, cfg.sk_dport));
    ev.local_port = typed(sk, cfg.sk_num);
    if ev.direction == DIRECTION_SENT {
        ev.state = typed::<u8>(sk, cfg.sk_state);
        ev.local_port = released_port(cfg, ev, sk);
    }
    Ok(())
}

/// A full socket closed with unread data has released its port before it sends the reset (a
/// proxy killed mid-connection): the port it sends from is still `inet_sport`. Request and
/// timewait sockets have no `inet_sock`, and always their own `skc_num`. `inet_sport` lies past
/// `struct sock`, where the verifier allows no typed load.
#[inline(always)]
fn released_port(cfg: &TcpResetConfig, ev: &TcpResetEvent, sk: *const u8) -> u16 {
    if ev.local_port == 0 && ev.state != TCP_TIME_WAIT && ev.state != TCP_NEW_SYN_RECV {
        u16::from_be(field(sk, cfg.inet_sport))
    } else {
        ev.local_port
    }
}

/// The rest of a socket's part of an event sent in full: its state and, with `addresses`, its
/// addresses.
#[inline(always)]
fn read_sock_detail(cfg: &TcpResetConfig, ev: &mut TcpResetEvent, sk: *const u8, addresses: bool) {
    ev.state = typed::<u8>(sk, cfg.sk_state);
    if !addresses {
        return;
    }
    ev.local_port = released_port(cfg, ev, sk);
    if ev.family == FAMILY_INET {
        ev.local_addr[..4].copy_from_slice(&typed::<[u8; 4]>(sk, cfg.sk_rcv_saddr));
        ev.remote_addr[..4].copy_from_slice(&typed::<[u8; 4]>(sk, cfg.sk_daddr));
    } else {
        ev.local_addr = typed(sk, cfg.sk_v6_rcv_saddr);
        ev.remote_addr = typed(sk, cfg.sk_v6_daddr);
    }
}

/// Reads the segment that provoked the reset: its destination is the local end, its source the
/// peer. Takes the netns from the receiving device and the original destination from the
/// conntrack entry (kept on the no-socket path). Returns the segment's TCP flags. Only what
/// decides whether this is a TCP segment (headers set, protocol) branches; the rest is
/// best-effort as in [`read_sock`]. All of it is the key's (the addresses tell whether NAT
/// rewrote the destination), but the redirect port ([`read_redirect_port`]).
#[inline(always)]
fn read_incoming_skb(cfg: &TcpResetConfig, ev: &mut TcpResetEvent, skb: *const u8) -> Result<u8, i32> {
    // `head` is a `char *`: an integer to the verifier, so the packet is read with the helper.
    let head: *const u8 = typed(skb, cfg.skb_head);
    let network: u16 = typed(skb, cfg.skb_network_header);
    let transport: u16 = typed(skb, cfg.skb_transport_header);
    if transport == HEADER_UNSET || head.is_null() {
        return Err(-1);
    }
    let protocol = u16::from_be(typed(skb, cfg.skb_protocol));
    let ip = head.wrapping_add(network as usize);
    // Each header read with the TCP header's first 14 bytes behind it (ports, then the flags at
    // 13): one read where no IP options or extension headers sit between, the usual case.
    let (tcp, next_to_ip): ([u8; 14], bool) = if protocol == ETH_P_IP {
        // Protocol at 9, source at 12, destination at 16.
        let header: [u8; 20 + 14] = field(ip, 0);
        if header[9] != IPPROTO_TCP {
            return Err(-1);
        }
        ev.family = FAMILY_INET;
        ev.remote_addr[..4].copy_from_slice(&header[12..16]);
        ev.local_addr[..4].copy_from_slice(&header[16..20]);
        (tcp_part(&header, 20), transport == network.wrapping_add(20))
    } else if protocol == ETH_P_IPV6 {
        // Next header at 6, source at 8, destination at 24. Extension headers may sit between;
        // the transport header offset skips them for us, so only the first next-header is checked.
        let header: [u8; 40 + 14] = field(ip, 0);
        if header[6] != IPPROTO_TCP {
            return Err(-1);
        }
        ev.family = FAMILY_INET6;
        ev.remote_addr.copy_from_slice(&header[8..24]);
        ev.local_addr.copy_from_slice(&header[24..40]);
        (tcp_part(&header, 40), transport == network.wrapping_add(40))
    } else {
        return Err(-1);
    };
    let header: [u8; 14] = if next_to_ip { tcp } else { field(head.wrapping_add(transport as usize), 0) };
    ev.remote_port = u16::from_be_bytes([header[0], header[1]]);
    ev.local_port = u16::from_be_bytes([header[2], header[3]]);
    let tcp_flags = header[13];

    let dev: *const u8 = typed(skb, cfg.skb_dev);
    let net: *const u8 = typed(dev, cfg.dev_nd_net);
    ev.header.netns_ino = typed(net, cfg.net_ns_inum);
    if cfg.skb_nfct != 0 {
        read_conntrack(cfg, ev, skb);
    }
    Ok(tcp_flags)
}

/// The 14 bytes of `header` from `at` (the TCP header behind an IP header read with it).
#[inline(always)]
fn tcp_part<const N: usize>(header: &[u8; N], at: usize) -> [u8; 14] {
    let mut tcp = [0u8; 14];
    tcp.copy_from_slice(&header[at..at + 14]);
    tcp
}

/// The segment's conntrack entry, when it is an original-direction packet's: "the destination
/// the client dialled" is in the ORIGINAL tuple's destination.
#[inline(always)]
fn conntrack_of(cfg: &TcpResetConfig, skb: *const u8) -> Option<(*const u8, ConntrackOffsets)> {
    // An integer holding the pointer and ctinfo: the entry itself is read with the helper.
    let nfct: u64 = typed(skb, cfg.skb_nfct);
    let ctinfo = nfct as usize & NFCT_INFOMASK;
    if nfct == 0 || ctinfo >= IP_CT_IS_REPLY || ctinfo == IP_CT_UNTRACKED {
        return None;
    }
    let off = *CONNTRACK.get(0)?;
    if off.valid == 0 {
        return None;
    }
    Some(((nfct as usize & !NFCT_INFOMASK) as *const u8, off))
}

#[inline(always)]
fn read_conntrack(cfg: &TcpResetConfig, ev: &mut TcpResetEvent, skb: *const u8) {
    let Some((ct, off)) = conntrack_of(cfg, skb) else { return };
    // The destination's address then its port (the agent checked they are adjacent): one read.
    let dst: [u8; 18] = field(ct, off.orig_dst_addr);
    ev.orig_dst_addr.copy_from_slice(&dst[..16]);
    ev.orig_dst_port = u16::from_be_bytes([dst[16], dst[17]]);
    ev.flags |= FLAG_HAS_CONNTRACK;
}

/// Where NAT sent the connection (the REPLY tuple's source port): detail only.
#[inline(always)]
fn read_redirect_port(cfg: &TcpResetConfig, ev: &mut TcpResetEvent, skb: *const u8) {
    if ev.flags & FLAG_HAS_CONNTRACK == 0 {
        return;
    }
    if let Some((ct, off)) = conntrack_of(cfg, skb) {
        ev.redirect_port = u16::from_be(field(ct, off.reply_src_port));
    }
}

impl Filtered for TcpResetEvent {
    fn header(&self) -> &EventHeader {
        &self.header
    }

    fn ports(&self) -> [u16; 3] {
        [self.local_port, self.remote_port, self.orig_dst_port]
    }
}
