//! The API socket (`kstall status`, `kstall trace`, `kstall explain`, `kstall capture`): one
//! request line from any local client, parsed by `api::server::parse_request`; then what the agent
//! does with it that needs no running agent: a trace filter matched against events, an explain
//! query looked up in an attribution index, a capture's bounds checked, a bundle id checked. A bad line is an error reply, never a panic; a request the CLI sends (the
//! serialized `Request`) parses back to itself.
#![no_main]

use std::sync::{Arc, LazyLock};

use kstall::{
    api::{Request, explain, filter::TraceFilter, server::parse_request},
    attribution::{Attributed, Attribution, Index, Via, cgroup::Qos},
    capture::{
        flags::Settings,
        service::{self, Ask},
        store,
    },
    decode::bytes_of,
    events::Decoder,
};
use kstall_common::{EventHeader, kind, tcp_reset as raw};
use libfuzzer_sys::fuzz_target;

/// An NFS socket error (ETIMEDOUT from 10.55.0.1:2049), as recorded on Debian 6.1
/// (agent/testdata/nfs/6.1.raw).
const NFS_RECORD: &str = "0400000001000000950e500d0e00000000000000000000000100000000000000c30100f000000000737761707065722f31000000000000000400000092ffffff00000000000000000000000000000000000000000000000002000108000000000a37000100000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000";

fn who(pod: &str, uid: &str, container: &str, via: Via) -> Arc<Attribution> {
    Arc::new(Attribution {
        namespace: "shop".into(),
        pod: pod.into(),
        container: container.into(),
        workload: "Deployment/web".into(),
        pod_uid: Some(uid.into()),
        container_id: (!container.is_empty()).then(|| format!("{container}-0123456789abcdef")),
        qos: Some(Qos::Burstable),
        via,
        ..Default::default()
    })
}

/// A reset redirected from the NFS port to a sidecar's (the agent's own unit-test sample), and
/// the recorded NFS error, attributed to a pod and to the host.
static EVENTS: LazyLock<Vec<Attributed>> = LazyLock::new(|| {
    let mut header = EventHeader::zeroed();
    (header.kind, header.version, header.netns_ino, header.tgid, header.pid) =
        (kind::TCP_RESET, raw::VERSION, 4026532999, 4242, 4243);
    let mut reset = raw::TcpResetEvent {
        header,
        direction: raw::DIRECTION_SENT,
        hook: raw::HOOK_TCP_SEND_RESET,
        family: raw::FAMILY_INET,
        flags: raw::FLAG_HAS_CONNTRACK | raw::FLAG_HAS_REASON,
        state: 0,
        _pad: [0; 3],
        reason: 1,
        _pad2: 0,
        local_port: 15001,
        remote_port: 40000,
        orig_dst_port: 2049,
        redirect_port: 15001,
        local_addr: [0; 16],
        remote_addr: [0; 16],
        orig_dst_addr: [0; 16],
    };
    reset.local_addr[..4].copy_from_slice(&[127, 0, 0, 1]);
    reset.remote_addr[..4].copy_from_slice(&[127, 0, 0, 1]);
    reset.orig_dst_addr[..4].copy_from_slice(&[10, 0, 0, 5]);
    let nfs: Vec<u8> = (0..NFS_RECORD.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&NFS_RECORD[i..i + 2], 16).unwrap())
        .collect();
    let decoder = Decoder::default();
    let mut events = Vec::new();
    for bytes in [bytes_of(&reset), nfs] {
        let event = decoder.decode(&bytes).expect("a sample record decodes");
        events.push(Attributed {
            event: event.clone(),
            who: who("web-5d8c7b9f4-x2x9z", UID, "app", Via::Cgroup),
        });
        events.push(Attributed { event, who: Arc::new(Attribution { host: true, ..Default::default() }) });
    }
    events
});

const UID: &str = "0c2a5b1e-7f3d-4c1a-9e8b-1234567890ab";

/// What `kstall explain pod` is answered from: a pod's container cgroups and its namespace.
static INDEX: LazyLock<Index> = LazyLock::new(|| {
    let mut index = Index::default();
    index.by_cgroup.insert(10, who("web-5d8c7b9f4-x2x9z", UID, "app", Via::Cgroup));
    index.by_cgroup.insert(11, who("web-5d8c7b9f4-x2x9z", UID, "", Via::Cgroup));
    index.by_cgroup.insert(12, who("db-0", "11111111-2222-3333-4444-555555555555", "postgres", Via::Cgroup));
    index.by_netns.insert(4026532999, who("web-5d8c7b9f4-x2x9z", UID, "", Via::Netns));
    index
        .departed_netns
        .insert(4026533000, who("gone-1", "99999999-2222-3333-4444-555555555555", "", Via::Netns));
    index
});

fuzz_target!(|data: &[u8]| {
    // The server reads one line (up to and with the first newline, at most 64 KiB: more than
    // libFuzzer's inputs); not UTF-8 is an error reply, never parsed.
    let line = match data.iter().position(|&b| b == b'\n') {
        Some(end) => &data[..=end],
        None => data,
    };
    let Ok(line) = std::str::from_utf8(line) else { return };
    let request = match parse_request(line) {
        Ok(request) => request,
        Err(e) => {
            let _ = e.to_string();
            return;
        }
    };
    let sent = serde_json::to_string(&request).expect("a request serializes");
    assert_eq!(parse_request(&sent).expect("a serialized request parses"), request, "{sent}");
    match request {
        Request::Events => trace(&TraceFilter::default()),
        Request::Trace { filter } => trace(&filter),
        Request::ExplainPod { pod, namespace } => match explain::find(&INDEX, &pod, namespace.as_deref()) {
            Ok(found) => {
                let explanation = explain::explain(&INDEX, found, vec![], vec![], vec![]);
                serde_json::to_vec(&explanation).expect("an explanation serializes");
            }
            Err(error) => assert!(!error.is_empty()),
        },
        Request::CaptureStart { filter, duration_secs, max_bytes, max_packets, snaplen, .. } => {
            let ask = Ask { filter, duration_secs, max_bytes, max_packets, snaplen };
            if let Err(refused) = service::bounds(&ask, &Settings::default()) {
                assert!(!refused.is_empty() && !refused.contains('\n'), "{refused:?}");
            }
        }
        Request::CaptureGet { id } | Request::CaptureStop { id } => {
            if let Err(refused) = store::check_id(&id) {
                assert!(!refused.contains('\n'), "{refused:?}");
            }
        }
        Request::Status | Request::Incidents | Request::Captures => {}
    }
});

fn trace(filter: &TraceFilter) {
    for event in EVENTS.iter() {
        let _ = filter.matches(event);
    }
}
