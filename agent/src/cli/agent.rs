use std::{io::IsTerminal as _, process::ExitCode};

use tracing_subscriber::EnvFilter;

use super::{EXIT_RUNTIME, EXIT_USAGE};
use crate::config::{AgentArgs, Config, LogFormat};

pub fn run(args: AgentArgs) -> ExitCode {
    let config = match Config::resolve(args) {
        Ok(config) => config,
        Err(e) => {
            eprintln!("kstall: {e}");
            return ExitCode::from(EXIT_USAGE);
        }
    };
    init_logging(&config);
    if let Err(e) = crate::kernel::raise_permitted_capabilities() {
        tracing::warn!(error = %e, "cannot raise the permitted capabilities");
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("kstall: cannot start the runtime: {e}");
            return ExitCode::from(EXIT_RUNTIME);
        }
    };
    match runtime.block_on(crate::daemon::run(config)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("{e:#}");
            eprintln!("kstall: {e:#}");
            ExitCode::from(EXIT_RUNTIME)
        }
    }
}

fn init_logging(config: &Config) {
    // Validated in Config::resolve. kube's client logs every failed request of a retry loop; the
    // pod source reports an outage once instead (a filter naming kube_client still wins).
    let filter = EnvFilter::try_new(format!("kube_client=off,{}", config.log_level))
        .unwrap_or_else(|_| EnvFilter::new("info"));
    let json = match config.log_format {
        LogFormat::Json => true,
        LogFormat::Text => false,
        LogFormat::Auto => !std::io::stderr().is_terminal(),
    };
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal());
    if json {
        builder.json().init();
    } else {
        builder.init();
    }
}
