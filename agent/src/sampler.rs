//! The node's periodic samplers (the conntrack tables, pressure): each reads small kernel files
//! every interval against the attribution index of the moment and its own previous sample, and
//! publishes the result on a `watch` channel its readers never wait on — shared, not copied: the
//! evaluator takes it every second.

use std::{sync::Arc, time::Duration};

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::attribution::Index;

/// Runs `sample(index, n, previous)` every `interval` until `stop`, publishing each result. On a
/// blocking thread: a `/proc` or cgroupfs read is no place to stall the runtime.
pub async fn every<T, F>(
    what: &'static str,
    interval: Duration,
    index: watch::Receiver<Arc<Index>>,
    tx: watch::Sender<Arc<T>>,
    stop: CancellationToken,
    sample: F,
) where
    T: Default + Send + Sync + 'static,
    F: Fn(&Index, u64, &T) -> T + Send + Sync + 'static,
{
    let mut tick = tokio::time::interval(interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let sample = Arc::new(sample);
    let mut last = Arc::new(T::default());
    for n in 1.. {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tick.tick() => {}
        }
        let (sample, index, before) = (sample.clone(), index.borrow().clone(), last.clone());
        match tokio::task::spawn_blocking(move || sample(&index, n, &before)).await {
            Ok(sampled) => {
                last = Arc::new(sampled);
                let _ = tx.send(last.clone());
            }
            Err(e) => tracing::warn!(sampler = what, error = %e, "sample failed"),
        }
    }
}
