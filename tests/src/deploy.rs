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
    crate::workspace().join("deploy")
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

/// The agent container's `resources.limits.memory` in the DaemonSet a cluster gets
/// (`plain-prometheus`), in bytes: what the kubelet holds the agent to.
pub fn agent_memory_limit() -> u64 {
    let daemonset = rendered_daemonset("plain-prometheus");
    let containers = daemonset["spec"]["template"]["spec"]["containers"].as_array().expect("containers");
    let agent = containers.iter().find(|c| c["name"] == "kstall").expect("the kstall container");
    let limit = agent["resources"]["limits"]["memory"].as_str().expect("a memory limit on the agent");
    quantity_bytes(limit).unwrap_or_else(|| panic!("{limit:?} is not a memory quantity this reads"))
}

/// A Kubernetes memory quantity (`160Mi`, `1Gi`, `500M`, `1048576`) in bytes.
fn quantity_bytes(quantity: &str) -> Option<u64> {
    let suffixes = [
        ("Ki", 1u64 << 10),
        ("Mi", 1 << 20),
        ("Gi", 1 << 30),
        ("k", 1000),
        ("M", 1_000_000),
        ("G", 1_000_000_000),
    ];
    let (number, unit) = suffixes
        .iter()
        .find_map(|(s, unit)| Some((quantity.strip_suffix(s)?, *unit)))
        .unwrap_or((quantity, 1));
    number.parse::<u64>().ok()?.checked_mul(unit)
}

/// `to` relative to `from`: kustomize takes no absolute paths.
pub fn relative(from: &Path, to: &Path) -> PathBuf {
    let (from, to) = (from.canonicalize().unwrap(), to.canonicalize().unwrap());
    let common = from.components().zip(to.components()).take_while(|(a, b)| a == b).count();
    let mut path: PathBuf = from.components().skip(common).map(|_| "..").collect();
    path.extend(to.components().skip(common));
    path
}

#[cfg(test)]
mod tests {
    use super::quantity_bytes;

    #[test]
    fn memory_quantities_are_read_in_bytes() {
        assert_eq!(quantity_bytes("160Mi"), Some(160 << 20));
        assert_eq!(quantity_bytes("1Gi"), Some(1 << 30));
        assert_eq!(quantity_bytes("500M"), Some(500_000_000));
        assert_eq!(quantity_bytes("1048576"), Some(1 << 20));
        assert_eq!(quantity_bytes("lots"), None);
        assert_eq!(quantity_bytes("1.5Gi"), None);
    }
}
