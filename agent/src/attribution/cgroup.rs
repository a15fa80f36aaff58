//! cgroup id -> cgroup path -> workload. The id is the kernfs inode of the v2 cgroup directory
//! (what `bpf_get_current_cgroup_id` and `task->cgroups->dfl_cgrp->kn->id` give); the path is read
//! off the hierarchy by a walk off the event path, and parsed into the Kubernetes layouts:
//!
//! - systemd driver: `kubepods.slice/kubepods-<qos>.slice/kubepods-<qos>-pod<uid_with_underscores>.slice/<runtime>-<id>.scope`
//!   (Guaranteed pods sit directly under `kubepods.slice` as `kubepods-pod<uid>.slice`),
//!   runtimes `cri-containerd`, `crio`, `docker`;
//! - cgroupfs driver: `kubepods/<qos>/pod<uid>/<id>` (Guaranteed: `kubepods/pod<uid>/<id>`);
//! - anything else under `system.slice/<unit>`: a host process of that systemd unit.
//!
//! v1 hierarchies use the same paths under a controller's mount.

use std::{
    os::unix::fs::MetadataExt as _,
    path::{Path, PathBuf},
};

use serde::Serialize;

#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Workload {
    /// A container of a pod.
    Container { pod_uid: String, container_id: String, qos: Qos },
    /// A pod's own cgroup (no container below it: the pod slice itself).
    Pod { pod_uid: String, qos: Qos },
    /// A node process; `unit` is its systemd unit when it has one (`kubelet.service`).
    Host { unit: Option<String> },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Qos {
    Guaranteed,
    Burstable,
    BestEffort,
}

/// Parses a cgroup path (relative to the hierarchy's root, with or without a leading `/`).
pub fn parse(path: &str) -> Workload {
    let parts: Vec<&str> = path.split('/').filter(|p| !p.is_empty()).collect();
    let Some(kubepods) = parts.iter().position(|p| *p == "kubepods.slice" || *p == "kubepods") else {
        return Workload::Host { unit: host_unit(&parts) };
    };
    let rest = &parts[kubepods + 1..];
    let systemd = parts[kubepods] == "kubepods.slice";
    let (qos, rest) = match rest.first().copied().and_then(|p| qos_of(p, systemd)) {
        Some(qos) => (qos, &rest[1..]),
        None => (Qos::Guaranteed, rest),
    };
    let Some(pod_uid) = rest.first().and_then(|p| pod_uid_of(p, systemd)) else {
        return Workload::Host { unit: None };
    };
    match rest.get(1).and_then(|c| container_id_of(c, systemd)) {
        Some(container_id) => Workload::Container { pod_uid, container_id, qos },
        None => Workload::Pod { pod_uid, qos },
    }
}

fn qos_of(part: &str, systemd: bool) -> Option<Qos> {
    let name = if systemd { part.strip_prefix("kubepods-")?.strip_suffix(".slice")? } else { part };
    match name {
        "burstable" => Some(Qos::Burstable),
        "besteffort" => Some(Qos::BestEffort),
        _ => None,
    }
}

/// `kubepods-burstable-pod<uid_with_underscores>.slice` or `pod<uid>`: the UID with dashes.
fn pod_uid_of(part: &str, systemd: bool) -> Option<String> {
    let uid = if systemd {
        let stem = part.strip_suffix(".slice")?;
        stem[stem.rfind("-pod")? + 4..].replace('_', "-")
    } else {
        part.strip_prefix("pod")?.to_string()
    };
    is_uid(&uid).then_some(uid)
}

fn is_uid(uid: &str) -> bool {
    uid.len() == 36
        && uid
            .char_indices()
            .all(|(i, c)| if matches!(i, 8 | 13 | 18 | 23) { c == '-' } else { c.is_ascii_hexdigit() })
}

/// `cri-containerd-<id>.scope`, `crio-<id>.scope`, `docker-<id>.scope`, or a bare `<id>`
/// (cgroupfs): a 64-hex-digit id.
fn container_id_of(part: &str, systemd: bool) -> Option<String> {
    let id = if systemd {
        let stem = part.strip_suffix(".scope")?;
        ["cri-containerd-", "crio-", "docker-"].iter().find_map(|p| stem.strip_prefix(p))?
    } else {
        part
    };
    (id.len() == 64 && id.bytes().all(|b| b.is_ascii_hexdigit())).then(|| id.to_string())
}

/// The systemd unit a host cgroup belongs to: the innermost `.service` or `.scope`.
fn host_unit(parts: &[&str]) -> Option<String> {
    parts.iter().rev().find(|p| p.ends_with(".service") || p.ends_with(".scope")).map(|p| p.to_string())
}

/// The hierarchies pods live in: the v2 one (whose ids events carry: `/sys/fs/cgroup`, or
/// `/sys/fs/cgroup/unified` on a hybrid host) and, on nodes whose kubelet uses cgroup v1, the v1
/// memory hierarchy.
#[derive(Debug, Clone, Default)]
pub struct Hierarchies {
    pub v2: Option<PathBuf>,
    pub v1_memory: Option<PathBuf>,
}

