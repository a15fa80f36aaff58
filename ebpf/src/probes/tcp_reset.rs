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

use aya_ebpf::{
    EbpfContext,
    macros::{btf_tracepoint, fentry, map},
    maps::Array,
    programs::{BtfTracePointContext, FEntryContext},
};
use kstall_common::{
    EventHeader, kind,
    tcp_reset::{
        ConntrackOffsets, DIRECTION_RECEIVED, DIRECTION_SENT, FAMILY_INET, FAMILY_INET6, FLAG_HAS_CONNTRACK,
        FLAG_HAS_REASON, FLAG_HAS_SOCKET, HOOK_KFREE_SKB_NO_SOCKET, HOOK_SEND_RESET_FUNCTION,
        HOOK_TCP_RECEIVE_RESET, HOOK_TCP_SEND_RESET, TcpResetConfig, TcpResetEvent, VERSION,
    },
};

use crate::{
    maps::{Filtered, emit},
    read::{at, field},
    task::current_header,
};

/// Filled by the agent from the running kernel's BTF before load.
#[unsafe(no_mangle)]
// SAFETY: plain integers; all zero means "not configured" (`valid == 0`).
static TCP_RESET_CONFIG: TcpResetConfig = unsafe { core::mem::zeroed() };

/// Written by the agent once `struct nf_conn`'s layout is known (see `ConntrackOffsets`).
#[map]
static CONNTRACK: Array<ConntrackOffsets> = Array::with_max_entries(1, 0);

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

