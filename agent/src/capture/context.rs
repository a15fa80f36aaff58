//! What kstall itself knows of a captured pod, for its bundle: the pod's incidents as the API
//! shows them (evidence and capture entries included) and kstall's last events about it — the
//! lead-up to the capture as well as what happened during it — from a ring of the node's recent
//! events that the pipeline keeps only while the agent can capture.

use std::{
    collections::VecDeque,
    path::Path,
    sync::{Arc, Mutex, PoisonError},
};

use super::{FileNote, FileStatus, write_new};
use crate::{attribution::Attributed, incidents::engine::Engine};

/// The node's events kept: at the event rates of an incident, minutes of history; about 1–2 MiB.
pub const EVENTS_KEPT: usize = 4096;
/// The most of them one bundle takes (the pod's newest).
pub const EVENTS_PER_BUNDLE: usize = 1000;

pub const INCIDENTS_FILE: &str = "kstall/incidents.json";
pub const EVENTS_FILE: &str = "kstall/events.jsonl";

/// The node's last [`EVENTS_KEPT`] events, oldest first.
pub struct Recent {
    events: Mutex<VecDeque<Arc<Attributed>>>,
    capacity: usize,
}

impl Recent {
    pub fn new(capacity: usize) -> Self {
        Self { events: Mutex::new(VecDeque::with_capacity(capacity)), capacity }
    }

    pub fn keep(&self, event: &Arc<Attributed>) {
        let mut events = self.events.lock().unwrap_or_else(PoisonError::into_inner);
        if events.len() == self.capacity {
            events.pop_front();
        }
        events.push_back(event.clone());
    }

    /// The newest `at_most` of pod `uid`'s events, oldest first, and how many of its events the
    /// ring held.
    fn of_pod(&self, uid: &str, at_most: usize) -> (Vec<Arc<Attributed>>, usize) {
        let events = self.events.lock().unwrap_or_else(PoisonError::into_inner);
        let mine: Vec<&Arc<Attributed>> =
            events.iter().filter(|e| e.who.pod_uid.as_deref() == Some(uid)).collect();
        let held = mine.len();
        (mine[held.saturating_sub(at_most)..].iter().map(|e| Arc::clone(e)).collect(), held)
    }
}

/// Where a bundle's `kstall/` files come from: the agent's ring and incident engine.
pub struct Context {
    pub recent: Arc<Recent>,
    pub incidents: Arc<Mutex<Engine>>,
}