impl Hierarchies {
    pub fn for_this_host() -> Self {
        let v2 = ["/sys/fs/cgroup", "/sys/fs/cgroup/unified"]
            .into_iter()
            .map(PathBuf::from)
            .find(|p| p.join("cgroup.procs").exists() && p.join("cgroup.controllers").exists());
        let v1_memory = Some(PathBuf::from("/sys/fs/cgroup/memory"))
            .filter(|p| p.join("cgroup.procs").exists() && p.join("memory.limit_in_bytes").exists());
        Self { v2, v1_memory }
    }
}

/// One cgroup directory found by a walk.
#[derive(Debug, Clone)]
pub struct CgroupDir {
    /// The kernfs inode: what the kernel calls the cgroup's id.
    pub id: u64,
    pub dir: PathBuf,
    pub workload: Workload,
}

/// Every cgroup under `root`. With `only_kubepods`, only the `kubepods` subtrees (a v1 hierarchy
/// is walked for the pods' processes, not for node units).
pub fn walk(root: &Path, only_kubepods: bool) -> Vec<CgroupDir> {
    let mut found = Vec::new();
    if only_kubepods {
        for entry in std::fs::read_dir(root).into_iter().flatten().flatten() {
            if entry.file_name().to_string_lossy().starts_with("kubepods") {
                walk_into(root, &entry.path(), &mut found);
            }
        }
    } else {
        walk_into(root, root, &mut found);
    }
    found
}

fn walk_into(root: &Path, dir: &Path, found: &mut Vec<CgroupDir>) {
    let Ok(meta) = std::fs::metadata(dir) else { return };
    let relative = dir.strip_prefix(root).unwrap_or(dir).to_string_lossy();
    found.push(CgroupDir { id: meta.ino(), dir: dir.to_path_buf(), workload: parse(&relative) });
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for entry in entries.flatten() {
        if entry.file_type().is_ok_and(|t| t.is_dir()) {
            walk_into(root, &entry.path(), found);
        }
    }
}

/// The directory of v2 cgroup `id`, found without a walk: cgroup ids are kernfs file handles
/// (`FILEID_KERNFS`), so `open_by_handle_at` opens the cgroup directly. Needs CAP_DAC_READ_SEARCH.
pub fn dir_of_id(v2_root: &Path, id: u64) -> std::io::Result<PathBuf> {
    use std::os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd};
    const FILEID_KERNFS: libc::c_int = 0xfe;
    #[repr(C)]
    struct Handle {
        handle_bytes: libc::c_uint,
        handle_type: libc::c_int,
        id: u64,
    }
    let mount = std::fs::File::open(v2_root)?;
    let mut handle = Handle { handle_bytes: 8, handle_type: FILEID_KERNFS, id };
    // SAFETY: `Handle` is `struct file_handle` with its 8-byte payload inline; the fd is checked.
    let fd = unsafe {
        libc::open_by_handle_at(
            mount.as_raw_fd(),
            (&raw mut handle).cast(),
            libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC,
        )
    };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: a fresh fd we own.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    std::fs::read_link(format!("/proc/self/fd/{}", fd.as_raw_fd()))
}

/// The memory limit of a cgroup: v2 `memory.max` or v1 `memory.limit_in_bytes`; `None` when
/// unlimited or not readable.
pub fn memory_limit(dir: &Path) -> Option<u64> {
    let text = std::fs::read_to_string(dir.join("memory.max"))
        .or_else(|_| std::fs::read_to_string(dir.join("memory.limit_in_bytes")))
        .ok()?;
    // v1 says "unlimited" with a huge page-rounded number.
    text.trim().parse::<u64>().ok().filter(|&b| b < 1 << 62)
}

/// The processes (tgids) in a cgroup.
pub fn procs(dir: &Path) -> Vec<u32> {
    std::fs::read_to_string(dir.join("cgroup.procs"))
        .map(|text| text.lines().filter_map(|l| l.trim().parse().ok()).collect())
        .unwrap_or_default()
}

/// The pod workload of a process from `/proc/<tgid>/cgroup`, in whichever hierarchy shows one
/// (a v1 controller's line on nodes whose kubelet uses cgroup v1).
pub fn workload_of_process(proc: &Path, tgid: u32) -> Option<Workload> {
    let text = std::fs::read_to_string(proc.join(tgid.to_string()).join("cgroup")).ok()?;
    text.lines()
        .filter_map(|line| line.splitn(3, ':').nth(2))
        .map(parse)
        .find(|w| !matches!(w, Workload::Host { .. }))
}

#[cfg(test)]
mod tests {
    use super::*;

    const UID: &str = "0c2a5b1e-7f3d-4c1a-9e8b-1234567890ab";
    const ID: &str = "4f1a2b3c4d5e6f708192a3b4c5d6e7f8091a2b3c4d5e6f708192a3b4c5d6e7f8";

