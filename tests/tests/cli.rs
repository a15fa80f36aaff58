//! The binary's contract with a user: bad input is one clear line and exit 64, nothing loaded.
//! These need no root.

use std::process::Command;

use kstall_tests::agent::agent_binary;

fn kstall(args: &[&str]) -> (i32, String) {
    kstall_with_env(args, &[])
}

fn kstall_with_env(args: &[&str], env: &[(&str, &str)]) -> (i32, String) {
    let binary = agent_binary();
    if !binary.exists() {
        // Same rule as the kernel tests: required under `cargo xtask test`.
        assert!(
            std::env::var("KSTALL_KERNEL_TESTS").as_deref() != Ok("require"),
            "no kstall binary at {}",
            binary.display()
        );
        println!("skipping: no kstall binary at {} (run `cargo xtask test`)", binary.display());
        return (64, "skipped\n".into());
    }
    let out =
        Command::new(binary).args(args).env_clear().envs(env.iter().copied()).output().expect("run kstall");
    (out.status.code().unwrap_or(-1), String::from_utf8_lossy(&out.stderr).into_owned())
}

fn assert_usage_error(args: &[&str], field: &str) {
    assert_usage_error_with_env(args, &[], field);
}

fn assert_usage_error_with_env(args: &[&str], env: &[(&str, &str)], field: &str) {
    let (code, stderr) = kstall_with_env(args, env);
    if stderr == "skipped\n" {
        return;
    }
    assert_eq!(code, 64, "{args:?}: {stderr}");
    assert_eq!(stderr.lines().count(), 1, "one line: {stderr}");
    assert!(stderr.contains(field), "{args:?} must name {field}: {stderr}");
}

#[test]
fn bad_values_exit_64_naming_the_flag() {
    assert_usage_error(&["agent", "--listen", "nowhere"], "--listen: ");
    assert_usage_error(&["agent", "--probes", "tcp-reset,oom-kil"], "--probes: ");
    assert_usage_error(&["agent", "--ring-buffer-bytes", "1000"], "--ring-buffer-bytes: ");
    assert_usage_error(&["agent", "--tcp-reset-hook", "kprobe"], "--tcp-reset-hook: ");
    assert_usage_error(&["agent", "--sample-events", "many"], "--sample-events: ");
    assert_usage_error(&["agent", "--sample-events", "4294967295"], "--sample-events: ");
    assert_usage_error(&["agent", "--config", "/nonexistent.toml"], "--config: ");
    assert_usage_error(&["agent", "--no-such-flag"], "--no-such-flag");
    assert_usage_error(&["frobnicate"], "frobnicate");
    assert_usage_error(&["agent", "--alertmanager-url", "ftp://am:9093"], "--alertmanager-url: ");
    assert_usage_error(&["agent", "--pods-file", "/nonexistent/pods.json"], "--pods-file: ");
    assert_usage_error(&["trace", "--probe", "tcp-reset,oom-kil"], "oom-kil");
    assert_usage_error(&["trace", "--duration", "soon"], "--duration");
    assert_usage_error(&["incidents", "--output", "xml"], "xml");
}

#[test]
fn environment_values_are_validated_like_flags_and_named_as_variables() {
    assert_usage_error_with_env(&["agent"], &[("KSTALL_LISTEN", "nowhere")], "KSTALL_LISTEN: ");
    assert_usage_error_with_env(&["agent"], &[("KSTALL_PROBES", "nfs-typo")], "KSTALL_PROBES: ");
    assert_usage_error_with_env(
        &["agent"],
        &[("KSTALL_RING_BUFFER_BYTES", "12K")],
        "KSTALL_RING_BUFFER_BYTES: ",
    );
}

#[test]
fn commands_without_an_agent_say_how_to_start_one() {
    for command in ["status", "incidents"] {
        let (code, stderr) = kstall(&[command, "--api-socket", "/nonexistent/kstall.sock"]);
        if stderr == "skipped\n" {
            return;
        }
        assert_eq!(code, 1, "{command}: {stderr}");
        assert_eq!(stderr.lines().count(), 1, "{command}: {stderr}");
        assert!(stderr.contains("kstall agent"), "{command}: {stderr}");
    }
}
