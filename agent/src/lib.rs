//! kstall's agent: probes, decoding, hung-task state, metrics, the API and the CLI commands.
//! `main.rs` is only the command line; `benches/` measure the event path through this library.

pub mod api;
pub mod attribution;
pub mod cli;
pub mod config;
mod daemon;
pub mod events;
pub mod export;
pub mod hung_tasks;
pub mod incidents;
mod kernel;
pub mod kernel_btf;
pub mod probes;
pub mod symbols;
