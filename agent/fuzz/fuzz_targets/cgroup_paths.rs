//! A cgroup path as the resolver's walk reads it off the hierarchy (or a process's
//! `/proc/<pid>/cgroup` line gives it): any directory name a container runtime, systemd or a user
//! made, lossily decoded as the walk does. `attribution::cgroup::parse` must never panic, and a pod
//! it finds has a real UID and container id.
#![no_main]

use kstall::attribution::cgroup::{Workload, parse};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let path = String::from_utf8_lossy(data);
    let workload = parse(&path);
    // A UID as the API server writes it, found in the path (with dashes, or the systemd driver's
    // underscores).
    let uid_ok = |uid: &str| {
        uid.len() == 36
            && uid.char_indices().all(|(i, c)| match i {
                8 | 13 | 18 | 23 => c == '-',
                _ => c.is_ascii_hexdigit(),
            })
            && path.replace('_', "-").contains(uid)
    };
    match &workload {
        Workload::Container { pod_uid, container_id, .. } => {
            assert!(uid_ok(pod_uid), "pod UID {pod_uid:?} is not from {path:?}");
            assert!(
                container_id.len() == 64
                    && container_id.bytes().all(|b| b.is_ascii_hexdigit())
                    && path.contains(container_id.as_str()),
                "container id {container_id:?} is not from {path:?}"
            );
        }
        Workload::Pod { pod_uid, .. } => assert!(uid_ok(pod_uid), "pod UID {pod_uid:?} is not from {path:?}"),
        Workload::Host { unit } => {
            if let Some(unit) = unit {
                assert!(path.contains(unit.as_str()), "unit {unit:?} is not from {path:?}");
            }
        }
    }
    serde_json::to_vec(&workload).expect("a workload serializes");
});
