//! What packet-drop says: a dropped packet, and a series' count of them.

use std::net::IpAddr;

use kstall_common::metrics;
use serde::Serialize;

use crate::probes::{
    kind::{Change, EventData, EventKind, FilterFields, Source, Subject, Update},
    ports::CountedPort,
};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Direction {
    /// Leaving one of the namespace's sockets (the pod sent it).
    Egress,
    /// Arriving, from a device or delivered to a socket.
    Ingress,
}

impl Direction {
    pub fn as_str(self) -> &'static str {
        match self {
            Direction::Egress => "egress",
            Direction::Ingress => "ingress",
        }
    }
}

/// A dropped packet. Its addresses and ports, when it is IP (ports only for TCP and UDP).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PacketDrop {
    /// The kernel's drop reason (`NETFILTER_DROP`, `NO_SOCKET`, ...), its enum name per kernel.
    pub reason: String,
    pub direction: Direction,
    /// `tcp`, `udp`, `icmp`, `icmpv6`, `other` (another IP protocol) or `not_ip`.
    pub protocol: &'static str,
    pub src_addr: Option<IpAddr>,
    pub src_port: Option<u16>,
    pub dst_addr: Option<IpAddr>,
    pub dst_port: Option<u16>,
    /// Where the kernel freed it (`nft_do_chain+0x...`: a rule's verdict).
    pub location: String,
}

impl PacketDrop {
    /// The other end: where an egress packet was going, where an ingress one came from.
    pub fn peer(&self) -> Option<IpAddr> {
        match self.direction {
            Direction::Egress => self.dst_addr,
            Direction::Ingress => self.src_addr,
        }
    }
}

/// Drops of one counter key in one interval, read from the kernel's counters: the exact count,
/// and how many of them were not sent in full (sampling).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DropCount {
    pub reason: String,
    pub direction: Direction,
    pub protocol: &'static str,
    /// The packets' destination port (the service they were for), or its class; empty for a
    /// protocol without ports.
    pub port: Option<CountedPort>,
    pub drops: u64,
    pub suppressed: u64,
}

pub(super) const DROP: EventKind = EventKind {
    name: "packet_drop",
    subject: Subject::Netns,
    families: &[],
    text: |e| {
        let end = |addr: &str, port: Option<u64>| match port {
            Some(port) => format!("{addr}:{port}"),
            None => addr.to_string(),
        };
        format!(
            "dropped {} {} {} -> {} {} at {}",
            e.s("direction"),
            e.s("protocol"),
            end(e.s("src_addr"), e.get("src_port").as_u64()),
            end(e.s("dst_addr"), e.get("dst_port").as_u64()),
            e.s("reason"),
            e.s("location")
        )
    },
};

/// A series' drops beyond those shown (sampling): counted, not each sent.
pub(super) const DROP_COUNT: EventKind = EventKind {
    name: "packet_drop_count",
    subject: Subject::Netns,
    families: &[&metrics::PACKET_DROPS],
    text: |e| {
        format!(
            "{} more {} {} drops not shown ({} counted in 1 s): port {} {}",
            e.n("suppressed"),
            e.s("direction"),
            e.s("protocol"),
            e.n("drops"),
            e.s("port"),
            e.s("reason")
        )
    },
};

impl EventData for PacketDrop {
    fn kind(&self) -> &'static EventKind {
        &DROP
    }

    fn filter_fields(&self) -> FilterFields {
        FilterFields {
            ports: [self.src_port, self.dst_port].into_iter().flatten().collect(),
            addrs: [self.src_addr, self.dst_addr].into_iter().flatten().map(|a| a.to_string()).collect(),
        }
    }
}

impl EventData for DropCount {
    fn kind(&self) -> &'static EventKind {
        &DROP_COUNT
    }

    /// Only a port counted by number; a count has no address.
    fn filter_fields(&self) -> FilterFields {
        let ports = match self.port {
            Some(CountedPort::Number(n)) => vec![n],
            _ => vec![],
        };
        FilterFields { ports, addrs: vec![] }
    }

    fn suppressed(&self) -> Option<u64> {
        Some(self.suppressed)
    }

    /// Counted from the kernel's counters, exact whatever the ring buffer or the sampling left
    /// out; the drops sent in full are their detail and count nothing.
    fn updates(&self, _: &Source) -> Vec<Update> {
        let port = self.port.map(|p| p.label()).unwrap_or_default();
        let labels = [self.reason.as_str(), self.protocol, self.direction.as_str(), port.as_str()];
        vec![Update::new(&metrics::PACKET_DROPS, &labels, Change::Add(self.drops))]
    }
}
