pub mod cpu_lockup;
pub mod hung_task;
pub mod nfs;
pub mod oom;
pub mod packet_drop;
pub mod stuck_task;
pub mod tcp_reset;
