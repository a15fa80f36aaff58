//! A span: bytes of a kernel struct that a program copies with one read where it needs several
//! of its fields on a hot path (`ebpf/src/read.rs`'s `Span`); the agent places it from BTF.

/// Bytes of a span: under emulation a helper call costs far more than the bytes it copies.
pub const SPAN_LEN: u32 = 128;

/// A struct whose layout allows no span: each field is read on its own.
pub const NO_SPAN: u32 = u32::MAX;
