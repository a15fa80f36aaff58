//! deploy/'s kustomize packages as a cluster gets them: rendered by the real `kubectl kustomize`
//! and parsed into JSON objects.

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use serde::Deserialize as _;
use serde_json::Value;

/// The repository's deploy/ directory.
pub fn deploy_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy")
}

/// The objects `kubectl kustomize dir` renders, in its order. Panics with kubectl's own error
/// when it cannot render them, or cannot run.
pub fn render(dir: &Path) -> Vec<Value> {
    let out = Command::new("kubectl").arg("kustomize").arg(dir).output().unwrap_or_else(|e| {
        panic!("kubectl kustomize {}: cannot run kubectl (1.27+, with kustomize 5): {e}", dir.display())
    });
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "kubectl kustomize {}: {}", dir.display(), stderr.trim());
    yaml_documents(&String::from_utf8_lossy(&out.stdout))
}

/// Every document of a YAML stream as a JSON value, empty documents left out.
pub fn yaml_documents(text: &str) -> Vec<Value> {
    serde_yaml_ng::Deserializer::from_str(text)
        .map(|doc| Value::deserialize(doc).unwrap_or_else(|e| panic!("not YAML: {e}")))
        .filter(|v| !v.is_null())
        .collect()
}

/// The rendered DaemonSet of `overlay`: a directory of deploy/overlays (`plain-prometheus`,
/// `prometheus-operator`), or `base` for deploy/base.
pub fn rendered_daemonset(overlay: &str) -> Value {
    let dir = match overlay {
        "base" => deploy_dir().join("base"),
        _ => deploy_dir().join("overlays").join(overlay),
    };
    let mut daemonsets: Vec<Value> = render(&dir).into_iter().filter(|o| o["kind"] == "DaemonSet").collect();
    assert_eq!(daemonsets.len(), 1, "{overlay}: rendered {} DaemonSets, not one", daemonsets.len());
    daemonsets.remove(0)
}
