//! A trial's disk quota, and no symbolic links, enforced in WASI's
//! filesystem layer.
//!
//! WASI gives a trial its own directory, and the cap-std layer under it
//! keeps every path inside; nothing there bounds how much it writes. Here
//! `wasi:filesystem/types` is replaced by a view that passes every call to
//! wasmtime-wasi's own implementation and, around the calls that make a
//! file grow or a directory entry appear, charges a per-trial
//! [`DiskQuota`]: bytes (the files' sizes) and entries (files, directories
//! and links). The call that would cross a cap traps, ending the trial with
//! the limit named; freed space (a file removed, truncated or replaced by a
//! rename) is credited back.
//!
//! Sizes are the files' lengths, so a sparse write far past a file's end
//! counts in full: the quota is conservative, never short. Writes through
//! streams (`write-via-stream`, `append-via-stream`) are charged by
//! [`QuotaStream`], which wraps the stream wasmtime-wasi made; a
//! positioned one writes itself, measuring the file at each write (another
//! call may have truncated it since) and finishing it before the call
//! returns.
//!
//! A file removed while the trial still holds it open keeps its bytes on
//! disk, so they stay charged until its last handle (descriptor or stream)
//! is gone ([`Handles`]), and the host's handle to it is closed at the end
//! of the call that dropped that; a truncation through such a handle is
//! credited then, not twice.
//!
//! Symbolic links are refused (`not-permitted`): a link left in the trial's
//! directory, harmless while the sandbox resolves it, leads a later copy of
//! the directory (`tar -h`, `rsync -L`, a backup) outside it. Trainables
//! have no need for them.
//!
//! Not covered: the read-only data grants (no write reaches them), and a
//! file grown by another process or trial (the count starts from what is on
//! disk when the instance starts and follows only this trial's calls).

use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};

use bytes::Bytes;
use wasmtime::component::{HasData, Linker, Resource};
use wasmtime_wasi::async_trait;
use wasmtime_wasi::filesystem::WasiFilesystemCtxView;
use wasmtime_wasi::p2::bindings::filesystem::types::ErrorCode;
use wasmtime_wasi::p2::bindings::sync::filesystem::types::{
    self as fs, Descriptor, DescriptorFlags, DescriptorStat, DescriptorType, DirectoryEntry,
    DirectoryEntryStream, Filesize, MetadataHashValue, NewTimestamp, OpenFlags, PathFlags,
};
use wasmtime_wasi::p2::bindings::sync::io::streams;
use wasmtime_wasi::p2::{
    DynInputStream, DynOutputStream, FsError, FsResult, InputStream, OutputStream, Pollable,
    StreamResult,
};

use super::limits::{LimitHit, Limits};

/// What one trial may keep in its directory, and what it keeps now.
#[derive(Debug)]
pub(crate) struct DiskQuota {
    limit_bytes: u64,
    limit_entries: u64,
    bytes: AtomicU64,
    entries: AtomicU64,
    handles: Mutex<Handles>,
    /// How many removed files `handles` holds, read without its lock.
    removed: AtomicUsize,
    /// Whether the trial dropped a stream since the last sweep: a sweep
    /// follows every host call, and only a drop can let go of a removed
    /// file, so the others cost a load. (A descriptor's drop sweeps at
    /// once.)
    let_go: AtomicBool,
    /// Host work the trial's file calls did since the store last charged
    /// it fuel ([`DiskQuota::take_work`]): the bytes read and written, and
    /// [`SYNC_WORK`] per sync.
    work: AtomicU64,
}

/// What a sync costs, in bytes of work: flushing to the disk stalls the
/// host for about as long as copying a mebibyte, and a loop of syncs would
/// slow every trial's (and the host's own) durable writes.
const SYNC_WORK: u64 = 1 << 20;

/// A file as the quota tells files apart: wasmtime-wasi's metadata hash,
/// which stands for its device and inode.
type FileId = (u64, u64);

/// The trial's handles to its regular files, and the files it removed
/// while it held them: the bytes of those stay on disk until the last
/// handle is dropped, so they stay charged until then.
#[derive(Debug, Default)]
struct Handles {
    /// Per file, one entry per descriptor the trial opened on it; the
    /// streams made from a descriptor share its handle.
    open: HashMap<FileId, Vec<Weak<std::fs::File>>>,
    /// Files noted since `open` last dropped its dead handles.
    noted: usize,
    /// Each file removed while open, held by the trial's live handles to
    /// it (these clones are ours): it is freed once only ours are left.
    removed: Vec<Vec<Arc<std::fs::File>>>,
}

