//! A writer stuck in writeback, for real: ext4 on a loop device whose backing file lives on a FUSE
//! mount (bindfs). Stopping the FUSE daemon freezes the disk underneath, and `dd ... conv=fsync`
//! waits in `folio_wait_writeback` — in D state, reported by the kernel's hung-task detector —
//! until the daemon is continued. (O_DIRECT reads would not do: they wait in a way the detector
//! deliberately ignores.)
//!
//! A reader of a file whose pages are not cached waits too, in a killable sleep
//! (`folio_wait_bit_common` in `TASK_KILLABLE`): the kind the detector skips.
//!
//! Everything is undone on drop, in the order that lets each step succeed: continue the daemon so
//! the writer can finish, unmount, detach the loop device, stop the daemon, remove the files.

use std::{
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    thread,
    time::{Duration, Instant},
};

use crate::host::run;

pub struct FreezableDisk {
    dir: PathBuf,
    bindfs: Child,
    loop_dev: Option<String>,
    mounted: bool,
    writers: Vec<Child>,
}

impl FreezableDisk {
    pub fn new(tag: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("kstall-{tag}-{}", std::process::id()));
        for sub in ["backing", "fuse", "mnt"] {
            std::fs::create_dir_all(dir.join(sub)).expect("scenario dirs");
        }
        let bindfs = Command::new("bindfs")
            .arg("-f")
            .arg(dir.join("backing"))
            .arg(dir.join("fuse"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start bindfs");
        let mut disk = FreezableDisk { dir, bindfs, loop_dev: None, mounted: false, writers: Vec::new() };
        disk.wait_for_fuse();
        let image = disk.dir.join("fuse/disk.img");
        run("truncate", &["-s", "64M", image.to_str().unwrap()]);
        disk.loop_dev =
            Some(run("losetup", &["--find", "--show", image.to_str().unwrap()]).trim().to_string());
        let dev = disk.loop_dev.clone().unwrap();
        // No lazy initialisation and the writer's file made beforehand: once frozen, the only
        // I/O a writer waits on is its own data's writeback (not inode tables or metadata reads,
        // which would classify its wait differently).
        run("mkfs.ext4", &["-q", "-E", "lazy_itable_init=0,lazy_journal_init=0", &dev]);
        run("mount", &[&dev, disk.mount_point().to_str().unwrap()]);
        disk.mounted = true;
        std::fs::File::create(disk.target()).and_then(|f| f.sync_all()).expect("the writer's file");
        // Allocating most of the disk once loads every block group's bitmap while the disk still
        // answers: a writer on the frozen disk then waits in writeback, never first in a bitmap
        // read (`ext4_read_block_bitmap_nowait`, a block_io wait) of a group not loaded yet.
        let filler = disk.mount_point().join("filler");
        run("fallocate", &["-l", "40M", filler.to_str().unwrap()]);
        std::fs::remove_file(&filler).expect("remove the filler");
        run("sync", &["-f", disk.target().to_str().unwrap()]);
        disk
    }

    fn wait_for_fuse(&self) {
        let deadline = Instant::now() + Duration::from_secs(10);
        let fuse = self.dir.join("fuse");
        while Instant::now() < deadline {
            let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap_or_default();
            if mounts.lines().any(|l| l.split_whitespace().nth(1) == fuse.to_str()) {
                return;
            }
            thread::sleep(Duration::from_millis(50));
        }
        panic!("bindfs did not mount {}", fuse.display());
    }

    pub fn mount_point(&self) -> PathBuf {
        self.dir.join("mnt")
    }

    fn target(&self) -> PathBuf {
        self.mount_point().join("stuck")
    }

    fn read_target(&self) -> PathBuf {
        self.mount_point().join("to-read")
    }

    /// Writes a file for `start_reader` to the disk, then drops its pages from the page cache,
    /// and the disk image's (the loop device reads through them): once frozen, reading it waits
    /// on the disk. Only these two files' caches are dropped, nothing else of the host's.
    pub fn prepare_read_file(&self) {
        use std::io::Write as _;
        let mut file = std::fs::File::create(self.read_target()).expect("the reader's file");
        file.write_all(&vec![0x5a; 1 << 20]).and_then(|()| file.sync_all()).expect("write the reader's file");
        drop(file);
        self.drop_read_cache();
    }

    /// Drops the pages of the reader's file and of the disk image from the page cache (again
    /// after a read brought them in).
    pub fn drop_read_cache(&self) {
        for path in [self.read_target(), self.dir.join("fuse/disk.img")] {
            let file = std::fs::File::open(&path).expect("open to drop its cache");
            // SAFETY: a valid fd; DONTNEED only drops clean cached pages.
            let rc = unsafe {
                libc::posix_fadvise(std::os::fd::AsRawFd::as_raw_fd(&file), 0, 0, libc::POSIX_FADV_DONTNEED)
            };
            assert_eq!(rc, 0, "posix_fadvise({}, DONTNEED)", path.display());
        }
    }

    /// The file `prepare_read_file` wrote, open for reading (opened before a freeze, a read of it
    /// then waits on the disk and nothing else).
    pub fn open_read_file(&self) -> std::fs::File {
        std::fs::File::open(self.read_target()).expect("open the reader's file")
    }

    /// Starts `cat` of the file `prepare_read_file` wrote, inside `cgroup_procs`. Returns its pid.
    pub fn start_reader(&mut self, cgroup_procs: &Path) -> u32 {
        let script = format!(
            "echo $$ > {} && exec cat {} > /dev/null",
            cgroup_procs.display(),
            self.read_target().display()
        );
        let child = Command::new("sh").args(["-c", &script]).spawn().expect("start cat");
        let pid = child.id();
        self.writers.push(child);
        pid
    }

    /// Freezes the disk: nothing written to it completes until `thaw`.
    pub fn freeze(&self) {
        unsafe { libc::kill(self.bindfs.id() as i32, libc::SIGSTOP) };
    }

    pub fn thaw(&self) {
        unsafe { libc::kill(self.bindfs.id() as i32, libc::SIGCONT) };
    }

    /// Starts `dd ... conv=fsync` into the disk, inside `cgroup_procs` (a cgroup's `cgroup.procs`)
    /// so that its cgroup is known. Returns its pid.
    pub fn start_writer(&mut self, cgroup_procs: &Path) -> u32 {
        let target = self.target();
        // The shell joins the cgroup, then becomes dd: the pid stays the same.
        let script = format!(
            "echo $$ > {} && exec dd if=/dev/zero of={} bs=1M count=8 conv=fsync status=none",
            cgroup_procs.display(),
            target.display()
        );
        let child = Command::new("sh").args(["-c", &script]).spawn().expect("start dd");
        let pid = child.id();
        self.writers.push(child);
        pid
    }

    /// Waits for every writer (and reader) to finish; panics after `timeout`.
    pub fn wait_writers(&mut self, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        for w in &mut self.writers {
            loop {
                if let Ok(Some(status)) = w.try_wait() {
                    assert!(status.success(), "writer failed: {status}");
                    break;
                }
                assert!(Instant::now() < deadline, "writer {} did not finish after the thaw", w.id());
                thread::sleep(Duration::from_millis(100));
            }
        }
        self.writers.clear();
    }
}

impl Drop for FreezableDisk {
    fn drop(&mut self) {
        self.thaw();
        for w in &mut self.writers {
            let _ = w.wait();
        }
        if self.mounted {
            let _ = Command::new("umount").arg(self.mount_point()).status();
        }
        if let Some(dev) = &self.loop_dev {
            let _ = Command::new("losetup").args(["-d", dev]).status();
        }
        let _ = self.bindfs.kill();
        let _ = self.bindfs.wait();
        let _ = Command::new("umount").arg(self.dir.join("fuse")).stderr(Stdio::null()).status();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
