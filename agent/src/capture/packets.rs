//! Packets of a network namespace: one `AF_PACKET` socket per interface that is up, opened on a
//! short-lived thread inside the namespace ([`crate::enter::in_netns`]) and read from the
//! caller's own — a socket stays in the namespace it was made in. Each socket carries the
//! compiled filter and snapshot length, so the kernel queues only what is kept; loopback's
//! outgoing copy of each packet is ignored (`PACKET_IGNORE_OUTGOING`), as libpcap drops it. The
//! capture ends at its duration, its packet cap, the first packet its byte cap has no room for,
//! or when asked to stop; the kernel's counters (`PACKET_STATISTICS`) go into each interface's
//! statistics block, and the sockets are closed before [`run`] returns.

use std::{
    fs::File,
    io::Write,
    mem::{size_of, zeroed},
    os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd},
    sync::atomic::{AtomicU8, Ordering},
    time::{Duration, Instant},
};

use super::{
    GRANTED_BY,
    filter::{self, FilterError, Link, Snaplen},
    pcapng::{self, Idb, Isb, Writer},
    sockopt::{force_receive_buffer, setsockopt},
};
use crate::enter;

/// When a capture ends, at the first reached.
#[derive(Debug, Clone, Copy)]
pub struct Bounds {
    pub duration: Duration,
    /// Of the files written, all together.
    pub max_bytes: u64,
    pub max_packets: u64,
}

const ARPHRD_ETHER: u16 = 1;
const ARPHRD_LOOPBACK: u16 = 772;
const ARPHRD_NONE: u16 = 0xfffe;
const PACKET_IGNORE_OUTGOING: libc::c_int = 23;
const RCVBUF: libc::c_int = 4 << 20;
/// Reads per ready socket before the others get their turn.
const BATCH: usize = 256;

/// One interface's socket.
pub struct Tap {
    fd: OwnedFd,
    pub index: u32,
    pub name: String,
    pub link: Link,
    pub idb: Idb,
    /// The receive buffer the kernel granted.
    pub rcvbuf: usize,
}

/// The sockets of a namespace, and the interfaces not captured with why.
pub struct Taps {
    pub taps: Vec<Tap>,
    pub skipped: Vec<String>,
}

/// An interface as `getifaddrs` tells it inside the namespace.
#[derive(Debug, Default)]
struct Interface {
    index: u32,
    name: String,
    up: bool,
    hatype: u16,
    mac: Option<[u8; 6]>,
    ipv4: Vec<([u8; 4], [u8; 4])>,
    ipv6: Vec<([u8; 16], u8)>,
}

#[derive(Debug)]
pub enum OpenError {
    Filter(FilterError),
    Other(String),
}

/// Opens a socket for each interface of `netns` that is up and Ethernet, loopback or bare IP,
/// with `filter` (libpcap's language; none: every packet) and `snap`. `describe` words an
/// interface's description from its name.
pub fn open(
    netns: &File,
    filter: Option<&str>,
    snap: Snaplen,
    describe: &(dyn Fn(&str) -> String + Sync),
) -> Result<Taps, OpenError> {
    let ether = filter::compile(filter, Link::Ethernet, snap).map_err(OpenError::Filter)?;
    // Compiled when a bare-IP interface is found: a filter of Ethernet words fails only then.
    let mut raw = None;
    let opened = enter::in_netns(netns, || -> Result<Taps, OpenError> {
        let mut taps = Taps { taps: Vec::new(), skipped: Vec::new() };
        for interface in interfaces().map_err(OpenError::Other)? {
            let link = match interface.hatype {
                ARPHRD_ETHER | ARPHRD_LOOPBACK => Link::Ethernet,
                ARPHRD_NONE => Link::Raw,
                other => {
                    taps.skipped.push(format!("{}: link type {other} is not captured", interface.name));
                    continue;
                }
            };
            if !interface.up {
                taps.skipped.push(format!("{}: down", interface.name));
                continue;
            }
            let program = match link {
                Link::Ethernet => &ether,
                Link::Raw => match &mut raw {
                    Some(raw) => raw,
                    none => none.insert(filter::compile(filter, Link::Raw, snap).map_err(OpenError::Filter)?),
                },
            };
            let (fd, rcvbuf) =
                socket(&interface, program, interface.hatype == ARPHRD_LOOPBACK).map_err(OpenError::Other)?;
            let idb = Idb {
                linktype: if link == Link::Ethernet {
                    pcapng::LINKTYPE_ETHERNET
                } else {
                    pcapng::LINKTYPE_RAW
                },
                snaplen: snap.idb(),
                name: interface.name.clone(),
                description: describe(&interface.name),
                ipv4: interface.ipv4,
                ipv6: interface.ipv6,
                mac: interface.mac.filter(|m| *m != [0; 6]),
                filter: filter.map(str::to_string),
            };
            taps.taps.push(Tap { fd, index: interface.index, name: interface.name, link, idb, rcvbuf });
        }
        Ok(taps)
    });
    opened.map_err(OpenError::Other)?
}

