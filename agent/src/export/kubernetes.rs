//! Writes to the Kubernetes API, where its users look: incidents as Events on their pods and
//! nodes ([`events`]), and the node conditions kstall owns ([`conditions`]). Each writer is its
//! own task behind a channel the evaluator never waits on; every write's outcome is counted in
//! `kstall_kubernetes_writes_total{kind,result}` and each cause of failure logged once.

pub mod conditions;
pub mod events;
pub mod flags;
pub mod taints;

use std::{collections::HashSet, sync::Arc, time::Duration};

use super::metrics::Metrics;
use crate::attribution::pods::api::ErrorChain;

/// `reportingController` of Events, and the name kstall's writes go by.
pub const CONTROLLER: &str = "kstall";
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// `nfs-sidecar-redirect` -> `NFSSidecarRedirect`: an Event's or a condition's reason
/// (UpperCamelCase, as the kubelet's `BackOff`, `FailedMount`), with the acronyms people write in
/// capitals.
pub fn reason(signature: &str) -> String {
    signature
        .split('-')
        .map(|part| match part {
            "nfs" | "oom" | "tcp" | "rpc" | "api" | "cpu" => part.to_ascii_uppercase(),
            _ => {
                let mut chars = part.chars();
                chars.next().map(|c| c.to_uppercase().chain(chars).collect()).unwrap_or_default()
            }
        })
        .collect()
}

/// Cuts `text` to `bytes` on a character boundary, marking the cut.
fn truncate(text: &mut String, bytes: usize) {
    if text.len() > bytes {
        let mut end = bytes - '…'.len_utf8();
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        text.truncate(end);
        text.push('…');
    }
}

/// The outcomes of one kind of write: counted, and each cause of failure logged once until a
/// write works again.
struct Outcomes {
    /// The `kind` label: `event`, `node_condition`.
    kind: &'static str,
    /// What the log line says was refused: "an Event".
    what: &'static str,
    /// Where a 403 points: the RBAC rule the writes need.
    rbac: &'static str,
    metrics: Arc<Metrics>,
    warned: HashSet<&'static str>,
}

impl Outcomes {
    fn new(kind: &'static str, what: &'static str, rbac: &'static str, metrics: Arc<Metrics>) -> Self {
        Self { kind, what, rbac, metrics, warned: HashSet::new() }
    }

    /// Counts a write's outcome (`written` when it worked); whether it worked.
    fn record<T>(
        &mut self,
        written: &'static str,
        outcome: Result<kube::Result<T>, tokio::time::error::Elapsed>,
    ) -> bool {
        let (result, error) = match outcome {
            Ok(Ok(_)) => (written, None),
            Ok(Err(kube::Error::Api(status))) => {
                let result = match status.code {
                    403 => "forbidden",
                    409 => "conflict",
                    404 | 410 => "not_found",
                    500..=599 => "server_error",
                    _ => "rejected",
                };
                (result, Some(format!("HTTP {}: {}", status.code, status.message)))
            }
            // kube's message stops at "client error (Connect)": the cause is further down.
            Ok(Err(e)) => ("unreachable", Some(ErrorChain(&e).to_string())),
            Err(_) => ("unreachable", Some(format!("no answer within {REQUEST_TIMEOUT:?}"))),
        };
        self.metrics.kubernetes_write(self.kind, result);
        let Some(error) = error else {
            self.warned.clear();
            return true;
        };
        if self.warned.insert(result) {
            let what = self.what;
            let hint = if result == "forbidden" { format!(" ({})", self.rbac) } else { String::new() };
            tracing::warn!(result, %error, "the Kubernetes API refused {what}{hint}; counting the rest in kstall_kubernetes_writes_total");
        }
        false
    }
}
