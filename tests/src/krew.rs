//! The kubectl plugin as krew sees it: kstall's plugin manifest (deploy/krew/kstall.yaml) and its
//! archives (target/krew, `cargo xtask krew`), checked by krew's own rules for an index manifest
//! and installed as `kubectl krew install --manifest=… --archive=…` lays a plugin out. No krew
//! binary is obtainable here (it is a Go program, and no registry this project reaches carries
//! it), so both are krew's code read and done again, from kubernetes-sigs/krew at db921d5:
//!
//! - [`validate`]: `internal/index/validation/validate.go` (`ValidatePlugin`, what krew checks of
//!   every manifest it reads) and `cmd/validate-krew-manifest/main.go` (what krew-index's CI adds:
//!   the file's name, every platform matching a supported os/arch, no os/arch matched twice, a
//!   license among the installed files);
//! - [`install`]: `internal/installation/install.go` and `move.go` (the platform picked, files
//!   moved per `files`, `$KREW_ROOT/store/<name>/<version>/`, the symlink
//!   `$KREW_ROOT/bin/kubectl-<name>`, the receipt) and `internal/download/downloader.go` (the
//!   sha256 checked, a `.tar.gz` extracted: regular files and directories only, no `..`, no
//!   absolute path).
//!
//! Two things are stricter than krew: a field krew does not know fails the parse (krew ignores
//! it, so a typo would go unnoticed), and `shortDescription` must be at most 50 characters (krew's
//! guide: "a few words", shown in `kubectl krew search`).

use std::{
    collections::BTreeMap,
    io::Read as _,
    path::{Component, Path, PathBuf},
    process::Command,
};

use serde::Deserialize;

use crate::deploy::deploy_dir;

pub const API_VERSION: &str = "krew.googlecontainertools.github.com/v1alpha2";
/// The longest `shortDescription` accepted here.
pub const SHORT_DESCRIPTION_MAX: usize = 50;

/// The committed manifest.
pub fn manifest_path() -> PathBuf {
    deploy_dir().join("krew/kstall.yaml")
}

/// Where `cargo xtask krew` writes the archive for `os`/`arch`.
pub fn archive_path(os: &str, arch: &str) -> PathBuf {
    crate::workspace().join(format!("target/krew/kstall-{os}-{arch}.tar.gz"))
}

