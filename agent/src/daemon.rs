//! `kstall agent`: binds its endpoints, loads the probes, runs the pipeline
//! (ring buffer -> decode -> metrics + API subscribers) and shuts down cleanly on SIGTERM/SIGINT:
//! stop intake (detach), drain what the kernel already queued, then exit.

use std::{
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use anyhow::Context as _;
use aya::maps::{MapData, PerCpuArray, RingBuf};
use tokio::{
    io::unix::AsyncFd,
    net::TcpListener,
    signal::unix::SignalKind,
    sync::{broadcast, mpsc, watch},
};
use tokio_util::sync::CancellationToken;

use crate::{
    api::{self, server::AgentState},
    attribution::{
        Attribution, Index, Key, Resolution,
        cgroup::Hierarchies,
        pods::{self, Health},
        resolver::{self, Resolver},
    },
    config::{Config, PodMetadata},
    events::{Decoder, Event, Payload},
    export::{alertmanager, http, metrics::Metrics},
    hung_tasks::{self, HungTaskTracker},
    incidents::engine::Engine,
    kernel,
    probes::{self, hung_task},
    symbols::Symbols,
};

/// Events buffered per API subscriber before a slow one starts losing them.
const SUBSCRIBER_BUFFER: usize = 4096;
const LOSS_POLL_INTERVAL: Duration = Duration::from_secs(1);
/// The kernel only wakes the reader once a quarter of the ring buffer is queued (see
/// `ebpf/src/maps.rs`); below that, events wait at most this long.
const DRAIN_INTERVAL: Duration = Duration::from_millis(50);
/// How often hung tasks are checked for having left D state.
const HUNG_SWEEP_INTERVAL: Duration = Duration::from_secs(1);
const SYMBOLS_REFRESH_INTERVAL: Duration = Duration::from_secs(30);
/// How long an event whose pod is not known yet waits for the resolver's answer before it goes
/// out with what is known.
const ATTRIBUTION_HOLD: Duration = Duration::from_millis(100);
/// How often held events are looked at again.
const HOLD_CHECK_INTERVAL: Duration = Duration::from_millis(20);
/// Incident snapshots waiting for the Alertmanager pusher; it only needs the latest.
const ALERT_SNAPSHOTS: usize = 4;
/// How often the incident signatures are evaluated.
const INCIDENT_EVALUATION_INTERVAL: Duration = Duration::from_secs(1);
/// Events held at once at most; beyond it they go out with what is known at once.
const MAX_HELD: usize = 10_000;
/// How often to look for the kernel modules probes wait for (sunrpc, nfsv4, nf_conntrack).
const MODULE_WATCH_INTERVAL: Duration = Duration::from_secs(5);

pub async fn run(config: Config) -> anyhow::Result<()> {
    // First of all: a SIGTERM that arrives while starting must still end in a clean shutdown
    // (sysctl restored, programs detached), not in the default action.
    let signals = Signals::install()?;
    // Endpoints first: a port or socket in use must fail before anything is loaded into the kernel.
    let http_listener = TcpListener::bind(config.listen)
        .await
        .with_context(|| format!("cannot listen on {}", config.listen))?;
    let api_listener = api::server::bind(&config.api_socket)
        .await
        .with_context(|| format!("cannot serve the API on {}", config.api_socket.display()))?;

    let kernel_release = kernel::release();
    let metrics = Arc::new(Metrics::new(crate::export::metrics::ephemeral_port_range()));
    let hung_task_timeout = match config.hung_task_timeout_secs {
        Some(secs) => {
            Some(kernel::HungTaskTimeout::set(secs).context("cannot set kernel.hung_task_timeout_secs")?)
        }
        None => None,
    };
    for missing in kernel::missing_capabilities() {
        tracing::warn!(capability = missing.name, "missing capability: {}", missing.without);
    }
    let mut loaded = probes::load(&config);
    describe_hung_task_detector(&mut loaded.statuses, hung_task_timeout.as_ref());
    // Loading parsed the kernel's BTF several times (tens of MB, now freed): hand it back to the
    // system instead of keeping it as the agent's resident size for its whole life.
    // SAFETY: no preconditions.
    unsafe { libc::malloc_trim(0) };
    metrics.set_probe_statuses(&loaded.statuses);
    for s in loaded.statuses.iter().filter(|s| !s.up) {
        let reason = s.reason.as_deref().unwrap_or("");
        // NFS waiting for its modules is how a node without NFS mounts looks, not a fault.
        if s.name == probes::nfs::NAME && loaded.nfs.pending {
            tracing::info!(probe = %s.name, reason, "probe waiting");
        } else {
            tracing::warn!(probe = %s.name, reason, "probe unavailable");
        }
    }
    let up = loaded.statuses.iter().filter(|s| s.up).count();
    tracing::info!(kernel = %kernel_release, probes_up = up, probes = loaded.statuses.len(), listen = %config.listen,
        api = %config.api_socket.display(), "kstall agent running");

    let (events_tx, _) = broadcast::channel::<Arc<Event>>(SUBSCRIBER_BUFFER);
    let shutdown = CancellationToken::new();
    let statuses = Arc::new(Mutex::new(loaded.statuses.clone()));
    let stop_intake = CancellationToken::new();
    let attribution = start_attribution(&config, stop_intake.clone()).await;
    let incidents = Arc::new(Mutex::new(Engine::new(config.node_name.clone(), &config.incidents)));
    let hung = Arc::new(Mutex::new(HungTaskTracker::default()));
    let state = Arc::new(AgentState {
        started: Instant::now(),
        kernel: kernel_release,
        probes: statuses.clone(),
        metrics: metrics.clone(),
        events: events_tx.clone(),
        attribution: attribution.index.clone(),
        pod_source: attribution.health.clone(),
        retention: config.pod_retention,
        incidents: incidents.clone(),
        hung: hung.clone(),
    });

    let http_task = tokio::spawn(http::serve(http_listener, state.clone(), shutdown.clone()));
    let api_task =
        tokio::spawn(api::server::serve(api_listener, config.api_socket.clone(), state, shutdown.clone()));
    let (alerts_tx, alerts_rx) = mpsc::channel(ALERT_SNAPSHOTS);
    let pusher = (!config.alertmanager_urls.is_empty()).then(|| {
        let urls = config.alertmanager_urls.clone();
        tokio::spawn(alertmanager::run(urls, alerts_rx, metrics.clone(), shutdown.clone()))
    });
    let pusher_tx = pusher.is_some().then_some(alerts_tx);
    let evaluator =
        tokio::spawn(evaluate_incidents(incidents.clone(), metrics.clone(), pusher_tx, stop_intake.clone()));
    let symbols = Arc::new(Symbols::default());
    let refresher = tokio::spawn(refresh_symbols(symbols.clone(), stop_intake.clone()));
    let mut decoder = loaded.decoder.clone();
    decoder.symbols = symbols;
    decoder.oom.critical_comms = config.critical_comms.clone();
    let sweeper = tokio::spawn(sweep_hung_tasks(
        hung.clone(),
        metrics.clone(),
        incidents.clone(),
        events_tx.clone(),
        stop_intake.clone(),
    ));
    let record_raw = match &config.record_raw {
        Some(path) => Some(std::io::BufWriter::new(
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(path)
                .with_context(|| format!("cannot open {} (--record-raw)", path.display()))?,
        )),
        None => None,
    };
    let reader = loaded.events.take().map(|ring| {
        let pipeline = Pipeline {
            decoder,
            index: attribution.index.clone(),
            misses: attribution.misses.clone(),
            pod_source: attribution.health.clone(),
            held: Held::default(),
            metrics: metrics.clone(),
            events: events_tx,
            hung,
            incidents,
            record_raw,
        };
        tokio::spawn(read_events(ring, pipeline, stop_intake.clone()))
    });
    let loss =
        loaded.lost.take().map(|lost| tokio::spawn(poll_losses(lost, metrics.clone(), stop_intake.clone())));
    let loaded = Arc::new(Mutex::new(loaded));
    // Its own token: it must stop before the probes are detached, not with the readers after.
    let stop_module_watch = CancellationToken::new();
    let module_watch =
        tokio::spawn(watch_modules(loaded.clone(), statuses, metrics.clone(), stop_module_watch.clone()));

    signals.wait().await;
    tracing::info!("shutting down: detaching probes");
    stop_module_watch.cancel();
    let _ = module_watch.await;
    let detached = loaded.lock().expect("probes").detach_all();
    stop_intake.cancel();
    if let Some(reader) = reader {
        let drained = reader.await.unwrap_or(0);
        tracing::info!(detached, drained, "probes detached, ring buffer drained");
    }
    if let Some(loss) = loss {
        let _ = loss.await;
    }
    let _ = tokio::join!(sweeper, refresher, evaluator);
    for task in attribution.tasks {
        let _ = task.await;
    }
    drop(hung_task_timeout);
    shutdown.cancel();
    let _ = tokio::join!(http_task, api_task);
    if let Some(pusher) = pusher {
        let _ = pusher.await;
    }
    drop(loaded);
    tracing::info!("kstall agent stopped");
    Ok(())
}

struct Signals {
    term: tokio::signal::unix::Signal,
    int: tokio::signal::unix::Signal,
}

impl Signals {
    fn install() -> anyhow::Result<Self> {
        Ok(Self {
            term: tokio::signal::unix::signal(SignalKind::terminate()).context("SIGTERM handler")?,
            int: tokio::signal::unix::signal(SignalKind::interrupt()).context("SIGINT handler")?,
        })
    }

    async fn wait(mut self) {
        tokio::select! {
            _ = self.term.recv() => {},
            _ = self.int.recv() => {},
        }
    }
}

struct Pipeline {
    decoder: Decoder,
    index: watch::Receiver<Arc<Index>>,
    misses: mpsc::Sender<Key>,
    pod_source: Health,
    held: Held,
    metrics: Arc<Metrics>,
    events: broadcast::Sender<Arc<Event>>,
    hung: Arc<Mutex<HungTaskTracker>>,
    incidents: Arc<Mutex<Engine>>,
    record_raw: Option<std::io::BufWriter<std::fs::File>>,
}

/// Events waiting for the resolver, in arrival order.
#[derive(Default)]
struct Held {
    events: std::collections::VecDeque<HeldEvent>,
    /// Keys already sent to the resolver (until the next index).
    asked: std::collections::HashSet<Key>,
    /// Keys whose wait ran out: their events are not held again until the next index.
    gave_up: std::collections::HashSet<Key>,
}

struct HeldEvent {
    until: Instant,
    key: Key,
    fallback: Option<Arc<Attribution>>,
    event: Event,
}

impl Pipeline {
    fn handle(&mut self, bytes: &[u8]) {
        if let Some(out) = &mut self.record_raw {
            record(out, bytes);
        }
        match self.decoder.decode(bytes) {
            Ok(event) => {
                self.metrics.received(event.header.probe);
                self.attribute(event);
            }
            Err(e) => {
                tracing::debug!(error = %e, "undecodable event");
                self.metrics.decode_error(e.label());
            }
        }
    }

    fn attribute(&mut self, mut event: Event) {
        let resolution = self.index.borrow().resolve(&event);
        match resolution {
            Resolution::Found(who) => {
                event.attribution = Some(who);
                self.emit(event);
            }
            Resolution::Missing { key, fallback } => {
                if self.held.gave_up.contains(&key) || self.held.events.len() >= MAX_HELD {
                    self.emit_unresolved(event, fallback);
                    return;
                }
                if self.held.asked.insert(key) {
                    // A full queue means the resolver is busy with misses already: it will walk.
                    let _ = self.misses.try_send(key);
                }
                self.held.events.push_back(HeldEvent {
                    until: Instant::now() + ATTRIBUTION_HOLD,
                    key,
                    fallback,
                    event,
                });
            }
        }
    }

    /// Sends held events whose answer arrived or whose wait ran out, in arrival order.
    fn release_held(&mut self) {
        if self.index.has_changed().unwrap_or(false) {
            self.index.mark_unchanged();
            self.held.asked.clear();
            self.held.gave_up.clear();
            let index = self.index.borrow().clone();
            self.metrics.set_attribution(&index, &self.pod_source.get());
            self.metrics.forget_pods_except(&index.named_pods);
            lock(&self.incidents).set_node_memory(index.pod_memory_limit_bytes, index.node_memory_bytes);
        }
        if self.held.events.is_empty() {
            return;
        }
        let now = Instant::now();
        let index = self.index.borrow().clone();
        for held in std::mem::take(&mut self.held.events) {
            match index.resolve(&held.event) {
                Resolution::Found(who) => {
                    let mut event = held.event;
                    event.attribution = Some(who);
                    self.emit(event);
                }
                Resolution::Missing { .. } if now >= held.until => {
                    self.held.gave_up.insert(held.key);
                    self.emit_unresolved(held.event, held.fallback);
                }
                Resolution::Missing { .. } => self.held.events.push_back(held),
            }
        }
    }

    fn emit_unresolved(&mut self, mut event: Event, fallback: Option<Arc<Attribution>>) {
        event.attribution = Some(fallback.unwrap_or_default());
        self.emit(event);
    }

    fn emit(&mut self, event: Event) {
        if event.attribution.as_ref().is_none_or(|a| a.pod_uid.is_none() && !a.host) {
            self.metrics.unattributed(event.header.probe);
        }
        if matches!(event.payload, Payload::HungTask(_)) {
            let mut hung = self.hung.lock().expect("hung-task tracker");
            let news = hung.observe(&event);
            self.metrics.set_hung_tasks(&hung);
            if !news {
                return;
            }
        }
        self.metrics.observe(&event);
        lock(&self.incidents).observe(&event);
        // No subscriber is not an error.
        let _ = self.events.send(Arc::new(event));
    }

    /// At shutdown: nothing waits any more.
    fn flush_held(&mut self) {
        for held in std::mem::take(&mut self.held.events) {
            self.emit_unresolved(held.event, held.fallback);
        }
    }
}

/// Starts the resolver and the configured pod metadata source, after a first walk so that the
/// first events already find the pods that exist.
async fn start_attribution(config: &Config, stop: CancellationToken) -> RunningAttribution {
    let settings = resolver::Settings {
        hierarchies: Hierarchies::for_this_host(),
        proc: "/proc".into(),
        retention: config.pod_retention,
        metadata_source: !matches!(config.pod_metadata, PodMetadata::None),
    };
    let first = tokio::task::spawn_blocking(move || {
        let mut r = Resolver::new(settings);
        r.full_walk(Instant::now());
        let index = r.index();
        (r, index)
    })
    .await;
    let (resolver, index) = first.expect("first cgroup walk");
    tracing::info!(
        cgroups = index.by_cgroup.len(),
        pod_netns = index.by_netns.len(),
        "cgroup hierarchy walked"
    );
    let (index_tx, index_rx) = watch::channel(Arc::new(index));
    let (pods_tx, pods_rx) = mpsc::channel(64);
    let (misses_tx, misses_rx) = mpsc::channel(1024);
    let inputs = resolver::Inputs { pods: pods_rx, misses: misses_rx };
    let mut tasks = vec![tokio::spawn(resolver::run(resolver, inputs, index_tx, stop.clone()))];
    let labels = config.pod_labels.clone();
    let health = match &config.pod_metadata {
        PodMetadata::None => Health::new("none".into(), true),
        PodMetadata::File(path) => {
            let health = Health::new(format!("file {}", path.display()), false);
            tasks.push(tokio::spawn(pods::file::watch(path.clone(), labels, pods_tx, health.clone(), stop)));
            health
        }
        PodMetadata::Api { kubeconfig } => {
            let (kubeconfig, node) = (kubeconfig.clone(), config.node_name.clone());
            let health = Health::new(format!("api (node {node})"), false);
            let source = health.clone();
            tasks.push(tokio::spawn(async move {
                match pods::api::client(kubeconfig.as_deref()).await {
                    Ok(client) => pods::api::watch_pods(client, node, labels, pods_tx, source, stop).await,
                    Err(e) => {
                        let e = format!("{e:#}");
                        tracing::warn!(error = %e, "no Kubernetes API: events carry pod UIDs, not names");
                        source.set(false, Some(e));
                    }
                }
            }));
            health
        }
    };
    RunningAttribution { index: index_rx, tasks, misses: misses_tx, health }
}

/// The running attribution: its index for the event path, its tasks, where misses go, and how
/// its pod metadata source is doing.
struct RunningAttribution {
    index: watch::Receiver<Arc<Index>>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
    misses: mpsc::Sender<Key>,
    health: Health,
}

/// Asks the signatures what fires, once a second; logs what started and what ended.
async fn evaluate_incidents(
    engine: Arc<Mutex<Engine>>,
    metrics: Arc<Metrics>,
    alerts: Option<mpsc::Sender<alertmanager::Snapshot>>,
    stop: CancellationToken,
) {
    let mut tick = tokio::time::interval(INCIDENT_EVALUATION_INTERVAL);
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tick.tick() => {}
        }
        let now = crate::events::unix_now_ns();
        let mut engine = lock(&engine);
        let changes = engine.evaluate(now);
        for i in &changes.fired {
            tracing::warn!(id = %i.id, severity = i.severity.as_str(), namespace = %i.namespace, pod = %i.pod, summary = %i.summary, "incident firing");
        }
        for i in &changes.resolved {
            tracing::info!(id = %i.id, "incident resolved");
        }
        let (firing, evictions): (Vec<_>, Vec<_>) = (engine.firing().cloned().collect(), engine.evictions());
        // Under the engine's lock: the API and /metrics never disagree on what fires.
        metrics.set_incidents(firing.iter(), &changes.fired, &evictions);
        drop(engine);
        if let Some(alerts) = &alerts {
            // A pusher still busy with the last one skips this one: the next carries the same.
            let _ = alerts.try_send(alertmanager::Snapshot { firing, resolved: changes.resolved });
        }
    }
}

