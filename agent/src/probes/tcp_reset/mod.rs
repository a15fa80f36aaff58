//! TCP resets, sent and received. Kernel half: `ebpf/src/probes/tcp_reset.rs`; event:
//! `common/src/tcp_reset.rs`.
//!
//! Hook choice: on kernels whose `tcp_send_reset` tracepoint carries a reason (>= 6.10) it also
//! fires for resets sent without a socket (the SYN redirected to a port where nothing listens), so
//! it is used alone. Before that it fires only with a full socket, and the no-socket resets are
//! caught as `kfree_skb` drops with reason NO_SOCKET (5.17+), or, on kernels whose `kfree_skb` has
//! no reason (5.10), by fentry on the function that sends them, `tcp_v{4,6}_send_reset` — those
//! resets then have no reason, and the events and `kstall status` say so.

pub mod event;

pub use event::*;

use std::{
    collections::HashMap,
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
};

use kstall_common::{
    EventHeader,
    counter::Counter,
    kind,
    tcp_reset::{
        self as raw, ConntrackOffsets, DIRECTION_RECEIVED, DIRECTION_SENT, FAMILY_INET, FAMILY_INET6,
        FLAG_HAS_CONNTRACK, FLAG_HAS_REASON, FLAG_HAS_SOCKET, KEY_ORIGINAL_EPHEMERAL, KEY_ORIGINAL_OTHER,
        KEY_PORT_EPHEMERAL, KEY_PORT_OTHER, ResetCountKey, TcpResetConfig, TcpResetEvent,
    },
};

use aya::{Ebpf, maps::Array};

pub use super::settings::Hook;
use super::{
    counters::CounterMap,
    error::ProbeError,
    kind::EventKind,
    payload::Payload,
    plan::{Fallback, Plan, ProbeStatus, ProgramSpec, Unavailable},
    ports::CountedPort,
    probe::{Completion, Counted, Counting, Decoding, Drained, EnumNames, Planned, Probe, Turn},
    settings::Settings,
};
use crate::{
    decode::{DecodeError, read_versioned},
    kernel_btf::KernelBtf,
};

pub const NAME: &str = "tcp-reset";

const GLOBAL: &str = "TCP_RESET_CONFIG";
const PROG_SEND: ProgramSpec = ProgramSpec::tp_btf("tcp_send_reset", "tcp_send_reset");
/// The same hook before 6.10, without the reason argument.
const PROG_SEND_SK_ONLY: ProgramSpec = ProgramSpec::tp_btf("tcp_send_reset_sk_only", "tcp_send_reset");
const PROG_RECEIVE: ProgramSpec = ProgramSpec::tp_btf("tcp_receive_reset", "tcp_receive_reset");
const PROG_NO_SOCKET: ProgramSpec = ProgramSpec::tp_btf("kfree_skb_no_socket", "kfree_skb");
/// Where `kfree_skb` has no drop reason (< 5.17): the no-socket resets where they are sent.
const PROG_SEND_V4: ProgramSpec = ProgramSpec::fentry("tcp_v4_send_reset", "tcp_v4_send_reset");
const PROG_SEND_V6: ProgramSpec = ProgramSpec::fentry("tcp_v6_send_reset", "tcp_v6_send_reset");
/// Why sent resets have no reason before 6.10, and where drops have no reason either (< 5.17).
const NO_SOCKET_REASON: &str = "tcp_send_reset has no reason before 6.10 (resets with a socket)";
const NO_REASON_AT_ALL: &str = "tcp_send_reset has no reason before 6.10 and kfree_skb no drop reason before 5.17 (no sent reset has one)";

/// The kernel enums whose value names the reasons are (read from BTF into `Decoding::enums`).
const RST_REASONS: &str = "sk_rst_reason";
const DROP_REASONS: &str = "skb_drop_reason";

/// Where the `nf_conn` offsets stand at start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Conntrack {
    Ready(ConntrackOffsets),
    /// nf_conntrack is a module not loaded yet: it comes with the first NAT rule.
    WaitingForModule,
    Unavailable,
}

/// Where the resets sent without a socket are seen.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum NoSocket {
    TcpSendReset,
    KfreeSkb,
    SendResetFunction,
}

