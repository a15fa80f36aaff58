//! Captures (issue 57): packets of a pod's network namespace, as pcapng, bounded, and the
//! namespace's state beside them. For now run by `kstall capture start --standalone` in the
//! CLI's own process. `filter.rs` compiles the operator's filter (libpcap's language) with the
//! headers-only tail, `pcapng.rs` writes the file, `packets.rs` opens a socket per interface
//! inside the namespace and reads them; `net.rs` records the namespace's conntrack entries and
//! events (`ct.rs`), rules (`rules.rs`), sockets (`sockets.rs`), addresses and routes
//! (`rtnl.rs`), over `netlink.rs`.

pub mod ct;
pub mod filter;
pub mod net;
pub mod netlink;
pub mod packets;
pub mod pcapng;
pub mod rtnl;
mod rules;
pub mod sockets;
