//! Load-time instrumentation of a whole trainable component.
//!
//! Every core module is rewritten by [`super::module`] (state exported, WASI
//! handle calls recorded in a ledger). Then a small *accessor* core module is
//! appended, instantiated against those modules, and its functions are
//! lifted into one exported component instance, [`ACCESS_EXPORT`], that only
//! the host calls:
//!
//! | function | purpose |
//! |---|---|
//! | `size-mK() -> u32` | pages in memory K |
//! | `dump-mK(offset, len)` | passes `len` bytes of memory K to the host's `chunk` import, without a copy in the guest |
//! | `grow-mK(pages) -> s32` | `memory.grow` |
//! | `zero-mK(offset, len)` | `memory.fill` with zeros |
//! | `seek-mK(offset)`, `write-mK(data)` | writes `data` at `offset`: `write`'s canonical `realloc` returns the seek offset, so the ABI's own copy lands the bytes in place |
//! | `get-gK()`, `set-gK(v)` | mutable global K |
//! | `acquire-stdout/stderr/stdin() -> u32` | re-acquire a WASI stream handle (restore only) |
//! | `acquire-preopens() -> u32`, `preopen-handle(j) -> u32` | re-acquire the preopened directories |
//! | `subscribe-output(h) -> u32` | re-create the pollable libc caches for an output stream |
//! | `drop-output-stream/input-stream/descriptor/pollable(h)` | release a handle acquired while restoring |
//!
//! The host side of `chunk` is the component-level import [`SINK_IMPORT`],
//! which the instrumentation adds and the sandbox's linker provides.

use std::collections::{BTreeMap, HashMap};

use wasm_encoder::reencode::Reencode;
use wasm_encoder::{
    Alias, CanonicalOption, ComponentExportKind, ComponentTypeRef, ComponentValType, ExportKind,
    PrimitiveValType,
};
use wasmparser::{
    CanonicalFunction, ComponentExternalKind, ExternalKind, Parser, Payload, ValType,
};

use super::module::{self, HandleImport, ModuleLayout};
use super::refusal::SnapshotRefusal;

/// Name of the exported accessor instance.
pub const ACCESS_EXPORT: &str = "wtune:snapshot/access";
/// Name of the imported instance whose `chunk(data: list<u8>)` receives
/// memory contents.
pub const SINK_IMPORT: &str = "wtune:snapshot/sink";

/// Memories and mutable globals, over all stateful core instances, that the
/// accessor reaches at most. Each costs accessor functions, imports and
/// code, so without a cap a small crafted component (many instances of a
/// module with many globals) would make instrumentation, which runs in the
/// host before the compile worker, grow as the product of the two. Real
/// components have a handful.
const MAX_ACCESSED_ITEMS: usize = 10_000;

/// One snapshotted memory.
#[derive(Debug, Clone)]
pub struct MemoryInfo {
    /// Which core module instance defines it (index into the component's
    /// core instances).
    pub core_instance: u32,
    /// Whether this is a handle ledger rather than guest data.
    pub ledger: bool,
}

/// Handle functions the accessor can call while restoring.
#[derive(Debug, Clone, Default)]
pub struct Replay {
    /// The recognised imports the guest uses; the accessor has the matching
    /// `acquire-*`/`drop-*` function for each.
    pub available: Vec<HandleImport>,
    /// Which memory (index into [`Layout::memories`]) is the ledger.
    pub ledger_memory: Option<usize>,
}

/// What an instrumented component exposes through [`ACCESS_EXPORT`].
#[derive(Debug, Clone)]
pub struct Layout {
    /// Memories, numbered as in `size-mK` etc.
    pub memories: Vec<MemoryInfo>,
    /// Types of the mutable globals, numbered as in `get-gK`.
    pub globals: Vec<ValType>,
    /// Handle re-acquisition support.
    pub replay: Replay,
}

/// An instrumented component and its accessor layout.
#[derive(Debug, Clone)]
pub struct Instrumented {
    /// The rewritten component.
    pub bytes: Vec<u8>,
    /// What its accessor offers.
    pub layout: Layout,
}

/// Component-scope index spaces, counted as sections go by.
#[derive(Debug, Default)]
struct Spaces {
    core_modules: u32,
    core_instances: u32,
    core_funcs: u32,
    core_memories: u32,
    types: u32,
    funcs: u32,
    instances: u32,
}

/// One core instantiation of a module.
struct Instantiation {
    instance: u32,
    module: u32,
    /// Instantiation arguments: import module name -> core instance.
    args: Vec<(String, u32)>,
}