impl DiskQuota {
    /// The quota of `limits`, counting what `dir` already holds (a trial
    /// that continues finds its earlier files there).
    pub(crate) fn measure(dir: &Path, limits: &Limits) -> std::io::Result<Arc<Self>> {
        let (bytes, entries) = usage(dir)?;
        Ok(Arc::new(Self {
            limit_bytes: limits.disk_bytes,
            limit_entries: limits.disk_files,
            bytes: AtomicU64::new(bytes),
            entries: AtomicU64::new(entries),
            handles: Mutex::default(),
            removed: AtomicUsize::new(0),
            let_go: AtomicBool::new(false),
            work: AtomicU64::new(0),
        }))
    }

    /// Notes `bytes` of host work done for one of the trial's file calls.
    fn worked(&self, bytes: u64) {
        self.work.fetch_add(bytes, Ordering::Relaxed);
    }

    /// The host work noted since the last call, for the store to charge:
    /// a fuel per byte, as for output. Overwriting a file in place costs
    /// no quota, so without it a guest could keep the host's disk busy for
    /// free.
    pub(crate) fn take_work(&self) -> u64 {
        self.work.swap(0, Ordering::Relaxed)
    }

    fn handles(&self) -> std::sync::MutexGuard<'_, Handles> {
        self.handles.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Notes a descriptor the trial opened on the regular file `id`.
    fn opened(&self, id: FileId, file: &Arc<std::fs::File>) {
        let mut handles = self.handles();
        handles
            .open
            .entry(id)
            .or_default()
            .push(Arc::downgrade(file));
        handles.noted += 1;
        if handles.noted >= 256 {
            handles.noted = 0;
            handles.open.retain(|_, held| {
                held.retain(|h| h.strong_count() > 0);
                !held.is_empty()
            });
        }
    }

    /// The last name of the regular file `id`, `size` bytes, is gone:
    /// credited now, or, while the trial holds the file open, once it lets
    /// go ([`DiskQuota::sweep`]).
    fn unlinked(&self, id: Option<FileId>, size: u64) {
        {
            let mut handles = self.handles();
            let held: Vec<Arc<std::fs::File>> = id
                .and_then(|id| handles.open.remove(&id))
                .unwrap_or_default()
                .iter()
                .filter_map(Weak::upgrade)
                .collect();
            if !held.is_empty() {
                handles.removed.push(held);
                self.removed.store(handles.removed.len(), Ordering::Release);
                return;
            }
        }
        self.shrink(size);
    }

    /// Notes that the trial dropped a handle, which may have been the last
    /// on a removed file.
    fn dropped_handle(&self) {
        self.let_go.store(true, Ordering::Release);
    }

    /// [`DiskQuota::sweep_removed`] if the trial dropped a handle since the
    /// last sweep. The store sweeps after every host call and at the end of
    /// every guest call, so a removed file's host handle closes with the
    /// call that dropped the trial's last handle to it. (A read or write
    /// still under way on wasmtime-wasi's blocking pool holds the file a
    /// little longer, until a later drop or write sweeps again.)
    pub(crate) fn sweep(&self) {
        if self.let_go.swap(false, Ordering::AcqRel) {
            self.sweep_removed();
        }
    }

    /// Lets go of the removed files the trial no longer holds, closing
    /// their host handles, and credits them at their size now (a
    /// truncation through a handle was credited when made).
    fn sweep_removed(&self) {
        if self.removed.load(Ordering::Acquire) == 0 {
            return;
        }
        let freed: Vec<Vec<Arc<std::fs::File>>> = {
            let mut handles = self.handles();
            let mut freed = Vec::new();
            handles.removed.retain_mut(|held| {
                let ours_only = held.iter().all(|h| Arc::strong_count(h) == 1);
                if ours_only {
                    freed.push(std::mem::take(held));
                }
                !ours_only
            });
            self.removed.store(handles.removed.len(), Ordering::Release);
            freed
        };
        for held in freed {
            let size = held[0].metadata().map_or(0, |m| m.len());
            // Dropping the last handles frees the file.
            drop(held);
            self.shrink(size);
        }
    }

    fn grow(&self, bytes: u64) -> Result<(), LimitHit> {
        if bytes == 0 {
            return Ok(());
        }
        self.sweep_removed();
        let limit = self.limit_bytes;
        self.bytes
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| {
                used.checked_add(bytes).filter(|&after| after <= limit)
            })
            .map(drop)
            .map_err(|used| LimitHit::Disk {
                limit,
                requested: used.saturating_add(bytes),
            })
    }

    fn shrink(&self, bytes: u64) {
        let _ = self
            .bytes
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| {
                Some(used.saturating_sub(bytes))
            });
    }

    fn add_entry(&self) -> Result<(), LimitHit> {
        let limit = self.limit_entries;
        self.entries
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| {
                (used < limit).then_some(used + 1)
            })
            .map(drop)
            .map_err(|_| LimitHit::DiskFiles { limit })
    }

    fn remove_entry(&self) {
        let _ = self
            .entries
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| {
                Some(used.saturating_sub(1))
            });
    }
}

