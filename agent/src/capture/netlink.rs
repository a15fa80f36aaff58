//! Netlink, as much as a capture reads: a socket of one protocol (made by the caller inside the
//! namespace it is about), a dump (one request, the multi-part reply up to `NLMSG_DONE`, an
//! `NLMSG_ERROR` as its errno), the messages of a received buffer, and the attributes of a
//! message (`NLA_F_NESTED` masked). Nothing here trusts a length it reads: a short or lying
//! message ends the walk with an error, never a panic (fuzz target `netlink_dump`).

use std::{
    fmt, io,
    mem::size_of,
    os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd},
    time::Duration,
};

use super::sockopt::setsockopt;

pub const NETLINK_ROUTE: libc::c_int = 0;
pub const NETLINK_SOCK_DIAG: libc::c_int = 4;
pub const NETLINK_NETFILTER: libc::c_int = 12;

const NLMSG_HDRLEN: usize = 16;
const NLMSG_ERROR: u16 = 2;
const NLMSG_DONE: u16 = 3;
const NLM_F_REQUEST: u16 = 1;
const NLM_F_MULTI: u16 = 2;
const NLM_F_DUMP: u16 = 0x300;
const NLA_TYPE_MASK: u16 = 0x3fff;
/// A dump larger than this is cut (a node-sized conntrack table).
const MAX_DUMP_BYTES: usize = 16 << 20;
const MAX_DUMP_MESSAGES: usize = 50_000;

#[derive(Debug)]
pub enum NlError {
    Io(io::Error),
    /// The kernel's answer: an errno.
    Kernel(i32),
    Malformed(&'static str),
    TooBig,
}

impl fmt::Display for NlError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NlError::Io(e) => write!(f, "{e}"),
            NlError::Kernel(errno) => write!(f, "{}", io::Error::from_raw_os_error(*errno)),
            NlError::Malformed(what) => write!(f, "malformed netlink reply: {what}"),
            NlError::TooBig => write!(
                f,
                "the dump passed {} messages or {} MiB: cut",
                MAX_DUMP_MESSAGES,
                MAX_DUMP_BYTES >> 20
            ),
        }
    }
}

/// A netlink socket of `protocol` in the calling thread's network namespace, joined to the
/// multicast `groups` (a bit mask; 0: none), its reads timed out after `timeout`.
pub fn open(protocol: libc::c_int, groups: u32, timeout: Duration) -> io::Result<OwnedFd> {
    // SAFETY: plain socket(2); the descriptor is owned from here on.
    let raw = unsafe { libc::socket(libc::AF_NETLINK, libc::SOCK_RAW | libc::SOCK_CLOEXEC, protocol) };
    if raw < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a descriptor just made and owned by no one else.
    let fd = unsafe { OwnedFd::from_raw_fd(raw) };
    let tv = libc::timeval { tv_sec: timeout.as_secs() as _, tv_usec: timeout.subsec_micros() as _ };
    setsockopt(&fd, libc::SOL_SOCKET, libc::SO_RCVTIMEO, &tv)?;
    // SAFETY: zeroed sockaddr_nl is valid; family and groups set before bind.
    let mut addr: libc::sockaddr_nl = unsafe { std::mem::zeroed() };
    addr.nl_family = libc::AF_NETLINK as _;
    addr.nl_groups = groups;
    // SAFETY: bind with a sockaddr_nl of its size.
    if unsafe {
        libc::bind(raw, (&addr as *const libc::sockaddr_nl).cast(), size_of::<libc::sockaddr_nl>() as _)
    } != 0
    {
        return Err(io::Error::last_os_error());
    }
    Ok(fd)
}

/// One message of a buffer: its type, flags, sequence number and payload.
#[derive(Debug, Clone, Copy)]
pub struct Message<'a> {
    pub kind: u16,
    pub flags: u16,
    pub seq: u32,
    pub payload: &'a [u8],
}

