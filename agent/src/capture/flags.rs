//! The captures' settings as users give them: one declaration each, at once the flag, the
//! `KSTALL_*` variable and the file's key (`config.rs` merges the layers), read into
//! [`Settings`] with the captures' own bounds.

use std::time::Duration;

use crate::{
    incidents::engine::NAMES,
    setting::{Invalid, bytes, count, duration},
};

#[derive(Debug, Default, clap::Args, serde::Serialize, serde::Deserialize)]
#[serde(default)]
#[group(id = "capture_settings")]
pub struct Flags {
    /// How long a capture asked for without --duration lasts: 1s to 10m [default: 60s].
    #[arg(long, env = "KSTALL_CAPTURE_DURATION", value_name = "DURATION")]
    pub capture_duration: Option<String>,
    /// The most a capture's packets may take, and the ceiling of any request: at least 1M
    /// [default: 64M].
    #[arg(long, env = "KSTALL_CAPTURE_MAX_BYTES", value_name = "BYTES")]
    pub capture_max_bytes: Option<String>,
    /// The most packets a capture keeps, and the ceiling of any request [default: 1000000].
    #[arg(long, env = "KSTALL_CAPTURE_MAX_PACKETS", value_name = "N")]
    pub capture_max_packets: Option<String>,
    /// Bundles kept under <state-dir>/captures, running captures included: at least 1
    /// [default: 20].
    #[arg(long, env = "KSTALL_CAPTURE_KEEP", value_name = "N")]
    pub capture_keep: Option<String>,
    /// Disk the bundles may take, running captures' reservations included: at least twice
    /// --capture-max-bytes [default: 512M].
    #[arg(long, env = "KSTALL_CAPTURE_DISK", value_name = "BYTES")]
    pub capture_disk: Option<String>,
    /// Captures running at once on the node: at least 1 [default: 2].
    #[arg(long, env = "KSTALL_CAPTURE_RUNNING", value_name = "N")]
    pub capture_running: Option<String>,
    /// Signatures whose firing starts a capture of the incident's pod at once, bounded as above
    /// and filtered to the incident's peers and ports: one at a time per pod, one per pod in 10
    /// minutes, at most --capture-per-hour on the node. E.g. nfs-sidecar-redirect [default: none].
    #[arg(long, env = "KSTALL_CAPTURE_ON", value_name = "SIGNATURES", value_delimiter = ',')]
    pub capture_on: Option<Vec<String>>,
    /// Captures incidents may start on the node in an hour: at least 1 [default: 6].
    #[arg(long, env = "KSTALL_CAPTURE_PER_HOUR", value_name = "N")]
    pub capture_per_hour: Option<String>,
}

/// What the agent's captures may do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settings {
    pub duration: Duration,
    pub max_bytes: u64,
    pub max_packets: u64,
    pub keep: usize,
    pub disk: u64,
    pub running: usize,
    /// The signatures whose incidents start a capture.
    pub on: Vec<&'static str>,
    pub per_hour: usize,
}

impl Settings {
    pub const MIN_DURATION: Duration = Duration::from_secs(1);
    pub const MAX_DURATION: Duration = Duration::from_secs(600);
    pub const MIN_MAX_BYTES: u64 = 1 << 20;
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            duration: Duration::from_secs(60),
            max_bytes: 64 << 20,
            max_packets: 1_000_000,
            keep: 20,
            disk: 512 << 20,
            running: 2,
            on: Vec::new(),
            per_hour: 6,
        }
    }
}

/// Whether a capture may last `d`: one line naming `what` when it may not.
pub fn check_duration(what: &str, d: Duration) -> Result<(), String> {
    if d < Settings::MIN_DURATION || d > Settings::MAX_DURATION {
        return Err(format!("{what}: a capture lasts 1 s to 10 min"));
    }
    Ok(())
}

