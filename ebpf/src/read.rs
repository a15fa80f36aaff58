//! Reads of kernel memory at offsets the agent resolved from BTF.

use aya_ebpf::{
    cty::c_void,
    helpers::{bpf_probe_read_kernel, generated},
};

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
