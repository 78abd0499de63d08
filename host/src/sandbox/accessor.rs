//! Taking and restoring host snapshots of a live trial instance through the
//! accessor that [`crate::snapshot::instrument`] adds to the component.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

use wasmtime::component::{Component, ComponentExportIndex, Instance, Linker, TypedFunc, WasmList};
use wasmtime::{AsContextMut, Store, StoreContextMut};

use crate::snapshot::{
    ACCESS_EXPORT, GlobalValue, GuestImage, HandleImport, ImageSource, LEDGER_OVERFLOW,
    LEDGER_SLOTS, Layout, MemoryImage, PREOPEN_HANDLE, ReadError, SINK_IMPORT, SnapshotRefusal,
    SnapshotSource, Spool, global_accessor, handle_accessor, ledger, memory_accessor,
};

use super::capture::{Keep, MemorySink};
use super::store_data::TrialHost;

/// Why a snapshot could not be taken or restored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SnapshotError {
    /// The component cannot be snapshotted at all.
    Unsupported(SnapshotRefusal),
    /// This state cannot be captured exactly (e.g. open files across calls).
    Inexact(String),
    /// The instance trapped earlier; its state is not trustworthy.
    Poisoned,
    /// The image does not fit this component.
    Mismatch(String),
    /// The accessor failed (a limit hit while growing memory, say).
    Failed(String),
}

impl fmt::Display for SnapshotError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SnapshotError::Unsupported(refusal) => write!(f, "{refusal}"),
            SnapshotError::Inexact(why) => write!(f, "cannot snapshot this state exactly: {why}"),
            SnapshotError::Poisoned => {
                write!(
                    f,
                    "the instance trapped earlier; its state cannot be snapshotted"
                )
            }
            SnapshotError::Mismatch(why) => write!(f, "the snapshot does not fit: {why}"),
            SnapshotError::Failed(why) => write!(f, "snapshot access failed: {why}"),
        }
    }
}

impl std::error::Error for SnapshotError {}

/// Bytes of a handle ledger: one word per slot and the overflow word.
const LEDGER_BYTES: u64 = (LEDGER_SLOTS as u64 + 1) * 4;

fn reading(err: ReadError) -> SnapshotError {
    SnapshotError::Failed(format!("reading the snapshot: {err}"))
}

/// Memory `k` of `source`, read whole into an image.
fn read_memory(source: &mut dyn SnapshotSource, k: usize) -> Result<MemoryImage, ReadError> {
    let layout = &source.layout().memories[k];
    let mut image = MemoryImage {
        pages: layout.pages,
        runs: layout.runs.clone(),
        data: Vec::with_capacity(layout.run_bytes() as usize),
    };
    source.open_memory(k)?;
    while let Some((_, bytes)) = source.next_piece()? {
        image.data.extend_from_slice(bytes);
    }
    Ok(image)
}

/// Largest span passed to `dump` in one call: below wasmtime's per-hostcall
/// transfer budget (128 MiB by default), which stays in force for guests.
const DUMP_SPAN: u64 = 64 << 20;

/// The accessor's functions, resolved once per program.
#[derive(Debug)]
pub(crate) struct AccessIndex {
    pub(crate) layout: Layout,
    funcs: BTreeMap<String, ComponentExportIndex>,
}

impl AccessIndex {
    /// Resolves every accessor function of an instrumented component.
    pub(crate) fn resolve(component: &Component, layout: Layout) -> Result<Arc<Self>, String> {
        let (_, instance) = component
            .get_export(None, ACCESS_EXPORT)
            .ok_or_else(|| format!("the instrumented component lacks `{ACCESS_EXPORT}`"))?;
        let mut names = Vec::new();
        for k in 0..layout.memories.len() {
            for op in ["size", "dump", "grow", "zero", "seek", "write"] {
                names.push(memory_accessor(op, k));
            }
        }
        for g in 0..layout.globals.len() {
            names.push(global_accessor("get", g));
            names.push(global_accessor("set", g));
        }
        for kind in &layout.replay.available {
            names.push(handle_accessor(*kind).to_string());
            if *kind == HandleImport::GetDirectories {
                names.push(PREOPEN_HANDLE.to_string());
            }
        }
        let mut funcs = BTreeMap::new();
        for name in names {
            let (_, index) = component
                .get_export(Some(&instance), &name)
                .ok_or_else(|| format!("the accessor lacks `{name}`"))?;
            funcs.insert(name, index);
        }
        Ok(Arc::new(Self { layout, funcs }))
    }
}

