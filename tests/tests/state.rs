//! The incident history survives the agent: a real agent with a real sidecar redirect (iptables
//! REDIRECT of tcp/2049 in a network namespace, SYNs reset) is killed with SIGKILL, and the next
//! agent on the same state directory has the history, and the incident that was firing goes on
//! from when it first fired. A state file that is not a history is moved aside, never a crash.

use std::{path::Path, time::Duration};

use kstall_tests::{
    agent::Agent,
    host::wait_for,
    kernel_tests_can_run,
    netns::{NetNs, NfsReconnects},
};
use serde_json::Value;

const REDIRECT: &str = "nfs-sidecar-redirect";
/// Resolved after this long without a redirected reset.
const ARGS: &[&str] = &["--quiet-window", "5s"];

fn redirect_of(ns: &NetNs, state: &'static str) -> impl Fn(&Value) -> bool {
    let key = format!("{REDIRECT}/");
    let netns = ns.inode();
    move |i: &Value| {
        i["id"].as_str().is_some_and(|id| id.starts_with(&key))
            && i["evidence"]["netns"] == netns
            && i["state"] == state
    }
}

/// The history file as written, once it says what `done` wants.
fn saved_when(state: &Path, done: impl Fn(&Value) -> bool) -> Option<Value> {
    wait_for(Duration::from_secs(30), || {
        let text = std::fs::read(state.join("incidents.json")).ok()?;
        serde_json::from_slice::<Value>(&text).ok().filter(|saved| done(saved))
    })
}

#[test]
fn the_incident_history_survives_a_kill_9() {
    if !kernel_tests_can_run("the_incident_history_survives_a_kill_9") {
        return;
    }
    let state = tempfile::tempdir().unwrap();
    let mut first = Agent::start_with_state(Some(state.path()), ARGS);
    // One redirect that fires and resolves (history), one that is firing when the agent dies.
    let (gone, going_on) = (NetNs::new("state-gone"), NetNs::new("state-on"));
    gone.redirect_tcp("iptables", 2049, 15001);
    going_on.redirect_tcp("iptables", 2049, 15001);
    let mut gone_client = NfsReconnects::start(&gone);
    let mut client = NfsReconnects::start(&going_on);
    let fired = first.wait_incident(redirect_of(&gone, "firing"), Duration::from_secs(30));
    assert!(fired.is_some(), "no firing redirect: {:#?}", first.incidents());
    gone_client.stop();
    let resolved = first.wait_incident(redirect_of(&gone, "resolved"), Duration::from_secs(30));
    let resolved = resolved.unwrap_or_else(|| panic!("no resolved redirect: {:#?}", first.incidents()));
    let firing = first.wait_incident(redirect_of(&going_on, "firing"), Duration::from_secs(30));
    let firing = firing.unwrap_or_else(|| panic!("no firing redirect: {:#?}", first.incidents()));

    let written = saved_when(state.path(), |saved| {
        let has =
            |list: &str, id: &Value| saved[list].as_array().is_some_and(|l| l.iter().any(|i| &i["id"] == id));
        has("resolved", &resolved["id"]) && has("firing", &firing["id"])
    });
    assert!(
        written.is_some(),
        "the history was not written: {:?}",
        std::fs::read_to_string(state.path().join("incidents.json"))
    );
    first.kill();
    let killed_at_ns =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64;

    let second = Agent::start_with_state(Some(state.path()), ARGS);
    let incidents = second.incidents();
    let find = |id: &Value| incidents.iter().find(|i| &i["id"] == id).cloned();
    let kept =
        find(&resolved["id"]).unwrap_or_else(|| panic!("the resolved incident is gone: {incidents:#?}"));
    assert_eq!(
        (&kept["state"], &kept["resolved_unix_ns"]),
        (&"resolved".into(), &resolved["resolved_unix_ns"])
    );
    let carried =
        find(&firing["id"]).unwrap_or_else(|| panic!("the firing incident is gone: {incidents:#?}"));
    assert_eq!(carried["state"], "firing", "{carried:#}");
    // Logged before the agent serves (its reader may be behind it).
    let restored = second.log_once_it_has("incident history restored", Duration::from_secs(10));
    assert!(restored.is_some(), "{}", second.log());

    // The redirect still resets: found again, it goes on from when it first fired.
    let found_again = second.wait_incident(
        |i| {
            redirect_of(&going_on, "firing")(i)
                && i["last_seen_unix_ns"].as_u64().is_some_and(|t| t > killed_at_ns)
        },
        Duration::from_secs(30),
    );
    let found_again =
        found_again.unwrap_or_else(|| panic!("not found again: {:#?}\n{}", second.incidents(), second.log()));
    assert_eq!(found_again["first_seen_unix_ns"], firing["first_seen_unix_ns"], "{found_again:#}");
    let fired =
        second.metric(r#"kstall_incidents_total{severity="critical",signature="nfs-sidecar-redirect"}"#);
    assert_eq!(fired, None, "nothing fired anew:\n{}", second.metrics());
    // And it resolves as any incident does once the resets stop.
    client.stop();
    let ended = second.wait_incident(redirect_of(&going_on, "resolved"), Duration::from_secs(30));
    assert!(ended.is_some(), "did not resolve: {:#?}", second.incidents());
}

#[test]
fn a_state_file_that_is_not_a_history_is_moved_aside_and_the_agent_runs() {
    if !kernel_tests_can_run("a_state_file_that_is_not_a_history_is_moved_aside_and_the_agent_runs") {
        return;
    }
    let cases: [(&[u8], &str); 3] = [
        (b"{\"version\":1,\"firing\":[{\"id\":", "not a kstall incident history"),
        (b"\x7fELF\x02\x01\x01\x00 not json", "not a kstall incident history"),
        (br#"{"version":2,"node":"n","firing":[],"resolved":[]}"#, "version 2, this kstall reads version 1"),
    ];
    for (text, reason) in cases {
        let state = tempfile::tempdir().unwrap();
        std::fs::write(state.path().join("incidents.json"), text).unwrap();
        let mut agent = Agent::start_with_state(Some(state.path()), &[]);
        assert!(agent.status()["probes"].is_array(), "the agent answers");
        let log = agent
            .log_once_it_has("moved aside", Duration::from_secs(10))
            .unwrap_or_else(|| panic!("no warning:\n{}", agent.log()));
        let warnings: Vec<&str> = log.lines().filter(|l| l.contains("moved aside")).collect();
        assert_eq!(warnings.len(), 1, "one warning:\n{log}");
        assert!(warnings[0].contains("WARN") && warnings[0].contains(reason), "{}", warnings[0]);
        let aside: Vec<_> = std::fs::read_dir(state.path())
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.file_name().unwrap().to_string_lossy().starts_with("incidents.json.unreadable-"))
            .collect();
        assert_eq!(aside.len(), 1, "{aside:?}");
        assert_eq!(std::fs::read(&aside[0]).unwrap(), text, "kept as it was, for a look");
        assert_eq!(agent.stop(), Some(0));
    }
    // A directory that cannot be one: the agent runs, its history in memory, and says so once.
    let not_a_dir = tempfile::NamedTempFile::new().unwrap();
    let mut agent = Agent::start_with_state(Some(not_a_dir.path()), &[]);
    let log = agent
        .log_once_it_has("state directory unusable", Duration::from_secs(10))
        .unwrap_or_else(|| panic!("no warning:\n{}", agent.log()));
    assert_eq!(log.matches("state directory unusable").count(), 1, "{log}");
    assert_eq!(agent.stop(), Some(0));
}
