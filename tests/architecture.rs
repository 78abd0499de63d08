//! The shape of `host/src`: no import cycle between its modules, and no
//! top-level part importing one that imports it back (a lower layer
//! reaching up).
//!
//! Every file of `host/src` is parsed with `syn`; test code (items under
//! `#[cfg(test)]`) is left out. A module depends on another when it names
//! one of its items: through a `use` of its own, or a `crate::`, `super::`
//! or `self::` path in its code. A name reached through a re-export (`pub
//! use`) counts as the module that defines it, so `use crate::tune::Trial`
//! depends on `tune::trial`, not on `tune`; and a re-export is no
//! dependency of a face (a module of nothing but `mod` and `use` items),
//! while a module with code of its own depends on what it re-exports.
//!
//! A child module's use of its own parent (or grandparent) is not counted:
//! the parent is the concept and its children are its parts, which see the
//! parent's items by Rust's own rules (`compute::session` holds the
//! `Compute` it belongs to). What must never happen is two siblings, two
//! modules in different folders, or two top-level parts importing each
//! other.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use syn::visit::Visit;

/// A module's path below the crate root (`["tune", "runner"]`).
type ModPath = Vec<String>;

/// What one file brings into scope and refers to.
#[derive(Default)]
struct Module {
    /// Names brought into scope by `use` (private or public), with the
    /// absolute path each stands for; `*` entries are glob imports.
    scope: Vec<(String, ModPath)>,
    /// Absolute paths this module's own code depends on.
    refs: Vec<ModPath>,
}

fn source_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

/// Every `.rs` file under `dir`, with its module path.
fn files(dir: &Path, module: &ModPath, out: &mut Vec<(ModPath, PathBuf)>) {
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    entries.sort();
    for path in entries {
        let name = path.file_name().unwrap().to_str().unwrap().to_string();
        if path.is_dir() {
            let mut child = module.clone();
            child.push(name);
            files(&path, &child, out);
        } else if let Some(stem) = name.strip_suffix(".rs") {
            let mut this = module.clone();
            if !matches!(stem, "mod" | "lib" | "main") {
                this.push(stem.to_string());
            }
            if stem != "main" {
                out.push((this, path));
            }
        }
    }
}

fn is_test_only(attrs: &[syn::Attribute]) -> bool {
    attrs.iter().any(|attr| {
        attr.path().is_ident("cfg")
            && attr
                .parse_args::<syn::Meta>()
                .is_ok_and(|meta| meta.path().is_ident("test"))
            || attr.path().is_ident("test")
    })
}

/// Drops test-only items, in inline modules too.
fn strip_tests(items: &mut Vec<syn::Item>) {
    items.retain(|item| {
        let attrs = match item {
            syn::Item::Mod(m) => &m.attrs,
            syn::Item::Fn(f) => &f.attrs,
            syn::Item::Use(u) => &u.attrs,
            syn::Item::Impl(i) => &i.attrs,
            syn::Item::Struct(s) => &s.attrs,
            syn::Item::Enum(e) => &e.attrs,
            syn::Item::Const(c) => &c.attrs,
            syn::Item::Static(s) => &s.attrs,
            syn::Item::Trait(t) => &t.attrs,
            syn::Item::Type(t) => &t.attrs,
            syn::Item::Macro(m) => &m.attrs,
            _ => return true,
        };
        !is_test_only(attrs)
    });
    for item in items {
        if let syn::Item::Mod(syn::ItemMod {
            content: Some((_, inner)),
            ..
        }) = item
        {
            strip_tests(inner);
        }
    }
}

/// Makes a path that starts with `crate`, `super` or `self` absolute, as
/// seen from `module`; `None` for paths into other crates or local names.
fn absolute(module: &ModPath, children: &BTreeSet<String>, path: &[String]) -> Option<ModPath> {
    let (first, rest) = path.split_first()?;
    let mut base = match first.as_str() {
        "crate" => Vec::new(),
        "self" => module.clone(),
        "super" => {
            let mut base = module.clone();
            base.pop()?;
            let mut rest = rest;
            while rest.first().is_some_and(|s| s == "super") {
                base.pop()?;
                rest = &rest[1..];
            }
            base.extend(rest.iter().cloned());
            return Some(base);
        }
        // A child module of this one, named directly.
        name if children.contains(name) => {
            let mut base = module.clone();
            base.push(name.to_string());
            base
        }
        _ => return None,
    };
    base.extend(rest.iter().cloned());
    Some(base)
}

/// Collects a file's `use` trees and paths.
struct Collector<'a> {
    module: &'a ModPath,
    children: &'a BTreeSet<String>,
    /// The module holds only `mod` and `use` items.
    face: bool,
    out: Module,
}

