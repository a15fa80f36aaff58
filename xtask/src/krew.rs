//! `cargo xtask krew`: the kubectl plugin (deploy/kubectl-kstall) as krew distributes it — one
//! `.tar.gz` per platform in target/krew (the script and a LICENSE, nothing else) and the plugin
//! manifest, deploy/krew/kstall.yaml, written wholly from here with the archives' sha256.
//!
//! The archives are byte for byte reproducible (fixed order, modes, owner and mtime; gzip without
//! a name or a time), so the committed manifest's sha256s are checkable anywhere: a unit test
//! fails when the script, the license or this generator changed and the manifest was not written
//! again. The plugin is a POSIX sh script, so both platforms' archives hold the same bytes; they
//! are two files because a krew platform is one `uri` each.
//!
//! The uris are where a release would publish the archives (`<homepage>/releases/download/v<version>/`);
//! nothing is published there yet. `kubectl krew install --manifest=deploy/krew/kstall.yaml
//! --archive=target/krew/kstall-linux-amd64.tar.gz` installs from the local archive, and
//! tests/tests/krew.rs lays it out as that does.

use std::path::{Path, PathBuf};

use anyhow::{Context as _, bail};

use crate::build;

/// The platforms the manifest offers: krew's `os` and `arch` selector labels.
pub const PLATFORMS: [(&str, &str); 2] = [("linux", "amd64"), ("linux", "arm64")];
const SCRIPT: &str = "deploy/kubectl-kstall";
const MANIFEST: &str = "deploy/krew/kstall.yaml";
const LICENSE_MIT: &str = "LICENSE-MIT";
const LICENSE_APACHE: &str = "LICENSE-APACHE";
const HOMEPAGE: &str = "https://github.com/kstall/kstall";
const COMMAND: &str = "cargo xtask krew";

/// Writes the archives into target/krew and the manifest with their sha256.
pub fn run() -> anyhow::Result<()> {
    let root = build::workspace_root();
    let archives = write_archives(&root)?;
    let manifest = manifest(&archives)?;
    let path = root.join(MANIFEST);
    if std::fs::read_to_string(&path).ok().as_deref() == Some(manifest.as_str()) {
        println!("krew: {MANIFEST} is up to date");
    } else {
        std::fs::create_dir_all(path.parent().expect("a directory"))
            .with_context(|| format!("krew: create the directory of {MANIFEST}"))?;
        std::fs::write(&path, manifest).with_context(|| format!("krew: write {MANIFEST}"))?;
        println!("krew: wrote {MANIFEST}");
    }
    Ok(())
}

/// The archives in target/krew, for the tests (`cargo xtask test`); fails when the committed
/// manifest's sha256s are not theirs.
pub fn archives() -> anyhow::Result<()> {
    let root = build::workspace_root();
    let archives = write_archives(&root)?;
    if std::fs::read_to_string(root.join(MANIFEST)).ok() != Some(manifest(&archives)?) {
        bail!("krew: {MANIFEST} is not written from the archives: run `{COMMAND}`");
    }
    Ok(())
}

/// One built archive: its platform, path and sha256.
struct Archive {
    os: &'static str,
    arch: &'static str,
    path: PathBuf,
    sha256: String,
}

fn write_archives(root: &Path) -> anyhow::Result<Vec<Archive>> {
    let bytes = archive(root)?;
    let dir = root.join("target/krew");
    std::fs::create_dir_all(&dir).with_context(|| format!("krew: create {}", dir.display()))?;
    let mut archives = Vec::new();
    for (os, arch) in PLATFORMS {
        let path = dir.join(file_name(os, arch));
        std::fs::write(&path, &bytes).with_context(|| format!("krew: write {}", path.display()))?;
        let sha256 = crate::tools::sha256(&path)?;
        println!("krew: {} ({} bytes, sha256 {sha256})", path.display(), bytes.len());
        archives.push(Archive { os, arch, path, sha256 });
    }
    Ok(archives)
}

pub fn file_name(os: &str, arch: &str) -> String {
    format!("kstall-{os}-{arch}.tar.gz")
}

/// The `.tar.gz`: `kubectl-kstall` (0755) and `LICENSE` (0644), regular files at the top, owned
/// by 0:0, mtime 0 — what krew's extractor takes (regular files and directories only).
fn archive(root: &Path) -> anyhow::Result<Vec<u8>> {
    let script = std::fs::read(root.join(SCRIPT)).with_context(|| format!("krew: read {SCRIPT}"))?;
    let license = license(root)?;
    let gzip = flate2::GzBuilder::new().mtime(0).write(Vec::new(), flate2::Compression::best());
    let mut tar = tar::Builder::new(gzip);
    for (name, mode, data) in [("kubectl-kstall", 0o755, &script[..]), ("LICENSE", 0o644, license.as_bytes())]
    {
        let mut header = tar::Header::new_ustar();
        header.set_path(name).context("krew: an archive path")?;
        header.set_size(data.len() as u64);
        header.set_mode(mode);
        header.set_uid(0);
        header.set_gid(0);
        header.set_mtime(0);
        header.set_entry_type(tar::EntryType::Regular);
        header.set_cksum();
        tar.append(&header, data).context("krew: write the archive")?;
    }
    let gzip = tar.into_inner().context("krew: finish the archive")?;
    gzip.finish().context("krew: finish the archive's gzip")
}

