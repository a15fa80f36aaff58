pub mod alertmanager;
pub mod http;
pub mod metrics;
