//! The agent's captures: the store under `<state>/captures/`, and the captures running now, each
//! on a `std` thread of its own (`kstall-capture`) calling [`runner::run`] with its own stop
//! flag. One capture at a time per network namespace (a pod), at most `--capture-running` on the
//! node. Nothing here blocks for long: the API's async tasks call it and poll [`Captures::info`].

use std::{
    fs::File,
    path::PathBuf,
    sync::{
        Arc, Mutex, MutexGuard, PoisonError,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use serde::{Deserialize, Serialize};

use super::{
    bundle::{FilterFrom, Pod, Time, Trigger, TriggerKind},
    filter::{Link, Snaplen},
    flags::{Settings, check_duration},
    packets::{Bounds, size},
    runner::{self, Plan, Target},
    store::{self, Retention, Store, Summary},
};

/// The one line of an agent without a state dir.
pub const OFF: &str =
    "captures are off: the agent runs with --state-dir none (bundles live under the state dir)";

/// Failed captures remembered for `kstall capture list` (they have no bundle).
const FAILED_KEPT: usize = 16;

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

struct Running {
    info: Info,
    stop: Arc<AtomicBool>,
}

#[derive(Default)]
struct Book {
    running: Vec<Running>,
    failed: Vec<Info>,
}

pub struct Captures {
    store: Store,
    settings: Settings,
    node: String,
    proc: PathBuf,
    book: Arc<Mutex<Book>>,
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
        })
    }

    pub fn settings(&self) -> &Settings {
        &self.settings
    }

    /// Starts capturing `target` as asked, on a thread of its own; refuses in one line.
    pub fn start(self: &Arc<Self>, target: Target, ask: &Ask) -> Result<Info, String> {
        let (bounds, snap) = bounds(ask, &self.settings)?;
        let filter = ask.filter.as_deref().map(str::trim).filter(|f| !f.is_empty()).map(str::to_string);
        super::filter::compile(filter.as_deref(), Link::Ethernet, snap).map_err(|e| e.to_string())?;
        let requested = Time(crate::kernel::unix_now_ns());
        let mut book = lock(&self.book);
        let running: Vec<Info> = book.running.iter().map(|r| r.info.clone()).collect();
        admit(&running, target.pod.netns, &target.label.replace("pod ", ""), self.settings.running)?;
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
            until: Some(Time(requested.0.saturating_add(bounds.duration.as_nanos() as u64))),
            filter: filter.clone(),
            duration_secs: bounds.duration.as_secs(),
            max_bytes: bounds.max_bytes,
            max_packets: bounds.max_packets,
            snaplen: ask.snaplen.clone().unwrap_or_else(|| "headers".into()),
            error: None,
            summary: None,
        };
        let plan = Plan {
            filter_from: if filter.is_some() { FilterFrom::Given } else { FilterFrom::None },
            filter,
            snap,
            bounds,
            trigger: Trigger {
                kind: TriggerKind::Manual,
                incidents: vec![],
                signature: None,
                requested_by: "socket".into(),
            },
            requested,
        };
        let stop = Arc::new(AtomicBool::new(false));
        let this = self.clone();
        let thread_stop = stop.clone();
        let thread_id = id.clone();
        std::thread::Builder::new()
            .name("kstall-capture".into())
            .spawn(move || this.run(&thread_id, &target, &plan, &thread_stop))
            .map_err(|e| format!("capture refused: cannot start its thread: {e}"))?;
        book.running.push(Running { info: info.clone(), stop });
        Ok(info)
    }

    fn run(&self, id: &str, target: &Target, plan: &Plan, stop: &AtomicBool) {
        let outcome = runner::run(&self.store, id, &self.node, target, plan, stop, &self.proc);
        let mut book = lock(&self.book);
        let Some(at) = book.running.iter().position(|r| r.info.id == id) else { return };
        let mut info = book.running.remove(at).info;
        match outcome {
            Ok(outcome) => {
                tracing::info!(
                    id,
                    bytes = outcome.summary.bytes,
                    packets = outcome.summary.packets,
                    "capture done"
                );
            }
            Err(e) => {
                tracing::warn!(id, error = %e, "capture failed");
                info.state = "failed".into();
                info.error = Some(e);
                info.until = None;
                book.failed.push(info);
                let excess = book.failed.len().saturating_sub(FAILED_KEPT);
                book.failed.drain(..excess);
            }
        }
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
            r.stop.store(true, Ordering::Relaxed);
        }
        Ok(info)
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
