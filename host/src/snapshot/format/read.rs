//! Reading snapshot files without holding them.
//!
//! [`SnapshotFile::open`] reads a file once, start to end, to verify its
//! checksum or MAC; on the way it keeps the header and notes where each
//! payload frame lies, with a hash of the frame's own bytes. Nothing else is
//! kept, so describing a checkpoint costs its header. Frames are read later,
//! on demand: a memory piece by piece into a buffer of [`PIECE`] bytes, so a
//! restore holds the guest's memory and little else. Each frame is hashed
//! again as it is read and refused ([`ReadError::Changed`]) if it differs
//! from what was verified: no byte is used that the checksum did not cover,
//! even when the file changes underneath.

use std::fs::File;
use std::io::{self, BufRead, BufReader, Read, Seek, SeekFrom};
use std::path::Path;

use super::{
    ComputeHeader, FLAG_GUEST, FLAG_KEYED, FORMAT_VERSION, FORMAT_VERSION_BURN,
    FORMAT_VERSION_PLAIN, FormatError, GlobalValueJson, Header, MAGIC, MAX_COMPUTE,
    MAX_GUEST_STATE, MAX_HEADER, MAX_MEMORY_PAGES, Payload, ReadError, SnapshotKey, SnapshotMeta,
    TRAILER, ZSTD_MAX_RATIO,
};
use crate::compute::ComputeImage;
use crate::compute::burn::{BurnBackend, BurnImage};
use crate::snapshot::image::{GlobalValue, GuestImage, MemoryImage, PAGE};

/// Most bytes of memory [`SnapshotFile::next_piece`] hands over at once.
pub const PIECE: usize = 1 << 20;
/// Bytes read from the file at once.
const READ_BUFFER: usize = 1 << 20;

/// More payload frames than any snapshot holds: one per memory (a component
/// has at most 16), one per compute buffer (at most
/// [`crate::compute::MAX_BUFFERS`]) and one for a burn session. The scan
/// lists frames before the MAC is checked, so an unbounded count would let
/// a file of empty frames take the host's memory.
pub(super) const MAX_FRAMES: usize = 1 << 17;
const _: () = assert!(MAX_FRAMES > 16 + crate::compute::MAX_BUFFERS + 1);

/// A verified snapshot file: its metadata and layout in memory, its payload
/// on disk until asked for.
pub struct SnapshotFile<R = File> {
    /// `None` while a frame is being read (its reader holds it), and after
    /// a read failed.
    source: Option<R>,
    meta: SnapshotMeta,
    contents: Contents,
    /// A memory being read by [`SnapshotFile::next_piece`].
    reading: Option<Reading<R>>,
    piece: Vec<u8>,
}

/// What the payload holds, as the header describes it.
enum Contents {
    /// The guest's own `save()` bytes: their frame and length.
    Guest { frame: Frame, len: u64 },
    /// A host snapshot: the image without its data (memories' `data` and
    /// the compute buffers are empty), each memory's frame, and the compute
    /// buffers' numbers, lengths and frames.
    Memory {
        layout: GuestImage,
        frames: Vec<Frame>,
        compute: Option<Box<ComputeFrames>>,
    },
}

struct ComputeFrames {
    next_buffer: u32,
    next_pipeline: u32,
    /// `(number, elements, frame)` of each buffer.
    buffers: Vec<(u32, u64, Frame)>,
    /// `(bytes, frame)` of the trial's burn session, the kind of backend
    /// that held it, and the quota it held.
    burn: Option<(u64, Frame, BurnBackend, Option<u64>)>,
}

/// Where one payload frame's bytes lie, and their hash as verified.
#[derive(Debug, Clone, Copy)]
struct Frame {
    at: u64,
    len: u64,
    hash: blake3::Hash,
}

/// A memory's frame being decompressed, and how far its runs are filled.
struct Reading<R> {
    memory: usize,
    decoder: FrameDecoder<R>,
    run: usize,
    within: u64,
}

