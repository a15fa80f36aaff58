//! Kernel stack symbolization from `/proc/kallsyms`, reloaded when the set of loaded modules
//! changes (module symbols move when modules come and go).
//!
//! A symbolized [`Stack`] holds symbol indices into the table it was resolved against, not text:
//! resolving is a search per frame and nothing else, classification reads the names in place, and
//! `name+0xoff [module]` strings are only built when a stack is shown or serialized.

use std::{
    collections::hash_map::DefaultHasher,
    fmt::Write as _,
    hash::{Hash as _, Hasher as _},
    sync::{Arc, RwLock},
};

use serde::{Serialize, Serializer, ser::SerializeSeq as _};

/// Sorted symbol table. A lookup first searches `index` (every `BLOCK`th start address: a few
/// KB, always in cache), then one block of `addrs` (a few cache lines): a whole-kernel table is
/// ~1 MB of addresses, and a plain binary search over it misses the cache at nearly every step.
#[derive(Debug, Default)]
pub struct SymbolTable {
    index: Vec<u64>,
    addrs: Vec<u64>,
    /// Per symbol, where its name is in `text` and which of `modules` it is in. One text for all
    /// names rather than one allocation each: a kernel has over 100,000 text symbols, and this
    /// table lives as long as the agent (4 MB of its resident size rather than 8).
    symbols: Vec<Symbol>,
    text: String,
    modules: Vec<Box<str>>,
}

#[derive(Debug, Clone, Copy)]
struct Symbol {
    name_start: u32,
    name_len: u16,
    /// Index into `modules`, `VMLINUX` for the kernel image.
    module: u16,
}

const VMLINUX: u16 = u16::MAX;
const BLOCK: usize = 64;

impl SymbolTable {
    /// Parses kallsyms text (`addr type name [module]`). Lines that do not parse are skipped; all
    /// addresses 0 (kptr_restrict hides them) leave the table empty.
    pub fn parse(text: &str) -> Self {
        let mut modules: Vec<Box<str>> = Vec::new();
        let mut parsed: Vec<(u64, &str, u16)> = text
            .lines()
            .filter_map(|line| {
                let mut parts = line.split_whitespace();
                let addr = u64::from_str_radix(parts.next()?, 16).ok()?;
                let kind = parts.next()?;
                let name = parts.next()?;
                // Text symbols only: stacks point into code.
                if addr == 0 || !matches!(kind, "T" | "t" | "W" | "w") || name.len() > usize::from(u16::MAX) {
                    return None;
                }
                let module = match parts.next().map(|m| m.trim_matches(|c| c == '[' || c == ']')) {
                    None => VMLINUX,
                    Some(m) => match modules.iter().position(|known| &**known == m) {
                        Some(i) => i as u16,
                        None if modules.len() < usize::from(VMLINUX) => {
                            modules.push(m.into());
                            (modules.len() - 1) as u16
                        }
                        None => VMLINUX,
                    },
                };
                Some((addr, name, module))
            })
            .collect();
        parsed.sort_by_key(|s| s.0);
        let mut text = String::with_capacity(parsed.iter().map(|s| s.1.len()).sum());
        let mut addrs = Vec::with_capacity(parsed.len());
        let mut symbols = Vec::with_capacity(parsed.len());
        for (addr, name, module) in parsed {
            // kallsyms is a few MB, so offsets fit u32; a text past 4 GiB ends the table there.
            let Ok(name_start) = u32::try_from(text.len()) else { break };
            symbols.push(Symbol { name_start, name_len: name.len() as u16, module });
            addrs.push(addr);
            text.push_str(name);
        }
        let index = addrs.iter().step_by(BLOCK).copied().collect();
        Self { index, addrs, symbols, text, modules }
    }

    pub fn len(&self) -> usize {
        self.addrs.len()
    }

    pub fn is_empty(&self) -> bool {
        self.addrs.is_empty()
    }

    /// Index of the symbol containing `addr` (the last one starting at or below it).
    fn lookup(&self, addr: u64) -> Option<usize> {
        let block = self.index.partition_point(|&a| a <= addr).checked_sub(1)?;
        let start = block * BLOCK;
        let end = (start + BLOCK).min(self.addrs.len());
        Some(start + self.addrs[start..end].partition_point(|&a| a <= addr) - 1)
    }

    fn name(&self, symbol: u32) -> &str {
        let s = self.symbols[symbol as usize];
        let start = s.name_start as usize;
        &self.text[start..start + usize::from(s.name_len)]
    }

