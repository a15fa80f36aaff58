//! kstall's one entry point for everything that is not plain cargo.
//!
//! `cargo xtask run` and `cargo xtask test` are the README's two set-up commands: both bootstrap
//! what is missing first, so a fresh Debian 12 machine needs nothing else.

mod arch;
mod background;
mod bench;
mod bootstrap;
mod build;
mod cluster;
mod dashboards;
mod deploy;
mod fuzz;
mod generated;
mod helm;
mod image;
mod imports;
mod krew;
mod libtest;
mod lockup_module;
mod repeat;
mod run;
mod seccomp;
mod soak;
mod support;
mod test;
mod tools;
mod vm;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "cargo xtask", about = "Bootstrap, build, run and test kstall")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Install what is missing: apt packages, the nightly's rust-src, bpf-linker, and helm and
    /// kubectl for the chart's tests into target/tools (idempotent).
    Bootstrap,
    /// Bootstrap, then build the release binary (target/release/kstall).
    Build,
    /// Bootstrap, build, and start `kstall agent` here (root); arguments after `--` go to the agent.
    Run {
        #[arg(last = true)]
        agent_args: Vec<String>,
    },
    /// Bootstrap, build, then fmt/clippy checks, every unit test and every kernel integration test,
    /// and as root the kernel matrix (vm-test).
    Test {
        /// Run the tests (not the checks) this many times back to back; a flake hunt.
        #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
        repeat: u32,
        /// Leave the kernel matrix out: only the unit and host kernel tests.
        #[arg(long)]
        no_matrix: bool,
    },
    /// Bootstrap, build, then the agent's container image (podman build of deploy/image/Containerfile
    /// from a staged context per architecture; saved as one multi-arch OCI archive under
    /// target/image/).
    Image {
        /// The architectures the image is for (another than this machine's is cross-built).
        #[arg(long, value_enum, default_value = "all")]
        arch: arch::Arches,
    },
    /// Regenerate deploy/'s generated files: the PrometheusRule (from the alerting rules), the
    /// Grafana dashboards' kustomization (from deploy/grafana/*.json), and the Helm chart's copies
    /// of both and its version.
    Deploy,
    /// The Helm chart (deploy/helm/kstall) with the pinned helm (target/tools): `package` writes
    /// target/helm/kstall-<version>.tgz.
    Helm {
        #[arg(value_enum)]
        action: HelmAction,
    },
    /// The kubectl plugin for krew: its archives (target/krew/kstall-linux-<arch>.tar.gz, the
    /// script and a LICENSE) and the plugin manifest with their sha256 (deploy/krew/kstall.yaml).
    Krew,
    /// The agent's module graph from its source: its layers, or the import circles and why.
    Imports,
    /// Bootstrap, build, then the benchmarks (root): the idle agent and the storms through a real
    /// agent beside bpftrace, into bench/results.md.
    Bench {
        /// Only these rows of the storm table, printed and not written (a partial table would
        /// replace bench/results.md); the other benchmarks are left out [default: everything].
        #[arg(long = "storm", value_name = "ROW", value_parser = ["idle", "resets", "ports", "drops", "hung", "oom", "capture"])]
        storms: Vec<String>,
    },
    /// Write the Grafana dashboards, deploy/grafana/*.json, from their generator.
    Dashboards,
    /// The libFuzzer targets (agent/fuzz, cargo-fuzz on the eBPF nightly), each for a while; a line
    /// per target (executions, corpus, crash) and a failure naming the input of any crash.
    Fuzz {
        /// Seconds each target runs.
        #[arg(long, default_value_t = 30, value_parser = clap::value_parser!(u64).range(1..))]
        secs: u64,
        /// Only these targets [default: all].
        #[arg(long = "target", value_name = "NAME")]
        targets: Vec<String>,
    },
    /// The soak (root): pods churned through the pods file with real cgroups, network namespaces,
    /// resets and OOM kills, the agent under the DaemonSet's memory limit; fails if RSS, fds,
    /// series or the attribution index are not back within 10% of their baseline. With
    /// `--healthy`: the healthy node instead (a mesh pod and its restarting proxy, scans, memory
    /// churn, writeback, one OOM) for `--secs`; fails on any incident.
    Soak {
        #[arg(long)]
        healthy: bool,
        #[arg(long, default_value_t = 2000, value_parser = clap::value_parser!(u64).range(1..))]
        pods: u64,
        /// How long the churn lasts at least.
        #[arg(long, default_value_t = 600, value_parser = clap::value_parser!(u64).range(1..))]
        secs: u64,
    },
    /// The agent's seccomp profile (deploy/seccomp/kstall.json) from the system calls it makes:
    /// `record` (root) runs the host kernel test suite and the kernel matrix's scenarios with them
    /// recorded and merges them into deploy/seccomp/syscalls.txt; `profile` writes the profile
    /// from that list.
    Seccomp {
        #[arg(value_enum)]
        action: SeccompAction,
        /// What `record` runs.
        #[arg(long, value_enum, default_value = "all")]
        suites: seccomp::Suites,
        /// With `--suites host`: only these files of tests/tests (a new feature's calls, merged
        /// into the list in minutes) [default: the whole suite].
        #[arg(long = "test", value_name = "NAME")]
        tests: Vec<String>,
    },
    /// A real Kubernetes 1.20 here (root), built once from Debian's packages and run in a network
    /// namespace with no route out: etcd, API server, controller manager, scheduler, containerd,
    /// kubelet; the agent's image imported. The cluster tests (tests/tests/cluster.rs) run on it.
    Cluster {
        #[arg(value_enum)]
        action: cluster::Action,
    },
    /// The kernel matrix (root): boot Debian 5.10, 6.1, 6.12 and 7.3 (amd64) and 6.1 and 6.12
    /// (arm64) in VMs; in each, load every probe and run the incident scenarios (real NFS, a
    /// real global OOM).
    VmTest {
        /// Only these kernels (5.10, 6.1, 6.12, 7.3) [default: all].
        #[arg(long = "kernel")]
        kernels: Vec<String>,
        /// Only this architecture's kernels (arm64: cross-built, emulated) [default: all].
        #[arg(long, value_enum, default_value = "all")]
        arch: arch::Arches,
        /// Run the matrix this many times back to back; a flake hunt.
        #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
        repeat: u32,
        /// Only the scenarios whose test name contains this (libtest's filter) [default: all].
        #[arg(long, value_name = "FILTER")]
        scenario: Option<String>,
        /// Only build what the guests run (the binaries, arm64's root file system); boot nothing.
        #[arg(long)]
        prepare_only: bool,
    },
}