impl SnapshotFile<File> {
    /// Opens and verifies the snapshot file at `path`. `component` is the
    /// digest of the component it must belong to; `key`, when given, makes
    /// a MAC mandatory.
    pub fn open(
        path: &Path,
        component: &str,
        key: Option<&SnapshotKey>,
    ) -> Result<Self, ReadError> {
        Self::new(File::open(path).map_err(ReadError::Io)?, component, key)
    }
}

impl<R: Read + Seek> SnapshotFile<R> {
    /// Verifies the snapshot in `source` (read from its start to its end)
    /// and reads its header; see [`SnapshotFile::open`].
    pub fn new(
        mut source: R,
        component: &str,
        key: Option<&SnapshotKey>,
    ) -> Result<Self, ReadError> {
        let len = source.seek(SeekFrom::End(0)).map_err(ReadError::Io)?;
        source.seek(SeekFrom::Start(0)).map_err(ReadError::Io)?;
        let mut start = [0u8; 16];
        let got = read_up_to(&mut source, &mut start).map_err(ReadError::Io)?;
        if got < MAGIC.len() || &start[..MAGIC.len()] != MAGIC {
            return Err(FormatError::NotASnapshot.into());
        }
        if got < 12 {
            return Err(FormatError::Truncated.into());
        }
        let version = u32::from_le_bytes(start[8..12].try_into().unwrap());
        if ![FORMAT_VERSION_PLAIN, FORMAT_VERSION, FORMAT_VERSION_BURN].contains(&version) {
            return Err(FormatError::Version(version).into());
        }
        if got < 16 || len < (16 + TRAILER) as u64 {
            return Err(FormatError::Truncated.into());
        }
        let flags = u32::from_le_bytes(start[12..16].try_into().unwrap());

        // Verify before parsing anything: every later check then runs on
        // bytes the writer produced.
        let keyed = flags & FLAG_KEYED != 0;
        let hasher = match (keyed, key) {
            (true, None) => return Err(FormatError::KeyRequired.into()),
            (true, Some(key)) => blake3::Hasher::new_keyed(&key.0),
            (false, _) => blake3::Hasher::new(),
        };
        source.seek(SeekFrom::Start(0)).map_err(ReadError::Io)?;
        let body_len = len - TRAILER as u64;
        let (scanned, hash) = Scan::run(&mut source, body_len, hasher).map_err(ReadError::Io)?;
        let mut trailer = [0u8; TRAILER];
        source.read_exact(&mut trailer).map_err(ReadError::Io)?;
        if hash != blake3::Hash::from_bytes(trailer) {
            return Err(match (keyed, key) {
                (true, _) => FormatError::Authentication,
                (false, Some(_)) => FormatError::Checksum,
                (false, None) => scanned.truncation().unwrap_or(FormatError::Checksum),
            }
            .into());
        }
        if !keyed && key.is_some() {
            return Err(FormatError::Unauthenticated.into());
        }
        if flags & !(FLAG_KEYED | FLAG_GUEST) != 0 {
            return Err(malformed(format!("unknown flags {flags:#x}")));
        }
        let (meta, contents) = scanned.parse(version, flags, body_len, component)?;
        Ok(Self {
            source: Some(source),
            meta,
            contents,
            reading: None,
            piece: Vec::new(),
        })
    }

    /// What the snapshot belongs to.
    pub fn meta(&self) -> &SnapshotMeta {
        &self.meta
    }

    /// Whether this is a host snapshot ([`Payload::Memory`]) rather than
    /// the guest's own `save()` bytes.
    pub fn is_host_snapshot(&self) -> bool {
        matches!(self.contents, Contents::Memory { .. })
    }

