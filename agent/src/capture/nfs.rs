//! The NFS side of a pod's processes, as the kernel shows it under `/proc`: per mount namespace
//! (one process read for each) its NFS mounts from `mountinfo` and their blocks of `mountstats`
//! (operations, RTTs, the transport's counters); per network namespace the client's RPC counters
//! (`net/rpc/nfs`) and its servers and volumes (`net/nfsfs/*`), when the kernel has them.
//! Nothing is `stat`ed, `statfs`ed or opened under a mount point — that is what hangs on a server
//! that went away — and every file is read through [`bounded`] with [`WITHIN`].

use std::{collections::BTreeMap, fmt::Write as _, path::Path, time::Duration};

use super::{
    FileNote, FileStatus,
    bounded::{self, Bounded},
    namespace_of, write_new,
};
use crate::attribution::mounts::nfs_mounts;

/// How long one file may take.
pub const WITHIN: Duration = Duration::from_secs(1);
/// A mount table of thousands of mounts is far below it.
const LIMIT: u64 = 8 << 20;

/// What [`collect`] wrote and found.
#[derive(Debug)]
pub struct Collected {
    pub notes: Vec<FileNote>,
    /// NFS mounts, summed over the mount namespaces whose table could be read.
    pub mounts: usize,
}

/// Reads the NFS side of `pids` (processes of `proc`, a `/proc`) into `dir/nfs/`. A mount
/// namespace without an NFS mount writes nothing and says so in a skipped note; a file that could
/// not be read is written with the one line saying why (a failed note).
pub fn collect(proc: &Path, pids: &[u32], dir: &Path) -> Result<Collected, String> {
    let mut found = Collected { notes: Vec::new(), mounts: 0 };
    for (mntns, pid) in witnesses(proc, pids, "mnt") {
        found.mounts += mount_namespace(proc, pid, mntns, dir, &mut found.notes)?;
    }
    for (netns, pid) in witnesses(proc, pids, "net") {
        for (source, name, what) in [
            ("net/rpc/nfs", "rpc-nfs", "the NFS client's RPC counters"),
            ("net/nfsfs/servers", "nfsfs-servers", "the NFS servers the client knows"),
            ("net/nfsfs/volumes", "nfsfs-volumes", "the NFS volumes the client has"),
        ] {
            let path = format!("nfs/{name}-{netns}.txt");
            let what = format!("{what} in network namespace {netns} (/proc/{pid}/{source})");
            let note = match read(proc, pid, source) {
                Err(Bounded::Io(std::io::ErrorKind::NotFound, _)) => FileNote {
                    path,
                    what,
                    status: FileStatus::Skipped,
                    error: Some("not in this kernel: the NFS client is not loaded".into()),
                },
                result => written(dir, path, what, (&format!("/proc/{pid}/{source}"), ""), result, |t| t)?,
            };
            found.notes.push(note);
        }
    }
    Ok(found)
}

/// Each namespace of kind `kind` (`mnt`, `net`) of `pids` and the first of them in it, by inode.
fn witnesses(proc: &Path, pids: &[u32], kind: &str) -> BTreeMap<u64, u32> {
    let mut namespaces = BTreeMap::new();
    for &pid in pids {
        // A process that ended since it was listed has no link: nothing to read through it.
        if let Some(ns) = namespace_of(&proc.join(format!("{pid}/ns/{kind}"))) {
            namespaces.entry(ns).or_insert(pid);
        }
    }
    namespaces
}

fn read(proc: &Path, pid: u32, name: &str) -> Result<String, Bounded> {
    bounded::read_text(&proc.join(format!("{pid}/{name}")), LIMIT, WITHIN)
}

/// The mounts and mountstats files of one mount namespace; its number of NFS mounts.
fn mount_namespace(
    proc: &Path,
    pid: u32,
    mntns: u64,
    dir: &Path,
    notes: &mut Vec<FileNote>,
) -> Result<usize, String> {
    let mounts_path = format!("nfs/mounts-{mntns}.txt");
    let mounts_what = format!("the NFS mounts of mount namespace {mntns} (/proc/{pid}/mountinfo)");
    let mountinfo = read(proc, pid, "mountinfo");
    let count = match &mountinfo {
        Ok(text) => {
            let count = nfs_lines(text).count();
            if count == 0 {
                notes.push(FileNote {
                    path: mounts_path,
                    what: mounts_what,
                    status: FileStatus::Skipped,
                    error: Some(format!("no NFS mount in mount namespace {mntns}")),
                });
                return Ok(0);
            }
            count
        }
        // Still read mountstats: its blocks are the mounts then.
        Err(_) => 0,
    };
    let nfs_only = ", NFS mounts only";
    notes.push(written(
        dir,
        mounts_path,
        mounts_what,
        (&format!("/proc/{pid}/mountinfo"), nfs_only),
        mountinfo,
        |text| {
            nfs_lines(&text).fold(String::new(), |mut kept, line| {
                let _ = writeln!(kept, "{line}");
                kept
            })
        },
    )?);
    notes.push(written(
        dir,
        format!("nfs/mountstats-{mntns}.txt"),
        format!("the NFS mounts' statistics of mount namespace {mntns} (/proc/{pid}/mountstats)"),
        (&format!("/proc/{pid}/mountstats"), nfs_only),
        read(proc, pid, "mountstats"),
        |text| nfs_blocks(&text),
    )?);
    Ok(count)
}

