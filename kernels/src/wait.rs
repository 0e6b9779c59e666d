//! Host waits for the device: where a thread blocks until streams or events finish.
//!
//! The kernel runtime knows nothing of async runtimes, but the engine calls it from tokio
//! worker threads that other partitions' tasks need. An embedder installs a hook
//! ([`set_blocking_hook`]) that every wait runs through: the engine's hands the worker's other
//! tasks to another thread first (`tokio::task::block_in_place`). The waits themselves sleep
//! (a blocking-sync CUDA context, condition variables on the emulator); none spins a core.

use std::sync::OnceLock;

/// How a wait is run: the hook calls the wait it is given exactly once.
pub type BlockingHook = fn(&mut dyn FnMut());

static HOOK: OnceLock<BlockingHook> = OnceLock::new();

/// Installs the hook every host wait runs through; the first one installed stays. Returns
/// false when one was installed before.
pub fn set_blocking_hook(hook: BlockingHook) -> bool {
    HOOK.set(hook).is_ok()
}

/// Runs a wait for the device through the hook, if any.
pub(crate) fn blocking<T>(wait: impl FnOnce() -> T) -> T {
    let Some(hook) = HOOK.get() else {
        return wait();
    };
    let mut wait = Some(wait);
    let mut out = None;
    hook(&mut || {
        if let Some(w) = wait.take() {
            out = Some(w());
        }
    });
    match out {
        Some(v) => v,
        // A hook that did not run the wait: run it here rather than lose it.
        None => match wait.take() {
            Some(w) => w(),
            None => unreachable!("the wait ran but left no result"),
        },
    }
}
