//! The test module that causes a real soft lockup in the kernel-matrix VMs
//! (`tests/lockup-module`), built once per kernel against that kernel's Debian headers.
//!
//! Built in a chroot of the Debian release the kernel comes from (mmdebstrap): the headers need
//! that release's compiler (5.10: gcc-10, 7.3: gcc-14) and their build tools (objtool, modpost)
//! are linked against its C library, which this machine's may be older than. The chroot is thrown
//! away; the module is kept in `target/vm/lockup-module/<version>/` until its source changes.

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context as _, bail};

use crate::{bootstrap, build};

const MODULE: &str = "kstall_spin.ko";
const SOURCES: [&str; 2] = ["kstall_spin.c", "Kbuild"];

/// Where the guest finds the module of kernel `version` (the guest script derives the same path
/// from its output directory).
fn path(vm_dir: &Path, version: &str) -> PathBuf {
    vm_dir.join("lockup-module").join(version).join(MODULE)
}

/// Builds the module for kernel `version` unless it is up to date; `release` is the Debian suite
/// the kernel's headers are in and `sources` the apt lines that reach them.
pub fn build(vm_dir: &Path, version: &str, release: &str, sources: &[&str]) -> anyhow::Result<()> {
    let source_dir = build::workspace_root().join("tests/lockup-module");
    let module = path(vm_dir, version);
    if is_newer_than_sources(&module, &source_dir) {
        return Ok(());
    }
    let dir = module.parent().expect("module directory");
    let root = dir.join("root");
    let _ = std::fs::remove_dir_all(&root);
    std::fs::create_dir_all(dir).with_context(|| format!("create {}", dir.display()))?;
    println!("vm-test: building the soft-lockup test module for {version} in a {release} chroot");
    let headers = format!("linux-headers-{version}");
    // The headers pull in their compiler, not always its assembler (7.3's gcc-14-for-host).
    bootstrap::run_step(
        Command::new("mmdebstrap")
            .args(["--variant=apt", &format!("--include=make,binutils,{headers}"), release])
            .arg(&root)
            .args(sources),
        &format!("mmdebstrap {release} with {headers}"),
    )?;
    let build_dir = root.join("build");
    std::fs::create_dir_all(&build_dir).context("create the chroot's build directory")?;
    for file in SOURCES {
        std::fs::copy(source_dir.join(file), build_dir.join(file)).with_context(|| format!("copy {file}"))?;
    }
    // objtool reads /proc: mounted in a mount namespace of the build's own, gone with it.
    let made = bootstrap::run_step(
        Command::new("unshare").args(["--mount", "--propagation", "private", "sh", "-c"]).arg(format!(
            "mount -t proc proc \"$0/proc\" && exec chroot \"$0\" make -C /usr/src/{headers} M=/build modules"
        )).arg(&root),
        &format!("make the test module against {headers}"),
    );
    let made = made.and_then(|()| {
        std::fs::copy(build_dir.join(MODULE), &module).with_context(|| format!("keep {}", module.display()))
    });
    let removed = std::fs::remove_dir_all(&root).with_context(|| format!("remove {}", root.display()));
    made?;
    removed?;
    if !is_newer_than_sources(&module, &source_dir) {
        bail!("{} is older than its sources after building it", module.display());
    }
    Ok(())
}

fn is_newer_than_sources(module: &Path, source_dir: &Path) -> bool {
    let modified = |p: &Path| std::fs::metadata(p).and_then(|m| m.modified()).ok();
    let Some(built) = modified(module) else { return false };
    SOURCES.iter().all(|f| modified(&source_dir.join(f)).is_some_and(|m| m <= built))
}
