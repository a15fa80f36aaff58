//! The kubectl plugin for krew (issue 55): its manifest (deploy/krew/kstall.yaml) passes krew's
//! own checks of an index manifest (tests/src/krew.rs: krew's code done again, check by check),
//! each check refuses a manifest that breaks it, the archives `cargo xtask krew` builds are the
//! ones the manifest names (sha256) and hold the script and a license, and installed as krew lays
//! a plugin out (`$KREW_ROOT/store/kstall/v0.1.0/`, `$KREW_ROOT/bin/kubectl-kstall`) the pinned
//! kubectl (target/tools) finds the plugin and runs it. tests/tests/cluster/krew_plugin.rs runs
//! it from that layout against the real cluster.

use std::{path::Path, process::Command};

use kstall_tests::{
    deploy::{deploy_dir, required},
    helm,
    krew::{self, Plugin},
};

const PLATFORMS: [(&str, &str); 2] = [("linux", "amd64"), ("linux", "arm64")];

fn manifest_text() -> String {
    std::fs::read_to_string(krew::manifest_path()).expect("deploy/krew/kstall.yaml")
}

/// Whether the archives are in target/krew: `cargo xtask krew` (and `cargo xtask test`) build
/// them. When not: a panic where the test is required, else a line saying why it skips.
fn archives_built(test: &str) -> bool {
    let missing: Vec<String> = PLATFORMS
        .iter()
        .map(|(os, arch)| krew::archive_path(os, arch))
        .filter(|p| !p.is_file())
        .map(|p| p.display().to_string())
        .collect();
    if missing.is_empty() {
        return true;
    }
    let why = format!("no {} (cargo xtask krew builds them)", missing.join(", "));
    assert!(!required(), "{test}: required here, but {why}");
    println!("skipping {test}: {why}");
    false
}

#[test]
fn the_manifest_passes_krews_checks_of_an_index_manifest() {
    let plugin = krew::validate_file(&krew::manifest_path()).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(plugin.metadata.name, "kstall");
    assert_eq!(plugin.spec.version, format!("v{}", env!("CARGO_PKG_VERSION")), "the crate's version");
    let offered: Vec<(String, String)> = plugin
        .spec
        .platforms
        .iter()
        .map(|p| {
            let labels = p.selector.as_ref().and_then(|s| s.match_labels.clone()).unwrap_or_default();
            (labels["os"].clone(), labels["arch"].clone())
        })
        .collect();
    assert_eq!(offered, PLATFORMS.map(|(o, a)| (o.to_string(), a.to_string())));
    for ((os, arch), platform) in PLATFORMS.iter().zip(&plugin.spec.platforms) {
        assert!(
            platform.uri.ends_with(&format!("/{}/kstall-{os}-{arch}.tar.gz", plugin.spec.version)),
            "{}",
            platform.uri
        );
        assert_eq!(platform.bin, "kubectl-kstall");
        let files: Vec<(&str, &str)> =
            platform.files.iter().flatten().map(|f| (f.from.as_str(), f.to.as_str())).collect();
        assert_eq!(files, [("kubectl-kstall", "."), ("LICENSE", ".")]);
        // Selected on its own os/arch only.
        for (other_os, other_arch) in krew::KREW_PLATFORMS {
            assert_eq!(
                krew::selector_matches(platform.selector.as_ref(), other_os, other_arch),
                (other_os, other_arch) == (*os, *arch),
                "{os}/{arch}'s selector on {other_os}/{other_arch}"
            );
        }
    }
}

/// The manifest with `change` made to its YAML, checked as a file named `file`.
fn broken(file: &str, change: impl FnOnce(&mut serde_yaml_ng::Value)) -> Result<Plugin, String> {
    let mut doc: serde_yaml_ng::Value = serde_yaml_ng::from_str(&manifest_text()).unwrap();
    change(&mut doc);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(file);
    std::fs::write(&path, serde_yaml_ng::to_string(&doc).unwrap()).unwrap();
    krew::validate_file(&path)
}

