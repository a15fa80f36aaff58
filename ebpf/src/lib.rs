// The agent build-depends on this crate so cargo rebuilds it when the kernel programs change; the
// programs themselves are the `kstall` binary target, built for bpfel by aya-build.
#![no_std]