impl Flags {
    /// The settings, each unset one at its default; a bad value names its key.
    pub fn settings(self) -> Result<Settings, Invalid> {
        let mut s = Settings::default();
        if let Some(text) = self.capture_duration {
            s.duration = duration("capture_duration", &text)?;
            check_duration(&format!("{text:?}"), s.duration).map_err(|e| ("capture_duration", e))?;
        }
        if let Some(text) = self.capture_max_bytes {
            s.max_bytes = bytes("capture_max_bytes", &text)?;
            if s.max_bytes < Settings::MIN_MAX_BYTES {
                return Err(("capture_max_bytes", format!("{text:?} is less than 1 MiB")));
            }
        }
        if let Some(text) = self.capture_max_packets {
            s.max_packets = u64::from(count("capture_max_packets", &text, 1)?);
        }
        if let Some(text) = self.capture_keep {
            s.keep = count("capture_keep", &text, 1)? as usize;
        }
        if let Some(text) = self.capture_disk {
            s.disk = bytes("capture_disk", &text)?;
        }
        if s.disk < 2 * s.max_bytes {
            return Err((
                "capture_disk",
                format!(
                    "{} MiB is less than twice --capture-max-bytes ({} MiB)",
                    s.disk >> 20,
                    s.max_bytes >> 20
                ),
            ));
        }
        if let Some(text) = self.capture_running {
            s.running = count("capture_running", &text, 1)? as usize;
        }
        for name in self.capture_on.iter().flatten().map(|n| n.trim()).filter(|n| !n.is_empty()) {
            let Some(known) = NAMES.iter().find(|k| **k == name) else {
                return Err((
                    "capture_on",
                    format!("unknown signature {name:?} (known: {})", NAMES.join(", ")),
                ));
            };
            if !s.on.contains(known) {
                s.on.push(known);
            }
        }
        if let Some(text) = self.capture_per_hour {
            s.per_hour = count("capture_per_hour", &text, 1)? as usize;
        }
        Ok(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unset_flags_are_the_defaults_and_each_bound_is_one_line_naming_its_key() {
        assert_eq!(Flags::default().settings().unwrap(), Settings::default());
        let set = Flags {
            capture_duration: Some("2m".into()),
            capture_max_bytes: Some("8M".into()),
            capture_max_packets: Some("1000".into()),
            capture_keep: Some("3".into()),
            capture_disk: Some("16M".into()),
            capture_running: Some("1".into()),
            capture_on: Some(vec!["nfs-sidecar-redirect".into(), " pod-termination-blocked".into()]),
            capture_per_hour: Some("2".into()),
        };
        let s = set.settings().unwrap();
        assert_eq!(
            (s.duration, s.max_bytes, s.max_packets, s.keep, s.disk, s.running, s.per_hour),
            (Duration::from_secs(120), 8 << 20, 1000, 3, 16 << 20, 1, 2)
        );
        assert_eq!(s.on, ["nfs-sidecar-redirect", "pod-termination-blocked"]);
        let bad = |flags: Flags| flags.settings().unwrap_err();
        let e = bad(Flags { capture_duration: Some("20m".into()), ..Default::default() });
        assert_eq!(e, ("capture_duration", "\"20m\": a capture lasts 1 s to 10 min".into()));
        let e = bad(Flags { capture_max_bytes: Some("512K".into()), ..Default::default() });
        assert_eq!(e.0, "capture_max_bytes");
        let e = bad(Flags { capture_disk: Some("100M".into()), ..Default::default() });
        assert_eq!(e, ("capture_disk", "100 MiB is less than twice --capture-max-bytes (64 MiB)".into()));
        assert_eq!(bad(Flags { capture_keep: Some("0".into()), ..Default::default() }).0, "capture_keep");
        assert_eq!(
            bad(Flags { capture_running: Some("0".into()), ..Default::default() }).0,
            "capture_running"
        );
        let e = bad(Flags { capture_on: Some(vec!["nfs-sidcar-redirect".into()]), ..Default::default() });
        assert_eq!(e.0, "capture_on");
        assert!(
            e.1.starts_with("unknown signature \"nfs-sidcar-redirect\" (known: nfs-sidecar-redirect, "),
            "{}",
            e.1
        );
        assert_eq!(
            bad(Flags { capture_per_hour: Some("0".into()), ..Default::default() }).0,
            "capture_per_hour"
        );
    }
}
