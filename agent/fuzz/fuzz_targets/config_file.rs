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

/// `resolve` reads the pods file the config names, to refuse a bad one at start. Named by the
/// fuzzer, that could be a device or a proc file (`/dev/zero`, `/proc/kcore`, a pipe): a read
/// that never ends tests the fuzzer's memory limit, not kstall. Such inputs are skipped.
fn reads_a_special_file(data: &[u8]) -> bool {
    let Some(table) = std::str::from_utf8(data).ok().and_then(|t| t.parse::<toml::Table>().ok()) else {
        return false;
    };
    let Some(path) = table.get("pods_file").and_then(|p| p.as_str()) else { return false };
    match std::fs::canonicalize(path).and_then(|p| Ok((std::fs::metadata(&p)?, p))) {
        Err(_) => false,
        Ok((meta, real)) => {
            !meta.is_file() || meta.len() > 1 << 20 || real.starts_with("/proc") || real.starts_with("/sys")
        }
    }
}
