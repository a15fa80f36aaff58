//! `kstall agent`: wiring and shutdown. Binds its endpoints, loads the probes, starts each part's
//! loop (the pipeline, the resolver, the incident evaluator, the watchers) with what it shares,
//! and on SIGTERM/SIGINT stops intake (detach), drains what the kernel already queued, restores
//! what it changed, and exits.

use std::{
    path::{Path, PathBuf},
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use anyhow::Context as _;
use tokio::{
    net::TcpListener,
    signal::unix::SignalKind,
    sync::{broadcast, mpsc, watch},
};
use tokio_util::sync::CancellationToken;

use crate::{
    api,
    attribution::flags::PodMetadata,
    attribution::{
        Attributed, Index, Key,
        cgroup::Hierarchies,
        pods::{self, Health},
        resolver::{self, Resolver},
    },
    config::Config,
    conntrack,
    events::{Counts, Decoder},
    export::{alertmanager, json_lines, kubernetes, metrics::Metrics, otlp},
    incidents::{
        engine::Engine,
        evaluator::{self, Subscriber},
        history,
        saved::{self, Loaded},
    },
    kernel, kubelet,
    pipeline::{self, Pipeline},
    pressure,
    probes::{self, probe::Sweep},
    state::AgentState,
    stuck::{self, StuckSet},
    symbols,
};

/// Events buffered per API subscriber before a slow one starts losing them.
const SUBSCRIBER_BUFFER: usize = 4096;
/// How long a shutdown waits for running captures to write their bundles: their end snapshot
/// reads are bounded at 1–2 s each, well inside a pod's 30 s grace period.
const CAPTURES_END_WITHIN: Duration = Duration::from_secs(10);

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

    let kernel_release = kernel::release();
    let counts = Arc::new(Counts::default());
    let metrics = Arc::new(Metrics::new(counts.clone(), config.metrics));
    for missing in kernel::missing_capabilities() {
        tracing::warn!(capability = missing.name, "missing capability: {}", missing.without);
    }
    let (mut loaded, statuses) = probes::load(&config.probes);
    // Loading parsed the kernel's BTF several times (tens of MB, now freed): hand it back to the
    // system instead of keeping it as the agent's resident size for its whole life.
    // SAFETY: no preconditions.
    unsafe { libc::malloc_trim(0) };
    metrics.set_probe_statuses(&statuses);
    // Held until the agent exits: the kernel counts the programs' runs while anyone holds it.
    let _run_time_stats = config.probes.program_stats.then(probes::runs::enable_run_time_stats).and_then(|held| {
        held.inspect(|_| counts.hold_run_time_stats())
            .inspect_err(|e| {
                tracing::warn!(error = %e, "cannot turn on the kernel's run-time statistics (--program-stats on); the programs' runs are not counted")
            })
            .ok()
    });
    for s in statuses.iter().filter(|s| !s.up) {
        let reason = s.reason.as_deref().unwrap_or("");
        // Waiting for its modules (NFS) is how a node without NFS mounts looks, not a fault.
        if loaded.waiting(&s.name) {
            tracing::info!(probe = %s.name, reason, "probe waiting");
        } else {
            tracing::warn!(probe = %s.name, reason, "probe unavailable");
        }
    }
    let up = statuses.iter().filter(|s| s.up).count();
    tracing::info!(kernel = %kernel_release, probes_up = up, probes = statuses.len(), listen = %config.listen,
        api = %config.api_socket.display(), "kstall agent running");

    let (events_tx, _) = broadcast::channel::<Arc<Attributed>>(SUBSCRIBER_BUFFER);
    let shutdown = CancellationToken::new();
    let stop_intake = CancellationToken::new();
    let attribution = start_attribution(&config, stop_intake.clone()).await;
    let mut engine = Engine::new(config.node_name.clone(), &config.incidents);
    let state_dir =
        config.state_dir.as_deref().filter(|dir| restore_incidents(dir, &config.node_name, &mut engine));
    let incidents = Arc::new(Mutex::new(engine));
    let stuck = Arc::new(Mutex::new(StuckSet::default()));
    let statuses = Arc::new(Mutex::new(statuses));
    let (kubelet_tx, kubelet_health) = watch::channel(kubelet::Health::default());
    let (conntrack_tx, conntrack_tables) = watch::channel(Arc::new(conntrack::Tables::default()));
    let (pressure_tx, pressure_sample) = watch::channel(Arc::new(pressure::Sample::default()));
    // Status shows the index the event path has applied, its forgotten pods' series removed (the
    // resolver's own without an event path, where no series are made).
    let (applied_tx, applied_index) = watch::channel(attribution.index.borrow().clone());
    let shown_index = if loaded.events.is_some() { applied_index } else { attribution.index.clone() };
    let captures = captures(&config);
    let (triggers, recent) = wire_captures(&captures, &incidents, &metrics);
    let ending_captures = captures.as_ref().ok().cloned();
    let state = Arc::new(AgentState {
        started: Instant::now(),
        kernel: kernel_release,
        probes: statuses.clone(),
        metrics: metrics.clone(),
        counts: counts.clone(),
        events: events_tx.clone(),
        attribution: shown_index,
        pod_source: attribution.health.clone(),
        retention: config.pod_retention,
        incidents: incidents.clone(),
        stuck: stuck.clone(),
        kubelet: kubelet_health.clone(),
        conntrack: conntrack_tables.clone(),
        pressure: pressure_sample.clone(),
        nfs_ports: config.incidents.nfs_ports.clone(),
        captures,
    });

    let web = match &config.web_config_file {
        Some(path) => Some((path.clone(), crate::web_config::load(path).map_err(anyhow::Error::msg)?)),
        None => None,
    };
    let http_task = tokio::spawn(api::http::serve(http_listener, state.clone(), web, shutdown.clone()));
    let api_task =
        tokio::spawn(api::server::serve(api_listener, config.api_socket.clone(), state, shutdown.clone()));
    // Who takes what the evaluator finds, each on its own: a new output is one more here.
    let mut subscribers: Vec<Box<dyn Subscriber>> = vec![Box::new(metrics.clone())];
    let mut writers = Vec::new();
    if !config.alertmanager.urls.is_empty() {
        let (pusher, feed) =
            alertmanager::pusher(config.alertmanager.clone(), metrics.clone(), shutdown.clone());
        writers.push(tokio::spawn(pusher));
        subscribers.push(Box::new(feed));
    }
    if let Some(settings) = config.export_events.clone() {
        let (writer, feed) = json_lines::start(
            settings,
            config.node_name.clone(),
            &events_tx,
            metrics.clone(),
            shutdown.clone(),
        );
        writers.push(tokio::spawn(writer));
        subscribers.push(Box::new(feed));
    }
    if let Some(settings) = config.export_otlp.clone() {
        let (exporter, feed) =
            otlp::start(settings, config.node_name.clone(), &events_tx, metrics.clone(), shutdown.clone());
        writers.push(tokio::spawn(exporter));
        subscribers.push(Box::new(feed));
    }
    if let Some(dir) = state_dir {
        let written = history_written(dir.to_path_buf(), metrics.clone());
        let (writer, feed) = history::writer(dir.to_path_buf(), written, shutdown.clone());
        writers.push(tokio::spawn(writer));
        subscribers.push(Box::new(feed));
    }
    if let Some(client) = &attribution.client {
        let node = config.node_name.clone();
        if config.kubernetes.events {
            let settings = kubernetes::events::Settings::default();
            let (writer, feed) = kubernetes::events::writer(
                client.clone(),
                node.clone(),
                settings,
                metrics.clone(),
                shutdown.clone(),
            );
            writers.push(tokio::spawn(writer));
            subscribers.push(Box::new(feed));
        }
        if !config.kubernetes.node_taints.is_empty() {
            let (writer, feed) = kubernetes::taints::writer(
                client.clone(),
                node.clone(),
                config.kubernetes.node_taints.clone(),
                config.kubernetes.taint_holds,
                metrics.clone(),
                shutdown.clone(),
            );
            writers.push(tokio::spawn(writer));
            subscribers.push(Box::new(feed));
        }
        if !config.kubernetes.node_conditions.is_empty() {
            let (enabled, settings) =
                (config.kubernetes.node_conditions.clone(), kubernetes::conditions::Settings::default());
            let (writer, feed) = kubernetes::conditions::writer(
                client.clone(),
                node,
                settings,
                enabled,
                metrics.clone(),
                shutdown.clone(),
            );
            writers.push(tokio::spawn(writer));
            subscribers.push(Box::new(feed));
        }
    }
    let kubelet_checks = config
        .kubelet
        .clone()
        .map(|settings| tokio::spawn(kubelet::watch(settings, kubelet_tx, stop_intake.clone())));
    let conntrack_sampler = tokio::spawn(conntrack::watch(
        conntrack::Settings::default(),
        attribution.index.clone(),
        conntrack_tx,
        stop_intake.clone(),
    ));
    let pressure_settings = pressure::Settings {
        proc: "/proc".into(),
        interval: pressure::DEFAULT_INTERVAL,
        cgroup_v2: Hierarchies::for_this_host().v2.is_some(),
    };
    let pressure_sampler = tokio::spawn(pressure::watch(
        pressure_settings,
        attribution.index.clone(),
        pressure_tx,
        stop_intake.clone(),
    ));
    let inputs = evaluator::Inputs {
        stuck: stuck.clone(),
        index: attribution.index.clone(),
        kubelet: kubelet_health,
        conntrack: conntrack_tables,
        pressure: pressure_sample,
    };
    let evaluator =
        tokio::spawn(evaluator::run(incidents.clone(), inputs, triggers, subscribers, stop_intake.clone()));
    symbols::refresh(loaded.decoding.symbols.clone()).await;
    let symbols = tokio::spawn(symbols::keep_current(loaded.decoding.symbols.clone(), stop_intake.clone()));
    let (states_tx, states_rx) = mpsc::channel(1);
    let stuck_states = {
        let metrics = metrics.clone();
        let swept = move |sweep: &Result<Sweep, String>| metrics.task_sweep(sweep);
        stuck::follow(loaded.take_task_sweeps(), stuck.clone(), states_tx, swept, stop_intake.clone())
    };
    let reader = loaded.events.take().map(|ring| {
        let pipeline = Pipeline {
            decoder: Decoder::new(loaded.decoding.clone()),
            index: attribution.index.clone(),
            applied: applied_tx,
            misses: attribution.misses.clone(),
            counts: counts.clone(),
            metrics: metrics.clone(),
            stuck,
            incidents,
            events: events_tx,
            recent,
            record_raw,
            held: Default::default(),
            count_keys: Default::default(),
            ring_fill: loaded.ring_fill.take().inspect(|fill| counts.set_ring_size(fill.size())),
        };
        let counters = loaded.counters.take();
        let wakeup =
            loaded.wakeup.take().map(|map| pipeline::Wakeup::new(map, config.probes.ring_buffer_bytes));
        tokio::spawn(pipeline::run(ring, wakeup, counters, pipeline, states_rx, stop_intake.clone()))
    });
    let loss = loaded.lost.take().map(|lost| {
        tokio::spawn(pipeline::poll_losses(lost, loaded.programs.take(), counts, stop_intake.clone()))
    });
    let loaded = Arc::new(Mutex::new(loaded));
    // Its own token: it must stop before the probes are detached, not with the readers after.
    let stop_module_watch = CancellationToken::new();
    let module_watch = tokio::spawn(probes::watch_modules(
        loaded.clone(),
        statuses,
        {
            let metrics = metrics.clone();
            move |all| metrics.set_probe_statuses(all)
        },
        stop_module_watch.clone(),
    ));

    signals.wait().await;
    // Running captures end first: their bundles are written (cut: the agent shut down) while the
    // engine still takes their end, before the incident history's last save.
    if let Some(captures) = ending_captures {
        let left = tokio::task::spawn_blocking(move || captures.end_all(CAPTURES_END_WITHIN)).await;
        match left {
            Ok(left) if !left.is_empty() => {
                tracing::warn!(?left, "captures not written at shutdown: the next start marks them failed")
            }
            _ => {}
        }
    }
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
    let _ = tokio::join!(stuck_states, symbols, evaluator, conntrack_sampler, pressure_sampler);
    if let Some(checks) = kubelet_checks {
        let _ = checks.await;
    }
    for task in attribution.tasks {
        let _ = task.await;
    }
    shutdown.cancel();
    let _ = tokio::join!(http_task, api_task);
    for task in writers {
        let _ = task.await;
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
    let mut client = None;
    let health = match &config.pod_metadata {
        PodMetadata::None => Health::new("none".into(), true),
        PodMetadata::File(path) => {
            let health = Health::new(format!("file {}", path.display()), false);
            tasks.push(tokio::spawn(pods::file::watch(path.clone(), labels, pods_tx, health.clone(), stop)));
            health
        }
        PodMetadata::Api { kubeconfig } => {
            let node = config.node_name.clone();
            let health = Health::new(format!("api (node {node})"), false);
            match pods::api::client(kubeconfig.as_deref()).await {
                Ok(c) => {
                    let watch = pods::api::watch_pods(c.clone(), node, labels, pods_tx, health.clone(), stop);
                    tasks.push(tokio::spawn(watch));
                    client = Some(c);
                }
                Err(e) => {
                    let e = format!("{e:#}");
                    tracing::warn!(error = %e, "no Kubernetes API: events carry pod UIDs, not names");
                    health.set(false, Some(e));
                }
            }
            health
        }
    };
    RunningAttribution { index: index_rx, tasks, misses: misses_tx, health, client }
}

/// The running attribution: its index for the event path, its tasks, where misses go, and how
/// its pod metadata source is doing.
struct RunningAttribution {
    index: watch::Receiver<Arc<Index>>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
    misses: mpsc::Sender<Key>,
    health: Health,
    /// The API client of the pod source, shared with the API's writers.
    client: Option<kube::Client>,
}

/// Takes back the incident history an earlier run left in `dir`; false when the directory cannot
/// be used (the agent then runs with its history in memory only, and says so once).
fn restore_incidents(dir: &Path, node: &str, engine: &mut Engine) -> bool {
    let unusable = |e: std::io::Error| {
        tracing::warn!(dir = %dir.display(), error = %e,
            "state directory unusable: the incident history will not survive a restart");
        false
    };
    if let Err(e) = saved::create_dir(dir) {
        return unusable(e);
    }
    match saved::load(dir, node) {
        Ok(Loaded::Nothing) => {}
        Ok(Loaded::History(history)) => {
            tracing::info!(
                firing = history.firing.len(),
                resolved = history.resolved.len(),
                saved_unix_ns = history.saved_unix_ns,
                "incident history restored"
            );
            engine.restore(history, kernel::unix_now_ns());
        }
        Ok(Loaded::MovedAside { to, why }) => {
            tracing::warn!(file = %to.display(), reason = %why, "incident history not restored: moved aside");
        }
        Err(e) => return unusable(e),
    }
    true
}

/// Counts each write of the history and logs a failure once, until a write succeeds again.
fn history_written(dir: PathBuf, metrics: Arc<Metrics>) -> impl Fn(&std::io::Result<usize>) + Send + 'static {
    let failing = std::sync::atomic::AtomicBool::new(false);
    move |result| {
        metrics.state_write(result.is_ok());
        let was_failing = failing.swap(result.is_err(), std::sync::atomic::Ordering::Relaxed);
        match result {
            Err(e) if !was_failing => tracing::warn!(dir = %dir.display(), error = %e,
                "cannot write the incident history; it will not survive a restart"),
            Ok(_) if was_failing => tracing::info!(dir = %dir.display(), "incident history written again"),
            _ => {}
        }
    }
}

