//! Packets the kernel dropped, by reason, per pod. Kernel half: `ebpf/src/probes/packet_drop.rs`;
//! record: `common/src/packet_drop.rs`.
//!
//! A NetworkPolicy's or a mesh's DROP rule, a full conntrack table, a full socket buffer: the app
//! sees timeouts, not resets, and nothing on the node says which pod lost what. `kfree_skb`
//! carries the kernel's drop reason from 5.17 (its names and numbers change from kernel to
//! kernel, even within a stable series: read from BTF, never compiled in); 5.10 has none: drops
//! are counted there without one (`reason=""`, and `kstall status` says so). Drops are counted in
//! the kernel by namespace, reason, protocol, direction and destination port (or its class),
//! attributed like resets.

pub mod event;

pub use event::*;

use std::{
    collections::HashMap,
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
};

use aya::Ebpf;
use kstall_common::{
    EventHeader,
    counter::Counter,
    kind,
    packet_drop::{
        self as raw, DIRECTION_EGRESS, DIRECTION_INGRESS, DropCountKey, FAMILY_INET, FAMILY_INET6,
        KEY_PORT_EPHEMERAL, KEY_PORT_OTHER, PROTOCOL_NOT_IP, PROTOCOL_OTHER_IP, PacketDropConfig,
        PacketDropEvent, REASON_UNKNOWN,
    },
};

use super::{
    counters::{CountKey, CounterMap},
    error::ProbeError,
    kind::EventKind,
    payload::Payload,
    plan::{Plan, ProgramSpec, Unavailable},
    ports::CountedPort,
    probe::{Counted, Counting, Decoding, Drained, EnumNames, Planned, Probe, Turn},
    settings::Settings,
};
use crate::{
    decode::{DecodeError, read_versioned},
    kernel_btf::KernelBtf,
    symbols::Symbols,
};

pub const NAME: &str = "packet-drop";

const GLOBAL: &str = "PACKET_DROP_CONFIG";
const PROGRAM: ProgramSpec = ProgramSpec::tp_btf("kfree_skb_drop", "kfree_skb");
/// Before 5.17: `kfree_skb` without its reason argument.
const PROGRAM_WITHOUT_REASON: ProgramSpec = ProgramSpec::tp_btf("kfree_skb_drop_without_reason", "kfree_skb");
/// The reason names, core and subsystems' (7.3's qdisc reasons), by their full value.
const REASONS: &str = "packet_drop_reason";

pub fn plan(vmlinux: &KernelBtf) -> Result<(Plan, EnumNames), ProbeError> {
    let mut cfg = PacketDropConfig {
        valid: 1,
        skb_sk: vmlinux.offset_of("sk_buff", "sk")?,
        skb_dev: vmlinux.offset_of("sk_buff", "dev")?,
        skb_head: vmlinux.offset_of("sk_buff", "head")?,
        skb_network_header: vmlinux.offset_of("sk_buff", "network_header")?,
        skb_protocol: vmlinux.offset_of("sk_buff", "protocol")?,
        sk_net: vmlinux.offset_of("sock", "__sk_common.skc_net")?,
        sk_num: vmlinux.offset_of("sock", "__sk_common.skc_num")?,
        dev_nd_net: vmlinux.offset_of("net_device", "nd_net")?,
        net_ns_inum: vmlinux.offset_of("net", "ns.inum")?,
        ..PacketDropConfig::default()
    };
    let ephemeral = crate::kernel::ephemeral_port_range();
    (cfg.ephemeral_low, cfg.ephemeral_high) = (*ephemeral.start(), *ephemeral.end());
    let mut names = EnumNames::default();
    let (program, hook, unavailable) = if vmlinux.tracepoint_arg_count("kfree_skb")? < 3 {
        let why = "kfree_skb has no drop reason before 5.17: every drop is counted, with reason=\"\"";
        (PROGRAM_WITHOUT_REASON, "tp_btf/kfree_skb (every drop)", vec![Unavailable::new("reason", why)])
    } else {
        let reasons = reason_names(vmlinux)?;
        let value = |name: &str| reasons.iter().find(|(_, n)| n.as_str() == name).map(|(v, _)| *v);
        let not_dropped = value("NOT_DROPPED_YET").unwrap_or(0);
        let not_specified = value("NOT_SPECIFIED")
            .ok_or_else(|| ProbeError::Missing("BTF enum skb_drop_reason has no NOT_SPECIFIED".into()))?;
        cfg.not_counted = [not_dropped, value("SKB_CONSUMED").unwrap_or(not_dropped), not_specified];
        names.insert(REASONS, reasons);
        (PROGRAM, "tp_btf/kfree_skb (every drop reason but NOT_SPECIFIED)", vec![])
    };
    let plan = Plan {
        config: Some((GLOBAL, crate::decode::bytes_of(&cfg))),
        programs: vec![program],
        hook: hook.into(),
        notes: vec![],
        unavailable,
        fallback: None,
    };
    Ok((plan, names))
}