/// Resolves everything the kernel half needs from BTF and picks the hooks.
pub fn plan(vmlinux: &KernelBtf, hook: Hook) -> Result<(Plan, EnumNames, Conntrack), ProbeError> {
    let send_has_reason = vmlinux.tracepoint_arg_count("tcp_send_reset")? >= 3;
    vmlinux.tracepoint_arg_count("tcp_receive_reset")?;
    let drop_no_socket = drop_reason_no_socket(vmlinux);
    let no_socket = match hook {
        Hook::Auto if send_has_reason => NoSocket::TcpSendReset,
        Hook::Auto if drop_no_socket.is_ok() => NoSocket::KfreeSkb,
        Hook::Auto => NoSocket::SendResetFunction,
        Hook::TcpSendReset if !send_has_reason => {
            return Err(
                "--tcp-reset-hook tcp-send-reset needs kernel >= 6.10 (tcp_send_reset without reason)".into(),
            );
        }
        Hook::TcpSendReset => NoSocket::TcpSendReset,
        Hook::KfreeSkb => NoSocket::KfreeSkb,
        Hook::SendResetFunction => NoSocket::SendResetFunction,
    };

    let mut names = EnumNames::default();
    let mut cfg = resolve_offsets(vmlinux)?;
    cfg.send_reset_skips_no_socket = u32::from(no_socket != NoSocket::TcpSendReset);
    if send_has_reason {
        names.insert(RST_REASONS, enum_names(vmlinux, RST_REASONS, "SK_RST_REASON_")?);
    }
    let mut notes = Vec::new();
    let mut unavailable = Vec::new();
    let mut programs = vec![if send_has_reason { PROG_SEND } else { PROG_SEND_SK_ONLY }, PROG_RECEIVE];
    let (hook_desc, fallback) = match no_socket {
        NoSocket::TcpSendReset => ("tp_btf/tcp_send_reset + tp_btf/tcp_receive_reset".to_string(), None),
        NoSocket::KfreeSkb => {
            if !send_has_reason {
                unavailable.push(Unavailable::new("reason", NO_SOCKET_REASON));
            }
            let (no_socket, drop_reasons) = drop_no_socket?;
            cfg.drop_reason_no_socket = no_socket;
            names.insert(DROP_REASONS, drop_reasons);
            programs.push(PROG_NO_SOCKET);
            let hook = "tp_btf/tcp_send_reset (socket resets) + tp_btf/kfree_skb reason=NO_SOCKET (no-socket \
                        resets) + tp_btf/tcp_receive_reset";
            (hook.to_string(), None)
        }
        NoSocket::SendResetFunction => {
            let functions: Vec<ProgramSpec> =
                [PROG_SEND_V4, PROG_SEND_V6].into_iter().filter(|p| vmlinux.has_function(p.target)).collect();
            if functions.is_empty() {
                return Err(
                    "no hook for resets without a socket: kfree_skb has no drop reason and the kernel \
                            has no function tcp_v4_send_reset"
                        .into(),
                );
            }
            unavailable.push(Unavailable::new("reason", NO_REASON_AT_ALL));
            let targets: Vec<&str> = functions.iter().map(|p| p.target).collect();
            let hook = format!(
                "tp_btf/tcp_send_reset (socket resets) + fentry/{{{}}} (no-socket resets) + tp_btf/tcp_receive_reset",
                targets.join(",")
            );
            // Without fentry only resets with a socket are seen: the REDIRECT case is not.
            let fallback = Fallback {
                programs: programs.clone(),
                hook: "tp_btf/tcp_send_reset + tp_btf/tcp_receive_reset (fentry refused: resets without a \
                       socket, the REDIRECT case, are not seen)"
                    .to_string(),
                unavailable: Vec::new(),
            };
            programs.extend(functions);
            (hook, Some(fallback))
        }
    };
    cfg.skb_nfct = vmlinux.offset_of("sk_buff", "_nfct").unwrap_or(0);
    let conntrack = if cfg.skb_nfct == 0 {
        unavailable.push(Unavailable::new(
            "original_dst_addr, original_dst_port, redirect_port",
            "the kernel has no conntrack (sk_buff._nfct)",
        ));
        Conntrack::Unavailable
    } else if vmlinux.has_field("nf_conn", "tuplehash") {
        let offsets = conntrack_offsets(vmlinux)?;
        notes.push(format!("{CONNTRACK_NOTE} (vmlinux BTF)"));
        Conntrack::Ready(offsets)
    } else {
        match conntrack_from_module(vmlinux) {
            Some(Ok(offsets)) => {
                notes.push(format!("{CONNTRACK_NOTE} (nf_conntrack module BTF)"));
                Conntrack::Ready(offsets)
            }
            Some(Err(e)) => {
                notes.push(format!("original destination: unavailable ({e}); original_port stays empty"));
                Conntrack::Unavailable
            }
            None => {
                notes.push(CONNTRACK_WAITING.into());
                Conntrack::WaitingForModule
            }
        }
    };

    let ephemeral = crate::kernel::ephemeral_port_range();
    (cfg.ephemeral_low, cfg.ephemeral_high) = (*ephemeral.start(), *ephemeral.end());
    cfg.valid = 1;
    let plan = Plan {
        config: Some((GLOBAL, crate::decode::bytes_of(&cfg))),
        programs,
        hook: hook_desc,
        notes,
        unavailable,
        fallback,
    };
    Ok((plan, names, conntrack))
}

