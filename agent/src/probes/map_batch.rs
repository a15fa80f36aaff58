//! Batched reads and deletes of a per-CPU hash map (`BPF_MAP_LOOKUP_BATCH`,
//! `BPF_MAP_DELETE_BATCH`, kernel 5.6+), which aya does not offer. Read one key at a time, a
//! counter drain costs three syscalls a key: with 6,000 new series, a third of the agent's time
//! (profiled, issue 58). Batched, a few syscalls a drain.

use std::{
    io,
    os::fd::{AsFd, AsRawFd as _},
};

use aya::Pod;

const BPF_MAP_LOOKUP_BATCH: libc::c_long = 24;
const BPF_MAP_DELETE_BATCH: libc::c_long = 27;

/// `bpf_attr`'s `batch` member (include/uapi/linux/bpf.h).
#[repr(C)]
#[derive(Default)]
struct BatchAttr {
    in_batch: u64,
    out_batch: u64,
    keys: u64,
    values: u64,
    count: u32,
    map_fd: u32,
    elem_flags: u64,
    flags: u64,
}

/// Entries asked for per lookup; a bucket larger than this (hash collisions) doubles it.
const FIRST_CHUNK: u32 = 256;

/// Every key of the per-CPU hash map `map` with its values, one per possible CPU (`cpus`); with
/// `cpus` 1, of a hash map whose values are a multiple of 8 bytes.
pub fn lookup_all<K: Pod, V: Pod>(map: impl AsFd, cpus: usize) -> io::Result<Vec<(K, Vec<V>)>> {
    let map_fd = map.as_fd().as_raw_fd() as u32;
    // The kernel lays each CPU's value out at an 8-byte stride.
    let stride = size_of::<V>().next_multiple_of(8);
    let mut chunk = FIRST_CHUNK;
    let mut entries = Vec::new();
    // The position of the next batch: a bucket index for a hash map (a u32; room for more).
    let (mut position, mut next) = ([0u8; 8], [0u8; 8]);
    let mut started = false;
    loop {
        let mut keys = vec![0u8; chunk as usize * size_of::<K>()];
        let mut values = vec![0u8; chunk as usize * cpus * stride];
        let mut attr = BatchAttr {
            in_batch: if started { position.as_ptr() as u64 } else { 0 },
            out_batch: next.as_mut_ptr() as u64,
            keys: keys.as_mut_ptr() as u64,
            values: values.as_mut_ptr() as u64,
            count: chunk,
            map_fd,
            ..BatchAttr::default()
        };
        let result = bpf(BPF_MAP_LOOKUP_BATCH, &mut attr);
        let done = match result {
            Ok(()) => false,
            // The last batch: `count` says how many it holds (maybe none).
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => true,
            // A bucket with more entries than `chunk`: ask again with room for it.
            Err(e) if e.raw_os_error() == Some(libc::ENOSPC) && chunk < u32::MAX / 2 => {
                chunk *= 2;
                continue;
            }
            Err(e) => return Err(e),
        };
        for i in 0..attr.count as usize {
            // SAFETY: the kernel wrote `count` keys and values; `K` and `V` are plain data
            // (`Pod`), read unaligned from their byte offsets.
            let key = unsafe { keys.as_ptr().add(i * size_of::<K>()).cast::<K>().read_unaligned() };
            let per_cpu = (0..cpus)
                .map(|cpu| unsafe {
                    values.as_ptr().add((i * cpus + cpu) * stride).cast::<V>().read_unaligned()
                })
                .collect();
            entries.push((key, per_cpu));
        }
        if done {
            return Ok(entries);
        }
        position = next;
        started = true;
    }
}

/// Deletes `keys` from `map`; how many it deleted before an error, with the error.
pub fn delete<K: Pod>(map: impl AsFd, keys: &[K]) -> Result<(), (usize, io::Error)> {
    if keys.is_empty() {
        return Ok(());
    }
    let mut attr = BatchAttr {
        keys: keys.as_ptr() as u64,
        count: keys.len() as u32,
        map_fd: map.as_fd().as_raw_fd() as u32,
        ..BatchAttr::default()
    };
    bpf(BPF_MAP_DELETE_BATCH, &mut attr).map_err(|e| (attr.count as usize, e))
}

fn bpf(command: libc::c_long, attr: &mut BatchAttr) -> io::Result<()> {
    // SAFETY: `attr` is a `bpf_attr` prefix the kernel reads and writes within its size; the
    // buffers it points to outlive the call and are as large as `count` says.
    let result = unsafe {
        libc::syscall(libc::SYS_bpf, command, attr as *mut BatchAttr, size_of::<BatchAttr>() as libc::c_uint)
    };
    if result < 0 { Err(io::Error::last_os_error()) } else { Ok(()) }
}
