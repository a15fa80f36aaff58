pub mod alertmanager;
pub mod histogram;
pub mod kubernetes;
pub mod metrics;
pub mod series;
