//! The arm64 guests' root file system. An amd64 guest shares this machine's root read-only; an
//! arm64 guest needs arm64 programs: a Debian 12 arm64 root made by mmdebstrap (its maintainer
//! scripts run under qemu-user, through binfmt_misc), holding what the scenarios run — the NFS
//! server and client, iptables, iproute2, socat, python3, Prometheus, bpftrace, bpftool, tcpdump and
//! libpcap (kstall capture) — and the matrix's arm64 kernels, their packages unpacked into /boot
//! and /usr/lib/modules (no initramfs: virtme-ng makes its own). Kept in target/vm/root-arm64 until
//! its recipe changes.

use std::{path::PathBuf, process::Command};

use anyhow::{Context as _, bail};

use crate::{arch::Arch, bootstrap};

/// What the scenarios run, beyond Debian's required packages; busybox for virtme-ng's init.
const PACKAGES: &[&str] = &[
    "bash",
    "busybox-static",
    "kmod",
    "procps",
    "util-linux",
    "hostname",
    "iproute2",
    "iptables",
    "nfs-kernel-server",
    "nfs-common",
    "socat",
    "python3",
    "curl",
    "prometheus",
    "bpftrace",
    "bpftool",
    // kstall capture's tests read its packets with tcpdump; the agent dlopens libpcap.so.0.8.
    "tcpdump",
    "libpcap0.8",
];

/// The suites the root and its kernels come from (6.12 from backports, as on amd64).
const SOURCES: &[&str] = &[
    "deb http://deb.debian.org/debian bookworm main",
    "deb http://deb.debian.org/debian bookworm-updates main",
    "deb http://deb.debian.org/debian-security bookworm-security main",
    "deb http://deb.debian.org/debian bookworm-backports main",
];

/// Run by mmdebstrap in the finished root (`$1`), with the kernels' packages after it: a
/// metapackage stands for the kernel it depends on, a `*` for the newest version. Their files
/// go into /usr (the root's /lib is a link to usr/lib, which unpacking over it would replace).
/// virtme-ng's init powers off with `poweroff` and binds over /etc/lvm.
const CUSTOMIZE: &str = r#"set -e
root=$1; shift
names=
for pattern in "$@"; do
    case $pattern in
    *'*'*) regex="^$(printf '%s' "$pattern" | sed 's/[.+]/\\&/g; s/\*/.*/g')\$"
           name=$(chroot "$root" apt-cache search --names-only "$regex" | cut -d' ' -f1 | grep -v -e -unsigned -e -dbg | sort -V | tail -n1) ;;
    *)     name=$(chroot "$root" apt-cache depends "$pattern" | sed -n 's/^ *Depends: \(linux-image-[0-9].*\)/\1/p' | head -n1) ;;
    esac
    [ -n "$name" ] || { echo "no kernel package for $pattern" >&2; exit 1; }
    names="$names $name"
