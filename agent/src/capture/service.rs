//! The agent's captures: the store under `<state>/captures/`, and the captures running now, each
//! on a `std` thread of its own (`kstall-capture`) calling [`runner::run`] with its own stop
//! flag. One capture at a time per network namespace (a pod), at most `--capture-running` on the
//! node. Nothing here blocks for long: the API's async tasks call it and poll [`Captures::info`].

use std::{
    collections::VecDeque,
    fs::File,
    path::PathBuf,
    sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock, PoisonError},
    time::{Duration, Instant},
};

use serde::{Deserialize, Serialize};

use super::{
    bundle::{FilterFrom, Pod, Time, Trigger, TriggerKind},
    context::Context,
    filter::{Link, Snaplen},
    flags::{Settings, check_duration},
    packets::{Bounds, Stop, size},
    runner::{self, Joined, Plan, Target},
    store::{self, Retention, Store, Summary},
};

/// The one line of an agent without a state dir.
pub const OFF: &str =
    "captures are off: the agent runs with --state-dir none (bundles live under the state dir)";

/// Failed captures remembered for `kstall capture list` (they have no bundle).
const FAILED_KEPT: usize = 16;

/// An incident starts at most one capture of its pod in this long: a flapping incident does not
/// fill the disk with one case.
const PER_POD_EVERY: Duration = Duration::from_secs(600);

const HOUR: Duration = Duration::from_secs(3600);

/// A capture as the API shows it: running, done (with its bundle's summary) or failed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Info {
    pub id: String,
    /// `running`, `done` or `failed`.
    pub state: String,
    /// `shop/web-1`, or `netns 4026532999`.
    pub target: String,
    pub netns: u64,
    pub started: Time,
    /// When it ends at the latest (running captures).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub until: Option<Time>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub filter: Option<String>,
    pub duration_secs: u64,
    pub max_bytes: u64,
    pub max_packets: u64,
    pub snaplen: String,
    /// Why it failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// The bundle's summary, once done.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub summary: Option<Summary>,
}

impl Info {
    /// A bundle kept in the store, as `done`.
    pub fn done(summary: Summary) -> Self {
        let target = match (&summary.namespace, &summary.pod) {
            (Some(ns), Some(pod)) => format!("{ns}/{pod}"),
            _ => format!("netns {}", summary.netns),
        };
        Info {
            id: summary.id.clone(),
            state: "done".into(),
            target,
            netns: summary.netns,
            started: summary.started,
            until: None,
            filter: None,
            duration_secs: 0,
            max_bytes: 0,
            max_packets: 0,
            snaplen: String::new(),
            error: None,
            summary: Some(summary),
        }
    }
}

/// What is asked of a capture, as the API carries it (unset: the agent's defaults).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Ask {
    pub filter: Option<String>,
    pub duration_secs: Option<u64>,
    pub max_bytes: Option<u64>,
    pub max_packets: Option<u64>,
    pub snaplen: Option<String>,
}

/// The incident a capture asked for by hand is of (`kstall capture start --incident ID`).
pub struct About {
    pub id: String,
    pub signature: String,
    /// Its peers and ports ([`super::trigger::default_filter`]).
    pub filter: Option<String>,
}

struct Running {
    info: Info,
    stop: Arc<Stop>,
    /// The incidents it is the capture of: the one that started it, those that joined.
    incidents: Joined,
}

/// A capture an incident started: when, of which pod.
struct Started {
    at_ns: u64,
    pod: String,
    id: String,
}

#[derive(Default)]
struct Book {
    running: Vec<Running>,
    failed: Vec<Info>,
    /// Those of the last hour.
    triggered: VecDeque<Started>,
}

/// Told when a capture that incidents asked for ends: their ids, and the capture's evidence
/// entry as it now stands.
pub type OnEnd = Box<dyn Fn(&[String], serde_json::Value) + Send + Sync>;

pub struct Captures {
    store: Store,
    settings: Settings,
    node: String,
    proc: PathBuf,
    book: Arc<Mutex<Book>>,
    /// Told each time a capture leaves the book (the agent's shutdown waits on it).
    ended: Condvar,
    wiring: OnceLock<Wiring>,
}

/// What the agent gives its captures once both are up: who hears of the end of captures that
/// incidents asked for (the engine, to update their evidence), where bundles find what kstall
/// knows of a pod, and the metrics.
pub struct Wiring {
    pub on_end: OnEnd,
    pub context: Context,
    pub metrics: Arc<crate::export::metrics::Metrics>,
}

