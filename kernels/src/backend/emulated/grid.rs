//! Running one emulated grid: the C ABI between Rust and the kernels compiled with
//! `spate_emu.h`, the host threads blocks run on, and the two ways a running kernel is stopped
//! from outside: a memory fault and the watchdog.
//!
//! Rust owns the threads: the kernel module asks [`run_workers`] for `workers` threads, each of
//! which pulls blocks until none are left. A thread marks itself with the launch it works for,
//! so that a signal handler knows which kernel faulted:
//!
//! - **SIGSEGV / SIGBUS** in a kernel (a guard page, quarantined memory, a wild pointer): the
//!   handler describes the address (see `memory.rs`: "out-of-bounds write at element 10 of
//!   buffer #12 (u32 x 10 …)") and calls the module's `abort_block`, which records the message
//!   as the block's error and leaves the faulting fiber for the block's scheduler. Faults
//!   outside a kernel go to the handler that was installed before (Rust's, or the default).
//! - **The watchdog** (one thread for the process) sends SIGURG to every thread of a launch
//!   that has run longer than its limit; the handler aborts the block with a message naming
//!   the kernel. A block that spins on a flag another block will set, when that block can never
//!   run, ends that way instead of hanging CI.

use std::cell::{Cell, UnsafeCell};
use std::ffi::{c_char, c_int, c_ulong, c_void};
use std::fmt::Write as _;
use std::sync::{Mutex, Once};
use std::time::{Duration, Instant};

use super::memory;

/// The watchdog's signal. SIGURG is ignored by default, so a stray one does nothing.
const WATCHDOG_SIGNAL: c_int = libc::SIGURG;

/// The launch record `spate_emu.h` reads (`struct spate_emu_launch`; keep them in step).
#[repr(C)]
pub(crate) struct LaunchArgs {
    pub(crate) dims: [u32; 7],
    pub(crate) params: *mut *mut c_void,
    pub(crate) err: *mut c_char,
    pub(crate) errlen: c_ulong,
    /// 0: blocks in index order and threads resumed alternately forwards and backwards;
    /// otherwise the seed of a random block order and random thread resumption at barriers.
    pub(crate) seed: u64,
    pub(crate) workers: u32,
    pub(crate) runner: *mut c_void,
    pub(crate) run_workers: unsafe extern "C" fn(
        runner: *mut c_void,
        workers: u32,
        work: unsafe extern "C" fn(*mut c_void),
        arg: *mut c_void,
    ),
    /// Set by the kernel module before it asks for workers: leaves the current block with this
    /// message when called from a signal handler on a thread running a kernel.
    pub(crate) abort_block: Option<unsafe extern "C" fn(*const c_char)>,
    /// A worker's fiber stacks for one launch, from [`STACKS`], and back.
    pub(crate) acquire_stacks: unsafe extern "C" fn(c_ulong, c_ulong, c_ulong) -> *mut c_void,
    pub(crate) release_stacks: unsafe extern "C" fn(*mut c_void, c_ulong, c_ulong, c_ulong),
}

// The C side asserts the same size and offset (`spate_emu.h`).
const _: () =
    assert!(size_of::<LaunchArgs>() == 112 && std::mem::offset_of!(LaunchArgs, abort_block) == 88);

/// A mapping of fiber stacks: `count` slots of a guard page (no access) then a stack.
struct StackRegion {
    base: usize,
    count: usize,
    stack: usize,
    guard: usize,
}

impl StackRegion {
    fn bytes(&self) -> usize {
        self.count * (self.stack + self.guard)
    }
}

/// Fiber stacks for every kernel module of the process: a worker leases a region for one
/// launch (`spate_emu.h`'s `StackLease`), any free one with enough slots of the same layout.
/// So there are about as many regions as workers ever ran at once, and each costs its mappings
/// once, not once per launch, nor once per thread (each stream thread keeping its own ran a
/// query with scores of streams out of `vm.max_map_count`). At most [`SPARE_REGIONS`] free
/// ones are kept; the rest are unmapped when returned.
struct StackPool {
    free: Vec<StackRegion>,
    leased: Vec<StackRegion>,
}