#[derive(Clone, Copy, clap::ValueEnum)]
enum SeccompAction {
    Record,
    Profile,
}

#[derive(Clone, Copy, clap::ValueEnum)]
enum HelmAction {
    Package,
}

fn main() -> ExitCode {
    let result = match Cli::parse().command {
        Command::Bootstrap => bootstrap::run().map(|_| ()),
        Command::Build => bootstrap::run().and_then(|env| build::release(&env)),
        Command::Run { agent_args } => run::run(&agent_args),
        Command::Test { repeat, no_matrix } => test::run(repeat, !no_matrix),
        Command::Image { arch } => image::run(arch),
        Command::Deploy => deploy::run(),
        Command::Helm { action: HelmAction::Package } => helm::package(),
        Command::Krew => krew::run(),
        Command::Imports => imports::run(),
        Command::Bench { storms } => bench::run(&storms),
        Command::Dashboards => dashboards::run(),
        Command::Fuzz { secs, targets } => fuzz::run(secs, &targets),
        Command::Soak { healthy: false, pods, secs } => soak::run(pods, secs),
        Command::Soak { healthy: true, secs, .. } => soak::healthy(secs),
        Command::Seccomp { action: SeccompAction::Record, suites, tests } => seccomp::record(suites, &tests),
        Command::Seccomp { action: SeccompAction::Profile, .. } => seccomp::profile(),
        Command::Cluster { action } => cluster::run(action),
        Command::VmTest { prepare_only: true, arch, .. } => vm::prepare(&arch.list()),
        Command::VmTest { kernels, arch, repeat, scenario, prepare_only: false } => {
            vm::run(&kernels, &arch.list(), repeat, scenario.as_deref())
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("xtask: {e:#}");
            ExitCode::FAILURE
        }
    }
}
