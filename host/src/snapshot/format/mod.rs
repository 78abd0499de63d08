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
//!                          host compute buffers' (one frame each), then the
//!                          trial's burn session (one frame, opaque: the
//!                          burn worker's image); or the guest's saved
//!                          bytes (one frame)
//! trailer      32 bytes    blake3 of everything above, keyed when flag 0 is set
//! ```
//!
//! Zero chunks are not stored at all (see [`super::GuestImage`]), so a large
//! memory that is mostly untouched heap costs next to nothing on disk.
//!
//! Files are written ([`write`]) and read ([`read`]) as streams: neither
//! side holds a whole file, or a second copy of a guest's memory, in memory.

mod read;
mod write;

use std::fmt;
use std::path::Path;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::image::GuestImage;
use crate::compute::burn::BurnBackend;

pub use read::{PIECE, SnapshotFile};
pub use write::{encode, write, write_spooled};

/// First bytes of every snapshot file.
pub const MAGIC: &[u8; 8] = b"WTSNAP\r\n";
/// The version this build writes for snapshots that hold host compute
/// buffers and no burn session; it reads this one,
/// [`FORMAT_VERSION_PLAIN`] and [`FORMAT_VERSION_BURN`].
pub const FORMAT_VERSION: u32 = 2;
/// The version written when the trial holds a burn session on the host,
/// so that builds from before it refuse such files instead of restoring
/// the trial without its tensors.
pub const FORMAT_VERSION_BURN: u32 = 3;
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

impl SnapshotMeta {
    /// The last result it holds, taken out: `None` when there is none (or
    /// it is not a JSON object).
    pub fn take_result(&mut self) -> Option<serde_json::Map<String, Value>> {
        match self.result.take() {
            Value::Object(map) => Some(map),
            _ => None,
        }
    }
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

    /// The key derived from the bytes of `file` (`snapshot_key_file`),
    /// which must hold at least 16 bytes of secret.
    pub fn from_file(file: &Path) -> Result<Self, String> {
        let secret = std::fs::read(file)
            .map_err(|e| format!("snapshot_key_file {}: {e}", file.display()))?;
        if secret.len() < 16 {
            return Err(format!(
                "snapshot_key_file {} holds {} bytes; use at least 16 bytes of secret",
                file.display(),
                secret.len()
            ));
        }
        Ok(Self::derive(&secret))
    }

    /// The MAC of `bytes` under a key derived from this one for `purpose`
    /// (a fixed string naming what is authenticated), so that no MAC made
    /// for one kind of file verifies as another's.
    pub fn purpose_mac(&self, purpose: &str, bytes: &[u8]) -> blake3::Hash {
        blake3::keyed_hash(&blake3::derive_key(purpose, &self.0), bytes)
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
                 {FORMAT_VERSION_PLAIN} to {FORMAT_VERSION_BURN})"
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

/// The first 12 characters of a digest, for a message; the file's own
/// may be anything, so cut at a character.
fn short(digest: &str) -> &str {
    digest
        .char_indices()
        .nth(12)
        .map_or(digest, |(end, _)| &digest[..end])
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
    /// Bytes of the trial's burn session, whose frame follows the
    /// buffers' (format version 3).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    burn: Option<u64>,
    /// The kind of backend that held it; absent from files written before
    /// burn ran on GPUs, whose sessions were all on the CPU backend.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    burn_backend: Option<BurnBackend>,
    /// The bytes of the trial's compute quota its burn session held;
    /// absent from files written before it was carried.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    burn_set_aside: Option<u64>,
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

/// Why a snapshot file could not be read.
#[derive(Debug)]
pub enum ReadError {
    /// The file could not be read.
    Io(std::io::Error),
    /// Its content was rejected.
    Format(FormatError),
    /// A part of the file read after it was verified differs from what was
    /// verified: it was changed while being read.
    Changed,
}

impl fmt::Display for ReadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ReadError::Io(e) => write!(f, "{e}"),
            ReadError::Format(e) => write!(f, "{e}"),
            ReadError::Changed => f.write_str(
                "the snapshot file changed while it was being read; nothing of it was used",
            ),
        }
    }
}

impl std::error::Error for ReadError {}

