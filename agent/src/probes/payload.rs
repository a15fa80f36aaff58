//! What an event says, typed: one variant per event kind of the registered probes, each wrapping
//! its probe's type (`probes/<probe>/event.rs`). Generic code reads a payload through its kind's
//! [`EventData`]; signatures and metrics match the variants they care about.

use serde::Serialize;

use super::{
    cleared::HungTaskCleared,
    cpu_lockup::event::CpuLockup,
    hung_task::event::HungTask,
    kind::{EventData, EventKind},
    nfs::event::{Nfs, NfsCount, NfsLatency},
    oom::event::{OomKill, OomKillCount},
    packet_drop::event::{DropCount, PacketDrop},
    stuck_task::event::StuckTaskSample,
    tcp_reset::event::{ResetCount, TcpReset},
};

#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Payload {
    TcpReset(TcpReset),
    /// One interval's resets of one series, read from the kernel's counters (not the ring
    /// buffer): exact, and how many were not sent in full.
    TcpResetCount(ResetCount),
    /// A task newly reported hung by the kernel's detector (reports of a task already known are
    /// folded into it).
    HungTask(HungTask),
    /// A task newly found stuck by the sampler, killable sleeps included (likewise folded).
    StuckTask(StuckTaskSample),
    /// A stuck task, however found, that left D state or exited.
    HungTaskCleared(HungTaskCleared),
    OomKill(OomKill),
    /// One interval's OOM kills of one series, from the kernel's counters, as `TcpResetCount`.
    OomKillCount(OomKillCount),
    Nfs(Nfs),
    /// One interval's NFS events of one series, from the kernel's counters, as `TcpResetCount`.
    NfsCount(NfsCount),
    /// One interval's NFS RPC execute times of one caller, server and procedure, from the
    /// kernel's histograms.
    NfsLatency(NfsLatency),
    /// A CPU the kernel's soft-lockup watchdog or RCU's stall detector found stuck.
    CpuLockup(CpuLockup),
    /// A packet the kernel dropped, with its reason (the first of each series in an interval).
    PacketDrop(PacketDrop),
    /// One interval's drops of one series, from the kernel's counters, as `TcpResetCount`.
    PacketDropCount(DropCount),
}

impl Payload {
    /// Its kind's data, through which everything generic reads it (a new kind is one line here).
    pub fn data(&self) -> &dyn EventData {
        match self {
            Payload::TcpReset(p) => p,
            Payload::TcpResetCount(p) => p,
            Payload::HungTask(p) => p,
            Payload::StuckTask(p) => p,
            Payload::HungTaskCleared(p) => p,
            Payload::OomKill(p) => p,
            Payload::OomKillCount(p) => p,
            Payload::Nfs(p) => p,
            Payload::NfsCount(p) => p,
            Payload::NfsLatency(p) => p,
            Payload::CpuLockup(p) => p,
            Payload::PacketDrop(p) => p,
            Payload::PacketDropCount(p) => p,
        }
    }

    pub fn kind(&self) -> &'static EventKind {
        self.data().kind()
    }
}
