//! Captures (issue 57): packets of a pod's network namespace, as pcapng, bounded, and the
//! namespace's state beside them. For now run by `kstall capture start --standalone` in the
//! CLI's own process. `filter.rs` compiles the operator's filter (libpcap's language) with the
//! headers-only tail, `pcapng.rs` writes the file, `packets.rs` opens a socket per interface
//! inside the namespace and reads them; `net.rs` records the namespace's conntrack entries and
//! events (`ct.rs`), rules (`rules.rs`), sockets (`sockets.rs`), addresses and routes
//! (`rtnl.rs`), over `netlink.rs`. Beside the namespace, its processes' side: `nfs.rs` (their
//! NFS mounts and the client's counters, per mount and network namespace) and `tasks.rs` (their
//! tasks in D state, with the kernel's stacks), every `/proc` file read through `bounded.rs`, which
//! gives up on a read after a second: nothing under a mount point is ever opened or `stat`ed.
//! `context.rs` adds what kstall knows of the pod: its incidents and its recent events.
//! `bundle.rs` packs a capture's files with a manifest and a README into one `.tar.gz`;
//! `store.rs` keeps the bundles under `<state>/captures/`: staging, retention (count, disk budget,
//! the filesystem's last 5%), ids, summaries.

use std::{
    io::Write as _,
    os::unix::fs::{DirBuilderExt as _, OpenOptionsExt as _},
    path::Path,
};

pub mod bounded;
pub mod bundle;
pub mod context;
pub mod ct;
pub mod filter;
pub mod flags;
pub mod net;
pub mod netlink;
pub mod nfs;
pub mod packets;
pub mod pcapng;
pub mod rtnl;
mod rules;
pub mod runner;
pub mod service;
pub mod sockets;
mod sockopt;
pub mod store;
pub mod target;
pub mod tasks;
pub mod trigger;

/// What grants a capture's capabilities (NET_RAW, NET_ADMIN, SYS_ADMIN), as a refusal names it.
pub const GRANTED_BY: &str = "deploy/components/capture (Helm: --set capture.enabled=true)";

/// One file a capture wrote (or tried to) into its staging directory: what the bundle's manifest
/// says about it beside its size and digest.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct FileNote {
    /// Relative to the capture's directory, `/`-separated: `nfs/mountstats-4026531841.txt`.
    pub path: String,
    /// One line: what the file holds.
    pub what: String,
    pub status: FileStatus,
    /// Why it is partial, failed or skipped, in one line.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum FileStatus {
    /// Everything it should hold.
    Complete,
    /// Some of it: a read timed out or was refused, a cap cut it (the error says which).
    Partial,
    /// Nothing could be read; the file says why in one line.
    Failed,
    /// Not made, on purpose (nothing to read: no NFS mount, conntrack not loaded).
    Skipped,
}

/// Writes `bytes` to `dir/rel` (`rel` `/`-separated): its directories made 0700 if missing, the
/// file 0600 and never over an existing one.
fn write_new(dir: &Path, rel: &str, bytes: &[u8]) -> Result<(), String> {
    let path = dir.join(rel);
    if let Some(parent) = path.parent() {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(parent)
            .map_err(|e| format!("{}: {e}", parent.display()))?;
    }
    create_new(&path)?.write_all(bytes).map_err(|e| format!("{}: {e}", path.display()))
}

/// A new file (0600), never an existing one opened.
fn create_new(path: &Path) -> Result<std::fs::File, String> {
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .map_err(|e| format!("{}: {e}", path.display()))
}

/// The inode of a namespace link (`/proc/<pid>/ns/mnt` reads `mnt:[4026531841]`), by `readlink`
/// only: nothing is opened.
pub fn namespace_of(link: &Path) -> Option<u64> {
    let points_to = std::fs::read_link(link).ok()?;
    points_to.to_str()?.split_once(":[")?.1.strip_suffix(']')?.parse().ok()
}

/// Every process in network namespace `netns` now (by the `readlink` of its `ns/net`: nothing
/// opened), and `known`; in order, each once. A process stuck in its exit's last flush is here
/// even where its cgroup no longer lists it (7.3's `cgroup.procs` leaves exiting processes out).
pub fn processes_in(proc: &Path, netns: u64, known: &[u32]) -> Vec<u32> {
    let mut pids: Vec<u32> = std::fs::read_dir(proc)
        .map(|dir| {
            dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
                .filter(|pid| namespace_of(&proc.join(format!("{pid}/ns/net"))) == Some(netns))
                .collect()
        })
        .unwrap_or_default();
    pids.extend_from_slice(known);
    pids.sort_unstable();
    pids.dedup();
    pids
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_processes_in_a_namespace_are_found_by_their_link_and_joined_to_the_known() {
        let proc = tempfile::tempdir().unwrap();
        for (pid, link) in [(10, "net:[4026532999]"), (11, "net:[4026531840]"), (12, "net:[4026532999]")] {
            let ns = proc.path().join(format!("{pid}/ns"));
            std::fs::create_dir_all(&ns).unwrap();
            std::os::unix::fs::symlink(link, ns.join("net")).unwrap();
        }
        std::fs::create_dir_all(proc.path().join("13/ns")).unwrap(); // no link: a kernel thread's
        std::fs::create_dir_all(proc.path().join("self")).unwrap();
        assert_eq!(processes_in(proc.path(), 4026532999, &[12, 7]), [7, 10, 12]);
    }
}
