//! The test module that causes a real soft lockup in the kernel-matrix VMs
//! (`tests/lockup-module`), built once per kernel against that kernel's Debian headers.
//!
//! Built in a chroot of the Debian release the kernel comes from (mmdebstrap): the headers need
//! that release's compiler (5.10: gcc-10, 7.3: gcc-14) and their build tools (objtool, modpost)
//! are linked against its C library, which this machine's may be older than. The chroot is thrown
//! away; the module is kept outside the clone, in `/var/cache/kstall/lockup-module/<version>/`
//! beside a copy of the sources it was built from (every clone and CI run on this machine shares
//! it, and a changed source builds anew), and copied into `target/vm/lockup-module/<version>/`.

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

/// Where a built module is kept with the sources it was built from: outside the clone, as the
/// cluster's build is (a clean clone would otherwise spend minutes on a chroot per kernel).
fn cache_dir(version: &str) -> PathBuf {
    Path::new("/var/cache/kstall/lockup-module").join(version)
}

/// Builds the module for kernel `version` unless the cache holds one built from these very
/// sources; `release` is the Debian suite the kernel's headers are in and `sources` the apt lines
/// that reach them.
pub fn build(vm_dir: &Path, version: &str, release: &str, sources: &[&str]) -> anyhow::Result<()> {
    let source_dir = build::workspace_root().join("tests/lockup-module");
    let cache = cache_dir(version);
    if !is_built_from(&cache, &source_dir) {
        build_into(&cache, &source_dir, version, release, sources)?;
    }
    let module = path(vm_dir, version);
    let dir = module.parent().expect("module directory");
    std::fs::create_dir_all(dir).with_context(|| format!("create {}", dir.display()))?;
    std::fs::copy(cache.join(MODULE), &module)
        .with_context(|| format!("copy the module to {}", module.display()))?;
    Ok(())
}

fn build_into(
    cache: &Path,
    source_dir: &Path,
    version: &str,
    release: &str,
    sources: &[&str],
) -> anyhow::Result<()> {
    let root = cache.join("root");
    let _ = std::fs::remove_dir_all(cache);
    std::fs::create_dir_all(cache).with_context(|| format!("create {}", cache.display()))?;
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
    // The sources go in last, from the chroot's copies: they mark the module as built from them.
    let made = made.and_then(|()| {
        std::fs::copy(build_dir.join(MODULE), cache.join(MODULE)).context("keep the module")?;
        SOURCES.iter().try_for_each(|f| {
            std::fs::copy(build_dir.join(f), cache.join(f)).map(drop).with_context(|| format!("keep {f}"))
        })
    });
    let removed = std::fs::remove_dir_all(&root).with_context(|| format!("remove {}", root.display()));
    made?;
    removed?;
    if !is_built_from(cache, source_dir) {
        bail!("{}: the sources changed while the module was built", cache.display());
    }
    Ok(())
}

/// Whether `cache` holds a module built from the sources as they are in `source_dir` now.
fn is_built_from(cache: &Path, source_dir: &Path) -> bool {
    cache.join(MODULE).is_file()
        && SOURCES.iter().all(|f| {
            let kept = std::fs::read(cache.join(f));
            kept.is_ok_and(|kept| std::fs::read(source_dir.join(f)).is_ok_and(|now| now == kept))
        })
}