done
mkdir -p "$root/tmp/kernels"
chroot "$root" sh -c "cd /tmp/kernels && apt-get download -q $names"
for deb in "$root"/tmp/kernels/*.deb; do
    rm -rf "$root/tmp/kernels/files"
    dpkg-deb -x "$deb" "$root/tmp/kernels/files"
    cp -a "$root/tmp/kernels/files/boot/." "$root/boot/"
    cp -a "$root/tmp/kernels/files/lib/modules/." "$root/usr/lib/modules/"
done
rm -rf "$root/tmp/kernels"
for version in $(ls "$root/usr/lib/modules"); do depmod -b "$root" "$version"; done
ln -sf /bin/busybox "$root/usr/sbin/poweroff"
mkdir -p "$root/etc/lvm"
"#;

/// The root for `arch`'s guests, made if missing or made from another recipe; `kernels` are the
/// kernel packages to unpack into it.
pub fn ensure(vm_dir: &std::path::Path, arch: Arch, kernels: &[&str]) -> anyhow::Result<PathBuf> {
    let root = vm_dir.join(format!("root-{}", arch.name()));
    let recipe =
        format!("{}\n{}\n{}\n{CUSTOMIZE}", PACKAGES.join(" "), kernels.join(" "), SOURCES.join("\n"));
    let stamp = root.join("etc/kstall-guest-root");
    if std::fs::read_to_string(&stamp).is_ok_and(|made| made == recipe) {
        return Ok(root);
    }
    println!("vm-test: making the {} guests' root file system (mmdebstrap, a few minutes)", arch.name());
    let _binfmt = Binfmt::register(arch)?;
    let making = root.with_extension("new");
    let _ = std::fs::remove_dir_all(&making);
    let _ = std::fs::remove_dir_all(&root);
    let hook = vm_dir.join("guest-root-customize.sh");
    std::fs::write(&hook, CUSTOMIZE).context("write the root's customize hook")?;
    let mut customize = format!("sh {} \"$1\"", hook.display());
    for kernel in kernels {
        customize.push_str(&format!(" '{kernel}'"));
    }
    bootstrap::run_step(
        Command::new("mmdebstrap")
            .args(["--arch", arch.name(), "--variant=required", "--mode=root"])
            .arg(format!("--include={}", PACKAGES.join(",")))
            .arg(format!("--customize-hook={customize}"))
            .arg("bookworm")
            .arg(&making)
            .args(SOURCES),
        &format!("mmdebstrap --arch {} (the guests' root file system)", arch.name()),
    )?;
    std::fs::write(making.join("etc/kstall-guest-root"), &recipe).context("stamp the root")?;
    std::fs::rename(&making, &root).context("move the root into place")?;
    Ok(root)
}

/// qemu-user as the interpreter of `arch`'s binaries while the root is made (mmdebstrap runs its
/// packages' maintainer scripts): registered with binfmt_misc only if it was not, and removed
/// again — with binfmt_misc's mount — when dropped.
struct Binfmt {
    entry: Option<PathBuf>,
    mounted: bool,
}

const BINFMT: &str = "/proc/sys/fs/binfmt_misc";

impl Binfmt {
    fn register(arch: Arch) -> anyhow::Result<Self> {
        let name = match arch {
            Arch::Arm64 => "qemu-aarch64",
            Arch::Amd64 => bail!("amd64 guests share this machine's root"),
        };
        let mut binfmt = Binfmt { entry: None, mounted: false };
        if !std::path::Path::new(BINFMT).join("register").exists() {
            let status = Command::new("mount").args(["-t", "binfmt_misc", "binfmt_misc", BINFMT]).status();
            if !status.is_ok_and(|s| s.success()) {
                bail!("vm-test: cannot mount binfmt_misc on {BINFMT}: qemu-user cannot run arm64 programs");
            }
            binfmt.mounted = true;
        }
        let entry = std::path::Path::new(BINFMT).join(name);
        if !entry.exists() {
            // Debian's qemu-user-binfmt rule, as systemd-binfmt would load it at boot.
            let conf = format!("/usr/lib/binfmt.d/{name}.conf");
            let rule =
                std::fs::read_to_string(&conf).with_context(|| format!("read {conf} (qemu-user-binfmt)"))?;
            let rule =
                rule.lines().find(|l| l.starts_with(':')).with_context(|| format!("no rule in {conf}"))?;
            std::fs::write(std::path::Path::new(BINFMT).join("register"), rule)
                .with_context(|| format!("register {name} with binfmt_misc"))?;
            binfmt.entry = Some(entry);
        }
        Ok(binfmt)
    }
}

impl Drop for Binfmt {
    fn drop(&mut self) {
        if let Some(entry) = &self.entry {
            let _ = std::fs::write(entry, "-1");
        }
        if self.mounted {
            let _ = Command::new("umount").arg(BINFMT).status();
        }
    }
}