static STACKS: Mutex<StackPool> = Mutex::new(StackPool {
    free: Vec::new(),
    leased: Vec::new(),
});

/// Free regions kept for the next launches.
const SPARE_REGIONS: usize = 64;

unsafe extern "C" fn acquire_stacks(count: c_ulong, stack: c_ulong, guard: c_ulong) -> *mut c_void {
    let (count, stack, guard) = (count as usize, stack as usize, guard as usize);
    let mut pool = STACKS.lock().unwrap_or_else(|p| p.into_inner());
    let fits = |r: &StackRegion| r.count >= count && r.stack == stack && r.guard == guard;
    if let Some(at) = pool.free.iter().position(fits) {
        let region = pool.free.swap_remove(at);
        let base = region.base as *mut c_void;
        pool.leased.push(region);
        return base;
    }
    let Some(bytes) = count.checked_mul(stack + guard) else {
        return std::ptr::null_mut();
    };
    // SAFETY: a fresh private mapping; the guard pages are inside it.
    let base = unsafe {
        let base = libc::mmap(
            std::ptr::null_mut(),
            bytes,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
            -1,
            0,
        );
        if base == libc::MAP_FAILED {
            return std::ptr::null_mut();
        }
        for i in 0..count {
            let slot = (base as *mut u8).add(i * (stack + guard));
            if libc::mprotect(slot as *mut c_void, guard, libc::PROT_NONE) != 0 {
                libc::munmap(base, bytes);
                return std::ptr::null_mut();
            }
        }
        base
    };
    pool.leased.push(StackRegion {
        base: base as usize,
        count,
        stack,
        guard,
    });
    base
}

unsafe extern "C" fn release_stacks(
    base: *mut c_void,
    _count: c_ulong,
    _stack: c_ulong,
    _guard: c_ulong,
) {
    let mut pool = STACKS.lock().unwrap_or_else(|p| p.into_inner());
    let Some(at) = pool.leased.iter().position(|r| r.base == base as usize) else {
        return;
    };
    let region = pool.leased.swap_remove(at);
    if pool.free.len() < SPARE_REGIONS {
        pool.free.push(region);
    } else {
        // SAFETY: the region was mapped by `acquire_stacks` and no launch uses it any more.
        unsafe { libc::munmap(region.base as *mut c_void, region.bytes()) };
    }
}

/// What the threads of one running launch share with the signal handlers and the watchdog.
struct LaunchCtx {
    name: String,
    args: *const LaunchArgs,
    started: Instant,
    limit: Duration,
    threads: Mutex<Vec<libc::pthread_t>>,
    /// NUL-terminated message the watchdog's handler passes to `abort_block`.
    watchdog_message: [u8; 256],
}

thread_local! {
    /// The launch this thread runs blocks for (null when none).
    static CURRENT: Cell<*const LaunchCtx> = const { Cell::new(std::ptr::null()) };
    /// Where a signal handler writes its message (signal handlers must not allocate).
    static MESSAGE: UnsafeCell<[u8; 1024]> = const { UnsafeCell::new([0; 1024]) };
    /// Set while the fault handler runs: the watchdog's handler must not leave a fiber then
    /// (the fault handler may hold the registry's lock), and a fault inside it is fatal.
    static IN_FAULT: Cell<bool> = const { Cell::new(false) };
    /// This thread's signal stack, installed the first time it runs blocks.
    static ALT_STACK: std::cell::RefCell<Option<AltStack>> = const { std::cell::RefCell::new(None) };
}

// SAFETY: `args` is only read while the launch runs (by its own threads and signal handlers);
// every other field is thread-safe.
unsafe impl Sync for LaunchCtx {}