/// The status note that says where original destinations come from.
pub const CONNTRACK_NOTE: &str = "original destination: conntrack";
const CONNTRACK_WAITING: &str =
    "original destination: waiting for the nf_conntrack module (loads with the first NAT rule)";

/// `nf_conn` offsets from the nf_conntrack module's BTF; `None` while it is not loaded.
pub fn conntrack_from_module(vmlinux: &KernelBtf) -> Option<Result<ConntrackOffsets, String>> {
    if !std::path::Path::new("/sys/kernel/btf/nf_conntrack").exists() {
        return None;
    }
    Some(
        vmlinux
            .module_from_sys_fs("nf_conntrack")
            .map_err(|e| e.to_string())
            .and_then(|module| conntrack_offsets(&module)),
    )
}

/// `SKB_DROP_REASON_NO_SOCKET` and every drop reason's name, where `kfree_skb` carries one.
fn drop_reason_no_socket(vmlinux: &KernelBtf) -> Result<(u32, HashMap<u32, String>), String> {
    if vmlinux.tracepoint_arg_count("kfree_skb").map_err(|e| e.to_string())? < 3 {
        return Err("kfree_skb has no drop reason (kernel < 5.17)".into());
    }
    let drop_reasons = enum_names(vmlinux, DROP_REASONS, "SKB_DROP_REASON_")?;
    let no_socket = *drop_reasons
        .iter()
        .find(|(_, name)| name.as_str() == "NO_SOCKET")
        .ok_or("BTF enum skb_drop_reason has no SKB_DROP_REASON_NO_SOCKET")?
        .0;
    Ok((no_socket, drop_reasons))
}

fn enum_names(btf: &KernelBtf, name: &str, prefix: &str) -> Result<HashMap<u32, String>, String> {
    Ok(btf
        .enum_values(name)
        .map_err(|e| e.to_string())?
        .into_iter()
        .map(|(n, v)| (v as u32, n.strip_prefix(prefix).unwrap_or(&n).to_string()))
        .collect())
}

fn resolve_offsets(btf: &KernelBtf) -> Result<TcpResetConfig, crate::kernel_btf::BtfError> {
    let sk = |path: &str| btf.offset_of("sock", &format!("__sk_common.{path}"));
    Ok(TcpResetConfig {
        sk_family: sk("skc_family")?,
        sk_state: sk("skc_state")?,
        sk_num: sk("skc_num")?,
        sk_dport: sk("skc_dport")?,
        sk_rcv_saddr: sk("skc_rcv_saddr")?,
        sk_daddr: sk("skc_daddr")?,
        sk_v6_rcv_saddr: sk("skc_v6_rcv_saddr")?,
        sk_v6_daddr: sk("skc_v6_daddr")?,
        sk_net: sk("skc_net")?,
        net_ns_inum: btf.offset_of("net", "ns.inum")?,
        inet_sport: btf.offset_of("inet_sock", "inet_sport")?,
        skb_head: btf.offset_of("sk_buff", "head")?,
        skb_network_header: btf.offset_of("sk_buff", "network_header")?,
        skb_transport_header: btf.offset_of("sk_buff", "transport_header")?,
        skb_protocol: btf.offset_of("sk_buff", "protocol")?,
        skb_dev: btf.offset_of("sk_buff", "dev")?,
        dev_nd_net: btf.offset_of("net_device", "nd_net")?,
        ..TcpResetConfig::default()
    })
}

