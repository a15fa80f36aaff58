//! Runs of kstall's programs the kernel skipped. A program already running on a CPU is not run
//! again there until it returns (the kernel's `recursion_misses`, in `bpf_prog_info` from 5.12):
//! where tracepoints call their programs preemptibly (7.3 guards them with SRCU, where 6.12
//! disabled preemption), a task preempted inside one makes the next task's run of it on that CPU a
//! miss — an RPC no histogram timed, seen in the 7.3 VM under load.
//! The counters are exact for what ran; these say what did not.

use std::os::fd::{AsFd as _, AsRawFd as _, OwnedFd};

use aya::Ebpf;

/// Every loaded program and where `bpf_prog_info` keeps its misses.
pub struct ProgramMisses {
    /// `recursion_misses`' offset in `struct bpf_prog_info` (from the kernel's BTF).
    offset: usize,
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

impl ProgramMisses {
    /// The loaded programs of `ebpf`; `offset` is `None` on a kernel that does not count misses.
    pub fn of(ebpf: &Ebpf, offset: Option<u32>) -> Option<Self> {
        let offset = offset? as usize;
        let programs = ebpf
            .programs()
            .filter_map(|(name, program)| {
                let fd = program.fd().ok()?.as_fd().try_clone_to_owned().ok()?;
                Some((name.to_string(), fd))
            })
            .collect();
        Some(Self { offset, programs })
    }

    /// Each program's misses so far (a program whose info cannot be read is left out).
    pub fn read(&self) -> Vec<(&str, u64)> {
        self.programs.iter().filter_map(|(name, fd)| Some((name.as_str(), self.misses(fd)?))).collect()
    }

    fn misses(&self, fd: &OwnedFd) -> Option<u64> {
        // Only up to the field: the kernel fills the first `info_len` bytes of its struct.
        let mut info = vec![0u8; self.offset + 8];
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
        (rc == 0).then(|| u64::from_ne_bytes(info[self.offset..self.offset + 8].try_into().expect("8 bytes")))
    }
}