/// Running launches, for the watchdog. Entries point at `LaunchCtx`s on the stacks of the
/// stream workers running them; an entry is removed (under this lock) before its context dies.
struct Active(Vec<*const LaunchCtx>);
// SAFETY: the pointers are only dereferenced under the lock, while their launches run.
unsafe impl Send for Active {}
static ACTIVE: Mutex<Active> = Mutex::new(Active(Vec::new()));

/// How one grid runs.
pub(crate) struct GridRun<'a> {
    pub(crate) name: &'a str,
    pub(crate) dims: [u32; 7],
    pub(crate) seed: u64,
    pub(crate) workers: u32,
    pub(crate) watchdog: Duration,
}

type LaunchFn = unsafe extern "C" fn(*mut LaunchArgs) -> c_int;

/// Runs a grid on this thread and `workers - 1` more; returns the first block's error.
///
/// # Safety
/// `params` match the kernel's signature and point at memory the kernel may access.
pub(crate) unsafe fn run(
    launch: LaunchFn,
    run: GridRun<'_>,
    params: &mut [*mut c_void],
) -> Result<(), String> {
    install_handlers();
    let mut err = [0 as c_char; 1024];
    let mut args = LaunchArgs {
        dims: run.dims,
        params: params.as_mut_ptr(),
        err: err.as_mut_ptr(),
        errlen: err.len() as c_ulong,
        seed: run.seed,
        workers: run.workers.max(1),
        runner: std::ptr::null_mut(),
        run_workers,
        abort_block: None,
        acquire_stacks,
        release_stacks,
    };
    let mut ctx = LaunchCtx {
        name: run.name.to_string(),
        args: std::ptr::null(),
        started: Instant::now(),
        limit: run.watchdog,
        threads: Mutex::new(Vec::new()),
        watchdog_message: [0; 256],
    };
    let mut text = Cursor::new(&mut ctx.watchdog_message);
    let _ = write!(
        text,
        "watchdog: `{}` ran for more than {:.1} s; a thread that waits for work that never \
         happens (a spin on a flag another block sets, when that block cannot run)",
        run.name,
        run.watchdog.as_secs_f64()
    );
    text.terminate();
    args.runner = std::ptr::from_ref(&ctx).cast_mut().cast();
    // One pointer to `args` for the module (which writes `abort_block`) and the handlers.
    let args_ptr: *mut LaunchArgs = &mut args;
    ctx.args = args_ptr;
    let ctx_ptr: *const LaunchCtx = &ctx;
    lock_active().0.push(ctx_ptr);
    start_watchdog();
    // SAFETY: the caller guarantees the parameters; `args`, `err` and `ctx` outlive the call.
    let rc = unsafe { launch(args_ptr) };
    lock_active().0.retain(|p| *p != ctx_ptr);
    if rc == 0 {
        return Ok(());
    }
    let bytes: Vec<u8> = err
        .iter()
        .take_while(|c| **c != 0)
        .map(|c| *c as u8)
        .collect();
    Err(String::from_utf8_lossy(&bytes).into_owned())
}

fn lock_active() -> std::sync::MutexGuard<'static, Active> {
    ACTIVE.lock().unwrap_or_else(|p| p.into_inner())
}

#[derive(Clone, Copy)]
struct SendPtr(*mut c_void);
// SAFETY: the kernel module's work argument is shared by its workers by design.
unsafe impl Send for SendPtr {}
// SAFETY: as above.
unsafe impl Sync for SendPtr {}

