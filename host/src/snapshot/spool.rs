//! Compressed frames on their way into a snapshot file.
//!
//! A snapshot file lists every memory's runs, and the payload's length,
//! before the payload itself, so its bytes cannot go straight from the
//! guest's memory into the file. A [`Spool`] holds them in between,
//! compressed as they arrive, one zstd frame at a time: in an unnamed
//! temporary file beside the snapshot ([`Spool::beside`]), which keeps the
//! host's memory at the guest's own plus a few compression buffers however
//! large the guest is, or in memory ([`Spool::in_memory`]) for files
//! encoded into a buffer anyway.

use std::fs::File;
use std::io::{self, BufReader, Cursor, Read, Seek, SeekFrom, Write};
use std::path::Path;

/// zstd level: fast enough to keep snapshots off the critical path.
const ZSTD_LEVEL: i32 = 1;

/// Read buffer for copying frames out of a spool file.
const COPY_BUFFER: usize = 1 << 20;

/// Where a spool keeps its frames.
pub trait SpoolStorage: Read + Write + Seek + Send {}

impl<T: Read + Write + Seek + Send> SpoolStorage for T {}

/// A sequence of zstd frames, written one after another and copied out,
/// each preceded by its length, by [`Spool::copy_frames_to`].
///
/// Bytes are written with [`Write`] between [`Spool::open_frame`] and
/// [`Spool::close_frame`]; writing with no frame open is an error. After an
/// I/O error the spool is broken and every later call fails.
pub struct Spool<S: SpoolStorage = File> {
    state: State<S>,
    /// Compressed length of each closed frame, in order.
    frames: Vec<u64>,
}

