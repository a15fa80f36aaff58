//! The cluster's binaries and images, from Debian's packages alone: `src:kubernetes` (the full
//! upstream tree with `vendor/`) built with Debian's Go, kubectl from `kubernetes-client`, and
//! the images no registry can give here (pause, busybox, and busybox with iptables for a mesh's
//! init container) made from Debian's files. Done once per source version; a `done` stamp says
//! it finished.

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context as _, bail};

use super::{SOURCE_VERSION, cache_dir};
use crate::{
    background::Background,
    bootstrap::{self, run_step},
};

/// What building and running the cluster takes from Debian.
const PACKAGES: &[&str] = &[
    "golang-go",
    // Vendored reflect2 1.0.1 crashes under Go >= 1.18 (the first node status patch segfaults).
    "golang-github-modern-go-reflect2-dev",
    "make",
    "rsync",
    "gcc",
    "libc6-dev",
    "dpkg-dev",
    "etcd-server",
    "containerd",
    "runc",
    "containernetworking-plugins",
    "busybox-static",
    "iptables",
    "iproute2",
    "util-linux",
];
const COMMANDS: &[&str] =
    &["cmd/kube-apiserver", "cmd/kubelet", "cmd/kube-controller-manager", "cmd/kube-scheduler"];
const DEB_SRC: &str = "/etc/apt/sources.list.d/kstall-kubernetes-src.sources";
/// The mirrors of this machine's own apt sources, for `apt-get source`.
const DEB_SRC_TEXT: &str = "Types: deb-src\nURIs: http://deb.debian.org/debian\nSuites: bookworm bookworm-updates\n\
Components: main\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n\n\
Types: deb-src\nURIs: http://deb.debian.org/debian-security\nSuites: bookworm-security\nComponents: main\n\
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg\n";

/// Images as the kubelet asks for them (`imagePullPolicy: Never` or a present tag).
pub const PAUSE_IMAGE: &str = "kstall.test/pause:3.2";
pub const BUSYBOX_IMAGE: &str = "kstall.test/busybox:1.35";
pub const IPTABLES_IMAGE: &str = "kstall.test/iptables:1.8.9";

/// A finished build: where its binaries and image archives are.
pub struct Built {
    pub dir: PathBuf,
}

impl Built {
    pub fn at(dir: &Path) -> Self {
        Self { dir: dir.to_path_buf() }
    }
    pub fn bin(&self, name: &str) -> PathBuf {
        self.dir.join("bin").join(name)
    }
    pub fn images(&self) -> Vec<PathBuf> {
        ["pause", "busybox", "iptables"]
            .iter()
            .map(|i| self.dir.join("images").join(format!("{i}.tar")))
            .collect()
    }
    fn stamp(&self) -> PathBuf {
        self.dir.join("done")
    }
}

/// The build, made if missing; a build another process is making is waited for (one lock).
pub fn ensure() -> anyhow::Result<Built> {
    let built = Built::at(&cache_dir());
    std::fs::create_dir_all(&built.dir)
        .with_context(|| format!("cluster: create {}", built.dir.display()))?;
    let _lock = Lock::take(&built.dir.join("lock"))?;
    if built.stamp().exists() {
        bootstrap::apt_install(PACKAGES)?;
        return Ok(built);
    }
    let started = std::time::Instant::now();
    println!("cluster: building Kubernetes {SOURCE_VERSION} from Debian's source (once; about 10 minutes)");
    fetch_locked(&built.dir)?;
    compile(&built.dir)?;
    images(&built)?;
    std::fs::write(built.stamp(), format!("{SOURCE_VERSION}\n")).context("cluster: write the stamp")?;
    println!("cluster: built in {:.0} s, kept in {}", started.elapsed().as_secs_f64(), built.dir.display());
    Ok(built)
}

/// What needs apt (the packages, the source): done in the foreground, since two apt-gets at
/// once fail on apt's lock.
pub fn fetch() -> anyhow::Result<()> {
    let built = Built::at(&cache_dir());
    std::fs::create_dir_all(&built.dir)
        .with_context(|| format!("cluster: create {}", built.dir.display()))?;
    let _lock = Lock::take(&built.dir.join("lock"))?;
    fetch_locked(&built.dir)
}

