//! The incident history on disk (`--state-dir`, `/var/lib/kstall` by default): what fired and
//! what still fires, so that a restart (a rolling update, the agent OOM-killed) neither forgets
//! the history nor leaves an alert firing forever. One JSON file, written whole (a temporary file,
//! fsync, rename), bounded in size; a file that cannot be taken back (corrupt, another version,
//! another node's, too big) is moved aside with one warning and the agent starts without it.

use std::{
    io::{self, Read as _, Write as _},
    path::{Path, PathBuf},
};

use serde::{Deserialize, Serialize};

use super::Incident;

pub const FILE: &str = "incidents.json";
/// Changes with the file's shape; a file of another version is moved aside, not guessed at.
pub const VERSION: u32 = 1;
/// The file's bound: the oldest resolved incidents are left out to stay below it.
pub const MAX_BYTES: usize = 4 << 20;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Saved {
    pub version: u32,
    pub node: String,
    pub saved_unix_ns: u64,
    pub firing: Vec<Incident>,
    /// Newest first.
    pub resolved: Vec<Incident>,
}

impl Saved {
    pub fn new(node: &str, saved_unix_ns: u64, firing: Vec<Incident>, resolved: Vec<Incident>) -> Self {
        Self { version: VERSION, node: node.to_string(), saved_unix_ns, firing, resolved }
    }
}

/// What was found in the state directory at start.
#[derive(Debug, PartialEq)]
pub enum Loaded {
    /// No file: a first start.
    Nothing,
    History(Saved),
    /// The file could not be taken back; it is now at `to`.
    MovedAside {
        to: PathBuf,
        why: String,
    },
}

/// Reads the history of `node` from `dir`, moving a file that is not one aside.
pub fn load(dir: &Path, node: &str) -> io::Result<Loaded> {
    let path = dir.join(FILE);
    let mut text = Vec::new();
    match std::fs::File::open(&path) {
        Ok(file) => file.take(MAX_BYTES as u64 + 1).read_to_end(&mut text)?,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Loaded::Nothing),
        Err(e) => return Err(e),
    };
    let why = if text.len() > MAX_BYTES {
        format!("larger than {} bytes", MAX_BYTES)
    } else {
        match serde_json::from_slice::<Versioned>(&text) {
            Err(e) => format!("not a kstall incident history ({e})"),
            Ok(Versioned { version }) if version != VERSION => {
                format!("version {version}, this kstall reads version {VERSION}")
            }
            Ok(_) => match serde_json::from_slice::<Saved>(&text) {
                Err(e) => format!("not a kstall incident history ({e})"),
                Ok(saved) if saved.node != node => format!("node {:?}'s, this is {node:?}", saved.node),
                Ok(saved) => return Ok(Loaded::History(saved)),
            },
        }
    };
    let to = dir.join(format!("{FILE}.unreadable-{}", crate::kernel::unix_now_ns() / 1_000_000_000));
    std::fs::rename(&path, &to)?;
    Ok(Loaded::MovedAside { to, why })
}

#[derive(Deserialize)]
struct Versioned {
    version: u32,
}

/// Writes `saved` whole, or not at all: a crash leaves the previous file. Returns the bytes
/// written; the oldest resolved incidents are left out where the file would pass its bound.
pub fn save(dir: &Path, saved: &Saved) -> io::Result<usize> {
    let text = bounded(saved);
    let tmp = dir.join(format!("{FILE}.tmp"));
    let mut file = std::fs::File::create(&tmp)?;
    file.write_all(&text)?;
    file.sync_all()?;
    drop(file);
    std::fs::rename(&tmp, dir.join(FILE))?;
    // The rename itself must reach the disk for the new file to survive a power cut.
    std::fs::File::open(dir)?.sync_all()?;
    Ok(text.len())
}

/// The JSON of `saved`, without as many of its oldest resolved incidents as it takes to fit in
/// [`MAX_BYTES`] (the firing ones are always kept).
fn bounded(saved: &Saved) -> Vec<u8> {
    let encode = |s: &Saved| serde_json::to_vec(s).expect("incidents serialize");
    let mut text = encode(saved);
    if text.len() <= MAX_BYTES {
        return text;
    }
    let mut kept = saved.clone();
    while text.len() > MAX_BYTES && !kept.resolved.is_empty() {
        // In proportion to the excess, at least one: a few passes, not one per incident.
        let excess = (text.len() - MAX_BYTES) as f64 / text.len() as f64;
        let drop = ((kept.resolved.len() as f64 * excess).ceil() as usize).max(1);
        kept.resolved.truncate(kept.resolved.len().saturating_sub(drop));
        text = encode(&kept);
    }
    text
}

