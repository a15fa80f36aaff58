pub mod hung_task;
pub mod oom;
pub mod tcp_reset;
