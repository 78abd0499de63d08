//! Load-time rewrite of one core module inside a trainable component.
//!
//! Two changes, neither of which slows the guest's own code:
//! - every defined memory and mutable global is exported under a `__wtune_`
//!   name, so the component-level accessor can read and write it;
//! - when the module imports WASI's handle-producing functions (stdout,
//!   stderr, stdin, preopened directories) or the matching resource drops,
//!   calls to them go through small wrappers that record, in an extra
//!   one-page memory (the *handle ledger*), which handle index holds which
//!   kind of resource. The ledger is snapshotted like any other memory, so a
//!   restore knows exactly which handles to re-acquire and where.
//!
//! Modules that keep state a snapshot cannot carry (tables mutated at run
//! time, dropped segments, shared or 64-bit memories, reference-typed
//! mutable globals) are refused with the reason.

use std::collections::HashMap;

use wasm_encoder::reencode::{Reencode, RoundtripReencoder};
use wasmparser::{ExternalKind, Operator, Parser, Payload, TypeRef, ValType};

use super::refusal::SnapshotRefusal;

/// Export name of a module's `i`-th defined memory.
pub(crate) fn memory_export(i: usize) -> String {
    format!("__wtune_memory_{i}")
}

/// Export name of a module's `i`-th defined mutable global.
pub(crate) fn global_export(i: usize) -> String {
    format!("__wtune_global_{i}")
}

/// Export name of the handle ledger memory.
pub(crate) const LEDGER_EXPORT: &str = "__wtune_handles";

/// Handle indices the ledger can describe; a guest holding a higher index
/// gets a clear refusal at snapshot time.
pub const LEDGER_SLOTS: u32 = 16 * 1024 - 1;
/// Ledger byte offset of the overflow flag (slot 0 is never a valid handle).
pub const LEDGER_OVERFLOW: u32 = 0;

/// Ledger codes: what kind of resource a handle index holds.
pub mod ledger {
    /// Slot is free (or holds something the ledger does not track).
    pub const FREE: u32 = 0;
    /// `wasi:cli/stdout.get-stdout`'s stream.
    pub const STDOUT: u32 = 1;
    /// `wasi:cli/stderr.get-stderr`'s stream.
    pub const STDERR: u32 = 2;
    /// `wasi:cli/stdin.get-stdin`'s stream.
    pub const STDIN: u32 = 3;
    /// Base of preopened-directory codes: `PREOPEN + j` is the `j`-th entry
    /// of `wasi:filesystem/preopens.get-directories`.
    pub const PREOPEN: u32 = 0x100;
    /// Base of pollable codes: `POLL_OUTPUT + h` is a pollable from
    /// `subscribe` on the output stream at handle index `h` (libc caches one
    /// per stream it has blocked on).
    pub const POLL_OUTPUT: u32 = 0x1_0000;
}

/// The WASI imports a module's wrappers and the restore path use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum HandleImport {
    /// `get-stdout: func() -> own<output-stream>`
    GetStdout,
    /// `get-stderr: func() -> own<output-stream>`
    GetStderr,
    /// `get-stdin: func() -> own<input-stream>`
    GetStdin,
    /// `get-directories: func() -> list<tuple<own<descriptor>, string>>`
    GetDirectories,
    /// `[resource-drop]output-stream`
    DropOutputStream,
    /// `[resource-drop]input-stream`
    DropInputStream,
    /// `[resource-drop]descriptor`
    DropDescriptor,
    /// `[method]output-stream.subscribe: func(self: borrow<output-stream>) -> own<pollable>`
    SubscribeOutput,
    /// `[resource-drop]pollable`
    DropPollable,
}

