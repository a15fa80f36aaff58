//! The counters' port policy: the ports kept by number in the resets' and drops' series, and how
//! a counted port reads. Every other port is counted as a class, so a port scan makes two series,
//! not one a port.

use std::ops::RangeInclusive;

use kstall_common::counter::KeptPorts;
use serde::Serialize;

/// A port as a counter counts it: by number, or a class. Serialized as its label.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CountedPort {
    Number(u16),
    /// In the node's ephemeral range (`net.ipv4.ip_local_port_range`).
    Ephemeral,
    /// Neither kept by number nor ephemeral (a port scan's targets, a client's odd port).
    Other,
    /// The counters' map was full: the reset was counted without its key.
    Overflow,
}

impl CountedPort {
    /// The metric's label value.
    pub fn label(self) -> String {
        match self {
            CountedPort::Number(port) => port.to_string(),
            CountedPort::Ephemeral => "ephemeral".into(),
            CountedPort::Other => "other".into(),
            CountedPort::Overflow => "overflow".into(),
        }
    }
}

impl Serialize for CountedPort {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.label())
    }
}

/// Ports the counters keep by number whatever the configuration: IANA's system ports and
/// the registered ports of what runs on and around Kubernetes nodes (NFS, etcd, the API server,
/// the kubelet, service-mesh proxies, databases, brokers, monitoring). Every other port is
/// counted as a class, `ephemeral` or `other`, unless `--metric-ports` keeps it.
pub const WELL_KNOWN_PORTS: &[RangeInclusive<u16>] = &[
    1..=1023,
    1433..=1433,   // SQL Server
    1521..=1521,   // Oracle
    2049..=2049,   // NFS
    2181..=2181,   // ZooKeeper
    2379..=2380,   // etcd
    3000..=3000,   // Grafana
    3306..=3306,   // MySQL
    4140..=4143,   // Linkerd proxy
    4191..=4191,   // Linkerd admin
    4222..=4222,   // NATS
    4317..=4318,   // OTLP
    5432..=5432,   // PostgreSQL
    5672..=5672,   // AMQP
    6379..=6379,   // Redis
    6443..=6443,   // Kubernetes API server
    8080..=8080,   // HTTP alternate
    8443..=8443,   // HTTPS alternate
    9042..=9042,   // Cassandra
    9090..=9093,   // Prometheus, Alertmanager, Kafka
    9100..=9100,   // node_exporter
    9200..=9200,   // Elasticsearch
    9300..=9300,   // Elasticsearch transport
    9443..=9443,   // admission webhooks
    9700..=9700,   // kstall
    10250..=10250, // kubelet
    10255..=10257, // kubelet read-only, kube-proxy, controller-manager
    10259..=10259, // scheduler
    11211..=11211, // memcached
    15000..=15021, // Istio / Envoy sidecar (15001 outbound, 15006 inbound)
    15090..=15090, // Envoy metrics
    20048..=20048, // NFS mountd
    27017..=27017, // MongoDB
];

/// The kernel's set of ports counted by number: the well-known ones and `extra`.
pub fn kept_ports(extra: &[RangeInclusive<u16>]) -> KeptPorts {
    let mut kept = KeptPorts::NONE;
    for port in WELL_KNOWN_PORTS.iter().chain(extra).cloned().flatten() {
        kept.insert(port);
    }
    kept
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_the_well_known_ports_and_the_extra_ones_by_number() {
        let kept = kept_ports(&[30000..=30002]);
        for port in [22, 53, 443, 1023, 2049, 6443, 10250, 15001, 15006, 20048, 30000, 30002] {
            assert!(kept.contains(port), "{port}");
        }
        for port in [0, 1024, 2048, 20000, 29999, 30003, 40000, 65535] {
            assert!(!kept.contains(port), "{port}");
        }
        assert!(!kept_ports(&[]).contains(30000));
    }
}
