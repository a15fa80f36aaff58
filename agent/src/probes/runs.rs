//! What the kernel says of each of kstall's programs (`bpf_prog_info`, read through
//! `BPF_OBJ_GET_INFO_BY_FD`): how often it ran and for how long — counted only while the node
//! has `kernel.bpf_stats_enabled` (or a holder of `BPF_ENABLE_STATS`, `--program-stats on`), as
//! the counting itself costs two clock reads a run — and the runs it skipped.
//!
//! Skipped runs (`recursion_misses`, 5.12+): a program already running on a CPU is not run again
//! there until it returns; where tracepoints call their programs preemptibly (7.3 guards them with
//! SRCU, where 6.12 disabled preemption), a task preempted inside one makes the next task's run of
//! it on that CPU a miss — an RPC no histogram timed, seen in the 7.3 VM under load. The counters
//! are exact for what ran; these say what did not.
//!
//! And how full the event ring buffer is: its producer and consumer positions, mapped read-only.

use std::{
    io,
    os::fd::{AsFd, AsRawFd as _, BorrowedFd, OwnedFd},
    ptr::NonNull,
    sync::atomic::{AtomicU64, Ordering},
};

use aya::Ebpf;

use crate::kernel_btf::KernelBtf;

/// Where `struct bpf_prog_info` keeps the figures, from the kernel's BTF.
#[derive(Debug, Clone, Copy)]
pub struct Offsets {
    run_time_ns: usize,
    run_cnt: usize,
    /// 5.12+.
    recursion_misses: Option<usize>,
}

impl Offsets {
    pub fn of(vmlinux: &KernelBtf) -> Option<Self> {
        let offset = |field| vmlinux.offset_of("bpf_prog_info", field).ok().map(|o| o as usize);
        Some(Self {
            run_time_ns: offset("run_time_ns")?,
            run_cnt: offset("run_cnt")?,
            recursion_misses: offset("recursion_misses"),
        })
    }

    fn end(&self) -> usize {
        [self.run_time_ns, self.run_cnt, self.recursion_misses.unwrap_or(0)].into_iter().max().unwrap_or(0)
            + 8
    }
}

/// One program's figures so far.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Runs {
    /// Runs counted while run-time statistics were on.
    pub count: u64,
    /// Their time in the program, nanoseconds.
    pub run_ns: u64,
    /// Runs skipped; `None` on a kernel that does not count them.
    pub missed: Option<u64>,
}

/// Every loaded program, to read its figures.
pub struct Programs {
    offsets: Offsets,
    programs: Vec<(String, OwnedFd)>,
}

/// `BPF_OBJ_GET_INFO_BY_FD`'s attribute (`union bpf_attr`'s `info`).
#[repr(C)]
struct InfoByFd {
    bpf_fd: u32,
    info_len: u32,
    info: u64,
}

const BPF_OBJ_GET_INFO_BY_FD: libc::c_long = 15;
const BPF_ENABLE_STATS: libc::c_long = 32;
const BPF_STATS_RUN_TIME: u32 = 0;

impl Programs {
    /// The loaded programs of `ebpf`; `None` on a kernel whose BTF has no `bpf_prog_info`.
    pub fn of(ebpf: &Ebpf, offsets: Option<Offsets>) -> Option<Self> {
        let offsets = offsets?;
        let programs = ebpf
            .programs()
            .filter_map(|(name, program)| {
                let fd = program.fd().ok()?.as_fd().try_clone_to_owned().ok()?;
                Some((name.to_string(), fd))
            })
            .collect();
        Some(Self { offsets, programs })
    }

    /// Each program's figures (a program whose info cannot be read is left out).
    pub fn read(&self) -> Vec<(&str, Runs)> {
        self.programs.iter().filter_map(|(name, fd)| Some((name.as_str(), self.runs(fd)?))).collect()
    }