impl HandleImport {
    fn recognise(module: &str, name: &str) -> Option<Self> {
        let (interface, version) = module.split_once('@')?;
        if !version.starts_with("0.2.") {
            return None;
        }
        Some(match (interface, name) {
            ("wasi:cli/stdout", "get-stdout") => HandleImport::GetStdout,
            ("wasi:cli/stderr", "get-stderr") => HandleImport::GetStderr,
            ("wasi:cli/stdin", "get-stdin") => HandleImport::GetStdin,
            ("wasi:filesystem/preopens", "get-directories") => HandleImport::GetDirectories,
            ("wasi:io/streams", "[resource-drop]output-stream") => HandleImport::DropOutputStream,
            ("wasi:io/streams", "[resource-drop]input-stream") => HandleImport::DropInputStream,
            ("wasi:filesystem/types", "[resource-drop]descriptor") => HandleImport::DropDescriptor,
            ("wasi:io/streams", "[method]output-stream.subscribe") => HandleImport::SubscribeOutput,
            ("wasi:io/poll", "[resource-drop]pollable") => HandleImport::DropPollable,
            _ => return None,
        })
    }

    /// The core signature the canonical ABI gives this import.
    pub(crate) fn signature(self) -> (&'static [ValType], &'static [ValType]) {
        match self {
            HandleImport::GetStdout | HandleImport::GetStderr | HandleImport::GetStdin => {
                (&[], &[ValType::I32])
            }
            HandleImport::SubscribeOutput => (&[ValType::I32], &[ValType::I32]),
            // The list comes back through a return pointer.
            HandleImport::GetDirectories
            | HandleImport::DropOutputStream
            | HandleImport::DropInputStream
            | HandleImport::DropDescriptor
            | HandleImport::DropPollable => (&[ValType::I32], &[]),
        }
    }
}

/// One core import, as `(module, name)`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImportName {
    pub module: String,
    pub name: String,
}

/// What the rewrite exposed in one module.
#[derive(Debug, Clone, Default)]
pub struct ModuleLayout {
    /// Defined memories: export name and minimum size in pages.
    pub memories: Vec<(String, u64)>,
    /// Defined mutable globals: export name and value type.
    pub globals: Vec<(String, ValType)>,
    /// Present when the module imports handle functions: the ledger's export
    /// name and the imports, by kind.
    pub ledger: Option<Ledger>,
}

/// The handle ledger of a module that imports WASI handle functions.
#[derive(Debug, Clone)]
pub struct Ledger {
    /// Export name of the ledger memory.
    pub export: String,
    /// The module's imports of each recognised kind.
    pub imports: Vec<(HandleImport, ImportName)>,
}

/// Rewrites `module` (a core module's bytes); see the module docs.
pub fn instrument(module: &[u8]) -> Result<(Vec<u8>, ModuleLayout), SnapshotRefusal> {
    let scan = scan(module)?;
    let mut layout = ModuleLayout::default();
    let mut exports = Vec::new();
    for (i, (_, min)) in scan.defined_memories.iter().enumerate() {
        let name = memory_export(i);
        exports.push((
            name.clone(),
            ExternalKind::Memory,
            scan.imported_memories + i as u32,
        ));
        layout.memories.push((name, *min));
    }
    for (i, (index, ty)) in scan.mutable_globals.iter().enumerate() {
        let name = global_export(i);
        exports.push((name.clone(), ExternalKind::Global, *index));
        layout.globals.push((name, *ty));
    }

    let mut wrappers = Vec::new();
    if !scan.handle_imports.is_empty() {
        if scan.defined_memories.len() != 1 || scan.imported_memories != 0 {
            return Err(SnapshotRefusal::new(
                "imports WASI handles into a core module that does not define exactly one memory",
            ));
        }
        let ledger_memory = 1;
        exports.push((LEDGER_EXPORT.into(), ExternalKind::Memory, ledger_memory));
        let mut imports = Vec::new();
        for (kind, (func, ty, name)) in &scan.handle_imports {
            wrappers.push(Wrapper {
                kind: *kind,
                import: *func,
                type_index: *ty,
                index: scan.func_count + wrappers.len() as u32,
                ledger_memory,
            });
            imports.push((*kind, name.clone()));
        }
        layout.ledger = Some(Ledger {
            export: LEDGER_EXPORT.into(),
            imports,
        });
    }

    let bytes = rewrite(module, &exports, &wrappers).map_err(|e| {
        SnapshotRefusal::new(format!("has a core module wtune cannot re-encode: {e:?}"))
    })?;
    Ok((bytes, layout))
}