/// The namespace's interfaces, from `getifaddrs` (a netlink dump made in the calling thread's
/// namespace).
fn interfaces() -> Result<Vec<Interface>, String> {
    let mut list: Vec<Interface> = Vec::new();
    let mut head: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs fills `head`, freed below; each entry is read while the list lives.
    unsafe {
        if libc::getifaddrs(&mut head) != 0 {
            return Err(format!("listing the namespace's interfaces: {}", std::io::Error::last_os_error()));
        }
        let mut at = head;
        while !at.is_null() {
            let entry = &*at;
            at = entry.ifa_next;
            if entry.ifa_addr.is_null() || entry.ifa_name.is_null() {
                continue;
            }
            let name = std::ffi::CStr::from_ptr(entry.ifa_name).to_string_lossy().into_owned();
            let family = i32::from((*entry.ifa_addr).sa_family);
            if family == libc::AF_PACKET {
                let ll = &*(entry.ifa_addr as *const libc::sockaddr_ll);
                let mac = (ll.sll_halen == 6).then(|| ll.sll_addr[..6].try_into().unwrap_or([0; 6]));
                list.push(Interface {
                    index: ll.sll_ifindex as u32,
                    name,
                    up: entry.ifa_flags & libc::IFF_UP as u32 != 0,
                    hatype: ll.sll_hatype,
                    mac,
                    ..Default::default()
                });
                continue;
            }
            let Some(interface) = list.iter_mut().find(|i| i.name == name) else { continue };
            if family == libc::AF_INET && !entry.ifa_netmask.is_null() {
                let addr = &*(entry.ifa_addr as *const libc::sockaddr_in);
                let mask = &*(entry.ifa_netmask as *const libc::sockaddr_in);
                interface.ipv4.push((addr.sin_addr.s_addr.to_ne_bytes(), mask.sin_addr.s_addr.to_ne_bytes()));
            } else if family == libc::AF_INET6 && !entry.ifa_netmask.is_null() {
                let addr = &*(entry.ifa_addr as *const libc::sockaddr_in6);
                let mask = &*(entry.ifa_netmask as *const libc::sockaddr_in6);
                let prefix = mask.sin6_addr.s6_addr.iter().map(|b| b.count_ones()).sum::<u32>() as u8;
                interface.ipv6.push((addr.sin6_addr.s6_addr, prefix));
            }
        }
        libc::freeifaddrs(head);
    }
    Ok(list)
}

