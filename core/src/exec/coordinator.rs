//! The spill coordinator: device memory held beyond one operator's reach that can move to the
//! host when an operator runs out (split-and-retry, `exec/retry.rs`), least recently used
//! first.
//!
//! Two kinds of holder register here:
//! - the tables cached in device memory (`exec/cache.rs`): a table moved to the host is
//!   uploaded again by its next scan;
//! - the input a sort, a join build, a final aggregation or a window holds while its input
//!   still runs (`exec/held.rs`): it is uploaded again when the operator needs it.
//!
//! The rest of operators' state is not moved from outside: past their share of the budget,
//! aggregations, joins and sorts spill their partitions and runs to the host themselves
//! (`exec/spill.rs`), before they run out.

use std::sync::{Arc, Mutex, Weak};
use std::time::Instant;

use crate::error::Result;

/// Device memory the coordinator may move to the host.
pub(crate) trait Spillable: Send + Sync {
    /// When it was last used: the least recently used goes first.
    fn last_used(&self) -> Instant;
    /// Device bytes it holds now (0 once on the host).
    fn resident_bytes(&self) -> usize;
    /// Moves it to the host; the device bytes that lets go of.
    fn spill(&self) -> Result<usize>;
}

/// The spillable holders of one device's memory.
#[derive(Default)]
pub(crate) struct SpillCoordinator {
    entries: Mutex<Vec<Weak<dyn Spillable>>>,
}

impl SpillCoordinator {
    /// Adds `entry`, forgotten once it is dropped.
    pub(crate) fn register(&self, entry: Weak<dyn Spillable>) {
        let mut entries = self.lock();
        entries.retain(|e| e.strong_count() > 0);
        entries.push(entry);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Weak<dyn Spillable>>> {
        self.entries.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Moves holders to the host, least recently used first, until `want` bytes are let go
    /// of or none is left on the device; the bytes let go of. A holder that fails to move
    /// stays where it is.
    pub(crate) fn relieve(&self, want: usize) -> usize {
        let mut live: Vec<Arc<dyn Spillable>> = {
            let mut entries = self.lock();
            entries.retain(|e| e.strong_count() > 0);
            entries.iter().filter_map(Weak::upgrade).collect()
        };
        live.sort_by_key(|e| e.last_used());
        let mut freed = 0;
        for entry in live {
            if freed >= want {
                break;
            }
            if entry.resident_bytes() > 0 {
                freed += entry.spill().unwrap_or(0);
            }
        }
        freed
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    use super::*;

    struct Holder {
        used: Instant,
        bytes: AtomicUsize,
    }

    impl Spillable for Holder {
        fn last_used(&self) -> Instant {
            self.used
        }
        fn resident_bytes(&self) -> usize {
            self.bytes.load(Ordering::Relaxed)
        }
        fn spill(&self) -> Result<usize> {
            Ok(self.bytes.swap(0, Ordering::Relaxed))
        }
    }

    #[test]
    fn the_least_recently_used_go_first_until_enough_is_freed() {
        let now = Instant::now();
        let holder = |age: u64, bytes| {
            Arc::new(Holder {
                used: now - Duration::from_secs(age),
                bytes: AtomicUsize::new(bytes),
            })
        };
        let (old, middle, recent) = (holder(30, 100), holder(20, 50), holder(10, 70));
        let coordinator = SpillCoordinator::default();
        for h in [&recent, &old, &middle] {
            let weak: Weak<dyn Spillable> = Arc::downgrade(h) as Weak<dyn Spillable>;
            coordinator.register(weak);
        }
        assert_eq!(coordinator.relieve(120), 150);
        assert_eq!(
            (
                old.resident_bytes(),
                middle.resident_bytes(),
                recent.resident_bytes()
            ),
            (0, 0, 70)
        );
        // Dropped holders are forgotten; what is left goes next.
        drop(old);
        assert_eq!(coordinator.relieve(1), 70);
        assert_eq!(coordinator.relieve(1), 0);
    }
}
