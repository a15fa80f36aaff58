//! Event types shared by kstall's kernel programs and its agent.
//!
//! Everything here crosses the kernel/user boundary as raw bytes: `#[repr(C)]`, `Copy`, fixed-width
//! integers only (no `bool`, no Rust enums in kernel-written fields), padding written out, and the
//! size pinned by a compile-time assertion. Kind ids are stable and never reused.
#![no_std]

pub mod capture;
pub mod counter;
pub mod cpu_lockup;
pub mod header;
pub mod hung_task;
pub mod metrics;
pub mod nfs;
pub mod oom;
pub mod packet_drop;
pub mod span;
pub mod stuck_task;
pub mod task;
pub mod tcp_reset;

pub use header::{EventHeader, TASK_COMM_LEN};

/// Stable event kind ids (`EventHeader::kind`). Never reuse a retired number.
pub mod kind {
    pub const TCP_RESET: u32 = 1;
    pub const HUNG_TASK: u32 = 2;
    pub const OOM_KILL: u32 = 3;
    pub const NFS: u32 = 4;
    pub const STUCK_TASK: u32 = 5;
    pub const CPU_LOCKUP: u32 = 6;
    pub const PACKET_DROP: u32 = 7;
    /// One past the highest kind: sizes the per-kind loss counter map.
    pub const COUNT: u32 = 8;
}