    /// Reads the guest's own `save()` bytes; `None` for a host snapshot.
    /// Refuses, before reading them, more than `most` bytes (the trial's
    /// memory limit: the guest must hold them to take them back).
    pub fn guest_state(&mut self, most: u64) -> Result<Option<Vec<u8>>, ReadError> {
        let Contents::Guest { frame, len } = self.contents else {
            return Ok(None);
        };
        if len > most {
            return Err(malformed(format!(
                "the guest state holds {len} bytes, more than the trial's memory limit of {most}"
            )));
        }
        let capacity = usize::try_from(len)
            .ok()
            .filter(|&c| c <= MAX_GUEST_STATE)
            .ok_or_else(|| malformed("guest state too large".into()))?;
        let data = self.read_frame(frame, capacity, "guest state")?;
        if data.len() as u64 != len {
            return Err(malformed(
                "guest state length differs from the header".into(),
            ));
        }
        Ok(Some(data))
    }

    /// Reads the whole payload into memory.
    pub fn into_payload(mut self) -> Result<(SnapshotMeta, Payload), ReadError> {
        if let Some(state) = self.guest_state(u64::MAX)? {
            return Ok((self.meta, Payload::Guest(state)));
        }
        let mut image = self.layout().clone();
        for (k, memory) in image.memories.iter_mut().enumerate() {
            let frame_len = match &self.contents {
                Contents::Memory { frames, .. } => frames[k].len,
                Contents::Guest { .. } => unreachable!("a guest checkpoint has no memories"),
            };
            // Reserve no more than the frame can produce: a few bytes of
            // frame may claim gigabytes of runs.
            let most = frame_len.saturating_mul(ZSTD_MAX_RATIO as u64);
            memory.data = Vec::with_capacity(memory.run_bytes().min(most) as usize);
            self.open_memory(k)?;
            while let Some((_, bytes)) = self.next_piece()? {
                memory.data.extend_from_slice(bytes);
            }
        }
        image.compute = self.compute(u64::MAX)?;
        Ok((self.meta, Payload::Memory(image)))
    }

    /// Decompresses frame `frame`, which may hold at most `capacity` bytes,
    /// reserving no more than the frame can produce: `capacity` comes from
    /// the header, and a few bytes of frame claiming gigabytes must not make
    /// the host reserve them (or abort when it cannot).
    fn read_frame(
        &mut self,
        frame: Frame,
        capacity: usize,
        what: &str,
    ) -> Result<Vec<u8>, ReadError> {
        let reader = self.frame_reader(frame)?;
        let mut decoder = zstd::stream::read::Decoder::new(reader).map_err(ReadError::Io)?;
        let most =
            usize::try_from(frame.len.saturating_mul(ZSTD_MAX_RATIO as u64)).unwrap_or(usize::MAX);
        let mut data = Vec::with_capacity(capacity.min(most));
        let read = (&mut decoder)
            .take(capacity as u64 + 1)
            .read_to_end(&mut data);
        if let Err(err) = read {
            return Err(frame_failure(&mut decoder, what, Some(err), None));
        }
        if data.len() > capacity {
            let longer = malformed(format!("{what}: longer than the header says"));
            return Err(frame_failure(&mut decoder, what, None, Some(longer)));
        }
        self.source = Some(decoder.finish().into_inner().finish(what)?);
        Ok(data)
    }

    /// Takes the source and places it at `frame`.
    fn frame_reader(&mut self, frame: Frame) -> Result<FrameReader<R>, ReadError> {
        if let Some(reading) = self.reading.take() {
            // A memory left half read: its frame is abandoned, unchecked.
            self.source = Some(reading.decoder.finish().into_inner().source);
        }
        let mut source = self.source.take().ok_or_else(|| {
            ReadError::Io(io::Error::other("an earlier read of this snapshot failed"))
        })?;
        source
            .seek(SeekFrom::Start(frame.at))
            .map_err(ReadError::Io)?;
        Ok(FrameReader {
            source,
            left: frame.len,
            hasher: blake3::Hasher::new(),
            expected: frame.hash,
            cut: false,
        })
    }
}

