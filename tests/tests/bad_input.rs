//! What a user, a file or a client sends that is wrong: the agent answers with one clear error
//! and changes nothing. Garbage on the API socket gets an error reply and the connection closed;
//! a truncated or runaway pods file one warning each, the pods known kept; a bad flag or
//! environment value exits 64 naming it.

use std::{
    io::{Read as _, Write as _},
    os::unix::net::UnixStream,
    process::Command,
    time::Duration,
};

use kstall_tests::{
    agent::{Agent, agent_binary, pod_json, write_pods_file},
    host::{memory_kib, wait_for},
    kernel_tests_can_run,
};

/// What the agent answers to `bytes` on its API socket, read until it closes the connection.
fn answer(agent: &Agent, bytes: &[u8]) -> String {
    let mut stream = UnixStream::connect(&agent.socket).unwrap();
    stream.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    // The agent may answer and close before reading all of an over-long line.
    let _ = stream.write_all(bytes);
    let mut reply = String::new();
    stream.read_to_string(&mut reply).expect("the agent closes the connection after its reply");
    reply
}

#[test]
fn garbage_on_the_api_socket_gets_an_error_reply_and_the_connection_closed() {
    if !kernel_tests_can_run("garbage_on_the_api_socket_gets_an_error_reply_and_the_connection_closed") {
        return;
    }
    let agent = Agent::start(&[]);
    let long = [b'{'; 100 * 1024];
    let cases: [(&[u8], &str); 5] = [
        (b"hello\n", "bad request: expected value"),
        (b"{\"request\":\"format-disk\"}\n", "bad request: unknown variant `format-disk`"),
        (b"{\"request\":\"trace\",\"filter\":{\"port\":\"x\"}}\n", "bad request:"),
        (b"\xff\xfe\x00\x01garbage\n", "bad request: not UTF-8"),
        (&long, "bad request: longer than 65536 bytes"),
    ];
    for (bytes, expected) in cases {
        let reply = answer(&agent, bytes);
        assert_eq!(reply.lines().count(), 1, "one line: {reply}");
        let reply: serde_json::Value =
            serde_json::from_str(&reply).unwrap_or_else(|e| panic!("{e}: {reply}"));
        let error = reply["error"].as_str().unwrap_or_default();
        assert!(error.starts_with(expected), "{expected}: {reply}");
    }
    assert!(agent.status()["probes"].is_array(), "the agent answers on");
    assert!(agent.metrics().contains("kstall_build_info"));
}

#[test]
fn a_truncated_or_runaway_pods_file_is_one_warning_and_the_pods_known_stay() {
    if !kernel_tests_can_run("a_truncated_or_runaway_pods_file_is_one_warning_and_the_pods_known_stay") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("pods.json");
    write_pods_file(&path, &[pod_json("7d1c0a3e-aaaa-4bbb-8ccc-0d1e2f3a4b5c", "web-1", "c1")]);
    let agent = Agent::start(&["--pods-file", path.to_str().unwrap()]);
    let running = r#"kstall_attribution_pods{state="running"}"#;
    assert_eq!(wait_for(Duration::from_secs(10), || agent.metric(running).filter(|&n| n == 1.0)), Some(1.0));

    let full = std::fs::read_to_string(&path).unwrap();
    let replace = |write: &dyn Fn(&std::path::Path)| {
        let tmp = dir.path().join("pods.json.tmp");
        write(&tmp);
        std::fs::rename(&tmp, &path).unwrap();
    };
    replace(&|p| std::fs::write(p, &full[..full.len() / 2]).unwrap());
    let warned =
        |what: &str| wait_for(Duration::from_secs(10), || agent.log().contains(what).then_some(())).is_some();
    assert!(warned("EOF while parsing"), "{}", agent.log());
    // 100 MB: not read at all.
    replace(&|p| std::fs::File::create(p).unwrap().set_len(100 << 20).unwrap());
    assert!(warned("larger than 16 MiB"), "{}", agent.log());
    let log = agent.log();
    let warnings = log.lines().filter(|l| l.contains("keeping the pods known")).count();
    assert_eq!(warnings, 2, "one warning a bad version:\n{log}");
    assert_eq!(agent.metric(running), Some(1.0), "the pod known is kept");
    assert_eq!(agent.metric("kstall_pod_metadata_up"), Some(0.0), "and the source said stale");
    let (rss_kib, _) = memory_kib(agent.pid());
    assert!(rss_kib < 100 << 10, "the runaway file was not read: {rss_kib} KiB");
}