#[test]
fn each_of_krews_checks_refuses_a_manifest_that_breaks_it() {
    type Change = Box<dyn FnOnce(&mut serde_yaml_ng::Value)>;
    // `value` at `path`; null removes the key (the field absent, as krew reads a missing one).
    let set = |path: &'static [&'static str], value: serde_yaml_ng::Value| -> Change {
        Box::new(move |doc| {
            let (last, parents) = path.split_last().unwrap();
            let mut at = doc;
            for key in parents {
                at = match key.parse::<usize>() {
                    Ok(i) => &mut at[i],
                    Err(_) => &mut at[*key],
                };
            }
            match (last.parse::<usize>(), value.is_null()) {
                (Ok(i), _) => at[i] = value,
                (Err(_), true) => {
                    at.as_mapping_mut().unwrap().remove(*last);
                }
                (Err(_), false) => at[*last] = value,
            }
        })
    };
    let yaml = |text: &str| serde_yaml_ng::from_str::<serde_yaml_ng::Value>(text).unwrap();
    let null = serde_yaml_ng::Value::Null;
    let cases: Vec<(&str, &str, Change, &str)> = vec![
        ("kstall.yml", "the file's extension", Box::new(|_| {}), "expected manifest extension"),
        (
            "kstall.yaml",
            "apiVersion",
            set(&["apiVersion"], "krew.googlecontainertools.github.com/v1alpha1".into()),
            "apiVersion",
        ),
        ("kstall.yaml", "kind", set(&["kind"], "Plugins".into()), "only \"Plugin\" is supported"),
        (
            "kubectl-kstall.yaml",
            "the name against the file's",
            Box::new(|_| {}),
            "plugin should be named \"kubectl-kstall\", not \"kstall\"",
        ),
        ("k stall.yaml", "an unsafe name", set(&["metadata", "name"], "k stall".into()), "is not allowed"),
        ("con.yaml", "a Windows device name", set(&["metadata", "name"], "con".into()), "is not allowed"),
        (
            "kstall.yaml",
            "no shortDescription",
            set(&["spec", "shortDescription"], null.clone()),
            "should have a short description",
        ),
        (
            "kstall.yaml",
            "a line break in it",
            set(&["spec", "shortDescription"], "Ask\nthe agents".into()),
            "line breaks",
        ),
        (
            "kstall.yaml",
            "a long one",
            set(
                &["spec", "shortDescription"],
                "Ask kstall's node agents why pods and nodes stall, from kubectl".into(),
            ),
            "more than 50",
        ),
        (
            "kstall.yaml",
            "no platform",
            set(&["spec", "platforms"], yaml("[]")),
            "should have a platform specified",
        ),
        (
            "kstall.yaml",
            "no version",
            set(&["spec", "version"], null.clone()),
            "should have a version specified",
        ),
        (
            "kstall.yaml",
            "a version without its v",
            set(&["spec", "version"], "0.1.0".into()),
            "not starting with 'v'",
        ),
        (
            "kstall.yaml",
            "a version that is not semver",
            set(&["spec", "version"], "v0.1".into()),
            "illegal version string",
        ),
        (
            "kstall.yaml",
            "a leading zero",
            set(&["spec", "version"], "v0.01.0".into()),
            "illegal version string",
        ),
        (
            "kstall.yaml",
            "no uri",
            set(&["spec", "platforms", "0", "uri"], null.clone()),
            "`uri` has to be set",
        ),
        (
            "kstall.yaml",
            "no sha256",
            set(&["spec", "platforms", "0", "sha256"], null.clone()),
            "`sha256` sum has to be set",
        ),
        (
            "kstall.yaml",
            "an upper-case sha256",
            set(&["spec", "platforms", "0", "sha256"], "AB".repeat(32).into()),
            "is not valid",
        ),
        (
            "kstall.yaml",
            "a short sha256",
            set(&["spec", "platforms", "1", "sha256"], "ab".repeat(31).into()),
            "is not valid",
        ),
        (
            "kstall.yaml",
            "no bin",
            set(&["spec", "platforms", "0", "bin"], null.clone()),
            "`bin` has to be set",
        ),
        (
            "kstall.yaml",
            "files empty",
            set(&["spec", "platforms", "0", "files"], yaml("[]")),
            "has to be unspecified or non-empty",
        ),
        (
            "kstall.yaml",
            "a file without from",
            set(&["spec", "platforms", "0", "files", "1", "from"], null.clone()),
            "`from` field has to be set",
        ),
        (
            "kstall.yaml",
            "a file without to",
            set(&["spec", "platforms", "0", "files", "0", "to"], null.clone()),
            "`to` field has to be set",
        ),
        (
            "kstall.yaml",
            "no selector",
            set(&["spec", "platforms", "0", "selector"], null.clone()),
            "nil selector is not supported",
        ),
        (
            "kstall.yaml",
            "an empty selector",
            set(&["spec", "platforms", "0", "selector"], yaml("{}")),
            "empty selector is not supported",
        ),
        (
            "kstall.yaml",
            "a key not os or arch",
            set(&["spec", "platforms", "0", "selector", "matchLabels", "distro"], "debian".into()),
            "key \"distro\" not supported",
        ),
        (
            "kstall.yaml",
            "matchLabels empty",
            set(
                &["spec", "platforms", "0", "selector"],
                yaml("{matchLabels: {}, matchExpressions: [{key: os, operator: In, values: [linux]}]}"),
            ),
            "`matchLabels` specified but empty",
        ),
        (
            "kstall.yaml",
            "a platform krew does not have",
            set(&["spec", "platforms", "1", "selector", "matchLabels", "os"], "plan9".into()),
            "doesn't match any supported platforms",
        ),
        (
            "kstall.yaml",
            "two platforms for linux/amd64",
            set(
                &["spec", "platforms", "1", "selector"],
                yaml("{matchExpressions: [{key: os, operator: In, values: [linux]}]}"),
            ),
            "overlapping selectors that select linux/amd64",
        ),
        (
            "kstall.yaml",
            "a field krew does not know (stricter than krew)",
            set(&["spec", "platforms", "0", "binary"], "kubectl-kstall".into()),
            "unknown field `binary`",
        ),
    ];
    for (file, what, change, expect) in cases {
        match broken(file, change) {
            Ok(_) => panic!("{what}: accepted"),
            Err(e) => assert!(e.contains(expect), "{what}: {e:?} does not say {expect:?}"),
        }
    }
    // The semantic versions krew takes.
    for ok in ["v0.1.0", "v1.2.3-rc.1", "v10.0.0+build.5"] {
        krew::parse_version(ok).unwrap_or_else(|e| panic!("{ok}: {e}"));
    }
}

