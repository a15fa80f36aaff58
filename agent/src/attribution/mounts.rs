//! NFS mounts -> the pod whose volume each is. The kubelet mounts a pod's NFS volume (or binds
//! the CSI driver's) under `<kubelet root>/pods/<pod uid>/volumes/...`, so the host's mount table
//! says whose a superblock is, also for a static PV mounted from the node: what a kernel thread's
//! RPC (writeback) is attributed by. Read from `/proc/1/mountinfo`, served from memory: no mount
//! is ever touched (a `stat()` of a hung NFS mount would hang the agent).

use std::{
    collections::{BTreeSet, HashMap},
    path::Path,
};

/// What the node's mount table says of NFS.
#[derive(Debug, Default)]
pub struct NodeNfsMounts {
    /// Each NFS device (`major:minor`) that exactly one pod's volumes mount, and that pod's UID. A
    /// device two pods mount (one export bound into both) is neither's.
    pub pod_volumes: HashMap<String, String>,
    /// The ports NFS mounts name in their options (`port=`, `mountport=`).
    pub option_ports: BTreeSet<u16>,
}

pub fn node_mounts(proc: &Path) -> NodeNfsMounts {
    match std::fs::read_to_string(proc.join("1/mountinfo")) {
        Ok(text) => NodeNfsMounts {
            pod_volumes: parse(&text),
            option_ports: nfs_mounts(&text).into_iter().flat_map(|m| m.ports).collect(),
        },
        Err(e) => {
            tracing::debug!(error = %e, "no host mount table: NFS mounts are not attributed to pods");
            NodeNfsMounts::default()
        }
    }
}

fn parse(mountinfo: &str) -> HashMap<String, String> {
    let mut owners: HashMap<String, Option<String>> = HashMap::new();
    for mount in nfs_mounts(mountinfo) {
        let Some(uid) = pod_of(mount.mount_point) else { continue };
        owners
            .entry(mount.device.to_string())
            .and_modify(|owner| {
                if owner.as_deref() != Some(uid) {
                    *owner = None;
                }
            })
            .or_insert_with(|| Some(uid.to_string()));
    }
    owners.into_iter().filter_map(|(device, owner)| Some((device, owner?))).collect()
}

/// One NFS mount of a mount table, as the kernel shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NfsMount<'a> {
    /// `major:minor` of its superblock.
    pub device: &'a str,
    pub mount_point: &'a str,
    /// The server's address (`addr=`), as the client resolved it.
    pub server: Option<std::net::IpAddr>,
    /// `vers=` (`3`, `4.1`, ...).
    pub version: Option<&'a str>,
    /// The ports the kernel shows in the mount's options: `port=` (NFS, when not 2049) and
    /// `mountport=` (mountd, an NFSv3 mount's).
    pub ports: Vec<u16>,
}

/// The NFS mounts of `mountinfo` (a `/proc/<pid>/mountinfo`).
pub fn nfs_mounts(mountinfo: &str) -> Vec<NfsMount<'_>> {
    let mut mounts = Vec::new();
    for line in mountinfo.lines() {
        // id parent major:minor root mount-point options [optional...] - fstype source super-options
        let Some((head, tail)) = line.split_once(" - ") else { continue };
        let mut tail = tail.split(' ');
        if !matches!(tail.next(), Some("nfs" | "nfs4")) {
            continue;
        }
        let options = tail.nth(1).unwrap_or_default();
        let fields: Vec<&str> = head.split(' ').collect();
        let (Some(device), Some(mount_point)) = (fields.get(2), fields.get(4)) else { continue };
        let option = |name: &str| {
            options.split(',').find_map(|o| o.strip_prefix(name).and_then(|v| v.strip_prefix('=')))
        };
        let ports = ["port", "mountport"].iter().filter_map(|name| option(name)?.parse().ok()).collect();
        mounts.push(NfsMount {
            device,
            mount_point,
            server: option("addr").and_then(|a| a.parse().ok()),
            version: option("vers"),
            ports,
        });
    }
    mounts
}

/// The pod UID of a mount point under the kubelet's `pods/<uid>/volumes/` (whatever its root).
fn pod_of(mount_point: &str) -> Option<&str> {
    let (_, rest) = mount_point.split_once("/pods/")?;
    let (uid, rest) = rest.split_once('/')?;
    (rest.starts_with("volumes/")
        && uid.len() == 36
        && uid.chars().all(|c| c.is_ascii_hexdigit() || c == '-'))
    .then_some(uid)
}