/// Reading a host snapshot's memories a piece at a time, and its compute
/// buffers: what [`crate::snapshot::SnapshotSource`] asks of a file.
impl<R: Read + Seek> SnapshotFile<R> {
    /// The memories' sizes and runs and the globals (no data); empty for a
    /// guest checkpoint.
    pub fn layout(&self) -> &GuestImage {
        static NONE: GuestImage = GuestImage {
            memories: Vec::new(),
            globals: Vec::new(),
            compute: ComputeImage {
                next_buffer: 0,
                next_pipeline: 0,
                buffers: Vec::new(),
                burn: None,
            },
        };
        match &self.contents {
            Contents::Memory { layout, .. } => layout,
            Contents::Guest { .. } => &NONE,
        }
    }

    /// Starts reading memory `k`'s stored bytes (its runs, in order).
    pub fn open_memory(&mut self, k: usize) -> Result<(), ReadError> {
        let frame = match &self.contents {
            Contents::Memory { frames, .. } => frames.get(k).copied(),
            Contents::Guest { .. } => None,
        }
        .ok_or_else(|| malformed(format!("there is no memory {k}")))?;
        let reader = self.frame_reader(frame)?;
        let decoder = zstd::stream::read::Decoder::new(reader).map_err(ReadError::Io)?;
        if self.piece.is_empty() {
            self.piece = vec![0; PIECE];
        }
        self.reading = Some(Reading {
            memory: k,
            decoder,
            run: 0,
            within: 0,
        });
        Ok(())
    }

    /// The next piece of the memory opened last: its offset and bytes (at
    /// most [`PIECE`]); `None` once its runs are filled and its frame was
    /// found to hold exactly that, as verified.
    pub fn next_piece(&mut self) -> Result<Option<(u64, &[u8])>, ReadError> {
        let Contents::Memory { layout, .. } = &self.contents else {
            return Ok(None);
        };
        let Some(reading) = self.reading.as_mut() else {
            return Ok(None);
        };
        let runs = &layout.memories[reading.memory].runs;
        let Some(&(offset, len)) = runs.get(reading.run) else {
            // Every run is filled: the frame must hold nothing more.
            let mut probe = [0u8; 1];
            match reading.decoder.read(&mut probe) {
                Ok(0) => {}
                Ok(_) => {
                    let longer =
                        malformed("memory run lengths do not add up to the stored bytes".into());
                    return Err(frame_failure(&mut reading.decoder, "", None, Some(longer)));
                }
                Err(err) => {
                    return Err(frame_failure(
                        &mut reading.decoder,
                        "memory data",
                        Some(err),
                        None,
                    ));
                }
            }
            let reading = self.reading.take().expect("checked above");
            self.source = Some(
                reading
                    .decoder
                    .finish()
                    .into_inner()
                    .finish("memory data")?,
            );
            return Ok(None);
        };
        let at = offset + reading.within;
        let n = (len - reading.within).min(PIECE as u64) as usize;
        let piece = &mut self.piece[..n];
        if let Err(err) = reading.decoder.read_exact(piece) {
            let shorter = (err.kind() == io::ErrorKind::UnexpectedEof)
                .then(|| malformed("memory run lengths do not add up to the stored bytes".into()));
            return Err(frame_failure(
                &mut reading.decoder,
                "memory data",
                Some(err),
                shorter,
            ));
        }
        reading.within += n as u64;
        if reading.within == len {
            reading.run += 1;
            reading.within = 0;
        }
        Ok(Some((at, &self.piece[..n])))
    }

    /// The kind of backend that held the trial's burn session, if it has
    /// one (from the header: nothing is read).
    pub fn burn_backend(&self) -> Option<BurnBackend> {
        match &self.contents {
            Contents::Memory {
                compute: Some(compute),
                ..
            } => compute.burn.map(|(_, _, backend, _)| backend),
            _ => None,
        }
    }