/// krew's `index.Plugin`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Plugin {
    #[serde(default)]
    pub api_version: String,
    #[serde(default)]
    pub kind: String,
    #[serde(default)]
    pub metadata: Metadata,
    pub spec: Spec,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Metadata {
    #[serde(default)]
    pub name: String,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Spec {
    #[serde(default)]
    pub version: String,
    #[serde(default)]
    pub short_description: String,
    #[serde(default)]
    pub description: String,
    #[serde(default)]
    pub caveats: String,
    #[serde(default)]
    pub homepage: String,
    #[serde(default)]
    pub platforms: Vec<Platform>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Platform {
    #[serde(default)]
    pub uri: String,
    #[serde(default)]
    pub sha256: String,
    pub selector: Option<Selector>,
    /// `None` (absent) is krew's default, everything to the top: `[{from: "*", to: "."}]`.
    pub files: Option<Vec<FileOperation>>,
    #[serde(default)]
    pub bin: String,
}

/// A Kubernetes label selector, as krew matches it against `{os, arch}`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Selector {
    pub match_labels: Option<BTreeMap<String, String>>,
    pub match_expressions: Option<Vec<Requirement>>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Requirement {
    pub key: String,
    pub operator: String,
    #[serde(default)]
    pub values: Vec<String>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileOperation {
    #[serde(default)]
    pub from: String,
    #[serde(default)]
    pub to: String,
}

/// Every os/arch krew supports (`allPlatforms` of validate-krew-manifest).
pub const KREW_PLATFORMS: [(&str, &str); 11] = [
    ("windows", "386"),
    ("windows", "amd64"),
    ("windows", "arm64"),
    ("linux", "386"),
    ("linux", "amd64"),
    ("linux", "arm"),
    ("linux", "arm64"),
    ("linux", "ppc64le"),
    ("darwin", "386"),
    ("darwin", "amd64"),
    ("darwin", "arm64"),
];

pub fn parse(text: &str) -> Result<Plugin, String> {
    serde_yaml_ng::from_str(text).map_err(|e| format!("failed to parse the manifest: {e}"))
}

/// The manifest file at `path` checked as krew-index's `validate-krew-manifest -skip-install`
/// checks it: its name, [`validate_plugin`], each platform used, none overlapping.
pub fn validate_file(path: &Path) -> Result<Plugin, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let file = path.file_name().and_then(|n| n.to_str()).unwrap_or_default();
    let Some(name) = file.strip_suffix(".yaml") else {
        return Err(format!("expected manifest extension \".yaml\" but found {file:?}"));
    };
    let plugin = parse(&text)?;
    validate(name, &plugin)?;
    Ok(plugin)
}

/// [`validate_plugin`] and what validate-krew-manifest adds to it for the plugin named `name`.
pub fn validate(name: &str, plugin: &Plugin) -> Result<(), String> {
    validate_plugin(name, plugin)?;
    for (i, platform) in plugin.spec.platforms.iter().enumerate() {
        if any_matching_platform(platform).is_none() {
            return Err(format!(
                "spec.platform[{i}]'s selector ({:?}) doesn't match any supported platforms",
                platform.selector
            ));
        }
    }
    for (os, arch) in KREW_PLATFORMS {
        let matching: Vec<usize> = plugin
            .spec
            .platforms
            .iter()
            .enumerate()
            .filter(|(_, p)| selector_matches(p.selector.as_ref(), os, arch))
            .map(|(i, _)| i)
            .collect();
        if matching.len() > 1 {
            return Err(format!(
                "overlapping platform selectors found: multiple spec.platforms (at indexes {matching:?}) have \
                 overlapping selectors that select {os}/{arch}"
            ));
        }
    }
    Ok(())
}

/// krew's `ValidatePlugin(name, p)`, check by check in its order, with its messages; then this
/// project's own: a short description of at most [`SHORT_DESCRIPTION_MAX`] characters, a
/// description and a homepage.
pub fn validate_plugin(name: &str, p: &Plugin) -> Result<(), String> {
    if p.api_version != API_VERSION {
        return Err(format!(
            "plugin manifest has apiVersion={:?}, not supported in this version of krew",
            p.api_version
        ));
    }
    if p.kind != "Plugin" {
        return Err(format!("plugin manifest has kind={:?}, but only \"Plugin\" is supported", p.kind));
    }
    if !is_safe_plugin_name(name) {
        return Err(format!("the plugin name {name:?} is not allowed, must match \"^[\\w-]+$\""));
    }
    if p.metadata.name != name {
        return Err(format!("plugin should be named {name:?}, not {:?}", p.metadata.name));
    }
    let short = &p.spec.short_description;
    if short.is_empty() {
        return Err("should have a short description".into());
    }
    if short.contains(['\r', '\n']) {
        return Err("should not have line breaks in short description".into());
    }
    if p.spec.platforms.is_empty() {
        return Err("should have a platform specified".into());
    }
    if p.spec.version.is_empty() {
        return Err("should have a version specified".into());
    }
    parse_version(&p.spec.version).map_err(|e| format!("failed to parse plugin version: {e}"))?;
    for platform in &p.spec.platforms {
        validate_platform(platform)
            .map_err(|e| format!("platform ({platform:?}) is badly constructed: {e}"))?;
    }
    // This project's own.
    if short.chars().count() > SHORT_DESCRIPTION_MAX {
        return Err(format!(
            "the short description has {} characters, more than {SHORT_DESCRIPTION_MAX}: {short:?}",
            short.chars().count()
        ));
    }
    if p.spec.description.trim().is_empty() {
        return Err("should have a description (krew's guide: required)".into());
    }
    if p.spec.homepage.is_empty() {
        return Err("should have a homepage".into());
    }
    Ok(())
}

/// krew's `IsSafePluginName`: Go's `^[\w-]+$` (ASCII letters, digits, `_`, `-`), and none of
/// Windows' reserved names.
pub fn is_safe_plugin_name(name: &str) -> bool {
    const WINDOWS_FORBIDDEN: [&str; 22] = [
        "CON", "PRN", "AUX", "NUL", "COM1", "COM2", "COM3", "COM4", "COM5", "COM6", "COM7", "COM8", "COM9",
        "LPT1", "LPT2", "LPT3", "LPT4", "LPT5", "LPT6", "LPT7", "LPT8", "LPT9",
    ];
    !name.is_empty()
        && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
        && !WINDOWS_FORBIDDEN.iter().any(|f| f.eq_ignore_ascii_case(name))
}

/// krew's `semver.Parse`: a leading `v`, then a semantic version as Kubernetes'
/// `version.ParseSemantic` reads it (`MAJOR.MINOR.PATCH`, numbers without leading zeros, then
/// an optional `-pre.release` and `+build`).
pub fn parse_version(version: &str) -> Result<(u64, u64, u64), String> {
    let Some(rest) = version.strip_prefix('v') else {
        return Err(format!("version string {version:?} not starting with 'v'"));
    };
    let (core, _build) = rest.split_once('+').map_or((rest, None), |(c, b)| (c, Some(b)));
    let (core, pre) = core.split_once('-').map_or((core, None), |(c, p)| (c, Some(p)));
    let number = |part: &str| -> Result<u64, String> {
        if part.is_empty()
            || !part.bytes().all(|b| b.is_ascii_digit())
            || (part.len() > 1 && part.starts_with('0'))
        {
            return Err(format!("illegal version string {version:?}"));
        }
        part.parse().map_err(|_| format!("illegal version string {version:?}"))
    };
    let parts: Vec<&str> = core.split('.').collect();
    let [major, minor, patch] = parts[..] else {
        return Err(format!("illegal version string {version:?}"));
    };
    let identifiers_ok = |s: &str| {
        s.split('.').all(|id| !id.is_empty() && id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-'))
    };
    if pre.is_some_and(|p| !identifiers_ok(p)) || _build.is_some_and(|b| !identifiers_ok(b)) {
        return Err(format!("illegal version string {version:?}"));
    }
    Ok((number(major)?, number(minor)?, number(patch)?))
}

/// krew's `validatePlatform`.
fn validate_platform(p: &Platform) -> Result<(), String> {
    if p.uri.is_empty() {
        return Err("`uri` has to be set".into());
    }
    if p.sha256.is_empty() {
        return Err("`sha256` sum has to be set".into());
    }
    if !(p.sha256.len() == 64 && p.sha256.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))) {
        return Err(format!("`sha256` value {} is not valid, must match pattern ^[a-f0-9]{{64}}$", p.sha256));
    }
    if p.bin.is_empty() {
        return Err("`bin` has to be set".into());
    }
    if let Some(files) = &p.files {
        if files.is_empty() {
            return Err("`files` is invalid: `files` has to be unspecified or non-empty".into());
        }
        for op in files {
            if op.from.is_empty() {
                return Err("`files` is invalid: `from` field has to be set".into());
            }
            if op.to.is_empty() {
                return Err("`files` is invalid: `to` field has to be set".into());
            }
        }
    }
    validate_selector(p.selector.as_ref()).map_err(|e| format!("invalid platform selector: {e}"))
}

/// krew's `validateSelector`.
fn validate_selector(selector: Option<&Selector>) -> Result<(), String> {
    let Some(sel) = selector else { return Err("nil selector is not supported".into()) };
    let expressions = sel.match_expressions.as_deref().unwrap_or_default();
    if sel.match_labels.is_none() && expressions.is_empty() {
        return Err("empty selector is not supported".into());
    }
    let keys = sel.match_labels.iter().flat_map(|l| l.keys()).chain(expressions.iter().map(|e| &e.key));
    for key in keys {
        if key != "os" && key != "arch" {
            return Err(format!("key {key:?} not supported"));
        }
    }
    if sel.match_labels.as_ref().is_some_and(BTreeMap::is_empty) {
        return Err("`matchLabels` specified but empty".into());
    }
    if sel.match_expressions.as_ref().is_some_and(Vec::is_empty) {
        return Err("`matchExpressions` specified but empty".into());
    }
    Ok(())
}

/// Whether `selector` selects the labels `{os, arch}` (Kubernetes' `LabelSelectorAsSelector` and
/// `Matches`; a selector it cannot convert matches nothing).
pub fn selector_matches(selector: Option<&Selector>, os: &str, arch: &str) -> bool {
    let Some(sel) = selector else { return false };
    let label = |key: &str| match key {
        "os" => Some(os),
        "arch" => Some(arch),
        _ => None,
    };
    let labels_match = sel.match_labels.iter().flatten().all(|(k, v)| label(k) == Some(v.as_str()));
    let expressions_match = sel.match_expressions.iter().flatten().all(|r| {
        let value = label(&r.key);
        match r.operator.as_str() {
            "In" => value.is_some_and(|v| r.values.iter().any(|x| x == v)),
            "NotIn" => !value.is_some_and(|v| r.values.iter().any(|x| x == v)),
            "Exists" => value.is_some(),
            "DoesNotExist" => value.is_none(),
            _ => false,
        }
    });
    labels_match && expressions_match
}

/// The first supported os/arch `platform` selects (validate-krew-manifest's
/// `findAnyMatchingPlatform`).
fn any_matching_platform(platform: &Platform) -> Option<(&'static str, &'static str)> {
    KREW_PLATFORMS.into_iter().find(|(os, arch)| selector_matches(platform.selector.as_ref(), os, arch))
}

/// What [`install`] made.
#[derive(Debug)]
pub struct Installed {
    /// `$KREW_ROOT/store/<name>/<version>`.
    pub store: PathBuf,
    /// `$KREW_ROOT/bin/kubectl-<name>`, a symlink.
    pub link: PathBuf,
    /// `$KREW_ROOT/receipts/<name>.yaml`.
    pub receipt: PathBuf,
}

/// `KREW_ROOT=<krew_root> KREW_OS=<os> KREW_ARCH=<arch> kubectl krew install --manifest=<manifest>
/// --archive=<archive>`, as krew does it: the manifest read and validated (krew's
/// `ReadPluginFromFile`), the first platform whose selector matches os/arch, the archive's sha256
/// checked against it, the archive extracted into a staging directory, `files` moved into a new
/// directory that becomes `store/<name>/<version>`, `bin` linked from `bin/kubectl-<name>` (`-`
/// as `_`) by its absolute path, and the receipt written (index `detached`, as for a manifest
/// given by path). Then validate-krew-manifest's license check.
pub fn install(
    krew_root: &Path,
    manifest: &Path,
    archive: &Path,
    os: &str,
    arch: &str,
) -> Result<Installed, String> {
    let text = std::fs::read_to_string(manifest).map_err(|e| format!("{}: {e}", manifest.display()))?;
    let plugin = parse(&text)?;
    validate_plugin(&plugin.metadata.name, &plugin)
        .map_err(|e| format!("plugin manifest validation error: {e}"))?;
    let name = &plugin.metadata.name;
    let root = std::path::absolute(krew_root).map_err(|e| e.to_string())?;
    let receipt = root.join("receipts").join(format!("{name}.yaml"));
    if receipt.exists() {
        return Err("can't install, the newest version is already installed".into());
    }
    let platform = plugin
        .spec
        .platforms
        .iter()
        .find(|p| selector_matches(p.selector.as_ref(), os, arch))
        .ok_or_else(|| format!("plugin {name:?} does not offer installation for this platform"))?;

    // downloadAndExtract, with the archive given (`--archive`: krew's file fetcher).
    let bytes = std::fs::read(archive).map_err(|e| format!("failed to obtain plugin archive: {e}"))?;
    let sum = sha256(archive)?;
    if sum != platform.sha256 {
        return Err(format!("checksum does not match, want: {}, got {sum}", platform.sha256));
    }
    let staging = tempfile::tempdir().map_err(|e| e.to_string())?;
    extract_tar_gz(staging.path(), &bytes)?;

    // moveToInstallDir.
    let files =
        platform.files.clone().unwrap_or_else(|| vec![FileOperation { from: "*".into(), to: ".".into() }]);
    let install_dir = root.join("store").join(name).join(&plugin.spec.version);
    std::fs::create_dir_all(install_dir.parent().expect("a parent")).map_err(|e| e.to_string())?;
    let tmp = tempfile::tempdir().map_err(|e| e.to_string())?;
    for op in &files {
        for (from, to) in move_targets(staging.path(), tmp.path(), op)? {
            std::fs::create_dir_all(to.parent().expect("a parent")).map_err(|e| e.to_string())?;
            std::fs::rename(&from, &to)
                .map_err(|e| format!("could not rename file from {from:?} to {to:?}: {e}"))?;
        }
    }
    let tmp = tmp.keep();
    set_mode(&tmp, 0o755)?;
    if install_dir.is_dir() {
        std::fs::remove_dir_all(&install_dir).map_err(|e| e.to_string())?;
    }
    // rename, or krew's copy when they are on two file systems (/tmp and KREW_ROOT may be).
    if std::fs::rename(&tmp, &install_dir).is_err() {
        copy_tree(&tmp, &install_dir)?;
        let _ = std::fs::remove_dir_all(&tmp);
    }

    // The link.
    let bin = install_dir.join(&platform.bin);
    if !clean(&bin).starts_with(&install_dir) {
        return Err(format!("the fullPath {bin:?} does not extend the sub-fullPath {install_dir:?}"));
    }
    if !bin.exists() {
        return Err(format!(
            "can't create symbolic link, source binary ({bin:?}) cannot be found in extracted archive"
        ));
    }
    let bin_dir = root.join("bin");
    std::fs::create_dir_all(&bin_dir).map_err(|e| e.to_string())?;
    let link = bin_dir.join(format!("kubectl-{}", name.replace('-', "_")));
    if let Ok(meta) = std::fs::symlink_metadata(&link) {
        if !meta.file_type().is_symlink() {
            return Err(format!("file {link:?} is not a symlink"));
        }
        std::fs::remove_file(&link).map_err(|e| e.to_string())?;
    }
    std::os::unix::fs::symlink(&bin, &link).map_err(|e| format!("failed to create a symlink: {e}"))?;

    // The receipt: the plugin, its creation time and the index it came from.
    let mut receipt_doc: serde_yaml_ng::Value = serde_yaml_ng::from_str(&text).map_err(|e| e.to_string())?;
    let now = jiff::Timestamp::now().strftime("%Y-%m-%dT%H:%M:%SZ").to_string();
    receipt_doc["metadata"]["creationTimestamp"] = now.into();
    receipt_doc["status"] = serde_yaml_ng::from_str("source: {name: detached}").expect("YAML");
    std::fs::create_dir_all(receipt.parent().expect("a parent")).map_err(|e| e.to_string())?;
    std::fs::write(&receipt, serde_yaml_ng::to_string(&receipt_doc).map_err(|e| e.to_string())?)
        .map_err(|e| e.to_string())?;

    license_installed(&root)?;
    Ok(Installed { store: install_dir, link, receipt })
}

/// validate-krew-manifest's `validateLicenseFileExists`: a regular file named like a license
/// somewhere under `$KREW_ROOT/store`.
fn license_installed(root: &Path) -> Result<(), String> {
    const NAMES: [&str; 8] = [
        "license",
        "license.txt",
        "license.md",
        "licenses",
        "licenses.txt",
        "licenses.md",
        "copying",
        "copying.txt",
    ];
    let mut files = Vec::new();
    let mut dirs = vec![root.join("store")];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).map_err(|e| e.to_string())?.flatten() {
            let kind = entry.file_type().map_err(|e| e.to_string())?;
            if kind.is_dir() {
                dirs.push(entry.path());
            } else if kind.is_file() {
                files.push(entry.file_name().to_string_lossy().into_owned());
            }
        }
    }
    if files.iter().any(|f| NAMES.contains(&f.to_lowercase().as_str())) {
        Ok(())
    } else {
        Err(format!(
            "LICENSE (or alike) file is not extracted from the archive as part of installation: could not find \
             license file among [{}]",
            files.join(", ")
        ))
    }
}