/// A reason's name; empty where the kernel gives none.
fn reason(names: &EnumNames, value: u32) -> String {
    if value == REASON_UNKNOWN { String::new() } else { names.name(REASONS, value) }
}

/// `enum skb_drop_reason`'s names without their prefix, and where the kernel has them (7.3),
/// the qdisc subsystem's (`enum qdisc_drop_reason`, its values carry the subsystem already).
fn reason_names(vmlinux: &KernelBtf) -> Result<HashMap<u32, String>, ProbeError> {
    let mut names: HashMap<u32, String> = vmlinux
        .enum_values("skb_drop_reason")?
        .into_iter()
        .map(|(n, v)| (v as u32, n.strip_prefix("SKB_DROP_REASON_").unwrap_or(&n).to_string()))
        .collect();
    if let Ok(qdisc) = vmlinux.enum_values("qdisc_drop_reason") {
        names.extend(qdisc.into_iter().map(|(n, v)| (v as u32, n)));
    }
    Ok(names)
}

fn direction(value: u8, field: &'static str) -> Result<Direction, DecodeError> {
    match value {
        DIRECTION_EGRESS => Ok(Direction::Egress),
        DIRECTION_INGRESS => Ok(Direction::Ingress),
        other => Err(DecodeError::BadField { field, value: other.into() }),
    }
}

fn protocol(value: u8) -> &'static str {
    match value {
        1 => "icmp",
        6 => "tcp",
        17 => "udp",
        58 => "icmpv6",
        PROTOCOL_OTHER_IP => "other",
        PROTOCOL_NOT_IP => "not_ip",
        _ => "other",
    }
}

fn has_ports(protocol: &str) -> bool {
    matches!(protocol, "tcp" | "udp")
}

pub fn decode(ev: &PacketDropEvent, names: &EnumNames, symbols: &Symbols) -> Result<PacketDrop, DecodeError> {
    let protocol = protocol(ev.protocol);
    let addr = |bytes: &[u8; 16]| -> Result<Option<IpAddr>, DecodeError> {
        match ev.family {
            _ if ev.protocol == PROTOCOL_NOT_IP => Ok(None),
            FAMILY_INET => Ok(Some(IpAddr::V4(Ipv4Addr::new(bytes[0], bytes[1], bytes[2], bytes[3])))),
            FAMILY_INET6 => Ok(Some(IpAddr::V6(Ipv6Addr::from(*bytes)))),
            other => Err(DecodeError::BadField { field: "packet_drop.family", value: other.into() }),
        }
    };
    let port = |port: u16| has_ports(protocol).then_some(port);
    Ok(PacketDrop {
        reason: reason(names, ev.reason),
        direction: direction(ev.direction, "packet_drop.direction")?,
        protocol,
        src_addr: addr(&ev.src_addr)?,
        src_port: port(ev.src_port),
        dst_addr: addr(&ev.dst_addr)?,
        dst_port: port(ev.dst_port),
        location: symbols.stack(&[ev.location]).texts().next().unwrap_or_default(),
    })
}

/// A counter key and its value, read back.
pub fn decode_count(
    key: &DropCountKey,
    counter: &Counter,
    names: &EnumNames,
) -> Result<DropCount, DecodeError> {
    let protocol = protocol(key.protocol);
    let port = if key.flags & KEY_PORT_EPHEMERAL != 0 {
        CountedPort::Ephemeral
    } else if key.flags & KEY_PORT_OTHER != 0 {
        CountedPort::Other
    } else {
        CountedPort::Number(key.port)
    };
    Ok(DropCount {
        reason: reason(names, key.reason),
        direction: direction(key.direction, "packet_drop_count.direction")?,
        protocol,
        port: has_ports(protocol).then_some(port),
        drops: counter.events,
        suppressed: counter.suppressed(),
    })
}

/// The probe, as the registry lists it.
pub struct PacketDropProbe;