/// Bytes of regular files and entries under `dir`, links not followed.
///
/// The walk goes from descriptor to descriptor (into a directory by its
/// name, back up through `..`), holding one open at a time: a guest builds
/// a tree nested past `PATH_MAX` easily, each level opened from the one
/// above, and a walk by paths would fail on it, so that the trial could
/// never start again. Nothing else changes the directory while it is
/// measured (the trial's instance has not started); should something move
/// a directory under the walk all the same, the `..` it climbs back
/// through is checked to be the one it came down from.
fn usage(dir: &Path) -> std::io::Result<(u64, u64)> {
    use rustix::fs::{CWD, Mode, OFlags, fstat, openat};
    let (mut bytes, mut entries) = (0u64, 0u64);
    // The trial's directory itself may be a link (an operator's choice);
    // nothing under it is followed.
    let root = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC;
    let mut current = openat(CWD, dir, root, Mode::empty())?;
    let identity = |fd: &rustix::fd::OwnedFd| fstat(fd).map(|st| (st.st_dev, st.st_ino));
    // Per level walked into, the directory's identity and the
    // subdirectories not yet walked.
    let mut pending = vec![(
        identity(&current)?,
        list(&current, &mut bytes, &mut entries)?,
    )];
    while let Some((_, level)) = pending.last_mut() {
        if let Some(name) = level.pop() {
            current = openat(&current, name.as_c_str(), WALK, Mode::empty())?;
            let listed = list(&current, &mut bytes, &mut entries)?;
            pending.push((identity(&current)?, listed));
        } else {
            pending.pop();
            if let Some((parent, _)) = pending.last() {
                current = openat(&current, c"..", WALK, Mode::empty())?;
                if identity(&current)? != *parent {
                    return Err(std::io::Error::other(
                        "a directory was moved while the trial's directory was measured",
                    ));
                }
            }
        }
    }
    Ok((bytes, entries))
}

/// How [`usage`] opens the directories under the trial's: never through a
/// link.
const WALK: rustix::fs::OFlags = rustix::fs::OFlags::RDONLY
    .union(rustix::fs::OFlags::DIRECTORY)
    .union(rustix::fs::OFlags::NOFOLLOW)
    .union(rustix::fs::OFlags::CLOEXEC);

/// Counts the entries of the directory `dir` into `entries`, and its
/// regular files' lengths into `bytes`; returns its subdirectories' names.
fn list(
    dir: &rustix::fd::OwnedFd,
    bytes: &mut u64,
    entries: &mut u64,
) -> std::io::Result<Vec<std::ffi::CString>> {
    use rustix::fs::{AtFlags, Dir, FileType, statat};
    let mut subdirs = Vec::new();
    for entry in Dir::read_from(dir)? {
        let entry = entry?;
        let name = entry.file_name();
        if name == c"." || name == c".." {
            continue;
        }
        let stat = statat(dir, name, AtFlags::SYMLINK_NOFOLLOW)?;
        *entries += 1;
        match FileType::from_raw_mode(stat.st_mode) {
            FileType::Directory => subdirs.push(name.to_owned()),
            FileType::RegularFile => *bytes += u64::try_from(stat.st_size).unwrap_or(0),
            _ => {}
        }
    }
    Ok(subdirs)
}

/// A trap naming the limit crossed.
fn over(hit: LimitHit) -> FsError {
    FsError::trap(wasmtime::Error::new(hit))
}

/// The same, for a stream's write.
fn stream_over(hit: LimitHit) -> wasmtime_wasi::p2::StreamError {
    wasmtime_wasi::p2::StreamError::Trap(wasmtime::Error::new(hit))
}

/// A second handle to the descriptor a call borrows.
fn again(fd: &Resource<Descriptor>) -> Resource<Descriptor> {
    Resource::new_borrow(fd.rep())
}

/// Whether removing the name `stat` describes removes the file: a regular
/// file's last link.
fn last_link(stat: &DescriptorStat) -> bool {
    stat.type_ == DescriptorType::RegularFile && stat.link_count <= 1
}

