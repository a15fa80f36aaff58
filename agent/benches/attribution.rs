//! Attribution on issue 4's node: 500 pods of 10 cgroups each (5,000 cgroups), 3 processes per
//! pod, a pods file naming them. Targets: under 1 µs per event on the event path, resolver memory
//! under 20 MiB, the start-up walk under 200 ms.
//!
//! Memory is counted by a global allocator (live heap bytes of resolver + index), not RSS, so
//! the figure is the resolver's own and repeatable.

use std::{
    alloc::{GlobalAlloc, Layout, System},
    hint::black_box,
    os::unix::fs::MetadataExt as _,
    path::{Path, PathBuf},
    sync::atomic::{AtomicIsize, Ordering},
    time::{Duration, Instant},
};

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use kstall::{
    attribution::{
        Resolution,
        cgroup::Hierarchies,
        pods::{PodMeta, PodUpdate},
        resolver::{Resolver, Settings},
    },
    events::Decoder,
};
use kstall_common::{EventHeader, kind, tcp_reset::TcpResetEvent};

struct Counting;

static LIVE: AtomicIsize = AtomicIsize::new(0);

// SAFETY: forwards to the system allocator, only counting.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LIVE.fetch_add(layout.size() as isize, Ordering::Relaxed);
        // SAFETY: same contract as ours.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size() as isize, Ordering::Relaxed);
        // SAFETY: same contract as ours.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

const PODS: u32 = 500;
const CGROUPS_PER_POD: u32 = 10;
const PROCS_PER_POD: u32 = 3;
const NETNS_BASE: u32 = 4_026_600_000;

fn uid(pod: u32) -> String {
    format!("{pod:08x}-1111-4222-8333-{pod:012x}")
}

fn container_id(pod: u32, c: u32) -> String {
    format!("{:064x}", pod * CGROUPS_PER_POD + c)
}

/// The fake node in a temporary directory: `v2/` hierarchy (systemd driver) and `proc/`.
struct FakeNode {
    dir: tempfile::TempDir,
    container_ids: Vec<u64>,
}

fn fake_node() -> FakeNode {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut container_ids = Vec::new();
    let burstable = dir.path().join("v2/kubepods.slice/kubepods-burstable.slice");
    for pod in 0..PODS {
        let pod_dir = burstable.join(format!("kubepods-burstable-pod{}.slice", uid(pod).replace('-', "_")));
        for c in 1..CGROUPS_PER_POD {
            let cdir = pod_dir.join(format!("cri-containerd-{}.scope", container_id(pod, c)));
            std::fs::create_dir_all(&cdir).unwrap();
            let procs: String =
                (0..PROCS_PER_POD).map(|p| format!("{}\n", 10_000 + pod * PROCS_PER_POD + p)).collect();
            std::fs::write(cdir.join("cgroup.procs"), if c == 1 { procs } else { String::new() }).unwrap();
            container_ids.push(std::fs::metadata(&cdir).unwrap().ino());
        }
        for p in 0..PROCS_PER_POD {
            let ns = dir.path().join(format!("proc/{}/ns", 10_000 + pod * PROCS_PER_POD + p));
            std::fs::create_dir_all(&ns).unwrap();
            std::os::unix::fs::symlink(format!("net:[{}]", NETNS_BASE + pod), ns.join("net")).unwrap();
        }
    }
    FakeNode { dir, container_ids }
}

fn pods() -> Vec<PodMeta> {
    (0..PODS)
        .map(|pod| {
            let statuses: Vec<_> = (1..CGROUPS_PER_POD)
                .map(|c| {
                    serde_json::json!({"name": format!("c{c}"), "containerID": format!("containerd://{}", container_id(pod, c)),
                    "image": "app", "imageID": "", "ready": true, "restartCount": 0})
                })
                .collect();
            let json = serde_json::json!({
                "metadata": {"name": format!("web-5d8c7b9f4-{pod:05}"), "namespace": "shop", "uid": uid(pod),
                    "labels": {"app": "web", "pod-template-hash": "5d8c7b9f4"},
                    "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web-5d8c7b9f4",
                        "uid": "u", "controller": true}]},
                "spec": {"nodeName": "node-a", "containers": []},
                "status": {"containerStatuses": statuses}
            });
            PodMeta::from_pod(&serde_json::from_value(json).unwrap(), &["app".into()]).unwrap()
        })
        .collect()
}

fn settings(v2: PathBuf, proc: PathBuf) -> Settings {
    Settings {
        hierarchies: Hierarchies { v2: Some(v2), v1_memory: None },
        proc,
        retention: Duration::from_secs(3600),
        metadata_source: true,
    }
}

fn reset_record(netns: u32) -> Vec<u8> {
    // SAFETY: a plain-integer record; all zeroes is valid.
    let mut ev: TcpResetEvent = unsafe { std::mem::zeroed() };
    ev.header = EventHeader::zeroed();
    ev.header.kind = kind::TCP_RESET;
    ev.header.version = kstall_common::tcp_reset::VERSION;
    ev.header.netns_ino = netns;
    ev.family = kstall_common::tcp_reset::FAMILY_INET;
    ev.hook = kstall_common::tcp_reset::HOOK_TCP_SEND_RESET;
    // SAFETY: a plain-integer record.
    unsafe { std::slice::from_raw_parts((&raw const ev).cast::<u8>(), size_of::<TcpResetEvent>()) }.to_vec()
}

