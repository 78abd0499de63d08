//! Writing snapshot files: the payload is compressed into a [`Spool`]
//! first, then laid out behind the header with the checksum computed on the
//! way, so the host never holds the file, or a second copy of a guest's
//! memory, in memory.

use std::io::Write;
use std::path::Path;

use super::{
    ComputeHeader, FLAG_GUEST, FLAG_KEYED, FORMAT_VERSION, FORMAT_VERSION_BURN,
    FORMAT_VERSION_PLAIN, GlobalValueJson, Header, MAGIC, MemoryHeader, Payload, SnapshotKey,
    SnapshotMeta,
};
use crate::snapshot::image::{GlobalValue, GuestImage, MemoryImage};
use crate::snapshot::spool::{Spool, SpoolStorage};

/// Encodes a snapshot file's bytes.
pub fn encode(meta: &SnapshotMeta, payload: &Payload, key: Option<&SnapshotKey>) -> Vec<u8> {
    let mut out = Vec::new();
    spool_payload(meta, payload, key, Spool::in_memory())
        .and_then(|parts| parts.write_to(&mut out))
        .expect("encoding into memory cannot fail");
    out
}

/// Compresses `payload`'s bytes into `spool` and describes them.
fn spool_payload<S: SpoolStorage>(
    meta: &SnapshotMeta,
    payload: &Payload,
    key: Option<&SnapshotKey>,
    mut spool: Spool<S>,
) -> std::io::Result<Parts<S>> {
    match payload {
        Payload::Memory(image) => {
            // One frame per memory, as a spooled snapshot has them.
            for memory in &image.memories {
                spool.frame(&memory.data)?;
            }
            memory_parts(meta, image, key, spool)
        }
        Payload::Guest(bytes) => {
            spool.frame(bytes)?;
            Ok(Parts {
                version: FORMAT_VERSION_PLAIN,
                flags: flags(key, FLAG_GUEST),
                header: header_bytes(meta, &GuestImage::default(), bytes.len() as u64),
                spool,
                key: key.map(|k| k.0),
            })
        }
    }
}

/// Describes a host snapshot whose memories' bytes are in `spool` already
/// (one frame per memory, in order), and adds its compute buffers' frames.
fn memory_parts<S: SpoolStorage>(
    meta: &SnapshotMeta,
    image: &GuestImage,
    key: Option<&SnapshotKey>,
    mut spool: Spool<S>,
) -> std::io::Result<Parts<S>> {
    if spool.frames() != image.memories.len() {
        return Err(std::io::Error::other(format!(
            "the snapshot spool holds {} frame(s) for {} memories",
            spool.frames(),
            image.memories.len()
        )));
    }
    for (_, buffer) in &image.compute.buffers {
        spool.frame(bytemuck::cast_slice::<f32, u8>(buffer))?;
    }
    if let Some(burn) = &image.compute.burn {
        spool.frame(&burn.bytes)?;
    }
    let data_len = image.memories.iter().map(MemoryImage::run_bytes).sum();
    let version = if image.compute.burn.is_some() {
        FORMAT_VERSION_BURN
    } else if image.compute.is_empty() {
        FORMAT_VERSION_PLAIN
    } else {
        FORMAT_VERSION
    };
    Ok(Parts {
        version,
        flags: flags(key, 0),
        header: header_bytes(meta, image, data_len),
        spool,
        key: key.map(|k| k.0),
    })
}

fn flags(key: Option<&SnapshotKey>, payload: u32) -> u32 {
    payload | if key.is_some() { FLAG_KEYED } else { 0 }
}

