//! TCP and UDP sockets of a namespace (IPv4 and IPv6, every state), from `SOCK_DIAG_BY_FAMILY`
//! dumps (`inet_diag_req_v2`) on a `NETLINK_SOCK_DIAG` socket opened inside it, rendered like
//! `ss -tuan`: protocol, state, receive and send queues, local and peer address:port, uid and
//! inode; then, like `ss -p`, the processes holding it: ` users:(("comm",pid=N,fd=M),...)`, by
//! pid then fd. The holders are found by [`owners`]: the `readlink` of each `/proc/<pid>/fd/*`
//! (`socket:[INODE]`) and the `comm` of the processes of the namespace, nothing else: a file's
//! target is never opened or `stat`ed, so a hung NFS mount holds nothing up. A socket nobody holds
//! (a `TIME-WAIT`, one of a process outside the namespace's) has no ` users:`.

use std::{collections::HashMap, fmt::Write as _, net::IpAddr, os::fd::OwnedFd, path::Path};

use super::{
    bounded,
    netlink::{self, NlError, ip},
    nfs::WITHIN,
};

const SOCK_DIAG_BY_FAMILY: u16 = 20;
/// `struct inet_diag_msg`: family, state, timer, retrans, the socket id (48), expires, rqueue,
/// wqueue, uid, inode.
const MSG_LEN: usize = 72;

/// A process holding a socket open: its name, its pid and the descriptor.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Owner {
    pub comm: String,
    pub pid: u32,
    pub fd: u32,
}

/// The holders of each socket, by inode.
pub type Owners = HashMap<u64, Vec<Owner>>;

/// `/proc/<pid>/comm` holds 16 bytes at most: more is not a name.
const COMM_LIMIT: u64 = 64;

/// Which of `pids` hold which sockets, by the `readlink` of their `/proc/<pid>/fd/*`; each
/// socket's holders by pid then fd. A process gone meanwhile, or whose descriptors cannot be
/// listed, holds nothing; one whose `comm` cannot be read is `?`.
pub fn owners(proc: &Path, pids: &[u32]) -> Owners {
    let mut owners = Owners::new();
    for &pid in pids {
        let base = proc.join(pid.to_string());
        let Ok(entries) = std::fs::read_dir(base.join("fd")) else { continue };
        let held: Vec<(u64, u32)> = entries
            .filter_map(|e| {
                let e = e.ok()?;
                let fd = e.file_name().to_str()?.parse().ok()?;
                let target = std::fs::read_link(e.path()).ok()?;
                let inode = target.to_str()?.strip_prefix("socket:[")?.strip_suffix(']')?.parse().ok()?;
                Some((inode, fd))
            })
            .collect();
        if held.is_empty() {
            continue;
        }
        let comm = match bounded::read_text(&base.join("comm"), COMM_LIMIT, WITHIN) {
            Ok(text) => text.strip_suffix('\n').unwrap_or(&text).to_string(),
            Err(bounded::Bounded::Io(std::io::ErrorKind::NotFound, _)) => continue,
            Err(_) => "?".to_string(),
        };
        for (inode, fd) in held {
            owners.entry(inode).or_default().push(Owner { comm: comm.clone(), pid, fd });
        }
    }
    for holders in owners.values_mut() {
        holders.sort_by_key(|o| (o.pid, o.fd));
    }
    owners
}

/// ` users:(("comm",pid=N,fd=M),...)` as `ss -p` prints it, or nothing for no holder. A name is
/// its process's choice: a `"` or a backslash in it is escaped by a backslash, a control character
/// written `\xNN`.
pub fn users(holders: &[Owner]) -> String {
    if holders.is_empty() {
        return String::new();
    }
    let mut out = String::from(" users:(");
    for (i, o) in holders.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        out.push_str("(\"");
        for c in o.comm.chars() {
            match c {
                '"' | '\\' => {
                    out.push('\\');
                    out.push(c);
                }
                c if c.is_control() => {
                    let _ = write!(out, "\\x{:02x}", c as u32);
                }
                c => out.push(c),
            }
        }
        let _ = write!(out, "\",pid={},fd={})", o.pid, o.fd);
    }
    out.push(')');
    out
}

/// Every TCP and UDP socket of the namespace, one line each, TCP first, with its holders among
/// `owners`.
pub fn dump(fd: &OwnedFd, owners: &Owners) -> Result<Vec<String>, NlError> {
    let mut lines = Vec::new();
    for (protocol, name) in [(libc::IPPROTO_TCP as u8, "tcp"), (libc::IPPROTO_UDP as u8, "udp")] {
        for family in [libc::AF_INET as u8, libc::AF_INET6 as u8] {
            // inet_diag_req_v2: family, protocol, ext, pad, states (all), then a zero socket id.
            let mut request = vec![family, protocol, 0, 0];
            request.extend_from_slice(&u32::MAX.to_ne_bytes());
            request.resize(56, 0);
            let payloads = netlink::dump(fd, SOCK_DIAG_BY_FAMILY, &request)?;
            lines.extend(payloads.iter().filter_map(|p| socket(name, p, owners)));
        }
    }
    Ok(lines)
}