/// The trial's filesystem seen through its quota.
pub(crate) struct GuardedFs<'a> {
    inner: WasiFilesystemCtxView<'a>,
    quota: &'a Arc<DiskQuota>,
}

impl<'a> GuardedFs<'a> {
    /// WASI's filesystem view `inner`, charged to `quota`.
    pub(crate) fn new(inner: WasiFilesystemCtxView<'a>, quota: &'a Arc<DiskQuota>) -> Self {
        Self { inner, quota }
    }
}

struct HasGuardedFs;

impl HasData for HasGuardedFs {
    type Data<'a> = GuardedFs<'a>;
}

/// Replaces `wasi:filesystem/types` in a linker that already holds WASI
/// preview 2 (`wasmtime_wasi::p2::add_to_linker_sync`) with the guarded
/// view `get` gives of a store's data.
pub(crate) fn add_to_linker<T: 'static>(
    linker: &mut Linker<T>,
    get: fn(&mut T) -> GuardedFs<'_>,
) -> wasmtime::Result<()> {
    linker.allow_shadowing(true);
    let added = fs::add_to_linker::<T, HasGuardedFs>(linker, get);
    linker.allow_shadowing(false);
    added
}

impl GuardedFs<'_> {
    fn stat_at_now(&mut self, fd: &Resource<Descriptor>, path: &str) -> Option<DescriptorStat> {
        fs::HostDescriptor::stat_at(&mut self.inner, again(fd), PathFlags::empty(), path.into())
            .ok()
    }

    /// Which file `path` under `fd` names, links not followed.
    fn id_at(&mut self, fd: &Resource<Descriptor>, path: &str) -> Option<FileId> {
        fs::HostDescriptor::metadata_hash_at(
            &mut self.inner,
            again(fd),
            PathFlags::empty(),
            path.into(),
        )
        .ok()
        .map(|h| (h.lower, h.upper))
    }

    /// The open file `fd` is, if it is not a directory.
    fn file_of(&mut self, fd: &Resource<Descriptor>) -> Option<Arc<std::fs::File>> {
        match self.inner.table.get(fd) {
            Ok(wasmtime_wasi::filesystem::Descriptor::File(f)) => Some(Arc::clone(&f.file)),
            _ => None,
        }
    }

    /// Notes `fd`, just opened, when it is a regular file
    /// ([`DiskQuota::opened`]).
    fn note_open(&mut self, fd: &Resource<Descriptor>) {
        let Some(file) = self.file_of(fd) else {
            return;
        };
        // Read from the file itself: no trip through wasmtime-wasi's
        // blocking pool, where every open would wait for it.
        if !file.metadata().is_ok_and(|m| m.is_file()) {
            return;
        }
        if let Ok(hash) = fs::HostDescriptor::metadata_hash(&mut self.inner, again(fd)) {
            self.quota.opened((hash.lower, hash.upper), &file);
        }
    }

    /// Credits the removal of the name `stat` described, which was the
    /// file `id`.
    fn removed(&mut self, stat: &DescriptorStat, id: Option<FileId>) {
        self.quota.remove_entry();
        if last_link(stat) {
            self.quota.unlinked(id, stat.size);
        }
    }

    /// Runs `call` with `bytes` more charged; the charge is returned if the
    /// call fails.
    fn charged<R>(
        &mut self,
        bytes: u64,
        call: impl FnOnce(&mut Self) -> FsResult<R>,
    ) -> FsResult<R> {
        self.quota.grow(bytes).map_err(over)?;
        call(self).inspect_err(|_| self.quota.shrink(bytes))
    }

    /// Runs `call` with one more entry charged, returned if it fails.
    fn new_entry<R>(&mut self, call: impl FnOnce(&mut Self) -> FsResult<R>) -> FsResult<R> {
        self.quota.add_entry().map_err(over)?;
        call(self).inspect_err(|_| self.quota.remove_entry())
    }

    /// Wraps a stream wasmtime-wasi made so its writes are charged:
    /// `positioned` at an offset in a file, or appending.
    fn guard_stream(
        &mut self,
        stream: Resource<streams::OutputStream>,
        positioned: Option<Positioned>,
    ) -> FsResult<Resource<streams::OutputStream>> {
        let inner: DynOutputStream = self.inner.table.delete(stream)?;
        let guarded: DynOutputStream = Box::new(QuotaStream {
            inner,
            quota: Arc::clone(self.quota),
            positioned,
        });
        Ok(self.inner.table.push(guarded)?)
    }
}

