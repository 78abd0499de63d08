//! Capped capture of a guest's output streams into per-trial log files, and
//! the sink that takes a guest's memory while a host snapshot reads it.
//!
//! A guest that floods stdout must not fill the disk or slow the host: once a
//! stream reaches its cap, one truncation marker is written and the rest is
//! dropped while the guest keeps running (its fuel and deadline still bound
//! it). The last few KiB are also kept in memory so a trap can quote the
//! guest's panic message.
//!
//! Files are created on the first write, so the many trials that never
//! print cost no file, and opened for appending, so a trial that continues
//! after a failure or a pause keeps its earlier output (the panic that made
//! it fail, for one) under one cap.

use std::collections::VecDeque;
use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};

use bytes::Bytes;
use wasmtime_wasi::cli::{IsTerminal, StdoutStream};
use wasmtime_wasi::p2::{OutputStream, Pollable, StreamError, StreamResult};

use crate::snapshot::{MemoryImage, Spool};

/// How much of the stream's end is kept in memory for error messages.
const TAIL_BYTES: usize = 4096;

struct Inner {
    path: PathBuf,
    file: Option<File>,
    written: u64,
    cap: u64,
    truncated: bool,
    tail: VecDeque<u8>,
}

impl Inner {
    fn write(&mut self, mut bytes: &[u8]) -> io::Result<()> {
        self.remember(bytes);
        if self.truncated || bytes.is_empty() {
            return Ok(());
        }
        if self.file.is_none() {
            let file = OpenOptions::new()
                .create(true)
                .append(true)
                .open(&self.path)?;
            self.written = file.metadata()?.len();
            self.truncated = self.written >= self.cap;
            self.file = Some(file);
            if self.truncated {
                return Ok(());
            }
        }
        let file = self.file.as_mut().expect("opened above");
        let room = self.cap.saturating_sub(self.written);
        if bytes.len() as u64 > room {
            bytes = &bytes[..room as usize];
            self.truncated = true;
        }
        file.write_all(bytes)?;
        self.written += bytes.len() as u64;
        if self.truncated {
            writeln!(
                file,
                "\n[wtune: output truncated at {} bytes; the rest was dropped]",
                self.cap
            )?;
        }
        Ok(())
    }

    fn remember(&mut self, bytes: &[u8]) {
        let keep = &bytes[bytes.len().saturating_sub(TAIL_BYTES)..];
        let overflow = (self.tail.len() + keep.len()).saturating_sub(TAIL_BYTES);
        self.tail.drain(..overflow);
        self.tail.extend(keep);
    }
}

/// One captured stream. Clones share the same file and counters, as wasmtime
/// asks for a fresh stream object per guest handle.
#[derive(Clone)]
pub(crate) struct CappedSink {
    inner: Arc<Mutex<Inner>>,
    /// Bytes the guest has handed over in all, kept or not: the host copied
    /// each of them, so each is charged fuel. Outside the lock so the call
    /// hook reads it for free.
    offered: Arc<AtomicU64>,
}

