//! Reading the agent's `--export-events file:PATH` as a log shipper does (Vector's `file` source
//! with `include: [PATH*]`, Fluent Bit's `tail` with a glob): every file under `PATH` and its
//! rotated names is followed by its inode, from its start, through the descriptor opened once, so
//! a file renamed (rotated) while it is read is read to its end, and one rotated before it was
//! seen is found under its new name. Records are put in `seq` order at the end, as a store does
//! by timestamp.

use std::{
    collections::HashMap,
    fs::File,
    io::Read as _,
    os::unix::fs::MetadataExt as _,
    path::{Path, PathBuf},
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    thread::{self, JoinHandle},
    time::Duration,
};

use serde_json::Value;

/// How often a follower looks again (a shipper's refresh interval).
const POLL: Duration = Duration::from_millis(20);

/// What a follower read.
#[derive(Debug, Default)]
pub struct Followed {
    /// Every record's `seq`, in order.
    pub seqs: Vec<u64>,
    /// The records kept (those `keep` took), in `seq` order.
    pub records: Vec<Value>,
    /// Lines that were not JSON: none, or the stream is broken.
    pub bad_lines: Vec<String>,
    /// Files read: the first and each rotation's new one.
    pub files: usize,
}

impl Followed {
    /// Records the agent dropped: the numbers missing from `seq`, 1 to the last.
    pub fn seq_gaps(&self) -> u64 {
        self.seqs.last().map_or(0, |last| last - self.seqs.len() as u64)
    }

    /// Whether a record was read twice.
    pub fn repeated(&self) -> bool {
        self.seqs.windows(2).any(|w| w[0] == w[1])
    }
}

pub struct Follower {
    stop: Arc<AtomicBool>,
    reader: JoinHandle<Followed>,
}

impl Follower {
    /// Follows `path` and its rotated names `path.1` ... `path.<max_files>` (none need exist yet),
    /// keeping the records `keep` takes (a storm's millions would not fit).
    pub fn start(path: &Path, max_files: u32, keep: fn(&Value) -> bool) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let mut names = vec![path.to_path_buf()];
        names.extend((1..=max_files).map(|n| PathBuf::from(format!("{}.{n}", path.display()))));
        let stopping = stop.clone();
        let reader = thread::spawn(move || follow(&names, keep, &stopping));
        Follower { stop, reader }
    }

    /// Reads what is left (call it once the writer is done) and returns everything read.
    pub fn finish(self) -> Followed {
        self.stop.store(true, Ordering::SeqCst);
        self.reader.join().expect("follower")
    }
}

struct Followed1 {
    file: File,
    partial: Vec<u8>,
}

fn follow(names: &[PathBuf], keep: fn(&Value) -> bool, stop: &AtomicBool) -> Followed {
    let mut followed = Followed::default();
    let mut files: HashMap<u64, Followed1> = HashMap::new();
    loop {
        // Looked at first: after `finish`, one more pass reads every file to its end.
        let stopping = stop.load(Ordering::SeqCst);
        for name in names {
            // Opened before its inode is read: a rename in between cannot pair one file's inode
            // with another's contents.
            let Ok(file) = File::open(name) else { continue };
            let inode = file.metadata().expect("fstat").ino();
            files.entry(inode).or_insert_with(|| {
                followed.files += 1;
                Followed1 { file, partial: Vec::new() }
            });
        }
        for f in files.values_mut() {
            let mut chunk = Vec::new();
            f.file.read_to_end(&mut chunk).expect("read the events file");
            f.partial.extend_from_slice(&chunk);
            while let Some(end) = f.partial.iter().position(|&b| b == b'\n') {
                let line: Vec<u8> = f.partial.drain(..=end).collect();
                let text = String::from_utf8_lossy(&line[..end]).into_owned();
                match serde_json::from_str::<Value>(&text) {
                    Ok(value) if value["seq"].is_u64() => {
                        followed.seqs.push(value["seq"].as_u64().unwrap_or_default());
                        if keep(&value) {
                            followed.records.push(value);
                        }
                    }
                    _ => followed.bad_lines.push(text),
                }
            }
        }
        if stopping {
            for f in files.values().filter(|f| !f.partial.is_empty()) {
                followed.bad_lines.push(String::from_utf8_lossy(&f.partial).into_owned());
            }
            followed.seqs.sort_unstable();
            followed.records.sort_by_key(|r| r["seq"].as_u64());
            return followed;
        }
        thread::sleep(POLL);
    }
}
