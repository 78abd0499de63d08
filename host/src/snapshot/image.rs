//! A guest's state as plain data: sparse memories and global values.

/// Granularity of zero detection: runs of all-zero chunks are not stored.
/// Smaller than a wasm page (64 KiB) so that a mostly untouched heap with a
/// few live allocations stays small.
pub const CHUNK: usize = 4096;

/// Size of a wasm page.
pub const PAGE: u64 = 65536;

static ZEROS: [u8; CHUNK] = [0; CHUNK];

/// Calls `f(start, end)` for each stretch of non-zero [`CHUNK`]s of `bytes`,
/// chunked from its start. Whole stretches let the caller copy at memcpy
/// speed rather than a chunk at a time.
fn for_nonzero(bytes: &[u8], mut f: impl FnMut(usize, usize)) {
    let mut pending = None;
    for (i, chunk) in bytes.chunks(CHUNK).enumerate() {
        let at = i * CHUNK;
        if chunk == &ZEROS[..chunk.len()] {
            if let Some(start) = pending.take() {
                f(start, at);
            }
        } else if pending.is_none() {
            pending = Some(at);
        }
    }
    if let Some(start) = pending {
        f(start, bytes.len());
    }
}

/// One linear memory: its size and the non-zero parts of its contents.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MemoryImage {
    /// Size in wasm pages.
    pub pages: u32,
    /// `(offset, len)` of each stored run, ascending and non-overlapping;
    /// everything outside the runs is zero. Offsets and lengths are
    /// multiples of [`CHUNK`] except where a run ends at the memory's end.
    pub runs: Vec<(u64, u64)>,
    /// The runs' bytes, concatenated in order.
    pub data: Vec<u8>,
}

impl MemoryImage {
    /// An empty image of a memory of `pages` pages.
    pub fn with_pages(pages: u32) -> Self {
        Self {
            pages,
            runs: Vec::new(),
            data: Vec::new(),
        }
    }

    /// An empty image of a memory of `pages` pages with room for all of its
    /// bytes, so that filling it never copies the data again to grow;
    /// untouched room costs no RAM.
    pub(crate) fn with_room(pages: u32) -> Self {
        let mut image = Self::with_pages(pages);
        image.data = Vec::with_capacity(image.byte_len() as usize);
        image
    }

    /// Bytes the runs cover: the length of `data` in a valid image.
    pub fn run_bytes(&self) -> u64 {
        self.runs.iter().map(|&(_, len)| len).sum()
    }

    /// Size in bytes.
    pub fn byte_len(&self) -> u64 {
        u64::from(self.pages) * PAGE
    }

    /// Appends the non-zero chunks of `bytes`, which lie at `offset` in the
    /// memory. Calls must come in ascending, contiguous order.
    pub fn push_contents(&mut self, offset: u64, bytes: &[u8]) {
        for_nonzero(bytes, |start, end| {
            self.extend_runs(offset + start as u64, (end - start) as u64);
            self.data.extend_from_slice(&bytes[start..end]);
        });
    }

    /// Records where `bytes`, at `offset`, is non-zero as runs and writes
    /// those bytes to `out` instead of storing them: what a snapshot taken
    /// straight into a file does. Calls must come in ascending, contiguous
    /// order.
    pub fn push_contents_to(
        &mut self,
        offset: u64,
        bytes: &[u8],
        out: &mut impl std::io::Write,
    ) -> std::io::Result<()> {
        let mut result = Ok(());
        for_nonzero(bytes, |start, end| {
            if result.is_ok() {
                self.extend_runs(offset + start as u64, (end - start) as u64);
                result = out.write_all(&bytes[start..end]);
            }
        });
        result
    }

    /// Records where `bytes`, at `offset`, is non-zero as runs but stores no
    /// data: the result says what to clear, and is no valid image.
    pub(crate) fn push_runs(&mut self, offset: u64, bytes: &[u8]) {
        for_nonzero(bytes, |start, end| {
            self.extend_runs(offset + start as u64, (end - start) as u64);
        });
    }

    /// Adds `len` bytes at `offset` to the runs, extending the last run when
    /// they continue it.
    fn extend_runs(&mut self, offset: u64, len: u64) {
        match self.runs.last_mut() {
            Some((start, run)) if *start + *run == offset => *run += len,
            _ => self.runs.push((offset, len)),
        }
    }

