//! `/proc/kallsyms` (`addr type name [module]` lines) as the agent reloads it when modules come and
//! go, parsed by `symbols::SymbolTable::parse`, then stacks resolved against it. Never a panic;
//! every address resolves to a frame, and a text symbol's own address to itself at offset 0.
#![no_main]

use kstall::symbols::{SymbolTable, Symbols};
use libfuzzer_sys::fuzz_target;

/// Addresses looked up per input, at most (a kernel stack is at most 127 frames).
const MAX_ADDRS: usize = 256;

fuzz_target!(|data: &[u8]| {
    // The agent reads the file with `read_to_string`: not UTF-8 is a read error, never parsed.
    let Ok(text) = std::str::from_utf8(data) else { return };
    let table = SymbolTable::parse(text);
    assert!(table.len() <= text.lines().count());
    let symbols = Symbols::from_table(table);

    // Each line's address (a symbol start, when the line is one), and the bytes around it.
    let mut addrs: Vec<u64> = vec![0, 1, u64::MAX, 0xffff_ffff_8100_0000];
    let mut starts: Vec<u64> = Vec::new();
    for line in text.lines().take(MAX_ADDRS / 3) {
        let mut parts = line.split_whitespace();
        let Some(addr) = parts.next().and_then(|a| u64::from_str_radix(a, 16).ok()) else { continue };
        addrs.extend([addr, addr.wrapping_sub(1), addr.wrapping_add(1)]);
        let kind = parts.next();
        let name = parts.next();
        if addr != 0 && matches!(kind, Some("T" | "t" | "W" | "w")) && name.is_some_and(|n| n.len() <= 0xffff)
        {
            starts.push(addr);
        }
    }
    let stack = symbols.stack(&addrs);
    assert_eq!(stack.len(), addrs.len());
    assert_eq!(stack.names().count(), addrs.len());
    let texts: Vec<String> = stack.texts().collect();
    assert_eq!(texts.len(), addrs.len());
    if !symbols.is_empty() {
        for addr in starts {
            let frame = symbols.stack(&[addr]).texts().next().expect("one frame");
            assert!(frame.contains("+0x0"), "{addr:#x} is a symbol's start, resolved as {frame:?}");
        }
    }
    serde_json::to_vec(&stack).expect("a stack serializes");

    // As a probe's record gives a stack: the frames and the byte count bpf_get_stack returned.
    for bytes_written in [-14, 0, 8, (addrs.len() * 8) as i64, i64::MAX] {
        let mut stack = symbols.kernel_stack(&addrs, bytes_written);
        assert!(stack.len() <= addrs.len());
        stack.trim_innermost(|name, module| module == Some("bpf") || name.starts_with("bpf_trace_run"));
        let _ = format!("{stack:?}");
    }
});
