//! Injected faults, for tests of what the engine does when the device fails it: the Nth device
//! allocation runs out of memory, or the Nth kernel launch leaves a sticky fault that marks the
//! device unhealthy (as an illegal address would on a GPU).
//!
//! On the emulator the environment sets them when the device opens: [`FAIL_ALLOC_ENV`]` = N`
//! and [`FAIL_LAUNCH_ENV`]` = N` count from the device's first allocation or launch. Tests set
//! them on an open device, counting from that moment ([`crate::Device::inject_alloc_failure`],
//! [`crate::Device::inject_launch_fault`]), so that the engine's own start-up work is not
//! among the calls they walk over.

use std::sync::atomic::{AtomicU64, Ordering};

/// `SPATE_EMU_FAIL_ALLOC=N`: the emulator's Nth device allocation fails with `OutOfMemory`.
pub const FAIL_ALLOC_ENV: &str = "SPATE_EMU_FAIL_ALLOC";

/// `SPATE_EMU_FAIL_LAUNCH=N`: the emulator's Nth kernel launch faults, and the device is
/// unhealthy from then on.
pub const FAIL_LAUNCH_ENV: &str = "SPATE_EMU_FAIL_LAUNCH";

/// One kind of call and the calls of it that fail: `count` calls from the `fail_at`th; none
/// when `fail_at` is 0.
#[derive(Debug, Default)]
struct Trigger {
    seen: AtomicU64,
    fail_at: AtomicU64,
    count: AtomicU64,
}

impl Trigger {
    /// The `nth` call from now fails; 0 disarms.
    fn arm(&self, nth: u64) {
        self.arm_many(nth, 1);
    }

    /// `count` calls fail from the `nth` from now; `nth` 0 disarms.
    fn arm_many(&self, nth: u64, count: u64) {
        let at = match nth {
            0 => 0,
            n => self.seen.load(Ordering::Acquire) + n,
        };
        self.count.store(count.max(1), Ordering::Release);
        self.fail_at.store(at, Ordering::Release);
    }

    /// Counts a call; true for the ones that fail (once each).
    fn fires(&self) -> bool {
        let at = self.fail_at.load(Ordering::Acquire);
        if at == 0 {
            return false;
        }
        let n = self.seen.fetch_add(1, Ordering::AcqRel) + 1;
        let count = self.count.load(Ordering::Acquire);
        if n + 1 == at + count {
            // The last to fail disarms the trigger.
            let _ = self
                .fail_at
                .compare_exchange(at, 0, Ordering::AcqRel, Ordering::Relaxed);
        }
        n >= at && n < at + count
    }
}

/// The faults armed on one device.
#[derive(Debug, Default)]
pub(crate) struct Faults {
    alloc: Trigger,
    launch: Trigger,
}

impl Faults {
    /// Faults armed from the environment (the emulator's).
    pub(crate) fn from_env() -> Self {
        let faults = Faults::default();
        let env = |name| {
            std::env::var(name)
                .ok()
                .and_then(|v| v.trim().parse::<u64>().ok())
                .filter(|&n| n > 0)
        };
        if let Some(n) = env(FAIL_ALLOC_ENV) {
            faults.alloc.arm(n);
        }
        if let Some(n) = env(FAIL_LAUNCH_ENV) {
            faults.launch.arm(n);
        }
        faults
    }

    /// `count` allocations fail from the `nth` from now.
    pub(crate) fn arm_alloc(&self, nth: u64, count: u64) {
        self.alloc.arm_many(nth, count);
    }

    /// The `nth` launch from now faults.
    pub(crate) fn arm_launch(&self, nth: u64) {
        self.launch.arm(nth);
    }

    /// Counts an allocation; true when it is to fail.
    pub(crate) fn alloc_fails(&self) -> bool {
        self.alloc.fires()
    }

    /// Counts a launch; true when it is to fault.
    pub(crate) fn launch_faults(&self) -> bool {
        self.launch.fires()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_nth_call_from_arming_fires_once() {
        let t = Trigger::default();
        assert!(!t.fires());
        t.arm(3);
        assert_eq!(
            (t.fires(), t.fires(), t.fires(), t.fires()),
            (false, false, true, false)
        );
        t.arm(1);
        assert!(t.fires());
        assert!(!t.fires());
        t.arm(2);
        t.arm(0);
        assert!(!t.fires() && !t.fires());
        t.arm_many(2, 3);
        let fired: Vec<bool> = (0..6).map(|_| t.fires()).collect();
        assert_eq!(fired, [false, true, true, true, false, false]);
    }
}
