//! Installs what building and testing kstall needs, and only what is missing. Each step prints
//! what it installs; an impossible step fails with one line saying why. helm and kubectl for the
//! chart's tests: tools.rs.

use std::{
    path::Path,
    process::{Command, Stdio},
};

use anyhow::{Context as _, bail};

/// Debian packages: LLVM 22 for bpf-linker; for the kernel tests iptables/iproute2 (resets),
/// nftables (a native nft table in a capture's rules.txt), bindfs/e2fsprogs (a writer stuck in
/// writeback), bpftool to inspect loaded programs, libpcap and tcpdump (kstall capture's filters,
/// its pcapng read back).
const APT_PACKAGES: &[&str] = &[
    "llvm-22-dev",
    "libpolly-22-dev",
    "libzstd-dev",
    "iptables",
    // nft, for a native nftables table in a pod's namespace (a capture's rules.txt). Installed
    // only: its service (the host's own ruleset) stays disabled, as the package leaves it.
    "nftables",
    "iproute2",
    "bpftool",
    "curl",
    "bindfs",
    "e2fsprogs",
    // promtool and a real Prometheus and Alertmanager, for the alerting tests.
    "prometheus",
    "prometheus-alertmanager",
    // kstall capture's filters (libpcap, dlopened), and tcpdump reading its pcapng in the tests.
    "libpcap0.8",
    "tcpdump",
];
/// The nightly the eBPF crate was checked with (rustc 1.97, LLVM 22.1).
const PINNED_NIGHTLY: &str = "nightly-2026-05-19";
const BPF_LINKER_VERSION: &str = "0.13.0";
const LLVM_PREFIX: &str = "/usr/lib/llvm-22";

/// Environment the build steps need (which nightly aya-build must use).
pub struct BuildEnv {
    pub ebpf_toolchain: String,
}

impl BuildEnv {
    pub fn apply(&self, cmd: &mut Command) {
        cmd.env("KSTALL_EBPF_TOOLCHAIN", &self.ebpf_toolchain);
    }
}

pub fn run() -> anyhow::Result<BuildEnv> {
    if !Path::new("/sys/kernel/btf/vmlinux").exists() {
        bail!(
            "bootstrap: this kernel has no BTF (/sys/kernel/btf/vmlinux); kstall needs CONFIG_DEBUG_INFO_BTF=y"
        );
    }
    apt_packages()?;
    let ebpf_toolchain = nightly()?;
    bpf_linker()?;
    crate::tools::install()?;
    println!("bootstrap: ready (eBPF toolchain {ebpf_toolchain}, bpf-linker {BPF_LINKER_VERSION})");
    Ok(BuildEnv { ebpf_toolchain })
}

pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

fn apt_packages() -> anyhow::Result<()> {
    apt_install(APT_PACKAGES)
}

/// Installs those of `packages` that are missing.
pub fn apt_install(packages: &[&str]) -> anyhow::Result<()> {
    let missing: Vec<&str> = packages.iter().copied().filter(|p| !dpkg_installed(p)).collect();
    if missing.is_empty() {
        return Ok(());
    }
    if !is_root() {
        bail!("bootstrap: apt packages {} are missing and installing them needs root", missing.join(" "));
    }
    println!("bootstrap: installing apt packages: {}", missing.join(" "));
    run_step(
        Command::new("apt-get").args(["update", "-q"]).env("DEBIAN_FRONTEND", "noninteractive"),
        "apt-get update (no network to the Debian mirror?)",
    )?;
    run_step(
        Command::new("apt-get")
            .args(["install", "-y", "-q", "--no-install-recommends"])
            .args(&missing)
            .env("DEBIAN_FRONTEND", "noninteractive"),
        &format!("apt-get install {}", missing.join(" ")),
    )
}

pub fn dpkg_installed(package: &str) -> bool {
    Command::new("dpkg-query")
        .args(["-W", "-f=${Status}", package])
        .stderr(Stdio::null())
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).contains("install ok installed"))
        .unwrap_or(false)
}

/// Uses the machine's `nightly` when it has one, else installs the pinned nightly; makes sure it
/// has rust-src (aya-build compiles core for the bpf target with `-Z build-std`).
fn nightly() -> anyhow::Result<String> {
    let has = |toolchain: &str| {
        Command::new("rustup")
            .args(["run", toolchain, "rustc", "--version"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .map(|s| s.success())
            .unwrap_or(false)
    };
    let toolchain = if has("nightly") {
        "nightly".to_string()
    } else {
        if !has(PINNED_NIGHTLY) {
            println!("bootstrap: installing Rust {PINNED_NIGHTLY} (for the eBPF programs)");
            run_step(
                Command::new("rustup").args([
                    "toolchain",
                    "install",
                    PINNED_NIGHTLY,
                    "--profile",
                    "minimal",
                    "--component",
                    "rust-src",
                ]),
                "rustup toolchain install (no network to the Rust dist server?)",
            )?;
        }
        PINNED_NIGHTLY.to_string()
    };
    let components = Command::new("rustup")
        .args(["component", "list", "--installed", "--toolchain", &toolchain])
        .output()
        .context("bootstrap: cannot run rustup")?;
    if !String::from_utf8_lossy(&components.stdout).lines().any(|l| l.starts_with("rust-src")) {
        println!("bootstrap: adding rust-src to {toolchain}");
        run_step(
            Command::new("rustup").args(["component", "add", "rust-src", "--toolchain", &toolchain]),
            "rustup component add rust-src",
        )?;
    }
    Ok(toolchain)
}

fn bpf_linker() -> anyhow::Result<()> {
    let version = Command::new("bpf-linker").arg("--version").output();
    if let Ok(out) = &version
        && String::from_utf8_lossy(&out.stdout).contains(BPF_LINKER_VERSION)
    {
        return Ok(());
    }
    println!("bootstrap: building bpf-linker {BPF_LINKER_VERSION} against LLVM 22 (about a minute)");
    // LLVM_SYS_221_PREFIX is for llvm-sys, LLVM_PREFIX for bpf-linker's own build script: without
    // it, it finds Debian's default llvm-config (LLVM 14) and fails to link -lLLVM.
    run_step(
        Command::new("cargo")
            .args([
                "install",
                "bpf-linker",
                "--version",
                BPF_LINKER_VERSION,
                "--no-default-features",
                "--features",
                "llvm-22",
            ])
            .env("LLVM_PREFIX", LLVM_PREFIX)
            .env("LLVM_SYS_221_PREFIX", LLVM_PREFIX),
        "cargo install bpf-linker",
    )
}

/// Runs an install step with its output in target/bootstrap.log, so that a failure is one line
/// here (and the details are in the log).
pub fn run_step(cmd: &mut Command, what: &str) -> anyhow::Result<()> {
    let log_path = crate::build::workspace_root().join("target/bootstrap.log");
    std::fs::create_dir_all(log_path.parent().expect("target dir")).context("bootstrap: create target/")?;
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&log_path)
        .with_context(|| format!("bootstrap: open {}", log_path.display()))?;
    let status = cmd
        .stdout(log.try_clone().context("bootstrap: log")?)
        .stderr(log)
        .status()
        .with_context(|| format!("bootstrap: cannot run {what}"))?;
    if !status.success() {
        bail!("bootstrap: {what} failed ({status}); details in {}", log_path.display());
    }
    Ok(())
}
