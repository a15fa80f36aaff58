//! Kernel stack symbolization from `/proc/kallsyms`, reloaded when the set of loaded modules
//! changes (module symbols move when modules come and go).

use std::{
    collections::hash_map::DefaultHasher,
    hash::{Hash as _, Hasher as _},
    sync::RwLock,
};

/// One kernel symbol: start address, name, module (`None` for vmlinux).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Symbol {
    addr: u64,
    name: String,
    module: Option<String>,
}

/// A resolved frame: `name+0xoff [module]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame {
    pub name: String,
    pub offset: u64,
    pub module: Option<String>,
}

impl std::fmt::Display for Frame {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}+{:#x}", self.name, self.offset)?;
        if let Some(m) = &self.module {
            write!(f, " [{m}]")?;
        }
        Ok(())
    }
}

/// Sorted symbol table.
#[derive(Debug, Default)]
pub struct SymbolTable {
    symbols: Vec<Symbol>,
}

impl SymbolTable {
    /// Parses kallsyms text (`addr type name [module]`). Lines that do not parse are skipped; all
    /// addresses 0 (kptr_restrict hides them) leave the table empty.
    pub fn parse(text: &str) -> Self {
        let mut symbols: Vec<Symbol> = text
            .lines()
            .filter_map(|line| {
                let mut parts = line.split_whitespace();
                let addr = u64::from_str_radix(parts.next()?, 16).ok()?;
                let kind = parts.next()?;
                let name = parts.next()?;
                // Text symbols only: stacks point into code.
                if addr == 0 || !matches!(kind, "T" | "t" | "W" | "w") {
                    return None;
                }
                let module = parts.next().map(|m| m.trim_matches(|c| c == '[' || c == ']').to_string());
                Some(Symbol { addr, name: name.to_string(), module })
            })
            .collect();
        symbols.sort_by_key(|s| s.addr);
        Self { symbols }
    }

    pub fn len(&self) -> usize {
        self.symbols.len()
    }

    /// The symbol containing `addr` (the last one starting at or below it).
    pub fn resolve(&self, addr: u64) -> Option<Frame> {
        let idx = self.symbols.partition_point(|s| s.addr <= addr).checked_sub(1)?;
        let s = &self.symbols[idx];
        Some(Frame { name: s.name.clone(), offset: addr - s.addr, module: s.module.clone() })
    }
}

/// The live table plus what it was built from, so a change of modules triggers a reload.
pub struct Symbols {
    table: RwLock<SymbolTable>,
    modules_hash: RwLock<u64>,
}

impl Default for Symbols {
    fn default() -> Self {
        Self { table: RwLock::new(SymbolTable::default()), modules_hash: RwLock::new(0) }
    }
}

impl Symbols {
    #[cfg(test)]
    pub fn from_table(table: SymbolTable) -> Self {
        Self { table: RwLock::new(table), modules_hash: RwLock::new(0) }
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
        if *self.modules_hash.read().expect("lock") == hash && self.len() > 0 {
            return Ok(false);
        }
        let table = SymbolTable::parse(&std::fs::read_to_string("/proc/kallsyms")?);
        *self.table.write().expect("lock") = table;
        *self.modules_hash.write().expect("lock") = hash;
        Ok(true)
    }

    pub fn len(&self) -> usize {
        self.table.read().expect("lock").len()
    }

    pub fn resolve(&self, addr: u64) -> Option<Frame> {
        self.table.read().expect("lock").resolve(addr)
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

    #[test]
    fn resolves_to_the_enclosing_symbol_with_offset_and_module() {
        let table = SymbolTable::parse(SAMPLE);
        assert_eq!(table.len(), 5, "data symbols, garbage and zero addresses are skipped");
        let f = table.resolve(0xffffffff81100412).unwrap();
        assert_eq!((f.name.as_str(), f.offset, f.module.as_deref()), ("folio_wait_writeback", 0x12, None));
        let f = table.resolve(0xffffffffc0a00310).unwrap();
        assert_eq!(f.to_string(), "nfs4_file_flush+0x10 [nfsv4]");
        assert!(table.resolve(0x1000).is_none(), "below every symbol");
    }

    #[test]
    fn hidden_addresses_give_an_empty_table() {
        let hidden = "0000000000000000 T _stext\n0000000000000000 T folio_wait_writeback\n";
        assert_eq!(SymbolTable::parse(hidden).len(), 0);
    }
}
