//! The one place raw ring-buffer records become typed events. Nothing downstream sees bytes.
//! Decoding never panics: short, unknown or garbage records are errors, counted by the caller.

use std::sync::Arc;

use kstall_common::{
    EventHeader, hung_task::HungTaskEvent, kind, nfs::NfsEvent, oom::OomKillEvent, tcp_reset::TcpResetEvent,
};
use serde::Serialize;

use crate::{
    attribution::Attribution,
    hung_tasks::HungTaskCleared,
    probes::{
        hung_task::{self, HungTask},
        nfs::{self, Nfs},
        oom::{self, OomKill},
        tcp_reset::{self, TcpReset},
    },
    symbols::Symbols,
};

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    #[error("record of {got} bytes is shorter than the {need}-byte {what}")]
    TooShort { what: &'static str, need: usize, got: usize },
    #[error("unknown event kind {0}")]
    UnknownKind(u32),
    #[error("event kind {kind} version {version} is not supported by this agent")]
    UnsupportedVersion { kind: u32, version: u32 },
    #[error("bad value {value} in {field}")]
    BadField { field: &'static str, value: u64 },
}

impl DecodeError {
    /// Every value [`label`](Self::label) gives: the series exist at 0 from the start, so a rate
    /// or an alert on them has a value before the first error.
    pub const LABELS: [&'static str; 4] = ["too_short", "unknown_kind", "unsupported_version", "bad_field"];

    /// Short, bounded label for `kstall_event_decode_errors_total{error}`.
    pub fn label(&self) -> &'static str {
        match self {
            DecodeError::TooShort { .. } => "too_short",
            DecodeError::UnknownKind(_) => "unknown_kind",
            DecodeError::UnsupportedVersion { .. } => "unsupported_version",
            DecodeError::BadField { .. } => "bad_field",
        }
    }
}

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
    /// A task newly reported hung (reports of a task already known are folded into it).
    HungTask(HungTask),
    /// A hung task that left D state or exited.
    HungTaskCleared(HungTaskCleared),
    OomKill(OomKill),
    Nfs(Nfs),
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Event {
    #[serde(flatten)]
    pub header: Header,
    #[serde(flatten)]
    pub payload: Payload,
    /// Namespace, pod, container, workload — or host. Set by the pipeline before anything sees
    /// the event; `None` only straight out of the decoder.
    #[serde(flatten, skip_serializing_if = "Option::is_none")]
    pub attribution: Option<Arc<Attribution>>,
}

/// Per-kernel context decoding needs: enum names read from BTF, kernel symbols, the tick rate,
/// the boot-to-wall clock offset.
#[derive(Clone)]
pub struct Decoder {
    pub tcp_reset: tcp_reset::Names,
    pub symbols: Arc<Symbols>,
    pub clock: hung_task::Clock,
    pub oom: oom::Context,
    boot_to_unix_ns: i128,
}

impl Default for Decoder {
    fn default() -> Self {
        Self::new()
    }
}

impl Decoder {
    pub fn new() -> Self {
        Self {
            tcp_reset: tcp_reset::Names::default(),
            symbols: Arc::new(Symbols::default()),
            clock: hung_task::Clock::default(),
            oom: oom::Context::default(),
            boot_to_unix_ns: boot_to_unix_offset_ns(),
        }
    }

    pub fn decode(&self, bytes: &[u8]) -> Result<Event, DecodeError> {
        let raw_header: EventHeader = read_record(bytes, "event header")?;
        let (probe, payload) = match raw_header.kind {
            kind::TCP_RESET => {
                check_version(&raw_header, kstall_common::tcp_reset::VERSION)?;
                let raw: TcpResetEvent = read_record(bytes, "tcp_reset event")?;
                (tcp_reset::NAME, Payload::TcpReset(tcp_reset::decode(&raw, &self.tcp_reset)?))
            }
            kind::HUNG_TASK => {
                check_version(&raw_header, kstall_common::hung_task::VERSION)?;
                let raw: HungTaskEvent = read_record(bytes, "hung_task event")?;
                (hung_task::NAME, Payload::HungTask(hung_task::decode(&raw, &self.symbols, self.clock)?))
            }
            kind::OOM_KILL => {
                check_version(&raw_header, kstall_common::oom::VERSION)?;
                let raw: OomKillEvent = read_record(bytes, "oom_kill event")?;
                (oom::NAME, Payload::OomKill(oom::decode(&raw, &self.symbols, &self.oom)?))
            }
            kind::NFS => {
                check_version(&raw_header, kstall_common::nfs::VERSION)?;
                let raw: NfsEvent = read_record(bytes, "nfs event")?;
                (nfs::NAME, Payload::Nfs(nfs::decode(&raw, self.clock)?))
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
            attribution: None,
        })
    }
}

fn check_version(header: &EventHeader, supported: u32) -> Result<(), DecodeError> {
    if header.version == supported {
        Ok(())
    } else {
        Err(DecodeError::UnsupportedVersion { kind: header.kind, version: header.version })
    }
}

/// Copies a kernel record out of `bytes`. `T: aya::Pod` is plain integers, valid for any bits.
fn read_record<T: aya::Pod>(bytes: &[u8], what: &'static str) -> Result<T, DecodeError> {
    if bytes.len() < size_of::<T>() {
        return Err(DecodeError::TooShort { what, need: size_of::<T>(), got: bytes.len() });
    }
    // SAFETY: length checked; read_unaligned copes with the ring buffer's 8-byte alignment.
    Ok(unsafe { std::ptr::read_unaligned(bytes.as_ptr().cast::<T>()) })
}

pub fn comm_string(comm: &[u8]) -> String {
    let end = comm.iter().position(|&b| b == 0).unwrap_or(comm.len());
    String::from_utf8_lossy(&comm[..end]).into_owned()
}

/// Wall-clock now, in the unit of `Header::time_unix_ns`.
pub fn unix_now_ns() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_nanos() as u64
}

