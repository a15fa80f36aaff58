//! The mesh pod's sidecar in the healthy soak (`tests/src/healthy.rs`): does with the connections
//! Istio's rules send it what Envoy does. Outbound (15001): the pod's connections, relayed to their
//! original destination, connected as the proxy's own user, which the rules let through. Inbound
//! (15006): connections to the pod, relayed to the app from 127.0.0.6, which the rules let through
//! too. A connection idle for the idle timeout is closed (FIN); one whose first bytes are `REJECT`
//! is refused there and closed with the rest of its request unread, so the kernel resets it (the
//! proxy's own reset, from an accepted socket). Run as uid 1337 in the pod's network namespace.
//!
//! The other meshes' proxies take other ports and are exempted otherwise: Linkerd's listens on
//! 4140 as uid 2102; ambient's ztunnel on 15001 in the pod's namespace, its own connections marked
//! 0x539 (istio-cni's rules return that mark), which takes root's CAP_NET_ADMIN.
//!
//! `mesh-proxy <idle timeout ms> [<outbound port> <inbound port, 0 for none> <mark, 0 for none>]`

use std::{
    io::{Read, Write},
    net::{Ipv4Addr, Shutdown, SocketAddr, SocketAddrV4, TcpListener, TcpStream},
    os::fd::{AsRawFd, FromRawFd},
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    thread,
    time::{Duration, Instant},
};

/// Envoy's source for inbound passthrough: the rules return it untouched.
const INBOUND_SOURCE: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 6);

const USAGE: &str = "usage: mesh-proxy <idle timeout ms> [<outbound port> <inbound port> <mark>]";

fn main() {
    let args: Vec<u32> = std::env::args().skip(1).map(|a| a.parse().expect(USAGE)).collect();
    let (idle, outbound, inbound, mark) = match args[..] {
        [idle] => (idle, 15001, 15006, 0),
        [idle, outbound, inbound, mark] => (idle, outbound, inbound, mark),
        _ => panic!("{USAGE}"),
    };
    let idle = Duration::from_millis(idle.into());
    let port = |p: u32| u16::try_from(p).expect(USAGE);
    let outbound = TcpListener::bind((Ipv4Addr::UNSPECIFIED, port(outbound))).expect("listen outbound");
    if inbound != 0 {
        let inbound = TcpListener::bind((Ipv4Addr::UNSPECIFIED, port(inbound))).expect("listen inbound");
        thread::spawn(move || serve(inbound, idle, Upstream::Inbound));
    }
    serve(outbound, idle, Upstream::Outbound { mark });
}

/// How the proxy connects on: inbound to the app from Envoy's passthrough address, outbound to
/// the original destination (marked, for ambient's rules).
#[derive(Clone, Copy)]
enum Upstream {
    Inbound,
    Outbound { mark: u32 },
}

fn serve(listener: TcpListener, idle: Duration, upstream: Upstream) {
    for downstream in listener.incoming().flatten() {
        thread::spawn(move || {
            let _ = relay(downstream, idle, upstream);
        });
    }
}

fn relay(mut downstream: TcpStream, idle: Duration, upstream: Upstream) -> std::io::Result<()> {
    let destination = original_destination(&downstream)?;
    let mut first = [0u8; 6];
    let n = downstream.peek(&mut first)?;
    if first[..n].starts_with(b"REJECT") {
        // Refused with its request unread: the kernel answers the close with RST.
        downstream.read_exact(&mut first)?;
        return Ok(());
    }
    let upstream = match upstream {
        Upstream::Inbound => connect(Some(INBOUND_SOURCE), 0, destination)?,
        Upstream::Outbound { mark: 0 } => TcpStream::connect(destination)?,
        Upstream::Outbound { mark } => connect(None, mark, destination)?,
    };
    let last = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let pipe = move |mut from: TcpStream, mut to: TcpStream, last: Arc<AtomicU64>| {
        let mut buf = [0u8; 16 << 10];
        from.set_read_timeout(Some(idle / 4)).ok();
        loop {
            match from.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => {
                    last.store(started.elapsed().as_millis() as u64, Ordering::Relaxed);
                    if to.write_all(&buf[..n]).is_err() {
                        break;
                    }
                }
                Err(e)
                    if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) =>
                {
                    let quiet = started.elapsed().as_millis() as u64 - last.load(Ordering::Relaxed);
                    if quiet >= idle.as_millis() as u64 {
                        break;
                    }
                }
                Err(_) => break,
            }
        }
        // Either side done or idle: both closed, as Envoy closes an idle connection.
        let _ = from.shutdown(Shutdown::Both);
        let _ = to.shutdown(Shutdown::Both);
    };
    let (down2, up2, last2) = (downstream.try_clone()?, upstream.try_clone()?, last.clone());
    let back = thread::spawn(move || pipe(up2, down2, last2));
    pipe(downstream, upstream, last);
    let _ = back.join();
    Ok(())
}

/// Where the connection was going before the rules redirected it (`SO_ORIGINAL_DST`).
fn original_destination(stream: &TcpStream) -> std::io::Result<SocketAddr> {
    const SO_ORIGINAL_DST: libc::c_int = 80;
    // SAFETY: a zeroed sockaddr_in is valid; getsockopt writes at most `len` bytes into it.
    let mut addr: libc::sockaddr_in = unsafe { std::mem::zeroed() };
    let mut len = size_of::<libc::sockaddr_in>() as libc::socklen_t;
    // SAFETY: the fd is the stream's, open; addr and len are valid for the call.
    let rc = unsafe {
        libc::getsockopt(
            stream.as_raw_fd(),
            libc::SOL_IP,
            SO_ORIGINAL_DST,
            (&mut addr as *mut libc::sockaddr_in).cast(),
            &mut len,
        )
    };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    let ip = Ipv4Addr::from(u32::from_be(addr.sin_addr.s_addr));
    Ok(SocketAddr::V4(SocketAddrV4::new(ip, u16::from_be(addr.sin_port))))
}

/// A connection to `to`, from address `from` (any port) when given, its packets marked `mark`
/// when not 0.
fn connect(from: Option<Ipv4Addr>, mark: u32, to: SocketAddr) -> std::io::Result<TcpStream> {
    let SocketAddr::V4(to) = to else { return Err(std::io::Error::other("IPv4 only")) };
    let sockaddr = |ip: Ipv4Addr, port: u16| libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: port.to_be(),
        sin_addr: libc::in_addr { s_addr: u32::from(ip).to_be() },
        sin_zero: [0; 8],
    };
    let len = size_of::<libc::sockaddr_in>() as libc::socklen_t;
    // SAFETY: plain socket calls on a descriptor this function owns; the addresses live through
    // each call.
    unsafe {
        let fd = libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0);
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        let stream = TcpStream::from_raw_fd(fd);
        if let Some(from) = from {
            let local = sockaddr(from, 0);
            if libc::bind(fd, (&local as *const libc::sockaddr_in).cast(), len) != 0 {
                return Err(std::io::Error::last_os_error());
            }
        }
        if mark != 0 {
            let size = size_of::<u32>() as libc::socklen_t;
            if libc::setsockopt(fd, libc::SOL_SOCKET, libc::SO_MARK, (&mark as *const u32).cast(), size) != 0
            {
                return Err(std::io::Error::last_os_error());
            }
        }
        let remote = sockaddr(*to.ip(), to.port());
        if libc::connect(fd, (&remote as *const libc::sockaddr_in).cast(), len) != 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(stream)
    }
}