/// Rewrites a component for host snapshots, or says why it cannot be.
pub fn instrument(component: &[u8]) -> Result<Instrumented, SnapshotRefusal> {
    let bad =
        |e: wasmparser::BinaryReaderError| SnapshotRefusal::new(format!("does not parse: {e}"));
    let mut out = wasm_encoder::Component::new();
    let mut spaces = Spaces::default();
    let mut modules: Vec<ModuleLayout> = Vec::new();
    let mut module_exports: Vec<Vec<String>> = Vec::new();
    let mut instantiations: Vec<Instantiation> = Vec::new();

    let mut parser = Parser::new(0);
    let mut rest = component;
    loop {
        let (payload, consumed) = match parser.parse(rest, true).map_err(bad)? {
            wasmparser::Chunk::NeedMoreData(_) => {
                return Err(SnapshotRefusal::new("is truncated"));
            }
            wasmparser::Chunk::Parsed { payload, consumed } => (payload, consumed),
        };
        rest = &rest[consumed..];
        match payload {
            Payload::Version { encoding, .. } => {
                if encoding != wasmparser::Encoding::Component {
                    return Err(SnapshotRefusal::new("is not a component"));
                }
            }
            Payload::ModuleSection {
                unchecked_range, ..
            } => {
                let (Some(bytes), Some(after)) = (
                    component.get(unchecked_range.clone()),
                    rest.get(unchecked_range.len()..),
                ) else {
                    return Err(SnapshotRefusal::new("is truncated"));
                };
                let (rewritten, layout) = module::instrument(bytes)?;
                module_exports.push(exports_of(bytes).map_err(bad)?);
                modules.push(layout);
                out.section(&wasm_encoder::RawSection {
                    id: wasm_encoder::ComponentSectionId::CoreModule as u8,
                    data: &rewritten,
                });
                spaces.core_modules += 1;
                // The parent parser resumes after the module's bytes.
                rest = after;
            }
            Payload::ComponentSection { .. } => {
                return Err(SnapshotRefusal::new(
                    "nested components are not supported by host snapshots",
                ));
            }
            Payload::End(_) => break,
            other => {
                count(&other, &mut spaces, &mut instantiations)?;
                if let Some((id, range)) = other.as_section() {
                    let data = component
                        .get(range)
                        .ok_or_else(|| SnapshotRefusal::new("is truncated"))?;
                    out.section(&wasm_encoder::RawSection { id, data });
                }
            }
        }
    }

    Accessor::build(&mut out, spaces, &modules, &module_exports, &instantiations).map(|layout| {
        Instrumented {
            bytes: out.finish(),
            layout,
        }
    })
}

fn exports_of(module: &[u8]) -> wasmparser::Result<Vec<String>> {
    let mut names = Vec::new();
    for payload in Parser::new(0).parse_all(module) {
        if let Payload::ExportSection(reader) = payload? {
            for export in reader {
                names.push(export?.name.to_string());
            }
        }
    }
    Ok(names)
}

/// Advances the index spaces past one section and refuses what a snapshot
/// cannot carry.
fn count(
    payload: &Payload,
    spaces: &mut Spaces,
    instantiations: &mut Vec<Instantiation>,
) -> Result<(), SnapshotRefusal> {
    let bad =
        |e: wasmparser::BinaryReaderError| SnapshotRefusal::new(format!("does not parse: {e}"));
    match payload {
        Payload::InstanceSection(reader) => {
            for instance in reader.clone() {
                if let wasmparser::Instance::Instantiate { module_index, args } =
                    instance.map_err(bad)?
                {
                    instantiations.push(Instantiation {
                        instance: spaces.core_instances,
                        module: module_index,
                        args: args.iter().map(|a| (a.name.to_string(), a.index)).collect(),
                    });
                }
                spaces.core_instances += 1;
            }
        }
        Payload::ComponentInstanceSection(reader) => spaces.instances += reader.count(),
        Payload::ComponentTypeSection(reader) => spaces.types += reader.count(),
        Payload::ComponentAliasSection(reader) => {
            for alias in reader.clone() {
                match alias.map_err(bad)? {
                    wasmparser::ComponentAlias::InstanceExport { kind, .. } => {
                        external(kind, spaces)
                    }
                    wasmparser::ComponentAlias::CoreInstanceExport { kind, .. } => match kind {
                        ExternalKind::Func | ExternalKind::FuncExact => spaces.core_funcs += 1,
                        ExternalKind::Memory => spaces.core_memories += 1,
                        _ => {}
                    },
                    wasmparser::ComponentAlias::Outer { kind, .. } => match kind {
                        wasmparser::ComponentOuterAliasKind::CoreModule => spaces.core_modules += 1,
                        wasmparser::ComponentOuterAliasKind::Type => spaces.types += 1,
                        _ => {}
                    },
                }
            }
        }
        Payload::ComponentCanonicalSection(reader) => {
            for canon in reader.clone() {
                match canon.map_err(bad)? {
                    CanonicalFunction::Lift { options, .. } => {
                        refuse_async(&options)?;
                        spaces.funcs += 1;
                    }
                    CanonicalFunction::Lower { options, .. } => {
                        refuse_async(&options)?;
                        spaces.core_funcs += 1;
                    }
                    CanonicalFunction::ResourceDrop { .. } => spaces.core_funcs += 1,
                    other => {
                        let name = format!("{other:?}");
                        let name = name.split([' ', '{', '(']).next().unwrap_or_default();
                        return Err(SnapshotRefusal::new(format!(
                            "uses the canonical built-in `{name}` (guest-defined resources, \
                             async or threads), whose state host snapshots cannot carry"
                        )));
                    }
                }
            }
        }
        Payload::ComponentImportSection(reader) => {
            for import in reader.clone() {
                let import = import.map_err(bad)?;
                if import.name.name == SINK_IMPORT {
                    return Err(SnapshotRefusal::new(format!(
                        "already imports `{SINK_IMPORT}`, a name wtune reserves"
                    )));
                }
                type_ref(import.ty, spaces);
            }
        }
        Payload::ComponentExportSection(reader) => {
            for export in reader.clone() {
                let export = export.map_err(bad)?;
                if export.name.name == ACCESS_EXPORT {
                    return Err(SnapshotRefusal::new(format!(
                        "already exports `{ACCESS_EXPORT}`, a name wtune reserves"
                    )));
                }
                external(export.kind, spaces);
            }
        }
        Payload::ComponentStartSection { .. } => {
            return Err(SnapshotRefusal::new(
                "uses a component start function, which host snapshots do not support",
            ));
        }
        _ => {}
    }
    Ok(())
}