/// Writes the read's text (what `keep` keeps of it, under a line naming `source` and `kept`), or
/// the one line saying why it failed.
fn written(
    dir: &Path,
    path: String,
    what: String,
    (source, kept): (&str, &str),
    read: Result<String, Bounded>,
    keep: impl FnOnce(String) -> String,
) -> Result<FileNote, String> {
    let (text, status, error) = match read {
        Ok(text) => (format!("# {source}{kept}\n{}", keep(text)), FileStatus::Complete, None),
        Err(e) => {
            let why = format!("{source}: {e}");
            (format!("{why}\n"), FileStatus::Failed, Some(why))
        }
    };
    write_new(dir, &path, text.as_bytes())?;
    Ok(FileNote { path, what, status, error })
}

/// The lines of a mountinfo that are NFS mounts (as `attribution::mounts` reads them).
fn nfs_lines(mountinfo: &str) -> impl Iterator<Item = &str> {
    mountinfo.lines().filter(|line| !nfs_mounts(line).is_empty())
}

/// The blocks of a mountstats whose `device … with fstype nfs` (or `nfs4`) line starts them: each device
/// line and the indented lines after it, up to the next device line.
fn nfs_blocks(mountstats: &str) -> String {
    let mut kept = String::new();
    let mut keeping = false;
    for line in mountstats.lines() {
        if line.starts_with("device ") {
            // `nfs` and `nfs4`, the client's; not `nfsd`, a server's control file system.
            keeping = line
                .split_once(" with fstype ")
                .is_some_and(|(_, rest)| matches!(rest.split(' ').next(), Some("nfs" | "nfs4")));
        }
        if keeping {
            let _ = writeln!(kept, "{line}");
        }
    }
    kept
}

#[cfg(test)]
mod tests {
    use super::*;

    const MOUNTINFO: &str = "\
22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw
301 22 0:53 / /data rw,relatime shared:90 - nfs4 10.55.0.1:/ledger rw,vers=4.1,hard,proto=tcp,addr=10.55.0.1
302 22 0:54 / /var/log rw - tmpfs tmpfs rw
303 22 0:55 / /mnt/v3 rw - nfs 10.55.0.2:/data rw,vers=3,mountport=20048,addr=10.55.0.2
304 22 0:56 / /mnt/nfsd rw - nfsd nfsd rw
";

    const MOUNTSTATS: &str = "\
device rootfs mounted on / with fstype rootfs
device 10.55.0.1:/ledger mounted on /data with fstype nfs4 statvers=1.1
\topts:\trw,vers=4.1,rsize=1048576,hard,proto=tcp,timeo=600,retrans=2,sec=sys
\tage:\t1234
\txprt:\ttcp 0 0 2 0 11 1044 1044 0 1044 0 2 0 0

\tper-op statistics
\t        NULL: 1 1 0 44 24 0 0 0 0
device proc mounted on /proc with fstype proc
device 10.55.0.2:/data mounted on /mnt/v3 with fstype nfs statvers=1.1
\topts:\trw,vers=3
device nfsd mounted on /proc/fs/nfsd with fstype nfsd
";

    #[test]
    fn only_the_nfs_mounts_and_their_statistics_are_kept() {
        let kept: Vec<&str> = nfs_lines(MOUNTINFO).collect();
        assert_eq!(kept.len(), 2, "{kept:?}");
        assert!(kept[0].starts_with("301 ") && kept[1].starts_with("303 "), "{kept:?}");
        assert_eq!(
            nfs_blocks(MOUNTSTATS),
            "device 10.55.0.1:/ledger mounted on /data with fstype nfs4 statvers=1.1\n\
             \topts:\trw,vers=4.1,rsize=1048576,hard,proto=tcp,timeo=600,retrans=2,sec=sys\n\
             \tage:\t1234\n\
             \txprt:\ttcp 0 0 2 0 11 1044 1044 0 1044 0 2 0 0\n\
             \n\
             \tper-op statistics\n\
             \t        NULL: 1 1 0 44 24 0 0 0 0\n\
             device 10.55.0.2:/data mounted on /mnt/v3 with fstype nfs statvers=1.1\n\
             \topts:\trw,vers=3\n"
        );
        // `nfsd`'s own mount (a server's) is not an NFS mount.
        assert_eq!(nfs_blocks("device nfsd mounted on /proc/fs/nfsd with fstype nfsd\n"), "");
    }

