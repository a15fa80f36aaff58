//! What the kernel said, typed: the one place raw ring-buffer records become [`Event`]s (each
//! probe decodes its own record; this reads the header and dispatches). Nothing downstream sees
//! bytes. Decoding never panics: short, unknown or garbage records are errors, counted by the
//! caller.

use std::sync::atomic::{AtomicU64, Ordering};

use kstall_common::{
    EventHeader, hung_task::HungTaskEvent, kind, nfs::NfsEvent, oom::OomKillEvent,
    stuck_task::StuckTaskEvent, tcp_reset::TcpResetEvent,
};
use serde::Serialize;

use crate::{
    decode::{DecodeError, check_version, comm_string, read_record},
    kernel,
    probes::{
        self, Decoding, EventData, EventKind,
        hung_task::{self, HungTask},
        nfs::{self, Nfs, NfsCount},
        oom::{self, OomKill, OomKillCount},
        stuck_task::{self, StuckTaskSample},
        tcp_reset::{self, ResetCount, TcpReset},
        wait::HungTaskCleared,
    },
};

/// Fields every event carries. `pid`/`tgid`/`comm`/`cgroup_id` are the task the kernel was running
/// when the hook fired; `netns` is the event's own network namespace.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Header {
    pub probe: &'static str,
    pub time_unix_ns: u64,
    pub tgid: u32,
    pub pid: u32,
    pub comm: String,
    pub cgroup_id: u64,
    pub netns: u32,
}

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
        }
    }

    pub fn kind(&self) -> &'static EventKind {
        self.data().kind()
    }
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Event {
    #[serde(flatten)]
    pub header: Header,
    #[serde(flatten)]
    pub payload: Payload,
}

/// Decodes records with what loading the probes learnt of this kernel ([`Decoding`]), stamping
/// them with wall-clock time.
#[derive(Clone)]
pub struct Decoder {
    probes: Decoding,
    boot_to_unix_ns: i128,
}

impl Default for Decoder {
    fn default() -> Self {
        Self::new(Decoding::default())
    }
}

impl Decoder {
    pub fn new(probes: Decoding) -> Self {
        Self { probes, boot_to_unix_ns: kernel::boot_to_unix_offset_ns() }
    }

    /// What OOM kills are decoded with: also what their counts are.
    pub fn oom_context(&self) -> &oom::Context {
        &self.probes.oom
    }

    pub fn decode(&self, bytes: &[u8]) -> Result<Event, DecodeError> {
        let raw_header: EventHeader = read_record(bytes, "event header")?;
        let (probe, payload) = match raw_header.kind {
            kind::TCP_RESET => {
                check_version(&raw_header, kstall_common::tcp_reset::VERSION)?;
                let raw: TcpResetEvent = read_record(bytes, "tcp_reset event")?;
                (tcp_reset::NAME, Payload::TcpReset(tcp_reset::decode(&raw, &self.probes.tcp_reset)?))
            }
            kind::HUNG_TASK => {
                check_version(&raw_header, kstall_common::hung_task::VERSION)?;
                let raw: HungTaskEvent = read_record(bytes, "hung_task event")?;
                (
                    hung_task::NAME,
                    Payload::HungTask(hung_task::decode(&raw, &self.probes.symbols, self.probes.clock)?),
                )
            }
            kind::OOM_KILL => {
                check_version(&raw_header, kstall_common::oom::VERSION)?;
                let raw: OomKillEvent = read_record(bytes, "oom_kill event")?;
                (oom::NAME, Payload::OomKill(oom::decode(&raw, &self.probes.symbols, &self.probes.oom)?))
            }
            kind::STUCK_TASK => {
                check_version(&raw_header, kstall_common::stuck_task::VERSION)?;
                let raw: StuckTaskEvent = read_record(bytes, "stuck_task event")?;
                (stuck_task::NAME, Payload::StuckTask(stuck_task::decode(&raw, &self.probes.symbols)?))
            }
            kind::NFS => {
                check_version(&raw_header, kstall_common::nfs::VERSION)?;
                let raw: NfsEvent = read_record(bytes, "nfs event")?;
                (nfs::NAME, Payload::Nfs(nfs::decode(&raw, self.probes.clock)?))
            }
            other => return Err(DecodeError::UnknownKind(other)),
        };
        let time_unix_ns =
            (i128::from(raw_header.timestamp_ns) + self.boot_to_unix_ns).clamp(0, u64::MAX.into()) as u64;
        Ok(Event {
            header: Header {
                probe,
                time_unix_ns,
                tgid: raw_header.tgid,
                pid: raw_header.pid,
                comm: comm_string(&raw_header.comm),
                cgroup_id: raw_header.cgroup_id,
                netns: raw_header.netns_ino,
            },
            payload,
        })
    }
}

