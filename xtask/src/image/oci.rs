//! The multi-architecture OCI archive: each architecture's image as podman saved it (an OCI
//! layout of one manifest), merged into one layout whose `index.json` names an image index with a
//! manifest per platform — what `docker buildx --output type=oci` writes, and what `ctr images
//! import`, `skopeo copy --all` and registries take.

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context as _, bail};
use serde_json::{Value, json};

use crate::arch::Arch;

const INDEX: &str = "application/vnd.oci.image.index.v1+json";
const REF_NAME: &str = "org.opencontainers.image.ref.name";

/// Merges `layouts` (one image each) into `archive`, an OCI layout tarball whose one reference,
/// `tag`, is an image index of every layout's manifest with its platform.
pub fn write_index(layouts: &[(Arch, &Path)], tag: &str, archive: &Path) -> anyhow::Result<()> {
    let merged = archive.with_extension("layout");
    let _ = std::fs::remove_dir_all(&merged);
    let blobs = merged.join("blobs/sha256");
    std::fs::create_dir_all(&blobs).with_context(|| format!("create {}", blobs.display()))?;
    let mut manifests = Vec::new();
    for (arch, layout) in layouts {
        let index = read_json(&layout.join("index.json"))?;
        let [manifest] = index["manifests"].as_array().map(Vec::as_slice).unwrap_or_default() else {
            bail!("{} holds more than one image", layout.display());
        };
        for blob in std::fs::read_dir(layout.join("blobs/sha256")).context("the saved blobs")? {
            let blob = blob?;
            std::fs::copy(blob.path(), blobs.join(blob.file_name())).context("copy a blob")?;
        }
        let mut manifest = manifest.clone();
        manifest.as_object_mut().expect("a descriptor").remove("annotations");
        manifest["platform"] = json!({"architecture": arch.name(), "os": "linux"});
        manifests.push(manifest);
    }
    let image_index = serde_json::to_vec(&json!({
        "schemaVersion": 2,
        "mediaType": INDEX,
        "manifests": manifests,
    }))?;
    let digest = sha256(&image_index)?;
    std::fs::write(blobs.join(&digest), &image_index).context("write the image index")?;
    let top = json!({
        "schemaVersion": 2,
        "manifests": [{
            "mediaType": INDEX,
            "digest": format!("sha256:{digest}"),
            "size": image_index.len(),
            "annotations": {REF_NAME: tag},
        }],
    });
    std::fs::write(merged.join("index.json"), serde_json::to_vec(&top)?).context("write index.json")?;
    std::fs::write(merged.join("oci-layout"), r#"{"imageLayoutVersion":"1.0.0"}"#)
        .context("write oci-layout")?;
    let _ = std::fs::remove_file(archive);
    let tar = Command::new("tar")
        .arg("-C")
        .arg(&merged)
        .arg("-cf")
        .arg(archive)
        .args(["oci-layout", "index.json", "blobs"])
        .status()
        .context("cannot run tar")?;
    std::fs::remove_dir_all(&merged).context("remove the merged layout")?;
    if !tar.success() {
        bail!("tar {} failed ({tar})", archive.display());
    }
    Ok(())
}

/// Reads `path` out of `archive`'s image for `arch`, as a runtime would find it: the reference's
/// image index, its manifest for the platform, the layers. Extracted under `scratch`.
pub fn binary_of(archive: &Path, arch: Arch, path: &str, scratch: &Path) -> anyhow::Result<PathBuf> {
    let _ = std::fs::remove_dir_all(scratch);
    std::fs::create_dir_all(scratch).context("create a scratch directory")?;
    untar(archive, scratch, &[])?;
    let blob = |digest: &Value| -> anyhow::Result<PathBuf> {
        let digest = digest.as_str().context("a descriptor without a digest")?;
        let hex = digest.strip_prefix("sha256:").with_context(|| format!("digest {digest}"))?;
        Ok(scratch.join("blobs/sha256").join(hex))
    };
    let top = read_json(&scratch.join("index.json"))?;
    let index = read_json(&blob(&top["manifests"][0]["digest"])?)?;
    let manifest = index["manifests"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|m| m["platform"]["architecture"] == arch.name() && m["platform"]["os"] == "linux")
        .with_context(|| format!("the image index has no linux/{} manifest", arch.name()))?;
    let manifest = read_json(&blob(&manifest["digest"])?)?;
    let config = read_json(&blob(&manifest["config"]["digest"])?)?;
    if config["architecture"] != arch.name() {
        bail!("the linux/{} manifest's config says {}", arch.name(), config["architecture"]);
    }
    let files = scratch.join("files");
    std::fs::create_dir_all(&files).context("create the layers' directory")?;
    for layer in manifest["layers"].as_array().into_iter().flatten() {
        untar(&blob(&layer["digest"])?, &files, &["--wildcards", "--no-anchored", path])
            .or_else(|e| if e.to_string().contains("Not found") { Ok(()) } else { Err(e) })?;
    }
    let found = files.join(path);
    if !found.exists() {
        bail!("the linux/{} image has no /{path}", arch.name());
    }
    Ok(found)
}

fn untar(archive: &Path, into: &Path, args: &[&str]) -> anyhow::Result<()> {
    let out = Command::new("tar").arg("-xf").arg(archive).arg("-C").arg(into).args(args).output();
    let out = out.context("cannot run tar")?;
    if !out.status.success() {
        bail!("tar -xf {}: {}", archive.display(), String::from_utf8_lossy(&out.stderr).trim());
    }
    Ok(())
}

fn read_json(path: &Path) -> anyhow::Result<Value> {
    let text = std::fs::read(path).with_context(|| format!("read {}", path.display()))?;
    serde_json::from_slice(&text).with_context(|| format!("parse {}", path.display()))
}

fn sha256(bytes: &[u8]) -> anyhow::Result<String> {
    let mut child = Command::new("sha256sum")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .context("cannot run sha256sum")?;
    std::io::Write::write_all(&mut child.stdin.take().expect("piped"), bytes).context("sha256sum's input")?;
    let out = child.wait_with_output().context("sha256sum")?;
    let text = String::from_utf8_lossy(&out.stdout);
    text.split_whitespace().next().map(str::to_string).context("sha256sum printed nothing")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An OCI layout of one image whose layer holds `usr/bin/kstall` with `contents`, as podman
    /// saves one.
    fn layout(dir: &Path, arch: Arch, contents: &str) -> PathBuf {
        let layout = dir.join(arch.name());
        let blobs = layout.join("blobs/sha256");
        std::fs::create_dir_all(&blobs).unwrap();
        let files = dir.join(format!("files-{}", arch.name()));
        std::fs::create_dir_all(files.join("usr/bin")).unwrap();
        std::fs::write(files.join("usr/bin/kstall"), contents).unwrap();
        let layer = dir.join(format!("layer-{}.tar", arch.name()));
        assert!(
            Command::new("tar")
                .arg("-C")
                .arg(&files)
                .arg("-cf")
                .arg(&layer)
                .arg("usr")
                .status()
                .unwrap()
                .success()
        );
        let blob = |bytes: Vec<u8>| {
            let digest = sha256(&bytes).unwrap();
            std::fs::write(blobs.join(&digest), &bytes).unwrap();
            json!({"digest": format!("sha256:{digest}"), "size": bytes.len()})
        };
        let layer = blob(std::fs::read(layer).unwrap());
        let config = blob(serde_json::to_vec(&json!({"architecture": arch.name(), "os": "linux"})).unwrap());
        let manifest = blob(
            serde_json::to_vec(&json!({"schemaVersion": 2, "config": config, "layers": [layer]})).unwrap(),
        );
        let index = json!({"schemaVersion": 2, "manifests": [manifest]});
        std::fs::write(layout.join("index.json"), serde_json::to_vec(&index).unwrap()).unwrap();
        layout
    }

    #[test]
    fn each_platform_of_the_index_leads_to_its_own_binary() {
        let dir = tempfile::tempdir().unwrap();
        let (amd64, arm64) =
            (layout(dir.path(), Arch::Amd64, "x86-64"), layout(dir.path(), Arch::Arm64, "aarch64"));
        let archive = dir.path().join("kstall.oci.tar");
        write_index(&[(Arch::Amd64, &amd64), (Arch::Arm64, &arm64)], "localhost/kstall:0.1.0", &archive)
            .unwrap();
        for (arch, contents) in [(Arch::Amd64, "x86-64"), (Arch::Arm64, "aarch64")] {
            let found = binary_of(&archive, arch, "usr/bin/kstall", &dir.path().join("check")).unwrap();
            assert_eq!(std::fs::read_to_string(found).unwrap(), contents);
        }
        let scratch = dir.path().join("top");
        std::fs::create_dir_all(&scratch).unwrap();
        untar(&archive, &scratch, &[]).unwrap();
        let top = read_json(&scratch.join("index.json")).unwrap();
        assert_eq!(top["manifests"][0]["annotations"][REF_NAME], "localhost/kstall:0.1.0");
        assert_eq!(top["manifests"][0]["mediaType"], INDEX);
    }

    #[test]
    fn a_platform_the_index_lacks_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let amd64 = layout(dir.path(), Arch::Amd64, "x86-64");
        let archive = dir.path().join("kstall.oci.tar");
        write_index(&[(Arch::Amd64, &amd64)], "localhost/kstall:0.1.0", &archive).unwrap();
        let err = binary_of(&archive, Arch::Arm64, "usr/bin/kstall", &dir.path().join("check")).unwrap_err();
        assert_eq!(err.to_string(), "the image index has no linux/arm64 manifest");
    }
}
