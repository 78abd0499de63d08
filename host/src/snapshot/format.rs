//! The snapshot file: a host snapshot plus what it belongs to, versioned,
//! compressed and checksummed.
//!
//! ```text
//! "WTSNAP\r\n"              8 bytes magic (the CR/LF catch text-mode mangling)
//! version      u32 LE      FORMAT_VERSION
//! flags        u32 LE      bit 0: the trailer is keyed (an HMAC-like MAC)
//!                          bit 1: the payload is the guest's own `save()` bytes
//! header_len   u32 LE
//! header       JSON        SnapshotMeta + memory sizes and runs + globals
//! payload_len  u64 LE
//! payload      zstd        the runs' bytes, all memories, in order, then the
//!                          host compute buffers' (one frame each); or the
//!                          guest's saved bytes (one frame)
//! trailer      32 bytes    blake3 of everything above, keyed when flag 0 is set
//! ```
//!
//! Zero chunks are not stored at all (see [`super::GuestImage`]), so a large
//! memory that is mostly untouched heap costs next to nothing on disk.

use std::fmt;
use std::io::Write;
use std::path::Path;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::image::{GlobalValue, GuestImage, MemoryImage};
use super::spool::{Spool, SpoolStorage};
use crate::compute::ComputeImage;

/// First bytes of every snapshot file.
pub const MAGIC: &[u8; 8] = b"WTSNAP\r\n";
/// The version this build writes for snapshots that hold host compute
/// buffers; it reads this one and [`FORMAT_VERSION_PLAIN`].
pub const FORMAT_VERSION: u32 = 2;
/// The version written when there are no compute buffers, so that builds
/// from before host compute still read those files.
pub const FORMAT_VERSION_PLAIN: u32 = 1;
/// Most compute-buffer bytes a snapshot may describe.
const MAX_COMPUTE: u64 = 16 << 30;
const FLAG_KEYED: u32 = 1;
const FLAG_GUEST: u32 = 2;
const TRAILER: usize = 32;
/// Largest header accepted (a header lists memory runs, so it can be long).
const MAX_HEADER: usize = 256 << 20;
/// Largest guest `save()` state accepted: a guest's state cannot exceed the
/// 4 GiB a 32-bit memory addresses.
const MAX_GUEST_STATE: usize = 4 << 30;
/// Most pages of a memory in a snapshot: host snapshots refuse 64-bit
/// memories, so each is at most 4 GiB.
const MAX_MEMORY_PAGES: u64 = 1 << 16;
/// Most bytes one byte of a zstd frame decompresses to: a block yields at
/// most 128 KiB and takes at least 4 bytes (a 3-byte header and one byte of
/// RLE content; RFC 8878, section 3.1.1.2).
const ZSTD_MAX_RATIO: usize = 32 << 10;

/// What a snapshot belongs to.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SnapshotMeta {
    /// blake3 hex digest of the component (as loaded, before instrumentation).
    pub component: String,
    /// The trial's id.
    pub trial_id: String,
    /// The trial's config.
    pub config: Value,
    /// `train()` calls completed when the snapshot was taken.
    pub iteration: u64,
    /// Fuel the trial had burned.
    pub fuel_total: u64,
    /// Seconds the trial had spent training.
    #[serde(default)]
    pub time_total_s: f64,
    /// The trial's last result when the checkpoint was taken (a JSON
    /// object, or null), so a checkpoint describes itself.
    #[serde(default)]
    pub result: Value,
}

/// What a checkpoint file holds.
#[derive(Debug, Clone, PartialEq)]
pub enum Payload {
    /// A host snapshot of the guest's memories and globals.
    Memory(GuestImage),
    /// The bytes the guest's own `save()` returned.
    Guest(Vec<u8>),
}

impl Payload {
    /// Which kind of checkpoint this is, as users name it in the config.
    pub fn kind(&self) -> &'static str {
        match self {
            Payload::Memory(_) => "snapshot",
            Payload::Guest(_) => "guest",
        }
    }
}

/// A secret key for authenticated snapshots (keyed blake3, used as a MAC).
#[derive(Clone)]
pub struct SnapshotKey([u8; 32]);