/// Records received from the kernel and records it could not queue (ring buffer full), per
/// probe: counted by the pipeline and the loss poller, read by `/metrics` when scraped and by
/// `kstall status`.
#[derive(Debug, Default)]
pub struct Counts {
    received: [AtomicU64; probes::ALL.len()],
    lost: [AtomicU64; probes::ALL.len()],
    /// Counted in the kernel and not sent in full (sampling).
    suppressed: [AtomicU64; probes::ALL.len()],
}

impl Counts {
    pub fn received(&self, probe: &str) {
        if let Some(i) = probes::position(probe) {
            self.received[i].fetch_add(1, Ordering::Relaxed);
        }
    }

    pub fn add_lost(&self, probe: &str, n: u64) {
        if let Some(i) = probes::position(probe) {
            self.lost[i].fetch_add(n, Ordering::Relaxed);
        }
    }

    pub fn suppressed(&self, probe: &str, n: u64) {
        if let Some(i) = probes::position(probe) {
            self.suppressed[i].fetch_add(n, Ordering::Relaxed);
        }
    }

    pub fn suppressed_of(&self, probe: &str) -> u64 {
        probes::position(probe).map(|i| self.suppressed[i].load(Ordering::Relaxed)).unwrap_or_default()
    }

    /// (received, lost) of `probe`.
    pub fn of(&self, probe: &str) -> (u64, u64) {
        probes::position(probe)
            .map(|i| (self.received[i].load(Ordering::Relaxed), self.lost[i].load(Ordering::Relaxed)))
            .unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{decode::bytes_of, probes::tcp_reset::tests::redirected_syn_reset};

    #[test]
    fn round_trip() {
        let mut raw = redirected_syn_reset();
        raw.header.tgid = 42;
        raw.header.pid = 43;
        raw.header.cgroup_id = 7;
        raw.header.comm[..4].copy_from_slice(b"curl");
        let event = Decoder::default().decode(&bytes_of(&raw)).unwrap();
        assert_eq!(event.header.probe, "tcp-reset");
        assert_eq!((event.header.tgid, event.header.pid, event.header.cgroup_id), (42, 43, 7));
        assert_eq!(event.header.comm, "curl");
        assert_eq!(event.header.netns, 4026532999);
        let Payload::TcpReset(reset) = &event.payload else { panic!("{event:?}") };
        assert_eq!(reset.original_dst_port, Some(2049));
        let json = serde_json::to_value(&event).unwrap();
        assert_eq!(json["kind"], "tcp_reset");
        assert_eq!(json["local_port"], 15001);
        assert_eq!(json["netns"], 4026532999u32);
    }

    #[test]
    fn short_input_is_an_error_at_every_length() {
        let bytes = bytes_of(&redirected_syn_reset());
        for len in 0..bytes.len() {
            assert!(
                matches!(Decoder::default().decode(&bytes[..len]), Err(DecodeError::TooShort { .. })),
                "len {len}"
            );
        }
    }

    #[test]
    fn unknown_kind_and_version_are_errors() {
        let mut raw = redirected_syn_reset();
        raw.header.kind = 999;
        assert_eq!(Decoder::default().decode(&bytes_of(&raw)), Err(DecodeError::UnknownKind(999)));
        let mut raw = redirected_syn_reset();
        raw.header.version = 2;
        assert!(matches!(
            Decoder::default().decode(&bytes_of(&raw)),
            Err(DecodeError::UnsupportedVersion { .. })
        ));
    }

    #[test]
    fn garbage_never_panics() {
        // Deterministic xorshift noise, with the kind forced valid half of the time so the payload
        // decoder sees garbage too.
        let mut state = 0x2545_f491_4f6c_dd1du64;
        let decoder = Decoder::default();
        for round in 0..20_000 {
            let len = (state % 200) as usize;
            let mut bytes: Vec<u8> = (0..len)
                .map(|_| {
                    state ^= state << 13;
                    state ^= state >> 7;
                    state ^= state << 17;
                    state as u8
                })
                .collect();
            if round % 2 == 0 && bytes.len() >= 8 {
                bytes[..4].copy_from_slice(&kind::TCP_RESET.to_ne_bytes());
                bytes[4..8].copy_from_slice(&kstall_common::tcp_reset::VERSION.to_ne_bytes());
            }
            let _ = decoder.decode(&bytes);
        }
    }
}
