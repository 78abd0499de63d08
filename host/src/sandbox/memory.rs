//! Guest linear memories, mapped by wtune instead of wasmtime so that a
//! restore can back the memory it writes with transparent huge pages.
//!
//! Why: restoring a snapshot grows a fresh instance's memory to the
//! snapshot's size and writes it back. With 4 KiB pages that is one page
//! fault per 4 KiB, and on the machines we measured the faults, not the
//! copy, set the pace (about 1.2 GB/s for a plain copy into fresh memory;
//! 2.5 GB/s once the kernel backs it with 2 MiB pages). Linux's default THP
//! mode is `madvise`, so the pages have to be asked for, and only the
//! owner of the mapping can ask: wasmtime does not, and a component's
//! memory is not reachable from the embedding API.
//!
//! Huge pages are asked for only where a restore is about to write most
//! of a 2 MiB block ([`growing_with_huge_pages`]); everywhere else memory
//! keeps small pages, so an instance's first pages cost no 2 MiB zeroing
//! and a sparse snapshot does not come back several times larger in RAM.
//!
//! Layout of each mapping, all reserved up front and never moved:
//! `[pre-guard][accessible | reserved, inaccessible][guard]`. The
//! accessible part starts on a [`HUGE_PAGE`] boundary so that guest
//! offsets and huge pages line up. Wasmtime elides bounds checks against
//! the reservation plus the guard, so both must stay inaccessible until
//! grown into; the pre-guard keeps the defence in depth wasmtime's own
//! memories have against negative offsets.
//!
//! This replaces wasmtime's copy-on-write initialisation of data segments
//! (it needs wasmtime's own mappings): segments are copied at
//! instantiation instead. For trainables (tens of KiB of data) start
//! latency stays the same: the copy costs what the faults on CoW pages
//! cost later.

use std::cell::RefCell;
use std::ops::Range;
use std::ptr::NonNull;

use wasmtime::{LinearMemory, MemoryCreator, MemoryType};

/// The huge page size on x86-64 and aarch64 with 4 KiB base pages.
pub(crate) const HUGE_PAGE: usize = 2 << 20;

/// Inaccessible space mapped before each memory.
const PRE_GUARD: usize = HUGE_PAGE;

thread_local! {
    /// Guest byte ranges the growth running on this thread should back
    /// with huge pages; see [`growing_with_huge_pages`].
    static HUGE_RANGES: RefCell<Vec<Range<usize>>> = const { RefCell::new(Vec::new()) };
}

/// Runs `grow`, a call on this thread that grows one guest memory, asking
/// for huge pages over `ranges` (guest byte offsets, [`HUGE_PAGE`]-aligned)
/// as far as they lie in the grown part. Pages are only asked for: where
/// the kernel has THP off or none to give, memory keeps small pages.
pub(crate) fn growing_with_huge_pages<R>(ranges: Vec<Range<usize>>, grow: impl FnOnce() -> R) -> R {
    struct Clear;
    impl Drop for Clear {
        fn drop(&mut self) {
            HUGE_RANGES.with_borrow_mut(Vec::clear);
        }
    }
    HUGE_RANGES.set(ranges);
    let _clear = Clear;
    grow()
}

/// Creates every guest linear memory; see the module docs.
pub(crate) struct GuestMemories;

// SAFETY: every memory it returns is a private anonymous mapping (zero
// filled) whose accessible bytes begin at `as_ptr`, is followed by at least
// `reserved + guard` bytes that are never mapped accessible beyond the
// current size, and is never moved or unmapped before it is dropped.
unsafe impl MemoryCreator for GuestMemories {
    fn new_memory(
        &self,
        _ty: MemoryType,
        minimum: usize,
        maximum: Option<usize>,
        reserved_size_in_bytes: Option<usize>,
        guard_size_in_bytes: usize,
    ) -> Result<Box<dyn LinearMemory>, String> {
        let reserved = reserved_size_in_bytes.or(maximum).ok_or_else(|| {
            "a linear memory without a maximum needs a reservation to grow into".to_string()
        })?;
        if minimum > reserved {
            return Err(format!(
                "a linear memory of at least {minimum} bytes does not fit its {reserved}-byte \
                 reservation"
            ));
        }
        GuestMemory::map(minimum, reserved, guard_size_in_bytes)
            .map(|memory| Box::new(memory) as Box<dyn LinearMemory>)
    }
}