/// Writes [`INCIDENTS_FILE`] (the pod's incidents, firing and resolved, as `kstall incidents -o
/// json` shows them) and [`EVENTS_FILE`] (its events, one JSON object a line as `kstall trace -o
/// json` prints them) into `dir`. A capture of no known pod has neither: both skipped.
pub fn write(context: &Context, pod_uid: Option<&str>, dir: &Path) -> Result<Vec<FileNote>, String> {
    let incidents_what = "the pod's incidents (firing, then resolved) as kstall's API shows them";
    let events_what = "kstall's last events about the pod, oldest first, one JSON object a line";
    let Some(uid) = pod_uid else {
        let skipped = |path: &str, what: &str| FileNote {
            path: path.into(),
            what: what.into(),
            status: FileStatus::Skipped,
            error: Some("the capture is of no pod kstall knows".into()),
        };
        return Ok(vec![skipped(INCIDENTS_FILE, incidents_what), skipped(EVENTS_FILE, events_what)]);
    };
    let incidents: Vec<_> = {
        let engine = context.incidents.lock().unwrap_or_else(PoisonError::into_inner);
        engine.incidents().into_iter().filter(|i| i.pod_uid.as_deref() == Some(uid)).collect()
    };
    let json = serde_json::to_vec_pretty(&serde_json::json!({ "incidents": incidents }))
        .map_err(|e| format!("{INCIDENTS_FILE}: {e}"))?;
    write_new(dir, INCIDENTS_FILE, &json)?;
    let (events, held) = context.recent.of_pod(uid, EVENTS_PER_BUNDLE);
    let mut lines = Vec::new();
    for event in &events {
        serde_json::to_writer(&mut lines, &**event).map_err(|e| format!("{EVENTS_FILE}: {e}"))?;
        lines.push(b'\n');
    }
    write_new(dir, EVENTS_FILE, &lines)?;
    let (status, error) = if held > events.len() {
        (
            FileStatus::Partial,
            Some(format!("{held} events of the pod kept: the newest {EVENTS_PER_BUNDLE} written")),
        )
    } else {
        (FileStatus::Complete, None)
    };
    Ok(vec![
        FileNote {
            path: INCIDENTS_FILE.into(),
            what: incidents_what.into(),
            status: FileStatus::Complete,
            error: None,
        },
        FileNote {
            path: EVENTS_FILE.into(),
            what: format!("{events_what} (from the node's last {EVENTS_KEPT} events)"),
            status,
            error,
        },
    ])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::incidents::{
        Settings,
        signatures::{nfs_sidecar_redirect, tests::*},
    };

    #[test]
    fn a_bundle_takes_its_pods_incidents_and_newest_events_and_no_other_pods() {
        let (web, db) = (pod("u1", "web-1"), pod("u2", "db-0"));
        let mut engine = Engine::new("node-a".into(), &Settings::default());
        let recent = Arc::new(Recent::new(4));
        for (t, who) in [(101, &web), (102, &db), (103, &web), (104, &web), (105, &web)] {
            let event = Arc::new(redirected_reset(t * SEC, 2049, who));
            engine.observe(&event);
            recent.keep(&event);
        }
        let fired = engine.evaluate(106 * SEC, &node(&stuck(&[])));
        assert!(fired.fired.iter().any(|i| i.signature == nfs_sidecar_redirect::NAME), "{fired:?}");
        let context = Context { recent, incidents: Arc::new(Mutex::new(engine)) };
        let dir = tempfile::tempdir().unwrap();
        let notes = write(&context, Some("u1"), dir.path()).unwrap();

        let incidents: serde_json::Value =
            serde_json::from_slice(&std::fs::read(dir.path().join(INCIDENTS_FILE)).unwrap()).unwrap();
        let incidents = incidents["incidents"].as_array().unwrap();
        assert_eq!(incidents.len(), 1, "{incidents:?}");
        assert_eq!(
            (&incidents[0]["signature"], &incidents[0]["pod"]),
            (&"nfs-sidecar-redirect".into(), &"web-1".into())
        );
        // The ring of 4 lost web-1's first; db-0's is not the pod's.
        let events = std::fs::read_to_string(dir.path().join(EVENTS_FILE)).unwrap();
        let times: Vec<u64> = events
            .lines()
            .map(|l| {
                serde_json::from_str::<serde_json::Value>(l).unwrap()["time_unix_ns"].as_u64().unwrap() / SEC
            })
            .collect();
        assert_eq!(times, [103, 104, 105]);
        assert!(notes.iter().all(|n| n.status == FileStatus::Complete), "{notes:?}");
    }

    #[test]
    fn the_newest_events_are_taken_and_the_note_says_how_many_were_left() {
        let web = pod("u1", "web-1");
        let recent = Recent::new(EVENTS_PER_BUNDLE + 5);
        for t in 0..EVENTS_PER_BUNDLE as u64 + 5 {
            recent.keep(&Arc::new(redirected_reset(t, 2049, &web)));
        }
        let (events, held) = recent.of_pod("u1", EVENTS_PER_BUNDLE);
        assert_eq!((events.len(), held), (EVENTS_PER_BUNDLE, EVENTS_PER_BUNDLE + 5));
        assert_eq!(events[0].event.header.time_unix_ns, 5);
        let context = Context {
            recent: Arc::new(recent),
            incidents: Arc::new(Mutex::new(Engine::new("node-a".into(), &Settings::default()))),
        };
        let dir = tempfile::tempdir().unwrap();
        let notes = write(&context, Some("u1"), dir.path()).unwrap();
        assert_eq!(notes[1].status, FileStatus::Partial);
        assert_eq!(notes[1].error.as_deref(), Some("1005 events of the pod kept: the newest 1000 written"));
        // No pod: neither file, both said skipped.
        let none = tempfile::tempdir().unwrap();
        let notes = write(&context, None, none.path()).unwrap();
        assert!(notes.iter().all(|n| n.status == FileStatus::Skipped));
        assert!(!none.path().join("kstall").exists());
    }
}
