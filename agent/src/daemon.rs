//! `kstall agent`: binds its endpoints, loads the probes, runs the pipeline
//! (ring buffer -> decode -> metrics + API subscribers) and shuts down cleanly on SIGTERM/SIGINT:
//! stop intake (detach), drain what the kernel already queued, then exit.

use std::{sync::Arc, time::Duration, time::Instant};

use anyhow::Context as _;
use aya::maps::{MapData, PerCpuArray, RingBuf};
use tokio::{io::unix::AsyncFd, net::TcpListener, signal::unix::SignalKind, sync::broadcast};
use tokio_util::sync::CancellationToken;

use crate::{
    api::{self, server::AgentState},
    config::Config,
    events::{Decoder, Event},
    export::{http, metrics::Metrics},
    kernel, probes,
};

/// Events buffered per API subscriber before a slow one starts losing them.
const SUBSCRIBER_BUFFER: usize = 4096;
const LOSS_POLL_INTERVAL: Duration = Duration::from_secs(1);
/// The kernel only wakes the reader once a quarter of the ring buffer is queued (see
/// `ebpf/src/maps.rs`); below that, events wait at most this long.
const DRAIN_INTERVAL: Duration = Duration::from_millis(50);

pub async fn run(config: Config) -> anyhow::Result<()> {
    // Endpoints first: a port or socket in use must fail before anything is loaded into the kernel.
    let http_listener = TcpListener::bind(config.listen)
        .await
        .with_context(|| format!("cannot listen on {}", config.listen))?;
    let api_listener = api::server::bind(&config.api_socket)
        .await
        .with_context(|| format!("cannot serve the API on {}", config.api_socket.display()))?;

    kernel::ensure_tracefs();
    let kernel_release = kernel::release();
    let metrics = Arc::new(Metrics::new(crate::export::metrics::ephemeral_port_range()));
    let mut loaded = probes::load(&config);
    // Loading parsed the kernel's BTF several times (tens of MB, now freed): hand it back to the
    // system instead of keeping it as the agent's resident size for its whole life.
    // SAFETY: no preconditions.
    unsafe { libc::malloc_trim(0) };
    metrics.set_probe_statuses(&loaded.statuses);
    for s in loaded.statuses.iter().filter(|s| !s.up) {
        tracing::warn!(probe = %s.name, reason = s.reason.as_deref().unwrap_or(""), "probe unavailable");
    }
    let up = loaded.statuses.iter().filter(|s| s.up).count();
    tracing::info!(kernel = %kernel_release, probes_up = up, probes = loaded.statuses.len(), listen = %config.listen,
        api = %config.api_socket.display(), "kstall agent running");

    let (events_tx, _) = broadcast::channel::<Arc<Event>>(SUBSCRIBER_BUFFER);
    let shutdown = CancellationToken::new();
    let state = Arc::new(AgentState {
        started: Instant::now(),
        kernel: kernel_release,
        probes: loaded.statuses.clone(),
        metrics: metrics.clone(),
        events: events_tx.clone(),
    });

    let http_task = tokio::spawn(http::serve(http_listener, metrics.clone(), shutdown.clone()));
    let api_task =
        tokio::spawn(api::server::serve(api_listener, config.api_socket.clone(), state, shutdown.clone()));
    let stop_intake = CancellationToken::new();
    let reader = loaded.events.take().map(|ring| {
        let pipeline =
            Pipeline { decoder: loaded.decoder.clone(), metrics: metrics.clone(), events: events_tx };
        tokio::spawn(read_events(ring, pipeline, stop_intake.clone()))
    });
    let loss =
        loaded.lost.take().map(|lost| tokio::spawn(poll_losses(lost, metrics.clone(), stop_intake.clone())));

    wait_for_signal().await?;
    tracing::info!("shutting down: detaching probes");
    let detached = loaded.detach_all();
    stop_intake.cancel();
    if let Some(reader) = reader {
        let drained = reader.await.unwrap_or(0);
        tracing::info!(detached, drained, "probes detached, ring buffer drained");
    }
    if let Some(loss) = loss {
        let _ = loss.await;
    }
    shutdown.cancel();
    let _ = tokio::join!(http_task, api_task);
    drop(loaded);
    tracing::info!("kstall agent stopped");
    Ok(())
}

async fn wait_for_signal() -> anyhow::Result<()> {
    let mut term = tokio::signal::unix::signal(SignalKind::terminate()).context("SIGTERM handler")?;
    let mut int = tokio::signal::unix::signal(SignalKind::interrupt()).context("SIGINT handler")?;
    tokio::select! {
        _ = term.recv() => {},
        _ = int.recv() => {},
    }
    Ok(())
}

struct Pipeline {
    decoder: Decoder,
    metrics: Arc<Metrics>,
    events: broadcast::Sender<Arc<Event>>,
}

impl Pipeline {
    fn handle(&self, bytes: &[u8]) {
        match self.decoder.decode(bytes) {
            Ok(event) => {
                self.metrics.observe(&event);
                // No subscriber is not an error.
                let _ = self.events.send(Arc::new(event));
            }
            Err(e) => {
                tracing::debug!(error = %e, "undecodable event");
                self.metrics.decode_error(e.label());
            }
        }
    }
}

/// Reads the ring buffer until intake stops, then drains what is left. Returns the number of
/// records drained after the stop.
async fn read_events(ring: RingBuf<MapData>, pipeline: Pipeline, stop: CancellationToken) -> u64 {
    // SAFETY: the RingBuf owns its fd for as long as the AsyncFd lives.
    let mut fd = match unsafe { AsyncFd::register(ring) } {
        Ok(fd) => fd,
        Err(e) => {
            tracing::error!(error = %e, "cannot poll the event ring buffer; no events will be read");
            return 0;
        }
    };
    let mut drain_tick = tokio::time::interval(DRAIN_INTERVAL);
    drain_tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = stop.cancelled() => break,
            _ = drain_tick.tick() => {
                let ring = fd.get_mut();
                while let Some(item) = ring.next() {
                    pipeline.handle(&item);
                }
            }
            guard = fd.readable_mut() => match guard {
                Ok(mut guard) => {
                    let ring = guard.get_inner_mut();
                    while let Some(item) = ring.next() {
                        pipeline.handle(&item);
                    }
                    guard.clear_ready();
                }
                Err(e) => {
                    tracing::error!(error = %e, "event ring buffer poll failed");
                    break;
                }
            },
        }
    }
    let ring = fd.get_mut();
    let mut drained = 0;
    while let Some(item) = ring.next() {
        pipeline.handle(&item);
        drained += 1;
    }
    drained
}

/// Turns the kernel's per-CPU loss counters into `kstall_events_lost_total`.
async fn poll_losses(lost: PerCpuArray<MapData, u64>, metrics: Arc<Metrics>, stop: CancellationToken) {
    let mut reported = vec![0u64; probes::ALL.len()];
    let mut tick = tokio::time::interval(LOSS_POLL_INTERVAL);
    loop {
        let stopping = tokio::select! {
            _ = stop.cancelled() => true,
            _ = tick.tick() => false,
        };
        for (i, probe) in probes::ALL.iter().enumerate() {
            let Ok(per_cpu) = lost.get(&probe.kind, 0) else { continue };
            let total: u64 = per_cpu.iter().sum();
            if total > reported[i] {
                metrics.add_lost(probe.name, total - reported[i]);
                reported[i] = total;
            }
        }
        if stopping {
            break;
        }
    }
}
