//! Every event and incident as a JSON line, for log pipelines (`--export-events stdout|file:PATH`):
//! Fluent Bit's `tail` or Vector's `file` source reads the file, a node's log collector reads
//! stdout. The schema is `kstall/v1` (README, "Event and incident stream"): an envelope (`schema`,
//! `record`, `seq`, `time`, `node`) and the record under its own name, `event` as the API socket
//! streams it, `incident` as `/api/v1/incidents` lists it (the records and their numbering:
//! `stream.rs`).
//!
//! Written by a thread of its own from the stream's queue. The file rotates by renaming at
//! `--export-events-max-bytes` (`PATH` → `PATH.1` → ... → `PATH.<max-files>`), the rotation those
//! readers follow.

use std::{
    fs::{File, OpenOptions},
    io::{self, Write as _},
    os::unix::fs::OpenOptionsExt as _,
    path::{Path, PathBuf},
    sync::{Arc, mpsc::Receiver},
    time::{Duration, Instant},
};

use serde::Serialize;
use tokio::sync::broadcast;
use tokio_util::sync::CancellationToken;

use super::{
    metrics::Metrics,
    rfc3339,
    stream::{self, Body, Feed, Record, SCHEMA},
};
use crate::{
    attribution::Attributed,
    setting::{self, Invalid},
};

/// A writer that cannot write waits this long before opening its file again.
const REOPEN_AFTER: Duration = Duration::from_secs(10);

/// Where the records go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Sink {
    Stdout,
    File(PathBuf),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settings {
    pub sink: Sink,
    /// A file rotates before a line would take it past this size.
    pub max_bytes: u64,
    /// Rotated files kept besides the one written (`PATH.1` newest).
    pub max_files: u32,
}

const DEFAULT_MAX_BYTES: u64 = 100 << 20;
const MIN_MAX_BYTES: u64 = 64 << 10;
const DEFAULT_MAX_FILES: u32 = 5;

/// The stream's settings as users give them (flag, `KSTALL_*` variable, file key).
#[derive(Debug, Default, clap::Args, serde::Serialize, serde::Deserialize)]
#[serde(default)]
#[group(id = "json_lines_settings")]
pub struct Flags {
    /// Write every event and incident as a JSON line (schema kstall/v1) to `stdout` or
    /// `file:PATH` (rotated at --export-events-max-bytes) [default: off].
    #[arg(long, env = "KSTALL_EXPORT_EVENTS", value_name = "stdout|file:PATH")]
    pub export_events: Option<String>,
    /// Rotate the events file before it grows past this size (`64K` at least) [default: 100M].
    #[arg(long, env = "KSTALL_EXPORT_EVENTS_MAX_BYTES", value_name = "SIZE")]
    pub export_events_max_bytes: Option<String>,
    /// Rotated events files kept (PATH.1 the newest) [default: 5].
    #[arg(long, env = "KSTALL_EXPORT_EVENTS_MAX_FILES", value_name = "N")]
    pub export_events_max_files: Option<String>,
}

impl Flags {
    /// `None` when the stream is off. A file's directory must exist and the file be writable
    /// now, not at the first event.
    pub fn settings(self) -> Result<Option<Settings>, Invalid> {
        let max_bytes = match self.export_events_max_bytes {
            Some(text) => {
                setting::bytes("export_events_max_bytes", &text).and_then(|n| match n >= MIN_MAX_BYTES {
                    true => Ok(n),
                    false => Err(("export_events_max_bytes", format!("{text:?} is less than 64K"))),
                })?
            }
            None => DEFAULT_MAX_BYTES,
        };
        let max_files = match self.export_events_max_files {
            Some(text) => setting::count("export_events_max_files", &text, 1)?,
            None => DEFAULT_MAX_FILES,
        };
        let Some(text) = self.export_events else { return Ok(None) };
        let sink = match text.trim() {
            "" | "off" => return Ok(None),
            "stdout" => Sink::Stdout,
            other => match other.strip_prefix("file:") {
                Some(path) if !path.is_empty() => {
                    let path = PathBuf::from(path);
                    open(&path)
                        .map_err(|e| ("export_events", format!("cannot open {}: {e}", path.display())))?;
                    Sink::File(path)
                }
                _ => return Err(("export_events", format!("{other:?} is not stdout or file:PATH"))),
            },
        };
        Ok(Some(Settings { sink, max_bytes, max_files }))
    }
}

