//! What the kernel said, typed: the one place raw ring-buffer records become [`Event`]s (each
//! probe decodes its own record; this reads the header and dispatches). Nothing downstream sees
//! bytes. Decoding never panics: short, unknown or garbage records are errors, counted by the
//! caller.

use std::sync::atomic::{AtomicU64, Ordering};

use kstall_common::EventHeader;
use serde::Serialize;

pub use crate::probes::Payload;
use crate::{
    decode::{DecodeError, comm_string, read_record},
    kernel,
    probes::{self, Decoding, runs::Runs},
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

    /// What loading learnt of this kernel and node: also what the kernel's counts are read with.
    pub fn decoding(&self) -> &Decoding {
        &self.probes
    }

    pub fn decode(&self, bytes: &[u8]) -> Result<Event, DecodeError> {
        let raw_header: EventHeader = read_record(bytes, "event header")?;
        let probe = probes::ALL
            .iter()
            .find(|p| p.record_kind() == raw_header.kind)
            .ok_or(DecodeError::UnknownKind(raw_header.kind))?;
        let payload = probe.decode(&raw_header, bytes, &self.probes)?;
        let time_unix_ns =
            (i128::from(raw_header.timestamp_ns) + self.boot_to_unix_ns).clamp(0, u64::MAX.into()) as u64;
        Ok(Event {
            header: Header {
                probe: probe.name(),
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
    /// What the kernel last said of each program's runs (`probes::runs`).
    programs: std::sync::Mutex<std::collections::BTreeMap<String, Runs>>,
    /// The ring buffer's bytes unread when the reader last woke, and the most it ever found.
    ring_used: AtomicU64,
    ring_used_max: AtomicU64,
    /// 0 until the ring's fill can be read.
    ring_size: AtomicU64,
    /// The agent holds the kernel's run-time statistics on (`--program-stats on`).
    run_time_stats_held: std::sync::atomic::AtomicBool,
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

    /// What the kernel says of program `program`'s runs so far.
    pub fn set_runs(&self, program: &str, runs: Runs) {
        self.programs.lock().expect("program runs").insert(program.to_string(), runs);
    }

    /// Each program's runs.
    pub fn programs(&self) -> Vec<(String, Runs)> {
        self.programs.lock().expect("program runs").iter().map(|(p, r)| (p.clone(), *r)).collect()
    }

    /// The agent holds the kernel's run-time statistics on.
    pub fn hold_run_time_stats(&self) {
        self.run_time_stats_held.store(true, Ordering::Relaxed);
    }

    /// Whether the agent holds the kernel's run-time statistics on.
    pub fn run_time_stats_held(&self) -> bool {
        self.run_time_stats_held.load(Ordering::Relaxed)
    }

    /// The ring buffer is `bytes` large, and its fill is read.
    pub fn set_ring_size(&self, bytes: u64) {
        self.ring_size.store(bytes, Ordering::Relaxed);
    }

    pub fn ring_size(&self) -> u64 {
        self.ring_size.load(Ordering::Relaxed)
    }

    /// The ring buffer's unread bytes as the reader woke.
    pub fn ring_used(&self, bytes: u64) {
        self.ring_used.store(bytes, Ordering::Relaxed);
        self.ring_used_max.fetch_max(bytes, Ordering::Relaxed);
    }

    /// (unread when last woken, the most ever found).
    pub fn ring_fill(&self) -> (u64, u64) {
        (self.ring_used.load(Ordering::Relaxed), self.ring_used_max.load(Ordering::Relaxed))
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
                bytes[..4].copy_from_slice(&kstall_common::kind::TCP_RESET.to_ne_bytes());
                bytes[4..8].copy_from_slice(&kstall_common::tcp_reset::VERSION.to_ne_bytes());
            }
            let _ = decoder.decode(&bytes);
        }
    }
}
