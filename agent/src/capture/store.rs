//! Where bundles live: `<state>/captures/` (0700), each capture staged in `.staging-<id>/`, then
//! `<id>.tar.gz` and its `<id>.json` summary (0600). Retention (a count and a disk budget, oldest
//! first) and the filesystem's last 5% are enforced when a capture asks to start, not when it ends:
//! a capture that started has its room.

use std::{
    fs::{self, File, OpenOptions},
    io::{self, BufWriter, Write},
    os::unix::fs::{DirBuilderExt as _, OpenOptionsExt as _},
    path::{Path, PathBuf},
    sync::{Arc, Mutex},
};

use ring::digest::{Context, SHA256};
use serde::{Deserialize, Serialize};

use super::{
    FileNote,
    bundle::{self, Manifest, Time, TriggerKind},
};

/// What a capture may write beside its packets (the netns's state, stacks, events).
pub const OVERHEAD: u64 = 8 << 20;
/// `list()` reads at most this many summaries, the newest.
pub const MAX_LISTED: usize = 1_000;
/// The filesystem's share kstall leaves free, in percent.
const KEEP_FREE_PERCENT: u64 = 5;
const ID_RULE: &str = "letters, digits, '.' and '-'";

/// How many bundles, and how many bytes of them, are kept.
#[derive(Debug, Clone, Copy)]
pub struct Retention {
    /// `--capture-keep`: bundles kept, running captures included.
    pub keep: usize,
    /// `--capture-disk`: bytes of bundles plus running captures' reservations.
    pub disk: u64,
}

/// What `<id>.json` holds: enough to list a bundle without opening it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Summary {
    pub id: String,
    /// `<id>.tar.gz`, in the captures' directory.
    pub file: String,
    pub bytes: u64,
    /// Of the `.tar.gz`, for a download to check.
    pub sha256: String,
    pub node: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod: Option<String>,
    pub netns: u64,
    pub trigger: TriggerKind,
    #[serde(default)]
    pub incidents: Vec<String>,
    pub started: Time,
    pub ended: Time,
    pub packets: u64,
    #[serde(default)]
    pub cut: Vec<String>,
}

/// Free and total bytes of a filesystem, as `fstatfs` gives them to an unprivileged user.
#[derive(Debug, Clone, Copy)]
pub struct Space {
    pub free: u64,
    pub total: u64,
}

#[derive(Debug, Default)]
struct Book {
    running: usize,
    reserved: u64,
}

/// Room held for one running capture until `finish` or drop.
#[derive(Debug)]
pub struct Reservation {
    bytes: u64,
    book: Arc<Mutex<Book>>,
}

impl Drop for Reservation {
    fn drop(&mut self) {
        let mut book = self.book.lock().unwrap_or_else(|p| p.into_inner());
        book.running -= 1;
        book.reserved -= self.bytes;
    }
}

type SpaceOf = Box<dyn Fn(&Path) -> io::Result<Space> + Send + Sync>;

pub struct Store {
    dir: PathBuf,
    retention: Retention,
    book: Arc<Mutex<Book>>,
    /// `fstatfs`; replaced in tests.
    space: SpaceOf,
}

impl Store {
    /// Makes `dir` (0700; the agent's is `<state>/captures/`) and removes what a crash left
    /// there: staging dirs, half written files and bundles without their summary. Returns the
    /// store and how many staging dirs were removed.
    pub fn open(dir: &Path, retention: Retention) -> Result<(Store, usize), String> {
        let dir = dir.to_path_buf();
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&dir)
            .map_err(|e| format!("{}: {e}", dir.display()))?;
        let mut staged = 0;
        let mut names = Vec::new();
        for entry in fs::read_dir(&dir).map_err(|e| format!("{}: {e}", dir.display()))? {
            let entry = entry.map_err(|e| format!("{}: {e}", dir.display()))?;
            names.push(entry.file_name().to_string_lossy().into_owned());
        }
        let gone = |name: &str, e: io::Error| format!("{}: {e}", dir.join(name).display());
        for name in &names {
            if name.starts_with(".staging-") {
                fs::remove_dir_all(dir.join(name)).map_err(|e| gone(name, e))?;
                staged += 1;
            } else if name.starts_with(".tmp-") {
                fs::remove_file(dir.join(name)).map_err(|e| gone(name, e))?;
            } else if let Some(id) = name.strip_suffix(".tar.gz")
                && !names.contains(&format!("{id}.json"))
            {
                // A crash between the bundle's rename and its summary's: never listed, never evicted.
                fs::remove_file(dir.join(name)).map_err(|e| gone(name, e))?;
            }
        }
        let store = Store { dir, retention, book: Arc::default(), space: Box::new(statfs) };
        Ok((store, staged))
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The newest bundles (at most [`MAX_LISTED`]), oldest first.
    pub fn list(&self) -> Vec<Summary> {
        let mut all = self.summaries();
        let excess = all.len().saturating_sub(MAX_LISTED);
        all.drain(..excess);
        all
    }