impl ReadError {
    /// Whether the file itself is damaged (cut short, corrupted, not a
    /// snapshot at all), rather than unreadable as things stand: written
    /// with another key, for another component or format version, or the
    /// read failed. Only damage lets a resume fall back to an older file.
    pub fn is_damage(&self) -> bool {
        match self {
            ReadError::Format(err) => matches!(
                err,
                FormatError::NotASnapshot
                    | FormatError::Truncated
                    | FormatError::Checksum
                    | FormatError::Malformed(_)
            ),
            ReadError::Io(err) => err.kind() == std::io::ErrorKind::UnexpectedEof,
            ReadError::Changed => false,
        }
    }
}

impl From<FormatError> for ReadError {
    fn from(err: FormatError) -> Self {
        ReadError::Format(err)
    }
}

/// Decodes and verifies a snapshot file held in memory. `component` is the
/// digest of the component it must belong to; `key`, when given, makes a
/// MAC mandatory.
pub fn decode(
    bytes: &[u8],
    component: &str,
    key: Option<&SnapshotKey>,
) -> Result<(SnapshotMeta, Payload), FormatError> {
    SnapshotFile::new(std::io::Cursor::new(bytes), component, key)
        .and_then(SnapshotFile::into_payload)
        .map_err(|err| match err {
            ReadError::Format(err) => err,
            // Bytes in memory neither fail to read nor change.
            ReadError::Io(_) => FormatError::Truncated,
            ReadError::Changed => FormatError::Checksum,
        })
}

