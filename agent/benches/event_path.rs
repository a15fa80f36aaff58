//! The agent's per-event cost on one core: decode + symbolize + classify, per event kind, from the
//! raw ring-buffer bytes the kernel writes. Targets (issue 3): at least 200k hung-task events/s and
//! 1M reset / OOM events/s. Criterion prints `thrpt` in events per second.

use std::{hint::black_box, sync::Arc};

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use kstall::{
    events::Decoder,
    probes::{Clock, Decoding},
    symbols::{SymbolTable, Symbols},
};
use kstall_common::{
    EventHeader, hung_task, kind, oom,
    tcp_reset::{self, TcpResetEvent},
};

/// A kernel-sized symbol table (this machine's 6.18 has ~122k text symbols) with the functions
/// the benchmark stacks pass through at known addresses.
const BASE: u64 = 0xffff_ffff_8100_0000;
const SPACING: u64 = 0x400;
const NAMED: &[&str] = &[
    "folio_wait_bit_common",
    "folio_wait_writeback",
    "__filemap_fdatawait_range",
    "file_write_and_wait_range",
    "nfs_wb_all",
    "nfs4_file_flush",
    "filp_close",
    "do_exit",
    "do_group_exit",
    "get_signal",
    "arch_do_signal_or_restart",
    "syscall_exit_to_user_mode",
    "mark_oom_victim",
    "__oom_kill_process",
    "oom_kill_process",
    "out_of_memory",
    "mem_cgroup_out_of_memory",
    "try_charge_memcg",
    "charge_memcg",
    "__mem_cgroup_charge",
    "do_anonymous_page",
    "__handle_mm_fault",
    "handle_mm_fault",
    "exc_page_fault",
    "asm_exc_page_fault",
];

fn symbols() -> Symbols {
    let mut text = String::new();
    for i in 0..122_000u64 {
        let name = NAMED.get(i as usize).map(|s| s.to_string()).unwrap_or_else(|| format!("kernel_fn_{i}"));
        text.push_str(&format!("{:x} T {name}\n", BASE + i * SPACING));
    }
    Symbols::from_table(SymbolTable::parse(&text))
}

fn addr(name: &str, offset: u64) -> u64 {
    BASE + NAMED.iter().position(|n| *n == name).expect("named") as u64 * SPACING + offset
}

fn header(kind: u32, version: u32) -> EventHeader {
    let mut h = EventHeader::zeroed();
    h.kind = kind;
    h.version = version;
    h.pid = 4242;
    h.tgid = 4242;
    h.cgroup_id = 9876;
    h.netns_ino = 4026532177;
    h.comm[..4].copy_from_slice(b"java");
    h
}

fn bytes<T>(value: &T) -> Vec<u8> {
    // SAFETY: repr(C) integer structs.
    unsafe { std::slice::from_raw_parts((value as *const T).cast::<u8>(), size_of::<T>()) }.to_vec()
}

/// Incident 1's stuck flush: the seed stack, 12 frames deep.
fn hung_event(offset: u64) -> Vec<u8> {
    let frames = [
        "folio_wait_bit_common",
        "folio_wait_writeback",
        "__filemap_fdatawait_range",
        "file_write_and_wait_range",
        "nfs_wb_all",
        "nfs4_file_flush",
        "filp_close",
        "do_exit",
        "do_group_exit",
        "get_signal",
        "arch_do_signal_or_restart",
        "syscall_exit_to_user_mode",
    ];
    let mut ev = hung_task::HungTaskEvent {
        header: header(kind::HUNG_TASK, hung_task::VERSION),
        last_switch_jiffies: 1_000,
        now_jiffies: 1_000 + 250 * 600,
        blocker: 0,
        blocker_owner_pid: 0,
        flags: 0,
        stack_bytes: (frames.len() * 8) as i64,
        stack: [0; hung_task::STACK_DEPTH],
    };
    for (slot, f) in ev.stack.iter_mut().zip(frames) {
        *slot = addr(f, 0x10 + offset);
    }
    bytes(&ev)
}