    /// The trial's host compute buffers.
    /// Refuses, before reading any, buffers whose lengths add up past
    /// `quota` (the trial's compute memory): the header's lengths are the
    /// file's word until each buffer is read.
    pub fn compute(&mut self, quota: u64) -> Result<ComputeImage, ReadError> {
        let Contents::Memory {
            compute: Some(compute),
            ..
        } = &self.contents
        else {
            return Ok(ComputeImage::default());
        };
        let (next_buffer, next_pipeline) = (compute.next_buffer, compute.next_pipeline);
        let burn_frame = compute.burn;
        let wanted = compute.buffers.clone();
        let total = wanted.iter().fold(0u64, |sum, (_, elements, _)| {
            sum.saturating_add(elements.saturating_mul(4))
        });
        if total > quota {
            return Err(malformed(format!(
                "compute buffers: they hold {total} bytes, past the trial's compute memory quota \
                 of {quota}"
            )));
        }
        let mut buffers = Vec::with_capacity(wanted.len());
        for (id, elements, frame) in wanted {
            let len = (elements * 4) as usize;
            let bytes = self.read_frame(frame, len, "compute buffers")?;
            if bytes.len() != len {
                return Err(malformed(
                    "compute buffers: a buffer's length differs from the header".into(),
                ));
            }
            buffers.push((id, bytemuck::pod_collect_to_vec::<u8, f32>(&bytes)));
        }
        let burn = match burn_frame {
            Some((len, frame, backend, set_aside)) => {
                let bytes = self.read_frame(frame, len as usize, "the burn session")?;
                if bytes.len() as u64 != len {
                    return Err(malformed(
                        "the burn session: its length differs from the header".into(),
                    ));
                }
                Some(BurnImage {
                    backend,
                    bytes,
                    set_aside,
                })
            }
            None => None,
        };
        Ok(ComputeImage {
            next_buffer,
            next_pipeline,
            buffers,
            burn,
        })
    }
}

fn malformed(why: String) -> ReadError {
    ReadError::Format(FormatError::Malformed(why))
}

type FrameDecoder<R> = zstd::stream::read::Decoder<'static, BufReader<FrameReader<R>>>;

/// Why a frame's data did not decode as the header says: the file's error
/// when reading it failed; [`ReadError::Changed`] when the frame's bytes
/// are no longer the ones verified (a changed byte usually breaks the
/// decompression before the frame's hash is complete); otherwise `err`, the
/// data's fault, or `io` from the decompressor, described as `what`'s.
fn frame_failure<R: Read>(
    decoder: &mut FrameDecoder<R>,
    what: &str,
    io: Option<io::Error>,
    err: Option<ReadError>,
) -> ReadError {
    let reader = decoder.get_mut().get_mut();
    if reader.cut {
        return ReadError::Io(io.unwrap_or_else(|| io::Error::other("reading failed")));
    }
    if reader.drain_changed() {
        return ReadError::Changed;
    }
    match (err, io) {
        (Some(err), _) => err,
        (None, Some(io)) => malformed(format!("{what}: {io}")),
        (None, None) => malformed(format!("{what}: cannot be decompressed")),
    }
}

/// Reads one frame's bytes, hashing them on the way.
struct FrameReader<R> {
    source: R,
    left: u64,
    hasher: blake3::Hasher,
    expected: blake3::Hash,
    /// Reading the file failed, or it ended early.
    cut: bool,
}

impl<R: Read> Read for FrameReader<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.left == 0 {
            return Ok(0);
        }
        let most = buf
            .len()
            .min(usize::try_from(self.left).unwrap_or(usize::MAX));
        let n = match self.source.read(&mut buf[..most]) {
            Ok(0) => {
                self.cut = true;
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "the snapshot file got shorter while it was read",
                ));
            }
            Ok(n) => n,
            Err(err) => {
                self.cut = true;
                return Err(err);
            }
        };
        self.hasher.update(&buf[..n]);
        self.left -= n as u64;
        Ok(n)
    }
}