/// Appends to `path`, made if missing; a FIFO or a device would block or never rotate, so only a
/// regular file is taken.
fn open(path: &Path) -> io::Result<File> {
    match std::fs::metadata(path) {
        Ok(meta) if !meta.is_file() => {
            return Err(io::Error::other("not a regular file (use stdout for a pipe)"));
        }
        _ => {}
    }
    OpenOptions::new().create(true).append(true).mode(0o640).open(path)
}

/// One line of the stream.
#[derive(Serialize)]
struct Envelope<'a> {
    schema: &'static str,
    record: &'static str,
    seq: u64,
    /// When it happened: the kernel's time of an event, the evaluation's of an incident's change.
    time: String,
    node: &'a str,
    #[serde(flatten)]
    body: &'a Body,
}

/// The stream's tasks: the events' subscriber (ending once the writer thread has written what was
/// queued), and the incidents' feed for the evaluator (`stream::start`).
pub fn start(
    settings: Settings,
    node: String,
    events: &broadcast::Sender<Arc<Attributed>>,
    metrics: Arc<Metrics>,
    stop: CancellationToken,
) -> (impl Future<Output = ()> + use<>, Feed) {
    stream::start(
        "json",
        "kstall-export",
        events,
        metrics.clone(),
        stop,
        Box::new(move |records| write_all(records, Writer::new(settings), &node, &metrics)),
    )
}

/// Writes until every producer is gone, flushing whenever the queue is empty.
fn write_all(rx: Receiver<Record>, mut writer: Writer, node: &str, metrics: &Metrics) {
    let mut line = Vec::with_capacity(4096);
    while let Ok(mut queued) = rx.recv() {
        loop {
            line.clear();
            let record = queued.body.record();
            let envelope = Envelope {
                schema: SCHEMA,
                record,
                seq: queued.seq,
                time: rfc3339(queued.time_unix_ns),
                node,
                body: &queued.body,
            };
            match serde_json::to_writer(&mut line, &envelope) {
                Ok(()) => {
                    line.push(b'\n');
                    match writer.write(&line) {
                        Ok(()) => metrics.export_written("json", record, 1),
                        Err(e) => {
                            metrics.export_dropped("json", record, "write_error", 1);
                            writer.failed(&e);
                        }
                    }
                }
                Err(e) => {
                    tracing::warn!(error = %e, seq = queued.seq, "cannot encode a record for --export-events");
                    metrics.export_dropped("json", record, "write_error", 1);
                }
            }
            match rx.try_recv() {
                Ok(next) => queued = next,
                Err(_) => break,
            }
        }
        writer.flush();
    }
    writer.flush();
}

/// Stdout, or the file and its rotation.
struct Writer {
    settings: Settings,
    out: Option<io::BufWriter<Box<dyn io::Write + Send>>>,
    /// The file's size as written so far.
    written: u64,
    /// After a failure: when to try again; the first failure of a run is logged.
    retry_at: Option<Instant>,
    logged: bool,
}

impl Writer {
    fn new(settings: Settings) -> Self {
        Self { settings, out: None, written: 0, retry_at: None, logged: false }
    }

    fn write(&mut self, line: &[u8]) -> io::Result<()> {
        if self.out.is_none() {
            if self.retry_at.is_some_and(|at| Instant::now() < at) {
                return Err(io::Error::other("waiting to reopen after a failure"));
            }
            self.reopen()?;
        }
        if let Sink::File(path) = &self.settings.sink
            && self.written > 0
            && self.written + line.len() as u64 > self.settings.max_bytes
        {
            let path = path.clone();
            self.flush();
            self.out = None;
            rotate(&path, self.settings.max_files)?;
            self.reopen()?;
        }
        let out = self.out.as_mut().expect("opened above");
        out.write_all(line)?;
        self.written += line.len() as u64;
        Ok(())
    }

