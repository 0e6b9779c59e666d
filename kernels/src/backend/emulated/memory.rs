//! Checked device memory for the emulator: guard zones, poison, quarantine and a registry that
//! turns a faulting address into "which buffer, which element".
//!
//! Each allocation is its own mapping:
//!
//! ```text
//!  | guard page | canary ... data (bytes, rounded up to 16) | guard page |
//!  ^ base        ^ base + PAGE          ^ data (right-aligned)           ^ base + map_len
//! ```
//!
//! - The data ends 16-byte aligned against the trailing guard page, so a read or write past
//!   the end faults at once (the emulator's signal handler names the kernel, the buffer and the
//!   index); a small overrun into the rounding slack, or an underrun into the leading canary,
//!   is found by the canary check after every launch that was passed the buffer, and at free.
//! - New memory reads as poison (0xCD bytes: -842150451 as an i32, -4.3e8 as an f32), so a
//!   kernel that reads what nobody wrote computes visibly wrong values.
//! - Freed memory is unmapped for access (PROT_NONE) and kept in a quarantine, so a use after
//!   free faults and is reported with the buffer it once was. In strict mode the allocator
//!   also hands a freed mapping of the right size to the next allocation at once, from any
//!   stream, as the CUDA pool does: a kernel still using it on another stream then reads the
//!   new owner's poison.
//!
//! Addresses are process-wide, so the registry is too: every emulated device shares it.

use std::collections::{BTreeMap, VecDeque};
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Mutex, RwLock};

use crate::backend::ElemInfo;
use crate::error::{KernelError, Result};

/// Bytes of new, unwritten memory.
pub(crate) const POISON_NEW: u8 = 0xCD;
/// Bytes around the data that nothing may write.
const CANARY: u8 = 0xFD;
/// Data alignment: the widest element (i128) a kernel reads.
const ALIGN: usize = 16;
/// Freed mappings kept unmapped for access before they are returned to the system.
const QUARANTINE_ENTRIES: usize = 4096;

fn page() -> usize {
    // SAFETY: sysconf has no preconditions.
    let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if p > 0 { p as usize } else { 4096 }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Live,
    Freed { by_stream: u64 },
}

#[derive(Debug, Clone, Copy)]
struct Entry {
    id: u64,
    /// A heap allocation with canaries only (see [`heap_alloc`]), not a guarded mapping.
    heap: bool,
    map_len: usize,
    data_offset: usize,
    bytes: usize,
    elem: ElemInfo,
    stream: u64,
    /// The emulated device the buffer belongs to ([`Owner::device`]).
    device: u32,
    state: State,
}

impl Entry {
    fn inner_len(&self, page: usize) -> usize {
        self.map_len - 2 * page
    }

    /// Where the leading canary starts: after the guard page of a mapping, at the start of a
    /// heap allocation.
    fn lead(&self, base: usize, page: usize) -> usize {
        if self.heap { base } else { base + page }
    }
}

/// Mapped (guarded) allocations live now. Each takes up to three of the process's memory
/// mappings, of which Linux allows `vm.max_map_count` (65530 by default); past
/// [`mapped_limit`] allocations come from the heap with canaries only, so that threads and
/// libraries still find mappings.
static MAPPED: AtomicUsize = AtomicUsize::new(0);

fn mapped_limit() -> usize {
    static LIMIT: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *LIMIT.get_or_init(|| {
        let max = std::fs::read_to_string("/proc/sys/vm/max_map_count")
            .ok()
            .and_then(|t| t.trim().parse::<usize>().ok())
            .unwrap_or(65_530);
        max.saturating_sub(QUARANTINE_ENTRIES + 8192) / 3
    })
}

/// Canary bytes on each side of a heap allocation.
const HEAP_CANARY: usize = 64;

struct Registry {
    by_base: BTreeMap<usize, Entry>,
    quarantine: VecDeque<usize>,
}

static REGISTRY: RwLock<Registry> = RwLock::new(Registry {
    by_base: BTreeMap::new(),
    quarantine: VecDeque::new(),
});
/// Serialises quarantine reuse and eviction (the registry lock is for lookups).
static ALLOCATOR: Mutex<()> = Mutex::new(());
static NEXT_ID: AtomicU64 = AtomicU64::new(1);

fn registry_read() -> std::sync::RwLockReadGuard<'static, Registry> {
    REGISTRY.read().unwrap_or_else(|p| p.into_inner())
}

fn registry_write() -> std::sync::RwLockWriteGuard<'static, Registry> {
    REGISTRY.write().unwrap_or_else(|p| p.into_inner())
}

