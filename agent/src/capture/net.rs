//! A network namespace's state around a capture, beside its packets: `conntrack.txt` (the table
//! at the start and the end, and the `NEW`/`DESTROY` events in between), `rules.txt`,
//! `sockets.txt` (start and end, each socket with the processes of the namespace holding it),
//! `addresses.txt` and `routes.txt`. The netlink sockets are made on a thread inside the
//! namespace ([`enter::in_netns`]) and used from the caller's, which reads the holders in the
//! agent's `/proc`; the rules are read by the namespace's own iptables tools. What cannot be read
//! is said in the file it belongs to, in one line: it never fails the capture.

use std::{
    fmt::Write as _,
    fs::File,
    os::fd::OwnedFd,
    path::{Path, PathBuf},
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    thread::JoinHandle,
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use super::{FileNote, FileStatus, GRANTED_BY};
use super::{
    ct,
    netlink::{self, NETLINK_NETFILTER, NETLINK_ROUTE, NETLINK_SOCK_DIAG, NlError},
    rtnl, rules, sockets,
    sockopt::force_receive_buffer,
};
use crate::enter;

/// Events kept, at most: the rest is counted.
const MAX_EVENTS: usize = 100_000;
/// A burst of refused reconnects is hundreds of NEW and DESTROY events a second, each near 1 KiB
/// of buffer: `rmem_max` (208 KiB by default) overflowed under load, losing the very events the
/// capture is for. Forced past `rmem_max` (the capture has `CAP_NET_ADMIN`), as the packet
/// sockets' buffers are.
const EVENTS_RCVBUF: libc::c_int = 4 << 20;
/// How often the event reader looks whether the capture ended.
const TICK: Duration = Duration::from_millis(100);
const TIMEOUT: Duration = Duration::from_secs(1);

const CONNTRACK_HEADER: &str = "\
# Connection tracking of the namespace: each line is an entry's original tuple, then its reply's.
# A connection answered by a RST alone (a REDIRECT to a port nothing listens on) is deleted at the
# RST: the dumps never show it, the events do (orig dport=2049 with reply sport=15001 is the redirect).
";

/// The sockets made in the namespace, what was read at the start, and the event reader.
pub struct Recorder {
    route: Result<OwnedFd, String>,
    diag: Result<OwnedFd, String>,
    /// `None`: conntrack is not loaded.
    ct: Option<Conntrack>,
    addresses: String,
    routes: String,
    rules: String,
    sockets_start: String,
    holders: Holders,
}

/// Where the holders of the namespace's sockets are looked for: the processes of `proc` (the
/// agent's, host PID namespace) in the namespace of inode `netns`, and `known`.
struct Holders {
    proc: PathBuf,
    netns: u64,
    known: Vec<u32>,
}

impl Holders {
    /// The sockets' holders now.
    fn now(&self) -> sockets::Owners {
        sockets::owners(&self.proc, &super::processes_in(&self.proc, self.netns, &self.known))
    }
}

struct Conntrack {
    dump: Result<OwnedFd, String>,
    at_start: String,
    /// Why events are not recorded, if they are not.
    events_note: Option<String>,
    events: Option<Events>,
}

struct Events {
    stop: Arc<AtomicBool>,
    reader: Option<JoinHandle<Vec<String>>>,
}

impl Drop for Events {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(reader) = self.reader.take() {
            let _ = reader.join();
        }
    }
}

impl Events {
    fn lines(mut self) -> Vec<String> {
        self.stop.store(true, Ordering::Relaxed);
        self.reader.take().and_then(|r| r.join().ok()).unwrap_or_default()
    }
}

/// What the thread inside the namespace made and read.
struct Opened {
    route: Result<OwnedFd, String>,
    diag: Result<OwnedFd, String>,
    ct_dump: Result<OwnedFd, String>,
    ct_events: Result<OwnedFd, String>,
    /// `net.netfilter.nf_conntrack_events` of the namespace; `None`: nf_conntrack is not loaded.
    events_sysctl: Option<String>,
    legacy: [bool; 2],
}

fn said<T>(what: &str, r: std::io::Result<T>) -> Result<T, String> {
    r.map_err(|e| match e.raw_os_error() {
        Some(libc::EPERM) | Some(libc::EACCES) => {
            format!("{what} was refused ({e}): the agent needs CAP_NET_ADMIN, which {GRANTED_BY} grants")
        }
        _ => format!("{what}: {e}"),
    })
}