/// krew's `extractTARGZ` (after `detectMIMEType` found gzip): regular files (with the archive's
/// mode) and directories; `pax_global_header` skipped; anything else, a path with `..` or an
/// absolute one, refused.
pub fn extract_tar_gz(target: &Path, bytes: &[u8]) -> Result<(), String> {
    if !bytes.starts_with(&[0x1f, 0x8b, 0x08]) {
        return Err("mime type for archive file is not a supported archive format".into());
    }
    let mut archive = tar::Archive::new(flate2::read::GzDecoder::new(bytes));
    for entry in archive.entries().map_err(|e| format!("tar extraction error: {e}"))? {
        let mut entry = entry.map_err(|e| format!("tar extraction error: {e}"))?;
        let name = String::from_utf8_lossy(&entry.path_bytes()).into_owned();
        if name == "pax_global_header" {
            continue;
        }
        if name.contains("..") {
            return Err(format!("refusing to unpack archive with suspicious entry {name:?}"));
        }
        if name.starts_with('/') || name.starts_with('\\') {
            return Err(format!("refusing to unpack archive with absolute entry {name:?}"));
        }
        let path = target.join(&name);
        let mode = entry.header().mode().map_err(|e| e.to_string())?;
        match entry.header().entry_type() {
            tar::EntryType::Directory => {
                std::fs::create_dir_all(&path).map_err(|e| e.to_string())?;
                set_mode(&path, mode)?;
            }
            tar::EntryType::Regular => {
                std::fs::create_dir_all(path.parent().expect("a parent")).map_err(|e| e.to_string())?;
                let mut data = Vec::new();
                entry.read_to_end(&mut data).map_err(|e| format!("failed to copy {name:?} from tar: {e}"))?;
                std::fs::write(&path, data).map_err(|e| format!("failed to create file {path:?}: {e}"))?;
                set_mode(&path, mode)?;
            }
            other => return Err(format!("unable to handle file type {other:?} for {name:?} in tar")),
        }
    }
    Ok(())
}