/// `CLOCK_REALTIME - CLOCK_BOOTTIME`: turns `bpf_ktime_get_boot_ns` stamps into wall time.
fn boot_to_unix_offset_ns() -> i128 {
    fn now(clock: libc::clockid_t) -> i128 {
        let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
        // SAFETY: valid clock id and out pointer.
        unsafe { libc::clock_gettime(clock, &mut ts) };
        i128::from(ts.tv_sec) * 1_000_000_000 + i128::from(ts.tv_nsec)
    }
    now(libc::CLOCK_REALTIME) - now(libc::CLOCK_BOOTTIME)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::probes::{bytes_of, tcp_reset::tests::redirected_syn_reset};

    #[test]
    fn every_decode_error_label_is_listed() {
        let errors = [
            DecodeError::TooShort { what: "header", need: 8, got: 0 },
            DecodeError::UnknownKind(99),
            DecodeError::UnsupportedVersion { kind: 1, version: 9 },
            DecodeError::BadField { field: "direction", value: 7 },
        ];
        let labels: Vec<&str> = errors.iter().map(DecodeError::label).collect();
        assert_eq!(labels, DecodeError::LABELS);
    }

    #[test]
    fn round_trip() {
        let mut raw = redirected_syn_reset();
        raw.header.tgid = 42;
        raw.header.pid = 43;
        raw.header.cgroup_id = 7;
        raw.header.comm[..4].copy_from_slice(b"curl");
        let event = Decoder::new().decode(&bytes_of(&raw)).unwrap();
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
                matches!(Decoder::new().decode(&bytes[..len]), Err(DecodeError::TooShort { .. })),
                "len {len}"
            );
        }
    }

    #[test]
    fn unknown_kind_and_version_are_errors() {
        let mut raw = redirected_syn_reset();
        raw.header.kind = 999;
        assert_eq!(Decoder::new().decode(&bytes_of(&raw)), Err(DecodeError::UnknownKind(999)));
        let mut raw = redirected_syn_reset();
        raw.header.version = 2;
        assert!(matches!(
            Decoder::new().decode(&bytes_of(&raw)),
            Err(DecodeError::UnsupportedVersion { .. })
        ));
    }

    #[test]
    fn garbage_never_panics() {
        // Deterministic xorshift noise, with the kind forced valid half of the time so the payload
        // decoder sees garbage too.
        let mut state = 0x2545_f491_4f6c_dd1du64;
        let decoder = Decoder::new();
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
