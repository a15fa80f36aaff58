//! The RPC latency histograms' keys, named. The kernel keys each by what the RPC's task points at
//! (transport, procedure, RPC client: a load each, on every NFS RPC) and writes what those are
//! into side maps once per key and interval; this reads them back as a key is drained.

use std::collections::HashMap;

use aya::{
    Ebpf,
    maps::{HashMap as BpfHashMap, MapData},
};
use kstall_common::nfs::{self as common, NfsLatencyKey, NfsTransport, Operation};

use super::event::{NfsLatency, server_addr};

/// What a latency key's transport, procedure and client are.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LatencySeries {
    pub transport: NfsTransport,
    /// `None` where the kernel's map no longer held it.
    pub operation: Option<Operation>,
    /// The superblock's `s_dev` (the kernel's MKDEV: major << 20 | minor); 0 before a read, write
    /// or commit of it completed.
    pub dev: u32,
}

/// The kernel's side maps, and what this drain already looked up in them (a few transports and
/// procedures serve every key).
pub struct LatencyNames {
    transports: BpfHashMap<MapData, u64, NfsTransport>,
    procedures: BpfHashMap<MapData, u64, Operation>,
    client_devs: BpfHashMap<MapData, u64, u32>,
    seen_transports: HashMap<u64, NfsTransport>,
    seen_procedures: HashMap<u64, Option<Operation>>,
    seen_devs: HashMap<u64, u32>,
}

impl LatencyNames {
    pub fn take(ebpf: &mut Ebpf) -> Result<Self, String> {
        fn map<K: aya::Pod, V: aya::Pod>(
            ebpf: &mut Ebpf,
            name: &str,
        ) -> Result<BpfHashMap<MapData, K, V>, String> {
            let map =
                ebpf.take_map(name).ok_or_else(|| format!("map {name} missing from the eBPF object"))?;
            BpfHashMap::try_from(map).map_err(|e| format!("map {name}: {e}"))
        }
        Ok(Self {
            transports: map(ebpf, "NFS_TRANSPORTS")?,
            procedures: map(ebpf, "NFS_PROCEDURES")?,
            client_devs: map(ebpf, "NFS_CLIENT_DEV")?,
            seen_transports: HashMap::new(),
            seen_procedures: HashMap::new(),
            seen_devs: HashMap::new(),
        })
    }

    /// Forgets the last drain's lookups: a freed transport's address may name another by now.
    pub fn new_drain(&mut self) {
        self.seen_transports.clear();
        self.seen_procedures.clear();
        self.seen_devs.clear();
    }

    /// A key's series. What the maps do not hold reads as unknown (a transport of family 0, no
    /// operation, no device), never as an error: the RPCs are still counted.
    pub fn series(&mut self, key: &NfsLatencyKey) -> LatencySeries {
        let transport = *self
            .seen_transports
            .entry(key.transport)
            .or_insert_with(|| self.transports.get(&key.transport, 0).unwrap_or_default());
        let operation = *self
            .seen_procedures
            .entry(key.procedure)
            .or_insert_with(|| self.procedures.get(&key.procedure, 0).ok());
        let dev = *self
            .seen_devs
            .entry(key.client)
            .or_insert_with(|| self.client_devs.get(&key.client, 0).unwrap_or(0));
        LatencySeries { transport, operation, dev }
    }
}

/// A latency key's interval: its series and what its RPCs took.
pub fn decode_latency(series: &LatencySeries, latency: &common::NfsLatency) -> NfsLatency {
    NfsLatency {
        server_addr: server_addr(series.transport.server_family, &series.transport.server_addr),
        operation: match series.operation {
            // A procedure without a name is the NULL one (a ping), as the kernel's rpc_proc_name says.
            Some(name) => Some(crate::decode::comm_string(&name))
                .filter(|name| !name.is_empty())
                .unwrap_or_else(|| "NULL".into()),
            None => "unknown".into(),
        },
        // The kernel's MKDEV: 12 bits of major, 20 of minor.
        device: (series.dev != 0).then(|| format!("{}:{}", series.dev >> 20, series.dev & 0xf_ffff)),
        rpcs: latency.rpcs,
        seconds_sum: latency.sum_ns as f64 / 1e9,
        buckets: latency.buckets.to_vec(),
    }
}

/// A series of `operation` to IPv4 `server` (tests).
#[cfg(test)]
pub fn series_of(server: [u8; 4], operation: &str, dev: u32) -> LatencySeries {
    let mut transport = NfsTransport { server_family: 2, ..Default::default() };
    transport.server_addr[..4].copy_from_slice(&server);
    let mut name = [0; kstall_common::nfs::OPERATION_LEN];
    name[..operation.len()].copy_from_slice(operation.as_bytes());
    LatencySeries { transport, operation: Some(name), dev }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_series_names_its_server_operation_and_device() {
        let latency = common::NfsLatency { rpcs: 1, ..Default::default() };
        let named = decode_latency(&series_of([10, 55, 0, 1], "WRITE", 52), &latency);
        assert_eq!(named.server_addr, Some("10.55.0.1".parse().unwrap()));
        assert_eq!((named.operation.as_str(), named.device.as_deref()), ("WRITE", Some("0:52")));
        let ping = decode_latency(&series_of([10, 55, 0, 1], "", 0), &latency);
        assert_eq!((ping.operation.as_str(), ping.device), ("NULL", None));
        let forgotten = decode_latency(&LatencySeries::default(), &latency);
        assert_eq!((forgotten.server_addr, forgotten.operation.as_str()), (None, "unknown"));
    }
}
