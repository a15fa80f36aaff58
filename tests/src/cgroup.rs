//! Cgroups made for a test, pod processes inside them, and memory limits.

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    process::{Child, Command},
    sync::{Mutex, PoisonError},
    time::Duration,
};

use crate::{host::wait_for, netns::NetNs, oom::OOM_LIMIT};

/// A cgroup v2 directory made for a test (on the unified hierarchy, wherever it is mounted),
/// removed on drop with every parent directory the tests made for it once no other test cgroup
/// lies below it.
pub struct Cgroup {
    pub path: PathBuf,
    /// The hierarchy's root: where processes still inside go before the directories are removed.
    root: PathBuf,
    /// The directories on its path that tests of this process made (see [`MADE`]).
    made: Vec<PathBuf>,
}

/// Directories the tests of this process made, with how many live [`Cgroup`]s lie at or below
/// each: the last one dropped removes it, in whatever order they go (a `Vec` of pods drops its
/// first first, whose pod-slice parents the second still holds).
static MADE: Mutex<BTreeMap<PathBuf, usize>> = Mutex::new(BTreeMap::new());

impl Cgroup {
    pub fn new(tag: &str) -> Self {
        Self::at(&format!("kstall-{tag}-{}", std::process::id()))
    }

    /// A container's cgroup as the kubelet's systemd driver and containerd lay it out: pod `uid`
    /// in QoS class `qos` (`burstable`, `besteffort`), container `container_id`.
    pub fn kubepods_container(qos: &str, uid: &str, container_id: &str) -> Self {
        Self::at(&format!(
            "kubepods.slice/kubepods-{qos}.slice/kubepods-{qos}-pod{}.slice/cri-containerd-{container_id}.scope",
            uid.replace('-', "_")
        ))
    }

    /// A cgroup at `relative` below the v2 root (e.g. a kubepods-style path), parents included.
    pub fn at(relative: &str) -> Self {
        let root = if Path::new("/sys/fs/cgroup/cgroup.controllers").exists() {
            PathBuf::from("/sys/fs/cgroup")
        } else {
            PathBuf::from("/sys/fs/cgroup/unified")
        };
        Self::under(root, relative)
    }

    /// A cgroup at `relative` in the cgroup v1 memory hierarchy (a kubelet on cgroup v1 puts
    /// pods there); panics on a host without one.
    pub fn v1_memory_at(relative: &str) -> Self {
        let root = PathBuf::from("/sys/fs/cgroup/memory");
        assert!(root.join("memory.limit_in_bytes").exists(), "this host has no cgroup v1 memory hierarchy");
        Self::under(root, relative)
    }

