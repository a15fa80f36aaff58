//! Network namespace of a process, read the way that works when the pod is half gone: the
//! `/proc/<pid>/ns/net` link, or — when the leader is a zombie and its link is unreadable — a live
//! thread's `/proc/<pid>/task/<tid>/ns/net` (incident #1's manual step).
//!
//! Only `readlink` on `/proc`: it takes no lock a stuck task holds (unlike `cmdline`/`environ`,
//! which need the task's mm), so a process in D state cannot block the agent here.

use std::path::Path;

/// The inode of `net:[<inode>]`, the link's target.
fn parse_link(target: &Path) -> Option<u32> {
    target.to_str()?.strip_prefix("net:[")?.strip_suffix(']')?.parse().ok()
}

fn read_link(path: &Path) -> Option<u32> {
    parse_link(&std::fs::read_link(path).ok()?)
}

/// The network namespace inode of process `tgid`, if any of its threads can still tell.
pub fn of_process(proc: &Path, tgid: u32) -> Option<u32> {
    let dir = proc.join(tgid.to_string());
    read_link(&dir.join("ns/net")).or_else(|| {
        std::fs::read_dir(dir.join("task"))
            .ok()?
            .flatten()
            .find_map(|thread| read_link(&thread.path().join("ns/net")))
    })
}

/// The host's network namespace: init's (the agent runs with hostPID), else the agent's own (it
/// runs with hostNetwork).
pub fn host(proc: &Path) -> Option<u32> {
    of_process(proc, 1).or_else(|| read_link(&proc.join("self/ns/net")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn link_targets() {
        assert_eq!(parse_link(Path::new("net:[4026531840]")), Some(4026531840));
        assert_eq!(parse_link(Path::new("mnt:[4026531840]")), None);
        assert_eq!(parse_link(Path::new("net:[x]")), None);
    }

    #[test]
    fn own_namespace_matches_self() {
        let proc = Path::new("/proc");
        let me = of_process(proc, std::process::id()).expect("own netns");
        assert_eq!(Some(me), read_link(&proc.join("self/ns/net")));
    }

    #[test]
    fn a_zombie_leader_falls_back_to_its_threads() {
        // A fake /proc: the leader's link is gone (what a zombie leader shows), a thread's is not.
        let dir = tempfile::tempdir().unwrap();
        let pid = dir.path().join("42");
        std::fs::create_dir_all(pid.join("ns")).unwrap();
        std::fs::create_dir_all(pid.join("task/42/ns")).unwrap();
        std::fs::create_dir_all(pid.join("task/43/ns")).unwrap();
        std::os::unix::fs::symlink("net:[4026532777]", pid.join("task/43/ns/net")).unwrap();
        assert_eq!(of_process(dir.path(), 42), Some(4026532777));
        assert_eq!(of_process(dir.path(), 41), None);
    }
}