fn conntrack_offsets(btf: &KernelBtf) -> Result<ConntrackOffsets, String> {
    let offset = |path: &str| btf.offset_of("nf_conn", path).map_err(|e| e.to_string());
    // IP_CT_DIR_ORIGINAL = 0, IP_CT_DIR_REPLY = 1.
    let offsets = ConntrackOffsets {
        valid: 1,
        orig_dst_addr: offset("tuplehash[0].tuple.dst.u3")?,
        orig_dst_port: offset("tuplehash[0].tuple.dst.u.all")?,
        reply_src_port: offset("tuplehash[1].tuple.src.u.all")?,
    };
    // The program reads the address and the port in one read.
    if offsets.orig_dst_port != offsets.orig_dst_addr + 16 {
        return Err(format!(
            "nf_conn's original destination port is not right after its address (offsets {} and {})",
            offsets.orig_dst_addr, offsets.orig_dst_port
        ));
    }
    Ok(offsets)
}

pub fn decode(ev: &TcpResetEvent, names: &EnumNames) -> Result<TcpReset, DecodeError> {
    let direction = match ev.direction {
        DIRECTION_SENT => Direction::Sent,
        DIRECTION_RECEIVED => Direction::Received,
        other => return Err(DecodeError::BadField { field: "tcp_reset.direction", value: other.into() }),
    };
    let hook = match ev.hook {
        raw::HOOK_TCP_SEND_RESET => "tcp_send_reset",
        raw::HOOK_TCP_RECEIVE_RESET => "tcp_receive_reset",
        raw::HOOK_KFREE_SKB_NO_SOCKET => "kfree_skb",
        raw::HOOK_SEND_RESET_FUNCTION if ev.family == FAMILY_INET6 => "tcp_v6_send_reset",
        raw::HOOK_SEND_RESET_FUNCTION => "tcp_v4_send_reset",
        other => return Err(DecodeError::BadField { field: "tcp_reset.hook", value: other.into() }),
    };
    let addr = |bytes: &[u8; 16]| -> Result<IpAddr, DecodeError> {
        match ev.family {
            FAMILY_INET => Ok(IpAddr::V4(Ipv4Addr::new(bytes[0], bytes[1], bytes[2], bytes[3]))),
            FAMILY_INET6 => Ok(IpAddr::V6(Ipv6Addr::from(*bytes))),
            other => Err(DecodeError::BadField { field: "tcp_reset.family", value: other.into() }),
        }
    };
    let local_addr = addr(&ev.local_addr)?;
    let remote_addr = addr(&ev.remote_addr)?;
    let (mut original_dst_addr, mut original_dst_port, mut redirect_port) = (None, None, None);
    if ev.flags & FLAG_HAS_CONNTRACK != 0 {
        let orig_addr = addr(&ev.orig_dst_addr)?;
        // Only a rewritten destination is news; an untouched one equals the local end.
        if ev.orig_dst_port != ev.local_port || orig_addr != local_addr {
            original_dst_addr = Some(orig_addr);
            original_dst_port = Some(ev.orig_dst_port);
            redirect_port = Some(ev.redirect_port);
        }
    }
    let reason = (ev.flags & FLAG_HAS_REASON != 0).then(|| reason(names, ev.hook, ev.reason));
    Ok(TcpReset {
        direction,
        hook,
        local_addr,
        local_port: ev.local_port,
        remote_addr,
        remote_port: ev.remote_port,
        original_dst_addr,
        original_dst_port,
        redirect_port,
        reason,
        tcp_state: tcp_state_name(ev.state),
        has_socket: ev.flags & FLAG_HAS_SOCKET != 0,
        unavailable: if direction == Direction::Sent && ev.flags & FLAG_HAS_REASON == 0 {
            vec!["reason"]
        } else {
            vec![]
        },
    })
}

/// A counter key and its value, read back.
pub fn decode_count(
    key: &ResetCountKey,
    counter: &Counter,
    names: &EnumNames,
) -> Result<ResetCount, DecodeError> {
    let direction = match key.direction {
        DIRECTION_SENT => Direction::Sent,
        DIRECTION_RECEIVED => Direction::Received,
        other => {
            return Err(DecodeError::BadField { field: "tcp_reset_count.direction", value: other.into() });
        }
    };
    let port = |number: u16, ephemeral_flag: u8, other_flag: u8| {
        if key.flags & ephemeral_flag != 0 {
            CountedPort::Ephemeral
        } else if key.flags & other_flag != 0 {
            CountedPort::Other
        } else {
            CountedPort::Number(number)
        }
    };
    Ok(ResetCount {
        direction,
        port: port(key.port, KEY_PORT_EPHEMERAL, KEY_PORT_OTHER),
        original_port: (key.flags & FLAG_HAS_CONNTRACK != 0)
            .then(|| port(key.orig_dst_port, KEY_ORIGINAL_EPHEMERAL, KEY_ORIGINAL_OTHER)),
        reason: (key.flags & FLAG_HAS_REASON != 0).then(|| reason(names, key.hook, key.reason)),
        resets: counter.events,
        suppressed: counter.suppressed(),
    })
}

