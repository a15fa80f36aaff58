//! What the kernel writes: a ring-buffer record, decoded by `kstall::events::Decoder` (the header,
//! then the probe's own decoder), and the same bytes read as a counter key and its value, decoded
//! by each probe's count decoder. Decoding must never panic on anything the kernel (or a corrupt
//! record) gives, and what decodes must serialize (the API and `kstall trace` send it as JSON).
#![no_main]

use std::sync::{Arc, LazyLock};

use kstall::{
    decode::read_record,
    events::Decoder,
    probes::{Clock, Decoding, nfs, oom, probe::EnumNames, tcp_reset},
    symbols::{SymbolTable, Symbols},
};
use kstall_common::{counter::Counter, nfs::NfsCountKey, oom::OomCountKey, tcp_reset::ResetCountKey};
use libfuzzer_sys::fuzz_target;

/// Real text symbols (this machine's /proc/kallsyms, and module lines as a node with NFS has
/// them), so stacks resolve to names and the wait class and OOM scope are read from them.
const KALLSYMS: &str = "\
ffffffff81000000 T _stext
ffffffff813669d0 T do_exit
ffffffff814cab70 T bpf_trace_run2
ffffffff815a3410 t folio_wait_bit_common
ffffffff815a7ca0 T filemap_read
ffffffff815b1010 T out_of_memory
ffffffff815b2a20 T folio_wait_writeback
ffffffff8163af50 t __alloc_pages_slowpath.constprop.0
ffffffff816aab00 t mem_cgroup_out_of_memory
ffffffff816ae9c0 t try_charge_memcg
ffffffff816d1610 T filp_close
ffffffff82259350 T schedule
ffffffff82259400 T io_schedule
ffffffff8225ba10 t __mutex_lock.constprop.0
ffffffff8225d530 t rwsem_down_write_slowpath
ffffffffc0a00000 t nfs_wb_all\t[nfs]
ffffffffc0a00300 t nfs4_file_flush\t[nfsv4]
ffffffffc0b00000 t rpc_wait_bit_killable\t[sunrpc]
";

/// As the agent decodes before it learnt anything of the kernel, and as it does once loaded (a
/// tick rate, symbols).
static DECODERS: LazyLock<[Decoder; 2]> = LazyLock::new(|| {
    let loaded = Decoding {
        clock: Clock { hz: Some(250) },
        symbols: Arc::new(Symbols::from_table(SymbolTable::parse(KALLSYMS))),
        ..Decoding::default()
    };
    [Decoder::default(), Decoder::new(loaded)]
});

fuzz_target!(|data: &[u8]| {
    for decoder in DECODERS.iter() {
        if let Ok(event) = decoder.decode(data) {
            serde_json::to_vec(&event).expect("a decoded event serializes");
        }
    }
    counts(data);
});

/// `data` as a counter key followed by its value (how `probes::counters` reads them back).
fn key_and_counter<K: aya::Pod>(data: &[u8]) -> Option<(K, Counter)> {
    let key = read_record::<K>(data, "counter key").ok()?;
    let counter = read_record::<Counter>(data.get(size_of::<K>()..)?, "counter").ok()?;
    Some((key, counter))
}

fn counts(data: &[u8]) {
    if let Some((key, counter)) = key_and_counter::<ResetCountKey>(data)
        && let Ok(count) = tcp_reset::decode_count(&key, &counter, &EnumNames::default())
    {
        let _ = count.redirected_port();
        serde_json::to_vec(&count).expect("a reset count serializes");
    }
    if let Some((key, counter)) = key_and_counter::<OomCountKey>(data) {
        let kills = oom::decode_count(&key, &counter);
        let ctx = DECODERS[1].decoding();
        for seen in [None, Some(oom::Scope::Memcg), Some(oom::Scope::Global)] {
            serde_json::to_vec(&kills.settle(seen, ctx)).expect("an OOM kill count serializes");
        }
    }
    if let Some((key, counter)) = key_and_counter::<NfsCountKey>(data)
        && let Ok(count) = nfs::decode_count(&key, &counter)
    {
        let _ = count.series.connect_failed();
        serde_json::to_vec(&count).expect("an NFS count serializes");
    }
}