impl Recorder {
    /// Opens the sockets inside `netns` (inode `netns_inode`), starts recording conntrack events,
    /// and reads the namespace's state at the start; the sockets' holders are looked for in
    /// `proc` among the processes of the namespace and `known`.
    pub fn open(netns: &File, netns_inode: u64, proc: &Path, known: &[u32]) -> Result<Recorder, String> {
        let opened = enter::in_netns(netns, || {
            let sysctl = std::fs::read_to_string("/proc/sys/net/netfilter/nf_conntrack_events")
                .ok()
                .map(|s| s.trim().to_string());
            Opened {
                route: said("a NETLINK_ROUTE socket", netlink::open(NETLINK_ROUTE, 0, TIMEOUT)),
                diag: said("a NETLINK_SOCK_DIAG socket", netlink::open(NETLINK_SOCK_DIAG, 0, TIMEOUT)),
                ct_dump: said("a ctnetlink socket", netlink::open(NETLINK_NETFILTER, 0, TIMEOUT)),
                ct_events: match sysctl {
                    Some(_) => said(
                        "listening to conntrack events",
                        netlink::open(NETLINK_NETFILTER, ct::EVENT_GROUPS, TICK),
                    ),
                    None => Err(String::new()),
                },
                events_sysctl: sysctl,
                legacy: rules::legacy_nat_here(),
            }
        })?;
        let ct = opened.events_sysctl.as_ref().map(|sysctl| {
            let events_note = match (&opened.ct_events, sysctl.as_str()) {
                (_, "0") => Some(
                    "net.netfilter.nf_conntrack_events is 0: connections opened and reset during the capture \
                     are not recorded"
                        .to_string(),
                ),
                (Err(e), _) => Some(format!("{e}: connections opened and reset during the capture are not recorded")),
                _ => None,
            };
            let events = match (opened.ct_events, &events_note) {
                (Ok(fd), None) => Some(Events::start(fd)),
                _ => None,
            };
            let at_start = dumped(&opened.ct_dump, ct::dump);
            Conntrack { dump: opened.ct_dump, at_start, events_note, events }
        });
        let names = match &opened.route {
            Ok(fd) => rtnl::links(fd).unwrap_or_default(),
            Err(_) => Default::default(),
        };
        let addresses = dumped(&opened.route, |fd| rtnl::addresses(fd, &names));
        let routes = dumped(&opened.route, |fd| rtnl::routes(fd, &names));
        let rules = rules::save(netns, opened.legacy, Instant::now() + enter::READ_DEADLINE);
        let holders = Holders { proc: proc.to_path_buf(), netns: netns_inode, known: known.to_vec() };
        let sockets_start = dumped(&opened.diag, |fd| sockets::dump(fd, &holders.now()));
        Ok(Recorder {
            route: opened.route,
            diag: opened.diag,
            ct,
            addresses,
            routes,
            rules,
            sockets_start,
            holders,
        })
    }

    /// Stops recording, reads the state at the end, and writes the files into `dir/net/` (0600,
    /// never over an existing file); what each holds, for the manifest.
    pub fn finish(self, dir: &Path) -> Result<Vec<FileNote>, String> {
        drop(self.route);
        let mut conntrack = String::from(CONNTRACK_HEADER);
        let conntrack_loaded = self.ct.is_some();
        match self.ct {
            None => conntrack.push_str(NOT_LOADED),
            Some(ct) => {
                let _ = write!(conntrack, "# at start\n{}", ct.at_start);
                conntrack.push_str("# events during the capture (NEW, DESTROY)\n");
                if let Some(note) = &ct.events_note {
                    let _ = writeln!(conntrack, "{note}");
                }
                for line in ct.events.map(Events::lines).unwrap_or_default() {
                    let _ = writeln!(conntrack, "{line}");
                }
                let _ = write!(conntrack, "# at end\n{}", dumped(&ct.dump, ct::dump));
            }
        }
        let columns =
            "# protocol state recv-q send-q local peer uid inode [users:((\"comm\",pid=N,fd=M),...)]\n";
        let sockets = format!(
            "{columns}# at start\n{}# at end\n{}",
            self.sockets_start,
            dumped(&self.diag, |fd| sockets::dump(fd, &self.holders.now()))
        );
        let mut notes = Vec::new();
        for (name, what, text) in [
            (
                "conntrack.txt",
                "connection tracking: entries at the start and end, NEW/DESTROY events between",
                conntrack,
            ),
            (
                "rules.txt",
                "the namespace's iptables rules (nft and legacy), as its own iptables-save prints them, and its whole nftables ruleset (nft list ruleset)",
                self.rules,
            ),
            (
                "sockets.txt",
                "TCP and UDP sockets at the start and the end (sock_diag), with the processes holding each (ss -p)",
                sockets,
            ),
            ("addresses.txt", "the interfaces and their addresses", self.addresses),
            ("routes.txt", "the routes of every table", self.routes),
        ] {
            let path = format!("net/{name}");
            super::write_new(dir, &path, text.as_bytes())?;
            let (status, error) = match refusal(&text) {
                Some(line) => (FileStatus::Partial, Some(line.to_string())),
                None if name == "conntrack.txt" && !conntrack_loaded => {
                    (FileStatus::Partial, Some(NOT_LOADED.trim_end().to_string()))
                }
                None => (FileStatus::Complete, None),
            };
            notes.push(FileNote { path, what: what.to_string(), status, error });
        }
        Ok(notes)
    }
}

