//! Zeroed events and keys, eight bytes a store.
//!
//! Why not `Default` or a struct literal: the compiler zeroes arrays and padding with calls to
//! `memset`, which in BPF is compiler_builtins' loop of one-byte stores, four instructions a byte.
//! A reset's 128-byte event cost over 500 instructions that way before it read anything, most
//! of what a reset cost in the kernel. Volatile stores keep the compiler from turning these back
//! into `memset`.

use core::mem::{MaybeUninit, align_of, size_of};

use kstall_common::{
    EventHeader, hung_task::HungTaskEvent, oom::OomCountKey, oom::OomKillEvent, stuck_task::StuckTaskEvent,
    tcp_reset::TcpResetEvent,
};

/// Types zeroed word by word.
///
/// # Safety
/// All-zero bytes must be a valid value, the size a multiple of 8 and the alignment at least 8
/// (checked at compile time by [`zero`]).
pub unsafe trait Zeroable {}
unsafe impl Zeroable for EventHeader {}
unsafe impl Zeroable for TcpResetEvent {}
unsafe impl Zeroable for OomKillEvent {}
unsafe impl Zeroable for OomCountKey {}
unsafe impl Zeroable for HungTaskEvent {}
unsafe impl Zeroable for StuckTaskEvent {}

/// Zeroes `slot` (on the stack) and returns it as a `T`. In place, not a returned value: the
/// compiler turns the copy of a value it knows is zero back into a `memset`.
#[inline(always)]
pub fn zeroed_in<T: Zeroable>(slot: &mut MaybeUninit<T>) -> &mut T {
    // SAFETY: every byte is written; all-zero is a valid `T` (`Zeroable`).
    unsafe {
        zero(slot.as_mut_ptr());
        slot.assume_init_mut()
    }
}

/// Zeroes the `T` at `ptr` (ring-buffer memory).
///
/// # Safety
/// `ptr` must be valid for writes of a `T` and 8-byte aligned.
#[inline(always)]
pub unsafe fn zero<T: Zeroable>(ptr: *mut T) {
    const { assert!(size_of::<T>().is_multiple_of(8) && align_of::<T>() >= 8) };
    let words = ptr.cast::<u64>();
    let mut i = 0;
    while i < size_of::<T>() / 8 {
        // SAFETY: within the `T` (the caller's contract).
        unsafe { core::ptr::write_volatile(words.add(i), 0) };
        i += 1;
    }
}