/// A packet socket on `interface`, its filter attached before it is bound (protocol 0 until
/// then: nothing is queued unfiltered).
fn socket(
    interface: &Interface,
    program: &filter::Program,
    loopback: bool,
) -> Result<(OwnedFd, usize), String> {
    let name = &interface.name;
    // SAFETY: a new socket, owned at once.
    let raw = unsafe {
        libc::socket(libc::AF_PACKET, libc::SOCK_RAW | libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK, 0)
    };
    if raw < 0 {
        let e = std::io::Error::last_os_error();
        return Err(match e.raw_os_error() {
            Some(libc::EPERM) => format!(
                "opening a packet socket in the pod's network namespace was refused: the agent needs \
                 CAP_NET_RAW, which {GRANTED_BY} grants"
            ),
            _ => format!("opening a packet socket for {name}: {e}"),
        });
    }
    // SAFETY: `raw` is a descriptor this function just made.
    let fd = unsafe { OwnedFd::from_raw_fd(raw) };
    let fprog =
        libc::sock_fprog { len: program.insns.len() as u16, filter: program.insns.as_ptr().cast_mut() };
    let on: libc::c_int = 1;
    setsockopt(&fd, libc::SOL_SOCKET, libc::SO_ATTACH_FILTER, &fprog)
        .map_err(|e| format!("attaching the filter to {name}'s socket: {e}"))?;
    setsockopt(&fd, libc::SOL_PACKET, libc::PACKET_AUXDATA, &on)
        .map_err(|e| format!("{name}: PACKET_AUXDATA: {e}"))?;
    setsockopt(&fd, libc::SOL_SOCKET, libc::SO_TIMESTAMPNS, &on)
        .map_err(|e| format!("{name}: SO_TIMESTAMPNS: {e}"))?;
    force_receive_buffer(&fd, RCVBUF).map_err(|e| format!("{name}: SO_RCVBUF: {e}"))?;
    if loopback {
        setsockopt(&fd, libc::SOL_PACKET, PACKET_IGNORE_OUTGOING, &on)
            .map_err(|e| format!("{name}: PACKET_IGNORE_OUTGOING: {e}"))?;
    }
    let mut rcvbuf: libc::c_int = 0;
    let mut len = size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: an int option read into an int.
    unsafe {
        libc::getsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_RCVBUF,
            (&mut rcvbuf as *mut libc::c_int).cast(),
            &mut len,
        )
    };
    // SAFETY: zeroed is a valid sockaddr_ll.
    let mut addr: libc::sockaddr_ll = unsafe { zeroed() };
    addr.sll_family = libc::AF_PACKET as u16;
    addr.sll_protocol = (libc::ETH_P_ALL as u16).to_be();
    addr.sll_ifindex = interface.index as i32;
    // SAFETY: a sockaddr_ll with its size.
    let rc = unsafe {
        libc::bind(
            fd.as_raw_fd(),
            (&addr as *const libc::sockaddr_ll).cast(),
            size_of::<libc::sockaddr_ll>() as libc::socklen_t,
        )
    };
    if rc != 0 {
        return Err(format!("binding the packet socket to {name}: {}", std::io::Error::last_os_error()));
    }
    Ok((fd, rcvbuf.max(0) as usize))
}

/// One interface's outcome.
#[derive(Debug, Clone, Default)]
pub struct InterfaceReport {
    pub name: String,
    pub index: u32,
    /// pcapng's link type of its file.
    pub linktype: u16,
    /// Packets the kernel's filter accepted (those dropped included).
    pub accepted: u64,
    /// Dropped for want of socket buffer.
    pub dropped: u64,
    pub written: u64,
    /// The socket's receive buffer, as the kernel granted it.
    pub rcvbuf: usize,
}

#[derive(Debug, Clone, Default)]
pub struct PacketsReport {
    pub interfaces: Vec<InterfaceReport>,
    pub packets: u64,
    pub file_bytes: u64,
    /// What ended the capture before its duration.
    pub cut: Option<String>,
}

/// Where each link type's packets go: `ether` for Ethernet and loopback, `raw` for bare IP.
pub struct Outputs<'a, W: Write> {
    pub ether: Option<&'a mut Writer<W>>,
    pub raw: Option<&'a mut Writer<W>>,
}

/// `tpacket_auxdata`, as the kernel hands it in a control message.
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct AuxData {
    status: u32,
    len: u32,
    snaplen: u32,
    mac: u16,
    net: u16,
    vlan_tci: u16,
    vlan_tpid: u16,
}