#[test]
fn the_archives_are_the_manifests_and_hold_the_script_and_its_license() {
    if !archives_built("the_archives_are_the_manifests_and_hold_the_script_and_its_license") {
        return;
    }
    let plugin = krew::parse(&manifest_text()).unwrap();
    let script = std::fs::read(deploy_dir().join("kubectl-kstall")).unwrap();
    for ((os, arch), platform) in PLATFORMS.iter().zip(&plugin.spec.platforms) {
        let archive = krew::archive_path(os, arch);
        assert_eq!(
            krew::sha256(&archive).unwrap(),
            platform.sha256,
            "{} is not the manifest's {os}/{arch} archive: run `cargo xtask krew`",
            archive.display()
        );
        let dir = tempfile::tempdir().unwrap();
        krew::extract_tar_gz(dir.path(), &std::fs::read(&archive).unwrap()).unwrap();
        let mut names: Vec<String> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        names.sort();
        assert_eq!(names, ["LICENSE", "kubectl-kstall"]);
        assert_eq!(
            std::fs::read(dir.path().join("kubectl-kstall")).unwrap(),
            script,
            "the archive's script is not deploy/kubectl-kstall: run `cargo xtask krew`"
        );
        let mode = std::os::unix::fs::PermissionsExt::mode(
            &std::fs::metadata(dir.path().join("kubectl-kstall")).unwrap().permissions(),
        );
        assert_eq!(mode & 0o777, 0o755);
        let license = std::fs::read_to_string(dir.path().join("LICENSE")).unwrap();
        for text in [
            "MIT OR Apache-2.0",
            "Permission is hereby granted",
            "Apache License",
            "Version 2.0, January 2004",
        ] {
            assert!(license.contains(text), "the LICENSE lacks {text:?}");
        }
    }
}

/// PATH for the plugin laid out under `krew_root`: its bin first, then the pinned kubectl.
fn krew_path(krew_root: &Path) -> String {
    format!(
        "{}:{}:/usr/sbin:/usr/bin:/sbin:/bin",
        krew_root.join("bin").display(),
        helm::tools_dir().display()
    )
}