fn lock(book: &Mutex<Book>) -> MutexGuard<'_, Book> {
    book.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Whether one more capture of namespace `netns` (`label`) may start beside `running`: one per
/// namespace, at most `limit` on the node; else the refusal's one line.
pub fn admit(running: &[Info], netns: u64, label: &str, limit: usize) -> Result<(), String> {
    if let Some(other) = running.iter().find(|r| r.netns == netns) {
        let until = other.until.map(clock).map(|t| format!(" until {t} UTC")).unwrap_or_default();
        return Err(format!("capture of {label} refused: {} is capturing it{until}", other.id));
    }
    if running.len() >= limit {
        return Err(format!(
            "capture refused: {} captures are running on this node (--capture-running {limit})",
            running.len()
        ));
    }
    Ok(())
}

/// `04:22:20` of a time.
fn clock(t: Time) -> String {
    jiff::Timestamp::from_nanosecond(i128::from(t.0))
        .map(|t| t.strftime("%H:%M:%S").to_string())
        .unwrap_or_default()
}

/// The request's bounds, each unset one at the agent's default, each checked against its ceiling.
pub fn bounds(ask: &Ask, settings: &Settings) -> Result<(Bounds, Snaplen), String> {
    let duration = ask.duration_secs.map_or(settings.duration, Duration::from_secs);
    check_duration(&format!("--duration {}s", duration.as_secs()), duration)?;
    let max_bytes = ask.max_bytes.unwrap_or(settings.max_bytes);
    if max_bytes > settings.max_bytes {
        return Err(format!(
            "--max-bytes {}: more than this agent allows (--capture-max-bytes {})",
            size(max_bytes).replace(' ', ""),
            size(settings.max_bytes)
        ));
    }
    if max_bytes < 64 << 10 {
        return Err(format!("--max-bytes {}: less than 64 KiB", size(max_bytes).replace(' ', "")));
    }
    let max_packets = ask.max_packets.unwrap_or(settings.max_packets);
    if max_packets > settings.max_packets {
        return Err(format!(
            "--max-packets {max_packets}: more than this agent allows (--capture-max-packets {})",
            settings.max_packets
        ));
    }
    if max_packets == 0 {
        return Err("--max-packets 0: would capture nothing".into());
    }
    let snap = Snaplen::parse(ask.snaplen.as_deref().unwrap_or("headers"))?;
    Ok((Bounds { duration, max_bytes, max_packets }, snap))
}

impl Captures {
    /// The store at `dir` (`<state>/captures`).
    pub fn open(dir: &std::path::Path, settings: Settings, node: &str) -> Result<Self, String> {
        let (store, staged) = Store::open(dir, Retention { keep: settings.keep, disk: settings.disk })?;
        if staged > 0 {
            tracing::info!(staged, "removed the staging dirs of captures cut by the agent's last exit");
        }
        Ok(Captures {
            store,
            settings,
            node: node.to_string(),
            proc: PathBuf::from("/proc"),
            book: Arc::default(),
            ended: Condvar::new(),
            wiring: OnceLock::new(),
        })
    }

    /// Set once, by the agent.
    pub fn wire(&self, wiring: Wiring) {
        let _ = self.wiring.set(wiring);
    }

    pub fn settings(&self) -> &Settings {
        &self.settings
    }

    /// Starts capturing `target` as asked, on a thread of its own; refuses in one line. `about`,
    /// an incident the operator named: its peers and ports are the filter unless one is given,
    /// and its `capture` evidence follows the capture as a triggered one's does.
    pub fn start(self: &Arc<Self>, target: Target, ask: &Ask, about: Option<&About>) -> Result<Info, String> {
        let (bounds, snap) = bounds(ask, &self.settings)?;
        let given = ask.filter.as_deref().map(str::trim).filter(|f| !f.is_empty()).map(str::to_string);
        let (filter, filter_from) = match (given, about.and_then(|a| a.filter.clone())) {
            (Some(given), _) => (Some(given), FilterFrom::Given),
            (None, Some(incidents)) => (Some(incidents), FilterFrom::Incident),
            (None, None) => (None, FilterFrom::None),
        };
        super::filter::compile(filter.as_deref(), Link::Ethernet, snap).map_err(|e| e.to_string())?;
        let mut book = lock(&self.book);
        let running: Vec<Info> = book.running.iter().map(|r| r.info.clone()).collect();
        admit(&running, target.pod.netns, &target.label.replace("pod ", ""), self.settings.running)?;
        let how = How {
            filter_from,
            filter,
            snap,
            snaplen: ask.snaplen.clone().unwrap_or_else(|| "headers".into()),
            bounds,
            trigger: Trigger {
                kind: TriggerKind::Manual,
                incidents: about.map(|a| vec![a.id.clone()]).unwrap_or_default(),
                signature: about.map(|a| a.signature.clone()),
                requested_by: "socket".into(),
            },
        };
        self.launch(&mut book, target, how)
    }

