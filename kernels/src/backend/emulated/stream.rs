//! Emulated streams: a queue of operations run in order by one host thread per stream.
//!
//! A launch or a copy is queued and the call returns; the stream's thread runs it later. Frees
//! are queued too, on the stream that allocated the memory, and take effect when that stream
//! reaches them, whatever other streams are still doing. Events complete when their stream
//! reaches them; a stream waiting for an event does not run further until then. In strict mode
//! the thread sleeps a random few hundred microseconds before some operations, so that streams
//! interleave differently from run to run.
//!
//! After a faulting operation the device is unhealthy: later work on every stream is skipped
//! (frees and events still complete, so nothing waits forever), and the next call that waits
//! reports the fault, as a sticky CUDA error does.

use std::any::Any;
use std::collections::VecDeque;
use std::sync::{Arc, Condvar, Mutex, Weak};
use std::time::{Duration, Instant};

use super::grid::{self, GridRun};
use super::memory::{self, POISON_NEW, Region};
use super::{EmuKernel, Rng, Shared, mix};
use crate::backend::{DeviceMemory, ElemInfo, EventBackend, HostPtr, StreamBackend};
use crate::error::{KernelError, Result};
use crate::launch::{Kernel, KernelArg, LaunchConfig};

enum Op {
    Launch {
        kernel: Kernel,
        cfg: LaunchConfig,
        args: Vec<KernelArg>,
    },
    /// Pageable bytes, staged when the copy was issued.
    Write {
        dst: u64,
        bytes: Vec<u8>,
    },
    /// Pinned host memory, read when the copy runs.
    WritePinned {
        src: HostPtr,
        dst: u64,
        len: usize,
    },
    /// Into host memory (pinned, or pageable with the host waiting).
    Read {
        src: u64,
        dst: HostPtr,
        len: usize,
    },
    Copy {
        src: u64,
        dst: u64,
        len: usize,
    },
    Fill {
        dst: u64,
        len: usize,
        byte: u8,
    },
    Free(Region),
    Record(Arc<EmuEvent>),
    Wait(Arc<EmuEvent>),
}

impl Op {
    /// Operations that still run on an unhealthy device.
    fn always_runs(&self) -> bool {
        matches!(self, Op::Free(_) | Op::Record(_) | Op::Wait(_))
    }
}

/// What went wrong on a stream, reported to the next call that waits on it.
#[derive(Debug, Clone)]
enum Fault {
    Kernel {
        entry: String,
        grid: (u32, u32, u32),
        block: (u32, u32, u32),
        message: String,
    },
    Other {
        call: &'static str,
        message: String,
    },
}

impl Fault {
    fn to_error(&self) -> KernelError {
        match self.clone() {
            Fault::Kernel {
                entry,
                grid,
                block,
                message,
            } => KernelError::Launch {
                entry,
                grid,
                block,
                message,
            },
            Fault::Other { call, message } => KernelError::Driver { call, message },
        }
    }

    fn describe(&self) -> String {
        match self {
            Fault::Kernel { entry, message, .. } => format!("kernel `{entry}` failed: {message}"),
            Fault::Other { call, message } => format!("`{call}` failed: {message}"),
        }
    }
}

#[derive(Default)]
struct QueueState {
    ops: VecDeque<Op>,
    issued: u64,
    completed: u64,
    closed: bool,
    fault: Option<Fault>,
}

/// One stream's queue, run by its worker thread.
pub(crate) struct Queue {
    id: u64,
    state: Mutex<QueueState>,
    /// The worker waits here for work.
    work: Condvar,
    /// Hosts wait here for completion.
    done: Condvar,
    shared: Arc<Shared>,
}