    fn runs(&self, fd: &OwnedFd) -> Option<Runs> {
        // Only up to the last field read: the kernel fills the first `info_len` bytes of its struct.
        let mut info = vec![0u8; self.offsets.end()];
        let attr = InfoByFd {
            bpf_fd: fd.as_raw_fd() as u32,
            info_len: info.len() as u32,
            info: info.as_mut_ptr() as u64,
        };
        // SAFETY: the attribute points at `info`, writable for `info_len` bytes, alive for the call.
        let rc = unsafe {
            libc::syscall(
                libc::SYS_bpf,
                BPF_OBJ_GET_INFO_BY_FD,
                &attr as *const InfoByFd,
                size_of::<InfoByFd>(),
            )
        };
        let at = |offset: usize| u64::from_ne_bytes(info[offset..offset + 8].try_into().expect("8 bytes"));
        (rc == 0).then(|| Runs {
            count: at(self.offsets.run_cnt),
            run_ns: at(self.offsets.run_time_ns),
            missed: self.offsets.recursion_misses.map(at),
        })
    }
}

/// Turns the kernel's run-time statistics on for as long as the returned descriptor is held
/// (5.8+, CAP_SYS_ADMIN); the kernel counts holders, so this never turns off another's.
pub fn enable_run_time_stats() -> io::Result<OwnedFd> {
    #[repr(C)]
    struct EnableStats {
        kind: u32,
    }
    let attr = EnableStats { kind: BPF_STATS_RUN_TIME };
    // SAFETY: the attribute is valid for the call; a returned descriptor is ours to own.
    let fd = unsafe {
        libc::syscall(libc::SYS_bpf, BPF_ENABLE_STATS, &attr as *const EnableStats, size_of::<EnableStats>())
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a fresh descriptor the kernel just returned.
    Ok(unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd as i32) })
}

/// Whether the node turned the kernel's run-time statistics on (`kernel.bpf_stats_enabled`; a
/// holder of `BPF_ENABLE_STATS` turns them on without the sysctl showing it); `None` when
/// unreadable.
pub fn run_time_stats_enabled() -> Option<bool> {
    let text = std::fs::read_to_string("/proc/sys/kernel/bpf_stats_enabled").ok()?;
    Some(text.trim() != "0")
}

/// The ring buffer's positions, mapped read-only: what the programs wrote and the reader has not
/// taken yet.
pub struct RingFill {
    consumer: NonNull<libc::c_void>,
    producer: NonNull<libc::c_void>,
    page: usize,
    size: u64,
}

// SAFETY: the mappings are read-only pages read with atomic loads.
unsafe impl Send for RingFill {}
unsafe impl Sync for RingFill {}

impl RingFill {
    /// Maps the consumer's page (offset 0) and the producer's (one page in) of the ring buffer
    /// `ring` of `size` bytes.
    pub fn of(ring: BorrowedFd<'_>, size: u64) -> io::Result<Self> {
        // SAFETY: no preconditions.
        let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as usize;
        let map = |offset: usize| {
            // SAFETY: a new read-only shared mapping of one page of the map's descriptor; the
            // kernel lets anyone map these pages read-only.
            let at = unsafe {
                libc::mmap(
                    std::ptr::null_mut(),
                    page,
                    libc::PROT_READ,
                    libc::MAP_SHARED,
                    ring.as_raw_fd(),
                    offset as libc::off_t,
                )
            };
            match at {
                libc::MAP_FAILED => Err(io::Error::last_os_error()),
                at => Ok(NonNull::new(at).expect("mmap returned null")),
            }
        };
        let consumer = map(0)?;
        let producer = match map(page) {
            Ok(p) => p,
            Err(e) => {
                // SAFETY: mapped above, of `page` bytes.
                unsafe { libc::munmap(consumer.as_ptr(), page) };
                return Err(e);
            }
        };
        Ok(Self { consumer, producer, page, size })
    }

    pub fn size(&self) -> u64 {
        self.size
    }

    /// Bytes written and not yet consumed (records and their headers).
    pub fn used(&self) -> u64 {
        // SAFETY: each mapping starts with the kernel's 8-byte-aligned position, written
        // atomically by the kernel (and by the reader, for the consumer's).
        let load = |page: NonNull<libc::c_void>| unsafe {
            (*page.cast::<AtomicU64>().as_ptr()).load(Ordering::Acquire)
        };
        let consumer = load(self.consumer);
        load(self.producer).saturating_sub(consumer).min(self.size)
    }
}

impl Drop for RingFill {
    fn drop(&mut self) {
        // SAFETY: mapped in `of`, `page` bytes each, not used after this.
        unsafe {
            libc::munmap(self.consumer.as_ptr(), self.page);
            libc::munmap(self.producer.as_ptr(), self.page);
        }
    }
}
