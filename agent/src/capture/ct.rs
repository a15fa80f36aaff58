//! Connection tracking through ctnetlink (`NETLINK_NETFILTER`, subsystem `NFNL_SUBSYS_CTNETLINK`):
//! the table dumped (`IPCTNL_MSG_CT_GET` with `NLM_F_DUMP`), and the `NEW` and `DESTROY` events
//! of the capture's duration. The events are what shows a redirect answered by a RST: the kernel
//! deletes such an entry at the RST, so no dump ever has it (the capture plan's §0.3). Each entry
//! is rendered as `conntrack -L` does, its original tuple then its reply tuple.

use std::{fmt::Write as _, net::IpAddr};

use super::netlink::{self, NlError, attr, attrs, be16, be32, ip};

/// Multicast groups NFNLGRP_CONNTRACK_NEW (1) and NFNLGRP_CONNTRACK_DESTROY (3), as a bind mask.
pub const EVENT_GROUPS: u32 = 1 | 1 << 2;
const SUBSYS_CTNETLINK: u16 = 1;
const MSG_NEW: u16 = 0;
const MSG_GET: u16 = 1;
const MSG_DELETE: u16 = 2;
const NFGENMSG_LEN: usize = 4;

const CTA_TUPLE_ORIG: u16 = 1;
const CTA_TUPLE_REPLY: u16 = 2;
const CTA_STATUS: u16 = 3;
const CTA_PROTOINFO: u16 = 4;
const CTA_TIMEOUT: u16 = 7;
const CTA_MARK: u16 = 8;
const CTA_ZONE: u16 = 18;
const CTA_TUPLE_IP: u16 = 1;
const CTA_TUPLE_PROTO: u16 = 2;
const CTA_PROTO_NUM: u16 = 1;
const CTA_PROTO_SRC_PORT: u16 = 2;
const CTA_PROTO_DST_PORT: u16 = 3;
const CTA_PROTOINFO_TCP: u16 = 1;
const CTA_PROTOINFO_TCP_STATE: u16 = 1;
const IPS_SEEN_REPLY: u32 = 1 << 1;
const IPS_ASSURED: u32 = 1 << 2;

/// The whole table of the socket's namespace, one line per entry.
pub fn dump(fd: &std::os::fd::OwnedFd) -> Result<Vec<String>, NlError> {
    // nfgenmsg: AF_UNSPEC (every family), version 0, res_id 0.
    let payloads = netlink::dump(fd, SUBSYS_CTNETLINK << 8 | MSG_GET, &[0; NFGENMSG_LEN])?;
    Ok(payloads.iter().filter_map(|p| entry(p.get(NFGENMSG_LEN..)?)).collect())
}

/// The event of one ctnetlink message (its type and payload): `[NEW] …` or `[DESTROY] …`;
/// `None` for any other message or one that does not decode.
pub fn event(kind: u16, payload: &[u8]) -> Option<String> {
    if kind >> 8 != SUBSYS_CTNETLINK {
        return None;
    }
    let what = match kind & 0xff {
        MSG_NEW => "[NEW]",
        MSG_DELETE => "[DESTROY]",
        _ => return None,
    };
    Some(format!("{what} {}", entry(payload.get(NFGENMSG_LEN..)?)?))
}

/// One entry's attributes as `conntrack -L` words them: `tcp 6 SYN_SENT src=… dst=… sport=…
/// dport=… [UNREPLIED] src=… dst=… sport=… dport=… mark=0`.
pub fn entry(attributes: &[u8]) -> Option<String> {
    let orig = tuple(attr(attributes, CTA_TUPLE_ORIG)?)?;
    let reply = attr(attributes, CTA_TUPLE_REPLY).and_then(tuple);
    let status = attr(attributes, CTA_STATUS).and_then(be32).unwrap_or(0);
    let mut line = format!("{} {}", proto_name(orig.proto), orig.proto);
    if let Some(timeout) = attr(attributes, CTA_TIMEOUT).and_then(be32) {
        let _ = write!(line, " {timeout}");
    }
    let state = attr(attributes, CTA_PROTOINFO)
        .and_then(|p| attr(p, CTA_PROTOINFO_TCP))
        .and_then(|t| attr(t, CTA_PROTOINFO_TCP_STATE))
        .and_then(|s| s.first().copied());
    if let Some(state) = state {
        let _ = write!(line, " {}", tcp_state(state));
    }
    let _ = write!(line, " {}", orig.words());
    if status & IPS_SEEN_REPLY == 0 {
        line.push_str(" [UNREPLIED]");
    }
    if let Some(reply) = reply {
        let _ = write!(line, " {}", reply.words());
    }
    if status & IPS_ASSURED != 0 {
        line.push_str(" [ASSURED]");
    }
    if let Some(mark) = attr(attributes, CTA_MARK).and_then(be32) {
        let _ = write!(line, " mark={mark}");
    }
    if let Some(zone) = attr(attributes, CTA_ZONE).and_then(be16) {
        let _ = write!(line, " zone={zone}");
    }
    Some(line)
}

struct Tuple {
    src: IpAddr,
    dst: IpAddr,
    proto: u8,
    ports: Option<(u16, u16)>,
}

impl Tuple {
    fn words(&self) -> String {
        let mut out = format!("src={} dst={}", self.src, self.dst);
        if let Some((sport, dport)) = self.ports {
            let _ = write!(out, " sport={sport} dport={dport}");
        }
        out
    }
}