    fn module(&self, symbol: u32) -> Option<&str> {
        let module = self.symbols[symbol as usize].module;
        (module != VMLINUX).then(|| &*self.modules[usize::from(module)])
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum StackFrame {
    Symbol { index: u32, offset: u32 },
    Unknown(u64),
}

/// A kernel stack, innermost frame first, resolved against one snapshot of the symbol table.
#[derive(Clone, Default)]
pub struct Stack {
    table: Arc<SymbolTable>,
    frames: Vec<StackFrame>,
}

impl Stack {
    pub fn len(&self) -> usize {
        self.frames.len()
    }

    pub fn is_empty(&self) -> bool {
        self.frames.is_empty()
    }

    /// Function names, innermost first (`""` for an address no symbol covers).
    pub fn names(&self) -> impl Iterator<Item = &str> + Clone {
        self.frames.iter().map(|f| match *f {
            StackFrame::Symbol { index, .. } => self.table.name(index),
            StackFrame::Unknown(_) => "",
        })
    }

    /// `name+0xoff [module]` per frame (hex for unknown addresses), innermost first.
    pub fn texts(&self) -> impl Iterator<Item = String> + '_ {
        self.frames.iter().map(|f| match *f {
            StackFrame::Symbol { index, offset } => {
                let mut text = format!("{}+{offset:#x}", self.table.name(index));
                if let Some(m) = self.table.module(index) {
                    let _ = write!(text, " [{m}]");
                }
                text
            }
            StackFrame::Unknown(addr) => format!("{addr:#x}"),
        })
    }

    /// A stack of these functions (innermost first), for tests.
    #[cfg(test)]
    pub fn from_names(names: &[&str]) -> Stack {
        let text: String = names
            .iter()
            .enumerate()
            .map(|(i, n)| format!("{:x} T {n}\n", 0xffff_ffff_8100_0000u64 + i as u64 * 0x100))
            .collect();
        let addrs: Vec<u64> = (0..names.len()).map(|i| 0xffff_ffff_8100_0010 + i as u64 * 0x100).collect();
        Symbols::from_table(SymbolTable::parse(&text)).stack(&addrs)
    }

    /// Drops innermost frames while `pred(name, module)` holds (e.g. the probe's own frames).
    pub fn trim_innermost(&mut self, pred: impl Fn(&str, Option<&str>) -> bool) {
        let keep_from = self
            .frames
            .iter()
            .position(|f| match *f {
                StackFrame::Symbol { index, .. } => !pred(self.table.name(index), self.table.module(index)),
                StackFrame::Unknown(_) => true,
            })
            .unwrap_or(self.frames.len());
        self.frames.drain(..keep_from);
    }

    /// Drops the innermost frames up to and including the first for which `pred(name)` holds;
    /// leaves the stack whole when none does.
    pub fn trim_through(&mut self, pred: impl Fn(&str) -> bool) {
        let found = self.frames.iter().position(|f| match *f {
            StackFrame::Symbol { index, .. } => pred(self.table.name(index)),
            StackFrame::Unknown(_) => false,
        });
        if let Some(i) = found {
            self.frames.drain(..=i);
        }
    }
}

impl PartialEq for Stack {
    fn eq(&self, other: &Self) -> bool {
        self.texts().eq(other.texts())
    }
}

impl std::fmt::Debug for Stack {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.texts()).finish()
    }
}

impl Serialize for Stack {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut seq = serializer.serialize_seq(Some(self.len()))?;
        for text in self.texts() {
            seq.serialize_element(&text)?;
        }
        seq.end()
    }
}

/// The live table plus what it was built from, so a change of modules triggers a reload.
#[derive(Default)]
pub struct Symbols {
    table: RwLock<Arc<SymbolTable>>,
    modules_hash: RwLock<u64>,
}

impl Symbols {
    pub fn from_table(table: SymbolTable) -> Self {
        Self { table: RwLock::new(Arc::new(table)), ..Self::default() }
    }

    /// Reloads `/proc/kallsyms` when `/proc/modules` changed since the last load (or on first
    /// use). Returns whether it reloaded.
    pub fn refresh(&self) -> std::io::Result<bool> {
        // A kernel built without module support has no /proc/modules: nothing ever moves.
        let modules = match std::fs::read_to_string("/proc/modules") {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
            other => other?,
        };
        let mut hasher = DefaultHasher::new();
        // Names and load addresses; sizes and refcounts change without moving symbols.
        for line in modules.lines() {
            let fields: Vec<&str> = line.split_whitespace().collect();
            (fields.first(), fields.get(5)).hash(&mut hasher);
        }
        let hash = hasher.finish();
        if *self.modules_hash.read().expect("lock") == hash && !self.is_empty() {
            return Ok(false);
        }
        let table = SymbolTable::parse(&std::fs::read_to_string("/proc/kallsyms")?);
        *self.table.write().expect("lock") = Arc::new(table);
        *self.modules_hash.write().expect("lock") = hash;
        Ok(true)
    }