/// Facts gathered in a first pass.
struct Scan {
    imported_funcs: u32,
    func_count: u32,
    imported_memories: u32,
    /// Minimum pages of each defined memory.
    defined_memories: Vec<(u32, u64)>,
    /// Global index and type of each defined mutable global.
    mutable_globals: Vec<(u32, ValType)>,
    /// Recognised imports: function index, type index, name.
    handle_imports: std::collections::BTreeMap<HandleImport, (u32, u32, ImportName)>,
    types: Vec<(Vec<ValType>, Vec<ValType>)>,
}

fn refuse_operator(op: &Operator) -> Option<&'static str> {
    Some(match op {
        Operator::TableSet { .. } => "table.set",
        Operator::TableGrow { .. } => "table.grow",
        Operator::TableFill { .. } => "table.fill",
        Operator::TableCopy { .. } => "table.copy",
        Operator::TableInit { .. } => "table.init",
        Operator::ElemDrop { .. } => "elem.drop",
        Operator::DataDrop { .. } => "data.drop",
        _ => return None,
    })
}

fn scan(module: &[u8]) -> Result<Scan, SnapshotRefusal> {
    let bad = |e: wasmparser::BinaryReaderError| {
        SnapshotRefusal::new(format!("has a core module that does not parse: {e}"))
    };
    let mut scan = Scan {
        imported_funcs: 0,
        func_count: 0,
        imported_memories: 0,
        defined_memories: Vec::new(),
        mutable_globals: Vec::new(),
        handle_imports: Default::default(),
        types: Vec::new(),
    };
    let mut imported_globals = 0;
    for payload in Parser::new(0).parse_all(module) {
        match payload.map_err(bad)? {
            Payload::TypeSection(reader) => {
                for ty in reader.into_iter_err_on_gc_types() {
                    let ty = ty.map_err(|e| {
                        SnapshotRefusal::new(format!(
                            "uses GC types, which snapshots cannot carry: {e}"
                        ))
                    })?;
                    scan.types
                        .push((ty.params().to_vec(), ty.results().to_vec()));
                }
            }
            Payload::ImportSection(reader) => {
                for import in reader.into_imports() {
                    let import = import.map_err(bad)?;
                    match import.ty {
                        TypeRef::Func(ty) | TypeRef::FuncExact(ty) => {
                            let index = scan.imported_funcs;
                            scan.imported_funcs += 1;
                            if let Some(kind) = HandleImport::recognise(import.module, import.name)
                            {
                                let expected = kind.signature();
                                let actual = scan.types.get(ty as usize);
                                if actual.map(|(p, r)| (p.as_slice(), r.as_slice()))
                                    != Some(expected)
                                {
                                    return Err(SnapshotRefusal::new(format!(
                                        "imports {}#{} with an unexpected core signature",
                                        import.module, import.name
                                    )));
                                }
                                scan.handle_imports.insert(
                                    kind,
                                    (
                                        index,
                                        ty,
                                        ImportName {
                                            module: import.module.into(),
                                            name: import.name.into(),
                                        },
                                    ),
                                );
                            }
                        }
                        TypeRef::Memory(_) => scan.imported_memories += 1,
                        TypeRef::Global(_) => imported_globals += 1,
                        TypeRef::Table(_) => {}
                        TypeRef::Tag(_) => {
                            return Err(SnapshotRefusal::new(
                                "uses exception tags, which snapshots cannot carry",
                            ));
                        }
                    }
                }
            }
            Payload::FunctionSection(reader) => {
                scan.func_count = scan.imported_funcs + reader.count();
            }
            Payload::MemorySection(reader) => {
                for memory in reader {
                    let memory = memory.map_err(bad)?;
                    if memory.shared {
                        return Err(SnapshotRefusal::new("uses a shared memory"));
                    }
                    if memory.memory64 {
                        return Err(SnapshotRefusal::new("uses a 64-bit memory"));
                    }
                    if memory.page_size_log2.is_some_and(|p| p != 16) {
                        return Err(SnapshotRefusal::new("uses custom page sizes"));
                    }
                    let index = scan.imported_memories + scan.defined_memories.len() as u32;
                    scan.defined_memories.push((index, memory.initial));
                }
            }
            Payload::GlobalSection(reader) => {
                for (i, global) in reader.into_iter().enumerate() {
                    let global = global.map_err(bad)?;
                    if !global.ty.mutable {
                        continue;
                    }
                    let ty = global.ty.content_type;
                    if !matches!(
                        ty,
                        ValType::I32 | ValType::I64 | ValType::F32 | ValType::F64
                    ) {
                        return Err(SnapshotRefusal::new(format!(
                            "has a mutable global of type {ty}, which snapshots cannot carry"
                        )));
                    }
                    scan.mutable_globals.push((imported_globals + i as u32, ty));
                }
            }
            Payload::TagSection(_) => {
                return Err(SnapshotRefusal::new(
                    "uses exception tags, which snapshots cannot carry",
                ));
            }
            Payload::CodeSectionEntry(body) => {
                let mut reader = body.get_operators_reader().map_err(bad)?;
                while !reader.eof() {
                    let op = reader.read().map_err(bad)?;
                    if let Some(name) = refuse_operator(&op) {
                        return Err(SnapshotRefusal::new(format!(
                            "changes instance state with `{name}` at run time, which a memory \
                             snapshot cannot carry"
                        )));
                    }
                }
            }
            _ => {}
        }
    }
    if scan.func_count == 0 {
        scan.func_count = scan.imported_funcs;
    }
    Ok(scan)
}