/// Who allocated a buffer: an emulated device (a process-wide number, see
/// `EmuDevice::open`) and the stream on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Owner {
    pub(crate) device: u32,
    pub(crate) stream: u64,
}

impl Owner {
    pub(crate) fn new(device: u32, stream: u64) -> Owner {
        Owner { device, stream }
    }
}

/// Checks that the live buffer holding `addr`, if any, belongs to emulated device `device`.
/// A GPU cannot address another GPU's memory without peer access, which the emulator does not
/// give: a kernel or copy on one device passed another's buffer is a bug a real machine would
/// turn into an illegal address (or, worse, another buffer's bytes). Returns what was wrong.
pub(crate) fn check_device(addr: u64, device: u32, what: &str) -> std::result::Result<(), String> {
    let reg = registry_read();
    let Some((_, e)) = lookup(&reg, addr as usize) else {
        return Ok(());
    };
    if e.device == device || e.state != State::Live {
        return Ok(());
    }
    let mut text = String::new();
    describe_buffer(&mut text, &e);
    Err(format!(
        "{what} on emulated device {device} was passed {text}, which belongs to emulated device \
         {} (devices do not address each other's memory: copy it across first)",
        e.device
    ))
}

/// One live emulated allocation.
#[derive(Debug)]
pub(crate) struct Region {
    base: usize,
    data: usize,
    id: u64,
}

impl Region {
    pub(crate) fn address(&self) -> u64 {
        self.data as u64
    }
}

fn fill(at: usize, len: usize, byte: u8) {
    if len > 0 {
        // SAFETY: callers pass ranges inside a mapping they just made readable and writable.
        unsafe { std::ptr::write_bytes(at as *mut u8, byte, len) };
    }
}

/// Allocates `bytes` (> 0). With `reuse`, a quarantined mapping of the same size is handed
/// out again at once, whichever stream freed it.
pub(crate) fn alloc(bytes: usize, elem: ElemInfo, owner: Owner, reuse: bool) -> Result<Region> {
    let page = page();
    let data_len = bytes.div_ceil(ALIGN) * ALIGN;
    let inner = data_len.div_ceil(page) * page;
    let map_len = inner + 2 * page;
    let data_offset = page + inner - data_len;
    let _guard = ALLOCATOR.lock().unwrap_or_else(|p| p.into_inner());
    if MAPPED.load(Ordering::Relaxed) >= mapped_limit() {
        return heap_alloc(bytes, elem, owner);
    }
    let mut base = None;
    if reuse {
        let mut reg = registry_write();
        let found = reg
            .quarantine
            .iter()
            .rposition(|b| reg.by_base.get(b).is_some_and(|e| e.map_len == map_len));
        if let Some(i) = found {
            base = reg.quarantine.remove(i);
        }
    }
    let base = match base {
        Some(b) => b,
        None => match map(map_len) {
            Ok(b) => b,
            // Out of mappings even after the quarantine went back: canaries only.
            Err(_) => return heap_alloc(bytes, elem, owner),
        },
    };
    let open = || {
        // SAFETY: `base..base + map_len` is our mapping; the data pages become accessible.
        unsafe {
            libc::mprotect(
                (base + page) as *mut libc::c_void,
                inner,
                libc::PROT_READ | libc::PROT_WRITE,
            )
        }
    };
    let mut rc = open();
    if rc != 0 {
        // Splitting the mapping needs a mapping more (vm.max_map_count): give the quarantine
        // back and try again.
        evict(usize::MAX);
        rc = open();
    }
    if rc != 0 {
        // SAFETY: our mapping, not registered as live.
        unsafe { libc::munmap(base as *mut libc::c_void, map_len) };
        registry_write().by_base.remove(&base);
        return Err(KernelError::OutOfMemory {
            requested_bytes: bytes,
            free_bytes: 0,
        });
    }
    fill(base + page, data_offset - page, CANARY);
    fill(base + data_offset, bytes, POISON_NEW);
    fill(base + data_offset + bytes, data_len - bytes, CANARY);
    MAPPED.fetch_add(1, Ordering::Relaxed);
    Ok(register(
        base,
        false,
        map_len,
        data_offset,
        bytes,
        elem,
        owner,
    ))
}

