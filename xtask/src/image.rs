//! `cargo xtask image`: the agent's container image, from what this machine can reach (no base
//! image from a registry). It stages a build context — the release binary and the shared
//! libraries it links, nothing else: no shell, no package manager — and builds it with
//! `podman build` from `deploy/image/Containerfile`, the same file a user builds with
//! `docker build` or `podman build` from that context. Then it saves the image as an OCI archive
//! (`target/image/kstall-<version>.oci.tar`, for `podman load`, `ctr images import` or a push) and
//! prints its size.

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context as _, bail};

use crate::{bootstrap, build};

/// What building and running the image needs: podman (its pause image needs catatonit), runc
/// (crun refuses this machine's hybrid cgroups), setcap; openssl for the container tests' API
/// server certificate.
pub const IMAGE_PACKAGES: &[&str] = &["podman", "runc", "catatonit", "libcap2-bin", "openssl"];
pub const VERSION: &str = env!("CARGO_PKG_VERSION");
/// The name the kustomize base deploys (`images:` in deploy/base/kustomization.yaml).
pub const NAME: &str = "localhost/kstall";
const SOURCE: &str = "https://github.com/kstall/kstall";
/// deploy/components/non-root's capability list, as file capabilities: permitted only, which the
/// agent makes effective itself (`kernel::raise_permitted_capabilities`); with the effective bit
/// the kernel would refuse to exec the binary wherever one of them is missing from the bounding
/// set. SYS_RESOURCE only serves kernels before 5.11.
const FILE_CAPABILITIES: &str = "cap_bpf,cap_perfmon,cap_syslog,cap_sys_ptrace,cap_dac_read_search+p";

pub fn run() -> anyhow::Result<()> {
    let env = bootstrap::run()?;
    bootstrap::apt_install(IMAGE_PACKAGES)?;
    build::release(&env)?;
    let image = build_image()?;
    println!("image: {} ({})", image.tag, human_bytes(image.size_bytes));
    println!("image: OCI archive {} ({})", image.archive.display(), human_bytes(image.archive_bytes));
    Ok(())
}

pub struct Image {
    pub tag: String,
    pub size_bytes: u64,
    pub archive: PathBuf,
    pub archive_bytes: u64,
}

/// Stages the context and builds and saves the image from the release binary already built.
pub fn build_image() -> anyhow::Result<Image> {
    let root = build::workspace_root();
    let out = root.join("target/image");
    let context = out.join("context");
    stage(&build::release_binary(), &context)?;
    let tag = format!("{NAME}:{VERSION}");
    let revision = git_revision(&root);
    println!("==> podman build {tag} (revision {revision})");
    let mut build = podman();
    build
        .args(["build", "--format", "oci", "--tag", &tag])
        .args(["--build-arg", &format!("VERSION={VERSION}")])
        .args(["--build-arg", &format!("REVISION={revision}")])
        .args(["--build-arg", &format!("SOURCE={SOURCE}")])
        .arg("--file")
        .arg(root.join("deploy/image/Containerfile"))
        .arg(&context);
    run_checked(&mut build, "podman build")?;
    let size = podman().args(["image", "inspect", "--format", "{{.Size}}", &tag]).output()?;
    let size_bytes =
        String::from_utf8_lossy(&size.stdout).trim().parse().context("podman image inspect: size")?;
    let archive = out.join(format!("kstall-{VERSION}.oci.tar"));
    let _ = std::fs::remove_file(&archive);
    run_checked(
        podman().args(["save", "--format", "oci-archive", "--output"]).arg(&archive).arg(&tag),
        "podman save",
    )?;
    let archive_bytes = std::fs::metadata(&archive).context("the saved archive")?.len();
    Ok(Image { tag, size_bytes, archive, archive_bytes })
}

/// The context's `rootfs/` becomes the image's `/`: the binary at /usr/bin/kstall (so
/// `kubectl exec ... kstall status` finds it on PATH) and each library `ldd` names, at its path.
fn stage(binary: &Path, context: &Path) -> anyhow::Result<()> {
    if context.exists() {
        std::fs::remove_dir_all(context).with_context(|| format!("clean {}", context.display()))?;
    }
    let rootfs = context.join("rootfs");
    let bin = rootfs.join("usr/bin/kstall");
    std::fs::create_dir_all(bin.parent().expect("usr/bin")).context("stage usr/bin")?;
    // The symbol table is 4 of the binary's 20 MB and only serves debuggers (a panic's message
    // needs none). The embedded kernel programs are data and keep their BTF.
    run_checked(
        Command::new("objcopy").arg("--strip-all").arg(binary).arg(&bin),
        "objcopy --strip-all (binutils)",
    )?;
    // For an agent run as a non-root user (deploy/components/non-root): the kernel grants these
    // on exec. Without effect for root, whose capabilities are the container's.
    run_checked(Command::new("setcap").arg(FILE_CAPABILITIES).arg(&bin), "setcap (libcap2-bin)")?;
    for library in shared_libraries(binary)? {
        let target = rootfs.join(library.strip_prefix("/").expect("absolute"));
        std::fs::create_dir_all(target.parent().expect("a directory")).context("stage a library")?;
        // The file itself, not a symlink into the builder's /lib.
        std::fs::copy(&library, &target).with_context(|| format!("copy {}", library.display()))?;
    }
    Ok(())
}

/// The absolute paths `ldd` resolves for `binary`, the dynamic loader included.
fn shared_libraries(binary: &Path) -> anyhow::Result<Vec<PathBuf>> {
    let out = Command::new("ldd").arg(binary).output().context("cannot run ldd")?;
    if !out.status.success() {
        bail!("ldd {} failed: {}", binary.display(), String::from_utf8_lossy(&out.stderr).trim());
    }
    let libraries = parse_ldd(&String::from_utf8_lossy(&out.stdout));
    if libraries.is_empty() {
        bail!("ldd named no libraries for {}: is it dynamically linked?", binary.display());
    }
    Ok(libraries)
}

fn parse_ldd(text: &str) -> Vec<PathBuf> {
    text.lines()
        .filter_map(|line| {
            // "libc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x...)" or "/lib64/ld-linux-x86-64.so.2 (0x...)";
            // linux-vdso has no file.
            let path = line.split("=>").last()?.split_whitespace().next()?;
            path.starts_with('/').then(|| PathBuf::from(path))
        })
        .collect()
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
    fn ldd_output_gives_the_files_to_copy() {
        let text = "\tlinux-vdso.so.1 (0x00007ffd)\n\
                    \tlibgcc_s.so.1 => /lib/x86_64-linux-gnu/libgcc_s.so.1 (0x00007f1)\n\
                    \tlibc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x00007f2)\n\
                    \t/lib64/ld-linux-x86-64.so.2 (0x00007f3)\n";
        assert_eq!(
            parse_ldd(text),
            [
                "/lib/x86_64-linux-gnu/libgcc_s.so.1",
                "/lib/x86_64-linux-gnu/libc.so.6",
                "/lib64/ld-linux-x86-64.so.2"
            ]
            .map(PathBuf::from)
        );
    }
}
