pub mod alertmanager;
pub mod kubernetes;
pub mod metrics;
pub mod series;
