//! What the capture tests share: a disk of their own, a bundle unpacked and checked against its
//! manifest, the packets read back by tcpdump, a namespace's packet sockets.

use std::{
    collections::BTreeSet,
    path::{Path, PathBuf},
    process::Command,
};

use crate::netns::NetNs;

/// A 256 MiB tmpfs on a temporary directory (or a directory of the test's choosing), unmounted on
/// drop: the captures' output or state directory. kstall refuses a capture on a filesystem with
/// less than 5% free, so a test writing to the host's disk would pass or fail with how full the
/// machine is.
pub struct CaptureDisk {
    path: PathBuf,
    /// Removed after the unmount (fields drop after `Drop::drop`).
    _temporary: Option<tempfile::TempDir>,
}

impl CaptureDisk {
    pub fn new() -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        Self::mounted(dir.path().to_path_buf(), Some(dir))
    }

    /// On `path`, made if missing and left there (empty) on drop: where a DaemonSet's hostPath
    /// puts the agent's captures.
    pub fn at(path: &Path) -> Self {
        std::fs::create_dir_all(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        Self::mounted(path.to_path_buf(), None)
    }

    fn mounted(path: PathBuf, temporary: Option<tempfile::TempDir>) -> Self {
        let mounted = Command::new("mount")
            .args(["-t", "tmpfs", "-o", "size=256m,mode=0700", "kstall-capture-test"])
            .arg(&path)
            .status()
            .expect("mount");
        assert!(mounted.success(), "mount -t tmpfs on {}", path.display());
        CaptureDisk { path, _temporary: temporary }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Default for CaptureDisk {
    fn default() -> Self {
        Self::new()
    }
}

impl Drop for CaptureDisk {
    fn drop(&mut self) {
        // Detached: a capture still writing (a failed test) does not keep the mount.
        let _ = Command::new("umount").arg("-l").arg(&self.path).status();
    }
}

/// A kept bundle (the agent's, under its state dir) copied into a directory of its own and
/// unpacked there, checked as [`unpacked`] checks it; the directory goes on drop.
pub struct Opened {
    pub top: PathBuf,
    pub manifest: serde_json::Value,
    _dir: tempfile::TempDir,
}

pub fn opened(bundle: &Path) -> Opened {
    let dir = tempfile::tempdir().expect("tempdir");
    let name = bundle.file_name().expect("a bundle's file name");
    std::fs::copy(bundle, dir.path().join(name)).unwrap_or_else(|e| panic!("{}: {e}", bundle.display()));
    let top = unpacked(dir.path());
    let manifest = manifest_of(&top);
    Opened { top, manifest, _dir: dir }
}

/// The manifest of an unpacked bundle.
pub fn manifest_of(top: &Path) -> serde_json::Value {
    serde_json::from_slice(&std::fs::read(top.join("manifest.json")).expect("manifest.json"))
        .expect("its JSON")
}

/// The namespace's packet sockets (`/proc/net/packet` read from inside it), header left out.
pub fn packet_sockets(ns: &NetNs) -> usize {
    ns.exec("cat", &["/proc/net/packet"]).lines().skip(1).filter(|l| !l.trim().is_empty()).count()
}

pub fn tcpdump(file: &Path) -> (String, String) {
    let out = Command::new("tcpdump")
        .args(["-nn", "-r"])
        .arg(file)
        .output()
        .expect("tcpdump (cargo xtask bootstrap)");
    assert!(out.status.success(), "tcpdump -r: {}", String::from_utf8_lossy(&out.stderr));
    (String::from_utf8_lossy(&out.stdout).into_owned(), String::from_utf8_lossy(&out.stderr).into_owned())
}

/// The client port of each line that matches `before` PORT `after`.
pub fn ports(lines: &str, before: &str, after: &str) -> Vec<u16> {
    lines
        .lines()
        .filter_map(|l| l.split_once(before)?.1.split_once(after).map(|(p, _)| p.parse().expect(l)))
        .collect()
}

/// The capture's one bundle in `out`, unpacked there once `tar tvzf` shows every file 0600 and
/// every directory 0700; every file in it is in the manifest with its size and sha256 (and the
/// manifest lists nothing that is not there but skipped files). Its top directory.
pub fn unpacked(out: &Path) -> PathBuf {
    let bundles: Vec<PathBuf> = std::fs::read_dir(out)
        .expect("the output dir")
        .map(|e| e.unwrap().path())
        .filter(|p| p.to_string_lossy().ends_with(".tar.gz"))
        .collect();
    assert_eq!(bundles.len(), 1, "{bundles:?}");
    let bundle = &bundles[0];
    let mode = std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(bundle).unwrap().permissions());
    assert_eq!(mode & 0o777, 0o600, "{}", bundle.display());
    let listing = Command::new("tar").arg("tvzf").arg(bundle).output().expect("tar");
    assert!(listing.status.success(), "tar tvzf: {}", String::from_utf8_lossy(&listing.stderr));
    let listing = String::from_utf8_lossy(&listing.stdout).into_owned();
    for line in listing.lines() {
        assert!(line.starts_with("-rw------- 0/0 ") || line.starts_with("drwx------ 0/0 "), "{listing}");
    }
    assert!(
        listing.lines().next().is_some_and(|l| l.ends_with("/manifest.json")),
        "manifest first:\n{listing}"
    );
    let untar = Command::new("tar").arg("xzf").arg(bundle).arg("-C").arg(out).status().expect("tar");
    assert!(untar.success());
    let id = bundle.file_name().unwrap().to_string_lossy().trim_end_matches(".tar.gz").to_string();
    let top = out.join(format!("kstall-capture-{id}"));
    let manifest = manifest_of(&top);
    assert_eq!(manifest["schema"], "kstall.capture/v1");
    assert_eq!(manifest["id"], id.as_str());
    let mut listed = BTreeSet::new();
    for file in manifest["files"].as_array().expect("files") {
        let path = file["path"].as_str().unwrap();
        if file["status"] == "skipped" {
            assert!(!top.join(path).exists(), "{file}");
            continue;
        }
        let bytes = std::fs::read(top.join(path)).unwrap_or_else(|e| panic!("{path}: {e}"));
        assert_eq!(file["bytes"], bytes.len() as u64, "{file}");
        let sum = Command::new("sha256sum").arg(top.join(path)).output().expect("sha256sum");
        let sum = String::from_utf8_lossy(&sum.stdout);
        assert_eq!(file["sha256"].as_str(), sum.split_whitespace().next(), "{file}");
        listed.insert(path.to_string());
    }
    for line in listing.lines().filter(|l| l.starts_with('-')) {
        let path = line.split_once(&format!("kstall-capture-{id}/")).unwrap().1;
        assert!(path == "manifest.json" || listed.contains(path), "{path} is not in the manifest");
    }
    top
}