impl fs::Host for GuardedFs<'_> {
    fn convert_error_code(&mut self, err: FsError) -> wasmtime::Result<fs::ErrorCode> {
        fs::Host::convert_error_code(&mut self.inner, err)
    }

    fn filesystem_error_code(
        &mut self,
        err: Resource<streams::Error>,
    ) -> wasmtime::Result<Option<fs::ErrorCode>> {
        fs::Host::filesystem_error_code(&mut self.inner, err)
    }
}

impl fs::HostDescriptor for GuardedFs<'_> {
    fn advise(
        &mut self,
        fd: Resource<Descriptor>,
        offset: Filesize,
        len: Filesize,
        advice: fs::Advice,
    ) -> FsResult<()> {
        self.inner.advise(fd, offset, len, advice)
    }

    fn sync_data(&mut self, fd: Resource<Descriptor>) -> FsResult<()> {
        self.quota.worked(SYNC_WORK);
        self.inner.sync_data(fd)
    }

    fn get_flags(&mut self, fd: Resource<Descriptor>) -> FsResult<DescriptorFlags> {
        self.inner.get_flags(fd)
    }

    fn get_type(&mut self, fd: Resource<Descriptor>) -> FsResult<DescriptorType> {
        self.inner.get_type(fd)
    }

    fn set_size(&mut self, fd: Resource<Descriptor>, size: Filesize) -> FsResult<()> {
        let old = self.inner.stat(again(&fd))?.size;
        if size > old {
            self.charged(size - old, |this| this.inner.set_size(fd, size))
        } else {
            self.inner.set_size(fd, size)?;
            self.quota.shrink(old - size);
            Ok(())
        }
    }

    fn set_times(
        &mut self,
        fd: Resource<Descriptor>,
        atim: NewTimestamp,
        mtim: NewTimestamp,
    ) -> FsResult<()> {
        self.inner.set_times(fd, atim, mtim)
    }

    fn read(
        &mut self,
        fd: Resource<Descriptor>,
        len: Filesize,
        offset: Filesize,
    ) -> FsResult<(Vec<u8>, bool)> {
        let read = self.inner.read(fd, len, offset)?;
        self.quota.worked(read.0.len() as u64);
        Ok(read)
    }

    fn write(
        &mut self,
        fd: Resource<Descriptor>,
        buf: Vec<u8>,
        offset: Filesize,
    ) -> FsResult<Filesize> {
        self.quota.worked(buf.len() as u64);
        let size = self.inner.stat(again(&fd))?.size;
        let end = offset.saturating_add(buf.len() as u64);
        let growth = end.saturating_sub(size);
        let written = self.charged(growth, |this| this.inner.write(fd, buf, offset))?;
        // A short write grew the file less than charged.
        let grown = offset.saturating_add(written).saturating_sub(size);
        self.quota.shrink(growth - grown.min(growth));
        Ok(written)
    }

    fn read_directory(
        &mut self,
        fd: Resource<Descriptor>,
    ) -> FsResult<Resource<DirectoryEntryStream>> {
        self.inner.read_directory(fd)
    }

    fn sync(&mut self, fd: Resource<Descriptor>) -> FsResult<()> {
        self.quota.worked(SYNC_WORK);
        self.inner.sync(fd)
    }

    fn create_directory_at(&mut self, fd: Resource<Descriptor>, path: String) -> FsResult<()> {
        self.new_entry(|this| this.inner.create_directory_at(fd, path))
    }

    fn stat(&mut self, fd: Resource<Descriptor>) -> FsResult<DescriptorStat> {
        self.inner.stat(fd)
    }

    fn stat_at(
        &mut self,
        fd: Resource<Descriptor>,
        path_flags: PathFlags,
        path: String,
    ) -> FsResult<DescriptorStat> {
        self.inner.stat_at(fd, path_flags, path)
    }

    fn set_times_at(
        &mut self,
        fd: Resource<Descriptor>,
        path_flags: PathFlags,
        path: String,
        atim: NewTimestamp,
        mtim: NewTimestamp,
    ) -> FsResult<()> {
        self.inner.set_times_at(fd, path_flags, path, atim, mtim)
    }

    fn link_at(
        &mut self,
        fd: Resource<Descriptor>,
        old_path_flags: PathFlags,
        old_path: String,
        new_descriptor: Resource<Descriptor>,
        new_path: String,
    ) -> FsResult<()> {
        self.new_entry(|this| {
            this.inner
                .link_at(fd, old_path_flags, old_path, new_descriptor, new_path)
        })
    }

    fn open_at(
        &mut self,
        fd: Resource<Descriptor>,
        path_flags: PathFlags,
        path: String,
        oflags: OpenFlags,
        flags: DescriptorFlags,
    ) -> FsResult<Resource<Descriptor>> {
        if !oflags.intersects(OpenFlags::CREATE | OpenFlags::TRUNCATE) {
            let opened = self.inner.open_at(fd, path_flags, path, oflags, flags)?;
            self.note_open(&opened);
            return Ok(opened);
        }
        let before = self.stat_at_now(&fd, &path);
        // A truncation frees the blocks even where other handles hold the
        // file.
        let truncated = match &before {
            Some(stat)
                if oflags.contains(OpenFlags::TRUNCATE)
                    && stat.type_ == DescriptorType::RegularFile =>
            {
                stat.size
            }
            _ => 0,
        };
        let opened = if before.is_none() && oflags.contains(OpenFlags::CREATE) {
            self.new_entry(|this| this.inner.open_at(fd, path_flags, path, oflags, flags))?
        } else {
            self.inner.open_at(fd, path_flags, path, oflags, flags)?
        };
        self.quota.shrink(truncated);
        self.note_open(&opened);
        Ok(opened)
    }

    fn drop(&mut self, fd: Resource<Descriptor>) -> wasmtime::Result<()> {
        fs::HostDescriptor::drop(&mut self.inner, fd)?;
        self.quota.sweep_removed();
        Ok(())
    }

    fn readlink_at(&mut self, fd: Resource<Descriptor>, path: String) -> FsResult<String> {
        self.inner.readlink_at(fd, path)
    }

    fn remove_directory_at(&mut self, fd: Resource<Descriptor>, path: String) -> FsResult<()> {
        self.inner.remove_directory_at(fd, path)?;
        self.quota.remove_entry();
        Ok(())
    }

    fn rename_at(
        &mut self,
        fd: Resource<Descriptor>,
        old_path: String,
        new_fd: Resource<Descriptor>,
        new_path: String,
    ) -> FsResult<()> {
        // A rename over another file frees the file it replaces, unless the
        // two names are one file.
        let new_id = self.id_at(&new_fd, &new_path);
        let replaced = self.stat_at_now(&new_fd, &new_path).filter(|_| {
            let old_id = self.id_at(&fd, &old_path);
            old_id.is_none() || old_id != new_id
        });
        self.inner.rename_at(fd, old_path, new_fd, new_path)?;
        if let Some(stat) = replaced {
            self.removed(&stat, new_id);
        }
        Ok(())
    }

    fn symlink_at(
        &mut self,
        _fd: Resource<Descriptor>,
        _src: String,
        _dest: String,
    ) -> FsResult<()> {
        Err(ErrorCode::NotPermitted.into())
    }

    fn unlink_file_at(&mut self, fd: Resource<Descriptor>, path: String) -> FsResult<()> {
        let before = self.stat_at_now(&fd, &path);
        let id = self.id_at(&fd, &path);
        self.inner.unlink_file_at(fd, path)?;
        if let Some(stat) = before {
            self.removed(&stat, id);
        }
        Ok(())
    }

    fn read_via_stream(
        &mut self,
        fd: Resource<Descriptor>,
        offset: Filesize,
    ) -> FsResult<Resource<streams::InputStream>> {
        let stream = self.inner.read_via_stream(fd, offset)?;
        let inner: DynInputStream = self.inner.table.delete(stream)?;
        let metered: DynInputStream = Box::new(MeteredInput {
            inner,
            quota: Arc::clone(self.quota),
        });
        Ok(self.inner.table.push(metered)?)
    }

    fn write_via_stream(
        &mut self,
        fd: Resource<Descriptor>,
        offset: Filesize,
    ) -> FsResult<Resource<streams::OutputStream>> {
        let file = self.file_of(&fd);
        let stream = self.inner.write_via_stream(fd, offset)?;
        // A stream is made only on a file, so there is one.
        let file = file.ok_or(ErrorCode::BadDescriptor)?;
        self.guard_stream(
            stream,
            Some(Positioned {
                position: offset,
                file,
            }),
        )
    }

    fn append_via_stream(
        &mut self,
        fd: Resource<Descriptor>,
    ) -> FsResult<Resource<streams::OutputStream>> {
        let stream = self.inner.append_via_stream(fd)?;
        self.guard_stream(stream, None)
    }

    fn is_same_object(
        &mut self,
        a: Resource<Descriptor>,
        b: Resource<Descriptor>,
    ) -> wasmtime::Result<bool> {
        self.inner.is_same_object(a, b)
    }

    fn metadata_hash(&mut self, fd: Resource<Descriptor>) -> FsResult<MetadataHashValue> {
        self.inner.metadata_hash(fd)
    }

    fn metadata_hash_at(
        &mut self,
        fd: Resource<Descriptor>,
        path_flags: PathFlags,
        path: String,
    ) -> FsResult<MetadataHashValue> {
        self.inner.metadata_hash_at(fd, path_flags, path)
    }
}