fn refuse_async(options: &[wasmparser::CanonicalOption]) -> Result<(), SnapshotRefusal> {
    if options.iter().any(|o| {
        matches!(
            o,
            wasmparser::CanonicalOption::Async | wasmparser::CanonicalOption::Callback(_)
        )
    }) {
        return Err(SnapshotRefusal::new(
            "uses async component functions, whose state host snapshots cannot carry",
        ));
    }
    Ok(())
}

fn external(kind: ComponentExternalKind, spaces: &mut Spaces) {
    match kind {
        ComponentExternalKind::Module => spaces.core_modules += 1,
        ComponentExternalKind::Func => spaces.funcs += 1,
        ComponentExternalKind::Type => spaces.types += 1,
        ComponentExternalKind::Instance => spaces.instances += 1,
        ComponentExternalKind::Component | ComponentExternalKind::Value => {}
    }
}

fn type_ref(ty: wasmparser::ComponentTypeRef, spaces: &mut Spaces) {
    match ty {
        wasmparser::ComponentTypeRef::Module(_) => spaces.core_modules += 1,
        wasmparser::ComponentTypeRef::Func(_) => spaces.funcs += 1,
        wasmparser::ComponentTypeRef::Type(_) => spaces.types += 1,
        wasmparser::ComponentTypeRef::Instance(_) => spaces.instances += 1,
        wasmparser::ComponentTypeRef::Component(_) | wasmparser::ComponentTypeRef::Value(_) => {}
    }
}

/// Signature of one accessor function, in core and component terms.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
enum Sig {
    /// `func() -> u32`
    NoneToU32,
    /// `func(a: u32) -> u32`
    U32ToU32,
    /// `func(a: u32) -> s32`
    U32ToS32,
    /// `func(a: u32)`
    U32,
    /// `func(a: u32, b: u32)`
    U32U32,
    /// `func(data: list<u8>)`
    Bytes,
    /// `func() -> T` for a global
    Get(PrimitiveValType),
    /// `func(value: T)` for a global
    Set(PrimitiveValType),
}

fn core_val(p: PrimitiveValType) -> wasm_encoder::ValType {
    match p {
        PrimitiveValType::S64 | PrimitiveValType::U64 => wasm_encoder::ValType::I64,
        PrimitiveValType::F32 => wasm_encoder::ValType::F32,
        PrimitiveValType::F64 => wasm_encoder::ValType::F64,
        _ => wasm_encoder::ValType::I32,
    }
}

impl Sig {
    fn core(self) -> (Vec<wasm_encoder::ValType>, Vec<wasm_encoder::ValType>) {
        use wasm_encoder::ValType::I32;
        match self {
            Sig::NoneToU32 => (vec![], vec![I32]),
            Sig::U32ToU32 | Sig::U32ToS32 => (vec![I32], vec![I32]),
            Sig::U32 => (vec![I32], vec![]),
            Sig::U32U32 | Sig::Bytes => (vec![I32, I32], vec![]),
            Sig::Get(p) => (vec![], vec![core_val(p)]),
            Sig::Set(p) => (vec![core_val(p)], vec![]),
        }
    }
}

/// A core function of the accessor module to be lifted and exported.
struct Export {
    name: String,
    sig: Sig,
    /// Index of the memory (in the accessor's import order) whose `memory`
    /// and `realloc` the lift needs, for `write-mK`.
    write_memory: Option<usize>,
}

/// What [`Accessor::import_state`] imported: the memories (with the core
/// instance and export each comes from), the handle functions by kind, the
/// owner's `cabi_realloc` where imported, and the globals' types.
struct Imported {
    memories: Vec<(MemoryInfo, u32, String)>,
    handle_funcs: BTreeMap<HandleImport, u32>,
    realloc: Option<u32>,
    global_types: Vec<ValType>,
}

/// The core instances that carry state (memories, mutable globals, a
/// handle ledger) and the one whose module has the ledger; refuses a
/// ledger instantiated twice (handle indices would be ambiguous) and more
/// state than the accessor can address.
fn stateful_instances<'a>(
    modules: &[ModuleLayout],
    instantiations: &'a [Instantiation],
) -> Result<(Vec<&'a Instantiation>, Option<&'a Instantiation>), SnapshotRefusal> {
    let mut stateful: Vec<&Instantiation> = Vec::new();
    let mut ledger_owner: Option<&Instantiation> = None;
    for inst in instantiations {
        let layout = modules
            .get(inst.module as usize)
            .ok_or_else(|| SnapshotRefusal::new("instantiates a core module it does not define"))?;
        if layout.ledger.is_some() {
            if ledger_owner.is_some() {
                return Err(SnapshotRefusal::new(
                    "has more than one core instance that imports WASI handles (host \
                     snapshots support one)",
                ));
            }
            ledger_owner = Some(inst);
        }
        if !layout.memories.is_empty() || !layout.globals.is_empty() || layout.ledger.is_some() {
            stateful.push(inst);
        }
    }
    let accessed: usize = stateful
        .iter()
        .map(|inst| {
            let layout = &modules[inst.module as usize];
            layout.memories.len() + layout.globals.len()
        })
        .sum();
    if accessed > MAX_ACCESSED_ITEMS {
        return Err(SnapshotRefusal::new(format!(
            "has {accessed} memories and mutable globals across {} core instances; host \
             snapshots handle at most {MAX_ACCESSED_ITEMS}",
            stateful.len()
        )));
    }
    Ok((stateful, ledger_owner))
}