/// One generated wrapper around a recognised import.
struct Wrapper {
    kind: HandleImport,
    import: u32,
    type_index: u32,
    /// The wrapper's own function index.
    index: u32,
    ledger_memory: u32,
}

impl Wrapper {
    fn body(&self) -> wasm_encoder::Function {
        use wasm_encoder::{BlockType, Function, Instruction as I, MemArg, ValType as V};
        let ledger = |offset: u64| MemArg {
            offset,
            align: 2,
            memory_index: self.ledger_memory,
        };
        let abi = |offset: u64| MemArg {
            offset,
            align: 2,
            memory_index: 0,
        };
        // record(handle in local H, code on stack): ledger[4 * H] = code, or
        // the overflow flag when H is beyond the ledger.
        let record = |f: &mut Function, handle: u32, code: &[I<'static>]| {
            f.instruction(&I::LocalGet(handle));
            f.instruction(&I::I32Const(LEDGER_SLOTS as i32));
            f.instruction(&I::I32LeU);
            f.instruction(&I::If(BlockType::Empty));
            f.instruction(&I::LocalGet(handle));
            f.instruction(&I::I32Const(2));
            f.instruction(&I::I32Shl);
            for i in code {
                f.instruction(i);
            }
            f.instruction(&I::I32Store(ledger(0)));
            f.instruction(&I::Else);
            f.instruction(&I::I32Const(LEDGER_OVERFLOW as i32));
            f.instruction(&I::I32Const(1));
            f.instruction(&I::I32Store(ledger(0)));
            f.instruction(&I::End);
        };
        match self.kind {
            HandleImport::GetStdout | HandleImport::GetStderr | HandleImport::GetStdin => {
                let code = match self.kind {
                    HandleImport::GetStdout => ledger::STDOUT,
                    HandleImport::GetStderr => ledger::STDERR,
                    _ => ledger::STDIN,
                };
                // local 0: the new handle
                let mut f = Function::new([(1, V::I32)]);
                f.instruction(&I::Call(self.import));
                f.instruction(&I::LocalSet(0));
                record(&mut f, 0, &[I::I32Const(code as i32)]);
                f.instruction(&I::LocalGet(0));
                f.instruction(&I::End);
                f
            }
            HandleImport::GetDirectories => {
                // param 0: return pointer; locals: 1 list ptr, 2 len, 3 j, 4 handle
                let mut f = Function::new([(4, V::I32)]);
                f.instruction(&I::LocalGet(0));
                f.instruction(&I::Call(self.import));
                f.instruction(&I::LocalGet(0));
                f.instruction(&I::I32Load(abi(0)));
                f.instruction(&I::LocalSet(1));
                f.instruction(&I::LocalGet(0));
                f.instruction(&I::I32Load(abi(4)));
                f.instruction(&I::LocalSet(2));
                f.instruction(&I::Block(BlockType::Empty));
                f.instruction(&I::Loop(BlockType::Empty));
                f.instruction(&I::LocalGet(3));
                f.instruction(&I::LocalGet(2));
                f.instruction(&I::I32GeU);
                f.instruction(&I::BrIf(1));
                // Each element is (handle: i32, name ptr: i32, name len: i32).
                f.instruction(&I::LocalGet(1));
                f.instruction(&I::LocalGet(3));
                f.instruction(&I::I32Const(12));
                f.instruction(&I::I32Mul);
                f.instruction(&I::I32Add);
                f.instruction(&I::I32Load(abi(0)));
                f.instruction(&I::LocalSet(4));
                record(
                    &mut f,
                    4,
                    &[
                        I::I32Const(ledger::PREOPEN as i32),
                        I::LocalGet(3),
                        I::I32Add,
                    ],
                );
                f.instruction(&I::LocalGet(3));
                f.instruction(&I::I32Const(1));
                f.instruction(&I::I32Add);
                f.instruction(&I::LocalSet(3));
                f.instruction(&I::Br(0));
                f.instruction(&I::End);
                f.instruction(&I::End);
                f.instruction(&I::End);
                f
            }
            HandleImport::SubscribeOutput => {
                // param 0: the stream; local 1: the new pollable
                let mut f = Function::new([(1, V::I32)]);
                f.instruction(&I::LocalGet(0));
                f.instruction(&I::Call(self.import));
                f.instruction(&I::LocalSet(1));
                record(
                    &mut f,
                    1,
                    &[
                        I::I32Const(ledger::POLL_OUTPUT as i32),
                        I::LocalGet(0),
                        I::I32Add,
                    ],
                );
                f.instruction(&I::LocalGet(1));
                f.instruction(&I::End);
                f
            }
            HandleImport::DropOutputStream
            | HandleImport::DropInputStream
            | HandleImport::DropDescriptor
            | HandleImport::DropPollable => {
                let mut f = Function::new([]);
                f.instruction(&I::LocalGet(0));
                f.instruction(&I::Call(self.import));
                record(&mut f, 0, &[I::I32Const(ledger::FREE as i32)]);
                f.instruction(&I::End);
                f
            }
        }
    }
}