    /// What incident `incident` (of `signature`, firing now) makes of a capture of its pod
    /// `target`, with `filter` (its peers and ports): started, joined to the pod's running one,
    /// or skipped; as the incident's evidence entry.
    pub fn start_triggered(
        self: &Arc<Self>,
        target: Target,
        incident: &str,
        signature: &str,
        filter: Option<String>,
    ) -> serde_json::Value {
        let now = crate::kernel::unix_now_ns();
        let pod = target.label.trim_start_matches("pod ").to_string();
        let mut book = lock(&self.book);
        match decide(&mut book, now, &pod, target.pod.netns, &self.settings) {
            Decision::Join(running) => {
                let running = &book.running[running];
                lock_ids(&running.incidents).push(incident.to_string());
                let mut entry = self.capturing(&running.info);
                entry["joined"] = true.into();
                return entry;
            }
            Decision::Skip(why) => return skipped(why),
            Decision::Start => {}
        }
        let snap = Snaplen::Headers;
        // The incident's own filter, or (should libpcap refuse it) the pod's every packet.
        let filter = filter.filter(|f| super::filter::compile(Some(f), Link::Ethernet, snap).is_ok());
        let how = How {
            filter_from: if filter.is_some() { FilterFrom::Incident } else { FilterFrom::None },
            filter,
            snap,
            snaplen: "headers".into(),
            bounds: Bounds {
                duration: self.settings.duration,
                max_bytes: self.settings.max_bytes,
                max_packets: self.settings.max_packets,
            },
            trigger: Trigger {
                kind: TriggerKind::Incident,
                incidents: vec![incident.to_string()],
                signature: Some(signature.to_string()),
                requested_by: "incident".into(),
            },
        };
        match self.launch(&mut book, target, how) {
            Ok(info) => {
                book.triggered.push_back(Started { at_ns: now, pod, id: info.id.clone() });
                self.capturing(&info)
            }
            Err(refused) => skipped(refused),
        }
    }

    /// A running capture as an incident's evidence names it.
    pub fn capturing(&self, info: &Info) -> serde_json::Value {
        serde_json::json!({
            "id": info.id,
            "path": self.store.dir().join(format!("{}.tar.gz", info.id)),
            "state": "capturing",
            "until_unix_ns": info.until.map(|t| t.0),
            "filter": info.filter,
        })
    }

    /// Starts the capture's thread, the book locked.
    fn launch(self: &Arc<Self>, book: &mut Book, target: Target, how: How) -> Result<Info, String> {
        let requested = Time(crate::kernel::unix_now_ns());
        let pod = match (&target.pod.namespace, &target.pod.name) {
            (Some(ns), Some(name)) => Some((ns.as_str(), name.as_str())),
            _ => None,
        };
        let id = store::new_id(requested.0, pod, target.pod.netns);
        let info = Info {
            id: id.clone(),
            state: "running".into(),
            target: target.label.trim_start_matches("pod ").to_string(),
            netns: target.pod.netns,
            started: requested,
            until: Some(Time(requested.0.saturating_add(how.bounds.duration.as_nanos() as u64))),
            filter: how.filter.clone(),
            duration_secs: how.bounds.duration.as_secs(),
            max_bytes: how.bounds.max_bytes,
            max_packets: how.bounds.max_packets,
            snaplen: how.snaplen,
            error: None,
            summary: None,
        };
        let incidents = Joined::default();
        lock_ids(&incidents).extend(how.trigger.incidents.iter().cloned());
        let plan = Plan {
            filter: how.filter,
            filter_from: how.filter_from,
            snap: how.snap,
            bounds: how.bounds,
            trigger: Trigger { incidents: vec![], ..how.trigger },
            joined: incidents.clone(),
            requested,
        };
        let stop = Arc::new(Stop::new());
        let this = self.clone();
        let thread_stop = stop.clone();
        let thread_id = id.clone();
        std::thread::Builder::new()
            .name("kstall-capture".into())
            .spawn(move || this.run(&thread_id, &target, &plan, &thread_stop))
            .map_err(|e| format!("capture refused: cannot start its thread: {e}"))?;
        book.running.push(Running { info: info.clone(), stop, incidents });
        if let Some(wiring) = self.wiring.get() {
            wiring.metrics.set_captures_running(book.running.len());
        }
        Ok(info)
    }

