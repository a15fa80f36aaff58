//! What nfs says: an RPC transport's event, and a series' count of them.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use kstall_common::metrics;
use serde::Serialize;

use crate::probes::kind::{Change, EventData, EventKind, FilterFields, Source, Subject, Update};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum What {
    Retransmit,
    /// A major timeout: the kernel's "server ... not responding".
    Timeout,
    SocketConnect,
    SocketError,
    SocketReset,
    /// A reply on a transport that had timed out (the kernel's "server ... OK") or failed to
    /// connect: the server answers this client again.
    ServerResponding,
    StateManagerFailed,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Nfs {
    pub what: What,
    pub server_addr: Option<IpAddr>,
    pub server_port: Option<u16>,
    pub xid: Option<u32>,
    pub ntrans: Option<u32>,
    pub client_id: Option<u32>,
    /// The task that owns the RPC (`current` is often a kworker).
    pub owner_pid: Option<u32>,
    pub timeout_ms: Option<u64>,
    pub program: Option<String>,
    /// The RPC procedure (`WRITE`, ...), or for a state-manager failure the failing section.
    pub procedure: Option<String>,
    /// Negative errno (or RPC status) as the kernel reported it.
    pub error: Option<i32>,
    /// Its name (`ECONNREFUSED`, ...), when known.
    pub error_name: Option<&'static str>,
}

impl Nfs {
    /// Its `server` label: transports without an IP address are local ones (rpcbind over a
    /// unix socket).
    pub fn server_label(&self) -> String {
        self.server_addr.map(|a| a.to_string()).unwrap_or_else(|| "local".into())
    }

    /// A connect that failed: every TCP connect starts with an "in progress" report, which is not.
    pub fn connect_failed(&self) -> bool {
        self.what == What::SocketConnect && self.error.is_some_and(|e| e != -libc::EINPROGRESS)
    }
}

/// One interval's NFS events of one series, read from the kernel's counters: exact, and how many
/// were not sent in full. `series` holds what the key has (kind, server, error, section).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct NfsCount {
    #[serde(flatten)]
    pub series: Nfs,
    pub events: u64,
    pub suppressed: u64,
}

pub(super) const RPC: EventKind = EventKind {
    name: "nfs",
    subject: Subject::Netns,
    families: &[&metrics::NFS_SERVER_RESPONDING],
    text: |e| {
        let mut text = format!("{} server {}:{}", e.s("what"), e.s("server_addr"), e.n("server_port"));
        if !e.s("procedure").is_empty() {
            text.push_str(&format!(" {}", e.s("procedure")));
        }
        if let Some(error) = e.get("error_name").as_str() {
            text.push_str(&format!(" {error}"));
        }
        text
    },
};

/// A series' NFS events beyond those shown (sampling).
pub(super) const RPC_COUNT: EventKind = EventKind {
    name: "nfs_count",
    subject: Subject::Netns,
    families: &[
        &metrics::NFS_RETRANSMITS,
        &metrics::NFS_TIMEOUTS,
        &metrics::NFS_CONNECT_ERRORS,
        &metrics::NFS_STATE_MANAGER_FAILURES,
    ],
    text: |e| {
        format!(
            "{} more {} not shown ({} counted in 1 s): server {}{}",
            e.n("suppressed"),
            e.s("what"),
            e.n("events"),
            e.s("server_addr"),
            e.get("error_name").as_str().map(|e| format!(" {e}")).unwrap_or_default()
        )
    },
};

impl EventData for Nfs {
    fn kind(&self) -> &'static EventKind {
        &RPC
    }

    /// The counters come from the kernel's counts, the server's state from the events.
    fn updates(&self, _: &Source) -> Vec<Update> {
        let value = match self.what {
            What::Timeout => 0,
            What::ServerResponding => 1,
            _ => return Vec::new(),
        };
        vec![Update::new(&metrics::NFS_SERVER_RESPONDING, &[&self.server_label()], Change::Set(value))]
    }

    fn filter_fields(&self) -> FilterFields {
        FilterFields {
            ports: self.server_port.into_iter().collect(),
            addrs: self.server_addr.iter().map(|a| a.to_string()).collect(),
        }
    }
}

impl EventData for NfsCount {
    fn kind(&self) -> &'static EventKind {
        &RPC_COUNT
    }

    fn updates(&self, _: &Source) -> Vec<Update> {
        let nfs = &self.series;
        let server = nfs.server_label();
        let error =
            nfs.error_name.map(str::to_string).or(nfs.error.map(|e| e.to_string())).unwrap_or_default();
        let (metric, labels) = match nfs.what {
            What::Retransmit => (&metrics::NFS_RETRANSMITS, vec![server.as_str()]),
            What::Timeout => (&metrics::NFS_TIMEOUTS, vec![server.as_str()]),
            What::ServerResponding => return Vec::new(),
            What::SocketConnect if !nfs.connect_failed() => return Vec::new(),
            What::SocketConnect | What::SocketError => {
                (&metrics::NFS_CONNECT_ERRORS, vec![server.as_str(), &error])
            }
            What::SocketReset => (&metrics::NFS_CONNECT_ERRORS, vec![server.as_str(), "reset"]),
            What::StateManagerFailed => (
                &metrics::NFS_STATE_MANAGER_FAILURES,
                vec![server.as_str(), nfs.procedure.as_deref().unwrap_or("")],
            ),
        };
        vec![Update::new(metric, &labels, Change::Add(self.events))]
    }

    /// A count's series has no port: a port filter leaves it out.
    fn filter_fields(&self) -> FilterFields {
        FilterFields { ports: vec![], addrs: self.series.server_addr.iter().map(|a| a.to_string()).collect() }
    }

    fn suppressed(&self) -> Option<u64> {
        Some(self.suppressed)
    }
}