impl Collector<'_> {
    fn use_tree(&mut self, prefix: &mut Vec<String>, tree: &syn::UseTree, public: bool) {
        match tree {
            syn::UseTree::Path(p) => {
                prefix.push(p.ident.to_string());
                self.use_tree(prefix, &p.tree, public);
                prefix.pop();
            }
            syn::UseTree::Name(n) => {
                let name = n.ident.to_string();
                self.imported(prefix, &name, &name, public);
            }
            syn::UseTree::Rename(r) => {
                self.imported(prefix, &r.ident.to_string(), &r.rename.to_string(), public);
            }
            syn::UseTree::Glob(_) => self.imported(prefix, "*", "*", public),
            syn::UseTree::Group(g) => {
                for tree in &g.items {
                    self.use_tree(prefix, tree, public);
                }
            }
        }
    }

    fn imported(&mut self, prefix: &[String], item: &str, alias: &str, public: bool) {
        let mut path = prefix.to_vec();
        if item != "self" {
            path.push(item.to_string());
        }
        let alias = if item == "self" {
            prefix.last().cloned().unwrap_or_default()
        } else {
            alias.to_string()
        };
        let Some(target) = absolute(self.module, self.children, &path) else {
            return;
        };
        if alias == "*" {
            self.out.scope.push(("*".into(), target.clone()));
        } else {
            self.out.scope.push((alias, target.clone()));
        }
        if !public || !self.face {
            self.out.refs.push(target);
        }
    }
}

impl<'ast> Visit<'ast> for Collector<'_> {
    fn visit_item_use(&mut self, item: &'ast syn::ItemUse) {
        let public = !matches!(item.vis, syn::Visibility::Inherited);
        self.use_tree(&mut Vec::new(), &item.tree, public);
    }

    fn visit_path(&mut self, path: &'ast syn::Path) {
        let segments: Vec<String> = path.segments.iter().map(|s| s.ident.to_string()).collect();
        if segments.len() > 1
            && matches!(segments[0].as_str(), "crate" | "super" | "self")
            && let Some(target) = absolute(self.module, self.children, &segments)
        {
            self.out.refs.push(target);
        }
        syn::visit::visit_path(self, path);
    }
}

/// Every module of the crate, parsed.
fn modules() -> BTreeMap<ModPath, Module> {
    let mut list = Vec::new();
    files(&source_root(), &Vec::new(), &mut list);
    let known: BTreeSet<ModPath> = list.iter().map(|(m, _)| m.clone()).collect();
    let mut modules = BTreeMap::new();
    for (module, file) in list {
        let text = std::fs::read_to_string(&file).unwrap();
        let mut parsed =
            syn::parse_file(&text).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        strip_tests(&mut parsed.items);
        let children: BTreeSet<String> = known
            .iter()
            .filter(|m| m.len() == module.len() + 1 && m.starts_with(&module))
            .map(|m| m.last().unwrap().clone())
            .collect();
        let face = parsed.items.iter().all(|item| {
            matches!(
                item,
                syn::Item::Mod(_) | syn::Item::Use(_) | syn::Item::ExternCrate(_)
            )
        });
        let mut collector = Collector {
            module: &module,
            children: &children,
            face,
            out: Module::default(),
        };
        collector.visit_file(&parsed);
        let found = collector.out;
        modules.insert(module, found);
    }
    modules
}

/// The module that defines what `path` names, following re-exports.
fn defining_module(modules: &BTreeMap<ModPath, Module>, path: &ModPath) -> Option<ModPath> {
    let mut path = path.clone();
    for _ in 0..32 {
        let owner = (0..=path.len())
            .rev()
            .map(|n| path[..n].to_vec())
            .find(|prefix| modules.contains_key(prefix))?;
        let Some(name) = path.get(owner.len()) else {
            return Some(owner);
        };
        let scope = &modules[&owner].scope;
        let next = scope
            .iter()
            .find(|(alias, _)| alias == name)
            .map(|(_, target)| target.clone())
            .or_else(|| {
                // A glob import that reaches a module defining `name`.
                scope
                    .iter()
                    .filter(|(alias, _)| alias == "*")
                    .find_map(|(_, base)| {
                        let mut candidate = base.clone();
                        candidate.push(name.clone());
                        let found = defining_module(modules, &candidate)?;
                        (found != *base || modules.contains_key(&candidate)).then_some(candidate)
                    })
            });
        match next {
            Some(target) => {
                let mut rest = target;
                rest.extend(path[owner.len() + 1..].iter().cloned());
                path = rest;
            }
            None => return Some(owner),
        }
    }
    None
}

