//! `--config FILE`: the TOML a user writes, through `Config::resolve` as the agent starts with it
//! (no flags, no `KSTALL_*` variables). It must give a configuration or one line naming the bad
//! field (the agent prints it and exits 64), never a panic.
#![no_main]

use std::{path::PathBuf, sync::LazyLock};

use kstall::config::{AgentArgs, Config};
use libfuzzer_sys::fuzz_target;

/// One file per fuzzing process, rewritten for each input.
static PATH: LazyLock<PathBuf> =
    LazyLock::new(|| std::env::temp_dir().join(format!("kstall-fuzz-config-{}.toml", std::process::id())));

fuzz_target!(|data: &[u8]| {
    if reads_a_special_file(data) {
        return;
    }
    std::fs::write(&*PATH, data).expect("write the config file");
    let args = AgentArgs { config: Some(PATH.clone()), ..Default::default() };
    if let Err(e) = Config::resolve(args) {
        let message = e.to_string();
        assert!(message.starts_with("invalid configuration: "), "{message}");
        assert!(!message.contains(['\n', '\r']), "not one line: {message:?}");
    }
});

/// `resolve` reads the files the config names, to refuse a bad one at start (`pods_file`,
/// `web_config_file`, the Alertmanager's secrets and CA; every `*_file` key is checked here).
/// A device, a FIFO or a file too large is refused by the agent without reading it, and is
/// fuzzed; a file under /proc or /sys is skipped: reading some has effects on this machine
/// (`/proc/kmsg` consumes the kernel's log).
fn reads_a_special_file(data: &[u8]) -> bool {
    let Some(table) = std::str::from_utf8(data).ok().and_then(|t| t.parse::<toml::Table>().ok()) else {
        return false;
    };
    let special = |path: &str| {
        std::fs::canonicalize(path).is_ok_and(|real| real.starts_with("/proc") || real.starts_with("/sys"))
    };
    table.iter().any(|(key, value)| key.ends_with("_file") && value.as_str().is_some_and(special))
}