const TP_STATUS_VLAN_VALID: u32 = 1 << 4;
const TP_STATUS_VLAN_TPID_VALID: u32 = 1 << 6;

/// Why a capture ends before its bounds: asked (`kstall capture stop`, the CLI's SIGINT), or the
/// agent shutting down. One atomic, as a signal handler sets it.
pub struct Stop(AtomicU8);

const RUNNING: u8 = 0;
const ASKED: u8 = 1;
const SHUTDOWN: u8 = 2;

impl Stop {
    pub const fn new() -> Self {
        Stop(AtomicU8::new(RUNNING))
    }

    pub fn ask(&self) {
        let _ = self.0.compare_exchange(RUNNING, ASKED, Ordering::Relaxed, Ordering::Relaxed);
    }

    pub fn shutting_down(&self) {
        let _ = self.0.compare_exchange(RUNNING, SHUTDOWN, Ordering::Relaxed, Ordering::Relaxed);
    }

    /// The cut a stop after `elapsed` makes, if one was asked for.
    fn cut(&self, elapsed: Duration) -> Option<String> {
        let secs = elapsed.as_secs_f64();
        match self.0.load(Ordering::Relaxed) {
            RUNNING => None,
            SHUTDOWN => Some(format!("the agent shut down after {secs:.1} s")),
            _ => Some(format!("stopped after {secs:.1} s")),
        }
    }
}

impl Default for Stop {
    fn default() -> Self {
        Self::new()
    }
}

/// Reads `taps` into `outputs` until `bounds` or `stop`; writes each interface's statistics block;
/// closes the sockets.
pub fn run<W: Write>(
    taps: Taps,
    outputs: &mut Outputs<'_, W>,
    bounds: Bounds,
    stop: &Stop,
) -> std::io::Result<PacketsReport> {
    let started = Instant::now();
    let start_ns = crate::kernel::unix_now_ns();
    let taps = taps.taps;
    // Interface ids, in the order each output describes them.
    let mut ids = Vec::with_capacity(taps.len());
    for tap in &taps {
        let writer = match tap.link {
            Link::Ethernet => outputs.ether.as_deref_mut(),
            Link::Raw => outputs.raw.as_deref_mut(),
        };
        let writer =
            writer.ok_or_else(|| std::io::Error::other(format!("no file for {}'s packets", tap.name)))?;
        ids.push(writer.interface(&tap.idb)?);
    }
    let files = u64::from(outputs.ether.is_some()) + u64::from(outputs.raw.is_some());
    let mut written = vec![0u64; taps.len()];
    let mut report = PacketsReport::default();
    let mut buffer = vec![0u8; 65536 + 4];
    let mut polls: Vec<libc::pollfd> = taps
        .iter()
        .map(|t| libc::pollfd { fd: t.fd.as_raw_fd(), events: libc::POLLIN, revents: 0 })
        .collect();
    'capture: loop {
        let elapsed = started.elapsed();
        if elapsed >= bounds.duration {
            break;
        }
        if let Some(cut) = stop.cut(elapsed) {
            report.cut = Some(cut);
            break;
        }
        let wait = (bounds.duration - elapsed).min(Duration::from_millis(100));
        // SAFETY: `polls` is a live array of pollfds.
        let ready =
            unsafe { libc::poll(polls.as_mut_ptr(), polls.len() as libc::nfds_t, wait.as_millis() as i32) };
        if ready <= 0 {
            continue;
        }
        for (i, tap) in taps.iter().enumerate() {
            if polls[i].revents == 0 {
                continue;
            }
            polls[i].revents = 0;
            for _ in 0..BATCH {
                let Some(packet) = receive(&tap.fd, &mut buffer) else { break };
                let total: u64 =
                    [&outputs.ether, &outputs.raw].iter().filter_map(|w| w.as_ref()).map(|w| w.bytes()).sum();
                if total + Writer::<W>::packet_bytes(packet.caplen) + pcapng::ISB_RESERVE * files
                    > bounds.max_bytes
                {
                    report.cut = Some(format!(
                        "byte cap {} reached after {:.1} s",
                        size(bounds.max_bytes),
                        started.elapsed().as_secs_f64()
                    ));
                    break 'capture;
                }
                let writer = match tap.link {
                    Link::Ethernet => outputs.ether.as_deref_mut(),
                    Link::Raw => outputs.raw.as_deref_mut(),
                };
                let Some(writer) = writer else { continue };
                writer.packet(
                    ids[i],
                    packet.ts_ns,
                    &buffer[..packet.caplen],
                    packet.orig_len,
                    packet.flags,
                )?;
                written[i] += 1;
                report.packets += 1;
                if report.packets >= bounds.max_packets {
                    report.cut = Some(format!(
                        "packet cap {} reached after {:.1} s",
                        thousands(bounds.max_packets),
                        started.elapsed().as_secs_f64()
                    ));
                    break 'capture;
                }
            }
        }
    }
    let end_ns = crate::kernel::unix_now_ns();
    for (i, tap) in taps.iter().enumerate() {
        let (accepted, dropped) = statistics(&tap.fd);
        let isb = Isb {
            start_ns,
            end_ns,
            accepted,
            dropped,
            delivered: written[i],
            comment: report.cut.as_ref().map(|c| format!("cut: {c}")),
        };
        let writer = match tap.link {
            Link::Ethernet => outputs.ether.as_deref_mut(),
            Link::Raw => outputs.raw.as_deref_mut(),
        };
        if let Some(writer) = writer {
            writer.statistics(ids[i], &isb)?;
        }
        report.interfaces.push(InterfaceReport {
            name: tap.name.clone(),
            index: tap.index,
            linktype: tap.idb.linktype,
            accepted,
            dropped,
            written: written[i],
            rcvbuf: tap.rcvbuf,
        });
    }
    drop(taps);
    report.file_bytes =
        [&outputs.ether, &outputs.raw].iter().filter_map(|w| w.as_ref()).map(|w| w.bytes()).sum();
    Ok(report)
}