impl SnapshotKey {
    /// Derives a key from secret material of any length (a passphrase, a
    /// key file's bytes).
    pub fn derive(secret: &[u8]) -> Self {
        Self(blake3::derive_key("wtune snapshot key v1", secret))
    }
}

impl fmt::Debug for SnapshotKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("SnapshotKey(..)")
    }
}

/// Why a snapshot file was rejected.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FormatError {
    /// The bytes do not start with [`MAGIC`].
    NotASnapshot,
    /// Written by another format version.
    Version(u32),
    /// Shorter than its own lengths say.
    Truncated,
    /// The checksum does not match: the file is corrupted or was modified.
    Checksum,
    /// The MAC does not match: modified, or a different key.
    Authentication,
    /// The file has no MAC but this reader requires one.
    Unauthenticated,
    /// The file has a MAC but no key was given.
    KeyRequired,
    /// The snapshot belongs to another component.
    Foreign { expected: String, found: String },
    /// Structurally wrong content behind a valid checksum.
    Malformed(String),
}

impl fmt::Display for FormatError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FormatError::NotASnapshot => f.write_str("not a wtune snapshot file"),
            FormatError::Version(v) => write!(
                f,
                "snapshot format version {v} is not supported (this build reads versions \
                 {FORMAT_VERSION_PLAIN} and {FORMAT_VERSION})"
            ),
            FormatError::Truncated => f.write_str("the snapshot file is truncated"),
            FormatError::Checksum => f.write_str(
                "the snapshot's checksum does not match: the file is corrupted or was modified",
            ),
            FormatError::Authentication => f.write_str(
                "the snapshot's MAC does not match: it was modified, or written with another key",
            ),
            FormatError::Unauthenticated => f.write_str(
                "the snapshot carries no MAC, but a snapshot key is configured; refusing it",
            ),
            FormatError::KeyRequired => f.write_str(
                "the snapshot is authenticated with a key; configure the snapshot key to read it",
            ),
            FormatError::Foreign { expected, found } => write!(
                f,
                "the snapshot belongs to another component (its digest {}, this one {})",
                short(found),
                short(expected)
            ),
            FormatError::Malformed(why) => write!(f, "the snapshot is malformed: {why}"),
        }
    }
}

impl std::error::Error for FormatError {}

fn short(digest: &str) -> &str {
    &digest[..digest.len().min(12)]
}

#[derive(Serialize, Deserialize)]
struct Header {
    #[serde(flatten)]
    meta: SnapshotMeta,
    memories: Vec<MemoryHeader>,
    globals: Vec<GlobalValueJson>,
    /// Uncompressed payload length.
    data_len: u64,
    /// The trial's host compute buffers (format version 2).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    compute: Option<ComputeHeader>,
}

#[derive(Serialize, Deserialize)]
struct ComputeHeader {
    next_buffer: u32,
    /// Absent from snapshots taken before pipeline numbers were carried.
    #[serde(default)]
    next_pipeline: u32,
    /// `(number, elements)` of each buffer, in the payload's order.
    buffers: Vec<(u32, u64)>,
}

#[derive(Serialize, Deserialize)]
struct MemoryHeader {
    pages: u32,
    runs: Vec<(u64, u64)>,
}

#[derive(Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
enum GlobalValueJson {
    I32(i32),
    I64(i64),
    F32(u32),
    F64(u64),
}

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
                header: header(meta, &GuestImage::default(), bytes.len() as u64),
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
    let data_len = image.memories.iter().map(MemoryImage::run_bytes).sum();
    let version = if image.compute.is_empty() {
        FORMAT_VERSION_PLAIN
    } else {
        FORMAT_VERSION
    };
    Ok(Parts {
        version,
        flags: flags(key, 0),
        header: header(meta, image, data_len),
        spool,
        key: key.map(|k| k.0),
    })
}

fn flags(key: Option<&SnapshotKey>, payload: u32) -> u32 {
    payload | if key.is_some() { FLAG_KEYED } else { 0 }
}