/// One `inet_diag_msg`: `tcp LISTEN 0 0 10.0.0.2:8080 0.0.0.0:* uid=0 inode=4242`, then
/// ` users:(("nginx",pid=812,fd=6))` if `owners` has holders of the inode.
pub fn socket(protocol: &str, payload: &[u8], owners: &Owners) -> Option<String> {
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
        "{protocol} {state} {rqueue} {wqueue} {} {} uid={uid} inode={inode}{}",
        endpoint(src, sport),
        if dport == 0 && dst.is_unspecified() { peerless(dst) } else { endpoint(dst, dport) },
        owners.get(&u64::from(inode)).map(|h| users(h)).unwrap_or_default()
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
        let none = Owners::new();
        let listen = msg(libc::AF_INET as u8, 10, &[10, 0, 0, 2], 8080, &[0; 4], 0);
        assert_eq!(
            socket("tcp", &listen, &none).unwrap(),
            "tcp LISTEN 0 0 10.0.0.2:8080 0.0.0.0:* uid=0 inode=4242"
        );
        let established = msg(libc::AF_INET as u8, 1, &[10, 0, 0, 2], 40312, &[10, 0, 0, 1], 2049);
        assert!(
            socket("tcp", &established, &none)
                .unwrap()
                .starts_with("tcp ESTAB 0 0 10.0.0.2:40312 10.0.0.1:2049 ")
        );
        let mut v6 = [0u8; 16];
        v6[15] = 1;
        let unconnected = msg(libc::AF_INET6 as u8, 7, &v6, 53, &[0; 16], 0);
        assert!(socket("udp", &unconnected, &none).unwrap().starts_with("udp UNCONN 0 0 [::1]:53 [::]:* "));
        assert_eq!(socket("tcp", &listen[..40], &none), None);
    }

    fn owner(comm: &str, pid: u32, fd: u32) -> Owner {
        Owner { comm: comm.into(), pid, fd }
    }

    #[test]
    fn the_holders_of_a_socket_are_read_from_the_fd_links_alone() {
        let proc = tempfile::tempdir().unwrap();
        let process = |pid: u32, comm: &str, fds: &[(u32, &str)]| {
            let fd = proc.path().join(format!("{pid}/fd"));
            std::fs::create_dir_all(&fd).unwrap();
            std::fs::write(proc.path().join(format!("{pid}/comm")), format!("{comm}\n")).unwrap();
            for (n, link) in fds {
                std::os::unix::fs::symlink(link, fd.join(n.to_string())).unwrap();
            }
        };
        // 20 and 21 share 4242 (a fork); a file of 21's is on an NFS mount nobody may stat.
        process(20, "nginx", &[(0, "/dev/null"), (6, "socket:[4242]"), (7, "socket:[5151]")]);
        process(21, "nginx: worker", &[(9, "/mnt/nfs/data/log"), (6, "socket:[4242]"), (3, "pipe:[77]")]);
        process(22, "cat", &[(1, "/dev/null"), (2, "anon_inode:[eventfd]")]);
        // 23 is gone, 24 went between its descriptors and its name.
        std::fs::create_dir_all(proc.path().join("24/fd")).unwrap();
        std::os::unix::fs::symlink("socket:[6161]", proc.path().join("24/fd/3")).unwrap();
        let owners = owners(proc.path(), &[21, 20, 22, 23, 24]);
        assert_eq!(
            owners,
            Owners::from([
                (4242, vec![owner("nginx", 20, 6), owner("nginx: worker", 21, 6)]),
                (5151, vec![owner("nginx", 20, 7)]),
            ])
        );
    }

    #[test]
    fn a_held_socket_ends_with_its_users_like_ss_p() {
        let established = msg(libc::AF_INET as u8, 1, &[10, 0, 0, 2], 40312, &[10, 0, 0, 1], 2049);
        let owners = Owners::from([(4242, vec![owner("app", 812, 6), owner("app", 813, 3)])]);
        assert_eq!(
            socket("tcp", &established, &owners).unwrap(),
            "tcp ESTAB 0 0 10.0.0.2:40312 10.0.0.1:2049 uid=0 inode=4242 \
             users:((\"app\",pid=812,fd=6),(\"app\",pid=813,fd=3))"
        );
        let others = Owners::from([(4243, vec![owner("app", 812, 7)])]);
        assert_eq!(
            socket("tcp", &established, &others).unwrap(),
            "tcp ESTAB 0 0 10.0.0.2:40312 10.0.0.1:2049 uid=0 inode=4242"
        );
        assert_eq!(
            users(&[owner("a\"),(\"b\\\n\x7f", 1, 2)]),
            r#" users:(("a\"),(\"b\\\x0a\x7f",pid=1,fd=2))"#
        );
        assert_eq!(users(&[]), "");
    }
}
