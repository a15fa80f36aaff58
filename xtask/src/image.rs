//! `cargo xtask image`: the agent's container image, from what this machine can reach (no base
//! image from a registry). It stages a build context — the release binary and the shared
//! libraries it links, Debian's iptables, nftables' nft and libpcap (image/debian.rs), nothing
//! else: no shell, no package manager — and builds it with
//! `podman build` from `deploy/image/Containerfile`, the same file a user builds with
//! `docker build` or `podman build` from that context. Then it saves the image as an OCI archive
//! (`target/image/kstall-<version>.oci.tar`, for `podman load`, `ctr images import` or a push) and
//! prints its size.

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context as _, bail};

use crate::{
    arch::{Arch, Arches},
    bootstrap, build,
};

mod debian;
mod oci;

/// What building and running the image needs: podman (its pause image needs catatonit), runc
/// (crun refuses this machine's hybrid cgroups), setcap, mmdebstrap (each architecture's Debian
/// iptables, nftables and libpcap, image/debian.rs); openssl for the container tests' API server
/// certificate.
pub const IMAGE_PACKAGES: &[&str] = &["podman", "runc", "catatonit", "libcap2-bin", "mmdebstrap", "openssl"];
pub const VERSION: &str = env!("CARGO_PKG_VERSION");
/// The name the kustomize base deploys (`images:` in deploy/base/kustomization.yaml).
pub const NAME: &str = "localhost/kstall";
const SOURCE: &str = "https://github.com/kstall/kstall";
/// deploy/components/non-root's capability list, as file capabilities: permitted only, which the
/// agent makes effective itself (`kernel::raise_permitted_capabilities`); with the effective bit
/// the kernel would refuse to exec the binary wherever one of them is missing from the bounding
/// set. SYS_RESOURCE only serves kernels before 5.11.
const FILE_CAPABILITIES: &str = "cap_bpf,cap_perfmon,cap_syslog,cap_sys_ptrace,cap_dac_read_search+p";

pub fn run(arches: Arches) -> anyhow::Result<()> {
    let env = bootstrap::run()?;
    bootstrap::apt_install(IMAGE_PACKAGES)?;
    let arches = arches.list();
    for &arch in &arches {
        build::release_for(&env, arch)?;
    }
    let image = build_image(&arches)?;
    if let Some((tag, size_bytes)) = &image.local {
        println!("image: {tag} ({})", human_bytes(*size_bytes));
    }
    println!(
        "image: OCI archive {} ({}), an index of {}",
        image.archive.display(),
        human_bytes(image.archive_bytes),
        arches.iter().map(|a| format!("linux/{}", a.name())).collect::<Vec<_>>().join(" and ")
    );
    Ok(())
}

pub struct Image {
    /// This machine's image, when built: its name in podman's storage (the one the kustomize base
    /// deploys) and its size.
    pub local: Option<(String, u64)>,
    /// Every architecture's image as one OCI image index.
    pub archive: PathBuf,
    pub archive_bytes: u64,
}

