//! `--pods-file`: the JSON `kubectl get pods -o json` prints (a `List` of pods), reloaded when it
//! changes. For running off-cluster and for tests; a file that does not parse is reported once and
//! the pods already known are kept.

use std::{
    path::{Path, PathBuf},
    time::{Duration, SystemTime},
};

use k8s_openapi::api::core::v1::Pod;
use serde::Deserialize;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::{Health, PodMeta, PodUpdate};

/// How often the file is checked for a change (mtime, size, inode: catches in-place writes and
/// the rename a ConfigMap update does).
const POLL_INTERVAL: Duration = Duration::from_millis(500);
/// A file read that takes longer (a stuck network filesystem) is abandoned until the next poll.
const READ_TIMEOUT: Duration = Duration::from_secs(2);
/// A larger file is not read: a node's pods are a few MB of JSON, and parsing a runaway file
/// would take the agent past its memory limit.
pub const MAX_BYTES: u64 = 16 << 20;

#[derive(Deserialize)]
struct PodList {
    items: Vec<Pod>,
}

#[derive(Debug, thiserror::Error)]
pub enum PodsFileError {
    /// Missing, not a regular file, larger than `MAX_BYTES`, not UTF-8.
    #[error("{0}")]
    Read(String),
    #[error("{path} is not the JSON of `kubectl get pods -o json`: {message}")]
    Parse { path: PathBuf, message: String },
}

/// Parses the file's text: a list of pods, or a single pod.
pub fn parse(path: &Path, text: &str, selected_labels: &[String]) -> Result<Vec<PodMeta>, PodsFileError> {
    let parse_error =
        |e: serde_json::Error| PodsFileError::Parse { path: path.into(), message: e.to_string() };
    // Into the pods directly, not through a JSON tree: a tree of the file costs several times its
    // size. A list has `items`; anything else is read as one pod.
    let pods = match serde_json::from_str::<PodList>(text) {
        Ok(list) => list.items,
        Err(e) if e.is_data() && e.to_string().starts_with("missing field `items`") => {
            vec![serde_json::from_str::<Pod>(text).map_err(parse_error)?]
        }
        Err(e) => return Err(parse_error(e)),
    };
    Ok(pods.iter().filter_map(|p| PodMeta::from_pod(p, selected_labels)).collect())
}

/// Reads (bounded) and parses the file.
pub fn load(path: &Path, selected_labels: &[String]) -> Result<Vec<PodMeta>, PodsFileError> {
    let text = crate::named_file::read_text(path, MAX_BYTES).map_err(PodsFileError::Read)?;
    parse(path, &text, selected_labels)
}

/// What identifies one version of the file.
fn version(path: &Path) -> Option<(SystemTime, u64, u64)> {
    use std::os::unix::fs::MetadataExt as _;
    let m = std::fs::metadata(path).ok()?;
    Some((m.modified().ok()?, m.len(), m.ino()))
}

