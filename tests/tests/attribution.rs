//! Attribution against the real kernel: fake pods made of real cgroups (in each kubelet layout)
//! and real network namespaces, a real reset in softirq context and a real memcg OOM kill from
//! each, and a pods file for the names. The events must name the pod, its namespace, workload and
//! container — also a minute after the pod was deleted.

use std::{
    net::{Ipv4Addr, SocketAddr},
    time::Duration,
};

use kstall_tests::{
    agent::{Agent, COUNTED_WITHIN, EventStream, pod_json, write_pods_file},
    cgroup::{Cgroup, PodProcess, v1_memory_limit},
    host::wait_for,
    kernel_tests_can_run,
    netns::{NetNs, closed_low_port, own_netns_inode, refused_connects},
    oom::{OOM_LIMIT, oom_kill},
};
use serde_json::Value;

#[derive(Clone, Copy, Debug)]
enum Layout {
    SystemdV2,
    CgroupfsV2,
    /// A kubelet on cgroup v1: the pod's cgroups are in the v1 hierarchies; its processes' v2
    /// cgroup says nothing about the pod.
    CgroupfsV1,
}

struct FakePod {
    uid: String,
    container_id: String,
    name: String,
    qos: &'static str,
}

impl FakePod {
    fn new(n: u32, name: &str, qos: &'static str) -> Self {
        FakePod {
            uid: format!("{n:08x}-7f3d-4c1a-9e8b-{:012x}", std::process::id()),
            container_id: format!("{:064x}", u64::from(n) << 32 | u64::from(std::process::id())),
            name: name.to_string(),
            qos,
        }
    }

    fn json(&self) -> Value {
        pod_json(&self.uid, &self.name, &self.container_id)
    }

    /// The container's cgroup in `layout`.
    fn container_cgroup(&self, layout: Layout) -> Cgroup {
        let (uid, id) = (&self.uid, &self.container_id);
        match layout {
            Layout::SystemdV2 => Cgroup::kubepods_container("burstable", uid, id),
            Layout::CgroupfsV2 => Cgroup::at(&format!("kubepods/besteffort/pod{uid}/{id}")),
            Layout::CgroupfsV1 => Cgroup::v1_memory_at(&format!("kubepods/burstable/pod{uid}/{id}")),
        }
    }
}

/// One reset, sent by the kernel in softirq context in `netns`: a connect to a closed port from a
/// thread that is not in the pod's cgroup.
fn reset_in(netns: &NetNs, events: &EventStream) -> Value {
    // A port of its own per call, to tell this reset from earlier ones in the same namespace.
    static NEXT: std::sync::atomic::AtomicU16 = std::sync::atomic::AtomicU16::new(20_000);
    let port = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    netns.run_inside(move || refused_connects(SocketAddr::from((Ipv4Addr::LOCALHOST, port)), 1));
    let ino = netns.inode();
    let resets = events.collect(
        |e| {
            e["kind"] == "tcp_reset"
                && e["netns"] == ino
                && e["direction"] == "sent"
                && e["local_port"] == port
        },
        1,
        Duration::from_secs(10),
    );
    assert_eq!(resets.len(), 1, "{resets:#?}");
    resets[0].clone()
}

fn assert_names(e: &Value, pod: &FakePod, what: &str) {
    assert_eq!(e["pod_uid"], pod.uid.as_str(), "{what}: {e}");
    assert_eq!(e["pod"], pod.name.as_str(), "{what}: {e}");
    assert_eq!(e["namespace"], "shop", "{what}: {e}");
    assert_eq!(e["workload"], "Deployment/web", "{what}: {e}");
    assert_eq!(e["host"], false, "{what}: {e}");
}

