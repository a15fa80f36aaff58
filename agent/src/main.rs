//! kstall: eBPF node agent that explains why pods and nodes stall. The library holds the agent;
//! this file parses the command line and runs the chosen command.

use std::process::ExitCode;

use clap::{Parser, Subcommand, error::ErrorKind};
use kstall::{cli, config};

#[derive(Debug, Parser)]
#[command(name = "kstall", version, about = "eBPF node agent: why pods and nodes stall")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the node agent (root): load the probes, serve /metrics and the API socket.
    Agent(Box<config::AgentArgs>),
    /// Show every probe (loaded or not, and why), events and losses, from the running agent.
    Status(cli::status::StatusArgs),
    /// Capture events live from the running agent, filtered (pod, port, probe, ...) and bounded.
    Trace(cli::trace::TraceArgs),
    /// Incidents firing now (--all: and recently resolved), with evidence and the way out.
    Incidents(cli::incidents::IncidentsArgs),
    /// Everything kstall knows about one pod now, and the next step.
    Explain(cli::explain::ExplainArgs),
    /// Capture a pod's network namespace: packets as pcapng, headers only unless asked, bounded.
    Capture(cli::capture::CaptureArgs),
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) if matches!(e.kind(), ErrorKind::DisplayHelp | ErrorKind::DisplayVersion) => {
            let _ = e.print();
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            // clap's rendering is several lines; the first one names the problem.
            let rendered = e.render().to_string();
            let first = rendered.lines().next().unwrap_or("usage error").trim_start_matches("error: ");
            eprintln!("kstall: {first} (see kstall --help)");
            return ExitCode::from(cli::EXIT_USAGE);
        }
    };
    match cli.command {
        Command::Agent(args) => cli::agent::run(*args),
        Command::Status(args) => cli::status::run(args),
        Command::Trace(args) => cli::trace::run(args),
        Command::Incidents(args) => cli::incidents::run(args),
        Command::Explain(args) => cli::explain::run(args),
        Command::Capture(args) => cli::capture::run(args),
    }
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory as _;

    /// clap checks a command line's declaration (unique ids and groups, among them those of the
    /// subsystems' flattened settings) only in debug builds, when it is parsed.
    #[test]
    fn the_command_line_is_well_formed() {
        super::Cli::command().debug_assert();
    }
}