impl Queue {
    fn lock(&self) -> std::sync::MutexGuard<'_, QueueState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn push(&self, op: Op) {
        let mut s = self.lock();
        s.ops.push_back(op);
        s.issued += 1;
        drop(s);
        self.work.notify_one();
    }

    /// Waits until everything issued so far has run; returns this stream's fault, if any.
    fn wait_for(&self, target: u64) -> Option<Fault> {
        let mut s = self.lock();
        while s.completed < target {
            s = self.done.wait(s).unwrap_or_else(|p| p.into_inner());
        }
        s.fault.clone()
    }

    pub(crate) fn wait_idle(&self) {
        let target = self.lock().issued;
        self.wait_for(target);
    }

    fn sync(&self) -> Result<()> {
        let target = self.lock().issued;
        match self.wait_for(target) {
            Some(f) => Err(f.to_error()),
            None => Ok(()),
        }
    }

    fn run(self: Arc<Self>) {
        let strict = self.shared.options.strict;
        let rng = Rng::new(mix(strict.unwrap_or(0) ^ self.id.wrapping_mul(0x5851_f42d)));
        let mut launches = 0u64;
        loop {
            let op = {
                let mut s = self.lock();
                loop {
                    if let Some(op) = s.ops.pop_front() {
                        break op;
                    }
                    if s.closed {
                        return;
                    }
                    s = self.work.wait(s).unwrap_or_else(|p| p.into_inner());
                }
            };
            if strict.is_some() && rng.next().is_multiple_of(4) {
                std::thread::sleep(Duration::from_micros(rng.next() % 300));
            }
            let health = self.shared.health.check();
            let healthy = health.is_ok() && self.lock().fault.is_none();
            let fault = if healthy || op.always_runs() {
                let seed = strict.map(|s| mix(s ^ self.id << 32 ^ launches) | 1);
                launches += u64::from(matches!(op, Op::Launch { .. }));
                // A panic here would leave every waiter of this stream waiting forever.
                std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    self.execute(op, seed.unwrap_or(0))
                }))
                .unwrap_or_else(|p| {
                    let what = p
                        .downcast_ref::<String>()
                        .map(String::as_str)
                        .or_else(|| p.downcast_ref::<&str>().copied())
                        .unwrap_or("a panic");
                    Some(Fault::Other {
                        call: "the emulator",
                        message: format!("an emulated stream operation panicked (a bug): {what}"),
                    })
                })
            } else {
                // Skipped: this stream's waiters must learn why their work did not run.
                health.err().map(|e| Fault::Other {
                    call: "the emulated stream",
                    message: format!("skipped after an earlier fault: {e}"),
                })
            };
            let mut s = self.lock();
            if let Some(f) = fault {
                if healthy {
                    self.shared
                        .health
                        .mark(format!("stream {}: {}", self.id, f.describe()));
                }
                s.fault.get_or_insert(f);
            }
            s.completed += 1;
            drop(s);
            self.done.notify_all();
        }
    }

    fn execute(&self, op: Op, seed: u64) -> Option<Fault> {
        let other = |call: &'static str, message: String| Some(Fault::Other { call, message });
        match op {
            Op::Launch { kernel, cfg, args } => self.launch(&kernel, cfg, &args, seed),
            // Each copy runs while the registry is locked for reading, so that no free on
            // another stream can unmap a range between its check and the copy.
            Op::Write { dst, bytes } => {
                let range = [(dst, bytes.len(), "host-to-device copy")];
                // SAFETY: the destination is a live allocation of at least this size.
                let copy = || unsafe {
                    std::ptr::copy_nonoverlapping(bytes.as_ptr(), dst as *mut u8, bytes.len())
                };
                memory::while_live(&range, copy)
                    .err()
                    .and_then(|m| other("cuMemcpyHtoDAsync", m))
            }
            Op::WritePinned { src, dst, len } => {
                let range = [(dst, len, "host-to-device copy")];
                // SAFETY: checked destination; the pinned source is kept alive by its event.
                let copy = || unsafe { std::ptr::copy_nonoverlapping(src.0, dst as *mut u8, len) };
                memory::while_live(&range, copy)
                    .err()
                    .and_then(|m| other("cuMemcpyHtoDAsync", m))
            }
            Op::Read { src, dst, len } => {
                let range = [(src, len, "device-to-host copy")];
                // SAFETY: checked source; the host destination outlives the copy.
                let copy =
                    || unsafe { std::ptr::copy_nonoverlapping(src as *const u8, dst.0, len) };
                memory::while_live(&range, copy)
                    .err()
                    .and_then(|m| other("cuMemcpyDtoHAsync", m))
            }
            Op::Copy { src, dst, len } => {
                let ranges = [
                    (src, len, "device copy source"),
                    (dst, len, "device copy destination"),
                ];
                // SAFETY: both ranges are live allocations; `copy` allows overlap.
                let copy = || unsafe { std::ptr::copy(src as *const u8, dst as *mut u8, len) };
                memory::while_live(&ranges, copy)
                    .err()
                    .and_then(|m| other("cuMemcpyDtoDAsync", m))
            }
            Op::Fill { dst, len, byte } => {
                let range = [(dst, len, "memset")];
                // SAFETY: a live allocation of at least this size.
                let fill = || unsafe { std::ptr::write_bytes(dst as *mut u8, byte, len) };
                memory::while_live(&range, fill)
                    .err()
                    .and_then(|m| other("cuMemsetD8Async", m))
            }
            Op::Free(region) => memory::free(region, self.id).map(|damage| Fault::Other {
                call: "cuMemFreeAsync",
                message: format!("{damage}, found when the buffer was freed"),
            }),
            Op::Record(event) => {
                event.complete();
                None
            }
            Op::Wait(event) => {
                event.wait();
                None
            }
        }
    }

    fn launch(
        &self,
        kernel: &Kernel,
        cfg: LaunchConfig,
        args: &[KernelArg],
        seed: u64,
    ) -> Option<Fault> {
        let Some(k) = kernel.imp.as_any().downcast_ref::<EmuKernel>() else {
            return Some(Fault::Other {
                call: "cuLaunchKernel",
                message: format!("kernel `{}` is not an emulated kernel", kernel.name()),
            });
        };
        let mut slots: Vec<u64> = args.iter().map(KernelArg::slot).collect();
        let mut params: Vec<*mut std::ffi::c_void> = slots
            .iter_mut()
            .map(|s| std::ptr::from_mut(s).cast())
            .collect();
        let run = GridRun {
            name: kernel.name(),
            dims: [
                cfg.grid.0,
                cfg.grid.1,
                cfg.grid.2,
                cfg.block.0,
                cfg.block.1,
                cfg.block.2,
                cfg.shared_mem_bytes,
            ],
            seed,
            workers: self.shared.workers,
            watchdog: self.shared.options.watchdog,
        };
        // SAFETY: the arguments were checked against the kernel's signature when the launch
        // was issued; pointers address memory the issuer keeps alive until this has run.
        let outcome = unsafe { grid::run(k.launch, run, &mut params) };
        let message = match outcome {
            Err(m) => Some(m),
            // A write just past (or before) a buffer it was given: its guard zone says so.
            Ok(()) => args.iter().find_map(|a| match a {
                &KernelArg::Ptr(p) if p != 0 => memory::check_canaries(p),
                _ => None,
            }),
        };
        message.map(|message| Fault::Kernel {
            entry: kernel.name().to_string(),
            grid: cfg.grid,
            block: cfg.block,
            message,
        })
    }
}

