//! A netlink receive buffer as `kstall capture` reads it from a namespace (rtnetlink, sock_diag
//! and ctnetlink replies and events — a namespace a pod's NET_ADMIN containers may fill):
//! `capture::netlink::messages`, then every decoder over each message and the attribute walk
//! down every nested level. Never a panic; every attribute lies inside its message.
#![no_main]

use std::collections::HashMap;

use kstall::capture::{ct, netlink, rtnl, sockets};
use libfuzzer_sys::fuzz_target;

/// Walks `buf`'s attributes, and each value's as if nested, `depth` levels down.
fn walk(buf: &[u8], depth: u8) {
    let range = buf.as_ptr_range();
    for (_, value) in netlink::attrs(buf) {
        assert!(range.start <= value.as_ptr() && value.as_ptr_range().end <= range.end);
        if depth > 0 {
            walk(value, depth - 1);
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let names = HashMap::from([(1, "lo".to_string()), (2, "eth0".to_string())]);
    for message in netlink::messages(data) {
        let Ok(message) = message else { break };
        let _ = ct::event(message.kind, message.payload);
        let _ = ct::entry(message.payload);
        let _ = rtnl::address(message.payload, &names);
        let _ = rtnl::route(message.payload, &names);
        // Whatever inode the message names is held, by a name that needs escaping.
        let inode = message.payload.get(68..72).map_or(0, |b| u32::from_ne_bytes(b.try_into().unwrap()));
        let holder = sockets::Owner { comm: "a\"),(\n\u{7f}".into(), pid: 1, fd: 3 };
        let owners = sockets::Owners::from([(u64::from(inode), vec![holder])]);
        let _ = sockets::socket("tcp", message.payload, &owners);
        let _ = sockets::socket("udp", message.payload, &sockets::Owners::default());
        let _ = netlink::error_of(message.payload);
        walk(message.payload, 4);
    }
});