#[test]
fn every_bad_flag_or_environment_value_exits_64_naming_it() {
    if !kernel_tests_can_run("every_bad_flag_or_environment_value_exits_64_naming_it") {
        return;
    }
    // Files named by mistake: a FIFO nobody writes to (a read of it would wait for ever), a
    // device that never ends.
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("pods.fifo");
    let c_path = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: a valid C string.
    assert_eq!(unsafe { libc::mkfifo(c_path.as_ptr(), 0o600) }, 0, "mkfifo");
    let fifo = fifo.to_str().unwrap();
    // Each named as the user gave it: its flag, or its variable.
    let events_fifo = format!("file:{fifo}");
    let cases: [(&[&str], (&str, &str), &str); 16] = [
        (&["--max-series-per-metric", "0"], ("", ""), "--max-series-per-metric"),
        (&["--metric-ports", "http"], ("", ""), "--metric-ports"),
        (&[], ("KSTALL_STATE_DIR", "relative/dir"), "KSTALL_STATE_DIR"),
        (&[], ("KSTALL_ALERTMANAGER_CA_FILE", "/nonexistent/ca.crt"), "KSTALL_ALERTMANAGER_CA_FILE"),
        (&["--pods-file", fifo], ("", ""), "--pods-file"),
        (&["--config", fifo], ("", ""), "--config"),
        (&["--web-config-file", "/dev/zero"], ("", ""), "--web-config-file"),
        // Writing to a FIFO nobody reads would block: refused at start, not at the first event.
        (&["--export-events", &events_fifo], ("", ""), "--export-events"),
        (&[], ("KSTALL_EXPORT_EVENTS", "file:/nonexistent/dir/events.jsonl"), "KSTALL_EXPORT_EVENTS"),
        // Captures: a signature misspelt, one with nowhere to keep its bundles, bounds.
        (&["--capture-on", "nfs-sidecar-redirect,nfs-sidcar-redirect"], ("", ""), "--capture-on"),
        (&["--capture-on", "pod-termination-blocked", "--state-dir", "none"], ("", ""), "--capture-on"),
        (&[], ("KSTALL_CAPTURE_PER_HOUR", "0"), "KSTALL_CAPTURE_PER_HOUR"),
        (&["--capture-disk", "64M"], ("", ""), "--capture-disk"),
        // OTLP is configured as the OpenTelemetry SDKs are: the variable is named.
        (
            &["--export-otlp", "on"],
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json"),
            "OTEL_EXPORTER_OTLP_PROTOCOL",
        ),
        (
            &["--export-otlp", "on"],
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "collector:4317"),
            "OTEL_EXPORTER_OTLP_ENDPOINT",
        ),
        (
            &["--export-otlp", "on"],
            ("OTEL_EXPORTER_OTLP_CERTIFICATE", fifo),
            "OTEL_EXPORTER_OTLP_CERTIFICATE",
        ),
    ];
    for (args, (env, value), field) in cases {
        let mut command = Command::new(agent_binary());
        command.arg("agent").args(args);
        if !env.is_empty() {
            command.env(env, value);
        }
        let out = command.output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(64), "{field}: {stderr}");
        assert_eq!(stderr.lines().count(), 1, "{stderr}");
        assert!(stderr.contains(&format!("invalid configuration: {field}:")), "{stderr}");
        if args.contains(&fifo) || args.contains(&"/dev/zero") || args.contains(&events_fifo.as_str()) {
            assert!(stderr.contains("not a regular file"), "{stderr}");
        }
        if args.contains(&"nfs-sidecar-redirect,nfs-sidcar-redirect") {
            assert!(
                stderr.contains("unknown signature \"nfs-sidcar-redirect\" (known: nfs-sidecar-redirect, "),
                "{stderr}"
            );
        }
    }
}
