//! Debian's files in the image. iptables, for `kstall explain pod`'s read of a meshed pod's own
//! NAT rules (agent/src/api/nfs_mesh.rs runs `iptables-nft-save` and `iptables-legacy-save`
//! entered into the pod's network namespace; deploy/components/pod-rules grants what that needs)
//! and a capture's `net/rules.txt` (agent/src/capture/rules.rs); nftables' `nft`, which that file
//! runs too (`nft list ruleset`: the tables made with nft itself, which no iptables-save shows);
//! and libpcap, which `kstall capture` dlopens (`libpcap.so.0.8`, agent/src/capture/filter.rs) to
//! compile a capture's filter (deploy/components/capture grants what capturing needs). Debian's
//! `iptables`, `nftables` and `libpcap0.8` packages of the image's architecture, fetched through
//! apt alone (mmdebstrap's extract variant: the packages and their dependencies unpacked, nothing
//! run, no emulation) and kept in target/image/debian-<arch> until its recipe changes. Staged from
//! it: the two multi-call programs and their `*-save` names and `nft` under /usr/sbin, the xtables
//! extensions they dlopen to print a rule's matches and targets (nft's libxtables too, for
//! iptables-nft's rules), libpcap (dlopened, so named here: it is in no staged file's
//! `DT_NEEDED`), the libraries all these need, and the copyright file of each Debian package a
//! staged file comes from (iptables and nftables are GPL-2: the image then distributes GPL
//! programs, with their notices as Debian ships them).

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context as _, bail};

use crate::{arch::Arch, bootstrap, build};

/// The packages extracted (with their dependencies).
const PACKAGES: &[&str] = &["iptables", "nftables", "libpcap0.8"];

/// The suites the packages come from (the same as the arm64 guests' root).
const SOURCES: &[&str] = &[
    "deb http://deb.debian.org/debian bookworm main",
    "deb http://deb.debian.org/debian bookworm-updates main",
    "deb http://deb.debian.org/debian-security bookworm-security main",
];

/// The programs kstall runs, under /usr/sbin: the Debian package each comes from, its file, and
/// the names nfs_mesh and capture run it by where it is a multi-call program (a link each, as
/// Debian's).
pub const PROGRAMS: &[(&str, &str, &[&str])] = &[
    ("iptables", "xtables-nft-multi", &["iptables-nft-save", "ip6tables-nft-save"]),
    ("iptables", "xtables-legacy-multi", &["iptables-legacy-save", "ip6tables-legacy-save"]),
    ("nftables", "nft", &[]),
];

/// The libraries kstall dlopens, by the name it opens (so not in any staged file's `DT_NEEDED`),
/// and the Debian package each comes from. Staged as files of that name in the image's library
/// directory, with their `DT_NEEDED` closure.
pub const DLOPENED: &[(&str, &str)] = &[("libpcap.so.0.8", "libpcap0.8")];

/// Each library taken from the extracted packages, by its name's start, and the Debian package
/// it comes from (whose copyright file goes with it). A library not listed stops the build: its
/// notice would be missing.
const LIBRARY_PACKAGES: &[(&str, &str)] = &[
    ("libxtables.so", "libxtables12"),
    ("libip4tc.so", "libip4tc2"),
    ("libip6tc.so", "libip6tc2"),
    ("libmnl.so", "libmnl0"),
    ("libnftnl.so", "libnftnl11"),
    ("libnfnetlink.so", "libnfnetlink0"),
    ("libnetfilter_conntrack.so", "libnetfilter-conntrack3"),
    // nft's: libnftables (libmnl, libnftnl and libxtables as above), libedit for its interactive
    // mode (and libedit's libtinfo, libbsd, libmd), libjansson (JSON), libgmp.
    ("libnftables.so", "libnftables1"),
    ("libedit.so", "libedit2"),
    ("libtinfo.so", "libtinfo6"),
    ("libbsd.so", "libbsd0"),
    ("libmd.so", "libmd0"),
    ("libjansson.so", "libjansson4"),
    ("libgmp.so", "libgmp10"),
    // libpcap's: libdbus (its D-Bus capture source), through libsystemd.
    ("libpcap.so", "libpcap0.8"),
    ("libdbus-1.so", "libdbus-1-3"),
    ("libsystemd.so", "libsystemd0"),
    ("libcap.so", "libcap2"),
    ("libgcrypt.so", "libgcrypt20"),
    ("libgpg-error.so", "libgpg-error0"),
    ("liblz4.so", "liblz4-1"),
    ("liblzma.so", "liblzma5"),
    ("libzstd.so", "libzstd1"),
];