const NOT_LOADED: &str = "nf_conntrack is not loaded on this node: nothing is tracked\n";

/// The first line saying a read was refused or failed, if any.
fn refusal(text: &str) -> Option<&str> {
    text.lines().find(|l| l.contains("was refused") || l.starts_with("the dump failed"))
}

/// A dump's lines, or the one line saying why there are none.
fn dumped(
    fd: &Result<OwnedFd, String>,
    read: impl FnOnce(&OwnedFd) -> Result<Vec<String>, NlError>,
) -> String {
    let lines = match fd {
        Err(e) => return format!("{e}\n"),
        Ok(fd) => read(fd),
    };
    match lines {
        Ok(lines) => lines.iter().map(|l| format!("{l}\n")).collect(),
        Err(NlError::Kernel(libc::EPERM)) => {
            format!("the dump was refused: the agent needs CAP_NET_ADMIN, which {GRANTED_BY} grants\n")
        }
        Err(e) => format!("the dump failed: {e}\n"),
    }
}

impl Events {
    /// Reads `fd` (bound to the NEW and DESTROY groups) on a thread until stopped: each event a
    /// line, prefixed by its time of arrival.
    fn start(fd: OwnedFd) -> Events {
        // Without the capability, as much as `rmem_max` allows: a smaller buffer only loses more
        // under load, and the lines say how often it did.
        let _ = force_receive_buffer(&fd, EVENTS_RCVBUF);
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = stop.clone();
        let reader = std::thread::Builder::new()
            .name("kstall-ct-events".into())
            .spawn(move || read_events(&fd, &stopped))
            .ok();
        Events { stop, reader }
    }
}

fn read_events(fd: &OwnedFd, stop: &AtomicBool) -> Vec<String> {
    let mut buf = vec![0u8; 64 << 10];
    let (mut lines, mut lost, mut cut) = (Vec::new(), 0u64, 0u64);
    // Once stopped, what arrived before is read, for two ticks at most.
    let mut until: Option<Instant> = None;
    loop {
        if until.is_none() && stop.load(Ordering::Relaxed) {
            until = Some(Instant::now() + 2 * TICK);
        }
        if until.is_some_and(|u| Instant::now() >= u) {
            break;
        }
        match netlink::recv(fd, &mut buf) {
            Ok(n) => {
                let at = time_of_day(SystemTime::now());
                for message in netlink::messages(&buf[..n]).map_while(Result::ok) {
                    if let Some(event) = ct::event(message.kind, message.payload) {
                        if lines.len() < MAX_EVENTS {
                            lines.push(format!("{at} {event}"));
                        } else {
                            cut += 1;
                        }
                    }
                }
            }
            Err(NlError::Io(e)) if e.raw_os_error() == Some(libc::ENOBUFS) => lost += 1,
            Err(NlError::Io(e)) if e.kind() == std::io::ErrorKind::WouldBlock => {
                if until.is_some() {
                    break;
                }
            }
            Err(e) => {
                lines.push(format!("reading events failed: {e}"));
                break;
            }
        }
    }
    if cut > 0 {
        lines.push(format!("cut: {cut} events past the first {MAX_EVENTS} not written"));
    }
    if lost > 0 {
        lines.push(format!("the kernel dropped events {lost} times (the socket's buffer was full)"));
    }
    lines
}

/// `HH:MM:SS.mmm` UTC.
fn time_of_day(at: SystemTime) -> String {
    let since = at.duration_since(UNIX_EPOCH).unwrap_or_default();
    let s = since.as_secs() % 86_400;
    format!("{:02}:{:02}:{:02}.{:03}", s / 3600, s / 60 % 60, s % 60, since.subsec_millis())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_are_utc_times_of_day() {
        let at = UNIX_EPOCH + Duration::from_millis(86_400_000 * 3 + 3_723_045);
        assert_eq!(time_of_day(at), "01:02:03.045");
    }
}
