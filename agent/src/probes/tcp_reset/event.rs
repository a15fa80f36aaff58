//! What tcp-reset says: a reset, and a series' count of them.

use std::net::IpAddr;

use kstall_common::metrics;
use serde::Serialize;

use crate::probes::{
    kind::{Change, EventData, EventKind, FilterFields, Source, Subject, Update},
    ports::CountedPort,
};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Direction {
    Sent,
    Received,
}

impl Direction {
    pub fn as_str(self) -> &'static str {
        match self {
            Direction::Sent => "sent",
            Direction::Received => "received",
        }
    }
}

/// A decoded reset. `local_*` is this host's end (for a sent reset: the port that refused, after
/// NAT), `remote_*` the peer.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TcpReset {
    pub direction: Direction,
    pub hook: &'static str,
    pub local_addr: IpAddr,
    pub local_port: u16,
    pub remote_addr: IpAddr,
    pub remote_port: u16,
    /// Pre-NAT destination when the packet's conntrack entry shows it was rewritten.
    pub original_dst_addr: Option<IpAddr>,
    pub original_dst_port: Option<u16>,
    /// Where NAT sent the connection (conntrack reply source port), when rewritten.
    pub redirect_port: Option<u16>,
    /// Kernel reason name (`NO_SOCKET`, ...), when the hook carries one.
    pub reason: Option<String>,
    pub tcp_state: Option<&'static str>,
    pub has_socket: bool,
    /// Fields this kernel's hook cannot give (a sent reset's `reason` before 6.10): never a
    /// silent empty value.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub unavailable: Vec<&'static str>,
}

/// Resets of one counter key in one interval, read from the kernel's counters: the exact count,
/// and how many of them were not sent in full (sampling).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ResetCount {
    pub direction: Direction,
    /// Sent: the refusing local port; received: the remote port.
    pub port: CountedPort,
    /// The pre-NAT destination port of a redirected connection.
    pub original_port: Option<CountedPort>,
    pub reason: Option<String>,
    pub resets: u64,
    pub suppressed: u64,
}

impl ResetCount {
    /// The redirected NFS port of these resets, as [`TcpReset`] tells it for one.
    pub fn redirected_port(&self) -> Option<u16> {
        match (self.direction, self.original_port?) {
            (Direction::Sent, CountedPort::Number(original))
                if self.port != CountedPort::Number(original) =>
            {
                Some(original)
            }
            _ => None,
        }
    }
}

pub(super) const RESET: EventKind = EventKind {
    name: "tcp_reset",
    subject: Subject::Netns,
    families: &[],
    text: |e| {
        let arrow = if e.s("direction") == "sent" { "sent RST" } else { "got RST" };
        let mut text = format!(
            "{arrow} {}:{} -> {}:{}",
            e.s("local_addr"),
            e.n("local_port"),
            e.s("remote_addr"),
            e.n("remote_port")
        );
        if let Some(port) = e.get("original_dst_port").as_u64() {
            text.push_str(&format!(" (dialled {}:{port}, redirected)", e.s("original_dst_addr")));
        }
        if !e.s("reason").is_empty() {
            text.push_str(&format!(" {}", e.s("reason")));
        }
        text
    },
};

/// A series' resets beyond those shown (sampling): counted, not each sent.
pub(super) const RESET_COUNT: EventKind = EventKind {
    name: "tcp_reset_count",
    subject: Subject::Netns,
    families: &[&metrics::TCP_RESETS],
    text: |e| {
        let arrow = if e.s("direction") == "sent" { "sent RSTs" } else { "got RSTs" };
        let mut text = format!(
            "{} more {arrow} not shown ({} counted in 1 s): port {}",
            e.n("suppressed"),
            e.n("resets"),
            e.s("port")
        );
        if !e.s("original_port").is_empty() {
            text.push_str(&format!(" (dialled port {}, redirected)", e.s("original_port")));
        }
        if !e.s("reason").is_empty() {
            text.push_str(&format!(" {}", e.s("reason")));
        }
        text
    },
};

impl EventData for TcpReset {
    fn kind(&self) -> &'static EventKind {
        &RESET
    }

    fn filter_fields(&self) -> FilterFields {
        FilterFields {
            ports: [Some(self.local_port), Some(self.remote_port), self.original_dst_port]
                .into_iter()
                .flatten()
                .collect(),
            addrs: [Some(self.remote_addr), self.original_dst_addr]
                .into_iter()
                .flatten()
                .map(|a| a.to_string())
                .collect(),
        }
    }
}

impl EventData for ResetCount {
    fn kind(&self) -> &'static EventKind {
        &RESET_COUNT
    }

    /// Only ports counted by number; a count has no address.
    fn filter_fields(&self) -> FilterFields {
        let ports = [Some(self.port), self.original_port]
            .into_iter()
            .flatten()
            .filter_map(|p| match p {
                CountedPort::Number(n) => Some(n),
                _ => None,
            })
            .collect();
        FilterFields { ports, addrs: vec![] }
    }

    fn suppressed(&self) -> Option<u64> {
        Some(self.suppressed)
    }

    /// Counted from the kernel's counters, exact whatever the ring buffer or the sampling left
    /// out; the resets sent in full are their detail and count nothing.
    fn updates(&self, _: &Source) -> Vec<Update> {
        let (port, original) = (self.port.label(), self.original_port.map(|p| p.label()));
        let labels = [
            self.direction.as_str(),
            &port,
            original.as_deref().unwrap_or(""),
            self.reason.as_deref().unwrap_or(""),
        ];
        vec![Update::new(&metrics::TCP_RESETS, &labels, Change::Add(self.resets))]
    }
}