    /// Every readable summary, oldest (by end time) first.
    fn summaries(&self) -> Vec<Summary> {
        let Ok(entries) = fs::read_dir(&self.dir) else { return Vec::new() };
        let mut all: Vec<Summary> = entries
            .flatten()
            .filter(|e| {
                let name = e.file_name();
                let name = name.to_string_lossy();
                name.ends_with(".json") && !name.starts_with('.')
            })
            .filter_map(|e| fs::read(e.path()).ok())
            .filter_map(|bytes| serde_json::from_slice::<Summary>(&bytes).ok())
            .collect();
        all.sort_by(|a, b| (a.ended, &a.id).cmp(&(b.ended, &b.id)));
        all
    }

    /// Room for a capture of up to `max_bytes` of packets (plus [`OVERHEAD`]). Deletes the oldest
    /// bundles until the count, the disk budget and the filesystem's free share allow it, or
    /// refuses in one line, deleting nothing, when no deletion would.
    pub fn reserve(&self, max_bytes: u64) -> Result<Reservation, String> {
        let need = max_bytes.saturating_add(OVERHEAD);
        let mut book = self.book.lock().unwrap_or_else(|p| p.into_inner());
        let bundles = self.summaries();
        let space = (self.space)(&self.dir)
            .map_err(|e| format!("capture refused: statfs {}: {e}", self.dir.display()))?;
        let floor = space.total / 100 * KEEP_FREE_PERCENT;
        let wanted = book.reserved.saturating_add(need);
        let total: u64 = bundles.iter().map(|b| b.bytes).sum();

        if wanted > self.retention.disk {
            return Err(match book.running {
                0 => format!(
                    "capture refused: a capture of up to {} (plus {} for the rest) does not fit the captures' disk budget ({})",
                    human(max_bytes),
                    human(OVERHEAD),
                    human(self.retention.disk)
                ),
                n => format!(
                    "capture refused: the captures' disk budget ({}) is held by {n} running capture{}",
                    human(self.retention.disk),
                    if n == 1 { "" } else { "s" }
                ),
            });
        }
        if space.free.saturating_add(total) < wanted.saturating_add(floor) {
            return Err(format!(
                "capture refused: the filesystem of {} has {} free of {}; {} more would leave less than the {KEEP_FREE_PERCENT}% kstall keeps free",
                self.dir.display(),
                human(space.free),
                human(space.total),
                human(wanted)
            ));
        }
        // The fewest oldest bundles whose deletion satisfies all three; the count gives way when
        // running captures alone reach it (it bounds what is kept, not what runs).
        let mut evict = 0;
        let mut freed = 0u64;
        loop {
            let left = bundles.len() - evict;
            let count_ok = left + book.running < self.retention.keep || left == 0;
            let budget_ok = total - freed + wanted <= self.retention.disk;
            let free_ok = space.free + freed >= wanted + floor;
            if count_ok && budget_ok && free_ok {
                break;
            }
            freed += bundles[evict].bytes;
            evict += 1;
        }
        for old in &bundles[..evict] {
            self.remove(&old.id)?;
        }
        book.running += 1;
        book.reserved += need;
        Ok(Reservation { bytes: need, book: Arc::clone(&self.book) })
    }