#[cfg(test)]
mod tests {
    use super::*;

    const UID_A: &str = "0b5e7b7e-7d45-4a8e-9c1e-2f4f1c0c9a11";
    const UID_B: &str = "5a0c1f2e-3b4d-4c5e-8f90-a1b2c3d4e5f6";

    #[test]
    fn a_pods_nfs_volumes_are_its_and_a_shared_device_is_nobodys() {
        let table = format!(
            "22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw\n\
             301 22 0:53 / /var/lib/kubelet/pods/{UID_A}/volumes/kubernetes.io~nfs/pv-ledger rw,relatime shared:90 - nfs4 10.55.0.1:/ledger rw,vers=4.1,hard,proto=tcp\n\
             302 22 0:54 / /var/lib/kubelet/pods/{UID_A}/volumes/kubernetes.io~csi/pv-data/mount rw master:91 - nfs 10.55.0.2:/data rw,vers=3\n\
             303 22 0:55 / /mnt/node-wide rw - nfs4 10.55.0.1:/shared rw\n\
             304 22 0:56 / /var/lib/kubelet/pods/{UID_A}/volumes/kubernetes.io~nfs/both rw - nfs4 10.55.0.1:/both rw\n\
             305 22 0:56 / /var/lib/kubelet/pods/{UID_B}/volumes/kubernetes.io~nfs/both rw - nfs4 10.55.0.1:/both rw\n\
             306 22 0:57 / /var/lib/kubelet/pods/{UID_B}/volumes/kubernetes.io~empty-dir/cache rw - tmpfs tmpfs rw\n\
             307 22 0:58 / /data/kubelet/pods/{UID_B}/volumes/kubernetes.io~nfs/logs rw - nfs4 10.55.0.3:/logs rw\n\
             308 22 0:59 / /var/lib/kubelet/pods/not-a-uid/volumes/x rw - nfs4 10.55.0.3:/x rw\n\
             garbage line\n"
        );
        let owners = parse(&table);
        assert_eq!(owners.get("0:53").map(String::as_str), Some(UID_A));
        assert_eq!(owners.get("0:54").map(String::as_str), Some(UID_A), "a CSI driver's mount too");
        assert_eq!(owners.get("0:58").map(String::as_str), Some(UID_B), "whatever the kubelet's root");
        for nobodys in ["0:55", "0:56", "0:57", "0:59", "8:1"] {
            assert!(!owners.contains_key(nobodys), "{nobodys}: {owners:?}");
        }
    }

    #[test]
    fn an_nfs_mounts_server_version_and_ports_are_read_from_its_options() {
        // As 6.1 shows a v3 mount made by mount.nfs (it passes the ports it found to the kernel),
        // and a v4.1 mount of a server on another port.
        let table = "40 22 0:60 / /data rw,relatime shared:2 - nfs 10.55.0.1:/export rw,vers=3,rsize=1048576,\
                     wsize=1048576,namlen=255,hard,nolock,proto=tcp,port=2049,timeo=600,retrans=2,sec=sys,\
                     mountaddr=10.55.0.1,mountvers=3,mountport=20048,mountproto=tcp,local_lock=all,addr=10.55.0.1\n\
                     41 22 0:61 / /mnt/b rw - nfs4 [fd00::5]:/ rw,vers=4.1,hard,proto=tcp6,port=3049,clientaddr=fd00::9,\
                     addr=fd00::5\n\
                     42 22 8:1 / / rw - ext4 /dev/sda1 rw,port=1\n";
        let mounts = nfs_mounts(table);
        assert_eq!(mounts.len(), 2, "{mounts:?}");
        assert_eq!((mounts[0].device, mounts[0].mount_point), ("0:60", "/data"));
        assert_eq!(mounts[0].server, Some("10.55.0.1".parse().unwrap()));
        assert_eq!((mounts[0].version, &mounts[0].ports[..]), (Some("3"), &[2049, 20048][..]));
        assert_eq!(mounts[1].server, Some("fd00::5".parse().unwrap()));
        assert_eq!((mounts[1].version, &mounts[1].ports[..]), (Some("4.1"), &[3049][..]));
    }
}