/// Re-encodes function references so that calls to wrapped imports reach
/// the wrappers instead.
struct Redirect {
    map: HashMap<u32, u32>,
}

impl Reencode for Redirect {
    type Error = std::convert::Infallible;

    fn function_index(
        &mut self,
        func: u32,
    ) -> Result<u32, wasm_encoder::reencode::Error<Self::Error>> {
        Ok(*self.map.get(&func).unwrap_or(&func))
    }
}

/// The ledger's own memory: one page, which holds every handle a guest may
/// keep.
const LEDGER_MEMORY: wasm_encoder::MemoryType = wasm_encoder::MemoryType {
    minimum: 1,
    maximum: Some(1),
    memory64: false,
    shared: false,
    page_size_log2: None,
};

/// A section's position in the module's canonical section order (0 for
/// custom sections, which may go anywhere).
fn canonical_order(id: u8) -> u8 {
    match id {
        1 => 1,   // type
        2 => 2,   // import
        3 => 3,   // function
        4 => 4,   // table
        5 => 5,   // memory
        13 => 6,  // tag
        6 => 7,   // global
        7 => 8,   // export
        8 => 9,   // start
        9 => 10,  // element
        12 => 11, // data count
        10 => 12, // code
        11 => 13, // data
        _ => 0,
    }
}