    /// Deletes a bundle: its summary first, so it is never listed without its file. A download
    /// that has the file open keeps reading it.
    fn remove(&self, id: &str) -> Result<(), String> {
        for name in [format!("{id}.json"), format!("{id}.tar.gz")] {
            match fs::remove_file(self.dir.join(&name)) {
                Err(e) if e.kind() != io::ErrorKind::NotFound => {
                    return Err(format!("removing {}: {e}", self.dir.join(name).display()));
                }
                _ => {}
            }
        }
        Ok(())
    }

    /// Makes `.staging-<id>/` (0700) for the collectors' files.
    pub fn staging(&self, id: &str) -> Result<PathBuf, String> {
        check_id(id)?;
        let path = self.dir.join(format!(".staging-{id}"));
        fs::DirBuilder::new().mode(0o700).create(&path).map_err(|e| format!("{}: {e}", path.display()))?;
        Ok(path)
    }

    /// Removes a staging dir of a capture that will have no bundle.
    pub fn abandon(&self, staging: &Path) -> Result<(), String> {
        fs::remove_dir_all(staging).map_err(|e| format!("{}: {e}", staging.display()))
    }

    /// Bundles `staging` into `<id>.tar.gz` (written as `.tmp-<id>.tar.gz`, synced, renamed),
    /// writes `<id>.json`, removes the staging dir and releases the reservation.
    pub fn finish(
        &self,
        reservation: Reservation,
        staging: &Path,
        manifest: &Manifest,
        notes: &[FileNote],
    ) -> Result<Summary, String> {
        let id = &manifest.id;
        check_id(id)?;
        let file = format!("{id}.tar.gz");
        let tmp = self.dir.join(format!(".tmp-{file}"));
        let written = (|| {
            let out = create(&tmp)?;
            let mut counted = Digesting {
                inner: BufWriter::with_capacity(256 << 10, out),
                digest: Context::new(&SHA256),
                bytes: 0,
            };
            bundle::write(&mut counted, staging, manifest, notes)?;
            let out = counted.inner.into_inner().map_err(|e| format!("{}: {}", tmp.display(), e.error()))?;
            out.sync_all().map_err(|e| format!("{}: {e}", tmp.display()))?;
            Ok::<_, String>((counted.bytes, hex(counted.digest.finish().as_ref())))
        })();
        let (bytes, sha256) = written.inspect_err(|_| {
            let _ = fs::remove_file(&tmp);
        })?;
        fs::rename(&tmp, self.dir.join(&file)).map_err(|e| format!("{}: {e}", tmp.display()))?;
        let summary = Summary {
            id: id.clone(),
            file,
            bytes,
            sha256,
            node: manifest.node.clone(),
            namespace: manifest.pod.namespace.clone(),
            pod: manifest.pod.name.clone(),
            netns: manifest.pod.netns,
            trigger: manifest.trigger.kind,
            incidents: manifest.trigger.incidents.clone(),
            started: manifest.times.started,
            ended: manifest.times.ended,
            packets: manifest.packets.written,
            cut: manifest.cut.clone(),
        };
        let json = serde_json::to_vec_pretty(&summary).map_err(|e| format!("summary: {e}"))?;
        let tmp_json = self.dir.join(format!(".tmp-{id}.json"));
        let mut out = create(&tmp_json)?;
        out.write_all(&json)
            .and_then(|()| out.sync_all())
            .and_then(|()| fs::rename(&tmp_json, self.dir.join(format!("{id}.json"))))
            .map_err(|e| format!("{}: {e}", tmp_json.display()))?;
        // The renames are durable once the directory is.
        File::open(&self.dir)
            .and_then(|d| d.sync_all())
            .map_err(|e| format!("{}: {e}", self.dir.display()))?;
        self.abandon(staging)?;
        drop(reservation);
        Ok(summary)
    }

    /// A bundle opened for reading, with its summary. Deleting it later does not cut the read.
    pub fn open_bundle(&self, id: &str) -> Result<(File, Summary), String> {
        check_id(id)?;
        let summary_path = self.dir.join(format!("{id}.json"));
        let not_found = || format!("capture {id}: no such bundle on this node");
        let bytes = fs::read(&summary_path).map_err(|e| match e.kind() {
            io::ErrorKind::NotFound => not_found(),
            _ => format!("{}: {e}", summary_path.display()),
        })?;
        let summary: Summary =
            serde_json::from_slice(&bytes).map_err(|e| format!("{}: {e}", summary_path.display()))?;
        // Named from the checked id, not from the summary's text.
        let path = self.dir.join(format!("{id}.tar.gz"));
        let file = File::open(&path).map_err(|e| match e.kind() {
            io::ErrorKind::NotFound => not_found(),
            _ => format!("{}: {e}", path.display()),
        })?;
        Ok((file, summary))
    }
}

