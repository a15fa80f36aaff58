//! kstall's one entry point for everything that is not plain cargo.
//!
//! `cargo xtask run` and `cargo xtask test` are the README's two set-up commands: both bootstrap
//! what is missing first, so a fresh Debian 12 machine needs nothing else.

mod bench;
mod bootstrap;
mod build;
mod run;
mod test;
mod vm;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "cargo xtask", about = "Bootstrap, build, run and test kstall")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Install what is missing: apt packages, the nightly's rust-src, bpf-linker (idempotent).
    Bootstrap,
    /// Bootstrap, then build the release binary (target/release/kstall).
    Build,
    /// Bootstrap, build, and start `kstall agent` here (root); arguments after `--` go to the agent.
    Run {
        #[arg(last = true)]
        agent_args: Vec<String>,
    },
    /// Bootstrap, build, then fmt/clippy checks, every unit test and every kernel integration test.
    Test,
    /// Bootstrap, build, then the benchmarks (root): a reset storm through a real agent.
    Bench,
    /// The kernel matrix (root): boot Debian 6.1 and 6.12 in VMs; in each, load every probe and
    /// run the incident scenarios (real NFS, a real global OOM).
    VmTest {
        /// Only these kernels (6.1, 6.12) [default: all].
        #[arg(long = "kernel")]
        kernels: Vec<String>,
    },
}

fn main() -> ExitCode {
    let result = match Cli::parse().command {
        Command::Bootstrap => bootstrap::run().map(|_| ()),
        Command::Build => bootstrap::run().and_then(|env| build::release(&env)),
        Command::Run { agent_args } => run::run(&agent_args),
        Command::Test => test::run(),
        Command::Bench => bench::run(),
        Command::VmTest { kernels } => vm::run(&kernels),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("xtask: {e:#}");
            ExitCode::FAILURE
        }
    }
}