#[test]
fn resets_and_oom_kills_name_their_pod_in_every_cgroup_layout() {
    if !kernel_tests_can_run("resets_and_oom_kills_name_their_pod_in_every_cgroup_layout") {
        return;
    }
    let layouts = [
        (Layout::SystemdV2, FakePod::new(1, "web-5d8c7b9f4-sysd2", "burstable")),
        (Layout::CgroupfsV2, FakePod::new(2, "web-5d8c7b9f4-cgfs2", "best_effort")),
        (Layout::CgroupfsV1, FakePod::new(3, "web-5d8c7b9f4-cgfs1", "burstable")),
    ];
    let dir = tempfile::tempdir().unwrap();
    let pods_file = dir.path().join("pods.json");
    write_pods_file(&pods_file, &layouts.iter().map(|(_, p)| p.json()).collect::<Vec<_>>());
    let mut agent = Agent::start(&["--pods-file", pods_file.to_str().unwrap()]);
    let events = agent.subscribe();

    // The pods live side by side, as on a node (and a namespace's inode number is not handed
    // to the next pod while the first one still exists).
    let mut running = Vec::new();
    for (layout, pod) in &layouts {
        let what = format!("{layout:?}");
        let container = pod.container_cgroup(*layout);
        let netns = NetNs::new(&format!("attr{}", *layout as usize));
        let sandbox = PodProcess::start(&netns, &container.procs());

        // The reset: attributed by network namespace (its task is the test's, not the pod's).
        let reset = reset_in(&netns, &events);
        assert_names(&reset, pod, &what);
        assert_eq!(reset["via"], "netns", "{what}: {reset}");
        assert_eq!(reset["container"], "", "{what}: a namespace is the pod's, not one container's");

        // The OOM kill: attributed by the victim's cgroup: on v1 by the memory cgroup path the
        // kernel gives with the kill, at once (no walk has seen the victim: it dies as it
        // starts), on v2 by its v2 cgroup (its memory cgroup here is a test one outside kubepods).
        let pid = match layout {
            Layout::CgroupfsV1 => {
                std::fs::write(container.path.join("memory.limit_in_bytes"), OOM_LIMIT.to_string()).unwrap();
                oom_kill(&[&container.procs()], |_| {})
            }
            _ => {
                let limit = v1_memory_limit(&format!("attr-oom{}", *layout as usize));
                oom_kill(&[&container.procs(), &limit.procs()], |_| {})
            }
        };
        let kills =
            events.collect(|e| e["kind"] == "oom_kill" && e["pid"] == pid, 1, Duration::from_secs(10));
        assert_eq!(kills.len(), 1, "{what}: {kills:#?}\n{}", agent.log());
        let kill = &kills[0];
        assert_names(kill, pod, &what);
        assert_eq!(kill["via"], "cgroup", "{what}: {kill}");
        assert_eq!(kill["container_id"], pod.container_id.as_str(), "{what}: {kill}");
        assert_eq!(kill["container"], "app", "{what}: {kill}");
        assert_eq!(kill["qos"], pod.qos, "{what}: {kill}");
        // Dropped in this order: processes, then namespaces, then cgroups.
        running.push((sandbox, netns, container));
    }

    // `kstall status` says where the names come from.
    let status = agent.status()["attribution"].clone();
    assert_eq!(status["source"], format!("file {}", pods_file.display()), "{status}");
    assert_eq!((&status["up"], &status["pods"]), (&true.into(), &3.into()), "{status}");
    assert!(status["pod_namespaces"].as_u64().is_some_and(|n| n >= 3), "{status}");

    // Metrics carry the same names (the resets' once the kernel's counters are read).
    let named = |metrics: &str, metric: &str, pod: &str| {
        let labels = [
            r#"host="false""#.to_string(),
            r#"namespace="shop""#.to_string(),
            format!(r#"pod="{pod}""#),
            r#"workload="Deployment/web""#.to_string(),
        ];
        metrics.lines().any(|l| l.starts_with(metric) && labels.iter().all(|x| l.contains(x.as_str())))
    };
    const METRICS: [&str; 2] = ["kstall_oom_kills_total{", "kstall_tcp_resets_total{"];
    let all_named = |metrics: &String| {
        layouts.iter().all(|(_, pod)| METRICS.iter().all(|metric| named(metrics, metric, &pod.name)))
    };
    let metrics = wait_for(COUNTED_WITHIN, || Some(agent.metrics()).filter(all_named))
        .unwrap_or_else(|| agent.metrics());
    for (_, pod) in &layouts {
        for metric in METRICS {
            assert!(named(&metrics, metric, &pod.name), "{metric} {}:\n{metrics}", pod.name);
        }
    }

    // The host's namespace is every hostNetwork pod's and every node process's: "host network".
    let port = closed_low_port();
    refused_connects(SocketAddr::from((Ipv4Addr::LOCALHOST, port)), 1);
    let host = events.collect(
        |e| {
            e["kind"] == "tcp_reset"
                && e["local_port"] == port
                && e["direction"] == "sent"
                && e["netns"] == own_netns_inode()
        },
        1,
        Duration::from_secs(10),
    );
    assert_eq!(host.len(), 1, "{host:#?}");
    assert_eq!(
        (&host[0]["host"], &host[0]["host_network"], &host[0]["pod"]),
        (&true.into(), &true.into(), &"".into())
    );

    // A namespace no pod lives in: sent without a pod, not guessed, and counted.
    let stray = NetNs::new("attr-stray");
    let e = reset_in(&stray, &events);
    assert_eq!((&e["pod"], &e["host"]), (&"".into(), &false.into()), "{e}");
    assert!(agent.metric(r#"kstall_events_unattributed_total{probe="tcp-reset"}"#).unwrap_or(0.0) >= 1.0);
    assert_eq!(agent.stop(), Some(0));
    drop(running);
}

/// Incident #1's pod is Terminating or gone while its stuck client still resets: a deleted pod
/// keeps its name for the retention time (1 h by default).
#[test]
fn a_deleted_pod_is_still_named_a_minute_later() {
    if !kernel_tests_can_run("a_deleted_pod_is_still_named_a_minute_later") {
        return;
    }
    let pod = FakePod::new(4, "web-5d8c7b9f4-gone1", "burstable");
    let dir = tempfile::tempdir().unwrap();
    let pods_file = dir.path().join("pods.json");
    write_pods_file(&pods_file, &[pod.json()]);
    let mut agent = Agent::start(&["--pods-file", pods_file.to_str().unwrap()]);
    let events = agent.subscribe();
    let netns = NetNs::new("attr-gone");
    {
        let container = pod.container_cgroup(Layout::SystemdV2);
        let _sandbox = PodProcess::start(&netns, &container.procs());
        assert_names(&reset_in(&netns, &events), &pod, "before");
    }
    // The pod is deleted: gone from the API (the file), its processes and cgroups removed; only
    // its network namespace lives on (held, as a stuck NFS client holds it).
    write_pods_file(&pods_file, &[]);
    std::thread::sleep(Duration::from_secs(61));
    let late = reset_in(&netns, &events);
    assert_names(&late, &pod, "a minute after deletion");
    assert_eq!(late["pod_phase"], "deleted", "{late}");
    assert_eq!(agent.stop(), Some(0));
}