struct Received {
    caplen: usize,
    orig_len: u32,
    ts_ns: u64,
    flags: u32,
}

/// One packet into `buffer` (VLAN tag put back, as libpcap does), or `None` when none is queued.
fn receive(fd: &OwnedFd, buffer: &mut [u8]) -> Option<Received> {
    // Room before the frame for a VLAN tag to be re-inserted.
    let room = buffer.len() - 4;
    let mut iov = libc::iovec { iov_base: buffer[4..].as_mut_ptr().cast(), iov_len: room };
    // SAFETY: zeroed sockaddr_ll and msghdr are valid; the control buffer is aligned by u64s.
    let mut from: libc::sockaddr_ll = unsafe { zeroed() };
    let mut control = [0u64; 16];
    let mut msg: libc::msghdr = unsafe { zeroed() };
    msg.msg_name = (&mut from as *mut libc::sockaddr_ll).cast();
    msg.msg_namelen = size_of::<libc::sockaddr_ll>() as libc::socklen_t;
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = size_of::<[u64; 16]>();
    // SAFETY: msg points at live buffers of the sizes given.
    let n = unsafe { libc::recvmsg(fd.as_raw_fd(), &mut msg, libc::MSG_DONTWAIT | libc::MSG_TRUNC) };
    if n < 0 {
        return None;
    }
    let mut caplen = (n as usize).min(room);
    let (mut ts_ns, mut aux) = (0u64, None::<AuxData>);
    // SAFETY: the kernel's control messages, walked with the CMSG macros.
    unsafe {
        let mut cmsg = libc::CMSG_FIRSTHDR(&msg);
        while !cmsg.is_null() {
            let (level, kind, data) = ((*cmsg).cmsg_level, (*cmsg).cmsg_type, libc::CMSG_DATA(cmsg));
            if level == libc::SOL_SOCKET && kind == libc::SO_TIMESTAMPNS {
                let ts = std::ptr::read_unaligned(data as *const libc::timespec);
                ts_ns = ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64;
            } else if level == libc::SOL_PACKET && kind == libc::PACKET_AUXDATA {
                aux = Some(std::ptr::read_unaligned(data as *const AuxData));
            }
            cmsg = libc::CMSG_NXTHDR(&msg, cmsg);
        }
    }
    let aux = aux.unwrap_or_default();
    let mut orig_len = if aux.len != 0 { aux.len } else { n as u32 };
    let mut start = 4;
    if aux.status & TP_STATUS_VLAN_VALID != 0 && caplen >= 12 && from.sll_hatype == ARPHRD_ETHER {
        let tpid = if aux.status & TP_STATUS_VLAN_TPID_VALID != 0 { aux.vlan_tpid } else { 0x8100 };
        // The MAC addresses 4 bytes forward, the tag after them, the rest where it is.
        buffer.copy_within(4..16, 0);
        buffer[12..14].copy_from_slice(&tpid.to_be_bytes());
        buffer[14..16].copy_from_slice(&aux.vlan_tci.to_be_bytes());
        start = 0;
        caplen += 4;
        orig_len += 4;
    }
    if start != 0 {
        buffer.copy_within(start..start + caplen, 0);
    }
    let flags = match from.sll_pkttype {
        libc::PACKET_OUTGOING => pcapng::flags::OUTBOUND,
        libc::PACKET_BROADCAST => pcapng::flags::INBOUND | pcapng::flags::BROADCAST,
        libc::PACKET_MULTICAST => pcapng::flags::INBOUND | pcapng::flags::MULTICAST,
        libc::PACKET_OTHERHOST => pcapng::flags::INBOUND | pcapng::flags::PROMISCUOUS,
        _ => pcapng::flags::INBOUND | pcapng::flags::UNICAST,
    };
    Some(Received {
        caplen,
        orig_len,
        ts_ns: if ts_ns == 0 { crate::kernel::unix_now_ns() } else { ts_ns },
        flags,
    })
}

