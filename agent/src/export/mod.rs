pub mod alertmanager;
pub mod metrics;
