//! What every probe's decoder shares: reading a fixed-size kernel record out of ring-buffer bytes,
//! and the errors decoding gives. A leaf: it knows no probe and no event.

use kstall_common::EventHeader;

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
    /// A report the kernel did not make: its text was written to `/dev/kmsg` by a process.
    #[error("{what} written to /dev/kmsg by a process, not reported by the kernel")]
    Forged { what: &'static str },
}

impl DecodeError {
    /// Every value [`label`](Self::label) gives: the series exist at 0 from the start, so a rate
    /// or an alert on them has a value before the first error.
    pub const LABELS: [&'static str; 5] =
        ["too_short", "unknown_kind", "unsupported_version", "bad_field", "forged"];

    /// Short, bounded label for `kstall_event_decode_errors_total{error}`.
    pub fn label(&self) -> &'static str {
        match self {
            DecodeError::TooShort { .. } => "too_short",
            DecodeError::UnknownKind(_) => "unknown_kind",
            DecodeError::UnsupportedVersion { .. } => "unsupported_version",
            DecodeError::BadField { .. } => "bad_field",
            DecodeError::Forged { .. } => "forged",
        }
    }
}

pub fn check_version(header: &EventHeader, supported: u32) -> Result<(), DecodeError> {
    if header.version == supported {
        Ok(())
    } else {
        Err(DecodeError::UnsupportedVersion { kind: header.kind, version: header.version })
    }
}

/// A probe's record: its version checked against the one this agent reads, then copied whole.
pub fn read_versioned<T: aya::Pod>(
    header: &EventHeader,
    bytes: &[u8],
    version: u32,
    what: &'static str,
) -> Result<T, DecodeError> {
    check_version(header, version)?;
    read_record(bytes, what)
}

/// Copies a kernel record out of `bytes`. `T: aya::Pod` is plain integers, valid for any bits.
pub fn read_record<T: aya::Pod>(bytes: &[u8], what: &'static str) -> Result<T, DecodeError> {
    if bytes.len() < size_of::<T>() {
        return Err(DecodeError::TooShort { what, need: size_of::<T>(), got: bytes.len() });
    }
    // SAFETY: length checked; read_unaligned copes with the ring buffer's 8-byte alignment.
    Ok(unsafe { std::ptr::read_unaligned(bytes.as_ptr().cast::<T>()) })
}

/// A kernel `comm` (NUL-padded, not necessarily UTF-8) as text.
pub fn comm_string(comm: &[u8]) -> String {
    let end = comm.iter().position(|&b| b == 0).unwrap_or(comm.len());
    String::from_utf8_lossy(&comm[..end]).into_owned()
}

/// The bytes of a kernel-shared struct (a config for `EbpfLoader::override_global`, or a record).
pub fn bytes_of<T: aya::Pod>(value: &T) -> Vec<u8> {
    // SAFETY: `Pod` types are plain integers without padding.
    unsafe { std::slice::from_raw_parts((value as *const T).cast::<u8>(), size_of::<T>()) }.to_vec()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_decode_error_label_is_listed() {
        let errors = [
            DecodeError::TooShort { what: "header", need: 8, got: 0 },
            DecodeError::UnknownKind(99),
            DecodeError::UnsupportedVersion { kind: 1, version: 9 },
            DecodeError::BadField { field: "direction", value: 7 },
            DecodeError::Forged { what: "a soft lockup line" },
        ];
        let labels: Vec<&str> = errors.iter().map(DecodeError::label).collect();
        assert_eq!(labels, DecodeError::LABELS);
    }
}