/// The messages of a received buffer, in order; a message whose length lies ends the walk
/// with an error.
pub fn messages(buf: &[u8]) -> impl Iterator<Item = Result<Message<'_>, NlError>> {
    let mut rest = buf;
    std::iter::from_fn(move || {
        if rest.is_empty() {
            return None;
        }
        if rest.len() < NLMSG_HDRLEN {
            rest = &[];
            return Some(Err(NlError::Malformed("a message shorter than its header")));
        }
        let len = u32::from_ne_bytes(rest[0..4].try_into().unwrap()) as usize;
        if len < NLMSG_HDRLEN || len > rest.len() {
            rest = &[];
            return Some(Err(NlError::Malformed("a message length outside the buffer")));
        }
        let message = Message {
            kind: u16::from_ne_bytes(rest[4..6].try_into().unwrap()),
            flags: u16::from_ne_bytes(rest[6..8].try_into().unwrap()),
            seq: u32::from_ne_bytes(rest[8..12].try_into().unwrap()),
            payload: &rest[NLMSG_HDRLEN..len],
        };
        rest = &rest[align(len).min(rest.len())..];
        Some(Ok(message))
    })
}

/// The errno of an `NLMSG_ERROR` payload (0: an acknowledgement).
pub fn error_of(payload: &[u8]) -> Result<i32, NlError> {
    let bytes = payload.get(0..4).ok_or(NlError::Malformed("an error message without its errno"))?;
    i32::from_ne_bytes(bytes.try_into().unwrap())
        .checked_neg()
        .ok_or(NlError::Malformed("an errno out of range"))
}

/// The attributes of `buf`: (type with the nested and byte-order flags masked, value).
pub fn attrs(buf: &[u8]) -> impl Iterator<Item = (u16, &[u8])> {
    let mut rest = buf;
    std::iter::from_fn(move || {
        if rest.len() < 4 {
            return None;
        }
        let len = usize::from(u16::from_ne_bytes(rest[0..2].try_into().unwrap()));
        let kind = u16::from_ne_bytes(rest[2..4].try_into().unwrap()) & NLA_TYPE_MASK;
        if len < 4 || len > rest.len() {
            rest = &[];
            return None;
        }
        let value = &rest[4..len];
        rest = &rest[align(len).min(rest.len())..];
        Some((kind, value))
    })
}

/// The value of the first attribute `kind` of `buf`.
pub fn attr(buf: &[u8], kind: u16) -> Option<&[u8]> {
    attrs(buf).find(|(k, _)| *k == kind).map(|(_, v)| v)
}

pub fn be16(value: &[u8]) -> Option<u16> {
    Some(u16::from_be_bytes(value.get(0..2)?.try_into().ok()?))
}

pub fn be32(value: &[u8]) -> Option<u32> {
    Some(u32::from_be_bytes(value.get(0..4)?.try_into().ok()?))
}

pub fn ne32(value: &[u8]) -> Option<u32> {
    Some(u32::from_ne_bytes(value.get(0..4)?.try_into().ok()?))
}

/// An address of 4 or 16 bytes, as text.
pub fn ip(value: &[u8]) -> Option<std::net::IpAddr> {
    match value.len() {
        4 => Some(<[u8; 4]>::try_from(value).ok()?.into()),
        16 => Some(<[u8; 16]>::try_from(value).ok()?.into()),
        _ => None,
    }
}

fn align(len: usize) -> usize {
    (len + 3) & !3
}

/// Sends a dump request of `kind` with `payload` on `fd` and returns the reply's payloads, up to
/// `NLMSG_DONE`; an `NLMSG_ERROR` ends it with its errno.
pub fn dump(fd: &OwnedFd, kind: u16, payload: &[u8]) -> Result<Vec<Vec<u8>>, NlError> {
    let seq: u32 = 1;
    let mut request = Vec::with_capacity(NLMSG_HDRLEN + payload.len());
    request.extend_from_slice(&((NLMSG_HDRLEN + payload.len()) as u32).to_ne_bytes());
    request.extend_from_slice(&kind.to_ne_bytes());
    request.extend_from_slice(&(NLM_F_REQUEST | NLM_F_DUMP).to_ne_bytes());
    request.extend_from_slice(&seq.to_ne_bytes());
    request.extend_from_slice(&0u32.to_ne_bytes());
    request.extend_from_slice(payload);
    // SAFETY: send of a buffer of its length on a descriptor held open.
    if unsafe { libc::send(fd.as_raw_fd(), request.as_ptr().cast(), request.len(), 0) } < 0 {
        return Err(NlError::Io(io::Error::last_os_error()));
    }
    let mut buf = vec![0u8; 64 << 10];
    let (mut out, mut total) = (Vec::new(), 0usize);
    loop {
        let n = recv(fd, &mut buf)?;
        if n == 0 {
            return Err(NlError::Malformed("the socket closed before the dump's end"));
        }
        for message in messages(&buf[..n]) {
            let message = message?;
            if message.seq != seq {
                continue;
            }
            match message.kind {
                NLMSG_DONE => return Ok(out),
                NLMSG_ERROR => match error_of(message.payload)? {
                    0 => return Ok(out),
                    errno => return Err(NlError::Kernel(errno)),
                },
                _ => {
                    total += message.payload.len();
                    if out.len() >= MAX_DUMP_MESSAGES || total > MAX_DUMP_BYTES {
                        return Err(NlError::TooBig);
                    }
                    out.push(message.payload.to_vec());
                    if message.flags & NLM_F_MULTI == 0 {
                        return Ok(out);
                    }
                }
            }
        }
    }
}