/// One mapping; see the module docs for its layout.
struct GuestMemory {
    /// The whole mapping, as `mmap` returned it, for `munmap`.
    mapping: NonNull<u8>,
    mapping_len: usize,
    /// The first guest byte.
    base: NonNull<u8>,
    /// Accessible bytes from `base`.
    size: usize,
    /// Bytes from `base` that growth may reach without moving.
    capacity: usize,
}

// SAFETY: the struct owns its mapping; wasmtime serialises access to the
// memory through the store that owns it.
unsafe impl Send for GuestMemory {}
// SAFETY: as above; `&self` methods only read the struct's own fields.
unsafe impl Sync for GuestMemory {}

impl GuestMemory {
    fn map(minimum: usize, capacity: usize, guard: usize) -> Result<Self, String> {
        let page = host_page();
        let capacity = round_up(capacity, page).ok_or("linear memory reservation overflows")?;
        // Room to slide `base` to a huge-page boundary, plus both guards.
        let mapping_len = [
            PRE_GUARD,
            HUGE_PAGE,
            capacity,
            round_up(guard, page).unwrap_or(guard),
        ]
        .iter()
        .try_fold(0usize, |sum, &n| sum.checked_add(n))
        .ok_or("linear memory reservation overflows")?;
        // SAFETY: a fresh anonymous mapping with no access; it touches no
        // existing memory.
        let mapping = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                mapping_len,
                libc::PROT_NONE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if mapping == libc::MAP_FAILED {
            return Err(format!(
                "reserving {mapping_len} bytes of address space for a linear memory: {}",
                std::io::Error::last_os_error()
            ));
        }
        let mapping = NonNull::new(mapping.cast::<u8>()).ok_or("mmap returned null")?;
        let start = mapping.as_ptr() as usize + PRE_GUARD;
        let offset =
            round_up(start, HUGE_PAGE).expect("within the mapping") - mapping.as_ptr() as usize;
        // SAFETY: `offset + capacity + guard <= mapping_len` by construction.
        let base = unsafe { NonNull::new_unchecked(mapping.as_ptr().add(offset)) };
        let mut memory = Self {
            mapping,
            mapping_len,
            base,
            size: 0,
            capacity,
        };
        memory.grow_to(minimum).map_err(|e| format!("{e:#}"))?;
        Ok(memory)
    }
}

impl Drop for GuestMemory {
    fn drop(&mut self) {
        // SAFETY: the mapping is ours and wasmtime has dropped every use of
        // it before dropping the memory.
        unsafe {
            libc::munmap(self.mapping.as_ptr().cast(), self.mapping_len);
        }
    }
}

// SAFETY: `as_ptr` never changes, growth stays within `capacity`, and the
// bytes between `size` and `capacity` plus the guard stay inaccessible.
unsafe impl LinearMemory for GuestMemory {
    fn byte_size(&self) -> usize {
        self.size
    }

    fn byte_capacity(&self) -> usize {
        self.capacity
    }

    fn grow_to(&mut self, new_size: usize) -> wasmtime::Result<()> {
        if new_size <= self.size {
            return Ok(());
        }
        if new_size > self.capacity {
            wasmtime::bail!(
                "a linear memory cannot grow to {new_size} bytes, past its {}-byte reservation",
                self.capacity
            );
        }
        let page = host_page();
        let from = round_up(self.size, page).expect("below capacity");
        let to = round_up(new_size, page).expect("below capacity");
        if to > from {
            // SAFETY: `from..to` lies within this memory's reservation.
            let status = unsafe {
                libc::mprotect(
                    self.base.as_ptr().add(from).cast(),
                    to - from,
                    libc::PROT_READ | libc::PROT_WRITE,
                )
            };
            if status != 0 {
                let err = std::io::Error::last_os_error();
                wasmtime::bail!(
                    "making {} bytes of a linear memory accessible: {err}",
                    to - from
                );
            }
            self.advise_huge(from..to);
        }
        self.size = new_size;
        Ok(())
    }

    fn as_ptr(&self) -> *mut u8 {
        self.base.as_ptr()
    }
}

impl GuestMemory {
    /// Asks for huge pages where `grown` meets the ranges a restore
    /// announced on this thread, if any.
    fn advise_huge(&self, grown: Range<usize>) {
        HUGE_RANGES.with_borrow(|ranges| {
            for range in ranges {
                let start = range.start.max(grown.start);
                let end = range.end.min(grown.end);
                // Only whole huge pages can be backed by one.
                let start = round_up(start, HUGE_PAGE).unwrap_or(end);
                let end = end & !(HUGE_PAGE - 1);
                if end > start {
                    // SAFETY: an advice on part of this memory's own,
                    // accessible mapping.
                    unsafe {
                        libc::madvise(
                            self.base.as_ptr().add(start).cast(),
                            end - start,
                            libc::MADV_HUGEPAGE,
                        );
                    }
                }
            }
        });
    }
}

