//! `iptables-save` output as `kstall explain pod` reads it from a meshed pod's network namespace
//! (whose rules the pod's own NET_ADMIN containers may have written), parsed by
//! `nat_rules::Dump::parse`, then walked for a few NFS connections. Never a panic, never a
//! hang: every walk ends with a verdict, and a verdict serializes.
#![no_main]

use kstall::nat_rules::{Connection, Dump, Verdict};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    // The agent reads the program's output lossily: any bytes become text.
    let text = String::from_utf8_lossy(data);
    let dump = Dump::parse(&text);
    let _ = dump.has_nat_rules();
    let servers = [None, Some("10.55.0.1".parse().unwrap()), Some("fd00::5".parse().unwrap())];
    for server in servers {
        for port in [2049, 111, 20048, 0, 65535] {
            let connection = Connection { server, port, pod_ips: vec!["10.55.0.2".parse().unwrap()] };
            let verdict = dump.verdict(&connection);
            if let Verdict::Redirected { via, .. } = &verdict {
                assert!(via.len() <= 64, "no deeper than the walk allows");
            }
            serde_json::to_vec(&verdict).expect("a verdict serializes");
        }
    }
});