#[test]
fn installed_as_krew_lays_it_out_the_pinned_kubectl_finds_and_runs_it() {
    let test = "installed_as_krew_lays_it_out_the_pinned_kubectl_finds_and_runs_it";
    if !archives_built(test) {
        return;
    }
    let tools = helm::tools_missing();
    if let Some(why) = &tools {
        assert!(!required(), "{test}: required here, but {why}");
        println!("skipping {test}'s kubectl runs: {why}");
    }
    let version = format!("v{}", env!("CARGO_PKG_VERSION"));
    for (os, arch) in PLATFORMS {
        let root = tempfile::tempdir().unwrap();
        let installed =
            krew::install(root.path(), &krew::manifest_path(), &krew::archive_path(os, arch), os, arch)
                .unwrap_or_else(|e| panic!("{os}/{arch}: {e}"));
        let store = root.path().join("store/kstall").join(&version);
        assert_eq!(installed.store, store);
        let mut files: Vec<String> = std::fs::read_dir(&store)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        files.sort();
        assert_eq!(files, ["LICENSE", "kubectl-kstall"], "{os}/{arch}: what `files` names, nothing more");
        let link = root.path().join("bin/kubectl-kstall");
        assert_eq!(installed.link, link);
        assert!(std::fs::symlink_metadata(&link).unwrap().file_type().is_symlink());
        assert_eq!(
            std::fs::read_link(&link).unwrap(),
            store.join("kubectl-kstall"),
            "krew links by absolute path"
        );
        let receipt = std::fs::read_to_string(root.path().join("receipts/kstall.yaml")).unwrap();
        assert!(receipt.contains("name: detached"), "{receipt}");
        // Installed once: krew refuses a second install over the receipt.
        let again =
            krew::install(root.path(), &krew::manifest_path(), &krew::archive_path(os, arch), os, arch);
        assert!(again.unwrap_err().contains("already installed"));
        if tools.is_some() {
            continue;
        }
        let kubectl = |args: &[&str]| {
            Command::new(helm::kubectl())
                .args(args)
                .env("PATH", krew_path(root.path()))
                // No cluster: the plugin's own checks answer before it asks one.
                .env("KUBECONFIG", root.path().join("no-kubeconfig"))
                .output()
                .expect("run the pinned kubectl")
        };
        let listed = kubectl(&["plugin", "list"]);
        let out = String::from_utf8_lossy(&listed.stdout);
        let err = String::from_utf8_lossy(&listed.stderr);
        assert!(listed.status.success(), "kubectl plugin list: {out}{err}");
        assert!(
            out.lines().any(|l| l == link.to_str().unwrap()),
            "kubectl plugin list does not list {}:\n{out}",
            link.display()
        );
        assert!(!err.contains("warning"), "kubectl plugin list warns: {err}");
        // kubectl runs the plugin through the link: the script's own usage answers.
        let ran = kubectl(&["kstall"]);
        let err = String::from_utf8_lossy(&ran.stderr);
        assert_eq!(ran.status.code(), Some(64), "{err}");
        assert!(err.starts_with("kubectl kstall: no kstall command given"), "{err}");
    }
}

/// The installer is krew's in what it refuses: a wrong sha256, an entry climbing out of the
/// staging directory, a symlink, a platform the manifest does not offer.
#[test]
fn the_krew_layout_refuses_what_krew_refuses() {
    let dir = tempfile::tempdir().unwrap();
    let tar_gz = |entries: &[(&str, tar::EntryType, &[u8])]| -> Vec<u8> {
        let mut builder =
            tar::Builder::new(flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast()));
        for (name, kind, data) in entries {
            let mut header = tar::Header::new_gnu();
            // set_path refuses `..`: write the name's bytes as a crafted archive would.
            header.as_old_mut().name[..name.len()].copy_from_slice(name.as_bytes());
            header.set_size(data.len() as u64);
            header.set_mode(0o755);
            header.set_entry_type(*kind);
            if *kind == tar::EntryType::Symlink {
                header.set_link_name("/bin/sh").unwrap();
            }
            header.set_cksum();
            builder.append(&header, *data).unwrap();
        }
        builder.into_inner().unwrap().finish().unwrap()
    };
    for (entries, expect) in [
        (vec![("../escape", tar::EntryType::Regular, &b"x"[..])], "suspicious entry"),
        (vec![("/etc/kstall", tar::EntryType::Regular, &b"x"[..])], "absolute entry"),
        (vec![("kubectl-kstall", tar::EntryType::Symlink, &b""[..])], "unable to handle file type"),
    ] {
        let target = dir.path().join(format!("t{}", expect.len()));
        std::fs::create_dir_all(&target).unwrap();
        let err = krew::extract_tar_gz(&target, &tar_gz(&entries)).unwrap_err();
        assert!(err.contains(expect), "{err}");
    }
    assert!(
        krew::extract_tar_gz(dir.path(), b"PK\x03\x04 a zip")
            .unwrap_err()
            .contains("not a supported archive")
    );

    // The manifest's archive with another's bytes: the sha256 stops it, nothing is installed.
    let other = dir.path().join("other.tar.gz");
    std::fs::write(&other, tar_gz(&[("kubectl-kstall", tar::EntryType::Regular, b"#!/bin/sh\n")])).unwrap();
    let root = dir.path().join("krew");
    let err = krew::install(&root, &krew::manifest_path(), &other, "linux", "amd64").unwrap_err();
    assert!(err.contains("checksum does not match"), "{err}");
    assert!(!root.join("bin").exists() && !root.join("store").exists());
    let err = krew::install(&root, &krew::manifest_path(), &other, "darwin", "arm64").unwrap_err();
    assert!(err.contains("does not offer installation for this platform"), "{err}");
}