/// Called by the kernel module: runs `work(arg)` on `workers` threads, this one included.
unsafe extern "C" fn run_workers(
    runner: *mut c_void,
    workers: u32,
    work: unsafe extern "C" fn(*mut c_void),
    arg: *mut c_void,
) {
    // SAFETY: `runner` is the `LaunchCtx` that `run` made, alive until `launch` returns.
    let ctx: &LaunchCtx = unsafe { &*(runner as *const LaunchCtx) };
    let arg = SendPtr(arg);
    std::thread::scope(|s| {
        for _ in 1..workers {
            // A thread that cannot be spawned only means fewer workers.
            let _ = std::thread::Builder::new()
                .name("spate-emu-block".into())
                .spawn_scoped(s, move || {
                    let arg = arg;
                    worker(ctx, work, arg)
                });
        }
        worker(ctx, work, arg);
    });
}

fn worker(ctx: &LaunchCtx, work: unsafe extern "C" fn(*mut c_void), arg: SendPtr) {
    ALT_STACK.with(|a| {
        let mut a = a.borrow_mut();
        if a.is_none() {
            *a = AltStack::install();
        }
    });
    // SAFETY: pthread_self has no preconditions.
    let me = unsafe { libc::pthread_self() };
    ctx.threads
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .push(me);
    let previous = CURRENT.with(|c| c.replace(ctx));
    // SAFETY: the module's work function, with its own argument.
    unsafe { work(arg.0) };
    CURRENT.with(|c| c.set(previous));
    ctx.threads
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .retain(|t| *t != me);
}

/// A signal stack of our own for a thread that runs blocks: the handler must not run on a
/// fiber stack that may just have overflowed, and the one std gives its threads (a few KiB)
/// is too small for a handler that formats a message and leaves through the kernel's
/// scheduler. The previous one is put back when the thread ends.
struct AltStack {
    mapped: *mut c_void,
    previous: libc::stack_t,
}

impl AltStack {
    const BYTES: usize = 64 << 10;

    fn install() -> Option<AltStack> {
        // SAFETY: a fresh private mapping for the signal stack.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                Self::BYTES,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return None;
        }
        let stack = libc::stack_t {
            ss_sp: p,
            ss_flags: 0,
            ss_size: Self::BYTES,
        };
        // SAFETY: zeroed is a valid stack_t to receive the previous one.
        let mut previous: libc::stack_t = unsafe { std::mem::zeroed() };
        // SAFETY: the mapping outlives its use: it is removed in Drop, on this thread.
        if unsafe { libc::sigaltstack(&stack, &mut previous) } != 0 {
            // SAFETY: our mapping, never installed.
            unsafe { libc::munmap(p, Self::BYTES) };
            return None;
        }
        Some(AltStack {
            mapped: p,
            previous,
        })
    }
}

impl Drop for AltStack {
    fn drop(&mut self) {
        // SAFETY: puts back the thread's previous signal stack, then unmaps ours.
        unsafe {
            libc::sigaltstack(&self.previous, std::ptr::null_mut());
            libc::munmap(self.mapped, Self::BYTES);
        }
    }
}

/// Writes into a fixed buffer, keeping room for a NUL; never allocates.
struct Cursor<'a> {
    buf: &'a mut [u8],
    len: usize,
}

impl<'a> Cursor<'a> {
    fn new(buf: &'a mut [u8]) -> Self {
        Cursor { buf, len: 0 }
    }

    fn terminate(&mut self) {
        let at = self.len.min(self.buf.len().saturating_sub(1));
        if let Some(b) = self.buf.get_mut(at) {
            *b = 0;
        }
    }
}

impl std::fmt::Write for Cursor<'_> {
    fn write_str(&mut self, s: &str) -> std::fmt::Result {
        let room = self.buf.len().saturating_sub(1).saturating_sub(self.len);
        let n = s.len().min(room);
        self.buf[self.len..self.len + n].copy_from_slice(&s.as_bytes()[..n]);
        self.len += n;
        Ok(())
    }
}

static mut PREVIOUS_SEGV: Option<libc::sigaction> = None;
static mut PREVIOUS_BUS: Option<libc::sigaction> = None;
static mut PREVIOUS_URG: Option<libc::sigaction> = None;

