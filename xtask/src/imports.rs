//! `cargo xtask imports`: the agent's module graph, read from its source with `syn` — which file
//! names which (a `use`, or a path in code; test code left out) — any circle in it, and any edge
//! between top-level modules that docs/architecture.md's module table does not allow. The table
//! is the rule; a unit test below keeps the source to it.

use std::{
    collections::{BTreeMap, BTreeSet},
    path::{Path, PathBuf},
};

use anyhow::Context as _;
use syn::visit::Visit;

/// A module as a path from the crate root: `["probes", "tcp_reset"]`; the root is `[]`.
type Module = Vec<String>;

/// Which modules each module names, with one path that makes each edge (for the report).
pub struct Graph {
    edges: BTreeMap<Module, BTreeMap<Module, String>>,
}

pub fn run() -> anyhow::Result<()> {
    let graph = Graph::read(&crate_src())?;
    let allowed = Allowed::read(&architecture_doc())?;
    let refused = allowed.refused(&graph);
    for edge in &refused {
        println!("not allowed by docs/architecture.md: {edge}");
    }
    let cycles = graph.cycles();
    if cycles.is_empty() && refused.is_empty() {
        for (layer, modules) in graph.layers().iter().enumerate() {
            let names: Vec<String> = modules.iter().map(name).collect();
            println!("{layer:>2}  {}", names.join("  "));
        }
        println!("imports: {} modules, no circle (layer 0 imports nothing of the agent)", graph.edges.len());
        return Ok(());
    }
    for cycle in &cycles {
        println!("circle of {} modules:", cycle.len());
        for from in cycle {
            for (to, why) in &graph.edges[from] {
                if cycle.contains(to) {
                    println!("  {} -> {}  ({why})", name(from), name(to));
                }
            }
        }
    }
    anyhow::bail!(
        "{} import circle(s) and {} edge(s) the architecture table does not allow among the agent's modules",
        cycles.len(),
        refused.len()
    )
}

fn crate_src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../agent/src")
}

fn architecture_doc() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/architecture.md")
}

/// docs/architecture.md's module table: each row's top-level modules (`daemon.rs`, `api/`) and
/// what they may import — a list (`state::lock`, `attribution (its ErrorChain)`: the module is
/// the first word), `everything below`, `` `x` and below``, or `—` (nothing). Rows go from the
/// top of the graph down.
pub struct Allowed {
    rows: Vec<(Vec<String>, BTreeSet<String>)>,
}

impl Allowed {
    pub fn read(doc: &Path) -> anyhow::Result<Self> {
        let text = std::fs::read_to_string(doc).with_context(|| doc.display().to_string())?;
        Self::parse(&text)
    }

    fn parse(text: &str) -> anyhow::Result<Self> {
        let table: Vec<Vec<&str>> = text
            .lines()
            .skip_while(|l| !l.starts_with("| module | holds | imports |"))
            .skip(2)
            .take_while(|l| l.starts_with('|'))
            .map(|l| l.trim_matches('|').split(" | ").map(str::trim).collect())
            .collect();
        anyhow::ensure!(!table.is_empty(), "no `| module | holds | imports |` table");
        let modules_of = |cell: &str| -> Vec<String> {
            cell.split('`')
                .skip(1)
                .step_by(2)
                .map(|m| m.trim_end_matches('/').trim_end_matches(".rs").to_string())
                .collect()
        };
        let rows: Vec<Vec<String>> = table.iter().map(|row| modules_of(row[0])).collect();
        let mut out = Vec::new();
        for (i, row) in table.iter().enumerate() {
            let cell = *row.last().expect("a row");
            let below = |from: usize| rows[from..].iter().flatten().cloned().collect::<BTreeSet<_>>();
            let allowed = if cell == "everything below" {
                below(i + 1)
            } else if let Some(first) = cell.strip_suffix(" and below") {
                let first = first.trim_matches('`');
                let at = rows.iter().position(|r| r.iter().any(|m| m == first));
                below(at.with_context(|| format!("{first:?} is in no row of the table"))?)
            } else if cell == "—" {
                BTreeSet::new()
            } else {
                cell.split(", ")
                    .map(|item| {
                        let word = item.trim_matches('`').split([' ', ':']).next().unwrap_or_default();
                        word.trim_matches('`').to_string()
                    })
                    .collect()
            };
            // The table itself points one way: nothing it lists is beside or above the row.
            let beside_or_above: BTreeSet<String> = rows[..=i].iter().flatten().cloned().collect();
            if let Some(up) = allowed.intersection(&beside_or_above).next() {
                anyhow::bail!("the module table's row {:?} imports {up:?}, beside or above it", rows[i]);
            }
            out.push((rows[i].clone(), allowed));
        }
        Ok(Self { rows: out })
    }