    fn run(&self, id: &str, target: &Target, plan: &Plan, stop: &Stop) {
        let wiring = self.wiring.get();
        let node = runner::Node { name: &self.node, proc: &self.proc, context: wiring.map(|w| &w.context) };
        let outcome = runner::run(&self.store, id, &node, target, plan, stop);
        let mut book = lock(&self.book);
        let Some(at) = book.running.iter().position(|r| r.info.id == id) else { return };
        let Running { mut info, incidents, .. } = book.running.remove(at);
        let entry = match outcome {
            Ok(outcome) => {
                let s = &outcome.summary;
                tracing::info!(id, bytes = s.bytes, packets = s.packets, "capture done");
                serde_json::json!({
                    "id": id,
                    "path": self.store.dir().join(&s.file),
                    "state": "complete",
                    "bytes": s.bytes,
                    "sha256": s.sha256,
                    "packets": s.packets,
                    "cut": s.cut,
                })
            }
            Err(e) => {
                tracing::warn!(id, error = %e, "capture failed");
                info.state = "failed".into();
                info.error = Some(e.clone());
                info.until = None;
                book.failed.push(info);
                let excess = book.failed.len().saturating_sub(FAILED_KEPT);
                book.failed.drain(..excess);
                serde_json::json!({"id": id, "state": "failed", "error": e})
            }
        };
        if let Some(wiring) = wiring {
            let trigger = match plan.trigger.kind {
                TriggerKind::Manual => "manual",
                TriggerKind::Incident => "incident",
            };
            wiring.metrics.capture_ended(trigger, entry["state"] == "complete", book.running.len());
        }
        drop(book);
        let incidents = lock_ids(&incidents).clone();
        if let (false, Some(wiring)) = (incidents.is_empty(), wiring) {
            (wiring.on_end)(&incidents, entry);
        }
        // After the engine has heard: a shutdown waiting on this then saves what it says.
        self.ended.notify_all();
    }

    /// Every capture: the bundles kept (oldest first), the failed ones, then those running.
    pub fn list(&self) -> Vec<Info> {
        let book = lock(&self.book);
        let running: Vec<Info> = book.running.iter().map(|r| r.info.clone()).collect();
        let failed = book.failed.clone();
        drop(book);
        let mut all: Vec<Info> = self.store.list().into_iter().map(Info::done).collect();
        all.extend(failed);
        all.extend(running);
        all
    }

    /// One capture by id, or the one line saying there is none.
    pub fn info(&self, id: &str) -> Result<Info, String> {
        store::check_id(id)?;
        let book = lock(&self.book);
        if let Some(r) = book.running.iter().find(|r| r.info.id == id) {
            return Ok(r.info.clone());
        }
        if let Some(f) = book.failed.iter().find(|f| f.id == id) {
            return Ok(f.clone());
        }
        drop(book);
        match self.store.open_bundle(id) {
            Ok((_, summary)) => Ok(Info::done(summary)),
            Err(_) => Err(no_such(id)),
        }
    }

    /// Ends a running capture early (its bundle is kept, cut); a finished one is left as it is.
    pub fn stop(&self, id: &str) -> Result<Info, String> {
        let info = self.info(id)?;
        if let Some(r) = lock(&self.book).running.iter().find(|r| r.info.id == id) {
            r.stop.ask();
        }
        Ok(info)
    }

    /// At the agent's shutdown: ends every running capture (each bundle is kept, its cut saying
    /// the agent shut down) and waits up to `within` for them to be written. The ids of those
    /// still running then, which the next start marks failed.
    pub fn end_all(&self, within: Duration) -> Vec<String> {
        let deadline = Instant::now() + within;
        let mut book = lock(&self.book);
        for running in &book.running {
            running.stop.shutting_down();
        }
        while !book.running.is_empty() {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            book = self.ended.wait_timeout(book, left).unwrap_or_else(PoisonError::into_inner).0;
        }
        book.running.iter().map(|r| r.info.id.clone()).collect()
    }

