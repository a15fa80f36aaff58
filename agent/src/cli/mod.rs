//! One file per subcommand.
pub mod agent;
pub mod capture;
pub mod explain;
pub mod incidents;
pub mod status;
pub mod trace;

/// Exit codes: 0 done, 1 runtime error, 64 usage (sysexits EX_USAGE).
pub const EXIT_RUNTIME: u8 = 1;
pub const EXIT_USAGE: u8 = 64;