fn oom_event() -> Vec<u8> {
    let frames = [
        "mark_oom_victim",
        "__oom_kill_process",
        "oom_kill_process",
        "out_of_memory",
        "mem_cgroup_out_of_memory",
        "try_charge_memcg",
        "charge_memcg",
        "__mem_cgroup_charge",
        "do_anonymous_page",
        "__handle_mm_fault",
        "handle_mm_fault",
        "exc_page_fault",
        "asm_exc_page_fault",
    ];
    let mut ev = oom::OomKillEvent {
        header: header(kind::OOM_KILL, oom::VERSION),
        invoker_pid: 4242,
        invoker_tgid: 4242,
        invoker_cgroup_id: 9876,
        invoker_comm: *b"java\0\0\0\0\0\0\0\0\0\0\0\0",
        anon_rss: 16384,
        file_rss: 1000,
        shmem_rss: 0,
        total_vm: 50000,
        oom_score_adj: 900,
        flags: oom::FLAG_HAS_RSS | oom::FLAG_HAS_SCORE_ADJ | oom::FLAG_HAS_MEMCG_PATH,
        oom_cgroup_id: 0,
        totalpages: 0,
        stack_bytes: (frames.len() * 8) as i64,
        invoker_stack: [0; oom::STACK_DEPTH],
        victim_memcg: [[0; oom::MEMCG_NAME_LEN]; oom::MEMCG_PATH_LEVELS],
    };
    // The kubelet's systemd layout, innermost first: the longest names the kernel gives.
    let container = format!("cri-containerd-{}.scope", "4f1a".repeat(16));
    let path = [
        container.as_str(),
        "kubepods-burstable-pod0c2a5b1e_7f3d_4c1a_9e8b_1234567890ab.slice",
        "kubepods-burstable.slice",
        "kubepods.slice",
    ];
    for (slot, name) in ev.victim_memcg.iter_mut().zip(path) {
        slot[..name.len()].copy_from_slice(name.as_bytes());
    }
    for (slot, f) in ev.invoker_stack.iter_mut().zip(frames) {
        *slot = addr(f, 0x20);
    }
    bytes(&ev)
}

fn reset_event() -> Vec<u8> {
    let mut ev = TcpResetEvent {
        header: header(kind::TCP_RESET, tcp_reset::VERSION),
        direction: tcp_reset::DIRECTION_SENT,
        hook: tcp_reset::HOOK_TCP_SEND_RESET,
        family: tcp_reset::FAMILY_INET,
        flags: tcp_reset::FLAG_HAS_CONNTRACK | tcp_reset::FLAG_HAS_REASON,
        state: 0,
        _pad: [0; 3],
        reason: 1,
        _pad2: 0,
        local_port: 15001,
        remote_port: 40000,
        orig_dst_port: 2049,
        redirect_port: 15001,
        local_addr: [0; 16],
        remote_addr: [0; 16],
        orig_dst_addr: [0; 16],
    };
    ev.local_addr[..4].copy_from_slice(&[10, 1, 2, 3]);
    ev.remote_addr[..4].copy_from_slice(&[10, 1, 2, 3]);
    ev.orig_dst_addr[..4].copy_from_slice(&[10, 9, 9, 9]);
    bytes(&ev)
}

fn event_path(c: &mut Criterion) {
    let decoder = Decoder::new(Decoding {
        symbols: Arc::new(symbols()),
        clock: Clock { hz: Some(250) },
        ..Default::default()
    });

    let mut group = c.benchmark_group("decode+symbolize+classify");
    group.throughput(Throughput::Elements(1));

    let reset = reset_event();
    group.bench_function("tcp_reset", |b| b.iter(|| black_box(decoder.decode(black_box(&reset)).unwrap())));

    let oom = oom_event();
    group.bench_function("oom_kill", |b| b.iter(|| black_box(decoder.decode(black_box(&oom)).unwrap())));

    let hung = hung_event(0);
    group.bench_function("hung_task (incident 1 stack)", |b| {
        b.iter(|| black_box(decoder.decode(black_box(&hung)).unwrap()))
    });

    // Stacks through random functions of the 122k-symbol table: every frame a cold search, and
    // every wait-class rule tried (they end as `other`).
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    let fresh: Vec<Vec<u8>> = (0..8192)
        .map(|_| {
            let mut ev = hung.clone();
            for slot in
                ev[std::mem::offset_of!(hung_task::HungTaskEvent, stack)..].chunks_exact_mut(8).take(12)
            {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                let addr = BASE + (state % (122_000 * SPACING));
                slot.copy_from_slice(&addr.to_ne_bytes());
            }
            ev
        })
        .collect();
    let mut next = 0;
    group.bench_function("hung_task (random stacks)", |b| {
        b.iter(|| {
            next = (next + 1) % fresh.len();
            black_box(decoder.decode(black_box(&fresh[next])).unwrap())
        })
    });
    group.finish();
}

criterion_group!(benches, event_path);
criterion_main!(benches);
