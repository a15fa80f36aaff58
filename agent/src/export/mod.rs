pub mod http;
pub mod metrics;