impl<R: Read> FrameReader<R> {
    /// Reads the rest of the frame; whether its bytes differ from those
    /// verified (`false` when that cannot be told).
    fn drain_changed(&mut self) -> bool {
        let mut sink = vec![0u8; 64 << 10];
        while self.left > 0 {
            if self.read(&mut sink).is_err() {
                return false;
            }
        }
        self.hasher.finalize() != self.expected
    }
}

impl<R> FrameReader<R> {
    /// The source back, once the whole frame was read and matches what was
    /// verified.
    fn finish(self, what: &str) -> Result<R, ReadError> {
        if self.left != 0 {
            return Err(malformed(format!(
                "{what}: bytes after the compressed data"
            )));
        }
        if self.hasher.finalize() != self.expected {
            return Err(ReadError::Changed);
        }
        Ok(self.source)
    }
}

/// Reads as much of `buf` as `source` holds.
fn read_up_to(source: &mut impl Read, buf: &mut [u8]) -> io::Result<usize> {
    let mut got = 0;
    while got < buf.len() {
        match source.read(&mut buf[got..]) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(err) if err.kind() == io::ErrorKind::Interrupted => {}
            Err(err) => return Err(err),
        }
    }
    Ok(got)
}

/// What the verifying pass noted of a file's body, trusted only once the
/// trailer matched.
#[derive(Default)]
struct Scanned {
    header_len: Option<u32>,
    /// The header, when its length is acceptable and it fits in the body.
    header: Option<Vec<u8>>,
    header_fits: bool,
    payload_len: Option<u64>,
    payload_fits: bool,
    payload_end: u64,
    /// The payload's frames, in order, up to the first that runs past the
    /// payload's end.
    frames: Vec<Frame>,
    /// Whether the frames fill the payload exactly.
    frames_tile: bool,
}

impl Scanned {
    /// A body whose own lengths run past its end was cut short, which says
    /// more than "checksum mismatch".
    fn truncation(&self) -> Option<FormatError> {
        self.header_len?;
        let cut = !self.header_fits || (self.payload_len.is_some() && !self.payload_fits);
        cut.then_some(FormatError::Truncated)
    }