/// One read of `fd` into `buf`: its length; a read timed out or interrupted is retried by the
/// caller's loop as an error of its kind.
pub fn recv(fd: &OwnedFd, buf: &mut [u8]) -> Result<usize, NlError> {
    loop {
        // SAFETY: recv into a buffer of its length.
        let n = unsafe { libc::recv(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
        if n >= 0 {
            return Ok(n as usize);
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(NlError::Io(e));
        }
    }
}

#[cfg(test)]
pub mod tests {
    use super::*;

    /// An attribute as the kernel writes it: length, type, value, padded to 4.
    pub fn nla(kind: u16, value: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        out.extend_from_slice(&((4 + value.len()) as u16).to_ne_bytes());
        out.extend_from_slice(&kind.to_ne_bytes());
        out.extend_from_slice(value);
        out.resize(align(out.len()), 0);
        out
    }

    /// A message: header then payload.
    pub fn msg(kind: u16, flags: u16, seq: u32, payload: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        out.extend_from_slice(&((NLMSG_HDRLEN + payload.len()) as u32).to_ne_bytes());
        out.extend_from_slice(&kind.to_ne_bytes());
        out.extend_from_slice(&flags.to_ne_bytes());
        out.extend_from_slice(&seq.to_ne_bytes());
        out.extend_from_slice(&0u32.to_ne_bytes());
        out.extend_from_slice(payload);
        out.resize(align(out.len()), 0);
        out
    }

    #[test]
    fn attributes_are_walked_with_padding_and_the_nested_flag_masked() {
        let mut buf = nla(3, b"eth0\0");
        buf.extend(nla(0x8000 | 1, &nla(2, &[1, 2, 3, 4])));
        buf.extend(nla(7, &[]));
        let got: Vec<(u16, Vec<u8>)> = attrs(&buf).map(|(k, v)| (k, v.to_vec())).collect();
        assert_eq!(got.len(), 3);
        assert_eq!(got[0], (3, b"eth0\0".to_vec()));
        assert_eq!(got[1].0, 1);
        assert_eq!(attr(&got[1].1, 2), Some(&[1u8, 2, 3, 4][..]));
        assert_eq!(got[2], (7, vec![]));
    }

    #[test]
    fn a_lying_length_ends_the_walk() {
        let mut buf = nla(1, &[9; 4]);
        buf.extend_from_slice(&[200, 0, 2, 0, 1]);
        assert_eq!(attrs(&buf).count(), 1);
        let mut messages_buf = msg(16, 2, 1, &[0; 4]);
        messages_buf.extend_from_slice(&[0xff, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
        let got: Vec<_> = messages(&messages_buf).collect();
        assert_eq!(got.len(), 2);
        assert!(got[0].is_ok());
        assert!(matches!(got[1], Err(NlError::Malformed(_))));
    }

    #[test]
    fn an_error_message_gives_its_errno() {
        let buf = msg(NLMSG_ERROR, 0, 1, &(-libc::EPERM).to_ne_bytes());
        let message = messages(&buf).next().unwrap().unwrap();
        assert_eq!(message.kind, NLMSG_ERROR);
        assert_eq!(error_of(message.payload).unwrap(), libc::EPERM);
        // Found by the fuzz target netlink_dump: i32::MIN has no negation.
        assert!(matches!(error_of(&i32::MIN.to_ne_bytes()), Err(NlError::Malformed(_))));
    }
}
