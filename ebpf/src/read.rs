//! Reads of kernel memory at offsets the agent resolved from BTF.
//!
//! Two kinds: [`typed`], a plain load from an object the verifier knows the BTF type of (a
//! `tp_btf` or `fentry` argument, or a struct pointer loaded from one), and [`field`]/[`at`],
//! `bpf_probe_read_kernel` for everything else (packet bytes, integers that hold pointers, and
//! offsets past the typed struct, such as `inet_sock`'s fields of a `struct sock *`).

use aya_ebpf::{
    cty::c_void,
    helpers::{bpf_probe_read_kernel, generated},
};
use kstall_common::span::{NO_SPAN, SPAN_LEN};

/// Reads a `T` at `base + offset`. Fails (instead of reading garbage) on a NULL base.
#[inline(always)]
pub fn at<T>(base: *const u8, offset: u32) -> Result<T, i32> {
    if base.is_null() {
        return Err(-1);
    }
    unsafe { bpf_probe_read_kernel(base.wrapping_add(offset as usize).cast::<T>()) }
}

/// Kernel values for which all-zero bytes are a valid value ("could not be read").
///
/// # Safety
/// Only for types where every bit pattern, zero included, is a valid value.
pub unsafe trait Plain {}
unsafe impl Plain for u8 {}
unsafe impl Plain for u16 {}
unsafe impl Plain for u32 {}
unsafe impl Plain for i32 {}
unsafe impl Plain for u64 {}
unsafe impl Plain for *const u8 {}
unsafe impl<const N: usize> Plain for [u8; N] {}

/// Reads a `T` at `base + offset`, zero when it cannot be read (NULL or a bad address). Without a
/// branch: the kernel zeroes the destination of a failed read, so a chain of these is one path
/// for the verifier, where `at`'s error branches double the paths at every read.
#[inline(always)]
pub fn field<T: Plain>(base: *const u8, offset: u32) -> T {
    let mut value = core::mem::MaybeUninit::<T>::uninit();
    unsafe {
        generated::bpf_probe_read_kernel(
            value.as_mut_ptr().cast::<c_void>(),
            core::mem::size_of::<T>() as u32,
            base.wrapping_add(offset as usize).cast::<c_void>(),
        );
        // Read or zeroed by the helper.
        value.assume_init()
    }
}

/// Loads a `T` at `base + offset` where `base` is BTF-typed: no helper call (the JIT turns the
/// load into one that reads zero where the address faults). The verifier checks the access
/// against the type, so `offset` must be a constant to it (read from the .rodata the agent
/// patched before load) and `T` must fit the field; a pointer to a struct loads as typed again.
#[inline(always)]
pub fn typed<T: Plain>(base: *const u8, offset: u32) -> T {
    unsafe { core::ptr::read_volatile(base.wrapping_add(offset as usize).cast::<T>()) }
}

/// Copies the NUL-terminated string at `src` into `dst`; `dst` is all zero when it cannot be read.
/// Without a branch, as [`field`].
#[inline(always)]
pub fn string<const N: usize>(src: *const u8, dst: &mut [u8; N]) {
    unsafe {
        generated::bpf_probe_read_kernel_str(
            dst.as_mut_ptr().cast::<c_void>(),
            N as u32,
            src.cast::<c_void>(),
        );
    }
}

/// A copy of `SPAN_LEN` bytes of a kernel struct, where a program needs several of its fields on
/// a hot path: one `bpf_probe_read_kernel` for all of them, each field then a load from the copy
/// (under emulation a helper call costs far more than the bytes it copies). The agent places the
/// span (`start`, 8-aligned, inside the struct); a field outside it is read on its own.
pub struct Span {
    base: *const u8,
    start: u32,
    copy: Option<*const SpanBytes>,
}

/// Where a [`Span`] is copied to: a per-CPU map slot (the stack is the event's).
#[repr(C, align(8))]
pub struct SpanBytes([u8; SPAN_LEN as usize]);

impl Span {
    /// Copies the span of `base` starting at `start` into `slot`; with no slot or `NO_SPAN`,
    /// copies nothing.
    #[inline(always)]
    pub fn read(slot: Option<*mut SpanBytes>, base: *const u8, start: u32) -> Self {
        let copy = slot.filter(|_| start != NO_SPAN).map(|slot| {
            unsafe {
                // Read or zeroed by the helper.
                generated::bpf_probe_read_kernel(
                    slot.cast::<c_void>(),
                    SPAN_LEN,
                    base.wrapping_add(start as usize).cast::<c_void>(),
                );
            }
            slot.cast_const()
        });
        Self { base, start, copy }
    }

    /// The `T` at `offset` in the struct, as [`field`] reads it.
    #[inline(always)]
    pub fn field<T: Plain>(&self, offset: u32) -> T {
        // 64-bit arithmetic on what were u32s: the register compared is the one added to the
        // slot's address (a 32-bit difference is zero-extended twice, the verifier then sees
        // the bound on one copy and the load through the other).
        let within = (offset as u64).wrapping_sub(self.start as u64) as usize;
        match self.copy {
            // The bound is a constant, for the verifier to check the load against the slot.
            Some(copy) if within <= SPAN_LEN as usize - core::mem::size_of::<T>() => unsafe {
                core::ptr::read_volatile(copy.cast::<u8>().wrapping_add(within).cast::<T>())
            },
            _ => field(self.base, offset),
        }
    }
}