/// The incident engine, also after a panic elsewhere while it was held: a bug in one signature
/// must not take the event path and the API down with it.
fn lock(engine: &Mutex<Engine>) -> std::sync::MutexGuard<'_, Engine> {
    engine.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Reads the ring buffer until intake stops, then drains what is left. Returns the number of
/// records drained after the stop.
async fn read_events(ring: RingBuf<MapData>, mut pipeline: Pipeline, stop: CancellationToken) -> u64 {
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
    let mut hold_tick = tokio::time::interval(HOLD_CHECK_INTERVAL);
    hold_tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = stop.cancelled() => break,
            _ = hold_tick.tick() => pipeline.release_held(),
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
    pipeline.release_held();
    pipeline.flush_held();
    if let Some(out) = &mut pipeline.record_raw {
        let _ = std::io::Write::flush(out);
    }
    drained
}

/// `<kind> <hex bytes>` (--record-raw); a write error stops nothing, it is only logged.
fn record(out: &mut std::io::BufWriter<std::fs::File>, bytes: &[u8]) {
    use std::io::Write as _;
    let kind = bytes.get(..4).map(|k| u32::from_ne_bytes(k.try_into().expect("4 bytes"))).unwrap_or(0);
    let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    if let Err(e) = writeln!(out, "{kind} {hex}").and_then(|()| out.flush()) {
        tracing::warn!(error = %e, "--record-raw write failed");
    }
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

/// Forgets hung tasks that left D state or exited, announcing each. The `/proc` reads run on the
/// blocking pool with a deadline, so a misbehaving `/proc` cannot stall the agent.
async fn sweep_hung_tasks(
    hung: Arc<Mutex<HungTaskTracker>>,
    metrics: Arc<Metrics>,
    incidents: Arc<Mutex<Engine>>,
    events: broadcast::Sender<Arc<Event>>,
    stop: CancellationToken,
) {
    let mut tick = tokio::time::interval(HUNG_SWEEP_INTERVAL);
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tick.tick() => {}
        }
        let tracked = hung.lock().expect("hung-task tracker").tracked();
        if tracked.is_empty() {
            continue;
        }
        let read = tokio::task::spawn_blocking(move || {
            tracked
                .into_iter()
                .map(|(tgid, tid)| ((tgid, tid), hung_tasks::read_task_state(tgid, tid)))
                .collect::<Vec<_>>()
        });
        let Ok(Ok(states)) = tokio::time::timeout(Duration::from_secs(2), read).await else {
            tracing::warn!("reading hung tasks' state from /proc timed out");
            continue;
        };
        let now = crate::events::unix_now_ns();
        let mut tracker = hung.lock().expect("hung-task tracker");
        for event in tracker.clear(&states, now) {
            lock(&incidents).observe(&event);
            let _ = events.send(Arc::new(event));
        }
        metrics.set_hung_tasks(&tracker);
    }
}