/// The JSON header: `meta`, the memories' sizes and runs, the globals and
/// the compute buffers' sizes of `image`, and `data_len`.
fn header_bytes(meta: &SnapshotMeta, image: &GuestImage, data_len: u64) -> Vec<u8> {
    let header = Header {
        meta: meta.clone(),
        memories: image
            .memories
            .iter()
            .map(|m| MemoryHeader {
                pages: m.pages,
                runs: m.runs.clone(),
            })
            .collect(),
        globals: image
            .globals
            .iter()
            .map(|g| match *g {
                GlobalValue::I32(v) => GlobalValueJson::I32(v),
                GlobalValue::I64(v) => GlobalValueJson::I64(v),
                GlobalValue::F32(v) => GlobalValueJson::F32(v),
                GlobalValue::F64(v) => GlobalValueJson::F64(v),
            })
            .collect(),
        data_len,
        compute: (!image.compute.is_empty()).then(|| ComputeHeader {
            next_buffer: image.compute.next_buffer,
            next_pipeline: image.compute.next_pipeline,
            buffers: image
                .compute
                .buffers
                .iter()
                .map(|(id, b)| (*id, b.len() as u64))
                .collect(),
            burn: image.compute.burn.as_ref().map(|b| b.bytes.len() as u64),
            burn_backend: image.compute.burn.as_ref().map(|b| b.backend),
            burn_set_aside: image.compute.burn.as_ref().and_then(|b| b.set_aside),
        }),
    };
    serde_json::to_vec(&header).expect("snapshot headers always serialize")
}

/// A snapshot file's parts before they are laid out: its header, and its
/// payload's frames in a spool; written by [`Parts::write_to`] without the
/// frames ever being held in memory together.
struct Parts<S: SpoolStorage> {
    version: u32,
    flags: u32,
    header: Vec<u8>,
    spool: Spool<S>,
    key: Option<[u8; 32]>,
}

impl<S: SpoolStorage> Parts<S> {
    /// Writes the file's bytes to `out` (the checksum computed on the way)
    /// and returns how many there were.
    fn write_to(self, out: impl Write) -> std::io::Result<u64> {
        let hasher = match &self.key {
            Some(key) => blake3::Hasher::new_keyed(key),
            None => blake3::Hasher::new(),
        };
        let mut out = Hashing {
            out,
            hasher,
            written: 0,
        };
        out.write_all(MAGIC)?;
        out.write_all(&self.version.to_le_bytes())?;
        out.write_all(&self.flags.to_le_bytes())?;
        out.write_all(&(self.header.len() as u32).to_le_bytes())?;
        out.write_all(&self.header)?;
        out.write_all(&self.spool.laid_out_len().to_le_bytes())?;
        self.spool.copy_frames_to(&mut out)?;
        let trailer = out.hasher.finalize();
        out.out.write_all(trailer.as_bytes())?;
        out.out.flush()?;
        Ok(out.written + trailer.as_bytes().len() as u64)
    }
}

/// A writer that hashes what passes through it.
struct Hashing<W> {
    out: W,
    hasher: blake3::Hasher,
    written: u64,
}

impl<W: Write> Write for Hashing<W> {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        let n = self.out.write(bytes)?;
        self.hasher.update(&bytes[..n]);
        self.written += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.out.flush()
    }
}

/// Writes a snapshot file atomically (temporary file, fsync, rename). The
/// payload's bytes are compressed into a [`Spool`] beside `path` first, so
/// the host holds no second copy of them.
pub fn write(
    path: &Path,
    meta: &SnapshotMeta,
    payload: &Payload,
    key: Option<&SnapshotKey>,
) -> std::io::Result<u64> {
    let parts = spool_payload(meta, payload, key, Spool::beside(path)?)?;
    write_parts(path, parts)
}

/// Writes the host snapshot `image` atomically, as [`write`] does, when its
/// memories' bytes are in `spool` already, one frame per memory in order
/// (the memories' own `data` is not read): how the sandbox snapshots a
/// live instance without copying its memory.
pub fn write_spooled(
    path: &Path,
    meta: &SnapshotMeta,
    image: &GuestImage,
    spool: Spool,
    key: Option<&SnapshotKey>,
) -> std::io::Result<u64> {
    write_parts(path, memory_parts(meta, image, key, spool)?)
}

fn write_parts<S: SpoolStorage>(path: &Path, parts: Parts<S>) -> std::io::Result<u64> {
    let mut written = 0;
    crate::persist::write_atomic_with(path, |file| {
        written = parts.write_to(std::io::BufWriter::new(file))?;
        Ok(())
    })?;
    Ok(written)
}
