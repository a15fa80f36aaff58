//! `--pods-file`: whatever JSON a user (or a ConfigMap, or `kubectl get pods -o json > file`
//! interrupted halfway) leaves there, parsed by `attribution::pods::file::parse` into pod
//! metadata, then applied to the pod store as the watcher does. Never a panic; a bad file is a
//! one-line error naming the file.
#![no_main]

use std::{
    path::Path,
    time::{Duration, Instant},
};

use kstall::attribution::pods::{PodStore, PodUpdate, file};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    // The agent reads the file with `read_to_string`: not UTF-8 is a read error, never parsed.
    let Ok(text) = std::str::from_utf8(data) else { return };
    let labels = ["app".to_string(), "team".to_string(), "pod-template-hash".to_string()];
    let path = Path::new("/etc/kstall/pods.json");
    match file::parse(path, text, &labels) {
        Ok(pods) => {
            let mut store = PodStore::new(Duration::from_secs(3600));
            let now = Instant::now();
            for pod in &pods {
                let _ = (pod.terminating(), pod.full_name());
            }
            store.apply(PodUpdate::Snapshot(pods), now);
            let _ = (store.kubelet_load(), store.states(), store.names());
            store.apply(PodUpdate::Snapshot(vec![]), now);
            store.expire(now + Duration::from_secs(7200));
            assert!(store.is_empty(), "pods outlived their retention");
        }
        Err(e) => {
            let message = e.to_string();
            assert!(message.starts_with("/etc/kstall/pods.json is not the JSON of"), "{message}");
            assert!(!message.contains(['\n', '\r']), "not one line: {message:?}");
        }
    }
});