/// Enters a new live allocation in the registry.
fn register(
    base: usize,
    heap: bool,
    map_len: usize,
    data_offset: usize,
    bytes: usize,
    elem: ElemInfo,
    owner: Owner,
) -> Region {
    let id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
    registry_write().by_base.insert(
        base,
        Entry {
            id,
            heap,
            map_len,
            data_offset,
            bytes,
            elem,
            stream: owner.stream,
            device: owner.device,
            state: State::Live,
        },
    );
    Region {
        base,
        data: base + data_offset,
        id,
    }
}

/// An allocation from the heap, `HEAP_CANARY` canary bytes on each side: what the emulator
/// falls back to when guarded mappings run out. Overruns are still found by the canary checks,
/// but not at the faulting access, and freed memory is poisoned but not quarantined.
fn heap_alloc(bytes: usize, elem: ElemInfo, owner: Owner) -> Result<Region> {
    let data_len = bytes.div_ceil(ALIGN) * ALIGN;
    let total = HEAP_CANARY + data_len + HEAP_CANARY;
    let layout = std::alloc::Layout::from_size_align(total, HEAP_CANARY).map_err(|_| {
        KernelError::OutOfMemory {
            requested_bytes: bytes,
            free_bytes: 0,
        }
    })?;
    // SAFETY: a non-zero size.
    let base = unsafe { std::alloc::alloc(layout) } as usize;
    if base == 0 {
        return Err(KernelError::OutOfMemory {
            requested_bytes: bytes,
            free_bytes: 0,
        });
    }
    fill(base, HEAP_CANARY, CANARY);
    fill(base + HEAP_CANARY, bytes, POISON_NEW);
    fill(
        base + HEAP_CANARY + bytes,
        total - HEAP_CANARY - bytes,
        CANARY,
    );
    Ok(register(base, true, total, HEAP_CANARY, bytes, elem, owner))
}

/// A new inaccessible mapping, evicting quarantined ones when the system refuses.
fn map(map_len: usize) -> Result<usize> {
    for attempt in 0..2 {
        // SAFETY: a fresh anonymous mapping; nothing else refers to it.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                map_len,
                libc::PROT_NONE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if p != libc::MAP_FAILED {
            return Ok(p as usize);
        }
        if attempt == 0 {
            // Out of mappings (vm.max_map_count) or address space: give the quarantine back.
            evict(usize::MAX);
        }
    }
    Err(KernelError::OutOfMemory {
        requested_bytes: map_len,
        free_bytes: 0,
    })
}

/// Returns up to `count` of the oldest quarantined mappings to the system.
fn evict(count: usize) {
    let mut reg = registry_write();
    for _ in 0..count {
        let Some(base) = reg.quarantine.pop_front() else {
            break;
        };
        if let Some(e) = reg.by_base.remove(&base) {
            // SAFETY: a quarantined mapping nobody owns any more.
            unsafe { libc::munmap(base as *mut libc::c_void, e.map_len) };
        }
    }
}

/// Frees a region (when its stream reaches the free): checks its canaries, makes it
/// inaccessible and quarantines it. Returns what the canaries show was overwritten.
pub(crate) fn free(region: Region, by_stream: u64) -> Option<String> {
    let page = page();
    let damage = check_canaries(region.data as u64);
    let _guard = ALLOCATOR.lock().unwrap_or_else(|p| p.into_inner());
    let mut reg = registry_write();
    let Some(entry) = reg.by_base.get_mut(&region.base) else {
        return Some(format!(
            "buffer #{} was freed twice (this is a bug)",
            region.id
        ));
    };
    if entry.heap {
        let (total, bytes) = (entry.map_len, entry.bytes);
        reg.by_base.remove(&region.base);
        drop(reg);
        // Poisoned for a read that races the free; then back to the heap.
        fill(region.data, bytes, 0xDD);
        if let Ok(layout) = std::alloc::Layout::from_size_align(total, HEAP_CANARY) {
            // SAFETY: allocated with this layout in `heap_alloc`, freed once.
            unsafe { std::alloc::dealloc(region.base as *mut u8, layout) };
        }
        return damage;
    }
    MAPPED.fetch_sub(1, Ordering::Relaxed);
    let inner = entry.inner_len(page);
    // SAFETY: our mapping; from now on every access faults.
    unsafe {
        libc::mprotect(
            region.base as *mut libc::c_void,
            entry.map_len,
            libc::PROT_NONE,
        );
        // The bytes need not survive: nothing may read them, and reuse poisons them again.
        libc::madvise(
            (region.base + page) as *mut libc::c_void,
            inner,
            libc::MADV_DONTNEED,
        );
    }
    entry.state = State::Freed { by_stream };
    reg.quarantine.push_back(region.base);
    let excess = reg.quarantine.len().saturating_sub(QUARANTINE_ENTRIES);
    drop(reg);
    if excess > 0 {
        evict(excess);
    }
    damage
}

