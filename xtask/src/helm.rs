//! `cargo xtask helm package`: the chart (deploy/helm/kstall) as target/helm/kstall-<version>.tgz,
//! by the pinned helm (tools.rs), from generated files that are current (deploy.rs).

use std::process::Command;

use anyhow::{Context as _, bail};

use crate::{build, deploy, tools};

pub fn package() -> anyhow::Result<()> {
    tools::install()?;
    deploy::check()?;
    let root = build::workspace_root();
    let out = root.join("target/helm");
    let home = out.join("home");
    std::fs::create_dir_all(&home).with_context(|| format!("helm: create {}", home.display()))?;
    let helm = tools::path(&tools::HELM);
    let output = Command::new(&helm)
        .args(["package", "deploy/helm/kstall", "--destination"])
        .arg(&out)
        .current_dir(&root)
        // helm's caches and configuration in target/, not the user's home.
        .env("HELM_CACHE_HOME", home.join("cache"))
        .env("HELM_CONFIG_HOME", home.join("config"))
        .env("HELM_DATA_HOME", home.join("data"))
        .output()
        .with_context(|| format!("helm: cannot run {}", helm.display()))?;
    if !output.status.success() {
        bail!("helm package: {}", String::from_utf8_lossy(&output.stderr).trim());
    }
    let archive = out.join(format!("kstall-{}.tgz", env!("CARGO_PKG_VERSION")));
    if !archive.is_file() {
        bail!(
            "helm package wrote no {}: {}",
            archive.display(),
            String::from_utf8_lossy(&output.stdout).trim()
        );
    }
    println!("helm: {}", archive.display());
    Ok(())
}
