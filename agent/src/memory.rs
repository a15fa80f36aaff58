//! Keeps the agent's resident size — what a pod's memory limit charges — at what it holds rather
//! than at what it once held.

/// Returns the free pages of every malloc arena to the kernel. A scrape builds every series twice
/// over (the registry's copy, then its text) and frees both; glibc gives back only what is free at
/// the top of a heap, so without this the agent stays as large as its largest scrape. With 10,000
/// live series (`cargo xtask bench`, resets to 5,000 distinct ports): 52 MiB resident without, 37
/// MiB with, for about 1 ms of a 150 ms scrape.
pub fn return_freed() {
    #[cfg(target_env = "gnu")]
    // SAFETY: malloc_trim has no precondition.
    unsafe {
        libc::malloc_trim(0);
    }
}
