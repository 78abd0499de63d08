//! Where a restore reads a host snapshot from: a file read as it goes
//! ([`super::SnapshotFile`]) or an image in memory ([`ImageSource`]).
//!
//! A restore asks for one memory's contents at a time, in pieces of at most
//! [`PIECE`] bytes, so that restoring from a file holds the guest's memory
//! and not also the file's contents or a decoded copy of them.

use std::io::{Read, Seek};

use super::format::{FormatError, PIECE, ReadError, SnapshotFile};
use super::image::GuestImage;
use crate::compute::ComputeImage;
use crate::compute::burn::BurnBackend;

/// A host snapshot to restore, read a memory at a time.
pub trait SnapshotSource {
    /// The memories' sizes and runs and the globals' values. The memories'
    /// `data` and the compute buffers may be empty: read them with
    /// [`SnapshotSource::open_memory`] and [`SnapshotSource::compute`].
    fn layout(&self) -> &GuestImage;

    /// Starts reading memory `k`'s stored bytes (its runs, in order);
    /// abandons the memory read before, if it was not read to its end.
    fn open_memory(&mut self, k: usize) -> Result<(), ReadError>;

    /// The next piece of the memory opened last: where it lies in the
    /// memory and its bytes, at most [`PIECE`] of them, within one run.
    /// `None` once every run was handed over and the stored bytes were
    /// found to be exactly that long.
    fn next_piece(&mut self) -> Result<Option<(u64, &[u8])>, ReadError>;

    /// The trial's host compute buffers.
    ///
    /// Refuses buffers that add up past `quota` before reading any.
    fn compute(&mut self, quota: u64) -> Result<ComputeImage, ReadError>;

    /// The kind of backend that held the trial's burn session, if it has
    /// one: known before anything is read, so that a restore can refuse a
    /// session its host cannot take before it writes any memory.
    fn burn_backend(&self) -> Option<BurnBackend>;
}

impl<R: Read + Seek> SnapshotSource for SnapshotFile<R> {
    fn layout(&self) -> &GuestImage {
        SnapshotFile::layout(self)
    }

    fn open_memory(&mut self, k: usize) -> Result<(), ReadError> {
        SnapshotFile::open_memory(self, k)
    }

    fn next_piece(&mut self) -> Result<Option<(u64, &[u8])>, ReadError> {
        SnapshotFile::next_piece(self)
    }

    fn compute(&mut self, quota: u64) -> Result<ComputeImage, ReadError> {
        SnapshotFile::compute(self, quota)
    }

    fn burn_backend(&self) -> Option<BurnBackend> {
        SnapshotFile::burn_backend(self)
    }
}

/// A [`GuestImage`] in memory as a [`SnapshotSource`].
pub struct ImageSource<'a> {
    image: &'a GuestImage,
    /// The memory being read: its index, run, and bytes handed over.
    memory: Option<usize>,
    run: usize,
    within: u64,
    /// Where the current run's bytes start in the memory's `data`.
    data_at: usize,
}

impl<'a> ImageSource<'a> {
    /// Reads `image`.
    pub fn new(image: &'a GuestImage) -> Self {
        Self {
            image,
            memory: None,
            run: 0,
            within: 0,
            data_at: 0,
        }
    }
}