    fn reopen(&mut self) -> io::Result<()> {
        let (out, written): (Box<dyn io::Write + Send>, u64) = match &self.settings.sink {
            Sink::Stdout => (Box::new(io::stdout()), 0),
            Sink::File(path) => {
                let file = open(path)?;
                let written = file.metadata()?.len();
                (Box::new(file), written)
            }
        };
        self.out = Some(io::BufWriter::with_capacity(64 << 10, out));
        self.written = written;
        self.retry_at = None;
        Ok(())
    }

    fn failed(&mut self, e: &io::Error) {
        if !self.logged {
            self.logged = true;
            tracing::warn!(error = %e, "cannot write --export-events; its records are dropped and counted until it can");
        }
        // What the buffer still held goes with it (counted as written when it was buffered): a
        // failure costs at most one buffer of lines the counters do not show as dropped.
        self.out = None;
        self.retry_at = Some(Instant::now() + REOPEN_AFTER);
    }

    fn flush(&mut self) {
        if let Some(out) = self.out.as_mut()
            && let Err(e) = out.flush()
        {
            self.failed(&e);
        }
    }
}

/// `PATH.{n-1}` → `PATH.n`, ..., `PATH` → `PATH.1`: the newest rotated file is `.1`.
fn rotate(path: &Path, max_files: u32) -> io::Result<()> {
    let numbered = |n: u32| {
        let mut name = path.as_os_str().to_owned();
        name.push(format!(".{n}"));
        PathBuf::from(name)
    };
    for n in (1..max_files).rev() {
        match std::fs::rename(numbered(n), numbered(n + 1)) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
            _ => {}
        }
    }
    std::fs::rename(path, numbered(1))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        events::Counts,
        incidents::{signatures::tests as ev, tests::incident},
    };

    fn metrics() -> Arc<Metrics> {
        Arc::new(Metrics::new(Arc::new(Counts::default()), Default::default()))
    }

    fn flags(sink: &str) -> Flags {
        Flags { export_events: Some(sink.into()), ..Default::default() }
    }

    fn lines(path: &Path) -> Vec<serde_json::Value> {
        std::fs::read_to_string(path)
            .unwrap_or_default()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
            .collect()
    }

    #[test]
    fn a_bad_sink_or_size_is_one_error_naming_its_key() {
        assert_eq!(Flags::default().settings(), Ok(None));
        assert_eq!(flags("stdout").settings().unwrap().unwrap().sink, Sink::Stdout);
        let (key, why) = flags("syslog").settings().unwrap_err();
        assert_eq!((key, why.as_str()), ("export_events", "\"syslog\" is not stdout or file:PATH"));
        let (key, why) = flags("file:/nonexistent/dir/kstall.jsonl").settings().unwrap_err();
        assert_eq!(key, "export_events");
        assert!(why.starts_with("cannot open /nonexistent/dir/kstall.jsonl: "), "{why}");
        let (_, why) = flags("file:/dev/null").settings().unwrap_err();
        assert_eq!(why, "cannot open /dev/null: not a regular file (use stdout for a pipe)");
        let small = Flags { export_events_max_bytes: Some("4K".into()), ..flags("stdout") };
        assert_eq!(small.settings().unwrap_err().0, "export_events_max_bytes");
        let no_files = Flags { export_events_max_files: Some("0".into()), ..flags("stdout") };
        assert_eq!(no_files.settings().unwrap_err().0, "export_events_max_files");
    }

    #[tokio::test]
    async fn events_and_incidents_are_numbered_lines_the_file_rotates_and_keeps_max_files() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("events.jsonl");
        let mut settings = flags(&format!("file:{}", path.display())).settings().unwrap().unwrap();
        settings.max_bytes = 64 << 10;
        settings.max_files = 2;
        let (events, _) = broadcast::channel(8192);
        let (metrics, stop) = (metrics(), CancellationToken::new());
        let (writer, feed) = start(settings, "node-a".into(), &events, metrics.clone(), stop.clone());
        let writer = tokio::spawn(writer);
        let who = ev::pod("uid-1", "web-1");
        feed.changes(5, &[incident(None)], &[]);
        let sent = 2000u64;
        for t in 0..sent {
            events.send(Arc::new(ev::redirected_reset(1_796_000_000_000_000_000 + t, 2049, &who))).unwrap();
        }
        // Every event offered before the incident resolves: it is the stream's last record.
        while !events.is_empty() {
            tokio::task::yield_now().await;
        }
        feed.changes(6, &[], &[incident(Some(6))]);
        drop(feed);
        stop.cancel();
        writer.await.unwrap();

        let rotated = |n: u32| PathBuf::from(format!("{}.{n}", path.display()));
        assert!(!rotated(3).exists(), "only --export-events-max-files rotated files are kept");
        let sizes: Vec<u64> = [path.clone(), rotated(1), rotated(2)]
            .iter()
            .map(|p| std::fs::metadata(p).unwrap().len())
            .collect();
        assert!(sizes.iter().all(|&n| n <= 64 << 10), "{sizes:?}");
        let mut all = lines(&rotated(2));
        all.extend(lines(&rotated(1)));
        all.extend(lines(&path));
        let seqs: Vec<u64> = all.iter().map(|l| l["seq"].as_u64().unwrap()).collect();
        assert!(seqs.windows(2).all(|w| w[1] == w[0] + 1), "consecutive across rotations");
        let resolved = all.last().unwrap();
        assert_eq!(resolved["seq"], sent + 2, "the newest file ends with the last record");
        assert_eq!(resolved["transition"], "resolved");
        assert_eq!(resolved["record"], "incident");
        assert_eq!(resolved["incident"]["signature"], "nfs-sidecar-redirect");
        assert_eq!(resolved["time"], "1970-01-01T00:00:00.000000006Z");
        let event = all.iter().find(|l| l["record"] == "event").unwrap();
        assert_eq!(event["schema"], SCHEMA);
        assert_eq!(event["node"], "node-a");
        assert_eq!(event["event"]["kind"], "tcp_reset");
        assert_eq!(event["event"]["original_dst_port"], 2049);
        assert_eq!(event["event"]["pod"], "web-1");
        assert!(event["time"].as_str().unwrap().starts_with("2026-"), "{}", event["time"]);
        let written = metrics.render();
        assert!(written.contains(r#"kstall_export_records_total{output="json",record="event"} 2000"#));
        assert!(written.contains(r#"kstall_export_records_total{output="json",record="incident"} 2"#));
    }

    #[tokio::test]
    async fn a_consumer_that_stops_reading_costs_dropped_records_each_a_counted_gap_in_seq() {
        // A pipe whose reader never reads: the writer blocks on it once the pipe is full.
        let (read_end, write_end) = std::io::pipe().unwrap();
        let metrics = metrics();
        let (offer, rx) = stream::offer_for_tests("json", 16, metrics.clone());
        let writer_metrics = metrics.clone();
        let writer = std::thread::spawn(move || {
            let mut writer = Writer::new(Settings { sink: Sink::Stdout, max_bytes: 0, max_files: 1 });
            writer.out = Some(io::BufWriter::with_capacity(1024, Box::new(write_end)));
            write_all(rx, writer, "node-a", &writer_metrics);
        });
        let who = ev::pod("uid-1", "web-1");
        let sent = 20_000u64;
        for t in 0..sent {
            offer.send(t, Body::Event { event: Arc::new(ev::redirected_reset(t, 2049, &who)) });
        }
        drop(offer);
        // Reading now lets the writer finish what it queued.
        let reader = std::thread::spawn(move || std::io::read_to_string(read_end).unwrap());
        writer.join().unwrap();
        let text = reader.join().unwrap();
        let seqs: Vec<u64> = text
            .lines()
            .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap()["seq"].as_u64().unwrap())
            .collect();
        let gaps: u64 = seqs.windows(2).map(|w| w[1] - w[0] - 1).sum::<u64>() + (sent - seqs.last().unwrap());
        assert!(gaps > 0, "a stopped consumer must cost records");
        let rendered = metrics.render();
        let dropped = format!(
            r#"kstall_export_records_dropped_total{{output="json",reason="behind",record="event"}} {gaps}"#
        );
        assert!(rendered.contains(&dropped), "every gap counted: {gaps}\n{rendered}");
    }
}
