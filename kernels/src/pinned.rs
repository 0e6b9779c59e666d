//! Pooled pinned (page-locked) host staging buffers for asynchronous host↔device copies.
//!
//! Buffers are kept by size class and reused. A buffer remembers the event of its last copy,
//! and every host access waits for it first; a buffer dropped while a copy may still read or
//! write it waits in a retired list (without blocking the thread that dropped it) until that
//! copy's event completes, before anyone else gets it.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use crate::backend::DeviceBackend;
use crate::error::Result;
use crate::event::Event;

/// Size classes of pinned staging buffers: powers of two from 64 KiB.
const PINNED_MIN_BYTES: usize = 64 << 10;

/// Pooled page-locked host buffers of one device.
pub struct PinnedPool {
    backend: Arc<dyn DeviceBackend>,
    free: Mutex<Vec<PinnedBlock>>,
    /// Blocks dropped while a copy still used them, with that copy's event.
    retired: Mutex<Vec<(PinnedBlock, Event)>>,
    cached_bytes: AtomicUsize,
    /// Bytes of the buffers handed out and not dropped yet.
    in_use_bytes: AtomicUsize,
}

impl std::fmt::Debug for PinnedPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PinnedPool")
            .field("cached_bytes", &self.cached_bytes())
            .finish()
    }
}

struct PinnedBlock {
    ptr: *mut u8,
    capacity: usize,
    backend: Arc<dyn DeviceBackend>,
}

// SAFETY: a block is owned by exactly one PinnedBuffer or by the pool's lists.
unsafe impl Send for PinnedBlock {}

impl Drop for PinnedBlock {
    fn drop(&mut self) {
        // SAFETY: allocated by this backend with this capacity; no copy uses it any more (the
        // pool only drops blocks from its free list, whose copies have completed).
        unsafe { self.backend.free_pinned(self.ptr, self.capacity) };
    }
}

impl PinnedPool {
    pub(crate) fn new(backend: Arc<dyn DeviceBackend>) -> Self {
        PinnedPool {
            backend,
            free: Mutex::new(Vec::new()),
            retired: Mutex::new(Vec::new()),
            cached_bytes: AtomicUsize::new(0),
            in_use_bytes: AtomicUsize::new(0),
        }
    }

    /// Bytes held by buffers waiting in the pool for reuse (those whose last copy is still in
    /// flight included).
    pub fn cached_bytes(&self) -> usize {
        self.cached_bytes.load(Ordering::Relaxed)
    }

    /// Bytes of the pinned buffers in use: handed out and not dropped. Zero between queries,
    /// or a buffer leaked.
    pub fn in_use_bytes(&self) -> usize {
        self.in_use_bytes.load(Ordering::Relaxed)
    }

    pub(crate) fn take(self: &Arc<Self>, bytes: usize) -> Result<PinnedBuffer> {
        let capacity = bytes.max(1).next_power_of_two().max(PINNED_MIN_BYTES);
        self.reclaim();
        let reused = {
            let mut free = self.free.lock().unwrap_or_else(|p| p.into_inner());
            free.iter()
                .position(|b| b.capacity == capacity)
                .map(|i| free.swap_remove(i))
        };
        let block = match reused {
            Some(b) => {
                self.cached_bytes.fetch_sub(b.capacity, Ordering::Relaxed);
                b
            }
            None => PinnedBlock {
                ptr: self.backend.alloc_pinned(capacity)?,
                capacity,
                backend: Arc::clone(&self.backend),
            },
        };
        self.in_use_bytes
            .fetch_add(block.capacity, Ordering::Relaxed);
        Ok(PinnedBuffer {
            block: Some(block),
            len: bytes,
            pending: None,
            upload_pending: false,
            pool: Arc::clone(self),
        })
    }

    /// Moves retired blocks whose copies have finished back to the free list.
    fn reclaim(&self) {
        let done: Vec<PinnedBlock> = {
            let mut retired = self.retired.lock().unwrap_or_else(|p| p.into_inner());
            let (done, pending): (Vec<_>, Vec<_>) =
                retired.drain(..).partition(|(_, e)| e.is_complete());
            *retired = pending;
            done.into_iter().map(|(b, _)| b).collect()
        };
        for b in done {
            self.cached_bytes.fetch_sub(b.capacity, Ordering::Relaxed);
            self.give_back(b);
        }
    }

    fn give_back(&self, block: PinnedBlock) {
        self.cached_bytes
            .fetch_add(block.capacity, Ordering::Relaxed);
        self.free
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(block);
    }