/// Creates the state directory (0700: incidents name pods and carry their evidence).
pub fn create_dir(dir: &Path) -> io::Result<()> {
    use std::os::unix::fs::DirBuilderExt as _;
    std::fs::DirBuilder::new().recursive(true).mode(0o700).create(dir)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::incidents::{State, tests::incident};

    fn history(resolved: usize) -> Saved {
        let mut old = incident(Some(1_796_000_100_000_000_000));
        old.state = State::Resolved;
        let resolved = (0..resolved)
            .map(|i| {
                let mut r = old.clone();
                r.id = format!("nfs-sidecar-redirect/node-a/netns-{i}");
                r
            })
            .collect();
        Saved::new("node-a", 1_796_000_200_000_000_000, vec![incident(None)], resolved)
    }

    #[test]
    fn what_is_saved_is_loaded_back_and_nothing_is_left_behind() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(load(dir.path(), "node-a").unwrap(), Loaded::Nothing);
        let saved = history(3);
        save(dir.path(), &saved).unwrap();
        // Written again over the first: the rename replaces it.
        save(dir.path(), &saved).unwrap();
        assert_eq!(load(dir.path(), "node-a").unwrap(), Loaded::History(saved));
        let files: Vec<_> = std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert_eq!(files, [FILE], "no temporary file stays");
    }

    /// Written by a kstall before incidents recorded when they fired: still this version's.
    #[test]
    fn a_history_without_fired_times_is_taken_back() {
        let dir = tempfile::tempdir().unwrap();
        let mut saved = history(1);
        let mut text = serde_json::to_value(&saved).unwrap();
        for list in ["firing", "resolved"] {
            for incident in text[list].as_array_mut().unwrap() {
                incident.as_object_mut().unwrap().remove("fired_unix_ns").expect("written today");
            }
        }
        std::fs::write(dir.path().join(FILE), text.to_string()).unwrap();
        saved.firing.iter_mut().chain(&mut saved.resolved).for_each(|i| i.fired_unix_ns = None);
        assert_eq!(load(dir.path(), "node-a").unwrap(), Loaded::History(saved));
    }

    #[test]
    fn a_file_that_is_not_a_history_is_moved_aside_with_the_reason() {
        let cases: [(&[u8], &str); 5] = [
            (b"{\"version\":1,\"node\":\"node-a\",\"firing\":[", "not a kstall incident history"),
            (b"\x00\xff garbage", "not a kstall incident history"),
            (b"{\"version\":7,\"anything\":true}", "version 7, this kstall reads version 1"),
            (
                br#"{"version":1,"node":"node-b","saved_unix_ns":1,"firing":[],"resolved":[]}"#,
                "node \"node-b\"'s",
            ),
            (&[b' '; MAX_BYTES + 1], "larger than"),
        ];
        for (text, reason) in cases {
            let dir = tempfile::tempdir().unwrap();
            std::fs::write(dir.path().join(FILE), text).unwrap();
            match load(dir.path(), "node-a").unwrap() {
                Loaded::MovedAside { to, why } => {
                    assert!(why.contains(reason), "{why}");
                    assert!(!why.contains('\n'), "{why}");
                    assert_eq!(std::fs::read(&to).unwrap(), text, "kept for a look");
                }
                other => panic!("{reason}: {other:?}"),
            }
            assert_eq!(load(dir.path(), "node-a").unwrap(), Loaded::Nothing, "{reason}: the path is free");
        }
    }

    #[test]
    fn a_history_past_the_bound_leaves_out_its_oldest_resolved_incidents() {
        let mut saved = history(0);
        let mut big = incident(Some(1));
        big.evidence = serde_json::json!({ "stack": "x".repeat(100_000) });
        saved.resolved = (0..60)
            .map(|i| {
                let mut r = big.clone();
                r.id = format!("resolved-{i}");
                r
            })
            .collect();
        let text = bounded(&saved);
        assert!(text.len() <= MAX_BYTES, "{}", text.len());
        let kept: Saved = serde_json::from_slice(&text).unwrap();
        assert_eq!(kept.firing, saved.firing, "firing incidents are always kept");
        assert!(kept.resolved.len() >= 35 && kept.resolved.len() < 60, "{}", kept.resolved.len());
        assert_eq!(kept.resolved[..], saved.resolved[..kept.resolved.len()], "the newest are kept");
    }
}