    /// Edges between top-level modules the table does not allow, and modules it does not list.
    pub fn refused(&self, graph: &Graph) -> Vec<String> {
        let allowed = |from: &str| self.rows.iter().find(|(modules, _)| modules.iter().any(|m| m == from));
        let mut refused = BTreeSet::new();
        for (from, targets) in &graph.edges {
            let Some(top) = from.first() else { continue };
            let Some((_, may)) = allowed(top) else {
                refused.insert(format!("{top} is in no row of the module table"));
                continue;
            };
            for (to, why) in targets {
                let Some(target) = to.first().filter(|t| *t != top) else { continue };
                if !may.contains(target) {
                    refused.insert(format!("{} -> {target} ({why})", name(from)));
                }
            }
        }
        refused.into_iter().collect()
    }
}

fn name(module: &Module) -> String {
    if module.is_empty() { "crate".into() } else { module.join("::") }
}

impl Graph {
    /// Reads the library crate rooted at `src/lib.rs`: every module file its `mod` declarations
    /// reach, test-only ones (`#[cfg(test)] mod tests;`) left out.
    pub fn read(src: &Path) -> anyhow::Result<Self> {
        let mut parsed: BTreeMap<Module, syn::File> = BTreeMap::new();
        let mut pending = vec![(Module::new(), src.join("lib.rs"), src.to_path_buf())];
        while let Some((module, file, dir)) = pending.pop() {
            let text = std::fs::read_to_string(&file).with_context(|| file.display().to_string())?;
            let ast = syn::parse_file(&text).with_context(|| format!("parse {}", file.display()))?;
            for child in ast.items.iter().filter_map(declared_module) {
                let mut path = module.clone();
                path.push(child.clone());
                let (flat, nested) = (dir.join(format!("{child}.rs")), dir.join(&child).join("mod.rs"));
                let file = if flat.exists() { flat } else { nested };
                pending.push((path, file, dir.join(&child)));
            }
            parsed.insert(module, ast);
        }
        let mut edges = BTreeMap::new();
        for (module, ast) in &parsed {
            let mut paths = Paths {
                current: module.clone(),
                children: ast.items.iter().filter_map(declared_module).collect(),
                aliases: BTreeMap::new(),
                found: Vec::new(),
            };
            paths.visit_file(ast);
            let mut out: BTreeMap<Module, String> = BTreeMap::new();
            for path in paths.found {
                // The longest prefix that is a module is the module it names.
                let target =
                    (0..=path.len()).rev().map(|n| path[..n].to_vec()).find(|p| parsed.contains_key(p));
                if let Some(target) = target.filter(|t| t != module) {
                    out.entry(target).or_insert_with(|| path.join("::"));
                }
            }
            edges.insert(module.clone(), out);
        }
        Ok(Self { edges })
    }