fn create(path: &Path) -> Result<File, String> {
    OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .map_err(|e| format!("{}: {e}", path.display()))
}

/// Counts and digests what passes through: the bundle's size and SHA-256 without reading it back.
struct Digesting<W> {
    inner: W,
    digest: Context,
    bytes: u64,
}

impl<W: Write> Write for Digesting<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.digest.update(&buf[..n]);
        self.bytes += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn statfs(path: &Path) -> io::Result<Space> {
    let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).map_err(io::Error::other)?;
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: a NUL-terminated path and a statfs the call fills.
    if unsafe { libc::statfs(c.as_ptr(), &mut st) } != 0 {
        return Err(io::Error::last_os_error());
    }
    let block = st.f_bsize as u64;
    Ok(Space { free: st.f_bavail as u64 * block, total: st.f_blocks as u64 * block })
}

/// 1.2 GiB, 40 GiB, 512 MiB.
fn human(bytes: u64) -> String {
    match bytes {
        b if b >= 1 << 30 && b % (1 << 30) == 0 => format!("{} GiB", b >> 30),
        b if b >= 1 << 30 => format!("{:.1} GiB", b as f64 / f64::from(1u32 << 30)),
        b => super::packets::size(b),
    }
}

/// `^[0-9A-Za-z][0-9A-Za-z.-]{0,159}$`: an id is a file name, never a path.
pub fn check_id(id: &str) -> Result<(), String> {
    let ok = id.len() <= 160
        && id.bytes().next().is_some_and(|b| b.is_ascii_alphanumeric())
        && id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'-');
    match ok {
        true => Ok(()),
        false => Err(format!("capture id {id:?}: not a capture id ({ID_RULE})")),
    }
}

/// `20261130T042205Z-shop-tenant-api-5d8c7b9f4-t9r2p-3f9a` for a pod, `<time>-netns-<inode>-<hex>`
/// for a bare network namespace; `at_ns` is unix nanoseconds.
pub fn new_id(at_ns: u64, pod: Option<(&str, &str)>, netns: u64) -> String {
    let time = jiff::Timestamp::from_nanosecond(i128::from(at_ns))
        .map_or_else(|_| "19700101T000000Z".into(), |t| t.strftime("%Y%m%dT%H%M%SZ").to_string());
    let mut random = [0u8; 2];
    // Only tells apart two captures of one pod in one second: a failure leaves zeros.
    let _ = ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut random);
    let tail = hex(&random);
    let middle = match pod {
        Some((namespace, name)) => {
            let name = clean(name, 100);
            // time, three dashes and the hex take 23 of the 160 characters.
            let namespace = clean(namespace, 160 - 23 - name.len());
            format!("{namespace}-{name}")
        }
        None => format!("netns-{netns}"),
    };
    format!("{time}-{middle}-{tail}")
}

/// Kubernetes names are already letters, digits, '-' and '.'; anything else becomes '-'.
fn clean(name: &str, max: usize) -> String {
    name.chars()
        .map(|c| if c.is_ascii_alphanumeric() || c == '.' || c == '-' { c } else { '-' })
        .take(max)
        .collect()
}

#[cfg(test)]
mod tests {
    use std::{io::Read as _, os::unix::fs::PermissionsExt as _};

    use super::*;
    use crate::capture::bundle::tests::{entries, manifest, stage};

    const GIB: u64 = 1 << 30;
    const NS: u64 = 1_000_000_000;

    fn store(state: &Path, keep: usize, disk: u64) -> Store {
        let (mut store, _) = Store::open(&state.join("captures"), Retention { keep, disk }).unwrap();
        store.space = Box::new(|_| Ok(Space { free: 100 * GIB, total: 200 * GIB }));
        store
    }