/// Stages a context per architecture and builds and saves the images from the release binaries
/// already built: each `NAME:VERSION-<arch>` in podman's storage (this machine's also
/// `NAME:VERSION`), all of them in one OCI archive whose index names each one's platform. Then
/// reads the archive back: each platform's manifest must hold that architecture's binary.
pub fn build_image(arches: &[Arch]) -> anyhow::Result<Image> {
    let root = build::workspace_root();
    let out = root.join("target/image");
    let tag = format!("{NAME}:{VERSION}");
    let revision = git_revision(&root);
    let mut layouts = Vec::new();
    for &arch in arches {
        let context = out.join(format!("context-{}", arch.name()));
        let binary = build::release_binary_for(arch);
        let debian = debian::extracted(arch)?;
        let staged = stage(&binary, &debian, &context, arch)?;
        let arch_tag = format!("{tag}-{}", arch.name());
        println!("==> podman build {arch_tag} (revision {revision})");
        let mut build = podman();
        // FROM scratch and COPY only: another architecture's image builds without emulating it.
        build
            .args(["build", "--format", "oci", "--platform", &format!("linux/{}", arch.name())])
            .args(["--tag", &arch_tag])
            .args(["--build-arg", &format!("VERSION={VERSION}")])
            .args(["--build-arg", &format!("REVISION={revision}")])
            .args(["--build-arg", &format!("SOURCE={SOURCE}")])
            .arg("--file")
            .arg(root.join("deploy/image/Containerfile"))
            .arg(&context);
        if arch.is_host() {
            build.args(["--tag", &tag]);
        }
        run_checked(&mut build, "podman build")?;
        let layout = out.join(format!("oci-{}", arch.name()));
        let _ = std::fs::remove_dir_all(&layout);
        run_checked(
            podman().args(["save", "--format", "oci-dir", "--output"]).arg(&layout).arg(&arch_tag),
            "podman save",
        )?;
        layouts.push((arch, layout, context.join("rootfs"), staged));
    }
    let local = if arches.iter().any(|a| a.is_host()) {
        let size = podman().args(["image", "inspect", "--format", "{{.Size}}", &tag]).output()?;
        let size =
            String::from_utf8_lossy(&size.stdout).trim().parse().context("podman image inspect: size")?;
        Some((tag.clone(), size))
    } else {
        None
    };
    let archive = out.join(format!("kstall-{VERSION}.oci.tar"));
    oci::write_index(
        &layouts.iter().map(|(a, l, _, _)| (*a, l.as_path())).collect::<Vec<_>>(),
        &tag,
        &archive,
    )?;
    for (arch, _, rootfs, staged) in &layouts {
        let held = oci::binary_of(&archive, *arch, "usr/bin/kstall", &out.join("check"))?;
        let machine = elf_machine(&held)?;
        let same = std::fs::read(&held).context("the image's binary")?
            == std::fs::read(rootfs.join("usr/bin/kstall")).context("staged")?;
        if machine != arch.elf_machine() || !same {
            bail!(
                "the image's linux/{} manifest holds a {machine} kstall that is not {} stripped",
                arch.name(),
                build::release_binary_for(*arch).display()
            );
        }
        println!(
            "image: linux/{} holds /usr/bin/kstall ({machine}): {} stripped",
            arch.name(),
            build::release_binary_for(*arch).display()
        );
        // Debian's too: this architecture's programs (iptables', nft) and dlopened libraries
        // (libpcap), as staged from its packages.
        let debian = staged
            .programs
            .iter()
            .map(|(p, package)| (p, *package))
            .chain(staged.dlopened.iter().map(|l| (l, "libpcap")));
        for (file, package) in debian {
            let held = oci::binary_of(&archive, *arch, file, &out.join("check"))?;
            let machine = elf_machine(&held)?;
            let same = std::fs::read(&held).with_context(|| format!("the image's /{file}"))?
                == std::fs::read(rootfs.join(file)).context("staged")?;
            if machine != arch.elf_machine() || !same {
                bail!(
                    "the image's linux/{} manifest holds a {machine} /{file} that is not Debian's {} one",
                    arch.name(),
                    arch.name()
                );
            }
            println!(
                "image: linux/{} holds /{file} ({machine}): Debian's {package} for {}",
                arch.name(),
                arch.name()
            );
        }
    }
    let archive_bytes = std::fs::metadata(&archive).context("the saved archive")?.len();
    Ok(Image { local, archive, archive_bytes })
}