/// What acts on incidents as they fire (the captures `--capture-on` asks for), and the ring of
/// the node's last events that bundles take their pod's from — kept only where the agent can
/// capture. The captures' end reaches the engine (each incident's `capture` evidence then says
/// complete or failed) and the metrics; bundles take a pod's incidents from the engine.
fn wire_captures(
    captures: &Result<Arc<crate::capture::service::Captures>, String>,
    engine: &Arc<Mutex<Engine>>,
    metrics: &Arc<Metrics>,
) -> (Vec<Box<dyn evaluator::Trigger>>, Option<Arc<crate::capture::context::Recent>>) {
    use crate::capture::{
        context::{Context, EVENTS_KEPT, Recent},
        service::Wiring,
    };
    let Ok(captures) = captures else { return (Vec::new(), None) };
    let recent = Arc::new(Recent::new(EVENTS_KEPT));
    let annotated = engine.clone();
    captures.wire(Wiring {
        on_end: Box::new(move |incidents, entry| {
            let mut engine = annotated.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            for id in incidents {
                engine.annotate(id, crate::incidents::engine::CAPTURE, entry.clone());
            }
        }),
        context: Context { recent: recent.clone(), incidents: engine.clone() },
        metrics: metrics.clone(),
    });
    let triggers = crate::capture::trigger::OnIncident::new(captures.clone())
        .map(|t| Box::new(t) as Box<dyn evaluator::Trigger>)
        .into_iter()
        .collect();
    (triggers, Some(recent))
}

/// The captures under `<state>/captures`, or why there are none (no state dir, or it cannot be
/// made: one warning, and the agent runs on without them).
fn captures(config: &Config) -> Result<Arc<crate::capture::service::Captures>, String> {
    let Some(dir) = &config.state_dir else {
        return Err(crate::capture::service::OFF.to_string());
    };
    crate::capture::service::Captures::open(&dir.join("captures"), config.captures.clone(), &config.node_name)
        .map(Arc::new)
        .map_err(|e| {
            tracing::warn!(error = %e, "captures are off");
            format!("captures are off: {e}")
        })
}
