//! Reads of kernel memory at offsets the agent resolved from BTF.

use aya_ebpf::helpers::bpf_probe_read_kernel;

/// Reads a `T` at `base + offset`. Fails (instead of reading garbage) on a NULL base.
#[inline(always)]
pub fn at<T>(base: *const u8, offset: u32) -> Result<T, i32> {
    if base.is_null() {
        return Err(-1);
    }
    unsafe { bpf_probe_read_kernel(base.wrapping_add(offset as usize).cast::<T>()) }
}
