//! Reading a kernel view under `/proc` that may never answer: a task's `mountinfo` or
//! `mountstats` waits on the mount namespace's lock, which a hung unmount holds; a file of a task
//! stuck in the kernel may wait on what it waits on. The open and the read run on a short-lived
//! thread and the caller waits for it up to a bound; past it the thread is abandoned (it may sleep
//! in D state for as long as the NFS server is away) and counted. Only kernel views are read
//! here: nothing under a mount point is ever opened or `stat`ed.

use std::{
    io::Read as _,
    path::{Path, PathBuf},
    sync::{
        atomic::{AtomicU64, Ordering},
        mpsc,
    },
    time::Duration,
};

/// Reads given up on and left to their threads, since the process started (for the agent's
/// `kstall_capture_reads_abandoned_total`).
static ABANDONED: AtomicU64 = AtomicU64::new(0);

/// How many reads were abandoned so far.
pub fn abandoned() -> u64 {
    ABANDONED.load(Ordering::Relaxed)
}

/// Why a bounded read gave nothing.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Bounded {
    /// The open or the read did not end in time; its thread is abandoned.
    #[error("timed out after {}", seconds(.0))]
    TimedOut(Duration),
    /// The open or the read failed.
    #[error("{1}")]
    Io(std::io::ErrorKind, String),
    /// A directory, a FIFO, a socket or a device: the text names it.
    #[error("{0}")]
    NotRegular(String),
    #[error("larger than {0} bytes: not read")]
    TooLarge(u64),
}

/// The bytes of the regular file `path`, if it has at most `limit` of them and its open and read
/// end within `within`.
pub fn read(path: &Path, limit: u64, within: Duration) -> Result<Vec<u8>, Bounded> {
    let (sender, receiver) = mpsc::sync_channel(1);
    let owned = path.to_path_buf();
    std::thread::Builder::new()
        .name("kstall-read".into())
        // It only opens and reads: a small stack, since abandoned ones may pile up.
        .stack_size(64 << 10)
        .spawn(move || {
            // The caller may have stopped waiting: then nobody hears it.
            let _ = sender.send(read_now(&owned, limit));
        })
        .map_err(|e| Bounded::Io(e.kind(), format!("no thread to read with: {e}")))?;
    match receiver.recv_timeout(within) {
        Ok(result) => result,
        Err(mpsc::RecvTimeoutError::Timeout) => {
            ABANDONED.fetch_add(1, Ordering::Relaxed);
            Err(Bounded::TimedOut(within))
        }
        Err(mpsc::RecvTimeoutError::Disconnected) => {
            Err(Bounded::Io(std::io::ErrorKind::Other, "the reading thread ended without a result".into()))
        }
    }
}

/// The text of `path` as [`read`], invalid UTF-8 replaced (proc files are text; a task's name
/// may hold any byte).
pub fn read_text(path: &Path, limit: u64, within: Duration) -> Result<String, Bounded> {
    read(path, limit, within).map(|bytes| String::from_utf8_lossy(&bytes).into_owned())
}

fn read_now(path: &PathBuf, limit: u64) -> Result<Vec<u8>, Bounded> {
    let io = |e: std::io::Error| Bounded::Io(e.kind(), e.to_string());
    // A blocking open: the kernel's views are regular files, and what else sits there (a FIFO
    // without a writer) waits here, on this thread, not the caller's. Checked once open, since a
    // `stat` first is one more call that can hang.
    let file = std::fs::File::open(path).map_err(io)?;
    crate::named_file::regular(path, &file.metadata().map_err(io)?).map_err(Bounded::NotRegular)?;
    let mut bytes = Vec::new();
    // Proc files say their size is 0: the bound is on what is read.
    file.take(limit + 1).read_to_end(&mut bytes).map_err(io)?;
    if bytes.len() as u64 > limit {
        return Err(Bounded::TooLarge(limit));
    }
    Ok(bytes)
}

fn seconds(d: &Duration) -> String {
    match d.subsec_millis() {
        0 => format!("{} s", d.as_secs()),
        _ => format!("{} ms", d.as_millis()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_regular_file_is_read_up_to_its_bound() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        std::fs::write(&path, "device 0:53 mounted on /data with fstype nfs4\n").unwrap();
        let second = Duration::from_secs(1);
        assert_eq!(
            read_text(&path, 1024, second).unwrap(),
            "device 0:53 mounted on /data with fstype nfs4\n"
        );
        assert_eq!(read(&path, 8, second).unwrap_err().to_string(), "larger than 8 bytes: not read");
        assert!(!read(Path::new("/proc/self/stat"), 4096, second).unwrap().is_empty());
        assert_eq!(read(Path::new("/proc/self/maps"), 16, second).unwrap_err(), Bounded::TooLarge(16));
        let missing = read(&dir.path().join("missing"), 1024, second).unwrap_err();
        assert!(matches!(missing, Bounded::Io(std::io::ErrorKind::NotFound, _)), "{missing:?}");
        assert_eq!(
            read(Path::new("/dev/null"), 1024, second).unwrap_err().to_string(),
            "/dev/null is a device, not a regular file"
        );
        assert_eq!(
            read(dir.path(), 1024, second).unwrap_err(),
            Bounded::NotRegular(format!("{} is a directory, not a regular file", dir.path().display()))
        );
    }

    #[test]
    fn an_open_that_never_ends_is_abandoned_at_the_bound() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("fifo");
        let c = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: a valid C string.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        let before = abandoned();
        // No writer: the open waits, and without the bound so would this test.
        let err = read(&fifo, 1024, Duration::from_millis(200)).unwrap_err();
        assert_eq!(err.to_string(), "timed out after 200 ms");
        assert!(abandoned() > before);
        assert_eq!(Bounded::TimedOut(Duration::from_secs(1)).to_string(), "timed out after 1 s");
        // A writer lets the abandoned thread's open end, and the thread with it.
        drop(std::fs::OpenOptions::new().write(true).open(&fifo).unwrap());
    }
}
