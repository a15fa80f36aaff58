//! A capture's bundle: the staging directory's files, a `manifest.json` and a `README.txt`, as one
//! `.tar.gz` with everything under `kstall-capture-<id>/`. The manifest is the first entry, so
//! `tar -xzOf … manifest.json` reads little; every other file is listed in it with its size and
//! SHA-256. Files are streamed, never held whole (a pcapng can be 64 MiB).

use std::{
    fs::File,
    io::{self, Read, Write},
    path::Path,
};

use flate2::{Compression, write::GzEncoder};
use ring::digest::{Context, SHA256};
use serde::{Deserialize, Serialize, Serializer};

use super::{FileNote, FileStatus, filter::Snaplen, packets::size, packets::thousands};

pub const SCHEMA: &str = "kstall.capture/v1";
const MANIFEST: &str = "manifest.json";
const README: &str = "README.txt";

/// What the caller knows of a capture; the bundle adds the schema and the files.
#[derive(Debug, Clone)]
pub struct Manifest {
    pub id: String,
    pub node: String,
    /// `uname -r`.
    pub kernel: String,
    /// kstall's version.
    pub kstall: String,
    pub trigger: Trigger,
    pub pod: Pod,
    pub times: Times,
    pub limits: Limits,
    /// One line per limit that cut something (empty: nothing was cut).
    pub cut: Vec<String>,
    pub packets: Packets,
    pub notes: Vec<String>,
}

#[derive(Debug, Clone, Serialize)]
pub struct Trigger {
    pub kind: TriggerKind,
    /// The incidents' ids (empty for a manual capture).
    pub incidents: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub signature: Option<String>,
    /// `socket`, `https:<user>`, `standalone`.
    pub requested_by: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TriggerKind {
    Manual,
    Incident,
}

/// The pod captured; a standalone capture of a bare network namespace has only `netns`.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Pod {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub uid: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub workload: Option<String>,
    /// The network namespace's inode.
    pub netns: u64,
    pub ips: Vec<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Times {
    pub requested: Time,
    pub started: Time,
    pub packets_ended: Time,
    pub ended: Time,
}

/// A moment, written both as unix nanoseconds and RFC 3339 (UTC).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Time(pub u64);

#[derive(Serialize, Deserialize)]
struct TimeText {
    unix_ns: u64,
    rfc3339: String,
}

impl Time {
    pub fn rfc3339(self) -> String {
        jiff::Timestamp::from_nanosecond(i128::from(self.0)).map_or_else(|_| String::new(), |t| t.to_string())
    }
}

impl Serialize for Time {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        TimeText { unix_ns: self.0, rfc3339: self.rfc3339() }.serialize(s)
    }
}

