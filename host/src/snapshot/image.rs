//! A guest's state as plain data: sparse memories and global values.

/// Granularity of zero detection: runs of all-zero chunks are not stored.
/// Smaller than a wasm page (64 KiB) so that a mostly untouched heap with a
/// few live allocations stays small.
pub const CHUNK: usize = 4096;

/// Size of a wasm page.
pub const PAGE: u64 = 65536;

static ZEROS: [u8; CHUNK] = [0; CHUNK];

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
            ..Self::default()
        }
    }

    /// Size in bytes.
    pub fn byte_len(&self) -> u64 {
        u64::from(self.pages) * PAGE
    }

    /// Appends the non-zero chunks of `bytes`, which lie at `offset` in the
    /// memory. Calls must come in ascending, contiguous order.
    pub fn push_contents(&mut self, offset: u64, bytes: &[u8]) {
        let mut at = offset;
        for chunk in bytes.chunks(CHUNK) {
            if chunk != &ZEROS[..chunk.len()] {
                match self.runs.last_mut() {
                    Some((start, len)) if *start + *len == at => *len += chunk.len() as u64,
                    _ => self.runs.push((at, chunk.len() as u64)),
                }
                self.data.extend_from_slice(chunk);
            }
            at += chunk.len() as u64;
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
        let mut end = 0u64;
        let mut total = 0u64;
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
            total += len;
        }
        if total != self.data.len() as u64 {
            return Err("memory run lengths do not add up to the stored bytes".into());
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