fn fetch_locked(dir: &Path) -> anyhow::Result<()> {
    bootstrap::apt_install(PACKAGES)?;
    if Built::at(dir).stamp().exists() {
        return Ok(());
    }
    sources(dir)
}

/// `cargo xtask cluster build` at idle priority (after [`fetch`]: it needs no apt), its output
/// in the cache's build.log.
pub fn spawn_background() -> anyhow::Result<Background> {
    fetch()?;
    Background::start(&["cluster", "build"], cache_dir().join("build.log"), "cluster: the build".into())
}

/// The source package and kubectl's binary package, unpacked.
fn sources(dir: &Path) -> anyhow::Result<()> {
    let src = dir.join("src");
    std::fs::create_dir_all(&src).context("cluster: create src/")?;
    let upstream = SOURCE_VERSION.split('-').next().expect("a version");
    let orig = src.join(format!("kubernetes_{upstream}.orig.tar.gz"));
    if !orig.exists() {
        if !Path::new(DEB_SRC).exists() {
            std::fs::write(DEB_SRC, DEB_SRC_TEXT).with_context(|| format!("cluster: write {DEB_SRC}"))?;
        }
        run_step(
            Command::new("apt-get").args(["update", "-q"]),
            "apt-get update (deb-src for src:kubernetes)",
        )?;
        run_step(
            Command::new("apt-get")
                .args(["source", "--download-only", "-q", &format!("kubernetes={SOURCE_VERSION}")])
                .current_dir(&src),
            "apt-get source kubernetes (no deb-src for bookworm on the Debian mirror?)",
        )?;
    }
    if std::fs::read_dir(&src)?
        .flatten()
        .all(|e| !e.file_name().to_string_lossy().starts_with("kubernetes-client_"))
    {
        run_step(
            Command::new("apt-get")
                .args(["download", "-q", &format!("kubernetes-client={SOURCE_VERSION}")])
                .current_dir(&src),
            "apt-get download kubernetes-client",
        )?;
    }
    let tree = tree(dir);
    if !tree.exists() {
        run_step(Command::new("tar").arg("xzf").arg(&orig).current_dir(&src), "unpack src:kubernetes")?;
    }
    // kubectl of the same version, from its binary package (another kubectl may own /usr/bin).
    let client = std::fs::read_dir(&src)?
        .flatten()
        .map(|e| e.path())
        .find(|p| p.file_name().is_some_and(|n| n.to_string_lossy().starts_with("kubernetes-client_")))
        .context("cluster: kubernetes-client's .deb is missing")?;
    let unpacked = dir.join("kubernetes-client");
    run_step(Command::new("dpkg-deb").arg("-x").arg(&client).arg(&unpacked), "unpack kubernetes-client")?;
    std::fs::create_dir_all(dir.join("bin")).context("cluster: create bin/")?;
    std::fs::copy(unpacked.join("usr/bin/kubectl"), dir.join("bin/kubectl"))
        .context("cluster: copy kubectl")?;
    Ok(())
}

fn tree(dir: &Path) -> PathBuf {
    let upstream = SOURCE_VERSION.split('-').next().expect("a version");
    let version = upstream.rsplit("really").next().expect("a version");
    dir.join("src").join(format!("kubernetes-{version}"))
}