fn lookup(reg: &Registry, addr: usize) -> Option<(usize, Entry)> {
    let (&base, e) = reg.by_base.range(..=addr).next_back()?;
    (addr < base + e.map_len).then_some((base, *e))
}

fn describe_buffer(out: &mut impl std::fmt::Write, e: &Entry) {
    let size = e.elem.size.max(1);
    let _ = write!(
        out,
        "buffer #{} ({} x {}, {} bytes, allocated on stream {} of device {})",
        e.id,
        e.elem.name,
        e.bytes / size,
        e.bytes,
        e.stream,
        e.device
    );
}

/// Describes an access to `addr` that faulted: a guard zone, freed memory, or no allocation.
/// Writes into `out` without allocating (it runs in a signal handler).
pub(crate) fn describe_fault(out: &mut impl std::fmt::Write, addr: u64, write: Option<bool>) {
    let access = match write {
        Some(true) => "write",
        Some(false) => "read",
        None => "access",
    };
    let reg = registry_read();
    let Some((base, e)) = lookup(&reg, addr as usize) else {
        let _ = write!(
            out,
            "illegal address: {access} of {addr:#x}, which is in no device allocation \
             (a null, uninitialised or stale pointer)"
        );
        return;
    };
    let data = (base + e.data_offset) as i128;
    let offset = addr as i128 - data;
    let size = e.elem.size.max(1) as i128;
    match e.state {
        State::Live => {
            let _ = write!(out, "out-of-bounds {access} at byte offset {offset}");
            if offset >= 0 {
                let _ = write!(out, " (element {})", offset / size);
            }
            let _ = write!(out, " of ");
            describe_buffer(out, &e);
        }
        State::Freed { by_stream } => {
            let _ = write!(
                out,
                "use after free: {access} at byte offset {offset} (element {}) of ",
                offset.div_euclid(size)
            );
            describe_buffer(out, &e);
            let _ = write!(
                out,
                ", freed on stream {by_stream} before this work ran (a free ordered on one \
                 stream does not wait for another)"
            );
        }
    }
}

/// Checks that `addr..addr + len` lies inside one live allocation: what a copy may touch.
#[cfg(test)]
fn check_range(addr: u64, len: usize, what: &str) -> std::result::Result<(), String> {
    check_in(&registry_read(), addr, len, what)
}

/// Runs `copy` once every range is checked, with the registry locked for reading: no free can
/// make a range inaccessible until it is done.
pub(crate) fn while_live<R>(
    ranges: &[(u64, usize, &str)],
    copy: impl FnOnce() -> R,
) -> std::result::Result<R, String> {
    let reg = registry_read();
    for (addr, len, what) in ranges {
        check_in(&reg, *addr, *len, what)?;
    }
    Ok(copy())
}

fn check_in(reg: &Registry, addr: u64, len: usize, what: &str) -> std::result::Result<(), String> {
    let fail = |detail: String| Err(format!("{what} of {len} bytes at {addr:#x}: {detail}"));
    let Some((base, e)) = lookup(reg, addr as usize) else {
        return fail("not in any device allocation".into());
    };
    let data = base + e.data_offset;
    let mut text = String::new();
    describe_buffer(&mut text, &e);
    if let State::Freed { by_stream } = e.state {
        return fail(format!(
            "use after free of {text}, freed on stream {by_stream} before the copy ran"
        ));
    }
    let start = addr as usize;
    if start < data || start + len > data + e.bytes {
        return fail(format!(
            "out of bounds of {text} (bytes {}..{})",
            start as i128 - data as i128,
            (start + len) as i128 - data as i128
        ));
    }
    Ok(())
}