/// The context's `rootfs/` becomes the image's `/`: the binary at /usr/bin/kstall (so
/// `kubectl exec ... kstall status` finds it on PATH), its dynamic loader and each library it
/// needs, at their paths; then Debian's iptables, for explain pod's read of a pod's NAT rules (and a
/// capture's), nftables' nft, for a capture's read of its native nftables tables, and libpcap,
/// which capture dlopens, from `debian` (the extracted packages). Returns what image/debian.rs
/// staged.
fn stage(binary: &Path, debian: &Path, context: &Path, arch: Arch) -> anyhow::Result<debian::Staged> {
    if context.exists() {
        std::fs::remove_dir_all(context).with_context(|| format!("clean {}", context.display()))?;
    }
    let rootfs = context.join("rootfs");
    let bin = rootfs.join("usr/bin/kstall");
    std::fs::create_dir_all(bin.parent().expect("usr/bin")).context("stage usr/bin")?;
    // The symbol table is 4 of the binary's 20 MB and only serves debuggers (a panic's message
    // needs none). The embedded kernel programs are data and keep their BTF; the build id stays.
    run_checked(
        Command::new(arch.binutil("objcopy")).arg("--strip-all").arg(binary).arg(&bin),
        "objcopy --strip-all (binutils)",
    )?;
    // For an agent run as a non-root user (deploy/components/non-root): the kernel grants these
    // on exec. Without effect for root, whose capabilities are the container's.
    run_checked(Command::new("setcap").arg(FILE_CAPABILITIES).arg(&bin), "setcap (libcap2-bin)")?;
    for (here, in_image) in shared_libraries(binary, arch)? {
        let target = rootfs.join(in_image.strip_prefix("/").expect("absolute"));
        std::fs::create_dir_all(target.parent().expect("a directory")).context("stage a library")?;
        // The file itself, not a symlink into the builder's /lib.
        std::fs::copy(&here, &target).with_context(|| format!("copy {}", here.display()))?;
    }
    let staged = debian::stage(debian, &rootfs, arch)?;
    // iptables' programs and nft run by the agent's loader: the same path, staged above.
    for (program, _) in &staged.programs {
        let headers = readelf(&rootfs.join(program), "--program-headers")?;
        let interpreter =
            program_interpreter(&headers).with_context(|| format!("/{program}: no interpreter"))?;
        if !rootfs.join(interpreter.trim_start_matches('/')).exists() {
            bail!("/{program} asks for {interpreter}, which the image does not hold");
        }
    }
    // The agent's dlopen of each finds what the library needs in the image, not on this machine.
    let in_image = [PathBuf::from(arch.libraries().in_image.trim_start_matches('/'))];
    for library in &staged.dlopened {
        resolves_within(&rootfs, Path::new(library), &in_image)?;
    }
    Ok(staged)
}

/// Whether `elf` (a path in the image `rootfs`) would load there: each of its `DT_NEEDED`
/// libraries, and theirs, is a file in one of `dirs` (paths in the image, where the loader looks
/// without an ld.so.cache) — searched in `rootfs` alone, never on this machine. The loader itself
/// is the agent's program interpreter, staged with it. Names the first that is missing.
fn resolves_within(rootfs: &Path, elf: &Path, dirs: &[PathBuf]) -> anyhow::Result<()> {
    let search: Vec<PathBuf> = dirs.iter().map(|d| rootfs.join(d)).collect();
    needed_libraries(&[rootfs.join(elf)], &search)
        .with_context(|| format!("a dlopen of /{} in the image would fail", elf.display()))?;
    Ok(())
}

/// What the binary needs at run time, as `(file here, path in the image)`: its program
/// interpreter (the dynamic loader) and the libraries it and they need, by their `DT_NEEDED`
/// names — read from the ELF, so it works for a binary this machine cannot run.
fn shared_libraries(binary: &Path, arch: Arch) -> anyhow::Result<Vec<(PathBuf, PathBuf)>> {
    let dirs = arch.libraries();
    let headers = readelf(binary, "--program-headers")?;
    let interpreter = program_interpreter(&headers).with_context(|| {
        format!("{} names no program interpreter: is it dynamically linked?", binary.display())
    })?;
    let loader = Path::new(&interpreter).file_name().expect("a file name").to_string_lossy().into_owned();
    let mut libraries = vec![(Path::new(dirs.here).join(&loader), PathBuf::from(&interpreter))];
    for (here, name) in needed_libraries(&[binary.to_path_buf()], &[PathBuf::from(dirs.here)])? {
        libraries.push((here, Path::new(dirs.in_image).join(name)));
    }
    Ok(libraries)
}