fn host_page() -> usize {
    // SAFETY: sysconf has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    usize::try_from(page).unwrap_or(4096)
}

fn round_up(n: usize, to: usize) -> Option<usize> {
    n.checked_add(to - 1).map(|n| n & !(to - 1))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn memory(minimum: usize, capacity: usize) -> GuestMemory {
        GuestMemory::map(minimum, capacity, 64 << 10).unwrap()
    }

    #[test]
    fn memories_start_zeroed_on_a_huge_page_boundary() {
        let m = memory(64 << 10, 64 << 20);
        assert_eq!(m.as_ptr() as usize % HUGE_PAGE, 0);
        assert_eq!(m.byte_size(), 64 << 10);
        assert_eq!(m.byte_capacity(), 64 << 20);
        // SAFETY: the first 64 KiB are accessible.
        let bytes = unsafe { std::slice::from_raw_parts(m.as_ptr(), 64 << 10) };
        assert!(bytes.iter().all(|&b| b == 0));
    }

    #[test]
    fn growth_keeps_contents_and_the_base() {
        let mut m = memory(64 << 10, 64 << 20);
        let base = m.as_ptr();
        // SAFETY: within the accessible size.
        unsafe { m.as_ptr().write(7) };
        m.grow_to(8 << 20).unwrap();
        assert_eq!(m.as_ptr(), base);
        assert_eq!(m.byte_size(), 8 << 20);
        // SAFETY: the memory grew to 8 MiB; both ends are accessible.
        unsafe {
            assert_eq!(m.as_ptr().read(), 7);
            m.as_ptr().add((8 << 20) - 1).write(9);
            assert_eq!(m.as_ptr().add((8 << 20) - 1).read(), 9);
        }
        // Shrinking is not a wasm operation; it is a no-op.
        m.grow_to(64 << 10).unwrap();
        assert_eq!(m.byte_size(), 8 << 20);
    }

    /// The `VmFlags` of the mapping that starts at `at`, from
    /// `/proc/self/smaps`.
    fn vm_flags_at(at: usize) -> String {
        let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
        let mut lines = smaps.lines();
        while let Some(line) = lines.next() {
            let start = line.split('-').next().unwrap_or("");
            if usize::from_str_radix(start, 16).ok() == Some(at) {
                return lines
                    .find(|l| l.starts_with("VmFlags:"))
                    .unwrap()
                    .to_string();
            }
        }
        panic!("no mapping starts at {at:#x}");
    }

    #[test]
    fn huge_pages_are_asked_for_only_where_announced() {
        let mut m = memory(64 << 10, 64 << 20);
        let base = m.as_ptr() as usize;
        // Grown without an announcement: small pages only.
        m.grow_to(8 << 20).unwrap();
        assert!(!vm_flags_at(base).contains(" hg"));
        // A restore announces 8-12 MiB and 16-20 MiB (and a range below the
        // grown part, which is left alone); growth to 18 MiB takes the
        // first whole and the second's whole huge page at 16-18 MiB.
        growing_with_huge_pages(
            vec![0..(4 << 20), (8 << 20)..(12 << 20), (16 << 20)..(20 << 20)],
            || m.grow_to(18 << 20).unwrap(),
        );
        assert!(!vm_flags_at(base).contains(" hg"));
        assert!(vm_flags_at(base + (8 << 20)).contains(" hg"));
        assert!(!vm_flags_at(base + (12 << 20)).contains(" hg"));
        assert!(vm_flags_at(base + (16 << 20)).contains(" hg"));
        // The announcement ends with the call.
        m.grow_to(32 << 20).unwrap();
        assert!(!vm_flags_at(base + (18 << 20)).contains(" hg"));
    }

    #[test]
    fn growth_past_the_reservation_is_refused() {
        let mut m = memory(0, 1 << 20);
        let err = m.grow_to((1 << 20) + 1).unwrap_err().to_string();
        assert!(err.contains("past its 1048576-byte reservation"), "{err}");
        assert_eq!(m.byte_size(), 0);
    }

    #[test]
    fn a_minimum_beyond_the_reservation_is_refused() {
        let err = GuestMemories
            .new_memory(MemoryType::new(1, None), 2 << 20, None, Some(1 << 20), 0)
            .err()
            .unwrap();
        assert!(err.contains("does not fit"), "{err}");
    }
}