/// Emits the sink the accessor streams memory through: the memories'
/// aliases, the sink's import, a chunk function lowered per memory and the
/// core instance that exports them. Returns the first memory's index and
/// that instance.
fn emit_sink(
    out: &mut wasm_encoder::Component,
    spaces: &mut Spaces,
    memories: &[(MemoryInfo, u32, String)],
) -> (u32, u32) {
    let mut aliases = wasm_encoder::ComponentAliasSection::new();
    let first_memory = spaces.core_memories;
    for (_, instance, name) in memories {
        aliases.alias(Alias::CoreInstanceExport {
            instance: *instance,
            kind: ExportKind::Memory,
            name,
        });
        spaces.core_memories += 1;
    }
    out.section(&aliases);

    let mut types = wasm_encoder::ComponentTypeSection::new();
    let mut sink_ty = wasm_encoder::InstanceType::new();
    sink_ty
        .ty()
        .defined_type()
        .list(ComponentValType::Primitive(PrimitiveValType::U8));
    sink_ty
        .ty()
        .function()
        .params([("data", ComponentValType::Type(0))])
        .result(None);
    sink_ty.export("chunk", ComponentTypeRef::Func(1));
    types.instance(&sink_ty);
    let sink_type = spaces.types;
    spaces.types += 1;
    out.section(&types);

    let mut imports = wasm_encoder::ComponentImportSection::new();
    imports.import(SINK_IMPORT, ComponentTypeRef::Instance(sink_type));
    let sink_instance = spaces.instances;
    spaces.instances += 1;
    out.section(&imports);

    let mut aliases = wasm_encoder::ComponentAliasSection::new();
    aliases.alias(Alias::InstanceExport {
        instance: sink_instance,
        kind: ComponentExportKind::Func,
        name: "chunk",
    });
    let chunk_func = spaces.funcs;
    spaces.funcs += 1;
    out.section(&aliases);

    let mut canon = wasm_encoder::CanonicalFunctionSection::new();
    let first_chunk = spaces.core_funcs;
    for k in 0..memories.len() {
        canon.lower(
            chunk_func,
            [CanonicalOption::Memory(first_memory + k as u32)],
        );
        spaces.core_funcs += 1;
    }
    out.section(&canon);

    let mut instances = wasm_encoder::InstanceSection::new();
    instances.export_items((0..memories.len()).map(|k| {
        (
            format!("chunk{k}"),
            ExportKind::Func,
            first_chunk + k as u32,
        )
    }));
    let sink_core = spaces.core_instances;
    spaces.core_instances += 1;
    out.section(&instances);
    (first_memory, sink_core)
}

/// Builds the accessor core module and the component-level plumbing around it.
struct Accessor {
    types: wasm_encoder::TypeSection,
    type_map: HashMap<(Vec<wasm_encoder::ValType>, Vec<wasm_encoder::ValType>), u32>,
    imports: wasm_encoder::ImportSection,
    imported_funcs: u32,
    functions: wasm_encoder::FunctionSection,
    code: wasm_encoder::CodeSection,
    exports: Vec<(Export, u32)>,
    /// Core exports that are not lifted (the `realloc` helpers).
    plain_exports: Vec<(String, u32)>,
    globals: wasm_encoder::GlobalSection,
    n_globals_imported: u32,
}

impl Accessor {
    /// Builds the accessor for the component whose core `modules` are
    /// instantiated as `instantiations` and emits it into `out`, after the
    /// component's own sections (`spaces` counts their index spaces).
    /// Returns the layout snapshots are read and written with.
    fn build(
        out: &mut wasm_encoder::Component,
        mut spaces: Spaces,
        modules: &[ModuleLayout],
        module_exports: &[Vec<String>],
        instantiations: &[Instantiation],
    ) -> Result<Layout, SnapshotRefusal> {
        let mut acc = Accessor {
            types: Default::default(),
            type_map: Default::default(),
            imports: Default::default(),
            imported_funcs: 0,
            functions: Default::default(),
            code: Default::default(),
            exports: Vec::new(),
            plain_exports: Vec::new(),
            globals: Default::default(),
            n_globals_imported: 0,
        };
        let (stateful, ledger_owner) = stateful_instances(modules, instantiations)?;
        let Imported {
            memories,
            handle_funcs,
            realloc,
            global_types,
        } = acc.import_state(modules, module_exports, &stateful, ledger_owner)?;

        // Per-memory functions.
        for k in 0..memories.len() {
            acc.memory_functions(k as u32);
        }
        // Per-global functions.
        for (g, ty) in global_types.iter().enumerate() {
            acc.global_functions(g as u32, *ty)?;
        }
        // Restore-time handle functions.
        let ledger_memory = memories.iter().position(|(m, _, _)| m.ledger);
        let abi_memory = ledger_owner.and_then(|owner| {
            memories
                .iter()
                .position(|(m, _, _)| m.core_instance == owner.instance && !m.ledger)
        });
        acc.handle_functions(&handle_funcs, realloc, abi_memory);

        // Emit: memory aliases for the chunk lowerings, the sink import, the
        // lowered chunks, the accessor module and its instance, the lifts
        // and the exported instance.
        let (first_memory, sink_core) = emit_sink(out, &mut spaces, &memories);
        let accessor_instance = acc.instantiate(
            out,
            &mut spaces,
            sink_core,
            modules,
            &stateful,
            ledger_owner,
        )?;
        acc.lift_exports(out, &mut spaces, accessor_instance, first_memory);

        Ok(Layout {
            memories: memories.into_iter().map(|(m, _, _)| m).collect(),
            globals: global_types,
            replay: Replay {
                available: handle_funcs.keys().copied().collect(),
                ledger_memory,
            },
        })
    }

