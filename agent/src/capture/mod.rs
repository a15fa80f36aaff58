//! Captures (issue 57): packets of a pod's network namespace, as pcapng, bounded. For now the
//! packets alone, run by `kstall capture start --standalone` in the CLI's own process.
//! `filter.rs` compiles the operator's filter (libpcap's language) with the headers-only tail,
//! `pcapng.rs` writes the file, `packets.rs` opens a socket per interface inside the namespace
//! and reads them.

pub mod filter;
pub mod packets;
pub mod pcapng;