/// krew's `findMoveTargets`: `to` must be a clean path; `from` naming a file is moved to `to`
/// (to its own name under `.`); else `from` is a glob whose matches go into the directory `to`.
/// Every source inside the staging directory, every target inside the new install directory.
fn move_targets(
    from_dir: &Path,
    to_dir: &Path,
    op: &FileOperation,
) -> Result<Vec<(PathBuf, PathBuf)>, String> {
    if op.to != clean_str(&op.to) {
        return Err(format!("the provided path is not clean, {:?} should be {:?}", op.to, clean_str(&op.to)));
    }
    let inside = |base: &Path, p: &Path| clean(p).starts_with(clean(base));
    let direct = clean(&from_dir.join(&op.from));
    if direct.exists() {
        let to = if clean_str(&op.to) == "." {
            to_dir.join(direct.file_name().expect("a file name"))
        } else {
            clean(&to_dir.join(&op.to))
        };
        if !(inside(from_dir, &direct) && inside(to_dir, &to)) {
            return Err(format!("can't move, move target {direct:?} -> {to:?} is out of bounds"));
        }
        return Ok(vec![(direct, to)]);
    }
    let new_dir = clean(&to_dir.join(&op.to));
    let matches = glob(from_dir, &op.from)?;
    if matches.is_empty() {
        return Err(format!("no files in the plugin archive matched the glob pattern={}", op.from));
    }
    let mut moves = Vec::new();
    for from in matches {
        let to = new_dir.join(from.file_name().expect("a file name"));
        if !(inside(from_dir, &from) && inside(to_dir, &to)) {
            return Err(format!("can't move, move target {from:?} -> {to:?} is not a subpath"));
        }
        moves.push((from, to));
    }
    Ok(moves)
}