    /// A finished capture's bundle, opened, with its summary.
    pub fn open_bundle(&self, id: &str) -> Result<(File, Summary), String> {
        let info = self.info(id)?;
        match info.state.as_str() {
            "running" => Err(format!("capture {id}: still running (kstall capture list)")),
            "failed" => Err(format!("capture {id}: failed: {}", info.error.unwrap_or_default())),
            _ => self.store.open_bundle(id).map_err(|_| no_such(id)),
        }
    }

    /// How many run now.
    pub fn running(&self) -> usize {
        lock(&self.book).running.len()
    }
}

enum Decision {
    /// The pod's capture running now (its index in the book).
    Join(usize),
    Skip(String),
    Start,
}

/// Whether an incident of `pod` (namespace `netns`), firing at `now`, joins the pod's running
/// capture, is skipped (the pod captured less than 10 min ago, the hour's triggered captures
/// reached, the node's running limit), or starts one. Forgets what is more than an hour old.
fn decide(book: &mut Book, now: u64, pod: &str, netns: u64, settings: &Settings) -> Decision {
    if let Some(running) = book.running.iter().position(|r| r.info.netns == netns) {
        return Decision::Join(running);
    }
    let hour_ago = now.saturating_sub(HOUR.as_nanos() as u64);
    while book.triggered.front().is_some_and(|s| s.at_ns < hour_ago) {
        book.triggered.pop_front();
    }
    let cooled = now.saturating_sub(PER_POD_EVERY.as_nanos() as u64);
    if let Some(last) = book.triggered.iter().rev().find(|s| s.pod == pod && s.at_ns >= cooled) {
        let ago = crate::incidents::signatures::human_secs((now - last.at_ns) / 1_000_000_000);
        return Decision::Skip(format!(
            "{pod} was captured {ago} ago ({}): one triggered capture per pod in 10 min",
            last.id
        ));
    }
    if book.triggered.len() >= settings.per_hour {
        return Decision::Skip(format!(
            "{} triggered captures in the last hour (--capture-per-hour {})",
            book.triggered.len(),
            settings.per_hour
        ));
    }
    let running: Vec<Info> = book.running.iter().map(|r| r.info.clone()).collect();
    match admit(&running, netns, pod, settings.running) {
        Ok(()) => Decision::Start,
        Err(refused) => Decision::Skip(refused),
    }
}

/// How a capture runs, decided before it starts.
struct How {
    filter: Option<String>,
    filter_from: FilterFrom,
    snap: Snaplen,
    /// As asked (`headers`, `full`, a number).
    snaplen: String,
    bounds: Bounds,
    trigger: Trigger,
}

fn lock_ids(ids: &Joined) -> MutexGuard<'_, Vec<String>> {
    ids.lock().unwrap_or_else(PoisonError::into_inner)
}

/// An incident's capture entry when none was started.
fn skipped(why: String) -> serde_json::Value {
    serde_json::json!({ "skipped": why })
}

pub fn no_such(id: &str) -> String {
    format!("capture {id}: no such capture on this node (kstall capture list)")
}