/// Keeps kernel symbols current: loaded at start, reloaded when modules come or go.
async fn refresh_symbols(symbols: Arc<Symbols>, stop: CancellationToken) {
    let mut tick = tokio::time::interval(SYMBOLS_REFRESH_INTERVAL);
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tick.tick() => {}
        }
        let symbols = symbols.clone();
        match tokio::task::spawn_blocking(move || symbols.refresh().map(|reloaded| (reloaded, symbols.len())))
            .await
        {
            Ok(Ok((true, 0))) => {
                tracing::warn!(
                    "/proc/kallsyms shows no addresses (kernel.kptr_restrict, or no CAP_SYSLOG): stacks stay unsymbolized"
                )
            }
            Ok(Ok((true, n))) => tracing::info!(symbols = n, "loaded kernel symbols"),
            Ok(Ok((false, _))) => {}
            Ok(Err(e)) => tracing::warn!(error = %e, "cannot read kernel symbols"),
            Err(e) => tracing::warn!(error = %e, "symbol refresh task failed"),
        }
    }
}

/// Adds what the hung-task detector is set to, to the probe's status: a probe that is up but
/// whose detector is off would otherwise look healthy and report nothing.
fn describe_hung_task_detector(
    statuses: &mut [probes::ProbeStatus],
    lowered: Option<&kernel::HungTaskTimeout>,
) {
    let Some(status) = statuses.iter_mut().find(|s| s.name == hung_task::NAME && s.up) else { return };
    let note = match (kernel::hung_task_timeout_secs(), lowered) {
        (Some(0), _) => {
            "detector disabled (kernel.hung_task_timeout_secs=0): no hung task will be reported".to_string()
        }
        (Some(now), Some(l)) => {
            format!("detector: kernel.hung_task_timeout_secs={now} (set by kstall, was {})", l.previous())
        }
        (Some(now), None) => format!("detector: kernel.hung_task_timeout_secs={now}"),
        (None, _) => "detector: kernel.hung_task_timeout_secs unreadable".to_string(),
    };
    status.notes.push(note);
}