impl CappedSink {
    /// A stream appended to the log file at `path` (created on the first
    /// write), capped at `cap` bytes in all.
    pub(crate) fn new(path: &Path, cap: u64) -> Self {
        Self {
            inner: Arc::new(Mutex::new(Inner {
                path: path.to_path_buf(),
                file: None,
                written: 0,
                cap,
                truncated: false,
                tail: VecDeque::with_capacity(TAIL_BYTES),
            })),
            offered: Arc::new(AtomicU64::new(0)),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // A panic while holding this lock can only come from a bug in this
        // module; the data (a file and counters) stays usable regardless.
        self.inner
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Appends to the stream, respecting the cap.
    pub(crate) fn write(&self, bytes: &[u8]) -> io::Result<()> {
        self.offered
            .fetch_add(bytes.len() as u64, Ordering::Relaxed);
        self.lock().write(bytes)
    }

    /// Bytes written to this stream so far, including those dropped past
    /// the cap.
    pub(crate) fn offered(&self) -> u64 {
        self.offered.load(Ordering::Relaxed)
    }

    /// The last bytes written (up to 4 KiB), decoded lossily.
    pub(crate) fn tail(&self) -> String {
        let inner = self.lock();
        let (a, b) = inner.tail.as_slices();
        let mut bytes = Vec::with_capacity(a.len() + b.len());
        bytes.extend_from_slice(a);
        bytes.extend_from_slice(b);
        String::from_utf8_lossy(&bytes).into_owned()
    }

    /// Flushes the file to the OS.
    pub(crate) fn flush(&self) -> io::Result<()> {
        match &mut self.lock().file {
            Some(file) => file.flush(),
            None => Ok(()),
        }
    }
}

impl IsTerminal for CappedSink {
    fn is_terminal(&self) -> bool {
        false
    }
}

impl StdoutStream for CappedSink {
    fn p2_stream(&self) -> Box<dyn OutputStream> {
        Box::new(self.clone())
    }

    fn async_stream(&self) -> Box<dyn tokio::io::AsyncWrite + Send + Sync> {
        Box::new(self.clone())
    }
}

#[wasmtime_wasi::async_trait]
impl Pollable for CappedSink {
    async fn ready(&mut self) {}
}

impl OutputStream for CappedSink {
    fn write(&mut self, bytes: Bytes) -> StreamResult<()> {
        CappedSink::write(self, &bytes).map_err(|e| StreamError::LastOperationFailed(e.into()))
    }

    fn flush(&mut self) -> StreamResult<()> {
        CappedSink::flush(self).map_err(|e| StreamError::LastOperationFailed(e.into()))
    }

    fn check_write(&mut self) -> StreamResult<usize> {
        // Writes never block: beyond the cap they are dropped.
        Ok(1 << 20)
    }
}

impl tokio::io::AsyncWrite for CappedSink {
    fn poll_write(
        self: Pin<&mut Self>,
        _: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Poll::Ready(CappedSink::write(&self, buf).map(|()| buf.len()))
    }

    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(CappedSink::flush(&self))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

/// Where the accessor's `chunk` calls put a memory's bytes while a host
/// snapshot reads it: offered in order, from `next` on.
pub(crate) struct MemorySink {
    image: MemoryImage,
    next: u64,
    keep: Keep,
}

/// What a [`MemorySink`] keeps of the bytes it is offered.
pub(crate) enum Keep {
    /// The non-zero chunks, with their bytes, in the image.
    Bytes,
    /// Only where the non-zero chunks are.
    Runs,
    /// Where the non-zero chunks are in the image, and their bytes written
    /// to the spool's open frame.
    Spool(Spool),
}

impl MemorySink {
    /// A sink that adds to `image` what lies at `from` onward.
    pub(crate) fn new(image: MemoryImage, from: u64, keep: Keep) -> Self {
        Self {
            image,
            next: from,
            keep,
        }
    }

    /// Takes the next `bytes` of the memory. Fails only when a spool
    /// cannot be written.
    pub(crate) fn push(&mut self, bytes: &[u8]) -> io::Result<()> {
        let at = self.next;
        self.next += bytes.len() as u64;
        match &mut self.keep {
            Keep::Bytes => self.image.push_contents(at, bytes),
            Keep::Runs => self.image.push_runs(at, bytes),
            Keep::Spool(spool) => return self.image.push_contents_to(at, bytes, spool),
        }
        Ok(())
    }

    /// The image, and the `keep` given (with its spool).
    pub(crate) fn into_parts(self) -> (MemoryImage, Keep) {
        (self.image, self.keep)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stops_at_the_cap_with_one_marker_and_keeps_the_tail() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("out.log");
        let sink = CappedSink::new(&path, 10);
        sink.write(b"12345").unwrap();
        sink.write(b"67890abc").unwrap();
        sink.write(b"more").unwrap();
        sink.flush().unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(
            text.starts_with("1234567890\n[wtune: output truncated at 10 bytes"),
            "{text}"
        );
        assert_eq!(text.matches("truncated").count(), 1);
        assert_eq!(sink.tail(), "1234567890abcmore");
    }

    #[test]
    fn files_appear_on_the_first_write_and_continue_under_one_cap() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("out.log");
        let quiet = CappedSink::new(&path, 12);
        quiet.flush().unwrap();
        drop(quiet);
        assert!(!path.exists(), "no output, no file");
        let first = CappedSink::new(&path, 12);
        first.write(b"before\n").unwrap();
        drop(first);
        let second = CappedSink::new(&path, 12);
        second.write(b"after the restore").unwrap();
        second.write(b"dropped").unwrap();
        drop(second);
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(
            text.starts_with("before\nafter\n[wtune: output truncated"),
            "{text}"
        );
        let third = CappedSink::new(&path, 12);
        third.write(b"also dropped").unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), text);
    }

    #[test]
    fn offered_counts_every_byte_including_those_past_the_cap() {
        let dir = tempfile::tempdir().unwrap();
        let sink = CappedSink::new(&dir.path().join("out.log"), 10);
        let clone = sink.clone();
        sink.write(b"0123456789abc").unwrap();
        clone.write(b"def").unwrap();
        assert_eq!(sink.offered(), 16);
        assert_eq!(clone.offered(), 16);
    }

    #[test]
    fn tail_keeps_only_the_last_bytes() {
        let dir = tempfile::tempdir().unwrap();
        let sink = CappedSink::new(&dir.path().join("x"), 1 << 20);
        for _ in 0..3 {
            sink.write(&[b'a'; TAIL_BYTES]).unwrap();
        }
        sink.write(b"END").unwrap();
        let tail = sink.tail();
        assert_eq!(tail.len(), TAIL_BYTES);
        assert!(tail.ends_with("aEND"));
    }
}