/// The pod as a bundle names it.
pub fn pod(
    namespace: &str,
    name: &str,
    uid: Option<&str>,
    workload: &str,
    netns: u64,
    ips: Vec<String>,
) -> Pod {
    let some = |s: &str| (!s.is_empty()).then(|| s.to_string());
    Pod {
        namespace: some(namespace),
        name: some(name),
        uid: uid.map(str::to_string),
        workload: some(workload),
        netns,
        ips,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn running(id: &str, netns: u64) -> Info {
        Info {
            id: id.into(),
            state: "running".into(),
            target: "shop/web-1".into(),
            netns,
            started: Time(0),
            until: Some(Time(1_796_000_000_000_000_000)),
            filter: None,
            duration_secs: 60,
            max_bytes: 64 << 20,
            max_packets: 1_000_000,
            snaplen: "headers".into(),
            error: None,
            summary: None,
        }
    }

    #[test]
    fn one_capture_per_pod_and_at_most_the_running_limit() {
        assert_eq!(admit(&[], 7, "shop/web-1", 2), Ok(()));
        let one = [running("cap-a", 7)];
        assert_eq!(
            admit(&one, 7, "shop/web-1", 2).unwrap_err(),
            "capture of shop/web-1 refused: cap-a is capturing it until 00:53:20 UTC"
        );
        assert_eq!(admit(&one, 8, "shop/web-2", 2), Ok(()));
        let two = [running("cap-a", 7), running("cap-b", 8)];
        assert_eq!(
            admit(&two, 9, "shop/web-3", 2).unwrap_err(),
            "capture refused: 2 captures are running on this node (--capture-running 2)"
        );
    }

    const SEC: u64 = 1_000_000_000;

    fn triggered(book: &mut Book, at_ns: u64, pod: &str, id: &str) {
        book.triggered.push_back(Started { at_ns, pod: pod.into(), id: id.into() });
    }

    #[test]
    fn an_incident_joins_its_pods_capture_and_the_pod_and_hour_caps_hold() {
        let settings = Settings { per_hour: 3, running: 2, ..Settings::default() };
        let mut book = Book::default();
        let now = 10_000 * SEC;
        assert!(matches!(decide(&mut book, now, "shop/web-1", 7, &settings), Decision::Start));

        // A capture of the pod runs (started by another incident or by hand): joined.
        book.running.push(Running {
            info: running("cap-a", 7),
            stop: Arc::default(),
            incidents: Joined::default(),
        });
        assert!(matches!(decide(&mut book, now, "shop/web-1", 7, &settings), Decision::Join(0)));

        // Captured 3 min ago by an incident: skipped, naming the capture.
        book.running.clear();
        triggered(&mut book, now - 180 * SEC, "shop/web-1", "cap-a");
        let Decision::Skip(why) = decide(&mut book, now, "shop/web-1", 7, &settings) else { panic!() };
        assert_eq!(why, "shop/web-1 was captured 3 min ago (cap-a): one triggered capture per pod in 10 min");
        // Another pod may; after 10 min, this one may again.
        assert!(matches!(decide(&mut book, now, "shop/web-2", 8, &settings), Decision::Start));
        assert!(matches!(decide(&mut book, now + 421 * SEC, "shop/web-1", 7, &settings), Decision::Start));

        // Three in the last hour: the fourth pod waits; an hour on, the oldest is forgotten.
        triggered(&mut book, now - 100 * SEC, "shop/web-2", "cap-b");
        triggered(&mut book, now - 50 * SEC, "shop/web-3", "cap-c");
        let Decision::Skip(why) = decide(&mut book, now, "shop/web-4", 9, &settings) else { panic!() };
        assert_eq!(why, "3 triggered captures in the last hour (--capture-per-hour 3)");
        let later = now - 180 * SEC + 3601 * SEC;
        assert!(matches!(decide(&mut book, later, "shop/web-4", 9, &settings), Decision::Start));
        assert_eq!(book.triggered.len(), 2, "the capture of an hour ago is forgotten");

        // The node's running limit.
        book.running.push(Running {
            info: running("cap-x", 1),
            stop: Arc::default(),
            incidents: Joined::default(),
        });
        book.running.push(Running {
            info: running("cap-y", 2),
            stop: Arc::default(),
            incidents: Joined::default(),
        });
        let Decision::Skip(why) = decide(&mut book, later, "shop/web-5", 10, &settings) else { panic!() };
        assert_eq!(why, "capture refused: 2 captures are running on this node (--capture-running 2)");
    }

    #[test]
    fn a_request_is_bounded_by_the_agents_settings() {
        let s = Settings::default();
        let (b, snap) = bounds(&Ask::default(), &s).unwrap();
        assert_eq!(
            (b.duration, b.max_bytes, b.max_packets, snap),
            (s.duration, s.max_bytes, s.max_packets, Snaplen::Headers)
        );
        let big = Ask { max_bytes: Some(1 << 30), ..Default::default() };
        assert_eq!(
            bounds(&big, &s).unwrap_err(),
            "--max-bytes 1GiB: more than this agent allows (--capture-max-bytes 64 MiB)"
        );
        let long = Ask { duration_secs: Some(1200), ..Default::default() };
        assert_eq!(bounds(&long, &s).unwrap_err(), "--duration 1200s: a capture lasts 1 s to 10 min");
        let none = Ask { duration_secs: Some(0), ..Default::default() };
        assert!(bounds(&none, &s).is_err());
        let snap = Ask { snaplen: Some("20".into()), ..Default::default() };
        assert!(bounds(&snap, &s).unwrap_err().starts_with("--snaplen \"20\""));
    }
}
