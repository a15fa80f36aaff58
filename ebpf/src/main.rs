//! kstall's kernel programs. Each probe lives in `probes/<probe>.rs`; this file only wires the
//! shared maps, the panic handler and the license.
#![no_std]
#![no_main]

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