/// Go's `filepath.Glob(dir/pattern)` for patterns of `*`, `?` and literal characters per path
/// component (krew's manifests use no more), sorted as Go returns them.
fn glob(dir: &Path, pattern: &str) -> Result<Vec<PathBuf>, String> {
    let mut found = vec![dir.to_path_buf()];
    for part in pattern.split('/').filter(|p| !p.is_empty() && *p != ".") {
        let mut next = Vec::new();
        for base in &found {
            let Ok(entries) = std::fs::read_dir(base) else { continue };
            let mut names: Vec<String> =
                entries.flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect();
            names.sort();
            next.extend(names.into_iter().filter(|n| wildcard(part, n)).map(|n| base.join(n)));
        }
        found = next;
    }
    Ok(found)
}

fn wildcard(pattern: &str, name: &str) -> bool {
    let (p, n): (Vec<char>, Vec<char>) = (pattern.chars().collect(), name.chars().collect());
    fn go(p: &[char], n: &[char]) -> bool {
        match (p.first(), n.first()) {
            (None, None) => true,
            (Some('*'), _) => go(&p[1..], n) || (!n.is_empty() && go(p, &n[1..])),
            (Some('?'), Some(_)) => go(&p[1..], &n[1..]),
            (Some(a), Some(b)) if a == b => go(&p[1..], &n[1..]),
            _ => false,
        }
    }
    go(&p, &n)
}