impl Probe for PacketDropProbe {
    fn name(&self) -> &'static str {
        NAME
    }

    fn record_kind(&self) -> u32 {
        kind::PACKET_DROP
    }

    fn events(&self) -> &'static [EventKind] {
        &[DROP, DROP_COUNT]
    }

    fn plan(
        &self,
        vmlinux: &KernelBtf,
        _: &Settings,
        decoding: &mut Decoding,
    ) -> Result<Planned, ProbeError> {
        let (plan, names) = plan(vmlinux)?;
        decoding.enums.extend(names);
        Ok(plan.into())
    }

    fn counting(&self, ebpf: &mut Ebpf) -> Result<Option<Box<dyn Counting>>, String> {
        let counts = CounterMap::take(ebpf, "PACKET_DROP_COUNTS", "PACKET_DROP_OVERFLOW", 1)?;
        Ok(Some(Box::new(DropCounts(counts))))
    }

    fn decode(
        &self,
        header: &EventHeader,
        record: &[u8],
        decoding: &Decoding,
    ) -> Result<Payload, DecodeError> {
        let raw: PacketDropEvent = read_versioned(header, record, raw::VERSION, "packet_drop event")?;
        Ok(Payload::PacketDrop(decode(&raw, &decoding.enums, &decoding.symbols)?))
    }

    #[cfg(test)]
    fn samples(&self) -> Vec<Payload> {
        let names = EnumNames::default();
        let symbols = Symbols::default();
        vec![
            Payload::PacketDrop(decode(&tests::dropped_syn(), &names, &symbols).expect("sample")),
            Payload::PacketDropCount(
                decode_count(&tests::dropped_syn_key(), &Counter { events: 5, emitted: 1 }, &names)
                    .expect("sample"),
            ),
        ]
    }
}

impl CountKey for DropCountKey {
    fn generation(&self) -> u8 {
        self.generation
    }
}

/// The drops counted in the kernel, by series.
struct DropCounts(CounterMap<DropCountKey>);

impl Counting for DropCounts {
    fn drain(&mut self, turn: Turn, decoding: &Decoding, drained: &mut Drained) -> Result<(), String> {
        let mut counted = Vec::new();
        let result = self.0.drain(turn, &mut counted);
        for (key, counter) in counted {
            match decode_count(&key, &counter, &decoding.enums) {
                Ok(count) => drained.counts.push(by_netns(key.netns_ino, count)),
                Err(e) => drained.errors.push(e),
            }
        }
        for new in result? {
            if new > 0 {
                let overflow = DropCount {
                    reason: "overflow".into(),
                    direction: Direction::Ingress,
                    protocol: "other",
                    port: Some(CountedPort::Overflow),
                    drops: new,
                    suppressed: new,
                };
                drained.counts.push(by_netns(0, overflow));
            }
        }
        Ok(())
    }
}

