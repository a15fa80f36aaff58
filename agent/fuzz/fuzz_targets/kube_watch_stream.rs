//! The Kubernetes API's pod list and watch stream as kube-rs hands them to
//! `attribution/pods/api.rs`: the bytes as a list of pods (the initial list and each relist), and
//! each line as a watch event (`{"type":"ADDED","object":{...}}`), deserialized with the types
//! kube uses; then the agent's own conversion (`api::update_of`, `PodMeta::from_pod`) and the pod
//! store. An API server (or a proxy in front of it) can send anything: never a panic.
#![no_main]

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use kstall::attribution::pods::{PodMeta, PodStore, api::update_of};
use kube::{
    core::{ObjectList, WatchEvent},
    runtime::watcher::Event,
};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let labels = ["app".to_string(), "team".to_string()];
    let now = Instant::now();
    let mut store = PodStore::new(Duration::from_secs(3600));
    let mut listing = Vec::new();
    let mut apply = |event: Event<Pod>, store: &mut PodStore| {
        if let Some(update) = update_of(event, &mut listing, &labels) {
            store.apply(update, now);
        }
    };

    // One pod (a GET, or a watch event's object).
    if let Ok(pod) = serde_json::from_slice::<Pod>(data)
        && let Some(meta) = PodMeta::from_pod(&pod, &labels)
    {
        assert_eq!(Some(&meta.uid), pod.metadata.uid.as_ref());
    }
    // A list: kube's watcher turns it into Init, one InitApply per pod, InitDone.
    if let Ok(list) = serde_json::from_slice::<ObjectList<Pod>>(data) {
        apply(Event::Init, &mut store);
        for pod in list.items {
            apply(Event::InitApply(pod), &mut store);
        }
        apply(Event::InitDone, &mut store);
    }
    // The watch stream: newline-separated events (kube reads it with a lines codec).
    for line in data.split(|&b| b == b'\n') {
        let Ok(line) = std::str::from_utf8(line) else { continue };
        match serde_json::from_str::<WatchEvent<Pod>>(line) {
            Ok(WatchEvent::Added(pod) | WatchEvent::Modified(pod)) => apply(Event::Apply(pod), &mut store),
            Ok(WatchEvent::Deleted(pod)) => apply(Event::Delete(pod), &mut store),
            // A bookmark only moves the resource version; an error ends the watch (a relist).
            Ok(WatchEvent::Bookmark(_) | WatchEvent::Error(_)) | Err(_) => {}
        }
    }
    let _ = (store.kubelet_load(), store.states(), store.names(), store.deleted());
    store.expire(now + Duration::from_secs(7200));
});