/// What [`stage`] put in the image, as paths in it (without the leading `/`): the programs (with
/// the Debian package of each) and the dlopened libraries, for the image's architecture check.
pub struct Staged {
    pub programs: Vec<(String, &'static str)>,
    pub dlopened: Vec<String>,
}

/// Debian's [`PACKAGES`] for `arch`, unpacked (with their dependencies) under target/image: made
/// if missing or made from another recipe.
pub fn extracted(arch: Arch) -> anyhow::Result<PathBuf> {
    let root = build::workspace_root().join(format!("target/image/debian-{}", arch.name()));
    let include = PACKAGES.join(",");
    let recipe = format!("{include}\n{}\n", SOURCES.join("\n"));
    let stamp = root.join("kstall-recipe");
    if std::fs::read_to_string(&stamp).is_ok_and(|made| made == recipe) {
        return Ok(root);
    }
    println!("image: Debian's {include} for {} (mmdebstrap --variant=extract, through apt)", arch.name());
    let making = root.with_extension("new");
    let _ = std::fs::remove_dir_all(&making);
    let _ = std::fs::remove_dir_all(&root);
    // mmdebstrap makes its target but not the directories above it (a clean checkout has no
    // target/image yet: "unable to get absolute path of target directory").
    std::fs::create_dir_all(making.parent().expect("target/image")).context("create target/image")?;
    bootstrap::run_step(
        Command::new("mmdebstrap")
            .args(["--variant=extract", "--mode=root", "--quiet"])
            .arg(format!("--architectures={}", arch.name()))
            .arg(format!("--include={include}"))
            .arg("bookworm")
            .arg(&making)
            .args(SOURCES),
        &format!("mmdebstrap --variant=extract --architectures={} --include={include}", arch.name()),
    )?;
    std::fs::write(making.join("kstall-recipe"), &recipe).context("stamp the extracted packages")?;
    std::fs::rename(&making, &root).context("move the extracted packages into place")?;
    Ok(root)
}

/// Stages iptables, nft and the dlopened libraries from `extracted` into `rootfs` for `arch`, whose
/// agent (with its loader and C library) is staged already.
pub fn stage(extracted: &Path, rootfs: &Path, arch: Arch) -> anyhow::Result<Staged> {
    let dirs = arch.libraries();
    let triple = Path::new(dirs.in_image).file_name().expect("a multiarch directory").to_owned();
    let sbin = rootfs.join("usr/sbin");
    std::fs::create_dir_all(&sbin).context("stage usr/sbin")?;
    let mut elves = Vec::new();
    let mut programs = Vec::new();
    let mut packages = Vec::new();
    for &(package, program, names) in PROGRAMS {
        let here = extracted.join("usr/sbin").join(program);
        std::fs::copy(&here, sbin.join(program)).with_context(|| format!("copy {}", here.display()))?;
        for name in names {
            // Debian's own link: the name must lead to this program there too.
            let link = extracted.join("usr/sbin").join(name);
            let target =
                std::fs::read_link(&link).with_context(|| format!("{} is no link", link.display()))?;
            if target != Path::new(program) {
                bail!("{} leads to {}, not {program}", link.display(), target.display());
            }
            std::os::unix::fs::symlink(program, sbin.join(name)).with_context(|| format!("link {name}"))?;
        }
        elves.push(here);
        programs.push((format!("usr/sbin/{program}"), package));
        if !packages.contains(&package) {
            packages.push(package);
        }
    }
    // libxtables dlopens them from its compiled-in XTABLES_LIBDIR, /usr/lib/<triple>/xtables.
    let modules = Path::new("usr/lib").join(&triple).join("xtables");
    std::fs::create_dir_all(rootfs.join(&modules)).context("stage the xtables modules")?;
    let mut entries: Vec<PathBuf> = std::fs::read_dir(extracted.join(&modules))
        .with_context(|| format!("{} in {}", modules.display(), extracted.display()))?
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "so"))
        .collect();
    entries.sort();
    if entries.is_empty() {
        bail!("no xtables modules in {}", extracted.join(&modules).display());
    }
    for module in entries {
        let name = module.file_name().expect("a file name");
        std::fs::copy(&module, rootfs.join(&modules).join(name))
            .with_context(|| format!("copy {}", module.display()))?;
        elves.push(module);
    }
    // The dlopened libraries, as files of the name kstall opens (Debian's is a link to the
    // versioned file), where the loader looks: the image's library directory.
    let libraries = rootfs.join(dirs.in_image.trim_start_matches('/'));
    let mut dlopened = Vec::new();
    for (name, package) in DLOPENED {
        let here = [extracted.join("usr/lib").join(&triple), extracted.join("lib").join(&triple)]
            .into_iter()
            .map(|dir| dir.join(name))
            .find(|p| p.exists())
            .with_context(|| format!("no {name} in {} (Debian's {package})", extracted.display()))?;
        std::fs::copy(&here, libraries.join(name)).with_context(|| format!("copy {}", here.display()))?;
        elves.push(here);
        dlopened.push(format!("{}/{name}", dirs.in_image.trim_start_matches('/')));
        packages.push(package);
    }
    // Their libraries, from the extracted packages (on amd64 too, where this machine may have
    // others): glibc's are the agent's, staged already, and kept; any other needs its package's
    // notice below.
    let search = [
        extracted.join("usr/lib").join(&triple),
        extracted.join("lib").join(&triple),
        PathBuf::from(dirs.here),
    ];
    for (here, name) in super::needed_libraries(&elves, &search)? {
        let target = libraries.join(&name);
        if target.exists() {
            continue;
        }
        if here.starts_with(extracted) {
            let package = LIBRARY_PACKAGES
                .iter()
                .find(|(prefix, _)| name.starts_with(prefix))
                .map(|(_, package)| *package)
                .with_context(|| {
                    format!("{name} (from {}) has no package in image/debian.rs: its notice", here.display())
                })?;
            if !packages.contains(&package) {
                packages.push(package);
            }
        }
        std::fs::copy(&here, &target).with_context(|| format!("copy {}", here.display()))?;
    }
    for package in packages {
        let copyright = Path::new("usr/share/doc").join(package).join("copyright");
        std::fs::create_dir_all(rootfs.join(copyright.parent().expect("a directory")))
            .context("stage usr/share/doc")?;
        std::fs::copy(extracted.join(&copyright), rootfs.join(&copyright))
            .with_context(|| format!("copy {}", extracted.join(&copyright).display()))?;
    }
    Ok(Staged { programs, dlopened })
}