fn install_handlers() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        // SAFETY: installs process-wide handlers once. The previous ones are saved first, so a
        // handler that runs at once already finds them, for signals that are not the
        // emulator's.
        unsafe {
            PREVIOUS_SEGV = current(libc::SIGSEGV);
            PREVIOUS_BUS = current(libc::SIGBUS);
            PREVIOUS_URG = current(WATCHDOG_SIGNAL);
            install(libc::SIGSEGV, on_fault as *const () as usize);
            install(libc::SIGBUS, on_fault as *const () as usize);
            install(WATCHDOG_SIGNAL, on_watchdog as *const () as usize);
        }
    });
}

unsafe fn current(signal: c_int) -> Option<libc::sigaction> {
    // SAFETY: reads one action into a zeroed structure.
    unsafe {
        let mut old: libc::sigaction = std::mem::zeroed();
        (libc::sigaction(signal, std::ptr::null(), &mut old) == 0).then_some(old)
    }
}

unsafe fn install(signal: c_int, handler: usize) {
    // SAFETY: a plain sigaction call with a zeroed, then filled, structure.
    unsafe {
        let mut action: libc::sigaction = std::mem::zeroed();
        action.sa_sigaction = handler;
        // NODEFER: the handler never returns to a faulting kernel (it leaves the fiber), so
        // the signal must not stay blocked on this thread afterwards.
        action.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK | libc::SA_NODEFER;
        libc::sigemptyset(&mut action.sa_mask);
        libc::sigaction(signal, &action, std::ptr::null_mut());
    }
}

/// Whether the faulting access was a write, from the x86-64 page-fault error code.
fn fault_was_write(uctx: *mut c_void) -> Option<bool> {
    #[cfg(all(target_arch = "x86_64", target_os = "linux"))]
    {
        if uctx.is_null() {
            return None;
        }
        // SAFETY: the kernel passes a ucontext_t to SA_SIGINFO handlers.
        let uc = unsafe { &*(uctx as *const libc::ucontext_t) };
        Some(uc.uc_mcontext.gregs[libc::REG_ERR as usize] & 2 != 0)
    }
    #[cfg(not(all(target_arch = "x86_64", target_os = "linux")))]
    {
        let _ = uctx;
        None
    }
}

extern "C" fn on_fault(signal: c_int, info: *mut libc::siginfo_t, uctx: *mut c_void) {
    let ctx = CURRENT.with(|c| c.get());
    // A fault inside this handler: nothing sensible is left to do but the default.
    let nested = IN_FAULT.with(|f| f.replace(true));
    if !ctx.is_null() && !info.is_null() && !nested {
        // SAFETY: set by `worker` for the life of the launch; `info` comes from the kernel.
        let (ctx, addr) = unsafe { (&*ctx, (*info).si_addr() as u64) };
        MESSAGE.with(|m| {
            // SAFETY: this thread's buffer; a nested fault would be a bug in the handler.
            let buf = unsafe { &mut *m.get() };
            let mut text = Cursor::new(buf);
            let _ = write!(text, "kernel `{}`: ", ctx.name);
            // Takes and releases the registry's read lock.
            memory::describe_fault(&mut text, addr, fault_was_write(uctx));
            text.terminate();
            IN_FAULT.with(|f| f.set(false));
            // SAFETY: `args` lives while the launch runs; `abort_block` leaves the fiber when
            // the thread is in kernel code, and returns otherwise.
            if let Some(abort) = unsafe { (*ctx.args).abort_block } {
                unsafe { abort(buf.as_ptr().cast()) };
            }
        });
    }
    if nested {
        // SAFETY: resets one signal to its default action; returning then ends the process.
        unsafe {
            let mut action: libc::sigaction = std::mem::zeroed();
            action.sa_sigaction = libc::SIG_DFL;
            libc::sigaction(signal, &action, std::ptr::null_mut());
        }
        return;
    }
    IN_FAULT.with(|f| f.set(false));
    // Not a kernel's fault: whatever handled it before us decides.
    // SAFETY: the saved actions are written once, before any handler can run.
    let previous = unsafe {
        if signal == libc::SIGBUS {
            (*std::ptr::addr_of!(PREVIOUS_BUS)).as_ref()
        } else {
            (*std::ptr::addr_of!(PREVIOUS_SEGV)).as_ref()
        }
    };
    chain(signal, previous, info, uctx);
}