/// Keeps a queue open; the last one dropped lets its worker finish and exit.
struct Handle {
    queue: Arc<Queue>,
}

impl Drop for Handle {
    fn drop(&mut self) {
        self.queue.lock().closed = true;
        self.queue.work.notify_one();
    }
}

/// An emulated stream.
pub(crate) struct EmuStream {
    handle: Arc<Handle>,
}

impl EmuStream {
    pub(crate) fn start(id: u64, shared: Arc<Shared>) -> Result<(EmuStream, Weak<Queue>)> {
        let queue = Arc::new(Queue {
            id,
            state: Mutex::new(QueueState::default()),
            work: Condvar::new(),
            done: Condvar::new(),
            shared,
        });
        let worker = Arc::clone(&queue);
        std::thread::Builder::new()
            .name(format!("spate-emu-stream-{id}"))
            .spawn(move || worker.run())
            .map_err(|e| KernelError::Driver {
                call: "cuStreamCreate",
                message: format!("cannot start the emulated stream's thread: {e}"),
            })?;
        let weak = Arc::downgrade(&queue);
        Ok((
            EmuStream {
                handle: Arc::new(Handle { queue }),
            },
            weak,
        ))
    }

    fn queue(&self) -> &Queue {
        &self.handle.queue
    }

    /// Fails when `addr` lies in another emulated device's buffer (see
    /// [`memory::check_device`]): a bug in the caller, reported before anything is queued.
    fn owns(&self, addr: u64, what: &str) -> Result<()> {
        memory::check_device(addr, self.queue().shared.device, what)
            .map_err(|message| KernelError::Internal { message })
    }
}