/// Sends a snapshot of the file's pods at start and after every change, until `stop`.
pub async fn watch(
    path: PathBuf,
    selected_labels: Vec<String>,
    updates: mpsc::Sender<PodUpdate>,
    health: Health,
    stop: CancellationToken,
) {
    let mut seen = None;
    let mut failing = false;
    let mut tick = tokio::time::interval(POLL_INTERVAL);
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tick.tick() => {}
        }
        let (p, labels) = (path.clone(), selected_labels.clone());
        let read = tokio::task::spawn_blocking(move || {
            let before = version(&p);
            (before, load(&p, &labels))
        });
        let (at, result) = match tokio::time::timeout(READ_TIMEOUT, read).await {
            Ok(Ok(done)) => done,
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "pods file reader failed");
                continue;
            }
            Err(_) => {
                if !failing {
                    tracing::warn!(path = %path.display(), "reading the pods file timed out; keeping the pods known");
                    failing = true;
                }
                health.set(false, Some("reading the file timed out".into()));
                continue;
            }
        };
        if at.is_some() && at == seen {
            continue;
        }
        match result {
            Ok(pods) => {
                tracing::info!(path = %path.display(), pods = pods.len(), "pods file loaded");
                failing = false;
                seen = at;
                health.set(true, None);
                if updates.send(PodUpdate::Snapshot(pods)).await.is_err() {
                    return;
                }
            }
            Err(e) => {
                // Once per version of the file, not once per poll.
                if seen != at || !failing {
                    tracing::warn!(error = %e, "keeping the pods known");
                }
                health.set(false, Some(e.to_string()));
                failing = true;
                seen = at;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::attribution::pods::tests::pod_json;

    #[test]
    fn parses_a_kubectl_list_and_a_single_pod() {
        let list = serde_json::json!({"apiVersion": "v1", "kind": "List", "metadata": {"resourceVersion": ""},
            "items": [pod_json("u1", "a", "c1"), pod_json("u2", "b", "c2")]});
        let pods = parse(Path::new("pods.json"), &list.to_string(), &[]).unwrap();
        assert_eq!(pods.iter().map(|p| p.name.as_str()).collect::<Vec<_>>(), ["a", "b"]);
        let one = parse(Path::new("pod.json"), &pod_json("u1", "a", "c1").to_string(), &[]).unwrap();
        assert_eq!(one[0].uid, "u1");
    }

    #[test]
    fn bad_files_are_one_line_errors() {
        for text in ["", "{", "[1,2]", r#"{"items": 3}"#, r#"{"items": [{"metadata": 5}]}"#] {
            let e = parse(Path::new("/etc/pods.json"), text, &[]).unwrap_err().to_string();
            assert!(e.starts_with("/etc/pods.json is not the JSON of"), "{e}");
            assert!(!e.contains('\n'), "{e}");
        }
    }

    #[tokio::test]
    async fn reloads_on_change_and_keeps_pods_on_a_bad_write() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("pods.json");
        let write = |items: Vec<serde_json::Value>| {
            // Write-and-rename, as a ConfigMap update or `kubectl ... > tmp && mv` does.
            let tmp = dir.path().join("tmp");
            std::fs::write(&tmp, serde_json::json!({"items": items}).to_string()).unwrap();
            std::fs::rename(&tmp, &path).unwrap();
        };
        write(vec![pod_json("u1", "a", "c1")]);
        let (tx, mut rx) = mpsc::channel(8);
        let stop = CancellationToken::new();
        let health = Health::new(format!("file {}", path.display()), false);
        let task = tokio::spawn(watch(path.clone(), vec![], tx, health.clone(), stop.clone()));
        let next = async |rx: &mut mpsc::Receiver<PodUpdate>| {
            tokio::time::timeout(Duration::from_secs(5), rx.recv()).await.expect("an update").unwrap()
        };
        let PodUpdate::Snapshot(first) = next(&mut rx).await else { panic!() };
        assert_eq!(first.len(), 1);
        write(vec![pod_json("u1", "a", "c1"), pod_json("u2", "b", "c2")]);
        let PodUpdate::Snapshot(second) = next(&mut rx).await else { panic!() };
        assert_eq!(second.len(), 2);
        std::fs::write(&path, "{ not json").unwrap();
        assert!(tokio::time::timeout(Duration::from_millis(1500), rx.recv()).await.is_err(), "no update");
        let h = health.get();
        assert!(!h.up && h.error.as_deref().is_some_and(|e| e.contains("is not the JSON")), "{h:?}");
        // Truncated mid-write, then runaway: each one warning, the pods known kept.
        let full = serde_json::json!({"items": [pod_json("u1", "a", "c1")]}).to_string();
        std::fs::write(&path, &full[..full.len() / 2]).unwrap();
        let truncated = async || {
            while !health.get().error.is_some_and(|e| e.contains("EOF while parsing")) {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        };
        tokio::time::timeout(Duration::from_secs(5), truncated()).await.expect("the truncated file refused");
        let runaway = std::fs::File::create(&path).unwrap();
        runaway.set_len(MAX_BYTES + 1).unwrap();
        let too_large = async || {
            while !health.get().error.is_some_and(|e| e.contains("larger than 16 MiB")) {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        };
        tokio::time::timeout(Duration::from_secs(5), too_large()).await.expect("the runaway file refused");
        assert!(rx.try_recv().is_err(), "no update from a bad file");
        write(vec![pod_json("u3", "c", "c3")]);
        let PodUpdate::Snapshot(third) = next(&mut rx).await else { panic!() };
        assert_eq!(third[0].uid, "u3");
        assert!(health.get().up);
        stop.cancel();
        task.await.unwrap();
    }
}