    /// A fake `/proc` with one process, 4242, in mount namespace 4026531841 and network namespace
    /// 4026531840.
    fn fake_proc() -> tempfile::TempDir {
        let proc = tempfile::tempdir().unwrap();
        let pid = proc.path().join("4242");
        std::fs::create_dir_all(pid.join("ns")).unwrap();
        std::fs::create_dir_all(pid.join("net/rpc")).unwrap();
        std::os::unix::fs::symlink("mnt:[4026531841]", pid.join("ns/mnt")).unwrap();
        std::os::unix::fs::symlink("net:[4026531840]", pid.join("ns/net")).unwrap();
        proc
    }

    fn mkfifo(path: &Path) {
        let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: a valid C string.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    }

    fn text(dir: &Path, rel: &str) -> String {
        std::fs::read_to_string(dir.join(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"))
    }

    #[test]
    fn a_fifo_for_mountstats_times_out_and_the_rest_is_read() {
        let proc = fake_proc();
        let pid = proc.path().join("4242");
        std::fs::write(pid.join("mountinfo"), MOUNTINFO).unwrap();
        // A mountstats that never answers: a FIFO nobody writes to.
        mkfifo(&pid.join("mountstats"));
        std::fs::write(pid.join("net/rpc/nfs"), "net 0 0 0 0\nrpc 12 0 0\n").unwrap();
        let out = tempfile::tempdir().unwrap();
        // Without the bound this never returns: the FIFO's open waits for a writer.
        // The pid twice and a process that is gone: one namespace each, read once.
        let found = collect(proc.path(), &[4242, 4242, 999_999], out.path()).unwrap();
        assert_eq!(found.mounts, 2);
        let note = |path: &str| {
            found.notes.iter().find(|n| n.path == path).unwrap_or_else(|| panic!("{path}: {:?}", found.notes))
        };
        assert_eq!(note("nfs/mounts-4026531841.txt").status, FileStatus::Complete);
        let mounts = text(out.path(), "nfs/mounts-4026531841.txt");
        assert!(mounts.starts_with("# /proc/4242/mountinfo, NFS mounts only\n301 22 0:53 "), "{mounts}");
        assert_eq!(mounts.lines().count(), 3, "{mounts}");
        let stats = note("nfs/mountstats-4026531841.txt");
        assert_eq!(stats.status, FileStatus::Failed);
        let why = "/proc/4242/mountstats: timed out after 1 s";
        assert_eq!(stats.error.as_deref(), Some(why));
        assert_eq!(text(out.path(), "nfs/mountstats-4026531841.txt"), format!("{why}\n"));
        assert_eq!(note("nfs/rpc-nfs-4026531840.txt").status, FileStatus::Complete);
        assert_eq!(
            text(out.path(), "nfs/rpc-nfs-4026531840.txt"),
            "# /proc/4242/net/rpc/nfs\nnet 0 0 0 0\nrpc 12 0 0\n"
        );
        let servers = note("nfs/nfsfs-servers-4026531840.txt");
        assert_eq!(servers.status, FileStatus::Skipped, "{servers:?}");
        assert!(!out.path().join(&servers.path).exists());
        assert_eq!(found.notes.len(), 5, "{:?}", found.notes);
        for (path, mode) in [("nfs", 0o700), ("nfs/mounts-4026531841.txt", 0o600)] {
            let meta = std::fs::metadata(out.path().join(path)).unwrap();
            assert_eq!(std::os::unix::fs::PermissionsExt::mode(&meta.permissions()) & 0o777, mode, "{path}");
        }
        // The abandoned open ends with a writer.
        drop(std::fs::OpenOptions::new().write(true).open(pid.join("mountstats")).unwrap());
    }

    #[test]
    fn no_nfs_mount_is_a_skipped_note_and_no_file() {
        let proc = fake_proc();
        let pid = proc.path().join("4242");
        std::fs::write(pid.join("mountinfo"), "22 1 8:1 / / rw - ext4 /dev/sda1 rw\n").unwrap();
        // Never read: the mountinfo said there is nothing.
        mkfifo(&pid.join("mountstats"));
        let out = tempfile::tempdir().unwrap();
        // Read, the FIFO would time out: a failed note, not the skipped ones below.
        let found = collect(proc.path(), &[4242], out.path()).unwrap();
        assert_eq!(found.mounts, 0);
        assert_eq!(found.notes[0].path, "nfs/mounts-4026531841.txt");
        assert_eq!(found.notes[0].status, FileStatus::Skipped);
        assert_eq!(found.notes[0].error.as_deref(), Some("no NFS mount in mount namespace 4026531841"));
        assert!(found.notes.iter().all(|n| n.status == FileStatus::Skipped), "{:?}", found.notes);
        assert!(!out.path().join("nfs").exists());
    }
}
