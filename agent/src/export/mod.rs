pub mod alertmanager;
mod event_counters;
pub mod histogram;
pub mod json_lines;
pub mod kubernetes;
pub mod metrics;
pub mod otlp;
pub mod series;
pub mod stream;
mod tls;

/// A wall-clock time in nanoseconds as RFC 3339 (UTC), as the outputs write it.
fn rfc3339(unix_ns: u64) -> String {
    jiff::Timestamp::from_nanosecond(i128::from(unix_ns)).map(|t| t.to_string()).unwrap_or_default()
}
