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
        let _ = sockets::socket("tcp", message.payload);
        let _ = sockets::socket("udp", message.payload);
        let _ = netlink::error_of(message.payload);
        walk(message.payload, 4);
    }
});