    /// Strongly connected components of more than one module (Tarjan).
    pub fn cycles(&self) -> Vec<Vec<Module>> {
        struct State<'a> {
            graph: &'a Graph,
            next: usize,
            index: BTreeMap<&'a Module, usize>,
            low: BTreeMap<&'a Module, usize>,
            stack: Vec<&'a Module>,
            on_stack: BTreeSet<&'a Module>,
            found: Vec<Vec<Module>>,
        }
        fn visit<'a>(s: &mut State<'a>, m: &'a Module) {
            s.index.insert(m, s.next);
            s.low.insert(m, s.next);
            s.next += 1;
            s.stack.push(m);
            s.on_stack.insert(m);
            for to in s.graph.edges[m].keys() {
                if !s.index.contains_key(to) {
                    visit(s, to);
                    let low = s.low[m].min(s.low[to]);
                    s.low.insert(m, low);
                } else if s.on_stack.contains(to) {
                    let low = s.low[m].min(s.index[to]);
                    s.low.insert(m, low);
                }
            }
            if s.low[m] == s.index[m] {
                let mut component = Vec::new();
                while let Some(top) = s.stack.pop() {
                    s.on_stack.remove(top);
                    component.push(top.clone());
                    if top == m {
                        break;
                    }
                }
                if component.len() > 1 {
                    component.sort();
                    s.found.push(component);
                }
            }
        }
        let mut s = State {
            graph: self,
            next: 0,
            index: BTreeMap::new(),
            low: BTreeMap::new(),
            stack: Vec::new(),
            on_stack: BTreeSet::new(),
            found: Vec::new(),
        };
        for m in self.edges.keys() {
            if !s.index.contains_key(m) {
                visit(&mut s, m);
            }
        }
        s.found
    }

    /// Modules by depth: layer 0 names no other module, layer n only modules below it.
    /// Only meaningful without cycles.
    pub fn layers(&self) -> Vec<Vec<Module>> {
        let mut depth: BTreeMap<&Module, usize> = BTreeMap::new();
        fn depth_of<'a>(g: &'a Graph, m: &'a Module, depth: &mut BTreeMap<&'a Module, usize>) -> usize {
            if let Some(&d) = depth.get(m) {
                return d;
            }
            depth.insert(m, 0);
            let d = g.edges[m].keys().map(|to| depth_of(g, to, depth) + 1).max().unwrap_or(0);
            depth.insert(m, d);
            d
        }
        for m in self.edges.keys() {
            depth_of(self, m, &mut depth);
        }
        let mut layers: Vec<Vec<Module>> = Vec::new();
        for (m, d) in depth {
            if layers.len() <= d {
                layers.resize(d + 1, Vec::new());
            }
            layers[d].push(m.clone());
        }
        layers
    }
}

/// `mod x;` (a file of its own) declared by this file, not test-only.
fn declared_module(item: &syn::Item) -> Option<String> {
    match item {
        syn::Item::Mod(m) if m.content.is_none() && !is_test_only(&m.attrs) => Some(m.ident.to_string()),
        _ => None,
    }
}

/// `#[cfg(test)]` exactly (not `cfg(not(test))`).
fn is_test_only(attrs: &[syn::Attribute]) -> bool {
    attrs.iter().any(|a| a.path().is_ident("cfg") && a.parse_args::<syn::Ident>().is_ok_and(|i| i == "test"))
}

/// Every path of the file as a module path from the crate root (`crate::`, `super::`, `self::`
/// and paths through a child module resolved), test code left out.
struct Paths {
    current: Module,
    children: BTreeSet<String>,
    /// Names brought in by `use` (`use crate::{api, probes::plan}` -> `api`, `plan`): a path
    /// that starts with one goes through what it names.
    aliases: BTreeMap<String, Module>,
    found: Vec<Module>,
}

impl Paths {
    fn resolve(&self, segments: &[String]) -> Option<Module> {
        let (first, rest) = segments.split_first()?;
        let mut base = match first.as_str() {
            "crate" => Vec::new(),
            "self" => self.current.clone(),
            "super" => {
                let mut base = self.current.clone();
                base.pop();
                let mut rest = rest;
                while rest.first().is_some_and(|s| s == "super") {
                    base.pop();
                    rest = &rest[1..];
                }
                base.extend(rest.iter().cloned());
                return Some(base);
            }
            child if self.children.contains(child) => {
                let mut base = self.current.clone();
                base.push(child.to_string());
                base
            }
            alias if self.aliases.contains_key(alias) => self.aliases[alias].clone(),
            _ => return None,
        };
        base.extend(rest.iter().cloned());
        Some(base)
    }

