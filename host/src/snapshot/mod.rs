//! Host-taken snapshots of a trainable's state, with no help from the guest.
//!
//! A component's state between calls is its core instances' linear memories
//! and mutable globals, plus the WASI handles it holds. At load time
//! [`instrument`] rewrites the component so that the host can read and write
//! that state through a hidden accessor instance (and so that handle
//! acquisitions are recorded in a ledger inside the guest's own state); the
//! sandbox then turns a live instance into a [`GuestImage`] (or straight
//! into a file) and a [`SnapshotSource`] (a file read as it goes, or an
//! image) back into a live instance. Components whose state cannot
//! be captured exactly are refused with a [`SnapshotRefusal`] naming the
//! cause; they still run, and can checkpoint through their own `save()`.
//!
//! Nothing here names wasmtime types: the rewrite works on bytes, and the
//! image is plain data.

mod component;
mod format;
mod image;
mod module;
mod refusal;
mod source;
mod spool;

pub use component::{
    ACCESS_EXPORT, Instrumented, Layout, MemoryInfo, PREOPEN_HANDLE, Replay, SINK_IMPORT,
    global_accessor, handle_accessor, instrument, memory_accessor,
};
pub use format::{
    FORMAT_VERSION, FormatError, MAGIC, PIECE, Payload, ReadError, SnapshotFile, SnapshotKey,
    SnapshotMeta, decode, encode, read, write, write_spooled,
};
pub use image::{CHUNK, GlobalValue, GuestImage, MemoryImage, PAGE};
pub use module::{HandleImport, LEDGER_OVERFLOW, LEDGER_SLOTS, ledger};
pub use refusal::SnapshotRefusal;
pub use source::{ImageSource, SnapshotSource};
pub use spool::{Spool, SpoolStorage};
