//! Where pods' names come from, as users give it: one declaration each, at once the flag, the
//! `KSTALL_*` variable and the file's key (`config.rs` merges the layers), read into what the
//! attribution needs.

use std::{path::PathBuf, time::Duration};

use crate::setting::{self, Invalid};

#[derive(Debug, Default, clap::Args, serde::Serialize, serde::Deserialize)]
#[serde(default)]
// A group id of its own: clap names a flattened struct's group after the type.
#[group(id = "attribution_settings")]
pub struct Flags {
    /// Where pod names come from: auto (the pods file if given, else the Kubernetes API when
    /// running in a cluster or given a kubeconfig, else none), api, file or none [default: auto].
    #[arg(long, env = "KSTALL_POD_METADATA", value_name = "SOURCE")]
    pub pod_metadata: Option<String>,
    /// The JSON of `kubectl get pods -o json`, reloaded when it changes.
    #[arg(long, env = "KSTALL_PODS_FILE", value_name = "FILE")]
    pub pods_file: Option<PathBuf>,
    /// kubeconfig for the Kubernetes API source [default: in-cluster service account].
    #[arg(long, env = "KSTALL_KUBECONFIG", value_name = "FILE")]
    pub kubeconfig: Option<PathBuf>,
    /// This node's name, whose pods are watched [default: $NODE_NAME, else the hostname].
    #[arg(long, env = "KSTALL_NODE_NAME", value_name = "NAME")]
    pub node_name: Option<String>,
    /// Pod label keys copied onto events, comma-separated (e.g. app,team) [default: none].
    #[arg(long, env = "KSTALL_POD_LABELS", value_name = "LIST", value_delimiter = ',')]
    pub pod_labels: Option<Vec<String>>,
    /// How long a deleted pod is still named on late events: 90s, 30m, 1h, 1d [default: 1h].
    #[arg(long, env = "KSTALL_POD_RETENTION", value_name = "DURATION")]
    pub pod_retention: Option<String>,
}

/// The source of pod names, namespaces and workloads.
#[derive(Debug, Clone, PartialEq)]
pub enum PodMetadata {
    /// Events carry pod UIDs and container ids only.
    None,
    File(PathBuf),
    /// The API server; in-cluster credentials unless a kubeconfig is given.
    Api {
        kubeconfig: Option<PathBuf>,
    },
}

/// The attribution's settings.
#[derive(Debug, Clone, PartialEq)]
pub struct Attribution {
    pub pod_metadata: PodMetadata,
    pub node_name: String,
    pub pod_labels: Vec<String>,
    pub pod_retention: Duration,
}

const DEFAULT_POD_RETENTION: Duration = Duration::from_secs(3600);

impl Flags {
    /// The settings, each unset one at its default (the source: the pods file if given, else the
    /// API when given a kubeconfig or running in a cluster); a pods file is read now, so that a
    /// wrong one is refused at start. A bad value names its key.
    pub fn settings(self) -> Result<Attribution, Invalid> {
        let Self { pod_metadata, pods_file, kubeconfig, node_name, pod_labels, pod_retention } = self;
        let pod_metadata = match pod_metadata.as_deref().map(str::trim) {
            None | Some("auto") => match (pods_file, kubeconfig) {
                (Some(path), _) => PodMetadata::File(path),
                (None, Some(kubeconfig)) => PodMetadata::Api { kubeconfig: Some(kubeconfig) },
                (None, None) if std::env::var_os("KUBERNETES_SERVICE_HOST").is_some() => {
                    PodMetadata::Api { kubeconfig: None }
                }
                (None, None) => PodMetadata::None,
            },
            Some("api") => PodMetadata::Api { kubeconfig },
            Some("file") => match pods_file {
                Some(path) => PodMetadata::File(path),
                None => return Err(("pod_metadata", "\"file\" needs --pods-file".into())),
            },
            Some("none") => PodMetadata::None,
            Some(other) => {
                return Err(("pod_metadata", format!("{other:?} is not one of auto, api, file, none")));
            }
        };
        if let PodMetadata::File(path) = &pod_metadata {
            // A file that is wrong at start is a mistake to report now; a bad later write only
            // keeps the pods already known.
            super::pods::file::load(path, &[]).map_err(|e| ("pods_file", e.to_string()))?;
        }
        let node_name = match node_name {
            Some(name) => name.trim().to_string(),
            None => std::env::var("NODE_NAME").ok().filter(|n| !n.is_empty()).unwrap_or_else(hostname),
        };
        if node_name.is_empty() {
            return Err(("node_name", "is empty".into()));
        }
        let pod_labels = label_keys(pod_labels.unwrap_or_default())?;
        let pod_retention = match pod_retention {
            Some(text) => setting::duration("pod_retention", &text)?,
            None => DEFAULT_POD_RETENTION,
        };
        Ok(Attribution { pod_metadata, node_name, pod_labels, pod_retention })
    }
}

/// The node's name when `--node-name` is not given.
pub fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname").map(|h| h.trim().to_string()).unwrap_or_default()
}

/// Kubernetes label keys: `[prefix/]name`, name up to 63 of `[A-Za-z0-9._-]`.
fn label_keys(list: Vec<String>) -> Result<Vec<String>, Invalid> {
    let keys: Vec<String> = list.iter().map(|s| s.trim().to_string()).filter(|s| !s.is_empty()).collect();
    for key in &keys {
        let name = key.rsplit_once('/').map_or(key.as_str(), |(_, n)| n);
        let valid = !name.is_empty()
            && name.len() <= 63
            && name.bytes().all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b));
        if !valid {
            return Err(("pod_labels", format!("{key:?} is not a Kubernetes label key")));
        }
    }
    Ok(keys)
}
