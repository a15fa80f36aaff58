//! kstall's kernel programs. Each probe lives in `probes/<probe>.rs`; this file only wires the
//! shared maps, the panic handler and the license.
#![no_std]
#![no_main]
// `core::sync::atomic` has no read-modify-write for BPF (no compare-and-swap before v3): an
// atomic add whose result is unused goes through the intrinsic, as BPF's XADD.
#![feature(core_intrinsics)]
#![allow(internal_features)]

mod clock;
mod maps;
mod probes;
mod read;
mod task;
mod zero;

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}

// GPL-compatible: tp_btf programs and bpf_probe_read_kernel need it.
#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 4] = *b"GPL\0";
