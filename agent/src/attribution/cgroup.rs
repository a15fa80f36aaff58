//! cgroup id -> cgroup path -> workload. The id is the kernfs inode of the v2 cgroup directory
//! (what `bpf_get_current_cgroup_id` and `task->cgroups->dfl_cgrp->kn->id` give); the path is read
//! off the hierarchy by a walk off the event path, and parsed into the Kubernetes layouts:
//!
//! - systemd driver: `kubepods.slice/kubepods-<qos>.slice/kubepods-<qos>-pod<uid_with_underscores>.slice/<runtime>-<id>.scope`
//!   (Guaranteed pods sit directly under `kubepods.slice` as `kubepods-pod<uid>.slice`),
//!   runtimes `cri-containerd`, `crio`, `docker`;
//! - cgroupfs driver: `kubepods/<qos>/pod<uid>/<id>` (Guaranteed: `kubepods/pod<uid>/<id>`);
//! - anything else under `system.slice/<unit>`: a host process of that systemd unit.

use std::{
    collections::HashMap,
    os::unix::fs::MetadataExt as _,
    path::{Path, PathBuf},
    sync::{Arc, RwLock},
};

use serde::Serialize;

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Workload {
    /// A container of a pod.
    Container { pod_uid: String, container_id: String, qos: Qos },
    /// A pod's own cgroup (no container below it: the pod slice itself).
    Pod { pod_uid: String, qos: Qos },
    /// A node process; `unit` is its systemd unit when it has one (`kubelet.service`).
    Host { unit: Option<String> },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
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

/// cgroup id -> path, for the v2 hierarchy; rebuilt by [`CgroupIndex::rescan`] off the event path.
#[derive(Default)]
pub struct CgroupIndex {
    root: Option<PathBuf>,
    /// Shared: attaching a workload to an event is a reference count, not a copy of its strings.
    paths: RwLock<HashMap<u64, Arc<Workload>>>,
}

impl CgroupIndex {
    /// The v2 hierarchy: `/sys/fs/cgroup` on a pure v2 host, `/sys/fs/cgroup/unified` on hybrid.
    pub fn for_this_host() -> Self {
        let root = ["/sys/fs/cgroup", "/sys/fs/cgroup/unified"]
            .into_iter()
            .map(PathBuf::from)
            .find(|p| p.join("cgroup.procs").exists() && p.join("cgroup.controllers").exists());
        Self { root, paths: RwLock::default() }
    }

    /// Walks the hierarchy and replaces the index. Returns the number of cgroups seen.
    pub fn rescan(&self) -> usize {
        let Some(root) = &self.root else { return 0 };
        let mut found = HashMap::new();
        walk(root, root, &mut found);
        let n = found.len();
        *self.paths.write().expect("cgroup index") = found;
        n
    }

    /// The workload of cgroup `id`, when the last walk saw it.
    pub fn workload(&self, id: u64) -> Option<Arc<Workload>> {
        self.paths.read().expect("cgroup index").get(&id).cloned()
    }

    /// An index over given (id, path) pairs instead of a walk.
    pub fn from_paths<'a>(paths: impl IntoIterator<Item = (u64, &'a str)>) -> Self {
        let index = Self::default();
        *index.paths.write().expect("cgroup index") =
            paths.into_iter().map(|(id, path)| (id, Arc::new(parse(path)))).collect();
        index
    }
}

fn walk(root: &Path, dir: &Path, found: &mut HashMap<u64, Arc<Workload>>) {
    let Ok(meta) = std::fs::metadata(dir) else { return };
    let relative = dir.strip_prefix(root).unwrap_or(dir).to_string_lossy();
    found.insert(meta.ino(), Arc::new(parse(&relative)));
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for entry in entries.flatten() {
        if entry.file_type().is_ok_and(|t| t.is_dir()) {
            walk(root, &entry.path(), found);
        }
    }
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