/// Adds the host side of the accessor's `chunk` import to the linker.
pub(crate) fn add_sink_to_linker(linker: &mut Linker<TrialHost>) -> wasmtime::Result<()> {
    linker.instance(SINK_IMPORT)?.func_wrap(
        "chunk",
        |mut store: StoreContextMut<'_, TrialHost>, (data,): (WasmList<u8>,)| {
            let Some(mut sink) = store.data_mut().sink.take() else {
                wasmtime::bail!("`{SINK_IMPORT}` called outside a host snapshot");
            };
            let written = sink.push(data.as_le_slice(&store));
            store.data_mut().sink = Some(sink);
            written.map_err(|e| wasmtime::format_err!("writing the snapshot: {e}"))
        },
    )?;
    Ok(())
}

/// Calls into one live instance's accessor.
pub(crate) struct Access<'a> {
    pub(crate) store: &'a mut Store<TrialHost>,
    pub(crate) instance: Instance,
    pub(crate) index: &'a AccessIndex,
}

impl Access<'_> {
    fn func<P, R>(&mut self, name: &str) -> Result<TypedFunc<P, R>, SnapshotError>
    where
        P: wasmtime::component::ComponentNamedList + wasmtime::component::Lower,
        R: wasmtime::component::ComponentNamedList + wasmtime::component::Lift,
    {
        let index = self
            .index
            .funcs
            .get(name)
            .ok_or_else(|| SnapshotError::Failed(format!("no accessor `{name}`")))?;
        self.instance
            .get_typed_func::<P, R>(self.store.as_context_mut(), index)
            .map_err(|e| SnapshotError::Failed(format!("accessor `{name}`: {e:#}")))
    }

    fn call<P, R>(&mut self, name: &str, params: P) -> Result<R, SnapshotError>
    where
        P: wasmtime::component::ComponentNamedList + wasmtime::component::Lower,
        R: wasmtime::component::ComponentNamedList + wasmtime::component::Lift,
    {
        let func = self.func::<P, R>(name)?;
        self.invoke(&func, name, params)
    }

    /// Calls a function resolved earlier with [`Access::func`], for loops
    /// that would otherwise look it up and type-check it on every call.
    fn invoke<P, R>(
        &mut self,
        func: &TypedFunc<P, R>,
        name: &str,
        params: P,
    ) -> Result<R, SnapshotError>
    where
        P: wasmtime::component::ComponentNamedList + wasmtime::component::Lower,
        R: wasmtime::component::ComponentNamedList + wasmtime::component::Lift,
    {
        func.call(self.store.as_context_mut(), params)
            .map_err(|e| SnapshotError::Failed(format!("accessor `{name}`: {e:#}")))
    }

    /// Passes `from..to` of memory `k` through the sink into `image`,
    /// keeping what `keep` says; gives `keep` back.
    fn dump(
        &mut self,
        k: usize,
        from: u64,
        to: u64,
        image: MemoryImage,
        keep: Keep,
    ) -> Result<(MemoryImage, Keep), SnapshotError> {
        let name = memory_accessor("dump", k);
        let dump = self.func::<(u32, u32), ()>(&name)?;
        self.store.data_mut().sink = Some(MemorySink::new(image, from, keep));
        let mut offset = from;
        let result = (|| {
            while offset < to {
                let span = (to - offset).min(DUMP_SPAN);
                self.invoke(&dump, &name, (offset as u32, span as u32))?;
                offset += span;
            }
            Ok(())
        })();
        let sink = self.store.data_mut().sink.take();
        result?;
        let sink = sink.ok_or_else(|| SnapshotError::Failed("the sink vanished".into()))?;
        Ok(sink.into_parts())
    }

    /// Reads every memory and global into an image.
    pub(crate) fn take(&mut self) -> Result<GuestImage, SnapshotError> {
        let (image, _) = self.take_with(None)?;
        Ok(image)
    }

    /// Reads every memory and global, the memories' bytes compressed into
    /// `spool` (one frame per memory, in order) rather than kept: the
    /// image's memories hold their runs but no data.
    pub(crate) fn take_into(&mut self, spool: Spool) -> Result<(GuestImage, Spool), SnapshotError> {
        let (image, spool) = self.take_with(Some(spool))?;
        Ok((image, spool.expect("take_with gives the spool back")))
    }

    fn take_with(
        &mut self,
        mut spool: Option<Spool>,
    ) -> Result<(GuestImage, Option<Spool>), SnapshotError> {
        let index = self.index;
        let spool_failed =
            |e: std::io::Error| SnapshotError::Failed(format!("writing the snapshot: {e}"));
        let mut image = GuestImage::default();
        for k in 0..index.layout.memories.len() {
            let (pages,): (u32,) = self.call(&memory_accessor("size", k), ())?;
            let len = u64::from(pages) * crate::snapshot::PAGE;
            // The ledger is read back below, so its (small) bytes are kept.
            let ledger = index.layout.replay.ledger_memory == Some(k);
            let memory = match spool.take() {
                Some(mut out) if !ledger => {
                    out.open_frame().map_err(spool_failed)?;
                    let memory = MemoryImage::with_pages(pages);
                    let (memory, keep) = self.dump(k, 0, len, memory, Keep::Spool(out))?;
                    let Keep::Spool(mut out) = keep else {
                        unreachable!("dump gives back what it was given")
                    };
                    out.close_frame().map_err(spool_failed)?;
                    spool = Some(out);
                    memory
                }
                out => {
                    let memory = MemoryImage::with_room(pages);
                    let (memory, _) = self.dump(k, 0, len, memory, Keep::Bytes)?;
                    if let Some(mut out) = out {
                        out.frame(&memory.data).map_err(spool_failed)?;
                        spool = Some(out);
                    }
                    memory
                }
            };
            image.memories.push(memory);
        }
        for (g, ty) in index.layout.globals.iter().enumerate() {
            let name = global_accessor("get", g);
            let value = match ty {
                wasmparser::ValType::I32 => GlobalValue::I32(self.call::<(), (i32,)>(&name, ())?.0),
                wasmparser::ValType::I64 => GlobalValue::I64(self.call::<(), (i64,)>(&name, ())?.0),
                wasmparser::ValType::F32 => {
                    GlobalValue::F32(self.call::<(), (f32,)>(&name, ())?.0.to_bits())
                }
                wasmparser::ValType::F64 => {
                    GlobalValue::F64(self.call::<(), (f64,)>(&name, ())?.0.to_bits())
                }
                other => {
                    return Err(SnapshotError::Failed(format!("global of type {other}")));
                }
            };
            image.globals.push(value);
        }
        self.check_handles(&image)?;
        if spool.is_some() {
            // Spooled images hold no data: the ledger's is in the spool too.
            for memory in &mut image.memories {
                memory.data = Vec::new();
            }
        }
        image.compute = self
            .store
            .data_mut()
            .compute
            .image()
            .map_err(|e| SnapshotError::Inexact(format!("compute state: {e}")))?;
        Ok((image, spool))
    }

    /// The handles the guest's ledger says it holds: index -> ledger code.
    /// `ledger` is the image of the ledger memory, when the component has
    /// one.
    fn ledger_entries(
        &self,
        ledger: Option<&MemoryImage>,
    ) -> Result<BTreeMap<u32, u32>, SnapshotError> {
        if self.index.layout.replay.ledger_memory.is_none() {
            return Ok(BTreeMap::new());
        }
        let memory =
            ledger.ok_or_else(|| SnapshotError::Mismatch("the handle ledger is missing".into()))?;
        if memory.read_u32(LEDGER_OVERFLOW.into()) != 0 {
            return Err(SnapshotError::Inexact(format!(
                "the guest has held a handle index above {LEDGER_SLOTS}, beyond what the \
                 handle ledger records"
            )));
        }
        let mut entries = BTreeMap::new();
        for (offset, bytes) in memory.runs() {
            for (i, word) in bytes.chunks_exact(4).enumerate() {
                let code = u32::from_le_bytes(word.try_into().unwrap());
                let slot = (offset / 4) as u32 + i as u32;
                if code != ledger::FREE && slot != 0 {
                    entries.insert(slot, code);
                }
            }
        }
        Ok(entries)
    }

    /// Every handle the guest holds must be one the ledger can replay.
    fn check_handles(&mut self, image: &GuestImage) -> Result<(), SnapshotError> {
        let ledger = self.index.layout.replay.ledger_memory;
        let recorded = self
            .ledger_entries(ledger.and_then(|k| image.memories.get(k)))?
            .len();
        let live = self.live_handles();
        if live != recorded {
            return Err(SnapshotError::Inexact(format!(
                "the guest holds {} WASI handle(s) across calls (open files, directory \
                 listings, streams or pollables) that a restore could not re-create; close them \
                 before the call returns, or checkpoint with the guest's own save()",
                live.saturating_sub(recorded).max(1)
            )));
        }
        Ok(())
    }

    /// Writes the snapshot `source` holds into this fresh instance: handles
    /// first (their acquisition allocates in guest memory), then memories a
    /// piece at a time, then globals and compute buffers.
    pub(crate) fn restore(&mut self, source: &mut dyn SnapshotSource) -> Result<(), SnapshotError> {
        self.check_fits(source.layout())?;
        self.store
            .data()
            .compute
            .check_burn_backend(source.burn_backend())
            .map_err(|e| SnapshotError::Failed(format!("restoring compute buffers: {e}")))?;
        // The ledger is read first and whole: the handles it lists are
        // re-acquired before any memory is written. It is one page at most.
        let ledger = match self.index.layout.replay.ledger_memory {
            Some(k) if source.layout().memories[k].run_bytes() > LEDGER_BYTES => {
                return Err(SnapshotError::Mismatch(
                    "its handle ledger is larger than a ledger can be".into(),
                ));
            }
            Some(k) => {
                let memory = read_memory(source, k).map_err(reading)?;
                let image = GuestImage {
                    memories: vec![memory],
                    ..GuestImage::default()
                };
                Some((k, image))
            }
            None => None,
        };
        let entries = self.ledger_entries(ledger.as_ref().map(|(_, image)| &image.memories[0]))?;
        self.replay_handles(&entries)?;
        for k in 0..source.layout().memories.len() {
            match &ledger {
                Some((ledger_k, image)) if *ledger_k == k => {
                    self.restore_memory(k, &mut ImageSource::new(image), 0)?;
                }
                _ => self.restore_memory(k, source, k)?,
            }
        }
        for (g, value) in source.layout().globals.clone().into_iter().enumerate() {
            let name = global_accessor("set", g);
            match value {
                GlobalValue::I32(v) => self.call::<(i32,), ()>(&name, (v,))?,
                GlobalValue::I64(v) => self.call::<(i64,), ()>(&name, (v,))?,
                GlobalValue::F32(v) => self.call::<(f32,), ()>(&name, (f32::from_bits(v),))?,
                GlobalValue::F64(v) => self.call::<(f64,), ()>(&name, (f64::from_bits(v),))?,
            }
        }
        let quota = self.store.data().compute.info().quota_bytes;
        let compute = source.compute(quota).map_err(reading)?;
        self.store
            .data_mut()
            .compute
            .restore(&compute)
            .map_err(|e| SnapshotError::Failed(format!("restoring compute buffers: {e}")))?;
        let live = self.live_handles();
        if live != entries.len() {
            return Err(SnapshotError::Failed(format!(
                "after restoring, the instance holds {live} handle(s) where the snapshot had {}",
                entries.len()
            )));
        }
        Ok(())
    }

    /// Resources the host's WASI table holds for this instance: one per
    /// handle the guest holds.
    fn live_handles(&mut self) -> usize {
        self.store.data_mut().table.iter_mut().count()
    }

    fn check_fits(&self, image: &GuestImage) -> Result<(), SnapshotError> {
        let layout = &self.index.layout;
        if image.memories.len() != layout.memories.len() {
            return Err(SnapshotError::Mismatch(format!(
                "it holds {} memories, the component has {}",
                image.memories.len(),
                layout.memories.len()
            )));
        }
        if image.globals.len() != layout.globals.len() {
            return Err(SnapshotError::Mismatch(format!(
                "it holds {} globals, the component has {}",
                image.globals.len(),
                layout.globals.len()
            )));
        }
        for (value, ty) in image.globals.iter().zip(&layout.globals) {
            let fits = matches!(
                (value, ty),
                (GlobalValue::I32(_), wasmparser::ValType::I32)
                    | (GlobalValue::I64(_), wasmparser::ValType::I64)
                    | (GlobalValue::F32(_), wasmparser::ValType::F32)
                    | (GlobalValue::F64(_), wasmparser::ValType::F64)
            );
            if !fits {
                return Err(SnapshotError::Mismatch("a global's type differs".into()));
            }
        }
        for memory in &image.memories {
            memory.validate_runs().map_err(SnapshotError::Mismatch)?;
        }
        Ok(())
    }

    /// Writes memory `from` of `source` into memory `k` of this instance:
    /// grows it to the snapshot's size, writes the runs a piece at a time
    /// and clears what lies between them.
    fn restore_memory(
        &mut self,
        k: usize,
        source: &mut dyn SnapshotSource,
        from: usize,
    ) -> Result<(), SnapshotError> {
        let (current,): (u32,) = self.call(&memory_accessor("size", k), ())?;
        let layout = &source.layout().memories[from];
        let pages = layout.pages;
        if current > pages {
            return Err(SnapshotError::Failed(format!(
                "memory {k} of the fresh instance has {current} pages, more than the \
                 snapshot's {pages}"
            )));
        }
        if pages > current {
            // Most of a dense block is about to be written: one huge-page
            // fault beats 512 small ones.
            let dense = layout
                .dense_blocks(super::memory::HUGE_PAGE as u64)
                .into_iter()
                .map(|span| span.start as usize..span.end as usize)
                .collect();
            let (old,): (i32,) = super::memory::growing_with_huge_pages(dense, || {
                self.call(&memory_accessor("grow", k), (pages - current,))
            })?;
            if old < 0 {
                let limit = self.store.data().limiter.hit;
                return Err(SnapshotError::Failed(match limit {
                    Some(hit) => format!("growing memory {k}: {hit}"),
                    None => format!("memory {k} could not grow to {pages} pages"),
                }));
            }
        }
        // Pages beyond the fresh size are zero already; below it, whatever
        // instantiation (and the handle replay) wrote must be cleared.
        let dirty = u64::from(current) * crate::snapshot::PAGE;
        let seek_name = memory_accessor("seek", k);
        let write_name = memory_accessor("write", k);
        let seek = self.func::<(u32,), ()>(&seek_name)?;
        let write = self.func::<(&[u8],), ()>(&write_name)?;
        let mut at = 0u64;
        source.open_memory(from).map_err(reading)?;
        while let Some((offset, bytes)) = source.next_piece().map_err(reading)? {
            if at < dirty && offset > at {
                self.clear(k, at, offset.min(dirty))?;
            }
            self.invoke(&seek, &seek_name, (offset as u32,))?;
            self.invoke(&write, &write_name, (bytes,))?;
            at = offset + bytes.len() as u64;
        }
        if at < dirty {
            self.clear(k, at, dirty)?;
        }
        Ok(())
    }

    /// Zeroes `from..to` of memory `k`. Only its non-zero chunks are
    /// written: zeroing a page the fresh instance never touched would fault
    /// it in, which costs far more than reading it.
    fn clear(&mut self, k: usize, from: u64, to: u64) -> Result<(), SnapshotError> {
        let (written, _) = self.dump(k, from, to, MemoryImage::with_pages(0), Keep::Runs)?;
        if written.runs.is_empty() {
            return Ok(());
        }
        let name = memory_accessor("zero", k);
        let zero = self.func::<(u32, u32), ()>(&name)?;
        for &(offset, len) in &written.runs {
            self.invoke(&zero, &name, (offset as u32, len as u32))?;
        }
        Ok(())
    }

    /// Re-acquires the handles in `entries` at the same indices. The
    /// component's handle table hands out the lowest free index last freed
    /// first (a LIFO free list, starting at 1), so: fill indices with
    /// fillers, then free each target index right before acquiring its
    /// resource, then drop the fillers. Every index is checked; a mismatch
    /// fails the restore instead of leaving a guest with wrong handles.
    fn replay_handles(&mut self, entries: &BTreeMap<u32, u32>) -> Result<(), SnapshotError> {
        let Some(&max) = entries.keys().next_back() else {
            return Ok(());
        };
        let available = self.index.layout.replay.available.clone();
        let has = |k: HandleImport| available.contains(&k);
        let max_preopen = entries
            .values()
            .filter(|&&c| (ledger::PREOPEN..ledger::POLL_OUTPUT).contains(&c))
            .map(|&c| c - ledger::PREOPEN)
            .max();
        // Spares above `max` let a preopen land at a chosen index: the
        // directories listed before it take the spares.
        let spares = max_preopen.unwrap_or(0);
        let mut held: BTreeMap<u32, Filler> = BTreeMap::new();
        while (held.len() as u32) < max + spares {
            for (index, filler) in self.acquire_filler(&has)? {
                if held.insert(index, filler).is_some() {
                    return Err(SnapshotError::Failed(format!(
                        "handle {index} was handed out twice while restoring"
                    )));
                }
            }
        }
        // Streams before the pollables subscribed to them.
        let ordered = entries
            .iter()
            .filter(|(_, c)| **c < ledger::POLL_OUTPUT)
            .chain(entries.iter().filter(|(_, c)| **c >= ledger::POLL_OUTPUT));
        for (&target, &code) in ordered {
            let filler = held.remove(&target).ok_or_else(|| {
                SnapshotError::Failed(format!("handle {target} was not reserved while restoring"))
            })?;
            self.drop_handle(target, filler)?;
            let landed = match code {
                ledger::STDOUT => self.acquire_one(HandleImport::GetStdout, &has)?,
                ledger::STDERR => self.acquire_one(HandleImport::GetStderr, &has)?,
                ledger::STDIN => self.acquire_one(HandleImport::GetStdin, &has)?,
                code if code >= ledger::POLL_OUTPUT => {
                    let stream = code - ledger::POLL_OUTPUT;
                    if !matches!(
                        entries.get(&stream),
                        Some(&(ledger::STDOUT | ledger::STDERR))
                    ) {
                        return Err(SnapshotError::Mismatch(format!(
                            "the handle ledger holds a pollable for handle {stream}, which is \
                             not a restorable stream"
                        )));
                    }
                    if !has(HandleImport::SubscribeOutput) {
                        return Err(SnapshotError::Mismatch(
                            "the ledger records a pollable, but the component cannot subscribe"
                                .into(),
                        ));
                    }
                    let subscribe = handle_accessor(HandleImport::SubscribeOutput);
                    self.call::<(u32,), (u32,)>(subscribe, (stream,))?.0
                }
                code if code >= ledger::PREOPEN => {
                    let j = code - ledger::PREOPEN;
                    // Free `j` spares above `max` so that entries 0..j land there.
                    let spare_indices: Vec<u32> = held
                        .range(max + 1..)
                        .map(|(i, _)| *i)
                        .take(j as usize)
                        .collect();
                    if spare_indices.len() < j as usize {
                        return Err(SnapshotError::Failed("ran out of spare handles".into()));
                    }
                    for index in spare_indices.iter().rev() {
                        let filler = held.remove(index).unwrap();
                        self.drop_handle(*index, filler)?;
                    }
                    let listed = self.acquire_preopens(&has)?;
                    if listed.len() <= j as usize {
                        return Err(SnapshotError::Mismatch(format!(
                            "the snapshot uses preopened directory #{j}, but this trial has {}",
                            listed.len()
                        )));
                    }
                    for (i, index) in listed.iter().enumerate() {
                        if i != j as usize {
                            held.insert(*index, Filler::Descriptor);
                        }
                    }
                    listed[j as usize]
                }
                other => {
                    return Err(SnapshotError::Mismatch(format!(
                        "the handle ledger holds an unknown code {other:#x}"
                    )));
                }
            };
            if landed != target {
                return Err(SnapshotError::Failed(format!(
                    "handle {target} was re-acquired as {landed}"
                )));
            }
        }
        for (index, filler) in held.into_iter().rev() {
            self.drop_handle(index, filler)?;
        }
        Ok(())
    }

    fn acquire_one(
        &mut self,
        kind: HandleImport,
        has: &dyn Fn(HandleImport) -> bool,
    ) -> Result<u32, SnapshotError> {
        if !has(kind) {
            return Err(SnapshotError::Mismatch(format!(
                "the ledger records a handle from {kind:?}, which the component does not import"
            )));
        }
        Ok(self.call::<(), (u32,)>(handle_accessor(kind), ())?.0)
    }

    fn acquire_preopens(
        &mut self,
        has: &dyn Fn(HandleImport) -> bool,
    ) -> Result<Vec<u32>, SnapshotError> {
        if !has(HandleImport::GetDirectories) {
            return Err(SnapshotError::Mismatch(
                "the ledger records a preopened directory, but the component does not list them"
                    .into(),
            ));
        }
        let (n,): (u32,) = self.call(handle_accessor(HandleImport::GetDirectories), ())?;
        (0..n)
            .map(|j| Ok(self.call::<(u32,), (u32,)>(PREOPEN_HANDLE, (j,))?.0))
            .collect()
    }

    /// One round of filler acquisition, using whatever the guest imports.
    fn acquire_filler(
        &mut self,
        has: &dyn Fn(HandleImport) -> bool,
    ) -> Result<Vec<(u32, Filler)>, SnapshotError> {
        let single = [
            (HandleImport::GetStdout, Filler::Output),
            (HandleImport::GetStderr, Filler::Output),
            (HandleImport::GetStdin, Filler::Input),
        ];
        for (get, filler) in single {
            if has(get) && has(filler.drop()) {
                return Ok(vec![(self.acquire_one(get, has)?, filler)]);
            }
        }
        if has(HandleImport::GetDirectories) && has(Filler::Descriptor.drop()) {
            let listed = self.acquire_preopens(has)?;
            if !listed.is_empty() {
                return Ok(listed
                    .into_iter()
                    .map(|i| (i, Filler::Descriptor))
                    .collect());
            }
        }
        Err(SnapshotError::Failed(
            "the component imports no function that can re-create its handle table".into(),
        ))
    }

    fn drop_handle(&mut self, index: u32, filler: Filler) -> Result<(), SnapshotError> {
        self.call::<(u32,), ()>(handle_accessor(filler.drop()), (index,))
    }
}

/// What a temporarily held handle is, so it can be dropped with the right
/// resource type.
#[derive(Debug, Clone, Copy)]
enum Filler {
    Output,
    Input,
    Descriptor,
}

impl Filler {
    /// The import that releases this kind of handle.
    fn drop(self) -> HandleImport {
        match self {
            Filler::Output => HandleImport::DropOutputStream,
            Filler::Input => HandleImport::DropInputStream,
            Filler::Descriptor => HandleImport::DropDescriptor,
        }
    }
}
