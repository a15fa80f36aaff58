//! How a setting's text is read, whoever owns the setting: durations and whole numbers as users
//! write them on a flag, in a variable or in the file. An error is the setting's key and one
//! line saying why; `config.rs` adds where the value came from.

use std::time::Duration;

/// A bad value: the key of its setting and why.
pub type Invalid = (&'static str, String);

/// `500ms`, `90s`, `30m`, `1h`, `1d`, or plain seconds.
pub fn parse_duration(text: &str) -> Option<Duration> {
    let t = text.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let n: u64 = t[..split].parse().ok()?;
    let unit = match &t[split..] {
        "ms" => return Some(Duration::from_millis(n)),
        "" | "s" => 1,
        "m" => 60,
        "h" => 3600,
        "d" => 86_400,
        _ => return None,
    };
    Some(Duration::from_secs(n.checked_mul(unit)?))
}

/// A duration that is not zero: a window or a wait of nothing is no setting.
pub fn duration(key: &'static str, text: &str) -> Result<Duration, Invalid> {
    parse_duration(text)
        .filter(|d| !d.is_zero())
        .ok_or_else(|| (key, format!("{text:?} is not a duration like 500ms, 90s, 30m, 1h")))
}

/// A whole number of at least `min`.
pub fn count(key: &'static str, text: &str, min: u32) -> Result<u32, Invalid> {
    text.trim()
        .parse::<u32>()
        .ok()
        .filter(|n| *n >= min)
        .ok_or_else(|| (key, format!("{text:?} is not a whole number of at least {min}")))
}

/// `4096`, `256K`, `1M`, `1G` (binary units).
pub fn bytes(key: &'static str, text: &str) -> Result<u64, Invalid> {
    let bad = || (key, format!("{text:?} is not a size like 1M"));
    let t = text.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let multiplier: u64 = match t[split..].to_ascii_uppercase().as_str() {
        "" | "B" => 1,
        "K" | "KB" | "KIB" => 1 << 10,
        "M" | "MB" | "MIB" => 1 << 20,
        "G" | "GB" | "GIB" => 1 << 30,
        _ => return Err(bad()),
    };
    let n: u64 = t[..split].parse().map_err(|_| bad())?;
    n.checked_mul(multiplier).ok_or_else(bad)
}

/// `on` / `off` from a flag or variable, `true` / `false` from the file's boolean.
pub fn on_off(key: &'static str, value: Option<String>) -> Result<Option<bool>, Invalid> {
    match value.as_deref().map(str::trim) {
        Some("on" | "true") => Ok(Some(true)),
        Some("off" | "false") => Ok(Some(false)),
        Some(other) => Err((key, format!("{other:?} is not on or off"))),
        None => Ok(None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("90s"), Some(Duration::from_secs(90)));
        assert_eq!(parse_duration("500ms"), Some(Duration::from_millis(500)));
        assert_eq!(parse_duration("30m"), Some(Duration::from_secs(1800)));
        assert_eq!(parse_duration("2h"), Some(Duration::from_secs(7200)));
        assert_eq!(parse_duration("1d"), Some(Duration::from_secs(86400)));
        assert_eq!(parse_duration("120"), Some(Duration::from_secs(120)));
        assert_eq!(parse_duration("1w"), None);
        assert_eq!(parse_duration("h"), None);
        assert_eq!(duration("quiet_window", "0s").unwrap_err().0, "quiet_window");
    }

    #[test]
    fn counts() {
        assert_eq!(count("oom_loop_count", " 3", 2), Ok(3));
        let (key, why) = count("oom_loop_count", "1", 2).unwrap_err();
        assert_eq!((key, why.as_str()), ("oom_loop_count", "\"1\" is not a whole number of at least 2"));
        assert!(count("oom_loop_count", "-3", 2).is_err());
    }
}