    /// Each run with its bytes.
    pub fn runs(&self) -> impl Iterator<Item = (u64, &[u8])> {
        let mut at = 0usize;
        self.runs.iter().map(move |&(offset, len)| {
            let bytes = &self.data[at..at + len as usize];
            at += len as usize;
            (offset, bytes)
        })
    }

    /// The spans of whole, aligned `block`-byte blocks that the image fills
    /// at least half, adjacent ones merged, in ascending order: where
    /// writing the image back touches most of each block anyway.
    pub fn dense_blocks(&self, block: u64) -> Vec<std::ops::Range<u64>> {
        let mut filled: Vec<(u64, u64)> = Vec::new();
        for &(offset, len) in &self.runs {
            let (mut at, end) = (offset, offset + len);
            while at < end {
                let index = at / block;
                let upto = end.min((index + 1) * block);
                match filled.last_mut() {
                    Some((i, n)) if *i == index => *n += upto - at,
                    _ => filled.push((index, upto - at)),
                }
                at = upto;
            }
        }
        let whole = self.byte_len() / block;
        let mut spans: Vec<std::ops::Range<u64>> = Vec::new();
        for (index, n) in filled {
            if index >= whole || n * 2 < block {
                continue;
            }
            let (start, end) = (index * block, (index + 1) * block);
            match spans.last_mut() {
                Some(span) if span.end == start => span.end = end,
                _ => spans.push(start..end),
            }
        }
        spans
    }

    /// The little-endian `u32` at `offset`, zero where nothing is stored.
    pub fn read_u32(&self, offset: u64) -> u32 {
        let mut out = [0u8; 4];
        for (i, byte) in out.iter_mut().enumerate() {
            *byte = self.byte_at(offset + i as u64);
        }
        u32::from_le_bytes(out)
    }

    fn byte_at(&self, offset: u64) -> u8 {
        let i = self.runs.partition_point(|&(start, _)| start <= offset);
        if i == 0 {
            return 0;
        }
        let (start, len) = self.runs[i - 1];
        if offset >= start + len {
            return 0;
        }
        let before: u64 = self.runs[..i - 1].iter().map(|&(_, l)| l).sum();
        self.data[(before + offset - start) as usize]
    }

    /// Checks the invariants a decoded image must hold.
    pub fn validate(&self) -> Result<(), String> {
        self.validate_runs()?;
        if self.run_bytes() != self.data.len() as u64 {
            return Err("memory run lengths do not add up to the stored bytes".into());
        }
        Ok(())
    }

    /// Checks that the runs are ascending, non-empty, non-overlapping and
    /// within the memory (what an image without its `data` must hold).
    pub fn validate_runs(&self) -> Result<(), String> {
        let mut end = 0u64;
        for &(offset, len) in &self.runs {
            if offset < end || len == 0 {
                return Err("memory runs overlap or are empty".into());
            }
            end = offset.checked_add(len).ok_or("a memory run overflows")?;
            if end > self.byte_len() {
                return Err(format!(
                    "a memory run ends at byte {end}, beyond the memory's {} bytes",
                    self.byte_len()
                ));
            }
        }
        Ok(())
    }
}

/// A mutable global's value, as stored (floats by their bits, so NaN
/// payloads survive).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GlobalValue {
    /// An `i32`.
    I32(i32),
    /// An `i64`.
    I64(i64),
    /// An `f32`, by its bits.
    F32(u32),
    /// An `f64`, by its bits.
    F64(u64),
}

/// Everything a host snapshot holds of one guest instance.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GuestImage {
    /// Memories in the accessor's order (ledgers included).
    pub memories: Vec<MemoryImage>,
    /// Mutable globals in the accessor's order.
    pub globals: Vec<GlobalValue>,
    /// The trial's host compute buffers, which live outside its memories.
    pub compute: crate::compute::ComputeImage,
}

impl GuestImage {
    /// Bytes of memory contents stored (zero chunks excluded).
    pub fn stored_bytes(&self) -> u64 {
        self.memories.iter().map(|m| m.data.len() as u64).sum()
    }