/// The four server binaries, one compile at a time (two cores; the tests run beside it).
fn compile(dir: &Path) -> anyhow::Result<()> {
    let tree = tree(dir);
    let reflect2 = tree.join("vendor/github.com/modern-go/reflect2");
    if !reflect2.join("go_above_118.go").exists() {
        for entry in std::fs::read_dir(&reflect2).context("cluster: vendor/reflect2")?.flatten() {
            let path = entry.path();
            if path.extension().is_some_and(|e| e == "go" || e == "s") {
                std::fs::remove_file(&path)?;
            }
        }
        let debian = Path::new("/usr/share/gocode/src/github.com/modern-go/reflect2");
        for entry in std::fs::read_dir(debian).context("cluster: Debian's reflect2")?.flatten() {
            let path = entry.path();
            if path.extension().is_some_and(|e| e == "go" || e == "s") {
                std::fs::copy(&path, reflect2.join(entry.file_name()))?;
            }
        }
    }
    let go = |cmd: &mut Command| {
        cmd.current_dir(&tree)
            .env("HOME", dir.join("home"))
            .env("GOMAXPROCS", "1")
            .env("GOPROXY", "off")
            .env("CGO_ENABLED", "0")
            .env("KUBE_GIT_VERSION", "v1.20.2")
            .env("KUBE_GIT_MAJOR", "1")
            .env("KUBE_GIT_MINOR", "20")
            .env("KUBE_GIT_TREE_STATE", "archive");
    };
    std::fs::create_dir_all(dir.join("home"))?;
    // Not in the release tarball.
    if !tree.join("pkg/generated/openapi/zz_generated.openapi.go").exists() {
        let mut cmd = Command::new("make");
        cmd.arg("gen_openapi");
        go(&mut cmd);
        run_step(&mut cmd, "make gen_openapi (src:kubernetes)")?;
    }
    for command in COMMANDS {
        let name = Path::new(command).file_name().expect("a name");
        if dir.join("bin").join(name).exists() {
            continue;
        }
        let started = std::time::Instant::now();
        let mut cmd = Command::new("hack/make-rules/build.sh");
        cmd.arg(command);
        go(&mut cmd);
        run_step(&mut cmd, &format!("build {command}"))?;
        std::fs::copy(tree.join("_output/local/bin/linux/amd64").join(name), dir.join("bin").join(name))
            .with_context(|| format!("cluster: copy {command}"))?;
        println!("cluster: built {command} in {:.0} s", started.elapsed().as_secs_f64());
    }
    Ok(())
}

/// pause (from the tree's own pause.c), busybox, and busybox with iptables, as docker archives
/// `ctr images import` takes.
fn images(built: &Built) -> anyhow::Result<()> {
    let out = built.dir.join("images");
    std::fs::create_dir_all(&out)?;
    let work = tempfile_dir(&built.dir.join("image-work"))?;

    let pause = work.join("pause");
    std::fs::create_dir_all(&pause)?;
    run_step(
        Command::new("gcc")
            .args(["-O2", "-static", "-o"])
            .arg(pause.join("pause"))
            .arg(tree(&built.dir).join("build/pause/linux/pause.c")),
        "compile pause",
    )?;
    archive(PAUSE_IMAGE, &pause, &["/pause"], &out.join("pause.tar"), &work)?;

    let busybox = work.join("busybox");
    busybox_root(&busybox)?;
    archive(BUSYBOX_IMAGE, &busybox, &["/bin/sh"], &out.join("busybox.tar"), &work)?;

    // A mesh's init container: busybox and Debian's iptables with what it loads.
    let iptables = work.join("iptables");
    busybox_root(&iptables)?;
    copy_with_libraries(&iptables, Path::new("/usr/sbin/xtables-nft-multi"))?;
    copy_with_libraries(&iptables, Path::new("/usr/sbin/xtables-legacy-multi"))?;
    for dir in ["/usr/lib/x86_64-linux-gnu/xtables"] {
        for entry in std::fs::read_dir(dir).with_context(|| format!("cluster: {dir}"))?.flatten() {
            copy_with_libraries(&iptables, &entry.path())?;
        }
    }
    for (name, target) in [("iptables", "xtables-nft-multi"), ("iptables-legacy", "xtables-legacy-multi")] {
        std::os::unix::fs::symlink(format!("/usr/sbin/{target}"), iptables.join("usr/sbin").join(name))?;
    }
    archive(IPTABLES_IMAGE, &iptables, &["/bin/sh"], &out.join("iptables.tar"), &work)?;
    std::fs::remove_dir_all(&work)?;
    Ok(())
}

fn tempfile_dir(path: &Path) -> anyhow::Result<PathBuf> {
    let _ = std::fs::remove_dir_all(path);
    std::fs::create_dir_all(path)?;
    Ok(path.to_path_buf())
}