/// Emulated device memory, freed in the order of the stream that allocated it.
struct EmuMemory {
    region: Option<Region>,
    handle: Arc<Handle>,
}

impl DeviceMemory for EmuMemory {
    fn address(&self) -> u64 {
        self.region.as_ref().map_or(0, Region::address)
    }

    fn free(mut self: Box<Self>, after_all_streams: bool, on: Option<&dyn StreamBackend>) {
        let Some(region) = self.region.take() else {
            return;
        };
        // Handed over to another stream: its free is ordered there (an event orders that
        // stream behind this memory's own work, so the free need not wait for it).
        let queue = match on.and_then(|s| s.as_any().downcast_ref::<EmuStream>()) {
            Some(other) => other.queue(),
            None => &self.handle.queue,
        };
        if after_all_streams {
            // Other streams may still read it: wait for every stream of the device.
            let queues: Vec<Arc<Queue>> = queue
                .shared
                .streams
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .iter()
                .filter_map(Weak::upgrade)
                .collect();
            for q in queues {
                q.wait_idle();
            }
        }
        queue.push(Op::Free(region));
    }
}

impl StreamBackend for EmuStream {
    fn alloc(&self, bytes: usize, zeroed: bool, elem: ElemInfo) -> Result<Box<dyn DeviceMemory>> {
        let q = self.queue();
        // In strict mode half the allocations take a mapping freed a moment ago, by any stream.
        let reuse =
            q.shared.options.strict.is_some_and(|seed| {
                mix(seed ^ bytes as u64 ^ q.id ^ rand_counter()).is_multiple_of(2)
            });
        let region = memory::alloc(
            bytes,
            elem,
            memory::Owner::new(q.shared.device, q.id),
            reuse,
        )?;
        let address = region.address();
        let mem = Box::new(EmuMemory {
            region: Some(region),
            handle: Arc::clone(&self.handle),
        });
        if zeroed {
            q.push(Op::Fill {
                dst: address,
                len: bytes,
                byte: 0,
            });
        }
        Ok(mem)
    }

    unsafe fn copy_from_host(&self, src: &[u8], dst: u64) -> Result<()> {
        self.owns(dst, "a copy to the device")?;
        self.queue().push(Op::Write {
            dst,
            bytes: src.to_vec(),
        });
        Ok(())
    }

    unsafe fn copy_from_pinned(&self, src: HostPtr, dst: u64, len: usize) -> Result<()> {
        self.owns(dst, "a copy to the device")?;
        self.queue().push(Op::WritePinned { src, dst, len });
        Ok(())
    }

    unsafe fn copy_to_pinned(&self, src: u64, dst: HostPtr, len: usize, idle: bool) -> Result<()> {
        // Until the copy runs the host must not read the buffer; if it does, it sees poison.
        // (Not while an earlier copy, an upload from this buffer, may still read its bytes.)
        self.owns(src, "a copy to the host")?;
        if idle {
            // SAFETY: the caller's range of a live pinned block no copy uses.
            unsafe { std::ptr::write_bytes(dst.0, POISON_NEW, len) };
        }
        self.queue().push(Op::Read { src, dst, len });
        Ok(())
    }

    unsafe fn copy_to_host(&self, src: u64, dst: &mut [u8]) -> Result<()> {
        self.owns(src, "a copy to the host")?;
        self.queue().push(Op::Read {
            src,
            dst: HostPtr(dst.as_mut_ptr()),
            len: dst.len(),
        });
        // `dst` is borrowed until this returns, so the copy must have run by then.
        self.queue().sync()
    }

