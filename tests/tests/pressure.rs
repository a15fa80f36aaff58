//! Pressure (PSI) per pod against the real kernel: a pod whose container reads a file four times
//! the size of its memory limit, over and over — its page cache cannot hold it, so every read
//! goes to the disk and its tasks stall on IO (and on memory, reclaiming its own cache). kstall
//! must export the pod's own stall times exactly as its cgroup's files say, beside the node's.

use std::{process::Command, time::Duration};

use kstall_tests::{
    agent::{Agent, pod_json, write_pods_file},
    cgroup::{Cgroup, MemoryLimit},
    host::wait_for,
    kernel_tests_can_run,
};

const LIMIT: u64 = 48 << 20;

/// `<cgroup>/<resource>.pressure`'s `some` total, in seconds.
fn stalled_seconds(cgroup: &std::path::Path, resource: &str) -> f64 {
    let text = std::fs::read_to_string(cgroup.join(format!("{resource}.pressure"))).expect("pressure file");
    let total = text
        .lines()
        .find(|l| l.starts_with("some "))
        .and_then(|l| l.split_whitespace().find_map(|w| w.strip_prefix("total=")))
        .and_then(|t| t.parse::<u64>().ok())
        .expect("some total");
    total as f64 / 1e6
}

#[test]
fn a_pods_own_stall_times_are_exported_as_its_cgroup_counts_them() {
    if !kernel_tests_can_run("a_pods_own_stall_times_are_exported_as_its_cgroup_counts_them") {
        return;
    }
    if !std::path::Path::new("/proc/pressure/memory").exists() {
        panic!("this kernel has no PSI (CONFIG_PSI, or psi=1 on its command line)");
    }
    let (uid, container_id) = (
        format!("0000b5b1-7f3d-4c1a-9e8b-{:012x}", std::process::id()),
        format!("{:064x}", 0xb5b1_u64 << 32 | u64::from(std::process::id())),
    );
    let name = "reports-7c9d5f8b6-psi";
    let dir = tempfile::tempdir_in("/var/tmp").unwrap();
    let pods_file = dir.path().join("pods.json");
    write_pods_file(&pods_file, &[pod_json(&uid, name, &container_id)]);
    let mut agent = Agent::start(&["--pods-file", pods_file.to_str().unwrap()]);
    let container = Cgroup::kubepods_container("burstable", &uid, &container_id);
    let pod_cgroup = container.path.parent().unwrap().to_path_buf();
    let limit = MemoryLimit::new(&container, LIMIT);
    // Written and read from inside the limit: the page cache the file gets is the pod's, a
    // quarter of the file.
    let data = dir.path().join("report.dat");
    let joins: String = [container.procs(), limit.procs().to_path_buf()]
        .iter()
        .map(|p| format!("echo $$ > {} && ", p.display()))
        .collect();
    let script = format!(
        "{joins}dd if=/dev/zero of={data} bs=1M count=192 status=none && \
         end=$(($(date +%s) + 6)); while [ $(date +%s) -lt $end ]; do cat {data} > /dev/null; done",
        data = data.display()
    );
    let status = Command::new("sh").args(["-c", &script]).status().expect("the reader");
    assert!(status.success(), "the reader: {status}");
    // The reader is gone: the pod's totals stand still, and kstall reads them within a sample.
    let (io, memory) = (stalled_seconds(&pod_cgroup, "io"), stalled_seconds(&pod_cgroup, "memory"));
    assert!(io > 0.5, "the pod stalled {io} s on IO: no pressure to read");
    let pod = |resource| [("resource", resource), ("kind", "some"), ("namespace", "shop"), ("pod", name)];
    let name_of = "kstall_pressure_stalled_seconds_total";
    // The kernel counts microseconds; the counter adds seconds as floats.
    let exported = |resource, total: f64| {
        wait_for(Duration::from_secs(10), || {
            agent.metric_with(name_of, &pod(resource)).filter(|v| (v - total).abs() < 1e-6)
        })
    };
    assert!(exported("io", io).is_some(), "IO {io} s:\n{}", agent.metrics());
    assert!(exported("memory", memory).is_some(), "memory {memory} s:\n{}", agent.metrics());
    let node = [("resource", "io"), ("kind", "some"), ("namespace", ""), ("pod", "")];
    let node_io = agent.metric_with(name_of, &node).unwrap_or(0.0);
    assert!(node_io >= io, "the node's IO stalls ({node_io} s) hold the pod's ({io} s)");
    println!("pressure: the pod stalled {io:.2} s on IO and {memory:.3} s on memory; kstall exported both");
    drop(limit);
    assert_eq!(agent.stop(), Some(0));
}