    /// The metadata and layout the verified header and frames describe.
    fn parse(
        self,
        version: u32,
        flags: u32,
        body_len: u64,
        component: &str,
    ) -> Result<(SnapshotMeta, Contents), ReadError> {
        let header_len = self.header_len.ok_or(FormatError::Truncated)?;
        if header_len as usize > MAX_HEADER {
            return Err(malformed("header too large".into()));
        }
        let header = self.header.ok_or(FormatError::Truncated)?;
        let header: Header =
            serde_json::from_slice(&header).map_err(|e| malformed(format!("header: {e}")))?;
        if header.meta.component != component {
            return Err(FormatError::Foreign {
                expected: component.into(),
                found: header.meta.component,
            }
            .into());
        }
        if self.payload_len.is_none() || !self.payload_fits {
            return Err(FormatError::Truncated.into());
        }
        if self.payload_end != body_len {
            return Err(malformed("trailing bytes after the payload".into()));
        }
        let mut frames = self.frames.into_iter();
        let mut next_frame = || frames.next().ok_or(FormatError::Truncated);

        if flags & FLAG_GUEST != 0 {
            if !header.memories.is_empty() || !header.globals.is_empty() || header.compute.is_some()
            {
                return Err(malformed(
                    "a guest checkpoint lists memories or compute buffers".into(),
                ));
            }
            let frame = next_frame()?;
            if header.data_len > MAX_GUEST_STATE as u64 {
                return Err(malformed("guest state too large".into()));
            }
            if frames.next().is_some() || !self.frames_tile {
                return Err(malformed(
                    "guest state length differs from the header".into(),
                ));
            }
            let contents = Contents::Guest {
                frame,
                len: header.data_len,
            };
            return Ok((header.meta, contents));
        }

        let mut layout = GuestImage::default();
        let mut memory_frames = Vec::with_capacity(header.memories.len().min(1 << 10));
        for memory in header.memories {
            // Only 32-bit memories are snapshotted; the bound also caps what
            // reading one memory's data reserves, whatever its runs claim.
            if u64::from(memory.pages) > MAX_MEMORY_PAGES {
                return Err(malformed(
                    "a memory is larger than the 4 GiB a 32-bit memory addresses".into(),
                ));
            }
            memory_frames.push(next_frame()?);
            let expected = memory
                .runs
                .iter()
                .try_fold(0u64, |sum, &(_, len)| sum.checked_add(len));
            if expected.is_none_or(|e| e > u64::from(memory.pages) * PAGE) {
                return Err(malformed("memory runs exceed the memory".into()));
            }
            let image = MemoryImage {
                pages: memory.pages,
                runs: memory.runs,
                data: Vec::new(),
            };
            image.validate_runs().map_err(malformed)?;
            layout.memories.push(image);
        }
        let compute = match header.compute {
            None => None,
            Some(_) if version == FORMAT_VERSION_PLAIN => {
                return Err(malformed(format!(
                    "compute buffers in a version {version} file"
                )));
            }
            Some(compute) if compute.burn.is_some() && version != FORMAT_VERSION_BURN => {
                return Err(malformed(format!(
                    "a burn session in a version {version} file"
                )));
            }
            Some(compute) => Some(Box::new(compute_frames(compute, &mut next_frame)?)),
        };
        if frames.next().is_some() || !self.frames_tile {
            return Err(malformed("unused memory data".into()));
        }
        layout.globals = header
            .globals
            .into_iter()
            .map(|g| match g {
                GlobalValueJson::I32(v) => GlobalValue::I32(v),
                GlobalValueJson::I64(v) => GlobalValue::I64(v),
                GlobalValueJson::F32(v) => GlobalValue::F32(v),
                GlobalValueJson::F64(v) => GlobalValue::F64(v),
            })
            .collect();
        let stored: u64 = layout.memories.iter().map(MemoryImage::run_bytes).sum();
        if stored != header.data_len {
            return Err(malformed(
                "memory data length differs from the header".into(),
            ));
        }
        let contents = Contents::Memory {
            layout,
            frames: memory_frames,
            compute,
        };
        Ok((header.meta, contents))
    }
}

/// The compute buffers a header lists, with their frames.
fn compute_frames(
    header: ComputeHeader,
    next_frame: &mut impl FnMut() -> Result<Frame, FormatError>,
) -> Result<ComputeFrames, ReadError> {
    let bad = |why: &str| malformed(format!("compute buffers: {why}"));
    let mut total: u64 = 0;
    let mut previous = 0;
    let mut buffers = Vec::with_capacity(header.buffers.len().min(1 << 16));
    for (id, elements) in header.buffers {
        if id <= previous || id >= header.next_buffer {
            return Err(bad("numbers out of order or out of range"));
        }
        previous = id;
        // Each buffer is bounded like a live one, so no single allocation
        // exceeds what a trial could create.
        if elements.saturating_mul(4) > crate::compute::MAX_BUFFER_BYTES {
            return Err(bad("a buffer is larger than any backend allows"));
        }
        total += elements * 4;
        if total > MAX_COMPUTE {
            return Err(bad("too large"));
        }
        buffers.push((id, elements, next_frame()?));
    }
    if header.burn.is_none() && header.burn_backend.is_some() {
        return Err(bad("a burn backend named without a burn session"));
    }
    let burn = match header.burn {
        Some(len) => {
            total = total.saturating_add(len);
            if total > MAX_COMPUTE {
                return Err(bad("too large"));
            }
            let backend = header.burn_backend.unwrap_or(BurnBackend::Cpu);
            Some((len, next_frame()?, backend, header.burn_set_aside))
        }
        None => None,
    };
    Ok(ComputeFrames {
        next_buffer: header.next_buffer,
        next_pipeline: header.next_pipeline,
        buffers,
        burn,
    })
}

