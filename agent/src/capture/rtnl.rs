//! Addresses and routes of a namespace, from rtnetlink dumps (`RTM_GETLINK` for the interfaces'
//! names, `RTM_GETADDR`, `RTM_GETROUTE` of every table and family) made on a `NETLINK_ROUTE`
//! socket opened inside it, rendered like `ip addr` and `ip route show table all`.

use std::{collections::HashMap, fmt::Write as _, os::fd::OwnedFd};

use super::netlink::{self, NlError, attr, attrs, ip, ne32};

const RTM_GETLINK: u16 = 18;
const RTM_GETADDR: u16 = 22;
const RTM_GETROUTE: u16 = 26;
const IFINFOMSG_LEN: usize = 16;
const IFADDRMSG_LEN: usize = 8;
const RTMSG_LEN: usize = 12;
const IFLA_IFNAME: u16 = 3;
const IFA_ADDRESS: u16 = 1;
const IFA_LOCAL: u16 = 2;
const RTA_DST: u16 = 1;
const RTA_OIF: u16 = 4;
const RTA_GATEWAY: u16 = 5;
const RTA_PRIORITY: u16 = 6;
const RTA_PREFSRC: u16 = 7;
const RTA_TABLE: u16 = 15;

/// Interface names by index.
pub fn links(fd: &OwnedFd) -> Result<HashMap<u32, String>, NlError> {
    let payloads = netlink::dump(fd, RTM_GETLINK, &[0; IFINFOMSG_LEN])?;
    Ok(payloads.iter().filter_map(|p| link(p)).collect())
}

fn link(payload: &[u8]) -> Option<(u32, String)> {
    let index = ne32(payload.get(4..8)?)?;
    let name = attr(payload.get(IFINFOMSG_LEN..)?, IFLA_IFNAME)?;
    let name = name.split(|b| *b == 0).next()?;
    Some((index, String::from_utf8_lossy(name).into_owned()))
}

/// Every address, one line each: `eth0 inet 10.0.0.2/24 scope global`.
pub fn addresses(fd: &OwnedFd, names: &HashMap<u32, String>) -> Result<Vec<String>, NlError> {
    let payloads = netlink::dump(fd, RTM_GETADDR, &[0; IFADDRMSG_LEN])?;
    Ok(payloads.iter().filter_map(|p| address(p, names)).collect())
}

pub fn address(payload: &[u8], names: &HashMap<u32, String>) -> Option<String> {
    let (family, prefix, scope) = (*payload.first()?, *payload.get(1)?, *payload.get(3)?);
    let index = ne32(payload.get(4..8)?)?;
    let attributes = payload.get(IFADDRMSG_LEN..)?;
    // IFA_LOCAL is the address itself; IFA_ADDRESS the peer's on a point-to-point link.
    let local = attr(attributes, IFA_LOCAL).or_else(|| attr(attributes, IFA_ADDRESS)).and_then(ip)?;
    let family = if family == libc::AF_INET6 as u8 { "inet6" } else { "inet" };
    Some(format!("{} {family} {local}/{prefix} scope {}", name(names, index), scope_name(scope)))
}

/// Every route of every table, one line each: `10.0.0.0/24 dev eth0 proto kernel scope link src
/// 10.0.0.2 table main`.
pub fn routes(fd: &OwnedFd, names: &HashMap<u32, String>) -> Result<Vec<String>, NlError> {
    let payloads = netlink::dump(fd, RTM_GETROUTE, &[0; RTMSG_LEN])?;
    Ok(payloads.iter().filter_map(|p| route(p, names)).collect())
}

pub fn route(payload: &[u8], names: &HashMap<u32, String>) -> Option<String> {
    let header = payload.get(..RTMSG_LEN)?;
    let (dst_len, table, protocol, scope, kind) = (header[1], header[4], header[5], header[6], header[7]);
    let attributes = &payload[RTMSG_LEN..];
    let mut line = String::new();
    if kind != 1 {
        let _ = write!(line, "{} ", type_name(kind));
    }
    match attr(attributes, RTA_DST).and_then(ip) {
        Some(dst) if dst_len as usize == if dst.is_ipv4() { 32 } else { 128 } => {
            let _ = write!(line, "{dst}");
        }
        Some(dst) => {
            let _ = write!(line, "{dst}/{dst_len}");
        }
        None if header[0] == libc::AF_INET6 as u8 => line.push_str("default (v6)"),
        None => line.push_str("default"),
    }
    for (kind, value) in attrs(attributes) {
        match kind {
            RTA_GATEWAY => {
                if let Some(gateway) = ip(value) {
                    let _ = write!(line, " via {gateway}");
                }
            }
            RTA_OIF => {
                if let Some(index) = ne32(value) {
                    let _ = write!(line, " dev {}", name(names, index));
                }
            }
            _ => {}
        }
    }
    let _ = write!(line, " proto {} scope {}", protocol_name(protocol), scope_name(scope));
    if let Some(src) = attr(attributes, RTA_PREFSRC).and_then(ip) {
        let _ = write!(line, " src {src}");
    }
    if let Some(metric) = attr(attributes, RTA_PRIORITY).and_then(ne32) {
        let _ = write!(line, " metric {metric}");
    }
    let table = attr(attributes, RTA_TABLE).and_then(ne32).unwrap_or(u32::from(table));
    let _ = write!(line, " table {}", table_name(table));
    Some(line)
}