/// The resets counted without a key (the map was full), of `direction`.
pub fn overflow_count(direction: Direction, resets: u64) -> ResetCount {
    ResetCount {
        direction,
        port: CountedPort::Overflow,
        original_port: None,
        reason: None,
        resets,
        suppressed: resets,
    }
}

/// A reason's name: a drop reason for the no-socket drops, else a reset reason.
fn reason(names: &EnumNames, hook: u8, value: u32) -> String {
    names.name(if hook == raw::HOOK_KFREE_SKB_NO_SOCKET { DROP_REASONS } else { RST_REASONS }, value)
}

/// Kernel `TCP_*` socket states (include/net/tcp_states.h; stable ABI, also in uapi).
fn tcp_state_name(state: u8) -> Option<&'static str> {
    Some(match state {
        1 => "ESTABLISHED",
        2 => "SYN_SENT",
        3 => "SYN_RECV",
        4 => "FIN_WAIT1",
        5 => "FIN_WAIT2",
        6 => "TIME_WAIT",
        7 => "CLOSE",
        8 => "CLOSE_WAIT",
        9 => "LAST_ACK",
        10 => "LISTEN",
        11 => "CLOSING",
        12 => "NEW_SYN_RECV",
        _ => return None,
    })
}

/// The probe, as the registry lists it.
pub struct TcpResetProbe;

impl Probe for TcpResetProbe {
    fn name(&self) -> &'static str {
        NAME
    }

    fn record_kind(&self) -> u32 {
        kind::TCP_RESET
    }

    fn events(&self) -> &'static [EventKind] {
        &[RESET, RESET_COUNT]
    }

    fn plan(
        &self,
        vmlinux: &KernelBtf,
        settings: &Settings,
        decoding: &mut Decoding,
    ) -> Result<Planned, ProbeError> {
        let (plan, names, conntrack) = plan(vmlinux, settings.tcp_reset_hook)?;
        decoding.enums.extend(names);
        let completion = OriginalDestinations { conntrack, waiting: false };
        Ok(Planned { programs: Some(plan), completion: Some(Box::new(completion)) })
    }

    fn counting(&self, ebpf: &mut Ebpf) -> Result<Option<Box<dyn Counting>>, String> {
        let counts = CounterMap::take(ebpf, "TCP_RESET_COUNTS", "TCP_RESET_OVERFLOW", 2)?;
        Ok(Some(Box::new(ResetCounts(counts))))
    }

    fn decode(
        &self,
        header: &EventHeader,
        record: &[u8],
        decoding: &Decoding,
    ) -> Result<Payload, DecodeError> {
        let raw: TcpResetEvent = read_versioned(header, record, raw::VERSION, "tcp_reset event")?;
        Ok(Payload::TcpReset(decode(&raw, &decoding.enums)?))
    }

    #[cfg(test)]
    fn samples(&self) -> Vec<Payload> {
        let names = EnumNames::default();
        vec![
            Payload::TcpReset(decode(&tests::redirected_syn_reset(), &names).expect("sample")),
            Payload::TcpResetCount(
                decode_count(&tests::redirected_count_key(), &Counter { events: 5, emitted: 1 }, &names)
                    .expect("sample"),
            ),
        ]
    }
}

/// The resets counted in the kernel, by series; the overflow slots are by direction.
struct ResetCounts(CounterMap<ResetCountKey>);

impl Counting for ResetCounts {
    fn drain(&mut self, turn: Turn, decoding: &Decoding, drained: &mut Drained) -> Result<(), String> {
        let mut counted = Vec::new();
        let result = self.0.drain(turn, &mut counted);
        for (key, counter) in counted {
            match decode_count(&key, &counter, &decoding.enums) {
                Ok(count) => drained.counts.push(by_netns(key.netns_ino, count)),
                Err(e) => drained.errors.push(e),
            }
        }
        for (new, direction) in result?.into_iter().zip([Direction::Sent, Direction::Received]) {
            if new > 0 {
                drained.counts.push(by_netns(0, overflow_count(direction, new)));
            }
        }
        Ok(())
    }
}