    fn use_tree(&mut self, prefix: &mut Vec<String>, tree: &syn::UseTree) {
        match tree {
            syn::UseTree::Path(p) => {
                prefix.push(p.ident.to_string());
                self.use_tree(prefix, &p.tree);
                prefix.pop();
            }
            syn::UseTree::Name(n) => self.found_use(prefix, Some(n.ident.to_string()), None),
            syn::UseTree::Rename(r) => {
                self.found_use(prefix, Some(r.ident.to_string()), Some(r.rename.to_string()))
            }
            syn::UseTree::Glob(_) => self.found_use(prefix, None, None),
            syn::UseTree::Group(g) => {
                for tree in &g.items {
                    self.use_tree(prefix, tree);
                }
            }
        }
    }

    fn found_use(&mut self, prefix: &[String], last: Option<String>, rename: Option<String>) {
        let mut segments = prefix.to_vec();
        // `use x::{self}` names x itself.
        let name = match last {
            Some(last) if last == "self" => prefix.last().cloned(),
            Some(last) => {
                segments.push(last.clone());
                Some(last)
            }
            None => None,
        };
        if let Some(path) = self.resolve(&segments) {
            if let Some(name) = rename.or(name) {
                self.aliases.insert(name, path.clone());
            }
            self.found.push(path);
        }
    }
}

impl<'ast> Visit<'ast> for Paths {
    fn visit_item_use(&mut self, item: &'ast syn::ItemUse) {
        if !is_test_only(&item.attrs) {
            self.use_tree(&mut Vec::new(), &item.tree);
        }
    }

    fn visit_item_mod(&mut self, item: &'ast syn::ItemMod) {
        if !is_test_only(&item.attrs) {
            syn::visit::visit_item_mod(self, item);
        }
    }

    fn visit_item_fn(&mut self, item: &'ast syn::ItemFn) {
        if !is_test_only(&item.attrs) {
            syn::visit::visit_item_fn(self, item);
        }
    }

    fn visit_impl_item_fn(&mut self, item: &'ast syn::ImplItemFn) {
        if !is_test_only(&item.attrs) {
            syn::visit::visit_impl_item_fn(self, item);
        }
    }