    unsafe fn copy_device(&self, src: u64, dst: u64, len: usize) -> Result<()> {
        self.owns(src, "a device copy")?;
        self.owns(dst, "a device copy")?;
        self.queue().push(Op::Copy { src, dst, len });
        Ok(())
    }

    unsafe fn copy_peer(
        &self,
        src: u64,
        from: &dyn StreamBackend,
        dst: u64,
        len: usize,
    ) -> Result<()> {
        let Some(from) = from.as_any().downcast_ref::<EmuStream>() else {
            return Err(KernelError::Internal {
                message: "a peer copy from a stream of another backend".into(),
            });
        };
        let same_device = Arc::ptr_eq(&self.queue().shared, &from.queue().shared);
        if !same_device && !self.queue().shared.options.peer_access {
            return Err(KernelError::Internal {
                message: "a peer copy between emulated devices without peer access \
                          (SPATE_EMU_NO_PEER): copy through the host"
                    .into(),
            });
        }
        from.owns(src, "a peer copy's source")?;
        self.owns(dst, "a peer copy")?;
        self.queue().push(Op::Copy { src, dst, len });
        Ok(())
    }

    unsafe fn launch(&self, kernel: &Kernel, cfg: LaunchConfig, args: &[KernelArg]) -> Result<()> {
        for arg in args {
            if let &KernelArg::Ptr(p) = arg
                && p != 0
            {
                self.owns(p, &format!("kernel `{}`", kernel.name()))?;
            }
        }
        self.queue().push(Op::Launch {
            kernel: kernel.clone(),
            cfg,
            args: args.to_vec(),
        });
        Ok(())
    }

    fn record_event(&self) -> Result<Arc<dyn EventBackend>> {
        let event = Arc::new(EmuEvent::default());
        self.queue().push(Op::Record(Arc::clone(&event)));
        Ok(event)
    }

    fn wait_event(&self, event: &dyn EventBackend) -> Result<()> {
        let Some(e) = event.as_any().downcast_ref::<EmuEvent>() else {
            return Err(KernelError::Internal {
                message: "an event of another backend waited on by an emulated stream".into(),
            });
        };
        self.queue().push(Op::Wait(Arc::new(e.share())));
        Ok(())
    }

    fn synchronize(&self) -> Result<()> {
        self.queue().sync()
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// A process-wide counter that decorrelates strict-mode decisions made on host threads.
fn rand_counter() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    COUNTER.fetch_add(1, Ordering::Relaxed)
}

/// An emulated event: completes when its stream reaches it.
#[derive(Debug, Default)]
pub(crate) struct EmuEvent {
    state: Arc<(Mutex<Option<Instant>>, Condvar)>,
}

impl EmuEvent {
    fn share(&self) -> EmuEvent {
        EmuEvent {
            state: Arc::clone(&self.state),
        }
    }

    fn complete(&self) {
        let (lock, cv) = &*self.state;
        *lock.lock().unwrap_or_else(|p| p.into_inner()) = Some(Instant::now());
        cv.notify_all();
    }

    fn wait(&self) -> Instant {
        let (lock, cv) = &*self.state;
        let mut at = lock.lock().unwrap_or_else(|p| p.into_inner());
        loop {
            if let Some(t) = *at {
                return t;
            }
            at = cv.wait(at).unwrap_or_else(|p| p.into_inner());
        }
    }
}

impl EventBackend for EmuEvent {
    fn synchronize(&self) -> Result<()> {
        self.wait();
        Ok(())
    }

    fn is_complete(&self) -> bool {
        self.state
            .0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .is_some()
    }

    fn elapsed_ms(&self, end: &dyn EventBackend) -> Result<f32> {
        let Some(end) = end.as_any().downcast_ref::<EmuEvent>() else {
            return Err(KernelError::Internal {
                message: "timing events of two different backends".into(),
            });
        };
        let (a, b) = (self.wait(), end.wait());
        Ok(b.saturating_duration_since(a).as_secs_f32() * 1000.0)
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}