/// A core module being rewritten section by section: the output so far,
/// and which of the sections the rewrite adds to (functions, memory,
/// exports, code) it holds. A section the module lacks is added just
/// before the first section that must follow it.
struct Rewriter<'a> {
    out: wasm_encoder::Module,
    redirect: Redirect,
    exports: &'a [(String, ExternalKind, u32)],
    wrappers: &'a [Wrapper],
    needs_ledger: bool,
    memory_done: bool,
    exports_done: bool,
    functions_done: bool,
    code_done: bool,
}

impl<'a> Rewriter<'a> {
    fn new(exports: &'a [(String, ExternalKind, u32)], wrappers: &'a [Wrapper]) -> Self {
        let needs_ledger = !wrappers.is_empty();
        Self {
            out: wasm_encoder::Module::new(),
            redirect: Redirect {
                map: wrappers.iter().map(|w| (w.import, w.index)).collect(),
            },
            exports,
            wrappers,
            needs_ledger,
            memory_done: !needs_ledger,
            exports_done: false,
            functions_done: wrappers.is_empty(),
            code_done: wrappers.is_empty(),
        }
    }

    /// Adds the sections still missing that must come before a section at
    /// canonical position `before`.
    fn add_pending(&mut self, before: u8) -> Result<(), wasm_encoder::reencode::Error> {
        use wasm_encoder::SectionId;
        if !self.functions_done && before > canonical_order(SectionId::Function as u8) {
            let mut s = wasm_encoder::FunctionSection::new();
            for w in self.wrappers {
                s.function(w.type_index);
            }
            self.out.section(&s);
            self.functions_done = true;
        }
        if !self.memory_done && before > canonical_order(SectionId::Memory as u8) {
            let mut s = wasm_encoder::MemorySection::new();
            s.memory(LEDGER_MEMORY);
            self.out.section(&s);
            self.memory_done = true;
        }
        if !self.exports_done && before > canonical_order(SectionId::Export as u8) {
            let mut s = wasm_encoder::ExportSection::new();
            for (name, kind, index) in self.exports {
                s.export(name, RoundtripReencoder.export_kind(*kind)?, *index);
            }
            self.out.section(&s);
            self.exports_done = true;
        }
        if !self.code_done && before > canonical_order(SectionId::Code as u8) {
            let mut s = wasm_encoder::CodeSection::new();
            for w in self.wrappers {
                s.function(&w.body());
            }
            self.out.section(&s);
            self.code_done = true;
        }
        Ok(())
    }

    /// The code section, whole (`body`, read by `reader`): copied as it is
    /// without wrappers, else re-encoded with calls redirected and the
    /// wrappers' bodies appended.
    fn code_section(
        &mut self,
        body: &[u8],
        reader: wasmparser::CodeSectionReader<'_>,
    ) -> Result<(), Box<dyn std::error::Error>> {
        use wasm_encoder::SectionId;
        self.add_pending(canonical_order(SectionId::Code as u8))?;
        if self.wrappers.is_empty() {
            self.out.section(&wasm_encoder::RawSection {
                id: SectionId::Code as u8,
                data: body,
            });
        } else {
            let mut code = wasm_encoder::CodeSection::new();
            self.redirect.parse_code_section(&mut code, reader)?;
            for w in self.wrappers {
                code.function(&w.body());
            }
            self.out.section(&code);
        }
        self.code_done = true;
        Ok(())
    }

