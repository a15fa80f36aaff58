pub mod hung_task;
pub mod tcp_reset;