/// The libraries `elves` need, and those need, by their `DT_NEEDED` names, as `(file here,
/// name)`: each looked for in `search`, in order. The dynamic loader (`ld-linux-*`, which some
/// libraries name too) is left out: it is the program interpreter.
fn needed_libraries(elves: &[PathBuf], search: &[PathBuf]) -> anyhow::Result<Vec<(PathBuf, String)>> {
    let mut libraries = Vec::new();
    let mut wanted: Vec<(String, PathBuf)> = Vec::new();
    for elf in elves {
        wanted.extend(needed(&readelf(elf, "--dynamic")?).into_iter().map(|n| (n, elf.clone())));
    }
    let mut seen: Vec<String> = Vec::new();
    while let Some((name, by)) = wanted.pop() {
        if seen.contains(&name) || name.starts_with("ld-linux") {
            continue;
        }
        let Some(here) = search.iter().map(|dir| dir.join(&name)).find(|p| p.exists()) else {
            let dirs: Vec<String> = search.iter().map(|d| d.display().to_string()).collect();
            bail!("{} needs {name}, which is not in {}", by.display(), dirs.join(" or "));
        };
        wanted.extend(needed(&readelf(&here, "--dynamic")?).into_iter().map(|n| (n, here.clone())));
        libraries.push((here, name.clone()));
        seen.push(name);
    }
    Ok(libraries)
}