impl fs::HostDirectoryEntryStream for GuardedFs<'_> {
    fn read_directory_entry(
        &mut self,
        stream: Resource<DirectoryEntryStream>,
    ) -> FsResult<Option<DirectoryEntry>> {
        self.inner.read_directory_entry(stream)
    }

    fn drop(&mut self, stream: Resource<DirectoryEntryStream>) -> wasmtime::Result<()> {
        fs::HostDirectoryEntryStream::drop(&mut self.inner, stream)
    }
}

/// A file's input stream whose reads are noted as host work
/// ([`DiskQuota::worked`]), as `read` and every write are: wasi-libc reads
/// files through streams.
struct MeteredInput {
    inner: DynInputStream,
    quota: Arc<DiskQuota>,
}

#[async_trait]
impl InputStream for MeteredInput {
    fn read(&mut self, size: usize) -> StreamResult<Bytes> {
        let bytes = self.inner.read(size)?;
        self.quota.worked(bytes.len() as u64);
        Ok(bytes)
    }

    async fn blocking_read(&mut self, size: usize) -> StreamResult<Bytes> {
        let bytes = self.inner.blocking_read(size).await?;
        self.quota.worked(bytes.len() as u64);
        Ok(bytes)
    }

    fn skip(&mut self, nelem: usize) -> StreamResult<usize> {
        let skipped = self.inner.skip(nelem)?;
        self.quota.worked(skipped as u64);
        Ok(skipped)
    }