/// The kernel's counters of the socket: accepted (drops included) and dropped.
fn statistics(fd: &OwnedFd) -> (u64, u64) {
    let mut stats = libc::tpacket_stats { tp_packets: 0, tp_drops: 0 };
    let mut len = size_of::<libc::tpacket_stats>() as libc::socklen_t;
    // SAFETY: PACKET_STATISTICS fills a tpacket_stats.
    unsafe {
        libc::getsockopt(
            fd.as_raw_fd(),
            libc::SOL_PACKET,
            libc::PACKET_STATISTICS,
            (&mut stats as *mut libc::tpacket_stats).cast(),
            &mut len,
        )
    };
    (u64::from(stats.tp_packets), u64::from(stats.tp_drops))
}

/// 1,000,000.
pub fn thousands(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// 64 MiB, 1.5 KiB, 100 B.
pub fn size(bytes: u64) -> String {
    match bytes {
        b if b >= 1 << 30 && b % (1 << 30) == 0 => format!("{} GiB", b >> 30),
        b if b >= 1 << 20 && b % (1 << 20) == 0 => format!("{} MiB", b >> 20),
        b if b >= 1 << 20 => format!("{:.1} MiB", b as f64 / f64::from(1 << 20)),
        b if b >= 1 << 10 && b % (1 << 10) == 0 => format!("{} KiB", b >> 10),
        b if b >= 1 << 10 => format!("{:.1} KiB", b as f64 / 1024.0),
        b => format!("{b} B"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_and_sizes_read_as_the_cut_says_them() {
        assert_eq!(thousands(1_000_000), "1,000,000");
        assert_eq!(thousands(12), "12");
        assert_eq!(size(64 << 20), "64 MiB");
        assert_eq!(size(1536), "1.5 KiB");
        assert_eq!(size(64 << 10), "64 KiB");
        assert_eq!(size(100), "100 B");
    }
}