    /// A finished capture of `bytes_of_packets` incompressible bytes, ended at second `ended`.
    fn capture(store: &Store, id: &str, ended: u64, packets_bytes: usize) -> Summary {
        let reservation = store.reserve(1 << 20).unwrap();
        let staging = store.staging(id).unwrap();
        let mut noise = vec![0u8; packets_bytes];
        ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut noise).unwrap();
        fs::write(staging.join("packets.pcapng"), noise).unwrap();
        store.finish(reservation, &staging, &manifest(id, 1_796_000_000 * NS + ended * NS), &[]).unwrap()
    }

    fn ids(store: &Store) -> Vec<String> {
        store.list().into_iter().map(|s| s.id).collect()
    }

    fn mode(path: &Path) -> u32 {
        fs::metadata(path).unwrap().permissions().mode() & 0o777
    }

    #[test]
    fn a_finished_capture_is_a_private_bundle_and_summary_and_its_staging_is_gone() {
        let state = tempfile::tempdir().unwrap();
        let store = store(state.path(), 10, 10 * GIB);
        assert_eq!(mode(store.dir()), 0o700);
        let reservation = store.reserve(64 << 20).unwrap();
        let staging = store.staging("b1").unwrap();
        assert_eq!(mode(&staging), 0o700);
        let notes = stage(&staging);
        let summary =
            store.finish(reservation, &staging, &manifest("b1", 1_796_012_525 * NS), &notes).unwrap();
        assert!(!staging.exists());
        assert_eq!(mode(&store.dir().join("b1.tar.gz")), 0o600);
        assert_eq!(mode(&store.dir().join("b1.json")), 0o600);
        assert_eq!(*store.book.lock().unwrap(), (0, 0), "the reservation is released");
        assert_eq!(store.list(), std::slice::from_ref(&summary));

        let (mut file, listed) = store.open_bundle("b1").unwrap();
        assert_eq!(listed, summary);
        let mut bytes = Vec::new();
        file.read_to_end(&mut bytes).unwrap();
        assert_eq!(bytes.len() as u64, summary.bytes);
        assert_eq!(hex(ring::digest::digest(&SHA256, &bytes).as_ref()), summary.sha256);
        assert_eq!(entries(&bytes[..])[0].0, "kstall-capture-b1/manifest.json");
        assert_eq!(summary.namespace.as_deref(), Some("shop"));
        assert!(
            fs::read_dir(store.dir()).unwrap().all(|e| !e
                .unwrap()
                .file_name()
                .to_string_lossy()
                .starts_with(".tmp-"))
        );
    }

    impl PartialEq<(usize, u64)> for Book {
        fn eq(&self, other: &(usize, u64)) -> bool {
            (self.running, self.reserved) == *other
        }
    }

    #[test]
    fn three_bundles_with_keep_2_leave_the_two_newest() {
        let state = tempfile::tempdir().unwrap();
        let store = store(state.path(), 2, 10 * GIB);
        // Written out of order: eviction goes by end time, not by id or file time.
        capture(&store, "c-second", 20, 100);
        capture(&store, "c-first", 10, 100);
        assert_eq!(ids(&store), ["c-first", "c-second"]);
        capture(&store, "c-third", 30, 100);
        assert_eq!(ids(&store), ["c-second", "c-third"]);
        assert!(!store.dir().join("c-first.tar.gz").exists());
        assert!(!store.dir().join("c-first.json").exists());
    }

    #[test]
    fn a_disk_budget_evicts_oldest_first_and_a_refusal_names_the_running_captures() {
        let state = tempfile::tempdir().unwrap();
        // Room for the 8 MiB overhead plus 1 MiB asked, and less than one 600 KiB bundle beside it.
        let store = store(state.path(), 100, OVERHEAD + (1 << 20) + (500 << 10));
        capture(&store, "d1", 10, 600 << 10);
        capture(&store, "d2", 20, 600 << 10);
        assert_eq!(ids(&store), ["d2"], "d1 was evicted for d2's reservation");
        let first = store.reserve(1 << 20).unwrap();
        assert_eq!(ids(&store), Vec::<String>::new(), "d2 goes too: a running capture's room counts");
        let refused = store.reserve(1 << 20).unwrap_err();
        assert_eq!(
            refused,
            "capture refused: the captures' disk budget (9.5 MiB) is held by 1 running capture"
        );
        drop(first);
        let _second = store.reserve(1 << 20).unwrap();

        let refused = store.reserve(64 << 20).unwrap_err();
        assert!(refused.contains("held by 1 running capture"), "{refused}");
        let other = tempfile::tempdir().unwrap();
        let idle = self::store(other.path(), 100, 512 << 20);
        assert_eq!(
            idle.reserve(1 << 30).unwrap_err(),
            "capture refused: a capture of up to 1 GiB (plus 8 MiB for the rest) does not fit the captures' disk budget (512 MiB)"
        );
    }

    #[test]
    fn a_full_filesystem_refuses_without_deleting_what_would_not_help() {
        let state = tempfile::tempdir().unwrap();
        let mut store = store(state.path(), 100, 100 * GIB);
        capture(&store, "e1", 10, 100);
        store.space = Box::new(|_| Ok(Space { free: GIB + GIB / 5, total: 40 * GIB }));
        let refused = store.reserve(64 << 20).unwrap_err();
        assert_eq!(
            refused,
            format!(
                "capture refused: the filesystem of {} has 1.2 GiB free of 40 GiB; 72 MiB more would leave less than the 5% kstall keeps free",
                state.path().join("captures").display()
            )
        );
        assert_eq!(ids(&store), ["e1"], "deleting it would not have made room");
    }

    #[test]
    fn what_a_crash_left_is_removed_when_the_store_opens() {
        let state = tempfile::tempdir().unwrap();
        {
            let store = store(state.path(), 10, 10 * GIB);
            capture(&store, "kept", 10, 100);
            let staging = store.staging("crashed").unwrap();
            fs::write(staging.join("packets.pcapng"), b"half").unwrap();
            fs::create_dir(store.dir().join(".staging-other")).unwrap();
            fs::write(store.dir().join(".tmp-crashed.tar.gz"), b"half").unwrap();
            fs::write(store.dir().join("orphan.tar.gz"), b"no summary").unwrap();
        }
        let (store, removed) =
            Store::open(&state.path().join("captures"), Retention { keep: 10, disk: 10 * GIB }).unwrap();
        assert_eq!(removed, 2);
        let mut left: Vec<String> = fs::read_dir(store.dir())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        left.sort();
        assert_eq!(left, ["kept.json", "kept.tar.gz"]);
    }

    #[test]
    fn ids_are_file_names_never_paths() {
        assert_eq!(
            check_id("../x").unwrap_err(),
            r#"capture id "../x": not a capture id (letters, digits, '.' and '-')"#
        );
        for bad in ["", ".hidden", "-x", "a/b", "a b", "é", &"a".repeat(161)] {
            assert!(check_id(bad).is_err(), "{bad:?}");
        }
        check_id(&"a".repeat(160)).unwrap();
        let state = tempfile::tempdir().unwrap();
        let store = store(state.path(), 10, 10 * GIB);
        assert!(store.staging("../x").is_err());
        assert_eq!(store.open_bundle("../x").unwrap_err(), check_id("../x").unwrap_err());
        assert_eq!(store.open_bundle("nope").unwrap_err(), "capture nope: no such bundle on this node");
    }

    #[test]
    fn ids_name_the_time_the_pod_or_the_netns() {
        let at = 1_796_012_525 * NS;
        let id = new_id(at, Some(("shop", "tenant-api-5d8c7b9f4-t9r2p")), 1);
        let (head, tail) = id.rsplit_once('-').unwrap();
        assert_eq!(head, "20261130T042205Z-shop-tenant-api-5d8c7b9f4-t9r2p");
        assert!(tail.len() == 4 && tail.bytes().all(|b| b.is_ascii_hexdigit()), "{id}");
        let id = new_id(at, None, 4026532000);
        assert!(id.starts_with("20261130T042205Z-netns-4026532000-"), "{id}");
        let long = new_id(at, Some((&"n".repeat(63), &"p".repeat(253))), 1);
        check_id(&long).unwrap();
        assert!(long.contains(&format!("-{}-", "p".repeat(100))), "{long}");
    }
}