    /// Any other section (`id`, at `range` in `module`): re-encoded where
    /// it names functions the wrappers move or gains the rewrite's
    /// entries, else copied as it is.
    fn section(
        &mut self,
        payload: Payload<'_>,
        id: u8,
        module: &[u8],
        range: std::ops::Range<usize>,
    ) -> Result<(), Box<dyn std::error::Error>> {
        let wrapped = !self.wrappers.is_empty();
        self.add_pending(canonical_order(id))?;
        match payload {
            Payload::FunctionSection(reader) if wrapped => {
                let mut s = wasm_encoder::FunctionSection::new();
                self.redirect.parse_function_section(&mut s, reader)?;
                for w in self.wrappers {
                    s.function(w.type_index);
                }
                self.out.section(&s);
                self.functions_done = true;
            }
            Payload::MemorySection(reader) if self.needs_ledger => {
                let mut s = wasm_encoder::MemorySection::new();
                self.redirect.parse_memory_section(&mut s, reader)?;
                s.memory(LEDGER_MEMORY);
                self.out.section(&s);
                self.memory_done = true;
            }
            Payload::ExportSection(reader) => {
                let mut s = wasm_encoder::ExportSection::new();
                self.redirect.parse_export_section(&mut s, reader)?;
                for (name, kind, index) in self.exports {
                    s.export(name, RoundtripReencoder.export_kind(*kind)?, *index);
                }
                self.out.section(&s);
                self.exports_done = true;
            }
            Payload::ElementSection(reader) if wrapped => {
                let mut s = wasm_encoder::ElementSection::new();
                self.redirect.parse_element_section(&mut s, reader)?;
                self.out.section(&s);
            }
            Payload::StartSection { func, .. } => {
                self.out.section(&wasm_encoder::StartSection {
                    function_index: self.redirect.function_index(func)?,
                });
            }
            Payload::GlobalSection(reader) if wrapped => {
                // Constant expressions may hold `ref.func`.
                let mut s = wasm_encoder::GlobalSection::new();
                self.redirect.parse_global_section(&mut s, reader)?;
                self.out.section(&s);
            }
            _ => {
                self.out.section(&wasm_encoder::RawSection {
                    id,
                    data: module.get(range).ok_or("truncated section")?,
                });
            }
        }
        Ok(())
    }

    /// Adds what is still missing and returns the module.
    fn finish(mut self) -> Result<Vec<u8>, Box<dyn std::error::Error>> {
        self.add_pending(u8::MAX)?;
        Ok(self.out.finish())
    }
}

/// `module` with the `exports` added and, with `wrappers`, the ledger's
/// memory added and every use of a wrapped import redirected to its
/// wrapper, whose body is appended.
fn rewrite(
    module: &[u8],
    exports: &[(String, ExternalKind, u32)],
    wrappers: &[Wrapper],
) -> Result<Vec<u8>, Box<dyn std::error::Error>> {
    let mut rewriter = Rewriter::new(exports, wrappers);
    let mut parser = Parser::new(0);
    let mut rest = module;
    loop {
        let (payload, consumed) = match parser.parse(rest, true)? {
            wasmparser::Chunk::NeedMoreData(_) => return Err("truncated module".into()),
            wasmparser::Chunk::Parsed { payload, consumed } => (payload, consumed),
        };
        rest = &rest[consumed..];
        if let Payload::End(_) = payload {
            break;
        }
        if let Payload::CodeSectionStart { range, .. } = &payload {
            // Handled whole here; the parser is told to skip the entries.
            let (Some(body), Some(after)) = (module.get(range.clone()), module.get(range.end..))
            else {
                return Err("truncated code section".into());
            };
            let reader = wasmparser::CodeSectionReader::new(wasmparser::BinaryReader::new(
                body,
                range.start,
            ))?;
            rewriter.code_section(body, reader)?;
            parser.skip_section();
            rest = after;
            continue;
        }
        let Some((id, range)) = payload.as_section() else {
            continue;
        };
        rewriter.section(payload, id, module, range)?;
    }
    rewriter.finish()
}