fn by_netns(netns: u32, count: ResetCount) -> Counted {
    Counted { probe: NAME, netns, cgroup_id: 0, comm: String::new(), payload: Payload::TcpResetCount(count) }
}

/// Original destinations need `nf_conn`'s layout: from vmlinux at start, or from the nf_conntrack
/// module's BTF once it loads (the first NAT rule loads it).
struct OriginalDestinations {
    conntrack: Conntrack,
    waiting: bool,
}

impl Completion for OriginalDestinations {
    fn on_load(&mut self, ebpf: &mut Ebpf, status: &mut ProbeStatus) {
        if !status.up {
            return;
        }
        match self.conntrack {
            Conntrack::Ready(offsets) => {
                if let Err(e) = set_conntrack_offsets(ebpf, offsets) {
                    status.notes.push(format!("original destination: {e}"));
                }
            }
            Conntrack::WaitingForModule => self.waiting = true,
            Conntrack::Unavailable => {}
        }
    }

    fn waiting(&self) -> bool {
        self.waiting
    }

    fn on_modules(&mut self, ebpf: &mut Ebpf, status: &mut ProbeStatus) -> bool {
        if !std::path::Path::new("/sys/kernel/btf/nf_conntrack").exists() {
            return false;
        }
        let result = match KernelBtf::vmlinux_from_sys_fs() {
            Ok(vmlinux) => match conntrack_from_module(&vmlinux) {
                Some(result) => result,
                None => return false,
            },
            Err(e) => Err(e.to_string()),
        };
        self.waiting = false;
        let note = match result.and_then(|offsets| set_conntrack_offsets(ebpf, offsets)) {
            Ok(()) => format!("{CONNTRACK_NOTE} (nf_conntrack module BTF, loaded after start)"),
            Err(e) => format!("original destination: unavailable ({e}); original_port stays empty"),
        };
        tracing::info!(note, "nf_conntrack appeared");
        status.notes.retain(|n| !n.starts_with("original destination"));
        status.notes.push(note);
        true
    }
}

