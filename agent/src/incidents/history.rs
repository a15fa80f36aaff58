//! The state file's writer: a subscriber of the evaluator that keeps the incident history
//! written to the state directory (`saved.rs` is its format).

use std::{io, path::PathBuf, sync::Arc};

use tokio::sync::watch;

use super::{
    evaluator::{Evaluation, Subscriber},
    saved::{Saved, save},
};

/// The evaluator's side: hands each history due to the writer (the newest wins).
pub struct Feed(watch::Sender<Option<Arc<Saved>>>);

impl Subscriber for Feed {
    fn publish(&mut self, evaluation: &Evaluation) {
        if let Some(history) = evaluation.history {
            self.0.send_replace(Some(history.clone()));
        }
    }

    fn stopping(&mut self, history: &Arc<Saved>) {
        self.0.send_replace(Some(history.clone()));
    }
}

/// The writer of `dir` and the subscriber that feeds it.
pub fn writer(
    dir: PathBuf,
    written: impl Fn(&io::Result<usize>) + Send + 'static,
    stop: tokio_util::sync::CancellationToken,
) -> (impl Future<Output = ()>, Feed) {
    let (feed, latest) = watch::channel(None);
    (keep_written(dir, latest, written, stop), Feed(feed))
}

/// How long a write at shutdown may take: a stuck disk must not keep the agent from exiting.
const LAST_WRITE_WITHIN: std::time::Duration = std::time::Duration::from_secs(5);

/// Writes each history the evaluator publishes, on the blocking pool and one at a time: a slow
/// disk delays the file, never the agent, and histories published meanwhile are coalesced (the
/// newest wins). When stopped, writes what is still pending, within [`LAST_WRITE_WITHIN`].
async fn keep_written(
    dir: PathBuf,
    mut latest: watch::Receiver<Option<Arc<Saved>>>,
    written: impl Fn(&io::Result<usize>) + Send + 'static,
    stop: tokio_util::sync::CancellationToken,
) {
    loop {
        let stopping = tokio::select! {
            changed = latest.changed() => changed.is_err(),
            _ = stop.cancelled() => true,
        };
        let pending = !stopping || latest.has_changed().unwrap_or(false);
        let saved = latest.borrow_and_update().clone();
        if let (true, Some(saved)) = (pending, saved) {
            let dir = dir.clone();
            let write = tokio::task::spawn_blocking(move || save(&dir, &saved));
            let result = match stopping {
                false => write.await.unwrap_or_else(|e| Err(io::Error::other(e))),
                true => match tokio::time::timeout(LAST_WRITE_WITHIN, write).await {
                    Ok(done) => done.unwrap_or_else(|e| Err(io::Error::other(e))),
                    Err(_) => {
                        Err(io::Error::new(io::ErrorKind::TimedOut, "the last write did not finish in 5 s"))
                    }
                },
            };
            written(&result);
        }
        if stopping {
            return;
        }
    }
}