fn name(names: &HashMap<u32, String>, index: u32) -> String {
    names.get(&index).cloned().unwrap_or_else(|| format!("if{index}"))
}

fn scope_name(scope: u8) -> String {
    match scope {
        0 => "global".into(),
        200 => "site".into(),
        253 => "link".into(),
        254 => "host".into(),
        255 => "nowhere".into(),
        n => n.to_string(),
    }
}

fn protocol_name(protocol: u8) -> String {
    match protocol {
        0 => "unspec".into(),
        1 => "redirect".into(),
        2 => "kernel".into(),
        3 => "boot".into(),
        4 => "static".into(),
        n => n.to_string(),
    }
}

fn type_name(kind: u8) -> String {
    match kind {
        2 => "local".into(),
        3 => "broadcast".into(),
        4 => "anycast".into(),
        5 => "multicast".into(),
        6 => "blackhole".into(),
        7 => "unreachable".into(),
        8 => "prohibit".into(),
        n => format!("type{n}"),
    }
}

fn table_name(table: u32) -> String {
    match table {
        253 => "default".into(),
        254 => "main".into(),
        255 => "local".into(),
        n => n.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::capture::netlink::tests::nla;

    fn names() -> HashMap<u32, String> {
        HashMap::from([(2, "eth0".to_string())])
    }

    #[test]
    fn a_link_gives_its_index_and_name() {
        let mut payload = vec![0, 0, 1, 0, 2, 0, 0, 0, 0x43, 0x10, 1, 0, 0, 0, 0, 0];
        payload[4..8].copy_from_slice(&2u32.to_ne_bytes());
        payload.extend(nla(IFLA_IFNAME, b"eth0\0"));
        assert_eq!(link(&payload), Some((2, "eth0".into())));
    }

    #[test]
    fn an_address_reads_like_ip_addr() {
        let mut payload = vec![libc::AF_INET as u8, 24, 0x80, 0];
        payload.extend(2u32.to_ne_bytes());
        payload.extend(nla(IFA_ADDRESS, &[10, 0, 0, 2]));
        payload.extend(nla(IFA_LOCAL, &[10, 0, 0, 2]));
        assert_eq!(address(&payload, &names()).unwrap(), "eth0 inet 10.0.0.2/24 scope global");
    }

    #[test]
    fn routes_read_like_ip_route() {
        // 10.0.0.0/24 dev eth0 proto kernel scope link src 10.0.0.2, table main.
        let mut payload = vec![libc::AF_INET as u8, 24, 0, 0, 254, 2, 253, 1, 0, 0, 0, 0];
        payload.extend(nla(RTA_TABLE, &254u32.to_ne_bytes()));
        payload.extend(nla(RTA_DST, &[10, 0, 0, 0]));
        payload.extend(nla(RTA_PREFSRC, &[10, 0, 0, 2]));
        payload.extend(nla(RTA_OIF, &2u32.to_ne_bytes()));
        assert_eq!(
            route(&payload, &names()).unwrap(),
            "10.0.0.0/24 dev eth0 proto kernel scope link src 10.0.0.2 table main"
        );
        // local 10.0.0.2 dev eth0, table local; a default route via a gateway.
        let mut local = vec![libc::AF_INET as u8, 32, 0, 0, 255, 2, 254, 2, 0, 0, 0, 0];
        local.extend(nla(RTA_DST, &[10, 0, 0, 2]));
        local.extend(nla(RTA_OIF, &2u32.to_ne_bytes()));
        assert_eq!(
            route(&local, &names()).unwrap(),
            "local 10.0.0.2 dev eth0 proto kernel scope host table local"
        );
        let mut default = vec![libc::AF_INET as u8, 0, 0, 0, 254, 4, 0, 1, 0, 0, 0, 0];
        default.extend(nla(RTA_GATEWAY, &[10, 0, 0, 1]));
        default.extend(nla(RTA_OIF, &7u32.to_ne_bytes()));
        assert_eq!(
            route(&default, &names()).unwrap(),
            "default via 10.0.0.1 dev if7 proto static scope global table main"
        );
        assert_eq!(route(&[2, 0, 0], &names()), None);
    }
}