    #[test]
    fn systemd_driver() {
        let uid = UID.replace('-', "_");
        for runtime in ["cri-containerd", "crio", "docker"] {
            let path = format!(
                "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{uid}.slice/{runtime}-{ID}.scope"
            );
            assert_eq!(
                parse(&path),
                Workload::Container { pod_uid: UID.into(), container_id: ID.into(), qos: Qos::Burstable },
                "{runtime}"
            );
        }
        let guaranteed = format!("kubepods.slice/kubepods-pod{uid}.slice/cri-containerd-{ID}.scope");
        assert!(matches!(parse(&guaranteed), Workload::Container { qos: Qos::Guaranteed, .. }));
        let pod = format!("kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{uid}.slice");
        assert_eq!(parse(&pod), Workload::Pod { pod_uid: UID.into(), qos: Qos::BestEffort });
    }

    #[test]
    fn cgroupfs_driver_and_v1_prefixes() {
        assert_eq!(
            parse(&format!("/kubepods/besteffort/pod{UID}/{ID}")),
            Workload::Container { pod_uid: UID.into(), container_id: ID.into(), qos: Qos::BestEffort }
        );
        assert!(matches!(
            parse(&format!("/kubepods/pod{UID}/{ID}")),
            Workload::Container { qos: Qos::Guaranteed, .. }
        ));
        // v1 hierarchies are the same paths under a controller, sometimes nested deeper.
        assert!(matches!(
            parse(&format!("/memory/kubepods/burstable/pod{UID}/{ID}")),
            Workload::Container { .. }
        ));
    }

    #[test]
    fn host_processes() {
        assert_eq!(
            parse("/system.slice/kubelet.service"),
            Workload::Host { unit: Some("kubelet.service".into()) }
        );
        assert_eq!(
            parse("system.slice/containerd.service"),
            Workload::Host { unit: Some("containerd.service".into()) }
        );
        assert_eq!(parse("/"), Workload::Host { unit: None });
        assert_eq!(parse(""), Workload::Host { unit: None });
        // Malformed pod directories are not guessed into pods.
        assert_eq!(parse("/kubepods/burstable/podnot-a-uid/x"), Workload::Host { unit: None });
        assert!(matches!(parse(&format!("/kubepods/pod{UID}/short-id")), Workload::Pod { .. }));
    }

    use proptest::prelude::*;

    fn uid() -> impl Strategy<Value = String> {
        "[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"
    }

    fn qos() -> impl Strategy<Value = Qos> {
        prop_oneof![Just(Qos::Guaranteed), Just(Qos::Burstable), Just(Qos::BestEffort)]
    }

    /// The path each driver gives a container (or the pod itself, without `container`).
    fn path(systemd: bool, qos: Qos, uid: &str, runtime: &str, container: Option<&str>) -> String {
        let q = match qos {
            Qos::Guaranteed => None,
            Qos::Burstable => Some("burstable"),
            Qos::BestEffort => Some("besteffort"),
        };
        if systemd {
            let (qos_dir, pod_prefix) = match q {
                Some(q) => (format!("/kubepods-{q}.slice"), format!("kubepods-{q}-pod")),
                None => (String::new(), "kubepods-pod".to_string()),
            };
            let pod = format!("kubepods.slice{qos_dir}/{pod_prefix}{}.slice", uid.replace('-', "_"));
            match container {
                Some(id) => format!("/{pod}/{runtime}-{id}.scope"),
                None => format!("/{pod}"),
            }
        } else {
            let qos_dir = q.map(|q| format!("/{q}")).unwrap_or_default();
            let pod = format!("/kubepods{qos_dir}/pod{uid}");
            match container {
                Some(id) => format!("{pod}/{id}"),
                None => pod,
            }
        }
    }

    proptest! {
        #[test]
        fn every_layout_round_trips(
            systemd: bool,
            qos in qos(),
            uid in uid(),
            runtime in prop_oneof![Just("cri-containerd"), Just("crio"), Just("docker")],
            id in "[0-9a-f]{64}",
            with_container: bool,
            v1_prefix in prop_oneof![Just(""), Just("/memory"), Just("/cpu,cpuacct")],
        ) {
            let container = with_container.then_some(id.as_str());
            let p = format!("{v1_prefix}{}", path(systemd, qos, &uid, runtime, container));
            let expected = match container {
                Some(id) => Workload::Container { pod_uid: uid.clone(), container_id: id.to_string(), qos },
                None => Workload::Pod { pod_uid: uid.clone(), qos },
            };
            prop_assert_eq!(parse(&p), expected, "{}", p);
        }

        #[test]
        fn never_panics(p in "[/a-z0-9_.,-]{0,200}") {
            let _ = parse(&p);
        }

        #[test]
        fn never_panics_on_kubepods_like_noise(p in "(/(kubepods(\\.slice)?|kubepods-[a-z]{0,12}(-pod[0-9a-f_-]{0,40})?\\.slice|pod[0-9a-f-]{0,40}|[a-z-]{0,20}[0-9a-f]{0,70}(\\.scope)?)){0,6}") {
            let _ = parse(&p);
        }
    }
}