    /// Symbols in the current table (0 until loaded, or when kptr_restrict hides addresses).
    pub fn len(&self) -> usize {
        self.table.read().expect("lock").len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Resolves a stack the kernel wrote into `raw` with `bpf_get_stack`/`bpf_get_task_stack`,
    /// which returned `bytes_written` (negative: an error, no frames).
    pub fn kernel_stack(&self, raw: &[u64], bytes_written: i64) -> Stack {
        let frames = usize::try_from(bytes_written).map_or(0, |b| (b / 8).min(raw.len()));
        self.stack(&raw[..frames])
    }

    /// Resolves `addrs` (innermost first) against the current table.
    pub fn stack(&self, addrs: &[u64]) -> Stack {
        let table = self.table.read().expect("lock").clone();
        let frames = addrs
            .iter()
            .map(|&addr| match table.lookup(addr) {
                Some(index) => match u32::try_from(addr - table.addrs[index]) {
                    Ok(offset) => StackFrame::Symbol { index: index as u32, offset },
                    Err(_) => StackFrame::Unknown(addr),
                },
                None => StackFrame::Unknown(addr),
            })
            .collect();
        Stack { table, frames }
    }
}

/// How often kallsyms is looked at for modules that came or went.
const REFRESH_INTERVAL: std::time::Duration = std::time::Duration::from_secs(30);

/// Keeps kernel symbols current once [`refresh`] loaded them: reloaded when modules come or go.
pub async fn keep_current(symbols: Arc<Symbols>, stop: tokio_util::sync::CancellationToken) {
    let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + REFRESH_INTERVAL, REFRESH_INTERVAL);
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tick.tick() => {}
        }
        refresh(symbols.clone()).await;
    }
}

/// Loads kernel symbols, or reloads them if modules changed, on the blocking pool. At start the
/// agent awaits it before it decodes an event: a stack read without symbols says nothing (an OOM
/// kill's scope would be `unknown`).
pub async fn refresh(symbols: Arc<Symbols>) {
    match tokio::task::spawn_blocking(move || symbols.refresh().map(|reloaded| (reloaded, symbols.len())))
        .await
    {
        Ok(Ok((true, 0))) => {
            tracing::warn!(
                "/proc/kallsyms shows no addresses (kernel.kptr_restrict, or no CAP_SYSLOG): stacks stay unsymbolized"
            )
        }
        Ok(Ok((true, n))) => tracing::info!(symbols = n, "loaded kernel symbols"),
        Ok(Ok((false, _))) => {}
        Ok(Err(e)) => tracing::warn!(error = %e, "cannot read kernel symbols"),
        Err(e) => tracing::warn!(error = %e, "symbol refresh task failed"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAMPLE: &str = "\
ffffffff81000000 T _stext
ffffffff81100000 T folio_wait_bit_common
ffffffff81100400 T folio_wait_writeback
ffffffff81100500 D some_data
ffffffffc0a00000 t nfs_wb_all\t[nfs]
ffffffffc0a00300 t nfs4_file_flush\t[nfsv4]
garbage line
0000000000000000 T hidden
";

    fn texts(stack: &Stack) -> Vec<String> {
        stack.texts().collect()
    }

    #[test]
    fn resolves_to_the_enclosing_symbol_with_offset_and_module() {
        let symbols = Symbols::from_table(SymbolTable::parse(SAMPLE));
        assert_eq!(symbols.len(), 5, "data symbols, garbage and zero addresses are skipped");
        let stack = symbols.stack(&[0xffffffff81100412, 0xffffffffc0a00310, 0xffffffff81100000, 0x1000]);
        assert_eq!(
            texts(&stack),
            [
                "folio_wait_writeback+0x12",
                "nfs4_file_flush+0x10 [nfsv4]",
                "folio_wait_bit_common+0x0",
                "0x1000"
            ]
        );
        assert_eq!(
            stack.names().collect::<Vec<_>>(),
            ["folio_wait_writeback", "nfs4_file_flush", "folio_wait_bit_common", ""]
        );
        assert_eq!(serde_json::to_value(&stack).unwrap()[1], "nfs4_file_flush+0x10 [nfsv4]");
    }

    #[test]
    fn two_level_search_matches_a_plain_one() {
        let text: String =
            (0..1000u64).map(|i| format!("{:x} T f{i}\n", 0x1000 + i * 0x40 + (i % 7))).collect();
        let table = SymbolTable::parse(&text);
        for addr in (0x0f00..0x1000 + 1000 * 0x40 + 0x100).step_by(3) {
            let plain = table.addrs.partition_point(|&a| a <= addr).checked_sub(1);
            assert_eq!(table.lookup(addr), plain, "{addr:#x}");
        }
    }

    #[test]
    fn a_stack_keeps_the_table_it_was_resolved_against() {
        let symbols = Symbols::from_table(SymbolTable::parse(SAMPLE));
        let stack = symbols.stack(&[0xffffffff81100412]);
        *symbols.table.write().unwrap() = Arc::new(SymbolTable::default());
        assert_eq!(texts(&stack), ["folio_wait_writeback+0x12"]);
        assert_eq!(texts(&symbols.stack(&[0xffffffff81100412])), ["0xffffffff81100412"]);
    }

    #[test]
    fn trims_innermost_frames() {
        let symbols = Symbols::from_table(SymbolTable::parse(SAMPLE));
        let mut stack = symbols.stack(&[0xffffffffc0a00010, 0xffffffffc0a00310, 0xffffffff81100412]);
        stack.trim_innermost(|name, module| module == Some("nfs") || name.starts_with("nfs4"));
        assert_eq!(texts(&stack), ["folio_wait_writeback+0x12"]);
    }

    #[test]
    fn hidden_addresses_give_an_empty_table() {
        let hidden = "0000000000000000 T _stext\n0000000000000000 T folio_wait_writeback\n";
        assert_eq!(SymbolTable::parse(hidden).len(), 0);
    }
}
