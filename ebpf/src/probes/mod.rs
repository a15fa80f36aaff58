pub mod hung_task;
pub mod nfs;
pub mod oom;
pub mod tcp_reset;
