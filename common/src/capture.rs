//! The filter of a one-off capture (`kstall trace --standalone`): an agent run for one capture
//! drops events of other processes or ports in the kernel, before the ring buffer. The node
//! agent leaves it empty — its metrics and incidents need every event.

/// 0 in a field: no filter on it.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CaptureFilter {
    /// Keep events whose task (tgid or tid) is this.
    pub pid: u32,
    /// Keep events that carry this port (a reset's local, remote or original port, an NFS
    /// server's port); events without ports are dropped when it is set.
    pub port: u16,
    pub _pad: u16,
}

const _: () = assert!(size_of::<CaptureFilter>() == 8);

// SAFETY: repr(C), only integer fields, no implicit padding.
#[cfg(feature = "user")]
unsafe impl aya::Pod for CaptureFilter {}
