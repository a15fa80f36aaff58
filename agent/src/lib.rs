//! kstall's agent: probes, decoding, attribution, the stuck-task set, incidents, metrics, the API
//! and the CLI commands. `main.rs` is only the command line; `benches/` measure the event path
//! through this library. docs/architecture.md has the map; imports point one way (from `daemon`
//! down to `decode`/`kernel`), checked by `cargo xtask imports`.

pub mod api;
pub mod attribution;
pub mod capture;
pub mod cli;
pub mod config;
pub mod conntrack;
mod daemon;
pub mod decode;
mod enter;
pub mod events;
pub mod export;
#[cfg(test)]
mod fake_api;
pub mod incidents;
mod kernel;
pub mod kernel_btf;
pub mod kubelet;
mod memory;
mod named_file;
pub mod nat_rules;
pub mod pipeline;
pub mod pressure;
pub mod probes;
#[cfg(test)]
mod registry_tests;
mod sampler;
pub mod setting;
pub mod state;
pub mod stuck;
pub mod symbols;
pub mod web_config;
