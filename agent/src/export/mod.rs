pub mod alertmanager;
pub mod histogram;
pub mod json_lines;
pub mod kubernetes;
pub mod metrics;
pub mod series;
