//! `cargo xtask cluster up|down|status`: a real Kubernetes 1.20 on this machine, for the tests of
//! `tests/tests/cluster.rs` and for trying kstall by hand. Built once from Debian's packages alone
//! (`build`), cached outside the clone and keyed by the source package's version; run (`node`)
//! inside a private network namespace with no route out: etcd, the API server with Node and RBAC
//! authorization, the controller manager and scheduler, containerd and a kubelet registering
//! itself as one node.

mod build;
mod node;
mod pki;

use std::path::{Path, PathBuf};

use anyhow::bail;

use crate::{background::Background, bootstrap};

/// Debian bookworm's `src:kubernetes`: the full upstream v1.20.2 tree, `vendor/` included.
pub const SOURCE_VERSION: &str = "1.20.5+really1.20.2-1.1+deb12u1";
/// The network namespace the whole cluster lives in.
pub const NETNS: &str = "kstall-cluster";
/// The one node, as the kubelet registers it.
pub const NODE: &str = "node1";
/// The node's address (TEST-NET-2: never routed anywhere) on a veth pair whose both ends stay
/// inside the namespace; it holds the default route, so nothing can leave.
pub const NODE_IP: &str = "198.51.100.10";
/// The pods' addresses (TEST-NET-3), on the CNI bridge inside the namespace.
pub const POD_SUBNET: &str = "203.0.113.0/24";

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Action {
    /// Only build what is missing (what `up` does first).
    Build,
    /// Build what is missing (once), then start the cluster (a fresh etcd each time).
    Up,
    /// Stop every process of the cluster, unmount what it mounted, remove its namespace.
    Down,
    /// What runs, whether the node is Ready, and how to reach it.
    Status,
}

/// Where the build is kept: outside the clone, so every clone and CI run on this machine shares
/// it; keyed by the source version, so a new one builds anew beside it.
pub fn cache_dir() -> PathBuf {
    Path::new("/var/cache/kstall/kubernetes").join(SOURCE_VERSION)
}

/// Where a running cluster keeps its state: certificates, etcd, containerd, the kubelet, logs.
pub fn state_dir() -> PathBuf {
    PathBuf::from("/var/lib/kstall-cluster")
}

pub fn run(action: Action) -> anyhow::Result<()> {
    if !bootstrap::is_root() {
        bail!("cluster: needs root (network namespaces, containerd, the kubelet)");
    }
    match action {
        Action::Up => {
            let started = std::time::Instant::now();
            let built = build::ensure()?;
            node::up(&built)?;
            println!("cluster: up in {:.0} s", started.elapsed().as_secs_f64());
            node::print_how_to_reach(&built);
            Ok(())
        }
        Action::Build => build::ensure().map(|_| ()),
        Action::Down => node::down(),
        Action::Status => node::status(&build::Built::at(&cache_dir())),
    }
}

/// Builds the cluster's binaries and images if they are missing, in the background at idle
/// priority: `cargo xtask test` starts it first and waits for it only when the cluster tests
/// need it.
pub fn build_in_background() -> anyhow::Result<Background> {
    build::spawn_background()
}

/// A cluster started for the tests, stopped when dropped (also when they failed).
pub struct Running {
    pub state_dir: PathBuf,
}

/// Waits for `build` (from [`build_in_background`]), then starts a fresh cluster (stopping one
/// that runs).
pub fn start_for_tests(build: Background) -> anyhow::Result<Running> {
    build.wait()?;
    let built = build::Built::at(&cache_dir());
    node::down()?;
    let started = std::time::Instant::now();
    node::up(&built)?;
    println!("cluster: up in {:.0} s", started.elapsed().as_secs_f64());
    Ok(Running { state_dir: state_dir() })
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Err(e) = node::down() {
            eprintln!("{e:#}");
        }
    }
}