/// Completes what waits for a kernel module: the NFS probe attaches when sunrpc appears (the
/// first NFS mount loads it) and its nfsv4 hook when nfsv4 does; tcp-reset gets original
/// destinations when nf_conntrack loads (the first NAT rule). No restart needed.
async fn watch_modules(
    loaded: Arc<Mutex<probes::Loaded>>,
    statuses: Arc<Mutex<Vec<probes::ProbeStatus>>>,
    metrics: Arc<Metrics>,
    stop: CancellationToken,
) {
    let mut tick = tokio::time::interval(MODULE_WATCH_INTERVAL);
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tick.tick() => {}
        }
        // BTF parsing and attaching take a moment; nothing on the event path waits on this lock.
        let mut probes = loaded.lock().expect("probes");
        if !probes.nfs.pending && !probes.conntrack_pending {
            return;
        }
        let nfs = if probes.nfs.pending { probes.attach_nfs_if_loaded() } else { None };
        let conntrack = if probes.conntrack_pending { probes.conntrack_if_loaded() } else { None };
        drop(probes);
        let mut all = statuses.lock().expect("probe statuses");
        if let Some(status) = nfs {
            match &status.reason {
                None => tracing::info!(hook = status.hook.as_deref().unwrap_or(""), "nfs probe attached"),
                Some(reason) => tracing::warn!(reason, "sunrpc appeared but the nfs probe cannot attach"),
            }
            if let Some(slot) = all.iter_mut().find(|s| s.name == status.name) {
                *slot = status;
            }
        }
        if let Some(note) = conntrack {
            tracing::info!(note, "nf_conntrack appeared");
            if let Some(tcp) = all.iter_mut().find(|s| s.name == probes::tcp_reset::NAME) {
                tcp.notes.retain(|n| !n.starts_with("original destination"));
                tcp.notes.push(note);
            }
        }
        metrics.set_probe_statuses(&all);
    }
}