/// Checks the canary bytes around the live allocation holding `addr`, if any: a kernel wrote
/// just before or just after its data. Returns the description of the damage.
pub(crate) fn check_canaries(addr: u64) -> Option<String> {
    let page = page();
    let reg = registry_read();
    let (base, e) = lookup(&reg, addr as usize)?;
    if e.state != State::Live {
        return None;
    }
    let data = base + e.data_offset;
    let data_len = e.bytes.div_ceil(ALIGN) * ALIGN;
    let lead = e.lead(base, page);
    // SAFETY: both ranges are inside the live allocation's accessible bytes.
    let before = unsafe { std::slice::from_raw_parts(lead as *const u8, data - lead) };
    let after =
        unsafe { std::slice::from_raw_parts((data + e.bytes) as *const u8, data_len - e.bytes) };
    let bad_before = before.iter().rposition(|b| *b != CANARY);
    let bad_after = after.iter().position(|b| *b != CANARY);
    if bad_before.is_none() && bad_after.is_none() {
        return None;
    }
    let mut text = String::new();
    if let Some(i) = bad_before {
        let _ = write!(
            text,
            "out-of-bounds write at byte offset {} ",
            i as i128 - before.len() as i128
        );
    } else if let Some(i) = bad_after {
        let size = e.elem.size.max(1);
        let off = e.bytes + i;
        let _ = write!(
            text,
            "out-of-bounds write at byte offset {off} (element {}) ",
            off / size
        );
    }
    text.push_str("of ");
    describe_buffer(&mut text, &e);
    text.push_str(" (its guard zone was overwritten)");
    Some(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    const U32: ElemInfo = ElemInfo {
        name: "u32",
        size: 4,
    };

    #[test]
    fn new_memory_is_poison_and_ends_at_its_guard() {
        let r = alloc(40, U32, Owner::new(0, 1), false).unwrap();
        // SAFETY: 40 live bytes.
        let bytes = unsafe { std::slice::from_raw_parts(r.address() as *const u8, 40) };
        assert!(bytes.iter().all(|b| *b == POISON_NEW));
        assert_eq!(
            (r.address() as usize + 48) % page(),
            0,
            "ends at the guard page"
        );
        assert!(check_range(r.address(), 40, "copy").is_ok());
        let oob = check_range(r.address() + 4, 40, "copy").unwrap_err();
        assert!(
            oob.contains("out of bounds") && oob.contains("u32 x 10"),
            "{oob}"
        );
        assert!(free(r, 1).is_none());
    }

    #[test]
    fn canaries_catch_small_overruns_and_underruns() {
        let r = alloc(10, U32, Owner::new(0, 1), false).unwrap();
        // SAFETY: inside the mapping's accessible pages (the rounding slack).
        unsafe { *(r.address() as *mut u8).add(12) = 1 };
        let msg = check_canaries(r.address()).unwrap();
        assert!(msg.contains("byte offset 12 (element 3)"), "{msg}");
        let msg = free(r, 1).unwrap();
        assert!(msg.contains("guard zone"), "{msg}");
        let r = alloc(100, U32, Owner::new(0, 1), false).unwrap();
        // SAFETY: the leading canary, inside the mapping.
        unsafe { *(r.address() as *mut u8).sub(4) = 0 };
        let msg = check_canaries(r.address()).unwrap();
        assert!(msg.contains("byte offset -4"), "{msg}");
        free(r, 1);
    }

    #[test]
    fn freed_memory_is_described_as_freed() {
        let r = alloc(64, U32, Owner::new(0, 3), false).unwrap();
        let addr = r.address();
        free(r, 5);
        let err = check_range(addr, 8, "copy source").unwrap_err();
        assert!(
            err.contains("use after free") && err.contains("stream 5"),
            "{err}"
        );
        let mut text = String::new();
        describe_fault(&mut text, addr + 8, Some(false));
        assert!(
            text.contains("use after free: read at byte offset 8 (element 2)"),
            "{text}"
        );
        let mut text = String::new();
        describe_fault(&mut text, 8, Some(true));
        assert!(text.contains("illegal address"), "{text}");
    }

    #[test]
    fn heap_allocations_keep_their_canaries() {
        let r = heap_alloc(10, U32, Owner::new(0, 1)).unwrap();
        assert!(check_range(r.address(), 10, "copy").is_ok());
        // SAFETY: inside the allocation's tail canary.
        unsafe { *(r.address() as *mut u8).add(10) = 7 };
        assert!(
            check_canaries(r.address())
                .unwrap()
                .contains("byte offset 10")
        );
        assert!(free(r, 1).is_some());
    }

    #[test]
    fn reuse_hands_a_freed_mapping_out_again() {
        // An odd size, so that no other test's mapping is the same size.
        let bytes = 5 * page() + 8;
        let r = alloc(bytes, U32, Owner::new(0, 1), false).unwrap();
        let addr = r.address();
        free(r, 1);
        let again = alloc(bytes, U32, Owner::new(0, 2), true).unwrap();
        assert_eq!(again.address(), addr, "the pool reuses it at once");
        // SAFETY: live again, and poisoned.
        assert_eq!(unsafe { *(addr as *const u8) }, POISON_NEW);
        free(again, 2);
    }
}