/// The verifying pass: hashes the body (`body_len` bytes from the source's
/// start) and notes its structure on the way.
struct Scan<'a, R> {
    reader: BufReader<io::Take<&'a mut R>>,
    hasher: blake3::Hasher,
    at: u64,
    len: u64,
}

impl<'a, R: Read> Scan<'a, R> {
    fn run(
        source: &'a mut R,
        body_len: u64,
        hasher: blake3::Hasher,
    ) -> io::Result<(Scanned, blake3::Hash)> {
        let mut scan = Scan {
            reader: BufReader::with_capacity(READ_BUFFER, source.take(body_len)),
            hasher,
            at: 0,
            len: body_len,
        };
        let mut scanned = Scanned::default();
        scan.pass(16, None)?;
        scanned.header_len = scan.u32()?;
        if let Some(header_len) = scanned.header_len {
            scanned.header_fits = scan.at + u64::from(header_len) <= scan.len;
            if scanned.header_fits {
                if header_len as usize <= MAX_HEADER {
                    scanned.header = scan.bytes(header_len as usize)?;
                } else {
                    scan.pass(header_len.into(), None)?;
                }
                scanned.payload_len = scan.u64()?;
            }
        }
        if let Some(payload_len) = scanned.payload_len {
            let end = scan.at.checked_add(payload_len);
            scanned.payload_fits = end.is_some_and(|end| end <= scan.len);
            scanned.payload_end = end.unwrap_or(u64::MAX);
        }
        if scanned.payload_fits {
            scanned.frames_tile = true;
            while scan.at < scanned.payload_end {
                let fits =
                    |at: u64, n: u64| at.checked_add(n).is_some_and(|e| e <= scanned.payload_end);
                if !fits(scan.at, 8) {
                    scanned.frames_tile = false;
                    break;
                }
                let len = scan.u64()?.expect("the payload fits in the body");
                if !fits(scan.at, len) || scanned.frames.len() == MAX_FRAMES {
                    scanned.frames_tile = false;
                    break;
                }
                let at = scan.at;
                let mut hasher = blake3::Hasher::new();
                scan.pass(len, Some(&mut hasher))?;
                scanned.frames.push(Frame {
                    at,
                    len,
                    hash: hasher.finalize(),
                });
            }
        }
        scan.pass(scan.len - scan.at, None)?;
        Ok((scanned, scan.hasher.finalize()))
    }

    /// Hashes the next `n` bytes, also into `frame` when given.
    fn pass(&mut self, n: u64, mut frame: Option<&mut blake3::Hasher>) -> io::Result<()> {
        let mut left = n.min(self.len - self.at);
        while left > 0 {
            let buf = self.reader.fill_buf()?;
            if buf.is_empty() {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "the snapshot file got shorter while it was read",
                ));
            }
            let take = buf.len().min(usize::try_from(left).unwrap_or(usize::MAX));
            self.hasher.update(&buf[..take]);
            if let Some(frame) = frame.as_mut() {
                frame.update(&buf[..take]);
            }
            self.reader.consume(take);
            left -= take as u64;
            self.at += take as u64;
        }
        Ok(())
    }

    /// The next `n` bytes, or `None` (and nothing read) when the body ends
    /// first.
    fn bytes(&mut self, n: usize) -> io::Result<Option<Vec<u8>>> {
        if self.at + n as u64 > self.len {
            return Ok(None);
        }
        let mut out = vec![0; n];
        self.reader.read_exact(&mut out)?;
        self.hasher.update(&out);
        self.at += n as u64;
        Ok(Some(out))
    }

    fn u32(&mut self) -> io::Result<Option<u32>> {
        Ok(self
            .bytes(4)?
            .map(|b| u32::from_le_bytes(b.try_into().unwrap())))
    }

    fn u64(&mut self) -> io::Result<Option<u64>> {
        Ok(self
            .bytes(8)?
            .map(|b| u64::from_le_bytes(b.try_into().unwrap())))
    }
}