    /// Imports what the accessor reads and writes, in index order: a sink
    /// chunk function per memory, the ledger owner's handle functions (and
    /// its `cabi_realloc` where directories are read back), then the
    /// memories and the mutable globals.
    fn import_state(
        &mut self,
        modules: &[ModuleLayout],
        module_exports: &[Vec<String>],
        stateful: &[&Instantiation],
        ledger_owner: Option<&Instantiation>,
    ) -> Result<Imported, SnapshotRefusal> {
        let mut memories: Vec<(MemoryInfo, u32, String)> = Vec::new();
        for inst in stateful {
            let layout = &modules[inst.module as usize];
            for (name, _) in &layout.memories {
                memories.push((
                    MemoryInfo {
                        core_instance: inst.instance,
                        ledger: false,
                    },
                    inst.instance,
                    name.clone(),
                ));
            }
            if let Some(ledger) = &layout.ledger {
                memories.push((
                    MemoryInfo {
                        core_instance: inst.instance,
                        ledger: true,
                    },
                    inst.instance,
                    ledger.export.clone(),
                ));
            }
        }
        let chunk_ty = self.core_type(Sig::U32U32);
        for k in 0..memories.len() {
            self.imports.import(
                "wtune-sink",
                &format!("chunk{k}"),
                wasm_encoder::EntityType::Function(chunk_ty),
            );
            self.imported_funcs += 1;
        }
        let mut handle_funcs: BTreeMap<HandleImport, u32> = BTreeMap::new();
        let mut realloc = None;
        if let Some(owner) = ledger_owner {
            let ledger = modules[owner.module as usize].ledger.as_ref().unwrap();
            for (kind, name) in &ledger.imports {
                let ty = self.core_type(handle_sig(*kind));
                self.imports.import(
                    &name.module,
                    &name.name,
                    wasm_encoder::EntityType::Function(ty),
                );
                handle_funcs.insert(*kind, self.imported_funcs);
                self.imported_funcs += 1;
            }
            if handle_funcs.contains_key(&HandleImport::GetDirectories) {
                if !module_exports[owner.module as usize]
                    .iter()
                    .any(|n| n == "cabi_realloc")
                {
                    return Err(SnapshotRefusal::new(
                        "reads preopened directories from a core module that exports no `cabi_realloc`",
                    ));
                }
                let ty = self.realloc_type();
                self.imports.import(
                    &instance_arg(owner.instance),
                    "cabi_realloc",
                    wasm_encoder::EntityType::Function(ty),
                );
                realloc = Some(self.imported_funcs);
                self.imported_funcs += 1;
            }
        }
        for (_, instance, name) in &memories {
            self.imports.import(
                &instance_arg(*instance),
                name,
                wasm_encoder::EntityType::Memory(wasm_encoder::MemoryType {
                    minimum: 0,
                    maximum: None,
                    memory64: false,
                    shared: false,
                    page_size_log2: None,
                }),
            );
        }
        let mut global_types = Vec::new();
        for inst in stateful {
            for (name, ty) in &modules[inst.module as usize].globals {
                let val = wasm_encoder::reencode::RoundtripReencoder
                    .val_type(*ty)
                    .map_err(|e| {
                        SnapshotRefusal::new(format!("has a global type wtune cannot encode: {e}"))
                    })?;
                self.imports.import(
                    &instance_arg(inst.instance),
                    name,
                    wasm_encoder::EntityType::Global(wasm_encoder::GlobalType {
                        val_type: val,
                        mutable: true,
                        shared: false,
                    }),
                );
                global_types.push(*ty);
            }
        }
        self.n_globals_imported = global_types.len() as u32;

        self.n_globals_imported = global_types.len() as u32;
        Ok(Imported {
            memories,
            handle_funcs,
            realloc,
            global_types,
        })
    }

    /// Emits the accessor module and instantiates it with the sink, the
    /// stateful instances and the ledger owner's handle providers. Returns
    /// the accessor's core instance.
    fn instantiate(
        &self,
        out: &mut wasm_encoder::Component,
        spaces: &mut Spaces,
        sink_core: u32,
        modules: &[ModuleLayout],
        stateful: &[&Instantiation],
        ledger_owner: Option<&Instantiation>,
    ) -> Result<u32, SnapshotRefusal> {
        let module_bytes = self.module();
        out.section(&wasm_encoder::RawSection {
            id: wasm_encoder::ComponentSectionId::CoreModule as u8,
            data: &module_bytes,
        });
        let accessor_module = spaces.core_modules;
        spaces.core_modules += 1;

        let mut args: Vec<(String, u32)> = vec![("wtune-sink".into(), sink_core)];
        for inst in stateful {
            args.push((instance_arg(inst.instance), inst.instance));
        }
        if let Some(owner) = ledger_owner {
            let ledger = modules[owner.module as usize].ledger.as_ref().unwrap();
            for (_, name) in &ledger.imports {
                let Some((_, index)) = owner.args.iter().find(|(n, _)| *n == name.module) else {
                    return Err(SnapshotRefusal::new(format!(
                        "does not say which instance provides `{}`",
                        name.module
                    )));
                };
                if !args.iter().any(|(n, _)| *n == name.module) {
                    args.push((name.module.clone(), *index));
                }
            }
        }
        let mut instances = wasm_encoder::InstanceSection::new();
        instances.instantiate(
            accessor_module,
            args.iter()
                .map(|(n, i)| (n.as_str(), wasm_encoder::ModuleArg::Instance(*i))),
        );
        let accessor_instance = spaces.core_instances;
        spaces.core_instances += 1;
        out.section(&instances);
        Ok(accessor_instance)
    }