fn tuple(nested: &[u8]) -> Option<Tuple> {
    let ips = attr(nested, CTA_TUPLE_IP)?;
    let (mut src, mut dst) = (None, None);
    for (kind, value) in attrs(ips) {
        match kind {
            1 | 3 => src = ip(value),
            2 | 4 => dst = ip(value),
            _ => {}
        }
    }
    let proto = attr(nested, CTA_TUPLE_PROTO)?;
    let num = attr(proto, CTA_PROTO_NUM)?.first().copied()?;
    let ports =
        attr(proto, CTA_PROTO_SRC_PORT).and_then(be16).zip(attr(proto, CTA_PROTO_DST_PORT).and_then(be16));
    Some(Tuple { src: src?, dst: dst?, proto: num, ports })
}

fn proto_name(num: u8) -> &'static str {
    match num {
        6 => "tcp",
        17 => "udp",
        1 => "icmp",
        58 => "icmpv6",
        132 => "sctp",
        136 => "udplite",
        _ => "unknown",
    }
}

/// `enum tcp_conntrack` (include/uapi/linux/netfilter/nf_conntrack_tcp.h).
fn tcp_state(state: u8) -> &'static str {
    match state {
        0 => "NONE",
        1 => "SYN_SENT",
        2 => "SYN_RECV",
        3 => "ESTABLISHED",
        4 => "FIN_WAIT",
        5 => "CLOSE_WAIT",
        6 => "LAST_ACK",
        7 => "TIME_WAIT",
        8 => "CLOSE",
        9 => "SYN_SENT2",
        _ => "UNKNOWN",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::capture::netlink::tests::nla;

    const NESTED: u16 = 0x8000;

    fn tuple_bytes(src: [u8; 4], dst: [u8; 4], sport: u16, dport: u16) -> Vec<u8> {
        let ips = [nla(1, &src), nla(2, &dst)].concat();
        let proto = [nla(1, &[6]), nla(2, &sport.to_be_bytes()), nla(3, &dport.to_be_bytes())].concat();
        [nla(NESTED | CTA_TUPLE_IP, &ips), nla(NESTED | CTA_TUPLE_PROTO, &proto)].concat()
    }

    /// The DESTROY event ctnetlink sends for a connect to 10.0.0.1:2049 redirected to
    /// 127.0.0.1:15001 and refused there (attributes in the kernel's order: ctnetlink_conntrack_event).
    fn redirected_destroy() -> Vec<u8> {
        let attributes = [
            nla(NESTED | CTA_TUPLE_ORIG, &tuple_bytes([10, 0, 0, 2], [10, 0, 0, 1], 40312, 2049)),
            nla(NESTED | CTA_TUPLE_REPLY, &tuple_bytes([127, 0, 0, 1], [10, 0, 0, 2], 15001, 40312)),
            nla(CTA_STATUS, &0x188u32.to_be_bytes()),
            nla(CTA_MARK, &0u32.to_be_bytes()),
        ]
        .concat();
        [vec![2, 0, 0, 0], attributes].concat()
    }

    #[test]
    fn a_redirected_connection_shows_2049_and_15001_on_one_line() {
        let line = event(SUBSYS_CTNETLINK << 8 | MSG_DELETE, &redirected_destroy()).unwrap();
        assert_eq!(
            line,
            "[DESTROY] tcp 6 src=10.0.0.2 dst=10.0.0.1 sport=40312 dport=2049 [UNREPLIED] \
             src=127.0.0.1 dst=10.0.0.2 sport=15001 dport=40312 mark=0"
        );
    }

    #[test]
    fn a_dumped_entry_has_its_timeout_and_tcp_state() {
        let protoinfo = nla(NESTED | CTA_PROTOINFO_TCP, &nla(CTA_PROTOINFO_TCP_STATE, &[3]));
        let attributes = [
            nla(NESTED | CTA_TUPLE_ORIG, &tuple_bytes([10, 0, 0, 2], [10, 0, 0, 1], 5000, 80)),
            nla(NESTED | CTA_TUPLE_REPLY, &tuple_bytes([10, 0, 0, 1], [10, 0, 0, 2], 80, 5000)),
            nla(CTA_STATUS, &(IPS_SEEN_REPLY | IPS_ASSURED).to_be_bytes()),
            nla(CTA_TIMEOUT, &431999u32.to_be_bytes()),
            nla(NESTED | CTA_PROTOINFO, &protoinfo),
        ]
        .concat();
        assert_eq!(
            entry(&attributes).unwrap(),
            "tcp 6 431999 ESTABLISHED src=10.0.0.2 dst=10.0.0.1 sport=5000 dport=80 \
             src=10.0.0.1 dst=10.0.0.2 sport=80 dport=5000 [ASSURED]"
        );
    }

    #[test]
    fn other_messages_and_garbage_are_not_events() {
        assert_eq!(event(2 << 8, &redirected_destroy()), None);
        assert_eq!(event(SUBSYS_CTNETLINK << 8 | MSG_NEW, &[2, 0]), None);
        assert_eq!(event(SUBSYS_CTNETLINK << 8 | MSG_NEW, &[2, 0, 0, 0, 8, 0, 1, 0, 1, 2, 3, 4]), None);
    }
}