#[inline(always)]
fn config() -> TcpResetConfig {
    // Volatile: the verifier must see a load from .rodata the agent patched, not a folded zero.
    unsafe { core::ptr::read_volatile(&TCP_RESET_CONFIG) }
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
    let mut ev = new_event(ctx, DIRECTION_SENT, HOOK_TCP_SEND_RESET);
    if let Some(reason) = reason {
        ev.reason = reason;
        ev.flags |= FLAG_HAS_REASON;
    }
    let filled = if !skb.is_null() { fill_from_incoming_skb(&cfg, &mut ev, skb).is_ok() } else { false };
    if !sk.is_null() {
        ev.flags |= FLAG_HAS_SOCKET;
        if fill_from_sock(&cfg, &mut ev, sk, !filled).is_err() && !filled {
            return 0;
        }
    } else if !filled {
        return 0;
    }
    emit(kind::TCP_RESET, &ev);
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
    let mut ev = new_event(&ctx, DIRECTION_SENT, HOOK_KFREE_SKB_NO_SOCKET);
    ev.reason = reason;
    ev.flags |= FLAG_HAS_REASON;
    match fill_from_incoming_skb(&cfg, &mut ev, skb) {
        // A RST is never answered with a RST.
        Ok(tcp_flags) if tcp_flags & TCP_FLAG_RST == 0 => emit(kind::TCP_RESET, &ev),
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
    let mut ev = new_event(ctx, DIRECTION_SENT, HOOK_SEND_RESET_FUNCTION);
    match fill_from_incoming_skb(&cfg, &mut ev, skb) {
        // The function returns without sending when the segment is itself a RST.
        Ok(tcp_flags) if tcp_flags & TCP_FLAG_RST == 0 => emit(kind::TCP_RESET, &ev),
        _ => {}
    }
    0
}

#[btf_tracepoint(function = "tcp_receive_reset")]
pub fn tcp_receive_reset(ctx: BtfTracePointContext) -> u32 {
    let cfg = config();
    if cfg.valid == 0 {
        return 0;
    }
    let sk: *const u8 = ctx.arg(0);
    let mut ev = new_event(&ctx, DIRECTION_RECEIVED, HOOK_TCP_RECEIVE_RESET);
    ev.flags |= FLAG_HAS_SOCKET;
    if fill_from_sock(&cfg, &mut ev, sk, true).is_ok() {
        emit(kind::TCP_RESET, &ev);
    }
    0
}

#[inline(always)]
fn new_event<C: EbpfContext>(ctx: &C, direction: u8, hook: u8) -> TcpResetEvent {
    let header = current_header(ctx, kind::TCP_RESET, VERSION);
    TcpResetEvent {
        header,
        direction,
        hook,
        family: 0,
        flags: 0,
        state: 0,
        _pad: [0; 3],
        reason: 0,
        _pad2: 0,
        local_port: 0,
        remote_port: 0,
        orig_dst_port: 0,
        redirect_port: 0,
        local_addr: [0; 16],
        remote_addr: [0; 16],
        orig_dst_addr: [0; 16],
    }
}

/// Fills addresses and ports from a socket (`sock_common` is the first member of full, request
/// and timewait sockets alike, so this is valid for all three). With `addresses == false` only the
/// netns and state are taken (the packet already gave the rest). Reads are best-effort
/// ([`field`]: a failed one is zero, without a branch for the verifier to walk); only the family
/// decides whether there is an event.
#[inline(always)]
fn fill_from_sock(
    cfg: &TcpResetConfig,
    ev: &mut TcpResetEvent,
    sk: *const u8,
    addresses: bool,
) -> Result<(), i32> {
    let net: *const u8 = field(sk, cfg.sk_net);
    ev.header.netns_ino = field(net, cfg.net_ns_inum);
    ev.state = field::<u8>(sk, cfg.sk_state);
    if !addresses {
        return Ok(());
    }
    let family: u16 = field(sk, cfg.sk_family);
    ev.local_port = field(sk, cfg.sk_num);
    // A full socket closed with unread data has released its port before it sends the reset
    // (a proxy killed mid-connection): the port it sends from is still `inet_sport`. Request
    // and timewait sockets have no `inet_sock`, and always their own `skc_num`.
    if ev.local_port == 0 && ev.state != TCP_TIME_WAIT && ev.state != TCP_NEW_SYN_RECV {
        ev.local_port = u16::from_be(field(sk, cfg.inet_sport));
    }
    ev.remote_port = u16::from_be(field(sk, cfg.sk_dport));
    if family == AF_INET {
        ev.family = FAMILY_INET;
        ev.local_addr[..4].copy_from_slice(&field::<[u8; 4]>(sk, cfg.sk_rcv_saddr));
        ev.remote_addr[..4].copy_from_slice(&field::<[u8; 4]>(sk, cfg.sk_daddr));
    } else if family == AF_INET6 {
        ev.family = FAMILY_INET6;
        ev.local_addr = field(sk, cfg.sk_v6_rcv_saddr);
        ev.remote_addr = field(sk, cfg.sk_v6_daddr);
    } else {
        return Err(-1);
    }
    Ok(())
}

/// Fills the event from the segment that provoked the reset: its destination is the local end,
/// its source the peer. Takes the netns from the receiving device and the original destination
/// from the conntrack entry (kept on the no-socket path). Returns the segment's TCP flags. Only
/// what decides whether this is a TCP segment (headers set, protocol) branches; the rest is
/// best-effort as in [`fill_from_sock`].
#[inline(always)]
fn fill_from_incoming_skb(cfg: &TcpResetConfig, ev: &mut TcpResetEvent, skb: *const u8) -> Result<u8, i32> {
    let head: *const u8 = field(skb, cfg.skb_head);
    let network: u16 = field(skb, cfg.skb_network_header);
    let transport: u16 = at(skb, cfg.skb_transport_header)?;
    if transport == HEADER_UNSET || head.is_null() {
        return Err(-1);
    }
    let protocol = u16::from_be(field(skb, cfg.skb_protocol));
    let ip = head.wrapping_add(network as usize);
    if protocol == ETH_P_IP {
        if field::<u8>(ip, 9) != IPPROTO_TCP {
            return Err(-1);
        }
        ev.family = FAMILY_INET;
        ev.remote_addr[..4].copy_from_slice(&field::<[u8; 4]>(ip, 12));
        ev.local_addr[..4].copy_from_slice(&field::<[u8; 4]>(ip, 16));
    } else if protocol == ETH_P_IPV6 {
        // Extension headers may sit between; the transport header offset skips them for us, so
        // only the first next-header is checked here.
        if field::<u8>(ip, 6) != IPPROTO_TCP {
            return Err(-1);
        }
        ev.family = FAMILY_INET6;
        ev.remote_addr = field(ip, 8);
        ev.local_addr = field(ip, 24);
    } else {
        return Err(-1);
    }
    let tcp = head.wrapping_add(transport as usize);
    // Source and destination port, then (at 13) the flags: one read of the first 14 bytes.
    let header: [u8; 14] = field(tcp, 0);
    ev.remote_port = u16::from_be_bytes([header[0], header[1]]);
    ev.local_port = u16::from_be_bytes([header[2], header[3]]);
    let tcp_flags = header[13];

    let dev: *const u8 = field(skb, cfg.skb_dev);
    let net: *const u8 = field(dev, cfg.dev_nd_net);
    ev.header.netns_ino = field(net, cfg.net_ns_inum);
    if cfg.skb_nfct != 0 {
        fill_conntrack(cfg, ev, skb);
    }
    Ok(tcp_flags)
}

#[inline(always)]
fn fill_conntrack(cfg: &TcpResetConfig, ev: &mut TcpResetEvent, skb: *const u8) {
    let nfct: u64 = field(skb, cfg.skb_nfct);
    let ctinfo = nfct as usize & NFCT_INFOMASK;
    // Only original-direction packets have "the destination the client dialled" in ORIGINAL.dst.
    if nfct == 0 || ctinfo >= IP_CT_IS_REPLY || ctinfo == IP_CT_UNTRACKED {
        return;
    }
    let Some(off) = CONNTRACK.get(0) else { return };
    if off.valid == 0 {
        return;
    }
    let ct = (nfct as usize & !NFCT_INFOMASK) as *const u8;
    ev.orig_dst_port = u16::from_be(field(ct, off.orig_dst_port));
    ev.redirect_port = u16::from_be(field(ct, off.reply_src_port));
    ev.orig_dst_addr = field(ct, off.orig_dst_addr);
    ev.flags |= FLAG_HAS_CONNTRACK;
}

impl Filtered for TcpResetEvent {
    fn header(&self) -> &EventHeader {
        &self.header
    }

    fn ports(&self) -> [u16; 3] {
        [self.local_port, self.remote_port, self.orig_dst_port]
    }
}