    /// Lifts every accessor export to a component function and exports
    /// them as one instance, [`ACCESS_EXPORT`].
    fn lift_exports(
        &self,
        out: &mut wasm_encoder::Component,
        spaces: &mut Spaces,
        accessor_instance: u32,
        first_memory: u32,
    ) {
        let mut aliases = wasm_encoder::ComponentAliasSection::new();
        let mut core_index = HashMap::new();
        for (export, _) in &self.exports {
            aliases.alias(Alias::CoreInstanceExport {
                instance: accessor_instance,
                kind: ExportKind::Func,
                name: &export.name,
            });
            core_index.insert(export.name.clone(), spaces.core_funcs);
            spaces.core_funcs += 1;
        }
        let mut realloc_index = HashMap::new();
        for (name, _) in &self.plain_exports {
            aliases.alias(Alias::CoreInstanceExport {
                instance: accessor_instance,
                kind: ExportKind::Func,
                name,
            });
            realloc_index.insert(name.clone(), spaces.core_funcs);
            spaces.core_funcs += 1;
        }
        out.section(&aliases);

        let mut types = wasm_encoder::ComponentTypeSection::new();
        let list_u8 = spaces.types;
        types
            .defined_type()
            .list(ComponentValType::Primitive(PrimitiveValType::U8));
        spaces.types += 1;
        let mut func_types: HashMap<Sig, u32> = HashMap::new();
        for (export, _) in &self.exports {
            if func_types.contains_key(&export.sig) {
                continue;
            }
            let u32_ = ComponentValType::Primitive(PrimitiveValType::U32);
            let mut f = types.function();
            match export.sig {
                Sig::NoneToU32 => {
                    f.params::<_, ComponentValType>([]).result(Some(u32_));
                }
                Sig::U32ToU32 => {
                    f.params([("a", u32_)]).result(Some(u32_));
                }
                Sig::U32ToS32 => {
                    f.params([("a", u32_)])
                        .result(Some(ComponentValType::Primitive(PrimitiveValType::S32)));
                }
                Sig::U32 => {
                    f.params([("a", u32_)]).result(None);
                }
                Sig::U32U32 => {
                    f.params([("a", u32_), ("b", u32_)]).result(None);
                }
                Sig::Bytes => {
                    f.params([("data", ComponentValType::Type(list_u8))])
                        .result(None);
                }
                Sig::Get(p) => {
                    f.params::<_, ComponentValType>([])
                        .result(Some(ComponentValType::Primitive(p)));
                }
                Sig::Set(p) => {
                    f.params([("value", ComponentValType::Primitive(p))])
                        .result(None);
                }
            }
            func_types.insert(export.sig, spaces.types);
            spaces.types += 1;
        }
        out.section(&types);

        let mut canon = wasm_encoder::CanonicalFunctionSection::new();
        let mut lifted = Vec::new();
        for (export, _) in &self.exports {
            let mut options = Vec::new();
            if let Some(k) = export.write_memory {
                options.push(CanonicalOption::Memory(first_memory + k as u32));
                options.push(CanonicalOption::Realloc(realloc_index[&realloc_name(k)]));
            }
            canon.lift(core_index[&export.name], func_types[&export.sig], options);
            lifted.push((export.name.clone(), spaces.funcs));
            spaces.funcs += 1;
        }
        out.section(&canon);

        let mut instances = wasm_encoder::ComponentInstanceSection::new();
        instances.export_items(
            lifted
                .iter()
                .map(|(n, i)| (n.as_str(), ComponentExportKind::Func, *i)),
        );
        let access_instance = spaces.instances;
        out.section(&instances);

        let mut exports = wasm_encoder::ComponentExportSection::new();
        exports.export(
            ACCESS_EXPORT,
            ComponentExportKind::Instance,
            access_instance,
            None,
        );
        out.section(&exports);
    }

    fn core_type(&mut self, sig: Sig) -> u32 {
        let (params, results) = sig.core();
        self.core_type_raw(params, results)
    }

    fn core_type_raw(
        &mut self,
        params: Vec<wasm_encoder::ValType>,
        results: Vec<wasm_encoder::ValType>,
    ) -> u32 {
        if let Some(i) = self.type_map.get(&(params.clone(), results.clone())) {
            return *i;
        }
        let index = self.types.len();
        self.types.ty().function(params.clone(), results.clone());
        self.type_map.insert((params, results), index);
        index
    }

    /// `realloc(old_ptr, old_size, align, new_size) -> ptr`, the canonical
    /// ABI's allocator signature.
    fn realloc_type(&mut self) -> u32 {
        self.core_type_raw(
            vec![wasm_encoder::ValType::I32; 4],
            vec![wasm_encoder::ValType::I32],
        )
    }

    /// Adds a defined function; returns its index.
    fn function(
        &mut self,
        sig: Sig,
        locals: &[wasm_encoder::ValType],
        body: &[wasm_encoder::Instruction],
    ) -> u32 {
        let ty = self.core_type(sig);
        self.function_typed(ty, locals, body)
    }

    fn function_typed(
        &mut self,
        ty: u32,
        locals: &[wasm_encoder::ValType],
        body: &[wasm_encoder::Instruction],
    ) -> u32 {
        let index = self.imported_funcs + self.functions.len();
        self.functions.function(ty);
        let mut f = wasm_encoder::Function::new(locals.iter().map(|l| (1, *l)));
        for i in body {
            f.instruction(i);
        }
        f.instruction(&wasm_encoder::Instruction::End);
        self.code.function(&f);
        index
    }