fn readelf(file: &Path, what: &str) -> anyhow::Result<String> {
    let out =
        Command::new("readelf").arg("--wide").arg(what).arg(file).output().context("cannot run readelf")?;
    if !out.status.success() {
        bail!("readelf {what} {} failed: {}", file.display(), String::from_utf8_lossy(&out.stderr).trim());
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// `[Requesting program interpreter: /lib64/ld-linux-x86-64.so.2]` in `readelf -l`.
fn program_interpreter(headers: &str) -> Option<String> {
    let (_, rest) = headers.split_once("[Requesting program interpreter: ")?;
    rest.split_once(']').map(|(path, _)| path.to_string())
}

/// The `(NEEDED) Shared library: [libc.so.6]` lines of `readelf -d`.
fn needed(dynamic: &str) -> Vec<String> {
    dynamic
        .lines()
        .filter(|l| l.contains("(NEEDED)"))
        .filter_map(|l| Some(l.split_once('[')?.1.split_once(']')?.0.to_string()))
        .collect()
}

fn elf_machine(file: &Path) -> anyhow::Result<String> {
    let header = readelf(file, "--file-header")?;
    header
        .lines()
        .find_map(|l| l.trim().strip_prefix("Machine:").map(|m| m.trim().to_string()))
        .with_context(|| format!("{} has no ELF machine", file.display()))
}

fn git_revision(root: &Path) -> String {
    let out = Command::new("git").args(["rev-parse", "HEAD"]).current_dir(root).output();
    let head = out
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string());
    let dirty = Command::new("git")
        .args(["status", "--porcelain", "--untracked-files=no"])
        .current_dir(root)
        .output()
        .is_ok_and(|o| !o.stdout.is_empty());
    match head {
        Some(head) if dirty => format!("{head}-dirty"),
        Some(head) => head,
        None => "unknown".into(),
    }
}

/// podman with this workplace's containers.conf when `CONTAINERS_CONF` is not set already (see
/// [`containers_conf`]).
pub fn podman() -> Command {
    let mut cmd = Command::new("podman");
    if std::env::var_os("CONTAINERS_CONF").is_none() {
        cmd.env("CONTAINERS_CONF", containers_conf());
    }
    cmd
}

/// Debian 12's podman defaults do not run here: crun refuses the hybrid cgroup layout and the
/// default ulimits exceed this sandbox's hard limits. runc and lower limits do.
pub fn containers_conf() -> PathBuf {
    let path = build::workspace_root().join("target/image/containers.conf");
    let text = "[containers]\ndefault_ulimits = [\"nofile=20000:20000\", \"nproc=1000:1000\"]\n\n[engine]\nruntime = \"runc\"\n";
    if std::fs::read_to_string(&path).ok().as_deref() != Some(text) {
        std::fs::create_dir_all(path.parent().expect("target/image")).expect("target/image");
        std::fs::write(&path, text).expect("write containers.conf");
    }
    path
}

fn run_checked(cmd: &mut Command, what: &str) -> anyhow::Result<()> {
    let status = cmd.status().with_context(|| format!("cannot run {what}"))?;
    if !status.success() {
        bail!("{what} failed ({status})");
    }
    Ok(())
}

pub fn human_bytes(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / (1024.0 * 1024.0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_loader_and_the_libraries_come_from_readelf() {
        let headers = "  INTERP  0x000350 0x350 0x350 0x00001c 0x00001c R   0x1\n      \
                       [Requesting program interpreter: /lib/ld-linux-aarch64.so.1]\n";
        assert_eq!(program_interpreter(headers).as_deref(), Some("/lib/ld-linux-aarch64.so.1"));
        assert_eq!(program_interpreter("  LOAD 0x0"), None, "a static binary has none");
        let dynamic = " 0x0000000000000001 (NEEDED)             Shared library: [libgcc_s.so.1]\n \
                       0x0000000000000001 (NEEDED)             Shared library: [libc.so.6]\n \
                       0x000000000000000e (SONAME)             Library soname: [libx.so.1]\n";
        assert_eq!(needed(dynamic), ["libgcc_s.so.1", "libc.so.6"]);
    }

    /// The check that a dlopened library loads in the image's root, on a real ELF (this test's
    /// own binary, which needs libc.so.6 and more): refused, naming the missing library, until
    /// its whole closure is in the root's library directory, looked for there and nowhere else.
    #[test]
    fn a_dlopened_library_loads_only_with_its_closure_in_the_image() {
        let arch = Arch::ALL.into_iter().find(|a| a.is_host()).expect("this machine's architecture");
        let dirs = arch.libraries();
        let root = tempfile::tempdir().unwrap();
        let lib = PathBuf::from(dirs.in_image.trim_start_matches('/'));
        std::fs::create_dir_all(root.path().join(&lib)).unwrap();
        let elf = lib.join("libtest.so.0");
        std::fs::copy(std::env::current_exe().unwrap(), root.path().join(&elf)).unwrap();
        let closure = needed_libraries(&[root.path().join(&elf)], &[PathBuf::from(dirs.here)]).unwrap();
        assert!(closure.iter().any(|(_, name)| name == "libc.so.6"), "{closure:?}");
        let err =
            format!("{:#}", resolves_within(root.path(), &elf, std::slice::from_ref(&lib)).unwrap_err());
        assert!(err.contains("a dlopen of /") && err.contains(".so"), "{err}");
        // All but one: that one is named.
        let (_, last) = closure.last().unwrap();
        for (here, name) in &closure[..closure.len() - 1] {
            std::fs::copy(here, root.path().join(&lib).join(name)).unwrap();
        }
        let err =
            format!("{:#}", resolves_within(root.path(), &elf, std::slice::from_ref(&lib)).unwrap_err());
        assert!(err.contains(&format!("needs {last}")), "{err}");
        let (here, name) = closure.last().unwrap();
        std::fs::copy(here, root.path().join(&lib).join(name)).unwrap();
        resolves_within(root.path(), &elf, &[lib]).unwrap();
    }
}