/// One interval's NFS RPCs of one caller (its cgroup), server and procedure, timed in the kernel:
/// how many, their summed execute time (what the caller waited: queued, sent and answered), and
/// how many ended within each bound of the histogram.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct NfsLatency {
    pub server_addr: Option<IpAddr>,
    /// The RPC procedure (`READ`, `WRITE`, `GETATTR`, ...).
    pub operation: String,
    /// The NFS mount's device (`major:minor`, as `/proc/<pid>/mountinfo` lists it), once the
    /// kernel said which superblock the RPC client serves: a kernel thread's RPCs (writeback)
    /// are attributed by it to the pod whose volume it is.
    pub device: Option<String>,
    pub rpcs: u64,
    pub seconds_sum: f64,
    /// RPCs per bucket (not cumulative), one per bound of [`LATENCY_BOUNDS_SECONDS`] and the
    /// last for the rest.
    pub buckets: Vec<u64>,
}

/// The histogram's bounds (`le`), in seconds.
pub const LATENCY_BOUNDS_SECONDS: [f64; kstall_common::nfs::LATENCY_BOUNDS_NS.len()] = {
    let mut seconds = [0.0; kstall_common::nfs::LATENCY_BOUNDS_NS.len()];
    let mut i = 0;
    while i < seconds.len() {
        seconds[i] = kstall_common::nfs::LATENCY_BOUNDS_NS[i] as f64 / 1e9;
        i += 1;
    }
    seconds
};

impl NfsLatency {
    /// The RPCs of every one of `latencies` in one histogram (no server, operation or device).
    pub fn sum_of<'a>(latencies: impl IntoIterator<Item = &'a NfsLatency>) -> NfsLatency {
        let mut all = NfsLatency {
            server_addr: None,
            operation: String::new(),
            device: None,
            rpcs: 0,
            seconds_sum: 0.0,
            buckets: vec![0; kstall_common::nfs::LATENCY_BUCKETS],
        };
        for l in latencies {
            all.rpcs = all.rpcs.saturating_add(l.rpcs);
            all.seconds_sum += l.seconds_sum;
            for (sum, n) in all.buckets.iter_mut().zip(&l.buckets) {
                *sum = sum.saturating_add(*n);
            }
        }
        all
    }

    /// The `q` quantile (0..=1) of its RPCs as Prometheus's `histogram_quantile` estimates it:
    /// linear within the bucket it falls in, the last bound for one past every bound; `None`
    /// without RPCs.
    pub fn quantile(&self, q: f64) -> Option<f64> {
        let total = self.buckets.iter().fold(0u64, |sum, n| sum.saturating_add(*n));
        let rank = q * total as f64;
        let mut seen = 0u64;
        for (i, &n) in self.buckets.iter().enumerate() {
            let below = seen as f64;
            seen = seen.saturating_add(n);
            if n == 0 || (seen as f64) < rank {
                continue;
            }
            let Some(&upper) = LATENCY_BOUNDS_SECONDS.get(i) else { break };
            let lower = i.checked_sub(1).map_or(0.0, |j| LATENCY_BOUNDS_SECONDS[j]);
            return Some(lower + (upper - lower) * (rank - below) / n as f64);
        }
        (total > 0).then(|| LATENCY_BOUNDS_SECONDS[LATENCY_BOUNDS_SECONDS.len() - 1])
    }
}

pub(super) const RPC_LATENCY: EventKind = EventKind {
    name: "nfs_latency",
    subject: Subject::Task,
    families: &[&metrics::NFS_RPC_DURATION],
    text: |e| {
        let rpcs = e.get("rpcs").as_u64().unwrap_or(0);
        let mean_ms = e.get("seconds_sum").as_f64().unwrap_or(0.0) * 1000.0 / rpcs.max(1) as f64;
        format!("{} {} to {} in 1 s, {mean_ms:.1} ms mean", rpcs, e.s("operation"), e.s("server_addr"))
    },
};

impl EventData for NfsLatency {
    fn kind(&self) -> &'static EventKind {
        &RPC_LATENCY
    }

    fn updates(&self, _: &Source) -> Vec<Update> {
        let server = self.server_addr.map(|a| a.to_string()).unwrap_or_else(|| "local".into());
        vec![Update::new(
            &metrics::NFS_RPC_DURATION,
            &[&server, &self.operation],
            Change::Buckets { counts: self.buckets.clone(), sum: self.seconds_sum },
        )]
    }

    fn filter_fields(&self) -> FilterFields {
        FilterFields { ports: vec![], addrs: self.server_addr.iter().map(|a| a.to_string()).collect() }
    }
}

/// A transport's server address: `AF_INET` or `AF_INET6`, else none (a local transport).
pub(super) fn server_addr(family: u16, addr: &[u8; 16]) -> Option<IpAddr> {
    match family {
        2 => Some(IpAddr::V4(Ipv4Addr::new(addr[0], addr[1], addr[2], addr[3]))),
        10 => Some(IpAddr::V6(Ipv6Addr::from(*addr))),
        _ => None,
    }
}