    fn export(&mut self, name: String, sig: Sig, body: &[wasm_encoder::Instruction]) {
        self.export_with(name, sig, &[], body, None)
    }

    fn export_with(
        &mut self,
        name: String,
        sig: Sig,
        locals: &[wasm_encoder::ValType],
        body: &[wasm_encoder::Instruction],
        write_memory: Option<usize>,
    ) {
        let index = self.function(sig, locals, body);
        self.exports.push((
            Export {
                name,
                sig,
                write_memory,
            },
            index,
        ));
    }

    /// A fresh mutable i32 global of the accessor's own; returns its index.
    fn own_global(&mut self) -> u32 {
        let index = self.n_globals_imported + self.globals.len();
        self.globals.global(
            wasm_encoder::GlobalType {
                val_type: wasm_encoder::ValType::I32,
                mutable: true,
                shared: false,
            },
            &wasm_encoder::ConstExpr::i32_const(0),
        );
        index
    }

    fn memory_functions(&mut self, k: u32) {
        use wasm_encoder::Instruction as I;
        let seek = self.own_global();
        self.export(
            memory_accessor("size", k),
            Sig::NoneToU32,
            &[I::MemorySize(k)],
        );
        self.export(
            memory_accessor("dump", k),
            Sig::U32U32,
            &[I::LocalGet(0), I::LocalGet(1), I::Call(k)],
        );
        self.export(
            memory_accessor("grow", k),
            Sig::U32ToS32,
            &[I::LocalGet(0), I::MemoryGrow(k)],
        );
        self.export(
            memory_accessor("zero", k),
            Sig::U32U32,
            &[
                I::LocalGet(0),
                I::I32Const(0),
                I::LocalGet(1),
                I::MemoryFill(k),
            ],
        );
        self.export(
            memory_accessor("seek", k),
            Sig::U32,
            &[I::LocalGet(0), I::GlobalSet(seek)],
        );
        // realloc(old_ptr, old_size, align, new_size) -> the seek offset,
        // after checking that the bytes fit.
        let realloc_ty = self.realloc_type();
        let realloc = self.function_typed(
            realloc_ty,
            &[],
            &[
                I::GlobalGet(seek),
                I::I64ExtendI32U,
                I::LocalGet(3),
                I::I64ExtendI32U,
                I::I64Add,
                I::MemorySize(k),
                I::I64ExtendI32U,
                I::I64Const(16),
                I::I64Shl,
                I::I64GtU,
                I::If(wasm_encoder::BlockType::Empty),
                I::Unreachable,
                I::End,
                I::GlobalGet(seek),
            ],
        );
        self.plain_exports.push((realloc_name(k as usize), realloc));
        self.export_with(
            memory_accessor("write", k),
            Sig::Bytes,
            &[],
            &[],
            Some(k as usize),
        );
    }

    fn global_functions(&mut self, g: u32, ty: ValType) -> Result<(), SnapshotRefusal> {
        use wasm_encoder::Instruction as I;
        let prim = match ty {
            ValType::I32 => PrimitiveValType::S32,
            ValType::I64 => PrimitiveValType::S64,
            ValType::F32 => PrimitiveValType::F32,
            ValType::F64 => PrimitiveValType::F64,
            other => {
                return Err(SnapshotRefusal::new(format!(
                    "has a mutable {other} global, which snapshots cannot carry"
                )));
            }
        };
        self.export(
            global_accessor("get", g),
            Sig::Get(prim),
            &[I::GlobalGet(g)],
        );
        self.export(
            global_accessor("set", g),
            Sig::Set(prim),
            &[I::LocalGet(0), I::GlobalSet(g)],
        );
        Ok(())
    }

    fn handle_functions(
        &mut self,
        funcs: &BTreeMap<HandleImport, u32>,
        realloc: Option<u32>,
        abi_memory: Option<usize>,
    ) {
        use wasm_encoder::Instruction as I;
        for (kind, func) in funcs {
            match kind {
                HandleImport::GetDirectories => {
                    let (Some(realloc), Some(m)) = (realloc, abi_memory) else {
                        continue;
                    };
                    let m = m as u32;
                    let list = self.own_global();
                    let arg = |offset| wasm_encoder::MemArg {
                        offset,
                        align: 2,
                        memory_index: m,
                    };
                    // The return area comes from the guest's own allocator:
                    // restores run before the guest's memory is written back,
                    // so whatever this allocates is overwritten afterwards.
                    self.export_with(
                        handle_accessor(HandleImport::GetDirectories).into(),
                        Sig::NoneToU32,
                        &[wasm_encoder::ValType::I32],
                        &[
                            I::I32Const(0),
                            I::I32Const(0),
                            I::I32Const(4),
                            I::I32Const(8),
                            I::Call(realloc),
                            I::LocalTee(0),
                            I::Call(*func),
                            I::LocalGet(0),
                            I::I32Load(arg(0)),
                            I::GlobalSet(list),
                            I::LocalGet(0),
                            I::I32Load(arg(4)),
                        ],
                        None,
                    );
                    self.export(
                        PREOPEN_HANDLE.into(),
                        Sig::U32ToU32,
                        &[
                            I::GlobalGet(list),
                            I::LocalGet(0),
                            I::I32Const(12),
                            I::I32Mul,
                            I::I32Add,
                            I::I32Load(arg(0)),
                        ],
                    );
                }
                // The rest forward their parameter (if any) to the import.
                _ => {
                    let sig = handle_sig(*kind);
                    let body: &[I] = if sig.core().0.is_empty() {
                        &[I::Call(*func)]
                    } else {
                        &[I::LocalGet(0), I::Call(*func)]
                    };
                    self.export(handle_accessor(*kind).into(), sig, body);
                }
            }
        }
    }

