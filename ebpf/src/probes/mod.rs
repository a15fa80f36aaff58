pub mod tcp_reset;
