//! TCP and UDP sockets of a namespace (IPv4 and IPv6, every state), from `SOCK_DIAG_BY_FAMILY`
//! dumps (`inet_diag_req_v2`) on a `NETLINK_SOCK_DIAG` socket opened inside it, rendered like
//! `ss -tuan`: protocol, state, receive and send queues, local and peer address:port, uid and
//! inode. Owning processes are not looked up.

use std::{net::IpAddr, os::fd::OwnedFd};

use super::netlink::{self, NlError, ip};

const SOCK_DIAG_BY_FAMILY: u16 = 20;
/// `struct inet_diag_msg`: family, state, timer, retrans, the socket id (48), expires, rqueue,
/// wqueue, uid, inode.
const MSG_LEN: usize = 72;

/// Every TCP and UDP socket of the namespace, one line each, TCP first.
pub fn dump(fd: &OwnedFd) -> Result<Vec<String>, NlError> {
    let mut lines = Vec::new();
    for (protocol, name) in [(libc::IPPROTO_TCP as u8, "tcp"), (libc::IPPROTO_UDP as u8, "udp")] {
        for family in [libc::AF_INET as u8, libc::AF_INET6 as u8] {
            // inet_diag_req_v2: family, protocol, ext, pad, states (all), then a zero socket id.
            let mut request = vec![family, protocol, 0, 0];
            request.extend_from_slice(&u32::MAX.to_ne_bytes());
            request.resize(56, 0);
            let payloads = netlink::dump(fd, SOCK_DIAG_BY_FAMILY, &request)?;
            lines.extend(payloads.iter().filter_map(|p| socket(name, p)));
        }
    }
    Ok(lines)
}

/// One `inet_diag_msg`: `tcp LISTEN 0 0 10.0.0.2:8080 0.0.0.0:* uid=0 inode=4242`.
pub fn socket(protocol: &str, payload: &[u8]) -> Option<String> {
    let msg = payload.get(..MSG_LEN)?;
    let (family, state) = (msg[0], msg[1]);
    let len = if family == libc::AF_INET6 as u8 { 16 } else { 4 };
    let sport = u16::from_be_bytes([msg[4], msg[5]]);
    let dport = u16::from_be_bytes([msg[6], msg[7]]);
    let src = ip(&msg[8..8 + len])?;
    let dst = ip(&msg[24..24 + len])?;
    let word = |at: usize| u32::from_ne_bytes(msg[at..at + 4].try_into().unwrap());
    let (rqueue, wqueue, uid, inode) = (word(56), word(60), word(64), word(68));
    let state = match (protocol, state) {
        ("udp", 7) => "UNCONN",
        (_, s) => state_name(s),
    };
    Some(format!(
        "{protocol} {state} {rqueue} {wqueue} {} {} uid={uid} inode={inode}",
        endpoint(src, sport),
        if dport == 0 && dst.is_unspecified() { peerless(dst) } else { endpoint(dst, dport) }
    ))
}

fn endpoint(address: IpAddr, port: u16) -> String {
    match address {
        IpAddr::V4(a) => format!("{a}:{port}"),
        IpAddr::V6(a) => format!("[{a}]:{port}"),
    }
}

fn peerless(address: IpAddr) -> String {
    match address {
        IpAddr::V4(a) => format!("{a}:*"),
        IpAddr::V6(a) => format!("[{a}]:*"),
    }
}

/// The kernel's TCP states (include/net/tcp_states.h), as `ss` names them.
fn state_name(state: u8) -> &'static str {
    match state {
        1 => "ESTAB",
        2 => "SYN-SENT",
        3 => "SYN-RECV",
        4 => "FIN-WAIT-1",
        5 => "FIN-WAIT-2",
        6 => "TIME-WAIT",
        7 => "CLOSE",
        8 => "CLOSE-WAIT",
        9 => "LAST-ACK",
        10 => "LISTEN",
        11 => "CLOSING",
        12 => "NEW-SYN-RECV",
        _ => "UNKNOWN",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn msg(family: u8, state: u8, src: &[u8], sport: u16, dst: &[u8], dport: u16) -> Vec<u8> {
        let mut m = vec![family, state, 0, 0];
        m.extend(sport.to_be_bytes());
        m.extend(dport.to_be_bytes());
        let mut ips = [0u8; 32];
        ips[..src.len()].copy_from_slice(src);
        ips[16..16 + dst.len()].copy_from_slice(dst);
        m.extend(ips);
        m.extend([0u8; 12]); // interface, cookie
        for word in [0u32, 0, 0, 0, 4242] {
            m.extend(word.to_ne_bytes()); // expires, rqueue, wqueue, uid, inode
        }
        m
    }

    #[test]
    fn sockets_read_like_ss() {
        let listen = msg(libc::AF_INET as u8, 10, &[10, 0, 0, 2], 8080, &[0; 4], 0);
        assert_eq!(
            socket("tcp", &listen).unwrap(),
            "tcp LISTEN 0 0 10.0.0.2:8080 0.0.0.0:* uid=0 inode=4242"
        );
        let established = msg(libc::AF_INET as u8, 1, &[10, 0, 0, 2], 40312, &[10, 0, 0, 1], 2049);
        assert!(
            socket("tcp", &established).unwrap().starts_with("tcp ESTAB 0 0 10.0.0.2:40312 10.0.0.1:2049 ")
        );
        let mut v6 = [0u8; 16];
        v6[15] = 1;
        let unconnected = msg(libc::AF_INET6 as u8, 7, &v6, 53, &[0; 16], 0);
        assert!(socket("udp", &unconnected).unwrap().starts_with("udp UNCONN 0 0 [::1]:53 [::]:* "));
        assert_eq!(socket("tcp", &listen[..40]), None);
    }
}
