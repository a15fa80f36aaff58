//! Pod metadata from the Kubernetes API: a list/watch of this node's pods.

use std::{path::Path, pin::pin};

use anyhow::Context;
use futures::{Stream, StreamExt, stream::BoxStream};
use k8s_openapi::api::core::v1::Pod;
use kube::{
    Api, Client, Config,
    config::{KubeConfigOptions, Kubeconfig},
    runtime::{
        WatchStreamExt,
        watcher::{self, Event, watcher},
    },
};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use super::{Health, PodMeta, PodUpdate};

/// A client from `kubeconfig` when given; else the pod's service account (in-cluster), which is
/// how the agent runs as a DaemonSet; else the default kubeconfig (`$KUBECONFIG`,
/// `~/.kube/config`), for running it by hand.
pub async fn client(kubeconfig: Option<&Path>) -> anyhow::Result<Client> {
    let config = match kubeconfig {
        Some(path) => {
            let file = Kubeconfig::read_from(path)
                .with_context(|| format!("reading the kubeconfig {}", path.display()))?;
            Config::from_custom_kubeconfig(file, &KubeConfigOptions::default())
                .await
                .with_context(|| format!("using the kubeconfig {}", path.display()))?
        }
        None => match Config::incluster() {
            Ok(config) => config,
            Err(in_cluster) => {
                Config::from_kubeconfig(&KubeConfigOptions::default()).await.map_err(|kubeconfig| {
                    anyhow::anyhow!(
                        "no Kubernetes API credentials: not running in a pod with a service account \
                         ({in_cluster}), and no usable default kubeconfig ({kubeconfig})"
                    )
                })?
            }
        },
    };
    Client::try_from(config).context("building the Kubernetes API client")
}

/// Watches the pods of `node` until `stop`. The initial list and every relist become one
/// [`PodUpdate::Snapshot`], so the store learns which pods went away while the watch was broken.
/// While the API is unreachable nothing is sent and the store keeps what it has; the watch is
/// retried with kube's backoff forever. Returns when `stop` is cancelled or `updates` is closed.
pub async fn watch_pods(
    client: Client,
    node: String,
    selected_labels: Vec<String>,
    updates: mpsc::Sender<PodUpdate>,
    health: Health,
    stop: CancellationToken,
) {
    let config = watcher::Config::default().fields(&format!("spec.nodeName={node}"));
    let mut events = pin!(pod_events(Api::all(client), config).default_backoff());
    // The pods of the list in progress.
    let mut listing = Vec::new();
    let mut down = false;
    loop {
        let event = tokio::select! {
            biased;
            () = stop.cancelled() => return,
            event = events.next() => event,
        };
        let event = match event {
            Some(Ok(event)) => event,
            Some(Err(error)) => {
                // A list that fails after some pages starts over, with a new list.
                listing.clear();
                if expired(&error) {
                    debug!(%error, "pod watch expired, listing the pods again");
                } else if !down {
                    down = true;
                    health.set(false, Some(ErrorChain(&error).to_string()));
                    warn!(
                        error = %ErrorChain(&error),
                        "cannot watch pods on the Kubernetes API, keeping the pod metadata we have; retrying"
                    );
                } else {
                    debug!(error = %ErrorChain(&error), "still cannot watch pods on the Kubernetes API");
                }
                continue;
            }
            // The watcher retries forever: it does not end.
            None => return,
        };
        if down {
            down = false;
            info!("reconnected to the Kubernetes API, watching pods again");
        }
        if matches!(event, Event::InitDone) || !health.get().up {
            health.set(true, None);
        }
        let Some(update) = update_of(event, &mut listing, &selected_labels) else { continue };
        tokio::select! {
            biased;
            () = stop.cancelled() => return,
            sent = updates.send(update) => if sent.is_err() { return },
        }
    }
}

/// What a watcher event tells the store: the pods of a list are gathered in `listing` until the
/// list is done (then one snapshot); `None` while listing, and for a pod without a UID.
pub fn update_of(
    event: Event<Pod>,
    listing: &mut Vec<PodMeta>,
    selected_labels: &[String],
) -> Option<PodUpdate> {
    match event {
        Event::InitApply(pod) => {
            listing.extend(PodMeta::from_pod(&pod, selected_labels));
            None
        }
        Event::InitDone => Some(PodUpdate::Snapshot(std::mem::take(listing))),
        Event::Apply(pod) => {
            PodMeta::from_pod(&pod, selected_labels).map(|meta| PodUpdate::Upsert(Box::new(meta)))
        }
        Event::Delete(pod) => pod.metadata.uid.map(|uid| PodUpdate::Delete { uid }),
        // Dropped by `pod_events`.
        Event::Init => None,
    }
}

/// kube's pod watcher with two changes, made before the backoff sees the events:
/// - `Init` is dropped: kube emits it before the list request, so it would reset the backoff
///   after every failed list and an API outage would be retried every second from every node;
/// - a watch refused with HTTP 410 starts a new watcher, which lists again: kube's would retry
///   the expired resource version forever (API servers send 410 inside a watch, which kube
///   handles, but a proxy may answer the request with it).
fn pod_events(
    api: Api<Pod>,
    config: watcher::Config,
) -> impl Stream<Item = watcher::Result<Event<Pod>>> + Send {
    futures::stream::unfold(None, move |current: Option<BoxStream<'static, _>>| {
        let mut events = current.unwrap_or_else(|| watcher(api.clone(), config.clone()).boxed());
        async move {
            loop {
                match events.next().await? {
                    Ok(Event::Init) => {}
                    Err(error @ watcher::Error::WatchStartFailed(_)) if expired(&error) => {
                        return Some((Err(error), None));
                    }
                    event => return Some((event, Some(events))),
                }
            }
        }
    })
}

/// The resource version the watch resumes from is no longer in the API server's history: only a
/// new list catches up. Routine, not an outage.
fn expired(error: &watcher::Error) -> bool {
    match error {
        watcher::Error::WatchError(status) => status.code == 410,
        watcher::Error::WatchStartFailed(kube::Error::Api(status)) => status.code == 410,
        _ => false,
    }
}

/// An error with its causes: kube's own messages stop at "client error (Connect)", the cause
/// ("Connection refused", a TLS failure) is further down.
pub struct ErrorChain<'a>(pub &'a (dyn std::error::Error + 'static));

impl std::fmt::Display for ErrorChain<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut shown = self.0.to_string();
        let mut source = self.0.source();
        while let Some(cause) = source {
            let message = cause.to_string();
            // kube's errors often repeat their cause's message in their own.
            if !shown.contains(&message) {
                shown = format!("{shown}: {message}");
            }
            source = cause.source();
        }
        f.write_str(&shown)
    }
}

#[cfg(test)]
mod tests;