fn attribution(c: &mut Criterion) {
    let node = fake_node();
    let before = LIVE.load(Ordering::Relaxed);
    let mut resolver = Resolver::new(settings(node.dir.path().join("v2"), node.dir.path().join("proc")));
    let walk_started = Instant::now();
    resolver.full_walk(Instant::now());
    let walked = walk_started.elapsed();
    resolver.apply(PodUpdate::Snapshot(pods()), Instant::now());
    let build_started = Instant::now();
    let index = resolver.index();
    let built = build_started.elapsed();
    let bytes = LIVE.load(Ordering::Relaxed) - before;
    println!(
        "attribution: {} cgroups, {} pod namespaces, {PODS} pods: walk {:.1} ms (fake tree), index build {:.1} ms, \
         resolver + index memory {:.2} MiB",
        index.by_cgroup.len(),
        index.by_netns.len(),
        walked.as_secs_f64() * 1e3,
        built.as_secs_f64() * 1e3,
        bytes as f64 / (1024.0 * 1024.0)
    );

    let decoder = Decoder::default();
    let resets: Vec<_> = (0..PODS).map(|p| decoder.decode(&reset_record(NETNS_BASE + p)).unwrap()).collect();
    // SAFETY: a plain-integer record; all zeroes is valid.
    let mut hung: kstall_common::hung_task::HungTaskEvent = unsafe { std::mem::zeroed() };
    hung.header.kind = kind::HUNG_TASK;
    hung.header.version = kstall_common::hung_task::VERSION;
    let hung_events: Vec<_> = node
        .container_ids
        .iter()
        .map(|&id| {
            hung.header.cgroup_id = id;
            // SAFETY: a plain-integer record.
            let bytes =
                unsafe { std::slice::from_raw_parts((&raw const hung).cast::<u8>(), size_of_val(&hung)) };
            decoder.decode(bytes).unwrap()
        })
        .collect();
    let mut group =
        c.benchmark_group(format!("attribution ({} cgroups, {PODS} pods)", index.by_cgroup.len()));
    group.throughput(Throughput::Elements(1));
    let mut next = 0;
    group.bench_function("reset -> pod by netns (event path)", |b| {
        b.iter(|| {
            next = (next + 7) % resets.len();
            let Resolution::Found(a) = index.resolve(black_box(&resets[next])) else { panic!("miss") };
            black_box(a)
        })
    });
    group.bench_function("hung task -> container by cgroup (event path)", |b| {
        b.iter(|| {
            next = (next + 7919) % hung_events.len();
            let Resolution::Found(a) = index.resolve(black_box(&hung_events[next])) else { panic!("miss") };
            black_box(a)
        })
    });
    group.sample_size(10);
    group.throughput(Throughput::Elements(index.by_cgroup.len() as u64));
    group.bench_function("rebuild the index (every pod update)", |b| b.iter(|| black_box(resolver.index())));
    group.finish();
    walk_real_hierarchy(c);
}

/// The start-up (and every 5 s) walk over the real cgroup v2 hierarchy with 5,000 kubepods
/// cgroups added: needs root; the cgroups are removed afterwards, also on a panic.
fn walk_real_hierarchy(c: &mut Criterion) {
    struct Cgroups(PathBuf);
    impl Drop for Cgroups {
        fn drop(&mut self) {
            // Leaves first: rmdir only removes empty cgroups.
            let mut dirs = dirs_under(&self.0);
            dirs.sort_by_key(|d| std::cmp::Reverse(d.components().count()));
            for d in dirs {
                let _ = std::fs::remove_dir(d);
            }
        }
    }
    fn dirs_under(dir: &Path) -> Vec<PathBuf> {
        let mut out = vec![dir.to_path_buf()];
        for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                out.extend(dirs_under(&e.path()));
            }
        }
        out
    }
    let Some(v2) = Hierarchies::for_this_host().v2 else {
        println!("skipping the real cgroup walk: no cgroup v2 hierarchy");
        return;
    };
    // Its own kubepods tree, so a node's real pods are never touched.
    let base = v2.join(format!("kstall-bench-{}", std::process::id()));
    if std::fs::create_dir(&base).is_err() {
        println!("skipping the real cgroup walk: cannot create cgroups (needs root)");
        return;
    }
    let guard = Cgroups(base.clone());
    let burstable = base.join("kubepods.slice/kubepods-burstable.slice");
    for pod in 0..PODS {
        let pod_dir = burstable.join(format!("kubepods-burstable-pod{}.slice", uid(pod).replace('-', "_")));
        for c in 1..CGROUPS_PER_POD {
            std::fs::create_dir_all(pod_dir.join(format!("cri-containerd-{}.scope", container_id(pod, c))))
                .expect("container cgroup");
        }
    }
    let mut resolver = Resolver::new(settings(v2, "/proc".into()));
    let mut group = c.benchmark_group("attribution (real hierarchy)");
    group.sample_size(10);
    group.bench_function("walk 5,000 real cgroups + learn + index", |b| {
        b.iter(|| {
            resolver.full_walk(Instant::now());
            black_box(resolver.index())
        })
    });
    group.finish();
    drop(guard);
}

criterion_group!(benches, attribution);
criterion_main!(benches);