/// Reads and verifies a whole snapshot file into memory; see
/// [`SnapshotFile`] to read one without holding it.
pub fn read(
    path: &Path,
    component: &str,
    key: Option<&SnapshotKey>,
) -> Result<(SnapshotMeta, Payload), ReadError> {
    SnapshotFile::open(path, component, key)?.into_payload()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::compute::ComputeImage;
    use crate::compute::burn::BurnImage;
    use crate::snapshot::image::{GlobalValue, MemoryImage};

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

    /// `file` with the first `from` in its header replaced by `to`, its
    /// header length and plain checksum made to fit, as someone forging it
    /// would.
    fn with_header_edited(file: &[u8], from: &[u8], to: &[u8]) -> Vec<u8> {
        let at = file.windows(from.len()).position(|w| w == from).unwrap();
        let mut edited = file[..at].to_vec();
        edited.extend_from_slice(to);
        edited.extend_from_slice(&file[at + from.len()..]);
        let header_len = u32::from_le_bytes(edited[16..20].try_into().unwrap());
        let header_len = header_len as usize + to.len() - from.len();
        edited[16..20].copy_from_slice(&(header_len as u32).to_le_bytes());
        rechecksum(&mut edited);
        edited
    }

    /// Recomputes a file's plain checksum after its bytes were changed, as
    /// someone forging it would.
    fn rechecksum(file: &mut [u8]) {
        let body = file.len() - TRAILER;
        let sum = blake3::hash(&file[..body]);
        file[body..].copy_from_slice(sum.as_bytes());
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
            burn: None,
        };
        let payload = Payload::Memory(image);
        let bytes = encode(&meta, &payload, None);
        assert_eq!(bytes[8..12], FORMAT_VERSION.to_le_bytes());
        let (_, read) = decode(&bytes, &meta.component, None).unwrap();
        assert_eq!(read, payload);

        // Numbers out of order, behind a valid checksum, are refused.
        let forged = with_header_edited(&bytes, b"[[2,1000],[7,2]]", b"[[7,1000],[2,2]]");
        assert_eq!(
            decode(&forged, &meta.component, None).unwrap_err(),
            FormatError::Malformed("compute buffers: numbers out of order or out of range".into())
        );

        // Nor may it name a burn backend without a burn session.
        let forged = with_header_edited(
            &bytes,
            b"[[2,1000],[7,2]]",
            b"[[2,1000],[7,2]],\"burn_backend\":\"cpu\"",
        );
        assert_eq!(
            decode(&forged, &meta.component, None).unwrap_err(),
            FormatError::Malformed(
                "compute buffers: a burn backend named without a burn session".into()
            )
        );
    }

    #[test]
    fn a_burn_session_round_trips_in_version_3_only() {
        let (meta, payload) = sample();
        let Payload::Memory(mut image) = payload else {
            unreachable!()
        };
        image.compute = ComputeImage {
            next_buffer: 3,
            next_pipeline: 1,
            buffers: vec![(2, vec![0.5; 10])],
            burn: Some(BurnImage {
                backend: BurnBackend::Gpu,
                bytes: b"the worker's image".to_vec(),
                set_aside: Some(1 << 20),
            }),
        };
        let payload = Payload::Memory(image);
        let bytes = encode(&meta, &payload, None);
        assert_eq!(bytes[8..12], FORMAT_VERSION_BURN.to_le_bytes());
        let (_, read) = decode(&bytes, &meta.component, None).unwrap();
        assert_eq!(read, payload);

        // A version 2 file may not carry one.
        let mut forged = bytes.clone();
        forged[8..12].copy_from_slice(&FORMAT_VERSION.to_le_bytes());
        rechecksum(&mut forged);
        assert_eq!(
            decode(&forged, &meta.component, None).unwrap_err(),
            FormatError::Malformed("a burn session in a version 2 file".into())
        );

        // Files from before burn ran on GPUs name no backend: their
        // sessions were all on burn's CPU backend.
        let older = with_header_edited(&bytes, b",\"burn_backend\":\"gpu\"", b"");
        let older = with_header_edited(&older, b",\"burn_set_aside\":1048576", b"");
        let (_, Payload::Memory(read)) = decode(&older, &meta.component, None).unwrap() else {
            unreachable!()
        };
        let burn = read.compute.burn.unwrap();
        assert_eq!(burn.backend, BurnBackend::Cpu);
        assert_eq!(burn.bytes, b"the worker's image");
        assert_eq!(burn.set_aside, None);
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
        future[8] = 4;
        assert_eq!(
            decode(&future, &meta.component, None),
            Err(FormatError::Version(4))
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
        forged[12] = 0; // clear the keyed flag
        rechecksum(&mut forged);
        assert_eq!(
            decode(&forged, &meta.component, Some(&key)),
            Err(FormatError::Unauthenticated)
        );
    }

    /// A version 1 file with `flags` whose header lists `memories` (as JSON)
    /// and `data_len`, with a frame of one byte for each memory (for the
    /// guest state with [`FLAG_GUEST`]), behind a valid checksum.
    fn forged(meta: &SnapshotMeta, flags: u32, memories: Value, data_len: u64) -> Vec<u8> {
        forged_with(meta, flags, memories, data_len, 0)
    }

    /// [`forged`], with `empty` frames of no bytes after the others.
    fn forged_with(
        meta: &SnapshotMeta,
        flags: u32,
        memories: Value,
        data_len: u64,
        empty: usize,
    ) -> Vec<u8> {
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
        for _ in 0..empty {
            payload.extend_from_slice(&0u64.to_le_bytes());
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
    fn frames_past_any_snapshot_are_not_listed() {
        // Frames are listed while the MAC is computed, before anything in
        // the file is trusted: empty ones cost 8 bytes of file each and 48
        // of the host's memory, so their number is bounded above what any
        // trial can hold.
        let (meta, _) = sample();
        let memory = serde_json::json!([{"pages": 1, "runs": [[0, 1]]}]);
        let bytes = forged_with(&meta, 0, memory, 1, read::MAX_FRAMES + 1);
        assert!(matches!(
            decode(&bytes, &meta.component, None),
            Err(FormatError::Malformed(_))
        ));
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
        // A frame can produce at most ZSTD_MAX_RATIO bytes per byte, which
        // leaves room for the most compressible data at the strongest level.
        let zeros = vec![0u8; 16 << 20];
        for level in [1, 19] {
            let frame = zstd::bulk::compress(&zeros, level).unwrap();
            assert!(zeros.len() <= frame.len() * ZSTD_MAX_RATIO, "level {level}");
            let payload = Payload::Guest(zeros.clone());
            let bytes = encode(&meta, &payload, None);
            assert_eq!(decode(&bytes, &meta.component, None).unwrap().1, payload);
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