    async fn blocking_skip(&mut self, nelem: usize) -> StreamResult<usize> {
        let skipped = self.inner.blocking_skip(nelem).await?;
        self.quota.worked(skipped as u64);
        Ok(skipped)
    }

    async fn cancel(&mut self) {
        self.inner.cancel().await
    }
}

impl Drop for MeteredInput {
    fn drop(&mut self) {
        self.quota.dropped_handle();
    }
}

#[async_trait]
impl Pollable for MeteredInput {
    async fn ready(&mut self) {
        self.inner.ready().await
    }
}

/// A file's output stream whose writes are charged to the trial's quota:
/// past the file's end for a positioned stream, every byte for an
/// appending one.
struct QuotaStream {
    /// The stream wasmtime-wasi made: it writes what appends, and answers
    /// `check_write`, `flush` and readiness for both kinds.
    inner: DynOutputStream,
    quota: Arc<DiskQuota>,
    /// `None` when appending.
    positioned: Option<Positioned>,
}

/// A positioned stream's own writing, done before each call returns:
/// wasmtime-wasi's stream would leave a write under way on another thread,
/// and a truncation the guest made meanwhile would credit bytes the write
/// then put back, free.
struct Positioned {
    /// Where the next write lands.
    position: u64,
    file: Arc<std::fs::File>,
}

impl Positioned {
    /// Writes `bytes` at the stream's position, charging what the file
    /// grows by, measured now (another call may have truncated it): a
    /// write past the end pays for the gap too, as the length counts,
    /// sparse or not.
    fn write(&mut self, quota: &DiskQuota, bytes: &[u8]) -> StreamResult<()> {
        use std::os::unix::fs::FileExt;
        let failed =
            |e: std::io::Error| wasmtime_wasi::p2::StreamError::LastOperationFailed(e.into());
        quota.worked(bytes.len() as u64);
        let size = self.file.metadata().map_err(failed)?.len();
        let end = self.position.saturating_add(bytes.len() as u64);
        let growth = end.saturating_sub(size);
        quota.grow(growth).map_err(stream_over)?;
        if let Err(e) = self.file.write_all_at(bytes, self.position) {
            // Part may have landed: what the file grew by stays charged.
            let grown = self
                .file
                .metadata()
                .map_or(growth, |m| m.len().saturating_sub(size));
            quota.shrink(growth - grown.min(growth));
            return Err(failed(e));
        }
        self.position = end;
        Ok(())
    }
}

impl Drop for QuotaStream {
    fn drop(&mut self) {
        self.quota.dropped_handle();
    }
}

impl QuotaStream {
    /// Runs an appending write, `write`, of `len` bytes with them charged;
    /// the charge is given back if it fails.
    fn appended<T>(
        &mut self,
        len: u64,
        write: impl FnOnce(&mut DynOutputStream) -> StreamResult<T>,
    ) -> StreamResult<T> {
        self.quota.worked(len);
        self.quota.grow(len).map_err(stream_over)?;
        write(&mut self.inner).inspect_err(|_| self.quota.shrink(len))
    }
}