    fn under(root: PathBuf, relative: &str) -> Self {
        let mut made_by_tests = MADE.lock().unwrap_or_else(PoisonError::into_inner);
        let mut path = root.clone();
        let mut made = Vec::new();
        for part in relative.split('/').filter(|p| !p.is_empty()) {
            path.push(part);
            if !path.exists() {
                std::fs::create_dir(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
                made_by_tests.insert(path.clone(), 0);
            }
            if let Some(holders) = made_by_tests.get_mut(&path) {
                *holders += 1;
                made.push(path.clone());
            }
        }
        Cgroup { path, root, made }
    }

    /// What kstall reports as `cgroup_id`: the directory's inode.
    pub fn id(&self) -> u64 {
        std::os::unix::fs::MetadataExt::ino(&std::fs::metadata(&self.path).expect("cgroup dir"))
    }

    pub fn procs(&self) -> PathBuf {
        self.path.join("cgroup.procs")
    }
}

impl Drop for Cgroup {
    fn drop(&mut self) {
        // Processes still inside go back to the root first, or rmdir fails: not to the parent,
        // which may be a directory a test made too.
        if let Ok(procs) = std::fs::read_to_string(self.procs()) {
            for pid in procs.lines() {
                let _ = std::fs::write(self.root.join("cgroup.procs"), pid);
            }
        }
        let mut made_by_tests = MADE.lock().unwrap_or_else(PoisonError::into_inner);
        for dir in self.made.iter().rev() {
            let Some(holders) = made_by_tests.get_mut(dir) else { continue };
            *holders -= 1;
            if *holders == 0 {
                made_by_tests.remove(dir);
                let _ = std::fs::remove_dir(dir);
            }
        }
    }
}

/// A long-running process in a network namespace and a cgroup: what a pod's sandbox (pause)
/// process is to kstall. Killed on drop.
pub struct PodProcess {
    child: Child,
}

impl PodProcess {
    pub fn start(netns: &NetNs, procs: &Path) -> Self {
        let child = Command::new("nsenter")
            .arg(format!("--net={}", netns.path().display()))
            .args(["sleep", "600"])
            .spawn()
            .expect("start the pod process");
        let process = PodProcess { child };
        // nsenter enters the namespace a moment after it starts: join the pod's cgroup only then,
        // or a walk could learn the host's namespace for the pod, as no real pause process shows.
        let ns_link = format!("/proc/{}/ns/net", process.pid());
        let inside = wait_for(Duration::from_secs(5), || {
            (std::fs::metadata(&ns_link).ok().map(|m| std::os::unix::fs::MetadataExt::ino(&m))
                == Some(netns.inode()))
            .then_some(())
        });
        assert!(inside.is_some(), "the pod process did not enter {}", netns.name);
        std::fs::write(procs, process.pid().to_string())
            .unwrap_or_else(|e| panic!("join {}: {e}", procs.display()));
        process
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for PodProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A v1 memory cgroup with an `OOM_LIMIT` limit (on a hybrid host the limit for a v2 cgroup
/// lives there), removed on drop.
pub fn v1_memory_limit(tag: &str) -> Cgroup {
    let limit = Cgroup::v1_memory_at(&format!("kstall-{tag}-{}", std::process::id()));
    std::fs::write(limit.path.join("memory.limit_in_bytes"), OOM_LIMIT.to_string()).expect("v1 limit");
    limit
}

/// A memory cgroup with a limit, removed on drop: on cgroup v1 (hybrid hosts) under
/// `/sys/fs/cgroup/memory`, else the v2 `memory.max` of `v2` itself.
pub struct MemoryLimit {
    v1: Option<PathBuf>,
    /// The directory whose files hold the limit and its events.
    dir: PathBuf,
    procs: PathBuf,
}

impl MemoryLimit {
    pub fn new(v2: &Cgroup, bytes: u64) -> Self {
        let v1_root = Path::new("/sys/fs/cgroup/memory");
        if v1_root.join("memory.limit_in_bytes").exists() {
            let dir = v1_root.join(v2.path.file_name().expect("cgroup name"));
            std::fs::create_dir_all(&dir).expect("v1 memory cgroup");
            std::fs::write(dir.join("memory.limit_in_bytes"), bytes.to_string()).expect("v1 limit");
            MemoryLimit { procs: dir.join("cgroup.procs"), dir: dir.clone(), v1: Some(dir) }
        } else {
            std::fs::write(v2.path.join("memory.max"), bytes.to_string())
                .expect("v2 memory.max (is the memory controller enabled for the parent?)");
            MemoryLimit { dir: v2.path.clone(), procs: v2.procs(), v1: None }
        }
    }

    /// The `cgroup.procs` a process must join for the limit to apply to it.
    pub fn procs(&self) -> &Path {
        &self.procs
    }

    /// Makes an OOM at this limit kill every process below it together (`memory.oom.group`, what
    /// the kubelet sets on cgroup v2); false on cgroup v1, which has no such thing.
    pub fn kill_as_a_group(&self) -> bool {
        if self.v1.is_some() {
            return false;
        }
        std::fs::write(self.dir.join("memory.oom.group"), "1").expect("memory.oom.group");
        true
    }

    /// How many processes the OOM killer has killed at this limit.
    pub fn oom_kills(&self) -> u64 {
        let events = if self.v1.is_some() { "memory.oom_control" } else { "memory.events" };
        let path = self.dir.join(events);
        let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        text.lines()
            .find_map(|l| l.strip_prefix("oom_kill ")?.trim().parse().ok())
            .unwrap_or_else(|| panic!("{}: no oom_kill count", path.display()))
    }
}

impl Drop for MemoryLimit {
    fn drop(&mut self) {
        if let Some(dir) = &self.v1 {
            let _ = std::fs::remove_dir(dir);
        }
    }
}