impl SnapshotSource for ImageSource<'_> {
    fn layout(&self) -> &GuestImage {
        self.image
    }

    fn open_memory(&mut self, k: usize) -> Result<(), ReadError> {
        let memory = self.image.memories.get(k).ok_or_else(|| {
            ReadError::Format(FormatError::Malformed(format!("there is no memory {k}")))
        })?;
        memory
            .validate()
            .map_err(|why| ReadError::Format(FormatError::Malformed(why)))?;
        self.memory = Some(k);
        self.run = 0;
        self.within = 0;
        self.data_at = 0;
        Ok(())
    }

    fn next_piece(&mut self) -> Result<Option<(u64, &[u8])>, ReadError> {
        let Some(k) = self.memory else {
            return Ok(None);
        };
        let memory = &self.image.memories[k];
        let Some(&(offset, len)) = memory.runs.get(self.run) else {
            self.memory = None;
            return Ok(None);
        };
        let n = (len - self.within).min(PIECE as u64);
        let start = self.data_at + self.within as usize;
        let piece = &memory.data[start..start + n as usize];
        let at = offset + self.within;
        self.within += n;
        if self.within == len {
            self.data_at += len as usize;
            self.run += 1;
            self.within = 0;
        }
        Ok(Some((at, piece)))
    }

    fn compute(&mut self, _quota: u64) -> Result<ComputeImage, ReadError> {
        // Held in memory already: the session's restore checks the quota.
        Ok(self.image.compute.clone())
    }

    fn burn_backend(&self) -> Option<BurnBackend> {
        self.image.compute.burn.as_ref().map(|b| b.backend)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::snapshot::format::{SnapshotFile, SnapshotMeta, encode};
    use crate::snapshot::image::{MemoryImage, PAGE};
    use crate::snapshot::{Payload, SnapshotKey};

    /// Every piece of every memory, as `(memory, offset, bytes)` runs
    /// joined back together.
    fn pieces(source: &mut dyn SnapshotSource) -> Vec<(usize, u64, Vec<u8>)> {
        let mut out: Vec<(usize, u64, Vec<u8>)> = Vec::new();
        for k in 0..source.layout().memories.len() {
            source.open_memory(k).unwrap();
            while let Some((at, bytes)) = source.next_piece().unwrap() {
                assert!(bytes.len() <= PIECE);
                match out.last_mut() {
                    Some((m, start, run)) if *m == k && *start + run.len() as u64 == at => {
                        run.extend_from_slice(bytes)
                    }
                    _ => out.push((k, at, bytes.to_vec())),
                }
            }
        }
        out
    }

    fn sample() -> (SnapshotMeta, GuestImage) {
        // Three pieces' worth of one run, a small run, and an empty memory.
        let mut big = MemoryImage::with_pages(80);
        let mut bytes: Vec<u8> = (0..80 * PAGE).map(|i| (i % 251) as u8 | 1).collect();
        bytes[(3 * PIECE + 8192)..(3 * PIECE + 12288)].fill(0);
        big.push_contents(0, &bytes);
        let mut small = MemoryImage::with_pages(1);
        let mut bytes = vec![0u8; PAGE as usize];
        bytes[4096..4200].fill(3);
        small.push_contents(0, &bytes);
        let image = GuestImage {
            memories: vec![big, small, MemoryImage::with_pages(2)],
            ..GuestImage::default()
        };
        let meta = SnapshotMeta {
            component: "ab".repeat(32),
            trial_id: "trial_0000".into(),
            config: serde_json::json!({}),
            iteration: 1,
            fuel_total: 2,
            time_total_s: 0.0,
            result: serde_json::Value::Null,
        };
        (meta, image)
    }

    #[test]
    fn a_file_and_an_image_hand_over_the_same_pieces() {
        let (meta, image) = sample();
        let expected: Vec<(usize, u64, Vec<u8>)> = image
            .memories
            .iter()
            .enumerate()
            .flat_map(|(k, m)| m.runs().map(move |(at, b)| (k, at, b.to_vec())))
            .collect();
        assert_eq!(pieces(&mut ImageSource::new(&image)), expected);
        let key = SnapshotKey::derive(b"a key");
        let bytes = encode(&meta, &Payload::Memory(image.clone()), Some(&key));
        let mut file =
            SnapshotFile::new(std::io::Cursor::new(&bytes), &meta.component, Some(&key)).unwrap();
        assert_eq!(file.meta(), &meta);
        assert!(file.is_host_snapshot());
        assert_eq!(pieces(&mut file), expected);
        // Memories may be read in any order, and again.
        file.open_memory(1).unwrap();
        assert_eq!(file.next_piece().unwrap().unwrap().0, 4096);
        file.open_memory(0).unwrap();
        let first = image.memories[0].data[..PIECE].to_vec();
        let (at, piece) = file.next_piece().unwrap().unwrap();
        assert_eq!((at, piece), (0, &first[..]));
    }

    /// Bytes that can be changed while a reader holds them, as a file can.
    struct Shared {
        bytes: std::rc::Rc<std::cell::RefCell<Vec<u8>>>,
        at: u64,
    }

    impl std::io::Read for Shared {
        fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
            let bytes = self.bytes.borrow();
            let rest = bytes.get(self.at as usize..).unwrap_or_default();
            let n = rest.len().min(buf.len());
            buf[..n].copy_from_slice(&rest[..n]);
            self.at += n as u64;
            Ok(n)
        }
    }

    impl std::io::Seek for Shared {
        fn seek(&mut self, to: std::io::SeekFrom) -> std::io::Result<u64> {
            self.at = match to {
                std::io::SeekFrom::Start(at) => at,
                std::io::SeekFrom::End(d) => (self.bytes.borrow().len() as i64 + d) as u64,
                std::io::SeekFrom::Current(d) => (self.at as i64 + d) as u64,
            };
            Ok(self.at)
        }
    }

    #[test]
    fn a_file_changed_after_it_was_verified_is_refused_when_read() {
        let (meta, image) = sample();
        let encoded = encode(&meta, &Payload::Memory(image), None);
        // Bytes inside each frame (first, middle, last), changed between
        // verifying and reading. Layout: magic, version, flags, header
        // length, header, payload length, then frames as (length, bytes).
        let word = |at: usize| u64::from_le_bytes(encoded[at..at + 8].try_into().unwrap());
        let header_len = u32::from_le_bytes(encoded[16..20].try_into().unwrap()) as usize;
        let mut at = 20 + header_len + 8;
        let mut inside = Vec::new();
        for _ in 0..3 {
            let len = word(at) as usize;
            inside.extend([at + 8, at + 8 + len / 2, at + 8 + len - 1]);
            at += 8 + len;
        }
        assert_eq!(at, encoded.len() - 32, "three frames, then the trailer");
        for at in inside {
            let bytes = std::rc::Rc::new(std::cell::RefCell::new(encoded.clone()));
            let source = Shared {
                bytes: bytes.clone(),
                at: 0,
            };
            let mut file = SnapshotFile::new(source, &meta.component, None).unwrap();
            bytes.borrow_mut()[at] ^= 0x10;
            let mut failure = None;
            'memories: for k in 0..3 {
                file.open_memory(k).unwrap();
                loop {
                    match file.next_piece() {
                        Ok(Some(_)) => {}
                        Ok(None) => break,
                        Err(err) => {
                            failure = Some(err);
                            break 'memories;
                        }
                    }
                }
            }
            match failure {
                Some(ReadError::Changed) => {}
                other => panic!("byte {at}: {other:?}"),
            }
        }
    }
}