fn chain(
    signal: c_int,
    previous: Option<&libc::sigaction>,
    info: *mut libc::siginfo_t,
    uctx: *mut c_void,
) {
    match previous {
        Some(p) if p.sa_sigaction != libc::SIG_DFL && p.sa_sigaction != libc::SIG_IGN => {
            if p.sa_flags & libc::SA_SIGINFO != 0 {
                // SAFETY: the previous SA_SIGINFO handler, called as the kernel would.
                let f: extern "C" fn(c_int, *mut libc::siginfo_t, *mut c_void) =
                    unsafe { std::mem::transmute(p.sa_sigaction) };
                f(signal, info, uctx);
            } else {
                // SAFETY: the previous plain handler.
                let f: extern "C" fn(c_int) = unsafe { std::mem::transmute(p.sa_sigaction) };
                f(signal);
            }
        }
        _ => {
            // Restore the default action; returning re-executes the access, which then
            // terminates the process as it would have without us.
            // SAFETY: resets one signal to its default action.
            unsafe {
                let mut action: libc::sigaction = std::mem::zeroed();
                action.sa_sigaction = libc::SIG_DFL;
                libc::sigaction(signal, &action, std::ptr::null_mut());
            }
        }
    }
}

extern "C" fn on_watchdog(signal: c_int, info: *mut libc::siginfo_t, uctx: *mut c_void) {
    let ctx = CURRENT.with(|c| c.get());
    if ctx.is_null() {
        // Not ours: whoever handled SIGURG before decides (by default it is ignored).
        // SAFETY: written once, before the handler was installed.
        let previous = unsafe { (*std::ptr::addr_of!(PREVIOUS_URG)).as_ref() };
        if previous
            .is_some_and(|p| p.sa_sigaction != libc::SIG_DFL && p.sa_sigaction != libc::SIG_IGN)
        {
            chain(signal, previous, info, uctx);
        }
        return;
    }
    if IN_FAULT.with(Cell::get) {
        // The fault handler is leaving this fiber already (and may hold a lock).
        return;
    }
    // SAFETY: set by `worker` for the life of the launch.
    let ctx = unsafe { &*ctx };
    // SAFETY: as in `on_fault`; returns when the thread is not in kernel code (the block's
    // scheduler then stops at its next step).
    if let Some(abort) = unsafe { (*ctx.args).abort_block } {
        unsafe { abort(ctx.watchdog_message.as_ptr().cast()) };
    }
}

fn start_watchdog() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let spawned = std::thread::Builder::new()
            .name("spate-emu-watchdog".into())
            .spawn(|| {
                loop {
                    std::thread::sleep(Duration::from_millis(100));
                    let active = lock_active();
                    for &ctx in &active.0 {
                        // SAFETY: entries are removed under this lock before they die.
                        let ctx = unsafe { &*ctx };
                        if ctx.started.elapsed() < ctx.limit {
                            continue;
                        }
                        let threads = ctx.threads.lock().unwrap_or_else(|p| p.into_inner());
                        for t in threads.iter() {
                            // SAFETY: a thread removes itself (under its lock) before exiting.
                            unsafe { libc::pthread_kill(*t, WATCHDOG_SIGNAL) };
                        }
                    }
                }
            });
        if let Err(e) = spawned {
            log::warn!("emulator watchdog not started: {e}");
        }
    });
}
