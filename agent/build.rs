//! Builds the kernel programs (`ebpf/`, the pinned nightly, bpf-linker) into OUT_DIR/kstall.
//!
//! `AYA_BUILD_SKIP=1` skips that (for hosts without the eBPF toolchain): an empty object is written
//! instead and the agent then reports every probe as unavailable, "built without eBPF programs".
//! It is explicit, never a silent fallback.
use anyhow::{Context as _, anyhow};

/// The nightly the eBPF crate is built with unless `KSTALL_EBPF_TOOLCHAIN` names another (the
/// bootstrap sets it when it had to install the pinned nightly under its dated name).
const DEFAULT_EBPF_TOOLCHAIN: &str = "nightly";

fn main() -> anyhow::Result<()> {
    let out_dir = std::path::PathBuf::from(std::env::var("OUT_DIR").context("OUT_DIR")?);
    println!("cargo:rerun-if-env-changed=AYA_BUILD_SKIP");
    if matches!(std::env::var("AYA_BUILD_SKIP").as_deref(), Ok("1") | Ok("true")) {
        std::fs::write(out_dir.join("kstall"), []).context("write empty eBPF object")?;
        println!("cargo:rustc-cfg=kstall_no_ebpf");
    }
    println!("cargo::rustc-check-cfg=cfg(kstall_no_ebpf)");
    println!("cargo:rerun-if-env-changed=KSTALL_EBPF_TOOLCHAIN");
    let toolchain =
        std::env::var("KSTALL_EBPF_TOOLCHAIN").unwrap_or_else(|_| DEFAULT_EBPF_TOOLCHAIN.to_string());
    let cargo_metadata::Metadata { packages, .. } =
        cargo_metadata::MetadataCommand::new().no_deps().exec().context("cargo metadata")?;
    let ebpf = packages
        .into_iter()
        .find(|p| p.name.as_str() == "kstall-ebpf")
        .ok_or_else(|| anyhow!("kstall-ebpf package not found"))?;
    let root_dir =
        ebpf.manifest_path.parent().ok_or_else(|| anyhow!("no parent for {}", ebpf.manifest_path))?;
    aya_build::build_ebpf(
        [aya_build::Package { name: ebpf.name.as_str(), root_dir: root_dir.as_str(), ..Default::default() }],
        aya_build::Toolchain::Custom(&toolchain),
    )
}