/// Go's `filepath.Clean` of a relative path, as a string.
fn clean_str(path: &str) -> String {
    let cleaned = clean(Path::new(path));
    let s = cleaned.to_string_lossy().into_owned();
    if s.is_empty() { ".".into() } else { s }
}

/// A path with `.` dropped and `..` applied, lexically.
fn clean(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for part in path.components() {
        match part {
            Component::CurDir => {}
            Component::ParentDir => {
                if !out.pop() {
                    out.push("..");
                }
            }
            other => out.push(other),
        }
    }
    out
}

fn set_mode(path: &Path, mode: u32) -> Result<(), String> {
    std::fs::set_permissions(path, std::os::unix::fs::PermissionsExt::from_mode(mode & 0o7777))
        .map_err(|e| format!("chmod {}: {e}", path.display()))
}

fn copy_tree(from: &Path, to: &Path) -> Result<(), String> {
    let status = Command::new("cp").arg("-a").arg(from).arg(to).status().map_err(|e| e.to_string())?;
    if status.success() { Ok(()) } else { Err(format!("cp -a {from:?} {to:?} failed")) }
}

/// The file's sha256, as sha256sum prints it.
pub fn sha256(path: &Path) -> Result<String, String> {
    let out = Command::new("sha256sum").arg(path).output().map_err(|e| format!("sha256sum: {e}"))?;
    if !out.status.success() {
        return Err(format!("sha256sum {}: {}", path.display(), String::from_utf8_lossy(&out.stderr).trim()));
    }
    let text = String::from_utf8_lossy(&out.stdout);
    text.split_whitespace().next().map(str::to_string).ok_or_else(|| "sha256sum printed nothing".into())
}