/// `from -> to` edges between modules; none to the module itself or its ancestors.
fn graph(modules: &BTreeMap<ModPath, Module>) -> BTreeMap<ModPath, BTreeSet<ModPath>> {
    let mut edges: BTreeMap<ModPath, BTreeSet<ModPath>> = BTreeMap::new();
    for (module, parsed) in modules {
        let entry = edges.entry(module.clone()).or_default();
        for path in &parsed.refs {
            if let Some(to) = defining_module(modules, path)
                && !module.starts_with(&to)
            {
                entry.insert(to);
            }
        }
    }
    edges
}

/// The strongly connected components with more than one member (Tarjan).
fn cycles<N: Ord + Clone>(edges: &BTreeMap<N, BTreeSet<N>>) -> Vec<Vec<N>> {
    struct State<N> {
        index: BTreeMap<N, usize>,
        low: BTreeMap<N, usize>,
        stack: Vec<N>,
        on_stack: BTreeSet<N>,
        found: Vec<Vec<N>>,
    }
    fn visit<N: Ord + Clone>(node: &N, edges: &BTreeMap<N, BTreeSet<N>>, s: &mut State<N>) {
        let at = s.index.len();
        s.index.insert(node.clone(), at);
        s.low.insert(node.clone(), at);
        s.stack.push(node.clone());
        s.on_stack.insert(node.clone());
        for next in edges.get(node).into_iter().flatten() {
            if !s.index.contains_key(next) {
                visit(next, edges, s);
                let low = s.low[node].min(s.low[next]);
                s.low.insert(node.clone(), low);
            } else if s.on_stack.contains(next) {
                let low = s.low[node].min(s.index[next]);
                s.low.insert(node.clone(), low);
            }
        }
        if s.low[node] == s.index[node] {
            let mut component = Vec::new();
            loop {
                let member = s.stack.pop().unwrap();
                s.on_stack.remove(&member);
                let done = member == *node;
                component.push(member);
                if done {
                    break;
                }
            }
            if component.len() > 1 {
                component.sort();
                s.found.push(component);
            }
        }
    }
    let mut state = State {
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        found: Vec::new(),
    };
    for node in edges.keys() {
        if !state.index.contains_key(node) {
            visit(node, edges, &mut state);
        }
    }
    state.found
}

fn name(module: &ModPath) -> String {
    if module.is_empty() {
        "crate".into()
    } else {
        module.join("::")
    }
}

/// Each cycle, with the edges that close it, for the failure message.
fn describe<N: Ord + Clone>(
    cycles: &[Vec<N>],
    edges: &BTreeMap<N, BTreeSet<N>>,
    show: impl Fn(&N) -> String,
) -> String {
    let mut text = String::new();
    for cycle in cycles {
        let members: BTreeSet<&N> = cycle.iter().collect();
        text.push_str("\n- cycle:");
        for from in cycle {
            for to in &edges[from] {
                if members.contains(to) {
                    text.push_str(&format!("\n    {} -> {}", show(from), show(to)));
                }
            }
        }
    }
    text
}

#[test]
fn no_module_imports_one_that_imports_it_back() {
    let modules = modules();
    assert!(modules.len() > 40, "found only {} modules", modules.len());
    let edges = graph(&modules);
    let found = cycles(&edges);
    assert!(
        found.is_empty(),
        "import cycles among host/src's modules:{}",
        describe(&found, &edges, name)
    );
}

#[test]
fn no_top_level_part_reaches_up_into_one_that_uses_it() {
    let edges = graph(&modules());
    // The crate root only declares and re-exports; everything else is a
    // part: a folder (`tune`, `sandbox`, ...) or a top-level file.
    let mut parts: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (from, targets) in &edges {
        let Some(part) = from.first() else { continue };
        let entry = parts.entry(part.clone()).or_default();
        for to in targets {
            if let Some(other) = to.first()
                && other != part
            {
                entry.insert(other.clone());
            }
        }
    }
    let found = cycles(&parts);
    assert!(
        found.is_empty(),
        "host/src's parts import each other both ways:{}",
        describe(&found, &parts, String::clone)
    );
}

#[test]
fn the_checker_sees_the_imports_it_must() {
    // A few known edges: if these vanish the parser, not the code, broke.
    let edges = graph(&modules());
    let path = |s: &str| -> ModPath { s.split("::").map(str::to_string).collect() };
    for (from, to) in [
        ("sandbox::instance", "sandbox::fault"),
        ("report::files", "tune::runner"),
        ("cli::run", "config"),
    ] {
        let targets = edges
            .iter()
            .find(|(m, _)| **m == path(from))
            .map(|(_, t)| t)
            .unwrap_or_else(|| panic!("no module {from}"));
        assert!(
            targets.iter().any(|t| t.starts_with(&path(to))),
            "{from} should import {to}; found {:?}",
            targets.iter().map(name).collect::<Vec<_>>()
        );
    }
}