fn set_conntrack_offsets(ebpf: &mut Ebpf, offsets: ConntrackOffsets) -> Result<(), String> {
    let mut map: Array<_, ConntrackOffsets> =
        Array::try_from(ebpf.map_mut("CONNTRACK").ok_or("map CONNTRACK missing from the eBPF object")?)
            .map_err(|e| e.to_string())?;
    map.set(0, offsets, 0).map_err(|e| e.to_string())
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::kernel_btf::tests::{kernel, testdata};

    pub(crate) fn redirected_syn_reset() -> TcpResetEvent {
        let mut header = EventHeader::zeroed();
        header.kind = kind::TCP_RESET;
        header.version = raw::VERSION;
        header.netns_ino = 4026532999;
        let mut ev = TcpResetEvent {
            header,
            direction: DIRECTION_SENT,
            hook: raw::HOOK_TCP_SEND_RESET,
            family: FAMILY_INET,
            flags: FLAG_HAS_CONNTRACK | FLAG_HAS_REASON,
            state: 0,
            _pad: [0; 3],
            reason: 1,
            _pad2: 0,
            local_port: 15001,
            remote_port: 40000,
            orig_dst_port: 2049,
            redirect_port: 15001,
            local_addr: [0; 16],
            remote_addr: [0; 16],
            orig_dst_addr: [0; 16],
        };
        ev.local_addr[..4].copy_from_slice(&[127, 0, 0, 1]);
        ev.remote_addr[..4].copy_from_slice(&[127, 0, 0, 1]);
        ev.orig_dst_addr[..4].copy_from_slice(&[10, 0, 0, 5]);
        ev
    }

    /// The counter key of [`redirected_syn_reset`]'s series.
    pub(crate) fn redirected_count_key() -> ResetCountKey {
        ResetCountKey {
            netns_ino: 4026532999,
            reason: 1,
            port: 15001,
            orig_dst_port: 2049,
            direction: DIRECTION_SENT,
            hook: raw::HOOK_TCP_SEND_RESET,
            flags: FLAG_HAS_CONNTRACK | FLAG_HAS_REASON,
            generation: 1,
        }
    }

    #[test]
    fn decodes_a_count_with_its_port_classes() {
        let counter = Counter { events: 900, emitted: 32 };
        let count = decode_count(&redirected_count_key(), &counter, &names_6_18()).unwrap();
        assert_eq!(count.direction, Direction::Sent);
        assert_eq!(
            (count.port, count.original_port),
            (CountedPort::Number(15001), Some(CountedPort::Number(2049)))
        );
        assert_eq!(count.reason.as_deref(), Some("NO_SOCKET"));
        assert_eq!((count.resets, count.suppressed), (900, 868));
        assert_eq!(count.redirected_port(), Some(2049));
        let json = serde_json::to_value(&count).unwrap();
        assert_eq!((json["port"].as_str(), json["original_port"].as_str()), (Some("15001"), Some("2049")));

        let mut key = redirected_count_key();
        key.flags = KEY_PORT_EPHEMERAL | FLAG_HAS_CONNTRACK | KEY_ORIGINAL_EPHEMERAL;
        let count = decode_count(&key, &counter, &names_6_18()).unwrap();
        assert_eq!((count.port, count.original_port), (CountedPort::Ephemeral, Some(CountedPort::Ephemeral)));
        assert_eq!((count.reason.as_deref(), count.redirected_port()), (None, None));
        key.flags = KEY_PORT_OTHER | FLAG_HAS_CONNTRACK | KEY_ORIGINAL_OTHER;
        let count = decode_count(&key, &counter, &names_6_18()).unwrap();
        assert_eq!((count.port, count.original_port), (CountedPort::Other, Some(CountedPort::Other)));
        assert_eq!(serde_json::to_value(&count).unwrap()["port"], "other");
        key.flags = 0;
        assert_eq!(decode_count(&key, &counter, &names_6_18()).unwrap().original_port, None);
        key.direction = 7;
        assert!(matches!(
            decode_count(&key, &counter, &names_6_18()),
            Err(DecodeError::BadField { field: "tcp_reset_count.direction", .. })
        ));
    }

    fn names_6_18() -> EnumNames {
        plan(&kernel("6.18"), Hook::TcpSendReset).unwrap().1
    }

    #[test]
    fn decodes_a_redirected_reset() {
        let reset = decode(&redirected_syn_reset(), &names_6_18()).unwrap();
        assert_eq!(reset.direction, Direction::Sent);
        assert_eq!(reset.local_port, 15001);
        assert_eq!(reset.original_dst_port, Some(2049));
        assert_eq!(reset.original_dst_addr, Some("10.0.0.5".parse().unwrap()));
        assert_eq!(reset.redirect_port, Some(15001));
        assert_eq!(reset.reason.as_deref(), Some("NO_SOCKET"));
    }

    #[test]
    fn an_untouched_conntrack_destination_is_not_a_redirect() {
        let mut ev = redirected_syn_reset();
        ev.orig_dst_port = ev.local_port;
        ev.orig_dst_addr = ev.local_addr;
        let reset = decode(&ev, &names_6_18()).unwrap();
        assert_eq!(reset.original_dst_port, None);
    }

    #[test]
    fn bad_enum_bytes_are_errors() {
        for (mutate, field) in [
            (
                Box::new(|e: &mut TcpResetEvent| e.direction = 9) as Box<dyn Fn(&mut TcpResetEvent)>,
                "tcp_reset.direction",
            ),
            (Box::new(|e: &mut TcpResetEvent| e.hook = 0), "tcp_reset.hook"),
            (Box::new(|e: &mut TcpResetEvent| e.family = 3), "tcp_reset.family"),
        ] {
            let mut ev = redirected_syn_reset();
            mutate(&mut ev);
            match decode(&ev, &EnumNames::default()) {
                Err(DecodeError::BadField { field: f, .. }) => assert_eq!(f, field),
                other => panic!("{field}: {other:?}"),
            }
        }
    }

    #[test]
    fn picks_the_no_socket_fallback_before_6_10() {
        let (plan_6_1, names, _) = plan(&kernel("6.1"), Hook::Auto).unwrap();
        assert!(plan_6_1.programs.iter().any(|p| p.target == "kfree_skb"), "{:?}", plan_6_1.hook);
        // 6.1's tcp_send_reset has no reason argument: the program must not touch one.
        assert!(plan_6_1.programs.iter().any(|p| p.program == "tcp_send_reset_sk_only"));
        assert!(!plan_6_1.programs.iter().any(|p| p.program == "tcp_send_reset"));
        assert_eq!(names.name(DROP_REASONS, 2), "NO_SOCKET");
        assert_eq!(plan_6_1.unavailable, [Unavailable::new("reason", NO_SOCKET_REASON)]);
        let (plan_6_12, ..) = plan(&kernel("6.12"), Hook::Auto).unwrap();
        assert!(!plan_6_12.programs.iter().any(|p| p.target == "kfree_skb"), "{:?}", plan_6_12.hook);
        assert!(plan(&kernel("6.1"), Hook::TcpSendReset).is_err());
        let (forced, ..) = plan(&kernel("6.18"), Hook::KfreeSkb).unwrap();
        assert!(forced.programs.iter().any(|p| p.target == "kfree_skb"));
    }

    /// 5.10: no reason on tcp_send_reset, none on kfree_skb: fentry where the resets are sent,
    /// falling back to socket resets only (said so) where fentry is refused.
    #[test]
    fn without_drop_reasons_the_no_socket_resets_come_from_the_send_functions() {
        let (p, names, conntrack) = plan(&kernel("5.10"), Hook::Auto).unwrap();
        let targets: Vec<&str> = p.programs.iter().map(|p| p.target).collect();
        assert_eq!(
            targets,
            ["tcp_send_reset", "tcp_receive_reset", "tcp_v4_send_reset", "tcp_v6_send_reset"]
        );
        assert!(p.programs.iter().any(|p| p.program == "tcp_send_reset_sk_only"));
        assert_eq!(p.unavailable, [Unavailable::new("reason", NO_REASON_AT_ALL)]);
        assert!(!names.has(DROP_REASONS));
        let fallback = p.fallback.unwrap();
        let targets: Vec<&str> = fallback.programs.iter().map(|p| p.target).collect();
        assert_eq!(targets, ["tcp_send_reset", "tcp_receive_reset"]);
        assert!(fallback.hook.contains("not seen"), "{}", fallback.hook);
        // 5.10's vmlinux describes nf_conn: original destinations need no module BTF.
        assert!(matches!(conntrack, Conntrack::Ready(_)), "{conntrack:?}");
        assert!(plan(&kernel("5.10"), Hook::KfreeSkb).err().is_some_and(|e| e.to_string().contains("5.17")));
        // Forced on a newer kernel (how the matrix tests the fallback on every kernel).
        let (forced, ..) = plan(&kernel("6.12"), Hook::SendResetFunction).unwrap();
        assert!(forced.programs.iter().any(|p| p.target == "tcp_v4_send_reset"));
        let (auto_7_3, ..) = plan(&kernel("7.3"), Hook::Auto).unwrap();
        assert_eq!(auto_7_3.hook, "tp_btf/tcp_send_reset + tp_btf/tcp_receive_reset");
    }

    #[test]
    fn a_sent_reset_without_a_reason_says_it_is_unavailable() {
        let mut ev = redirected_syn_reset();
        ev.hook = raw::HOOK_SEND_RESET_FUNCTION;
        ev.flags &= !FLAG_HAS_REASON;
        let reset = decode(&ev, &EnumNames::default()).unwrap();
        assert_eq!((reset.hook, reset.reason.as_deref()), ("tcp_v4_send_reset", None));
        assert_eq!(reset.unavailable, ["reason"]);
        let json = serde_json::to_value(&reset).unwrap();
        assert_eq!(json["unavailable"], serde_json::json!(["reason"]));
        ev.flags |= FLAG_HAS_REASON;
        ev.hook = raw::HOOK_TCP_SEND_RESET;
        assert!(decode(&ev, &EnumNames::default()).unwrap().unavailable.is_empty());
    }

    #[test]
    fn offsets_resolve_on_every_kernel_and_differ_where_kernels_differ() {
        let mut seen = Vec::new();
        for k in crate::kernel_btf::tests::KERNELS {
            let btf = kernel(k);
            let cfg = resolve_offsets(&btf).unwrap_or_else(|e| panic!("{k}: {e}"));
            let ct = if btf.has_field("nf_conn", "tuplehash") {
                btf
            } else {
                btf.module_from_bytes(&testdata(k, "nf_conntrack")).unwrap()
            };
            let ct = conntrack_offsets(&ct).unwrap();
            assert_eq!(cfg.sk_num, cfg.sk_dport + 2, "{k}");
            assert!(cfg.inet_sport > cfg.sk_num, "inet_sock extends sock: {k}");
            assert!(ct.reply_src_port > ct.orig_dst_port, "{k}");
            seen.push((cfg, ct));
        }
        // The point of resolving at load time: one binary, different layouts.
        assert!(seen.windows(2).any(|w| w[0] != w[1]));
    }
}