fn by_netns(netns: u32, count: DropCount) -> Counted {
    Counted {
        probe: NAME,
        netns,
        cgroup_id: 0,
        comm: String::new(),
        payload: Payload::PacketDropCount(count),
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::kernel_btf::tests::kernel;

    /// A SYN from a pod (10.0.0.7:40001) to 10.96.0.10:5432, dropped by its OUTPUT DROP rule on 6.18.
    pub(crate) fn dropped_syn() -> PacketDropEvent {
        let mut header = EventHeader::zeroed();
        header.kind = kind::PACKET_DROP;
        header.version = raw::VERSION;
        header.netns_ino = 4026532300;
        let mut ev = PacketDropEvent {
            header,
            reason: 12,
            direction: DIRECTION_EGRESS,
            family: FAMILY_INET,
            protocol: 6,
            _pad: 0,
            src_port: 40001,
            dst_port: 5432,
            _pad2: 0,
            location: 0,
            src_addr: [0; 16],
            dst_addr: [0; 16],
        };
        ev.src_addr[..4].copy_from_slice(&[10, 0, 0, 7]);
        ev.dst_addr[..4].copy_from_slice(&[10, 96, 0, 10]);
        ev
    }

    pub(crate) fn dropped_syn_key() -> DropCountKey {
        DropCountKey {
            netns_ino: 4026532300,
            reason: 12,
            port: 5432,
            protocol: 6,
            direction: DIRECTION_EGRESS,
            ..DropCountKey::default()
        }
    }

    fn names(version: &str) -> EnumNames {
        plan(&kernel(version)).unwrap().1
    }

    fn config(version: &str) -> PacketDropConfig {
        let (plan, _) = plan(&kernel(version)).unwrap();
        let bytes = plan.config.unwrap().1;
        assert_eq!(bytes.len(), size_of::<PacketDropConfig>());
        // SAFETY: the bytes of a PacketDropConfig (repr(C), integers only), length checked.
        unsafe { std::ptr::read_unaligned(bytes.as_ptr().cast()) }
    }

    /// The reasons move from kernel to kernel: NETFILTER_DROP is 7 on 6.1, 11 on 6.12, 12 on
    /// 6.18; each reads its own from BTF.
    #[test]
    fn reason_names_and_the_uncounted_values_come_from_each_kernels_btf() {
        for (version, netfilter, not_specified, consumed) in
            [("6.1", 7, 1, 0), ("6.12", 11, 2, 1), ("6.18", 12, 2, 1)]
        {
            assert_eq!(names(version).name(REASONS, netfilter), "NETFILTER_DROP", "{version}");
            let cfg = config(version);
            assert_eq!(cfg.not_counted, [0, consumed, not_specified], "{version}");
            assert_ne!(cfg.skb_sk, cfg.skb_dev);
        }
        // 7.3 moved the qdisc reasons to their own subsystem.
        let names_7_3 = names("7.3");
        assert_eq!(names_7_3.name(REASONS, 12), "NETFILTER_DROP");
        assert_eq!(names_7_3.name(REASONS, 0x30002), "QDISC_DROP_OVERLIMIT");
    }

    #[test]
    fn kernels_without_a_drop_reason_count_every_drop_and_say_what_is_missing() {
        let (plan, _) = plan(&kernel("5.10")).unwrap();
        assert_eq!(
            plan.programs.iter().map(|p| p.program).collect::<Vec<_>>(),
            ["kfree_skb_drop_without_reason"]
        );
        assert_eq!(plan.unavailable[0].field, "reason");
        assert!(plan.unavailable[0].why.contains("before 5.17"), "{:?}", plan.unavailable);
        let mut ev = dropped_syn();
        ev.reason = REASON_UNKNOWN;
        assert_eq!(decode(&ev, &EnumNames::default(), &Symbols::default()).unwrap().reason, "");
    }

    #[test]
    fn a_drop_decodes_with_its_reason_addresses_and_ports() {
        let drop = decode(&dropped_syn(), &names("6.18"), &Symbols::default()).unwrap();
        assert_eq!(drop.reason, "NETFILTER_DROP");
        assert_eq!((drop.direction, drop.protocol), (Direction::Egress, "tcp"));
        assert_eq!(drop.dst_addr, Some("10.96.0.10".parse().unwrap()));
        assert_eq!((drop.src_port, drop.dst_port), (Some(40001), Some(5432)));
        assert_eq!(drop.peer(), Some("10.96.0.10".parse().unwrap()));
        // ICMP has no ports; a packet that is not IP has no addresses either.
        let mut ping = dropped_syn();
        ping.protocol = 1;
        let ping = decode(&ping, &names("6.18"), &Symbols::default()).unwrap();
        assert_eq!((ping.protocol, ping.dst_port), ("icmp", None));
        let mut arp = dropped_syn();
        arp.protocol = PROTOCOL_NOT_IP;
        arp.family = 0;
        let arp = decode(&arp, &names("6.18"), &Symbols::default()).unwrap();
        assert_eq!((arp.protocol, arp.src_addr, arp.dst_addr), ("not_ip", None, None));
    }

    #[test]
    fn counts_decode_with_their_port_class() {
        let names = names("6.12");
        let mut key = dropped_syn_key();
        key.reason = 11;
        let count = decode_count(&key, &Counter { events: 9, emitted: 2 }, &names).unwrap();
        assert_eq!(
            (count.reason.as_str(), count.port, count.drops, count.suppressed),
            ("NETFILTER_DROP", Some(CountedPort::Number(5432)), 9, 7)
        );
        (key.port, key.flags) = (0, KEY_PORT_EPHEMERAL);
        assert_eq!(
            decode_count(&key, &Counter::default(), &names).unwrap().port,
            Some(CountedPort::Ephemeral)
        );
        (key.protocol, key.flags) = (58, 0);
        assert_eq!(decode_count(&key, &Counter::default(), &names).unwrap().port, None);
    }

    #[test]
    fn garbage_is_refused_never_a_panic() {
        let mut ev = dropped_syn();
        ev.direction = 9;
        assert!(matches!(
            decode(&ev, &names("6.18"), &Symbols::default()),
            Err(DecodeError::BadField { field: "packet_drop.direction", .. })
        ));
        let mut ev = dropped_syn();
        ev.family = 77;
        assert!(decode(&ev, &names("6.18"), &Symbols::default()).is_err());
        let mut key = dropped_syn_key();
        key.direction = 0;
        assert!(decode_count(&key, &Counter::default(), &names("6.18")).is_err());
        // A reason BTF does not name reads as its number.
        let mut key = dropped_syn_key();
        key.reason = 60_000;
        assert_eq!(decode_count(&key, &Counter::default(), &names("6.18")).unwrap().reason, "60000");
    }
}
