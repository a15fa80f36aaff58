//! Socket options the capture's sockets share (packet, netlink).

use std::{
    io,
    mem::size_of,
    os::fd::{AsRawFd as _, OwnedFd},
};

pub fn setsockopt<T>(fd: &OwnedFd, level: libc::c_int, name: libc::c_int, value: &T) -> io::Result<()> {
    // SAFETY: `value` is the option's type, passed with its size.
    let rc = unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            level,
            name,
            (value as *const T).cast(),
            size_of::<T>() as libc::socklen_t,
        )
    };
    if rc == 0 { Ok(()) } else { Err(io::Error::last_os_error()) }
}

/// Sets the receive buffer to `bytes`, past `rmem_max` where the capability allows
/// (`SO_RCVBUFFORCE`, `CAP_NET_ADMIN`), else as far as `rmem_max` does.
pub fn force_receive_buffer(fd: &OwnedFd, bytes: libc::c_int) -> io::Result<()> {
    setsockopt(fd, libc::SOL_SOCKET, libc::SO_RCVBUFFORCE, &bytes)
        .or_else(|_| setsockopt(fd, libc::SOL_SOCKET, libc::SO_RCVBUF, &bytes))
}