    fn module(&self) -> Vec<u8> {
        let mut m = wasm_encoder::Module::new();
        m.section(&self.types);
        m.section(&self.imports);
        m.section(&self.functions);
        m.section(&self.globals);
        let mut exports = wasm_encoder::ExportSection::new();
        for (export, index) in &self.exports {
            exports.export(&export.name, wasm_encoder::ExportKind::Func, *index);
        }
        for (name, index) in &self.plain_exports {
            exports.export(name, wasm_encoder::ExportKind::Func, *index);
        }
        m.section(&exports);
        m.section(&self.code);
        m.finish()
    }
}

/// Name of the accessor function `op` (`size`, `dump`, `grow`, `zero`,
/// `seek`, `write`) for memory `k`.
pub fn memory_accessor(op: &str, k: impl std::fmt::Display) -> String {
    format!("{op}-m{k}")
}

/// Name of the accessor function `op` (`get`, `set`) for global `g`.
pub fn global_accessor(op: &str, g: impl std::fmt::Display) -> String {
    format!("{op}-g{g}")
}

/// Name of the accessor function that calls `kind` directly (for
/// `GetDirectories`, the one that lists them; see [`PREOPEN_HANDLE`]).
pub fn handle_accessor(kind: HandleImport) -> &'static str {
    match kind {
        HandleImport::GetStdout => "acquire-stdout",
        HandleImport::GetStderr => "acquire-stderr",
        HandleImport::GetStdin => "acquire-stdin",
        HandleImport::GetDirectories => "acquire-preopens",
        HandleImport::DropOutputStream => "drop-output-stream",
        HandleImport::DropInputStream => "drop-input-stream",
        HandleImport::DropDescriptor => "drop-descriptor",
        HandleImport::SubscribeOutput => "subscribe-output",
        HandleImport::DropPollable => "drop-pollable",
    }
}

/// Name of the accessor function returning the `j`-th handle of the last
/// `acquire-preopens` call.
pub const PREOPEN_HANDLE: &str = "preopen-handle";

/// The core (and accessor) signature of a recognised import, from the one
/// the module rewrite checks imports against.
fn handle_sig(kind: HandleImport) -> Sig {
    match kind.signature() {
        ([], [ValType::I32]) => Sig::NoneToU32,
        ([ValType::I32], [ValType::I32]) => Sig::U32ToU32,
        ([ValType::I32], []) => Sig::U32,
        other => unreachable!("no accessor signature for {other:?}"),
    }
}

fn instance_arg(instance: u32) -> String {
    format!("wtune-i{instance}")
}

fn realloc_name(k: usize) -> String {
    format!("realloc-m{k}")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A small component with a module, an instance and a lifted export.
    fn sample() -> Vec<u8> {
        wat::parse_str(
            r#"(component
                (core module $m
                  (memory (export "memory") 1)
                  (global $g (mut i32) (i32.const 7))
                  (func (export "f") (result i32) global.get $g))
                (core instance $i (instantiate $m))
                (func (export "f") (result s32) (canon lift (core func $i "f"))))"#,
        )
        .unwrap()
    }

    #[test]
    fn a_component_with_too_much_state_to_reach_is_refused_quickly() {
        // 200 globals instantiated 100 times: 20 000 accessor targets from
        // a few kilobytes of input.
        let globals = "(global (mut i32) (i32.const 0))".repeat(200);
        let instances = "(core instance (instantiate $m))".repeat(100);
        let bytes = wat::parse_str(format!(
            "(component (core module $m {globals}) {instances})"
        ))
        .unwrap();
        let refusal = instrument(&bytes).unwrap_err();
        assert_eq!(
            refusal.reason(),
            "has 20000 memories and mutable globals across 100 core instances; host snapshots \
             handle at most 10000"
        );
    }

    #[test]
    fn a_plain_component_gets_an_accessor_and_stays_valid() {
        let out = instrument(&sample()).unwrap();
        wasmparser::Validator::new_with_features(wasmparser::WasmFeatures::all())
            .validate_all(&out.bytes)
            .unwrap();
        assert_eq!(out.layout.memories.len(), 1);
        assert_eq!(out.layout.globals, vec![ValType::I32]);
        assert!(out.layout.replay.available.is_empty());
    }

    #[test]
    fn damaged_bytes_are_refused_never_panic() {
        let bytes = sample();
        for cut in 0..bytes.len() {
            let _ = instrument(&bytes[..cut]);
        }
        for i in 0..bytes.len() {
            for bit in [0x01, 0x80] {
                let mut damaged = bytes.clone();
                damaged[i] ^= bit;
                let _ = instrument(&damaged);
            }
        }
    }

    #[test]
    fn state_a_snapshot_cannot_carry_is_refused_with_the_reason() {
        let table_grow = wat::parse_str(
            r#"(component
                (core module $m
                  (table 1 funcref)
                  (func (export "f") (drop (table.grow (ref.null func) (i32.const 1)))))
                (core instance $i (instantiate $m)))"#,
        )
        .unwrap();
        let err = instrument(&table_grow).unwrap_err();
        assert!(err.reason().contains("table.grow"), "{err}");

        let shared = wat::parse_str(
            r#"(component (core module $m (memory 1 1 shared)) (core instance (instantiate $m)))"#,
        )
        .unwrap();
        assert!(instrument(&shared).unwrap_err().reason().contains("shared"));

        let core = wat::parse_str("(module)").unwrap();
        assert!(
            instrument(&core)
                .unwrap_err()
                .reason()
                .contains("not a component")
        );
    }
}