    /// Total size of the memories the image describes.
    pub fn memory_bytes(&self) -> u64 {
        self.memories.iter().map(MemoryImage::byte_len).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zero_chunks_are_skipped_and_runs_coalesce() {
        let mut image = MemoryImage::with_pages(1);
        let mut bytes = vec![0u8; PAGE as usize];
        bytes[10] = 1;
        bytes[CHUNK + 5] = 2;
        bytes[5 * CHUNK] = 3;
        image.push_contents(0, &bytes);
        assert_eq!(
            image.runs,
            vec![(0, 2 * CHUNK as u64), (5 * CHUNK as u64, CHUNK as u64)]
        );
        assert_eq!(image.data.len(), 3 * CHUNK);
        assert_eq!(image.read_u32(10), 1);
        assert_eq!(image.read_u32(5 * CHUNK as u64), 3);
        assert_eq!(image.read_u32(3 * CHUNK as u64), 0);
        image.validate().unwrap();
        let runs: Vec<_> = image.runs().map(|(o, b)| (o, b.len())).collect();
        assert_eq!(runs, vec![(0, 2 * CHUNK), (5 * CHUNK as u64, CHUNK)]);
    }

    #[test]
    fn runs_continue_across_calls() {
        let mut image = MemoryImage::with_pages(1);
        image.push_contents(0, &[1u8; CHUNK]);
        image.push_contents(CHUNK as u64, &[2u8; CHUNK]);
        assert_eq!(image.runs, vec![(0, 2 * CHUNK as u64)]);
    }

    #[test]
    fn contents_written_out_match_contents_kept() {
        let mut bytes = vec![0u8; 6 * CHUNK + 100];
        bytes[CHUNK + 3] = 1;
        bytes[2 * CHUNK] = 2;
        bytes[6 * CHUNK + 99] = 3;
        let mut kept = MemoryImage::with_pages(1);
        kept.push_contents(0, &bytes[..3 * CHUNK]);
        kept.push_contents(3 * CHUNK as u64, &bytes[3 * CHUNK..]);
        let mut written = MemoryImage::with_pages(1);
        let mut out = Vec::new();
        written
            .push_contents_to(0, &bytes[..3 * CHUNK], &mut out)
            .unwrap();
        written
            .push_contents_to(3 * CHUNK as u64, &bytes[3 * CHUNK..], &mut out)
            .unwrap();
        assert_eq!(written.runs, kept.runs);
        assert_eq!(out, kept.data);
        assert_eq!(written.run_bytes(), kept.data.len() as u64);
        assert!(written.data.is_empty());
    }

    #[test]
    fn runs_alone_mark_the_non_zero_chunks() {
        let mut image = MemoryImage::with_pages(1);
        let mut bytes = vec![0u8; 4 * CHUNK + 10];
        bytes[CHUNK] = 1;
        bytes[4 * CHUNK + 9] = 2;
        image.push_runs(0, &bytes);
        assert_eq!(
            image.runs,
            vec![(CHUNK as u64, CHUNK as u64), (4 * CHUNK as u64, 10)]
        );
        assert!(image.data.is_empty());
    }

    #[test]
    fn dense_blocks_are_the_mostly_filled_whole_ones() {
        const B: u64 = 1024;
        // 8 KiB memory, blocks of 1 KiB: block 0 full, block 1 half,
        // block 2 below half, blocks 3-4 filled by one run across them,
        // block 6 full through two runs.
        let image = MemoryImage {
            pages: 1,
            runs: vec![
                (0, 1536),
                (2048, 511),
                (3072, 2048),
                (6144, 512),
                (6656, 512),
            ],
            data: Vec::new(),
        };
        assert_eq!(image.dense_blocks(B), vec![0..2048, 3072..5120, 6144..7168]);
        // The 64 KiB memory's second 40 KiB block is cut short by its end:
        // never named, however full.
        let tail = MemoryImage {
            pages: 1,
            runs: vec![(40 << 10, 24 << 10)],
            data: Vec::new(),
        };
        assert_eq!(tail.dense_blocks(40 << 10), vec![]);
        assert!(MemoryImage::with_pages(4).dense_blocks(B).is_empty());
    }

    #[test]
    fn invalid_images_are_named() {
        let image = MemoryImage {
            pages: 1,
            runs: vec![(PAGE - 10, 20)],
            data: vec![1; 20],
        };
        assert!(image.validate().unwrap_err().contains("beyond"));
        let image = MemoryImage {
            pages: 1,
            runs: vec![(0, 20)],
            data: vec![1; 10],
        };
        assert!(image.validate().unwrap_err().contains("add up"));
    }
}