/// kstall's licenses as one file (krew's manifest validator wants a LICENSE among the installed
/// files): the choice, then each text.
fn license(root: &Path) -> anyhow::Result<String> {
    let read =
        |name: &str| std::fs::read_to_string(root.join(name)).with_context(|| format!("krew: read {name}"));
    Ok(format!(
        "kstall is licensed under either of the Apache License, Version 2.0 or the MIT license, at\n\
         your option (SPDX: MIT OR Apache-2.0). Both texts follow.\n\n\
         ==> {LICENSE_MIT} <==\n{}\n==> {LICENSE_APACHE} <==\n{}",
        read(LICENSE_MIT)?,
        read(LICENSE_APACHE)?
    ))
}

/// The manifest, krew-index's `plugins/kstall.yaml`, for `archives` (one per platform).
fn manifest(archives: &[Archive]) -> anyhow::Result<String> {
    let version = format!("v{}", env!("CARGO_PKG_VERSION"));
    let mut platforms = String::new();
    for archive in archives {
        let file = archive.path.file_name().and_then(|n| n.to_str()).context("krew: an archive's name")?;
        platforms.push_str(&format!(
            "    - selector:\n        matchLabels:\n          os: {}\n          arch: {}\n      \
             uri: {HOMEPAGE}/releases/download/{version}/{file}\n      sha256: {}\n      \
             bin: kubectl-kstall\n      files:\n        - from: kubectl-kstall\n          to: .\n        \
             - from: LICENSE\n          to: .\n",
            archive.os, archive.arch, archive.sha256
        ));
    }
    Ok(format!(
        "# kstall's krew plugin manifest (krew-index's plugins/kstall.yaml), written by `{COMMAND}`\n\
         # with the sha256 of the archives it builds in target/krew. Do not edit: change {SCRIPT}\n\
         # or the generator (xtask/src/krew.rs), then run it. The uris are where a release would\n\
         # publish the archives; nothing is published yet. From a local archive:\n\
         #   kubectl krew install --manifest=deploy/krew/kstall.yaml \\\n\
         #     --archive=target/krew/kstall-linux-amd64.tar.gz\n\
         apiVersion: krew.googlecontainertools.github.com/v1alpha2\n\
         kind: Plugin\n\
         metadata:\n  name: kstall\n\
         spec:\n  version: {version}\n  homepage: {HOMEPAGE}\n  \
         shortDescription: Ask kstall's node agents why pods stall\n  \
         description: |\n    \
         kstall is an eBPF node agent that names what stalls pods and nodes (NFS behind a dead mesh\n    \
         sidecar, hung tasks, OOM kills, kubelet trouble) with the pod it hits. This plugin asks\n    \
         the agents from kubectl: every node's incidents in one table through the API server's pod\n    \
         proxy, or kstall's own commands (trace, explain, incidents, status) run in the agent on\n    \
         the node of a pod or a named node.\n  \
         caveats: |\n    \
         Needs kstall's agents in the cluster (namespace kstall, or set KSTALL_NAMESPACE):\n    \
         helm install or kubectl apply -k, see {HOMEPAGE}.\n    \
         incidents --all-nodes needs get on pods/proxy in that namespace; the other\n    \
         commands need create on pods/exec.\n  \
         platforms:\n{platforms}"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The archive as `cargo xtask krew` builds it, hashed in a directory of the test's own.
    fn built() -> Vec<Archive> {
        let root = build::workspace_root();
        let bytes = archive(&root).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("archive.tar.gz");
        std::fs::write(&path, &bytes).unwrap();
        let sha256 = crate::tools::sha256(&path).unwrap();
        PLATFORMS
            .iter()
            .map(|&(os, arch)| Archive {
                os,
                arch,
                path: PathBuf::from(file_name(os, arch)),
                sha256: sha256.clone(),
            })
            .collect()
    }

    #[test]
    fn the_committed_manifest_is_what_the_generator_writes_for_the_archives() {
        let committed = std::fs::read_to_string(build::workspace_root().join(MANIFEST)).unwrap_or_default();
        assert!(
            committed == manifest(&built()).unwrap(),
            "{MANIFEST} is not written from the archives: run `{COMMAND}`"
        );
    }

    #[test]
    fn an_archive_is_the_same_bytes_every_time() {
        let root = build::workspace_root();
        assert_eq!(archive(&root).unwrap(), archive(&root).unwrap());
        let bytes = archive(&root).unwrap();
        // gzip's header: no name, no time.
        assert_eq!(&bytes[..4], &[0x1f, 0x8b, 8, 0], "magic, deflate, no flags");
        assert_eq!(&bytes[4..8], &[0, 0, 0, 0], "mtime 0");
    }
}