/// The JSON header: `meta`, the memories' sizes and runs, the globals and
/// the compute buffers' sizes of `image`, and `data_len`.
fn header(meta: &SnapshotMeta, image: &GuestImage, data_len: u64) -> Vec<u8> {
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

/// Decodes and verifies a snapshot file. `component` is the digest of the
/// component it must belong to; `key`, when given, makes a MAC mandatory.
pub fn decode(
    bytes: &[u8],
    component: &str,
    key: Option<&SnapshotKey>,
) -> Result<(SnapshotMeta, Payload), FormatError> {
    if bytes.len() < MAGIC.len() || &bytes[..MAGIC.len()] != MAGIC {
        return Err(FormatError::NotASnapshot);
    }
    let mut cursor = Cursor {
        bytes,
        at: MAGIC.len(),
    };
    let version = cursor.u32()?;
    if version != FORMAT_VERSION && version != FORMAT_VERSION_PLAIN {
        return Err(FormatError::Version(version));
    }
    let flags = cursor.u32()?;
    if bytes.len() < cursor.at + TRAILER {
        return Err(FormatError::Truncated);
    }
    // Verify before parsing anything else: every later check then runs on
    // bytes the writer produced.
    let (body, trailer) = bytes.split_at(bytes.len() - TRAILER);
    let keyed = flags & FLAG_KEYED != 0;
    match (keyed, key) {
        (true, None) => return Err(FormatError::KeyRequired),
        (false, Some(_)) => {
            if blake3::hash(body).as_bytes() != trailer {
                return Err(FormatError::Checksum);
            }
            return Err(FormatError::Unauthenticated);
        }
        (true, Some(key)) => {
            if blake3::keyed_hash(&key.0, body)
                != blake3::Hash::from_bytes(trailer.try_into().unwrap())
            {
                return Err(FormatError::Authentication);
            }
        }
        (false, None) => {
            if blake3::hash(body) != blake3::Hash::from_bytes(trailer.try_into().unwrap()) {
                return Err(check_truncation(body, cursor.at).unwrap_or(FormatError::Checksum));
            }
        }
    }
    if flags & !(FLAG_KEYED | FLAG_GUEST) != 0 {
        return Err(FormatError::Malformed(format!("unknown flags {flags:#x}")));
    }
    let cursor = &mut Cursor {
        bytes: body,
        at: cursor.at,
    };
    let header_len = cursor.u32()? as usize;
    if header_len > MAX_HEADER {
        return Err(FormatError::Malformed("header too large".into()));
    }
    let header: Header = serde_json::from_slice(cursor.take(header_len)?)
        .map_err(|e| FormatError::Malformed(format!("header: {e}")))?;
    if header.meta.component != component {
        return Err(FormatError::Foreign {
            expected: component.into(),
            found: header.meta.component,
        });
    }
    let payload_len = cursor.u64()? as usize;
    let mut payload = Cursor {
        bytes: cursor.take(payload_len)?,
        at: 0,
    };
    if cursor.at != body.len() {
        return Err(FormatError::Malformed(
            "trailing bytes after the payload".into(),
        ));
    }

    if flags & FLAG_GUEST != 0 {
        if !header.memories.is_empty() || !header.globals.is_empty() || header.compute.is_some() {
            return Err(FormatError::Malformed(
                "a guest checkpoint lists memories or compute buffers".into(),
            ));
        }
        let frame_len = payload.u64()? as usize;
        let frame = payload.take(frame_len)?;
        let capacity = usize::try_from(header.data_len)
            .ok()
            .filter(|&c| c <= MAX_GUEST_STATE)
            .ok_or_else(|| FormatError::Malformed("guest state too large".into()))?;
        let data = decompress(frame, capacity)
            .map_err(|e| FormatError::Malformed(format!("guest state: {e}")))?;
        if data.len() as u64 != header.data_len || payload.at != payload.bytes.len() {
            return Err(FormatError::Malformed(
                "guest state length differs from the header".into(),
            ));
        }
        return Ok((header.meta, Payload::Guest(data)));
    }
    let mut image = GuestImage::default();
    for memory in header.memories {
        // Only 32-bit memories are snapshotted; the bound also caps what
        // one memory's data reserves below, whatever its runs claim.
        if u64::from(memory.pages) > MAX_MEMORY_PAGES {
            return Err(FormatError::Malformed(
                "a memory is larger than the 4 GiB a 32-bit memory addresses".into(),
            ));
        }
        let expected = memory
            .runs
            .iter()
            .try_fold(0u64, |sum, &(_, len)| sum.checked_add(len));
        let frame_len = payload.u64()? as usize;
        let frame = payload.take(frame_len)?;
        let capacity = expected
            .and_then(|e| usize::try_from(e).ok())
            .filter(|&c| c as u64 <= u64::from(memory.pages) * super::PAGE)
            .ok_or_else(|| FormatError::Malformed("memory runs exceed the memory".into()))?;
        let data = decompress(frame, capacity)
            .map_err(|e| FormatError::Malformed(format!("memory data: {e}")))?;
        let image_memory = MemoryImage {
            pages: memory.pages,
            runs: memory.runs,
            data,
        };
        image_memory.validate().map_err(FormatError::Malformed)?;
        image.memories.push(image_memory);
    }
    if let Some(compute) = header.compute {
        if version != FORMAT_VERSION {
            return Err(FormatError::Malformed(format!(
                "compute buffers in a version {version} file"
            )));
        }
        image.compute = decode_compute(compute, &mut payload)?;
    }
    if payload.at != payload.bytes.len() {
        return Err(FormatError::Malformed("unused memory data".into()));
    }
    image.globals = header
        .globals
        .into_iter()
        .map(|g| match g {
            GlobalValueJson::I32(v) => GlobalValue::I32(v),
            GlobalValueJson::I64(v) => GlobalValue::I64(v),
            GlobalValueJson::F32(v) => GlobalValue::F32(v),
            GlobalValueJson::F64(v) => GlobalValue::F64(v),
        })
        .collect();
    if image.stored_bytes() != header.data_len {
        return Err(FormatError::Malformed(
            "memory data length differs from the header".into(),
        ));
    }
    Ok((header.meta, Payload::Memory(image)))
}

/// The compute buffers a header lists, from their frames.
fn decode_compute(
    header: ComputeHeader,
    payload: &mut Cursor<'_>,
) -> Result<ComputeImage, FormatError> {
    let malformed = |why: &str| FormatError::Malformed(format!("compute buffers: {why}"));
    let mut total: u64 = 0;
    let mut previous = 0;
    let mut buffers = Vec::with_capacity(header.buffers.len().min(1 << 16));
    for (id, elements) in header.buffers {
        if id <= previous || id >= header.next_buffer {
            return Err(malformed("numbers out of order or out of range"));
        }
        previous = id;
        // Each buffer is bounded like a live one, so no single allocation
        // exceeds what a trial could create.
        if elements.saturating_mul(4) > crate::compute::MAX_BUFFER_BYTES {
            return Err(malformed("a buffer is larger than any backend allows"));
        }
        total += elements * 4;
        if total > MAX_COMPUTE {
            return Err(malformed("too large"));
        }
        let frame_len = payload.u64()? as usize;
        let frame = payload.take(frame_len)?;
        let bytes =
            decompress(frame, (elements * 4) as usize).map_err(|e| malformed(&e.to_string()))?;
        if bytes.len() as u64 != elements * 4 {
            return Err(malformed("a buffer's length differs from the header"));
        }
        buffers.push((id, bytemuck::pod_collect_to_vec::<u8, f32>(&bytes)));
    }
    Ok(ComputeImage {
        next_buffer: header.next_buffer,
        next_pipeline: header.next_pipeline,
        buffers,
    })
}

/// Decompresses `frame`, which may hold at most `capacity` bytes, reserving
/// no more than the frame can produce: `capacity` comes from the header, and
/// a few bytes of frame claiming gigabytes must not make the host reserve
/// them (or abort when it cannot).
fn decompress(frame: &[u8], capacity: usize) -> std::io::Result<Vec<u8>> {
    let most = frame.len().saturating_mul(ZSTD_MAX_RATIO);
    zstd::bulk::decompress(frame, capacity.min(most))
}

/// A body whose own lengths run past its end was cut short, which says more
/// than "checksum mismatch".
fn check_truncation(body: &[u8], at: usize) -> Option<FormatError> {
    let cursor = &mut Cursor { bytes: body, at };
    let header_len = cursor.u32().ok()? as usize;
    if cursor.take(header_len).is_err() {
        return Some(FormatError::Truncated);
    }
    let payload_len = cursor.u64().ok()? as usize;
    if cursor.take(payload_len).is_err() {
        return Some(FormatError::Truncated);
    }
    None
}

struct Cursor<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], FormatError> {
        let end = self.at.checked_add(n).ok_or(FormatError::Truncated)?;
        let slice = self.bytes.get(self.at..end).ok_or(FormatError::Truncated)?;
        self.at = end;
        Ok(slice)
    }

    fn u32(&mut self) -> Result<u32, FormatError> {
        Ok(u32::from_le_bytes(self.take(4)?.try_into().unwrap()))
    }

    fn u64(&mut self) -> Result<u64, FormatError> {
        Ok(u64::from_le_bytes(self.take(8)?.try_into().unwrap()))
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

/// Why a snapshot file could not be read.
#[derive(Debug)]
pub enum ReadError {
    /// The file could not be read.
    Io(std::io::Error),
    /// Its content was rejected.
    Format(FormatError),
}

impl fmt::Display for ReadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ReadError::Io(e) => write!(f, "{e}"),
            ReadError::Format(e) => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for ReadError {}

/// Reads and verifies a snapshot file.
pub fn read(
    path: &Path,
    component: &str,
    key: Option<&SnapshotKey>,
) -> Result<(SnapshotMeta, Payload), ReadError> {
    let bytes = std::fs::read(path).map_err(ReadError::Io)?;
    decode(&bytes, component, key).map_err(ReadError::Format)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> (SnapshotMeta, Payload) {
        let mut memory = MemoryImage::with_pages(4);
        let mut bytes = vec![0u8; 4 * super::super::PAGE as usize];
        bytes[100..200].fill(7);
        bytes[70_000..70_010].fill(9);
        memory.push_contents(0, &bytes);
        let image = GuestImage {
            memories: vec![memory, MemoryImage::with_pages(1)],
            globals: vec![
                GlobalValue::I32(-5),
                GlobalValue::F64(f64::NAN.to_bits() | 3),
            ],
            compute: Default::default(),
        };
        let meta = SnapshotMeta {
            component: "ab".repeat(32),
            trial_id: "trial_0001".into(),
            config: serde_json::json!({"lr": 0.1}),
            iteration: 7,
            fuel_total: 12345,
            time_total_s: 1.5,
            result: serde_json::json!({"loss": 0.25}),
        };
        (meta, Payload::Memory(image))
    }

    #[test]
    fn compute_buffers_round_trip_in_version_2_only() {
        let (meta, payload) = sample();
        let plain = encode(&meta, &payload, None);
        assert_eq!(plain[8..12], FORMAT_VERSION_PLAIN.to_le_bytes());
        let Payload::Memory(mut image) = payload else {
            unreachable!()
        };
        image.compute = ComputeImage {
            next_buffer: 9,
            next_pipeline: 4,
            buffers: vec![(2, vec![1.5; 1000]), (7, vec![f32::NAN, -0.0])],
        };
        let payload = Payload::Memory(image);
        let bytes = encode(&meta, &payload, None);
        assert_eq!(bytes[8..12], FORMAT_VERSION.to_le_bytes());
        let (_, read) = decode(&bytes, &meta.component, None).unwrap();
        assert_eq!(read, payload);

        // Numbers out of order, behind a valid checksum, are refused.
        let at = bytes
            .windows(16)
            .position(|w| w == b"[[2,1000],[7,2]]")
            .unwrap();
        let mut forged = bytes.clone();
        forged[at..at + 16].copy_from_slice(b"[[7,1000],[2,2]]");
        let body = forged.len() - TRAILER;
        let sum = blake3::hash(&forged[..body]);
        forged[body..].copy_from_slice(sum.as_bytes());
        assert_eq!(
            decode(&forged, &meta.component, None).unwrap_err(),
            FormatError::Malformed("compute buffers: numbers out of order or out of range".into())
        );
    }

    #[test]
    fn configs_come_back_as_the_same_floats() {
        // A restore compares the stored config with the trial's: sampled
        // floats must survive JSON exactly (serde_json's float_roundtrip).
        let (mut meta, payload) = sample();
        let mut x = 0.123_456_789_012_345_67_f64;
        let values: Vec<f64> = (0..2000)
            .map(|i| {
                x = (x * 3.999_999_7 * (1.0 - x)).abs();
                x * 10f64.powi(i % 9 - 4)
            })
            .collect();
        meta.config = serde_json::json!({ "values": values });
        let bytes = encode(&meta, &payload, None);
        let (read, _) = decode(&bytes, &meta.component, None).unwrap();
        assert_eq!(read.config, meta.config);
    }

    #[test]
    fn guest_checkpoints_round_trip_and_are_checked_like_snapshots() {
        let (meta, _) = sample();
        let payload = Payload::Guest(b"model weights".repeat(100));
        let bytes = encode(&meta, &payload, None);
        assert_eq!(
            decode(&bytes, &meta.component, None).unwrap(),
            (meta.clone(), payload.clone())
        );
        for i in (0..bytes.len()).step_by(7) {
            let mut damaged = bytes.clone();
            damaged[i] ^= 0x20;
            assert!(decode(&damaged, &meta.component, None).is_err(), "byte {i}");
        }
        let empty = Payload::Guest(Vec::new());
        let bytes = encode(&meta, &empty, None);
        assert_eq!(decode(&bytes, &meta.component, None).unwrap().1, empty);
    }

    #[test]
    fn round_trips_exactly_and_stays_small() {
        let (meta, image) = sample();
        let bytes = encode(&meta, &image, None);
        assert!(bytes.len() < 2048, "{} bytes", bytes.len());
        assert_eq!(
            decode(&bytes, &meta.component, None).unwrap(),
            (meta, image)
        );
    }

    #[test]
    fn every_damaged_byte_is_detected() {
        let (meta, image) = sample();
        let bytes = encode(&meta, &image, None);
        for i in (0..bytes.len()).step_by(7) {
            let mut damaged = bytes.clone();
            damaged[i] ^= 0x20;
            assert!(decode(&damaged, &meta.component, None).is_err(), "byte {i}");
        }
    }

    #[test]
    fn truncation_foreign_and_version_are_named() {
        let (meta, image) = sample();
        let bytes = encode(&meta, &image, None);
        assert_eq!(
            decode(&bytes[..bytes.len() / 2], &meta.component, None),
            Err(FormatError::Truncated)
        );
        assert_eq!(
            decode(b"PK\x03\x04 zip", &meta.component, None),
            Err(FormatError::NotASnapshot)
        );
        let err = decode(&bytes, &"cd".repeat(32), None).unwrap_err();
        assert!(matches!(err, FormatError::Foreign { .. }), "{err}");
        let mut future = bytes.clone();
        future[8] = 3;
        assert_eq!(
            decode(&future, &meta.component, None),
            Err(FormatError::Version(3))
        );
    }

    #[test]
    fn keys_authenticate_and_are_enforced_both_ways() {
        let (meta, image) = sample();
        let key = SnapshotKey::derive(b"correct horse");
        let other = SnapshotKey::derive(b"battery staple");
        let signed = encode(&meta, &image, Some(&key));
        assert!(decode(&signed, &meta.component, Some(&key)).is_ok());
        assert_eq!(
            decode(&signed, &meta.component, Some(&other)),
            Err(FormatError::Authentication)
        );
        assert_eq!(
            decode(&signed, &meta.component, None),
            Err(FormatError::KeyRequired)
        );
        let plain = encode(&meta, &image, None);
        assert_eq!(
            decode(&plain, &meta.component, Some(&key)),
            Err(FormatError::Unauthenticated)
        );
        // An attacker who edits a keyed file and recomputes a plain checksum
        // still needs the key.
        let mut forged = signed.clone();
        let len = forged.len();
        forged[12] = 0; // clear the keyed flag
        let digest = blake3::hash(&forged[..len - 32]);
        forged[len - 32..].copy_from_slice(digest.as_bytes());
        assert_eq!(
            decode(&forged, &meta.component, Some(&key)),
            Err(FormatError::Unauthenticated)
        );
    }

    /// A version 1 file with `flags` whose header lists `memories` (as JSON)
    /// and `data_len`, with a frame of one byte for each memory (for the
    /// guest state with [`FLAG_GUEST`]), behind a valid checksum.
    fn forged(meta: &SnapshotMeta, flags: u32, memories: Value, data_len: u64) -> Vec<u8> {
        let frames = match flags & FLAG_GUEST {
            0 => memories.as_array().unwrap().len(),
            _ => 1,
        };
        let mut header = serde_json::to_value(meta).unwrap();
        header["memories"] = memories;
        header["globals"] = serde_json::json!([]);
        header["data_len"] = serde_json::json!(data_len);
        let header = serde_json::to_vec(&header).unwrap();
        let frame = zstd::bulk::compress(b"x", 1).unwrap();
        let mut payload = Vec::new();
        for _ in 0..frames {
            payload.extend_from_slice(&(frame.len() as u64).to_le_bytes());
            payload.extend_from_slice(&frame);
        }
        let mut out = MAGIC.to_vec();
        out.extend_from_slice(&FORMAT_VERSION_PLAIN.to_le_bytes());
        out.extend_from_slice(&flags.to_le_bytes());
        out.extend_from_slice(&(header.len() as u32).to_le_bytes());
        out.extend_from_slice(&header);
        out.extend_from_slice(&(payload.len() as u64).to_le_bytes());
        out.extend_from_slice(&payload);
        let sum = blake3::hash(&out);
        out.extend_from_slice(sum.as_bytes());
        out
    }

    #[test]
    fn claimed_memory_sizes_are_bounded_before_anything_is_reserved() {
        // Found with the `snapshot` fuzz target (fuzz/): run lengths whose
        // sum overflowed, and a memory of 2^32 - 1 pages whose runs made the
        // decoder reserve 16 TiB for a one-byte frame (an abort, not an
        // error).
        let (meta, _) = sample();
        let malformed =
            |memories: Value| match decode(&forged(&meta, 0, memories, 1), &meta.component, None) {
                Err(FormatError::Malformed(why)) => why,
                other => panic!("{other:?}"),
            };
        let half = 1u64 << 63;
        assert_eq!(
            malformed(serde_json::json!([{"pages": 1, "runs": [[0, half], [half, half]]}])),
            "memory runs exceed the memory"
        );
        assert_eq!(
            malformed(serde_json::json!([{"pages": u32::MAX, "runs": [[0, 1u64 << 44]]}])),
            "a memory is larger than the 4 GiB a 32-bit memory addresses"
        );
        // 4 GiB itself is a memory a snapshot may hold.
        let largest = forged(
            &meta,
            0,
            serde_json::json!([{"pages": 1 << 16, "runs": [[0, 1]]}]),
            1,
        );
        let (_, Payload::Memory(image)) = decode(&largest, &meta.component, None).unwrap() else {
            panic!("a memory snapshot expected")
        };
        assert_eq!(
            (image.memories[0].pages, image.memories[0].data.len()),
            (1 << 16, 1)
        );
    }

    #[test]
    fn a_small_frame_reserves_no_more_than_it_can_hold() {
        // Found with the `snapshot` fuzz target: a guest checkpoint of a few
        // hundred bytes whose header claimed 4 GiB of state made the decoder
        // reserve 4 GiB before reading its one-byte frame.
        let (meta, _) = sample();
        let claim = forged(&meta, FLAG_GUEST, serde_json::json!([]), 4 << 30);
        assert_eq!(
            decode(&claim, &meta.component, None),
            Err(FormatError::Malformed(
                "guest state length differs from the header".into()
            ))
        );
        let frame = zstd::bulk::compress(b"x", 1).unwrap();
        let data = decompress(&frame, MAX_GUEST_STATE).unwrap();
        assert_eq!(data, b"x");
        assert!(data.capacity() <= frame.len() * ZSTD_MAX_RATIO);
        // The bound leaves room for the most compressible data at the
        // strongest level.
        let zeros = vec![0u8; 16 << 20];
        for level in [1, 19] {
            let frame = zstd::bulk::compress(&zeros, level).unwrap();
            assert_eq!(decompress(&frame, zeros.len()).unwrap(), zeros);
        }
    }

    #[test]
    fn writes_atomically() {
        let (meta, image) = sample();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("checkpoint.wtsnap");
        write(&path, &meta, &image, None).unwrap();
        assert_eq!(read(&path, &meta.component, None).unwrap(), (meta, image));
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
    }
}