fn busybox_root(root: &Path) -> anyhow::Result<()> {
    for d in ["bin", "tmp", "etc", "usr/sbin", "proc", "sys", "dev"] {
        std::fs::create_dir_all(root.join(d))?;
    }
    std::fs::copy("/bin/busybox", root.join("bin/busybox")).context("cluster: busybox-static")?;
    for applet in [
        "sh", "ls", "cat", "echo", "sleep", "date", "hostname", "ps", "true", "false", "env", "nc", "kill",
        "head", "dd", "wc", "grep", "seq",
    ] {
        std::os::unix::fs::symlink("busybox", root.join("bin").join(applet))?;
    }
    std::fs::write(root.join("etc/passwd"), "root:x:0:0:root:/:/bin/sh\n")?;
    std::fs::write(root.join("etc/group"), "root:x:0:\n")?;
    Ok(())
}

/// `file` at the same path under `root`, and the shared libraries it loads (ldd's list).
fn copy_with_libraries(root: &Path, file: &Path) -> anyhow::Result<()> {
    let ldd = Command::new("ldd").arg(file).output().context("cluster: ldd")?;
    let mut files = vec![file.to_path_buf()];
    for line in String::from_utf8_lossy(&ldd.stdout).lines() {
        let path = line.split("=>").last().unwrap_or(line).split_whitespace().next().unwrap_or("");
        if path.starts_with('/') {
            files.push(PathBuf::from(path));
        }
    }
    for file in files {
        let target = root.join(file.strip_prefix("/").expect("absolute"));
        if target.exists() {
            continue;
        }
        std::fs::create_dir_all(target.parent().expect("a directory"))?;
        std::fs::copy(&file, &target).with_context(|| format!("cluster: copy {}", file.display()))?;
    }
    Ok(())
}

/// A one-layer docker archive of `root` named `name`.
fn archive(name: &str, root: &Path, entrypoint: &[&str], out: &Path, work: &Path) -> anyhow::Result<()> {
    let layer = work.join("layer.tar");
    run_step(
        Command::new("tar")
            .arg("-C")
            .arg(root)
            .args(["--numeric-owner", "--owner=0", "--group=0", "--sort=name", "--mtime=@0", "-cf"])
            .arg(&layer)
            .arg("."),
        "tar an image layer",
    )?;
    let digest = Command::new("sha256sum").arg(&layer).output().context("cluster: sha256sum")?;
    let digest = String::from_utf8_lossy(&digest.stdout).split_whitespace().next().unwrap_or("").to_string();
    if digest.len() != 64 {
        bail!("cluster: sha256sum of an image layer failed");
    }
    let config = serde_json::json!({
        "architecture": "amd64", "os": "linux",
        "config": {"Entrypoint": entrypoint, "Env": ["PATH=/bin:/usr/sbin:/usr/bin"], "WorkingDir": "/"},
        "rootfs": {"type": "layers", "diff_ids": [format!("sha256:{digest}")]},
    });
    std::fs::write(work.join("config.json"), config.to_string())?;
    let manifest =
        serde_json::json!([{"Config": "config.json", "RepoTags": [name], "Layers": ["layer.tar"]}]);
    std::fs::write(work.join("manifest.json"), manifest.to_string())?;
    run_step(
        Command::new("tar").arg("-C").arg(work).arg("-cf").arg(out).args([
            "manifest.json",
            "config.json",
            "layer.tar",
        ]),
        "tar an image",
    )?;
    std::fs::remove_file(&layer)?;
    Ok(())
}

/// An exclusive lock on a file, held until dropped: one build at a time.
struct Lock(std::fs::File);

impl Lock {
    fn take(path: &Path) -> anyhow::Result<Self> {
        use std::os::fd::AsRawFd as _;
        let file = std::fs::File::create(path).with_context(|| format!("cluster: {}", path.display()))?;
        // SAFETY: flock on a descriptor this owns.
        if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX) } != 0 {
            bail!("cluster: cannot lock {}", path.display());
        }
        Ok(Self(file))
    }
}

impl Drop for Lock {
    fn drop(&mut self) {
        use std::os::fd::AsRawFd as _;
        // SAFETY: unlocking the descriptor this owns.
        unsafe { libc::flock(self.0.as_raw_fd(), libc::LOCK_UN) };
    }
}