enum State<S: SpoolStorage> {
    Idle(S),
    Open(zstd::stream::write::Encoder<'static, Counted<S>>),
    Broken,
}

/// A writer that counts what passes through it.
struct Counted<W> {
    inner: W,
    written: u64,
}

impl<W: Write> Write for Counted<W> {
    fn write(&mut self, bytes: &[u8]) -> io::Result<usize> {
        let n = self.inner.write(bytes)?;
        self.written += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

impl Spool<File> {
    /// A spool in an unnamed temporary file in `path`'s directory (the
    /// directory the snapshot is written to, so that no other filesystem
    /// needs room for it). The file has no name, so nothing is left behind
    /// when the host dies.
    pub fn beside(path: &Path) -> io::Result<Self> {
        let dir = path
            .parent()
            .filter(|p| !p.as_os_str().is_empty())
            .unwrap_or(Path::new("."));
        Ok(Self::new(tempfile::tempfile_in(dir)?))
    }
}

impl Spool<Cursor<Vec<u8>>> {
    /// A spool in memory.
    pub fn in_memory() -> Self {
        Self::new(Cursor::new(Vec::new()))
    }
}

impl<S: SpoolStorage> Spool<S> {
    fn new(storage: S) -> Self {
        Self {
            state: State::Idle(storage),
            frames: Vec::new(),
        }
    }

    /// How many frames have been closed.
    pub fn frames(&self) -> usize {
        self.frames.len()
    }

    /// Starts a frame; what is written next goes into it.
    pub fn open_frame(&mut self) -> io::Result<()> {
        let storage = match std::mem::replace(&mut self.state, State::Broken) {
            State::Idle(storage) => storage,
            State::Open(encoder) => {
                self.state = State::Open(encoder);
                return Err(misuse("a frame is already open"));
            }
            State::Broken => return Err(broken()),
        };
        let counted = Counted {
            inner: storage,
            written: 0,
        };
        self.state = State::Open(zstd::stream::write::Encoder::new(counted, ZSTD_LEVEL)?);
        Ok(())
    }

    /// Ends the open frame.
    pub fn close_frame(&mut self) -> io::Result<()> {
        let encoder = match std::mem::replace(&mut self.state, State::Broken) {
            State::Open(encoder) => encoder,
            State::Idle(storage) => {
                self.state = State::Idle(storage);
                return Err(misuse("no frame is open"));
            }
            State::Broken => return Err(broken()),
        };
        let counted = encoder.finish()?;
        self.frames.push(counted.written);
        self.state = State::Idle(counted.inner);
        Ok(())
    }

    /// Writes `bytes` as one whole frame.
    pub fn frame(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.open_frame()?;
        self.write_all(bytes)?;
        self.close_frame()
    }

    /// Bytes the frames take once laid out: each frame and its 8-byte
    /// length.
    pub fn laid_out_len(&self) -> u64 {
        self.frames.iter().map(|len| 8 + len).sum()
    }

    /// Writes every frame to `out`, each preceded by its length as a
    /// little-endian `u64`. Fails while a frame is open.
    pub fn copy_frames_to(self, out: &mut impl Write) -> io::Result<()> {
        let mut storage = match self.state {
            State::Idle(storage) => storage,
            State::Open(_) => return Err(misuse("a frame is still open")),
            State::Broken => return Err(broken()),
        };
        storage.seek(SeekFrom::Start(0))?;
        let mut reader = BufReader::with_capacity(COPY_BUFFER, storage);
        for len in self.frames {
            out.write_all(&len.to_le_bytes())?;
            let copied = io::copy(&mut (&mut reader).take(len), out)?;
            if copied != len {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "the snapshot spool is shorter than what was written to it",
                ));
            }
        }
        Ok(())
    }
}

impl<S: SpoolStorage> Write for Spool<S> {
    fn write(&mut self, bytes: &[u8]) -> io::Result<usize> {
        match &mut self.state {
            State::Open(encoder) => {
                let result = encoder.write(bytes);
                if result.is_err() {
                    self.state = State::Broken;
                }
                result
            }
            State::Idle(_) => Err(misuse("no frame is open")),
            State::Broken => Err(broken()),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        match &mut self.state {
            State::Open(encoder) => encoder.flush(),
            State::Idle(storage) => storage.flush(),
            State::Broken => Err(broken()),
        }
    }
}

fn misuse(what: &str) -> io::Error {
    io::Error::other(format!("snapshot spool: {what}"))
}

fn broken() -> io::Error {
    io::Error::other("snapshot spool: an earlier write failed")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn laid_out<S: SpoolStorage>(spool: Spool<S>) -> Vec<Vec<u8>> {
        let mut out = Vec::new();
        spool.copy_frames_to(&mut out).unwrap();
        let mut frames = Vec::new();
        let mut rest = out.as_slice();
        while !rest.is_empty() {
            let (len, tail) = rest.split_at(8);
            let len = u64::from_le_bytes(len.try_into().unwrap()) as usize;
            let (frame, tail) = tail.split_at(len);
            frames.push(zstd::bulk::decompress(frame, 1 << 24).unwrap());
            rest = tail;
        }
        frames
    }

    /// Three frames: a small one, an empty one and `big` written in pieces.
    fn fill<S: SpoolStorage>(spool: &mut Spool<S>, big: &[u8]) {
        spool.frame(b"first").unwrap();
        spool.frame(b"").unwrap();
        spool.open_frame().unwrap();
        for piece in big.chunks(100_000) {
            spool.write_all(piece).unwrap();
        }
        spool.close_frame().unwrap();
        assert_eq!(spool.frames(), 3);
    }

    #[test]
    fn frames_come_out_in_order_and_whole() {
        let big: Vec<u8> = (0..3_000_000u32).map(|i| (i * 7 % 251) as u8).collect();
        let expected = vec![b"first".to_vec(), Vec::new(), big.clone()];

        let mut spool = Spool::in_memory();
        fill(&mut spool, &big);
        assert_eq!(laid_out(spool), expected);

        let dir = tempfile::tempdir().unwrap();
        let mut spool = Spool::beside(&dir.path().join("x.wtsnap")).unwrap();
        fill(&mut spool, &big);
        // The spool's file has no name: nothing shows in the directory.
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
        assert_eq!(laid_out(spool), expected);
    }

    #[test]
    fn misuse_is_an_error_not_a_panic() {
        let mut spool = Spool::in_memory();
        assert!(spool.write_all(b"x").is_err());
        assert!(spool.close_frame().is_err());
        spool.open_frame().unwrap();
        assert!(spool.open_frame().is_err());
        spool.write_all(b"x").unwrap();
        spool.close_frame().unwrap();
        assert_eq!(spool.frames(), 1);
        spool.open_frame().unwrap();
        let err = spool.copy_frames_to(&mut Vec::new()).unwrap_err();
        assert!(err.to_string().contains("still open"), "{err}");
    }
}