#[async_trait]
impl OutputStream for QuotaStream {
    fn write(&mut self, bytes: Bytes) -> StreamResult<()> {
        match &mut self.positioned {
            Some(positioned) => positioned.write(&self.quota, &bytes),
            None => self.appended(bytes.len() as u64, |inner| inner.write(bytes)),
        }
    }

    fn flush(&mut self) -> StreamResult<()> {
        self.inner.flush()
    }

    fn check_write(&mut self) -> StreamResult<usize> {
        self.inner.check_write()
    }

    async fn blocking_write_and_flush(&mut self, bytes: Bytes) -> StreamResult<()> {
        match &mut self.positioned {
            Some(positioned) => positioned.write(&self.quota, &bytes),
            None => {
                let len = bytes.len() as u64;
                self.quota.worked(len);
                self.quota.grow(len).map_err(stream_over)?;
                let written = self.inner.blocking_write_and_flush(bytes).await;
                written.inspect_err(|_| self.quota.shrink(len))
            }
        }
    }

    fn write_zeroes(&mut self, nelem: usize) -> StreamResult<()> {
        match &mut self.positioned {
            // As wasmtime-wasi's: at most what `check_write` allows.
            Some(_) if nelem > self.inner.check_write()? => {
                Err(wasmtime_wasi::p2::StreamError::trap(
                    "cannot write more zeroes than `check_write` allows",
                ))
            }
            Some(positioned) => positioned.write(&self.quota, &vec![0; nelem]),
            None => self.appended(nelem as u64, |inner| inner.write_zeroes(nelem)),
        }
    }

    async fn cancel(&mut self) {
        self.inner.cancel().await
    }
}

#[async_trait]
impl Pollable for QuotaStream {
    async fn ready(&mut self) {
        self.inner.ready().await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rustix::fs::{CWD, Mode, OFlags, mkdirat, openat, symlinkat};

    #[test]
    fn usage_measures_a_tree_nested_past_path_max_and_follows_no_link() {
        let dir = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        std::fs::write(outside.path().join("big"), vec![0u8; 1 << 20]).unwrap();
        std::fs::write(dir.path().join("top"), [1u8; 10]).unwrap();
        // 60 levels of 100-byte names: 6 KB of path, past PATH_MAX (4096),
        // made as a guest makes it, one level opened from the one above.
        let name = "n".repeat(100);
        let mut current = openat(CWD, dir.path(), WALK, Mode::empty()).unwrap();
        for _ in 0..60 {
            mkdirat(&current, name.as_str(), Mode::RWXU).unwrap();
            current = openat(&current, name.as_str(), WALK, Mode::empty()).unwrap();
        }
        let bottom = openat(
            &current,
            "bottom",
            OFlags::WRONLY | OFlags::CREATE | OFlags::CLOEXEC,
            Mode::RUSR | Mode::WUSR,
        )
        .unwrap();
        rustix::io::write(&bottom, &[2u8; 123]).unwrap();
        symlinkat(outside.path(), &current, "out").unwrap();
        symlinkat(outside.path().join("big"), &current, "big").unwrap();

        // 60 directories, `top`, `bottom` and two links; the links' targets
        // are not counted.
        assert_eq!(usage(dir.path()).unwrap(), (10 + 123, 64));
        // A path walk fails on this tree, which is why `usage` walks by
        // descriptor.
        let deep: std::path::PathBuf = std::iter::repeat_n(name.as_str(), 60).collect();
        let path_error = std::fs::symlink_metadata(dir.path().join(deep).join("bottom"));
        assert_eq!(
            path_error.unwrap_err().raw_os_error(),
            Some(rustix::io::Errno::NAMETOOLONG.raw_os_error())
        );
    }

    /// The trial's directory itself may be a link (an operator who moved
    /// the guests' files elsewhere); what is under it is not followed.
    #[test]
    fn usage_measures_a_trial_directory_that_is_a_link() {
        let real = tempfile::tempdir().unwrap();
        std::fs::write(real.path().join("f"), [0u8; 7]).unwrap();
        let place = tempfile::tempdir().unwrap();
        let linked = place.path().join("work");
        std::os::unix::fs::symlink(real.path(), &linked).unwrap();
        assert_eq!(usage(&linked).unwrap(), (7, 1));
    }

    #[test]
    fn usage_of_a_missing_directory_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        assert!(usage(&dir.path().join("gone")).is_err());
    }
}