    /// Frees every cached buffer whose last copy has finished.
    pub fn trim(&self) {
        self.reclaim();
        let drained: Vec<_> = self
            .free
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .drain(..)
            .collect();
        for b in drained {
            self.cached_bytes.fetch_sub(b.capacity, Ordering::Relaxed);
        }
    }
}

/// A pinned host staging buffer of `len` bytes. Copies from or into it are truly asynchronous;
/// the buffer remembers the last copy's event, and every host access waits for it first.
pub struct PinnedBuffer {
    block: Option<PinnedBlock>,
    len: usize,
    pending: Option<Event>,
    /// The pending copy (or one before it) is an upload, which reads the bytes.
    upload_pending: bool,
    pool: Arc<PinnedPool>,
}

impl std::fmt::Debug for PinnedBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PinnedBuffer")
            .field("len", &self.len)
            .field("pending", &self.pending.is_some())
            .finish()
    }
}

impl PinnedBuffer {
    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when zero bytes long.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    fn ptr(&self) -> *mut u8 {
        self.block.as_ref().map_or(std::ptr::null_mut(), |b| b.ptr)
    }

    /// Waits for the last copy that uses this buffer.
    pub fn wait(&mut self) -> Result<()> {
        if let Some(e) = self.pending.take() {
            e.synchronize()?;
        }
        self.upload_pending = false;
        Ok(())
    }

    /// The bytes, after any pending copy completes.
    pub fn as_bytes(&mut self) -> Result<&[u8]> {
        self.wait()?;
        // SAFETY: the block holds at least `len` bytes and no copy is in flight.
        Ok(unsafe { std::slice::from_raw_parts(self.ptr(), self.len) })
    }

    /// The bytes for writing, after any pending copy completes.
    pub fn as_bytes_mut(&mut self) -> Result<&mut [u8]> {
        self.wait()?;
        // SAFETY: as in `as_bytes`, and `&mut self` makes the access exclusive.
        Ok(unsafe { std::slice::from_raw_parts_mut(self.ptr(), self.len) })
    }

    /// The bytes as they are now, without waiting for a copy in flight: what a host read that
    /// forgot its synchronisation sees. Only for tests of the emulator's strictness.
    ///
    /// # Safety
    /// A copy may be writing the bytes while they are read; the caller must not rely on them.
    #[doc(hidden)]
    pub unsafe fn as_bytes_unsynchronized(&self) -> &[u8] {
        // SAFETY: the block holds at least `len` bytes; the caller accepts the race.
        unsafe { std::slice::from_raw_parts(self.ptr(), self.len) }
    }

    pub(crate) fn raw_ptr(&self) -> *mut u8 {
        self.ptr()
    }

    /// True unless an upload may still read the buffer's bytes (downloads into other ranges
    /// of it may be in flight).
    pub(crate) fn is_idle(&self) -> bool {
        !self.upload_pending || self.pending.as_ref().is_none_or(Event::is_complete)
    }

    pub(crate) fn set_upload_pending(&mut self, e: Event) {
        self.pending = Some(e);
        self.upload_pending = true;
    }

    pub(crate) fn set_pending(&mut self, e: Event) {
        self.pending = Some(e);
    }
}

impl Drop for PinnedBuffer {
    fn drop(&mut self) {
        let Some(block) = self.block.take() else {
            return;
        };
        self.pool
            .in_use_bytes
            .fetch_sub(block.capacity, Ordering::Relaxed);
        match self.pending.take() {
            Some(e) if !e.is_complete() => {
                self.pool
                    .cached_bytes
                    .fetch_add(block.capacity, Ordering::Relaxed);
                self.pool
                    .retired
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .push((block, e));
            }
            _ => self.pool.give_back(block),
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::device::{Device, DeviceOptions};

    #[test]
    fn pinned_buffers_are_reused_by_size_class() {
        let device = Device::emulated(DeviceOptions::default()).unwrap();
        let pool = device.pinned_pool();
        let mut b = device.pinned(1000).unwrap();
        b.as_bytes_mut().unwrap().fill(7);
        let first = b.raw_ptr();
        drop(b);
        assert_eq!(pool.cached_bytes(), super::PINNED_MIN_BYTES);
        let mut c = device.pinned(2000).unwrap();
        assert_eq!(c.raw_ptr(), first);
        assert_eq!(c.as_bytes().unwrap().len(), 2000);
        drop(c);
        pool.trim();
        assert_eq!(pool.cached_bytes(), 0);
    }
}