    /// `pub(super)` and `pub(in path)` say who may use an item, not what it uses.
    fn visit_visibility(&mut self, _: &'ast syn::Visibility) {}

    /// A trait's test-only method (its samples for a test) is test code too.
    fn visit_trait_item_fn(&mut self, item: &'ast syn::TraitItemFn) {
        if !is_test_only(&item.attrs) {
            syn::visit::visit_trait_item_fn(self, item);
        }
    }

    fn visit_path(&mut self, path: &'ast syn::Path) {
        let segments: Vec<String> = path.segments.iter().map(|s| s.ident.to_string()).collect();
        if let Some(module) = self.resolve(&segments) {
            self.found.push(module);
        }
        syn::visit::visit_path(self, path);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn graph(files: &[(&str, &str)]) -> Graph {
        // One directory a call: the tests run side by side.
        static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("kstall-imports-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        for (path, text) in files {
            let path = dir.join(path);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, text).unwrap();
        }
        let graph = Graph::read(&dir).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        graph
    }

    #[test]
    fn uses_paths_and_parents_are_edges_tests_are_not() {
        let g = graph(&[
            ("lib.rs", "pub mod a; pub mod b; pub mod c;"),
            ("a/mod.rs", "pub mod x; pub fn f() { x::g() } pub(in crate::a) struct Y;"),
            (
                "a/x.rs",
                "use super::super::b::{self, T}; pub fn g() {} #[cfg(not(test))] fn h() { crate::c::k() } \
                 pub(super) struct Z;",
            ),
            ("b.rs", "use crate::{a, c as see}; pub struct T; fn h() { see::k(); a::x::g(); }"),
            (
                "c.rs",
                "pub fn k() {} #[cfg(test)] mod tests { use crate::a::x; } #[cfg(test)] mod more; \
                 pub trait S { #[cfg(test)] fn s() -> crate::b::T; }",
            ),
            ("c/more.rs", "use crate::b::T;"),
            ("unused.rs", "use crate::b::T;"),
        ]);
        let names = |m: &str| -> Vec<String> {
            let module: Module =
                if m.is_empty() { vec![] } else { m.split("::").map(String::from).collect() };
            g.edges[&module].keys().map(name).collect()
        };
        assert_eq!(names("a"), ["a::x"]);
        assert_eq!(names("a::x"), ["b", "c"], "cfg(not(test)) code is an edge");
        assert_eq!(names("b"), ["a", "a::x", "c"], "through what `use` named");
        assert!(names("c").is_empty(), "test code is not an edge");
        assert!(
            !g.edges.contains_key(&vec!["c".to_string(), "more".to_string()]),
            "a test-only file is no module"
        );
        let cycles: Vec<Vec<String>> = g.cycles().iter().map(|c| c.iter().map(name).collect()).collect();
        assert_eq!(cycles, [["a", "a::x", "b"]]);
    }

    #[test]
    fn a_circle_is_found() {
        let g = graph(&[
            ("lib.rs", "pub mod a; pub mod b;"),
            ("a.rs", "use crate::b::B; pub struct A;"),
            ("b.rs", "pub struct B(crate::a::A);"),
        ]);
        let cycles: Vec<Vec<String>> = g.cycles().iter().map(|c| c.iter().map(name).collect()).collect();
        assert_eq!(cycles, [["a", "b"]]);
    }

    #[test]
    fn the_agents_modules_import_in_one_direction() {
        let graph = Graph::read(&crate_src()).unwrap();
        let cycles: Vec<Vec<String>> = graph.cycles().iter().map(|c| c.iter().map(name).collect()).collect();
        assert!(cycles.is_empty(), "import circles (cargo xtask imports shows why): {cycles:?}");
        let refused = Allowed::read(&architecture_doc()).unwrap().refused(&graph);
        assert!(refused.is_empty(), "imports docs/architecture.md does not allow: {refused:#?}");
    }

    #[test]
    fn the_table_says_what_each_module_may_import() {
        let doc = "| module | holds | imports |\n|---|---|---|\n\
                   | `top.rs` | x | everything below |\n\
                   | `mid/` | x | `low` and below |\n\
                   | `side.rs` | x | low::item, leaf (its Error) |\n\
                   | `low.rs`, `leaf.rs` | x | — |\n";
        let allowed = Allowed::parse(doc).unwrap();
        let g = graph(&[
            ("lib.rs", "pub mod top; pub mod mid; pub mod side; pub mod low; pub mod leaf;"),
            ("top.rs", "use crate::{mid, side, low};"),
            ("mid.rs", "use crate::{low, leaf, side};"),
            ("side.rs", "use crate::{low::X, leaf::E};"),
            ("low.rs", "pub struct X; fn f() { crate::leaf::g() }"),
            ("leaf.rs", "pub struct E; pub fn g() {}"),
        ]);
        assert_eq!(
            allowed.refused(&g),
            ["low -> leaf (leaf::g)", "mid -> side (side)"],
            "a module below may not import one beside or above it"
        );
        let upward = "| module | holds | imports |\n|---|---|---|\n| `a.rs` | x | — |\n| `b.rs` | x | a |\n";
        let e = Allowed::parse(upward).err().expect("a table pointing up is refused");
        assert!(e.to_string().contains("imports \"a\", beside or above it"), "{e}");
    }
}