impl<'de> Deserialize<'de> for Time {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        TimeText::deserialize(d).map(|t| Time(t.unix_ns))
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct Limits {
    pub duration_secs: u64,
    pub max_bytes: u64,
    pub max_packets: u64,
    #[serde(serialize_with = "snaplen_text")]
    pub snaplen: Snaplen,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub filter: Option<String>,
    pub filter_from: FilterFrom,
}

/// `"headers"`, `"full"` or the number of bytes.
fn snaplen_text<S: Serializer>(snap: &Snaplen, s: S) -> Result<S::Ok, S::Error> {
    match snap {
        Snaplen::Headers => s.serialize_str("headers"),
        Snaplen::Full => s.serialize_str("full"),
        Snaplen::Bytes(n) => s.serialize_u32(*n),
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum FilterFrom {
    Given,
    Incident,
    None,
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct Packets {
    pub interfaces: Vec<Interface>,
    pub written: u64,
    pub file_bytes: u64,
}

#[derive(Debug, Clone, Serialize)]
pub struct Interface {
    pub name: String,
    pub index: u32,
    /// pcapng's LINKTYPE_: 1 Ethernet (and `lo`), 101 raw IP.
    pub linktype: u16,
    pub accepted: u64,
    pub dropped_by_kernel: u64,
    pub written: u64,
}

/// One file of the bundle, as the manifest lists it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct FileEntry {
    pub path: String,
    pub bytes: u64,
    /// Absent for a file that is not in the bundle (skipped, or missing from the staging dir).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sha256: Option<String>,
    pub what: String,
    pub status: FileStatus,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// The manifest as written: field order is the reading order.
#[derive(Serialize)]
struct Written<'a> {
    schema: &'static str,
    id: &'a str,
    node: &'a str,
    kernel: &'a str,
    kstall: &'a str,
    trigger: &'a Trigger,
    pod: &'a Pod,
    times: &'a Times,
    limits: &'a Limits,
    cut: &'a [String],
    packets: &'a Packets,
    files: &'a [FileEntry],
    notes: &'a [String],
}

/// The directory everything in the tar sits under.
pub fn top_dir(id: &str) -> String {
    format!("kstall-capture-{id}")
}

/// Writes the bundle of `staging` (described by `notes`) as a gzipped tar into `out`; returns
/// what the manifest lists.
pub fn write<W: Write>(
    out: W,
    staging: &Path,
    manifest: &Manifest,
    notes: &[FileNote],
) -> Result<Vec<FileEntry>, String> {
    let (mut files, mut extra_notes) = inventory(staging, notes)?;
    let readme = readme(manifest, &files).into_bytes();
    files.insert(
        0,
        FileEntry {
            path: README.into(),
            bytes: readme.len() as u64,
            sha256: Some(hex(ring::digest::digest(&SHA256, &readme).as_ref())),
            what: "what each file is, how to read the packets, the limits and what they cut".into(),
            status: FileStatus::Complete,
            error: None,
        },
    );
    let mut all_notes = manifest.notes.clone();
    all_notes.append(&mut extra_notes);
    let written = Written {
        schema: SCHEMA,
        id: &manifest.id,
        node: &manifest.node,
        kernel: &manifest.kernel,
        kstall: &manifest.kstall,
        trigger: &manifest.trigger,
        pod: &manifest.pod,
        times: &manifest.times,
        limits: &manifest.limits,
        cut: &manifest.cut,
        packets: &manifest.packets,
        files: &files,
        notes: &all_notes,
    };
    let mut json = serde_json::to_vec_pretty(&written).map_err(|e| format!("manifest: {e}"))?;
    json.push(b'\n');

    let top = top_dir(&manifest.id);
    let mtime = manifest.times.ended.0 / 1_000_000_000;
    let mut tar = tar::Builder::new(GzEncoder::new(out, Compression::fast()));
    let fail = |what: &str, e: io::Error| format!("writing the bundle's {what}: {e}");
    append(&mut tar, &format!("{top}/{MANIFEST}"), json.len() as u64, mtime, &json[..])
        .map_err(|e| fail(MANIFEST, e))?;
    append(&mut tar, &format!("{top}/{README}"), readme.len() as u64, mtime, &readme[..])
        .map_err(|e| fail(README, e))?;
    append_dir(&mut tar, &top, mtime).map_err(|e| fail("directory", e))?;
    let mut dirs_made = Vec::<String>::new();
    for file in files.iter().skip(1).filter(|f| f.sha256.is_some()) {
        // Each subdirectory's entry (0700) before its first file.
        let parts: Vec<&str> = file.path.split('/').collect();
        for end in 1..parts.len() {
            let parent = parts[..end].join("/");
            if !dirs_made.contains(&parent) {
                append_dir(&mut tar, &format!("{top}/{parent}"), mtime).map_err(|e| fail(&parent, e))?;
                dirs_made.push(parent);
            }
        }
        let source = File::open(staging.join(&file.path)).map_err(|e| fail(&file.path, e))?;
        // Hashed again as it is copied: the manifest, written first, must match what follows.
        let mut reader = Hashing { inner: source.take(file.bytes), digest: Context::new(&SHA256), read: 0 };
        append(&mut tar, &format!("{top}/{}", file.path), file.bytes, mtime, &mut reader)
            .map_err(|e| fail(&file.path, e))?;
        let digest = hex(reader.digest.finish().as_ref());
        if reader.read != file.bytes || Some(&digest) != file.sha256.as_ref() {
            return Err(format!("{}: changed while it was bundled", file.path));
        }
    }
    tar.into_inner()
        .and_then(|gz| gz.finish())
        .and_then(|mut out| out.flush())
        .map_err(|e| fail("end", e))?;
    Ok(files)
}

fn header(kind: tar::EntryType, mode: u32, bytes: u64, mtime: u64) -> tar::Header {
    let mut header = tar::Header::new_gnu();
    header.set_entry_type(kind);
    header.set_mode(mode);
    header.set_uid(0);
    header.set_gid(0);
    header.set_mtime(mtime);
    header.set_size(bytes);
    header
}

fn append<W: Write>(
    tar: &mut tar::Builder<W>,
    path: &str,
    bytes: u64,
    mtime: u64,
    data: impl Read,
) -> io::Result<()> {
    tar.append_data(&mut header(tar::EntryType::Regular, 0o600, bytes, mtime), path, data)
}

fn append_dir<W: Write>(tar: &mut tar::Builder<W>, path: &str, mtime: u64) -> io::Result<()> {
    tar.append_data(&mut header(tar::EntryType::Directory, 0o700, 0, mtime), format!("{path}/"), io::empty())
}

struct Hashing<R> {
    inner: R,
    digest: Context,
    read: u64,
}

impl<R: Read> Read for Hashing<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.digest.update(&buf[..n]);
        self.read += n as u64;
        Ok(n)
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Size and SHA-256 of a file, read in 256 KiB pieces.
fn digest_file(path: &Path) -> io::Result<(u64, String)> {
    let mut file = File::open(path)?;
    let mut reader = Hashing { inner: &mut file, digest: Context::new(&SHA256), read: 0 };
    io::copy(&mut reader, &mut io::sink())?;
    Ok((reader.read, hex(reader.digest.finish().as_ref())))
}

/// Where a file goes in the bundle: the packets first, then by directory in the design's order.
fn rank(path: &str) -> u8 {
    match path {
        "packets.pcapng" => 0,
        "packets-raw.pcapng" => 1,
        p if !p.contains('/') => 2,
        p if p.starts_with("net/") => 3,
        p if p.starts_with("nfs/") => 4,
        p if p.starts_with("tasks/") => 5,
        p if p.starts_with("kstall/") => 6,
        _ => 7,
    }
}

/// Every regular file under `staging`, with its note's words, size and digest, in the bundle's
/// order; notes of files that are not there (skipped) are listed without a digest. The second
/// value is the manifest notes about what could not go in.
fn inventory(staging: &Path, notes: &[FileNote]) -> Result<(Vec<FileEntry>, Vec<String>), String> {
    let mut found = Vec::new();
    let mut refused = Vec::new();
    walk(staging, "", &mut found, &mut refused)?;
    let mut files = Vec::new();
    for path in &found {
        if path == MANIFEST || path == README {
            refused.push(format!(
                "{path}: a collector's file of that name is left out; the bundle writes its own"
            ));
            continue;
        }
        let (bytes, sha256) =
            digest_file(&staging.join(path)).map_err(|e| format!("{}: {e}", staging.join(path).display()))?;
        let entry = match notes.iter().find(|n| &n.path == path) {
            Some(note) => FileEntry {
                path: path.clone(),
                bytes,
                sha256: Some(sha256),
                what: note.what.clone(),
                status: note.status,
                error: note.error.clone(),
            },
            None => FileEntry {
                path: path.clone(),
                bytes,
                sha256: Some(sha256),
                what: "not described by the collector that wrote it".into(),
                status: FileStatus::Complete,
                error: None,
            },
        };
        files.push(entry);
    }
    for note in notes.iter().filter(|n| !found.contains(&n.path)) {
        let (status, error) = match note.status {
            FileStatus::Skipped => (FileStatus::Skipped, note.error.clone()),
            _ => (FileStatus::Failed, Some(note.error.clone().unwrap_or_else(|| "not written".into()))),
        };
        files.push(FileEntry {
            path: note.path.clone(),
            bytes: 0,
            sha256: None,
            what: note.what.clone(),
            status,
            error,
        });
    }
    files.sort_by(|a, b| (rank(&a.path), &a.path).cmp(&(rank(&b.path), &b.path)));
    Ok((files, refused))
}

fn walk(dir: &Path, prefix: &str, found: &mut Vec<String>, refused: &mut Vec<String>) -> Result<(), String> {
    let entries = std::fs::read_dir(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    for entry in entries {
        let entry = entry.map_err(|e| format!("{}: {e}", dir.display()))?;
        let Some(name) = entry.file_name().to_str().map(str::to_string) else {
            refused.push(format!(
                "{prefix}{}: a name that is not UTF-8, left out",
                entry.file_name().to_string_lossy()
            ));
            continue;
        };
        let path = format!("{prefix}{name}");
        let kind = entry.file_type().map_err(|e| format!("{path}: {e}"))?;
        if kind.is_dir() {
            walk(&entry.path(), &format!("{path}/"), found, refused)?;
        } else if kind.is_file() {
            found.push(path);
        } else {
            // A symlink could point anywhere on the node: never followed.
            refused.push(format!("{path}: not a regular file, left out"));
        }
    }
    Ok(())
}

const NAT_NOTE: &str = "\
Where the redirect shows (NAT). On the pod's lo the SYN appears after the REDIRECT,
as `pod:port > 127.0.0.1:15001 [S]`; the RST appears after conntrack undid the NAT,
as `server:2049 > pod:port [R.]`. No interface shows a packet that carries both
ports, and none shows a SYN to 2049: the conntrack file links the two.

Conntrack. A connection answered by a RST alone is deleted at once: the dumps at
the start and the end never show it. Only the events recorded during the capture
do, with orig dport=2049 and reply sport=15001 (the redirect).
";

fn readme(m: &Manifest, files: &[FileEntry]) -> String {
    let mut out = format!("kstall capture {}\n\n", m.id);
    out += &format!("node {}, kernel {}, kstall {}\n", m.node, m.kernel, m.kstall);
    let pod = &m.pod;
    match (&pod.namespace, &pod.name) {
        (Some(ns), Some(name)) => {
            out += &format!("pod {ns}/{name}");
            if let Some(workload) = &pod.workload {
                out += &format!(" ({workload})");
            }
            out += &format!(", netns {}", pod.netns);
            if !pod.ips.is_empty() {
                out += &format!(", addresses {}", pod.ips.join(" "));
            }
            out += "\n";
        }
        _ => out += &format!("network namespace {} (no pod)\n", pod.netns),
    }
    out += &match m.trigger.kind {
        TriggerKind::Manual => format!("started by hand ({})\n", m.trigger.requested_by),
        TriggerKind::Incident => format!(
            "started by incident {}{}\n",
            m.trigger.incidents.join(", "),
            m.trigger.signature.as_ref().map(|s| format!(" ({s})")).unwrap_or_default()
        ),
    };
    out += &format!(
        "from {} to {}; packets until {}\n\n",
        m.times.started.rfc3339(),
        m.times.ended.rfc3339(),
        m.times.packets_ended.rfc3339()
    );

    out += "Files\n";
    let width = files.iter().map(|f| f.path.len()).chain([MANIFEST.len()]).max().unwrap_or(0);
    out += &format!("  {MANIFEST:width$}  what is here: times, limits, each file's size and SHA-256\n");
    for f in files {
        let state = match (f.status, &f.error) {
            (FileStatus::Complete, _) => String::new(),
            (status, Some(e)) => format!(" [{}: {e}]", status_word(status)),
            (status, None) => format!(" [{}]", status_word(status)),
        };
        out += &format!("  {:width$}  {}{state}\n", f.path, f.what);
    }
    out += "\nReading the packets\n";
    out += "  tcpdump -nn -r packets.pcapng\n";
    out += "  tshark -r packets.pcapng -Y tcp.flags.reset==1\n";
    if files.iter().any(|f| f.path == "packets-raw.pcapng") {
        out += "  packets-raw.pcapng holds the bare-IP interfaces (tun, wireguard): libpcap reads one\n  link type per file.\n";
    }
    out += "\n";
    out += NAT_NOTE;

    let l = &m.limits;
    out += "\nLimits\n";
    out += &format!(
        "  at most {} s, {} and {} packets; snaplen {}\n",
        l.duration_secs,
        size(l.max_bytes),
        thousands(l.max_packets),
        match l.snaplen {
            Snaplen::Headers => "headers (up to the end of the TCP/UDP header, no payload)".to_string(),
            Snaplen::Full => "full".to_string(),
            Snaplen::Bytes(n) => format!("{n} bytes"),
        }
    );
    out += &match (&l.filter, l.filter_from) {
        (Some(f), FilterFrom::Incident) => format!("  filter (from the incident): {f}\n"),
        (Some(f), _) => format!("  filter: {f}\n"),
        (None, _) => "  filter: none, every packet\n".to_string(),
    };
    out += "\nCut\n";
    if m.cut.is_empty() {
        out += "  nothing: no limit was reached\n";
    }
    for cut in &m.cut {
        out += &format!("  {cut}\n");
    }
    if !m.notes.is_empty() {
        out += "\nNotes\n";
        for note in &m.notes {
            out += &format!("  {note}\n");
        }
    }
    out
}

fn status_word(status: FileStatus) -> &'static str {
    match status {
        FileStatus::Complete => "complete",
        FileStatus::Partial => "partial",
        FileStatus::Failed => "failed",
        FileStatus::Skipped => "skipped",
    }
}

#[cfg(test)]
pub(super) mod tests {
    use std::collections::BTreeMap;

    use super::*;

    pub fn manifest(id: &str, ended_ns: u64) -> Manifest {
        Manifest {
            id: id.into(),
            node: "node-a".into(),
            kernel: "6.18.0".into(),
            kstall: "0.1.0".into(),
            trigger: Trigger {
                kind: TriggerKind::Incident,
                incidents: vec!["inc-1".into()],
                signature: Some("nfs-sidecar-redirect".into()),
                requested_by: "socket".into(),
            },
            pod: Pod {
                namespace: Some("shop".into()),
                name: Some("tenant-api-5d8c7b9f4-t9r2p".into()),
                uid: Some("0f0e".into()),
                workload: Some("Deployment/tenant-api".into()),
                netns: 4026532000,
                ips: vec!["10.99.0.1".into()],
            },
            times: Times {
                requested: Time(ended_ns - 3_000_000_000),
                started: Time(ended_ns - 2_000_000_000),
                packets_ended: Time(ended_ns - 1_000_000_000),
                ended: Time(ended_ns),
            },
            limits: Limits {
                duration_secs: 60,
                max_bytes: 64 << 20,
                max_packets: 1_000_000,
                snaplen: Snaplen::Headers,
                filter: Some("port 2049".into()),
                filter_from: FilterFrom::Incident,
            },
            cut: vec!["packets: byte cap 64 MiB reached after 7.3 s".into()],
            packets: Packets { interfaces: vec![], written: 2, file_bytes: 300 },
            notes: vec![],
        }
    }

    /// A staging dir as the collectors leave it, and their notes.
    pub fn stage(dir: &Path) -> Vec<FileNote> {
        std::fs::create_dir_all(dir.join("net")).unwrap();
        std::fs::create_dir_all(dir.join("nfs")).unwrap();
        // Bigger than one read and not a multiple of it: streamed in pieces.
        let packets: Vec<u8> = (0..700_001u32).map(|i| (i * 7 % 251) as u8).collect();
        std::fs::write(dir.join("packets.pcapng"), &packets).unwrap();
        std::fs::write(dir.join("net/conntrack.txt"), "orig dport=2049 reply sport=15001\n").unwrap();
        std::fs::write(
            dir.join("net/rules.txt"),
            "-A OUTPUT -p tcp --dport 2049 -j REDIRECT --to-ports 15001\n",
        )
        .unwrap();
        std::fs::write(dir.join("nfs/mountstats-4026531841.txt"), "").unwrap();
        let note = |path: &str, what: &str, status, error: Option<&str>| FileNote {
            path: path.into(),
            what: what.into(),
            status,
            error: error.map(Into::into),
        };
        vec![
            note("net/rules.txt", "the namespace's NAT, mangle and filter rules", FileStatus::Complete, None),
            note(
                "net/conntrack.txt",
                "conntrack entries and events",
                FileStatus::Partial,
                Some("events: 12 lost"),
            ),
            note("packets.pcapng", "the packets, headers only", FileStatus::Complete, None),
            note(
                "nfs/mountstats-4026531841.txt",
                "the pod's NFS mounts' statistics",
                FileStatus::Complete,
                None,
            ),
            note("tasks/stacks.txt", "stuck tasks' stacks", FileStatus::Skipped, Some("no stuck task")),
        ]
    }

    /// Every entry of a bundle: (path, mode, uid, gid, mtime, kind, contents).
    type Entry = (String, u32, u64, u64, u64, tar::EntryType, Vec<u8>);

    pub fn entries(bundle: impl Read) -> Vec<Entry> {
        let mut archive = tar::Archive::new(flate2::read::GzDecoder::new(bundle));
        let mut out = Vec::new();
        for entry in archive.entries().unwrap() {
            let mut entry = entry.unwrap();
            let mut data = Vec::new();
            entry.read_to_end(&mut data).unwrap();
            let h = entry.header();
            out.push((
                entry.path().unwrap().to_str().unwrap().to_string(),
                h.mode().unwrap(),
                h.uid().unwrap(),
                h.gid().unwrap(),
                h.mtime().unwrap(),
                h.entry_type(),
                data,
            ));
        }
        out
    }

    fn sha256(data: &[u8]) -> String {
        hex(ring::digest::digest(&SHA256, data).as_ref())
    }

    const ENDED: u64 = 1_796_012_525_123_456_789;

    #[test]
    fn entries_are_private_owned_by_root_in_order_with_the_manifest_first() {
        let staging = tempfile::tempdir().unwrap();
        let notes = stage(staging.path());
        let mut bundle = Vec::new();
        write(&mut bundle, staging.path(), &manifest("x1", ENDED), &notes).unwrap();
        let entries = entries(&bundle[..]);
        let order: Vec<&str> = entries.iter().map(|e| e.0.as_str()).collect();
        assert_eq!(
            order,
            [
                "kstall-capture-x1/manifest.json",
                "kstall-capture-x1/README.txt",
                "kstall-capture-x1/",
                "kstall-capture-x1/packets.pcapng",
                "kstall-capture-x1/net/",
                "kstall-capture-x1/net/conntrack.txt",
                "kstall-capture-x1/net/rules.txt",
                "kstall-capture-x1/nfs/",
                "kstall-capture-x1/nfs/mountstats-4026531841.txt",
            ]
        );
        for (path, mode, uid, gid, mtime, kind, _) in &entries {
            let want = if kind.is_dir() { 0o700 } else { 0o600 };
            assert_eq!(*mode, want, "{path}");
            assert_eq!((*uid, *gid), (0, 0), "{path}");
            assert_eq!(*mtime, ENDED / 1_000_000_000, "{path}");
        }
    }

    #[test]
    fn every_size_and_digest_in_the_manifest_is_what_the_tar_holds() {
        let staging = tempfile::tempdir().unwrap();
        let notes = stage(staging.path());
        let mut bundle = Vec::new();
        write(&mut bundle, staging.path(), &manifest("x2", ENDED), &notes).unwrap();
        let entries = entries(&bundle[..]);
        let manifest: serde_json::Value = serde_json::from_slice(&entries[0].6).unwrap();
        assert_eq!(manifest["schema"], SCHEMA);
        assert_eq!(manifest["limits"]["snaplen"], "headers");
        assert_eq!(manifest["times"]["ended"]["unix_ns"], ENDED);
        assert_eq!(manifest["times"]["ended"]["rfc3339"], "2026-11-30T04:22:05.123456789Z");
        let listed: BTreeMap<String, &serde_json::Value> = manifest["files"]
            .as_array()
            .unwrap()
            .iter()
            .map(|f| (f["path"].as_str().unwrap().to_string(), f))
            .collect();
        let in_tar: BTreeMap<String, &Vec<u8>> = entries
            .iter()
            .filter(|e| !e.5.is_dir())
            .skip(1)
            .map(|e| (e.0.strip_prefix("kstall-capture-x2/").unwrap().to_string(), &e.6))
            .collect();
        for (path, data) in &in_tar {
            let file = listed.get(path).unwrap_or_else(|| panic!("{path} is not in the manifest"));
            assert_eq!(file["bytes"], data.len() as u64, "{path}");
            assert_eq!(file["sha256"], sha256(data), "{path}");
        }
        // Listed and not in the tar: only what was never written, without a digest.
        let absent: Vec<&String> = listed.keys().filter(|p| !in_tar.contains_key(*p)).collect();
        assert_eq!(absent, ["tasks/stacks.txt"]);
        assert_eq!(listed["tasks/stacks.txt"]["status"], "skipped");
        assert!(listed["tasks/stacks.txt"].get("sha256").is_none());
        assert_eq!(listed["net/conntrack.txt"]["status"], "partial");
        assert_eq!(listed["net/conntrack.txt"]["error"], "events: 12 lost");
        assert_eq!(in_tar["packets.pcapng"].len(), 700_001);

        let readme = String::from_utf8(entries[1].6.clone()).unwrap();
        assert!(readme.contains("net/conntrack.txt"), "{readme}");
        assert!(readme.contains("conntrack entries and events [partial: events: 12 lost]"), "{readme}");
        assert!(readme.contains("tcpdump -nn -r packets.pcapng"), "{readme}");
        assert!(readme.contains("tshark -r packets.pcapng -Y tcp.flags.reset==1"), "{readme}");
        assert!(
            readme.contains("> 127.0.0.1:15001 [S]") && readme.contains("server:2049 > pod:port [R.]"),
            "{readme}"
        );
        assert!(readme.contains("packets: byte cap 64 MiB reached after 7.3 s"), "{readme}");
        assert!(readme.contains("filter (from the incident): port 2049"), "{readme}");
    }

    #[test]
    fn a_symlink_in_staging_is_left_out_and_said_so() {
        let staging = tempfile::tempdir().unwrap();
        std::fs::write(staging.path().join("packets.pcapng"), b"x").unwrap();
        std::os::unix::fs::symlink("/etc/shadow", staging.path().join("shadow")).unwrap();
        let mut bundle = Vec::new();
        let files = write(&mut bundle, staging.path(), &manifest("x3", ENDED), &[]).unwrap();
        assert!(files.iter().all(|f| f.path != "shadow"));
        let entries = entries(&bundle[..]);
        assert!(entries.iter().all(|e| !e.0.ends_with("shadow")));
        let manifest: serde_json::Value = serde_json::from_slice(&entries[0].6).unwrap();
        assert_eq!(manifest["notes"][0], "shadow: not a regular file, left out");
        assert!(manifest["pod"].get("namespace").is_some());
    }
}
