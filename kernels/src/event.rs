//! Events: points in a stream's work, for ordering other streams and the host behind it, and
//! for timing.

use std::sync::Arc;

use crate::backend::EventBackend;
use crate::counters::{Call, Counters, count};
use crate::error::Result;
use crate::health::Health;

/// A point in a stream's work, for ordering and timing.
#[derive(Debug, Clone)]
pub struct Event {
    imp: Arc<dyn EventBackend>,
    health: Arc<Health>,
    counters: Arc<Counters>,
}

impl Event {
    pub(crate) fn new(
        imp: Arc<dyn EventBackend>,
        health: Arc<Health>,
        counters: Arc<Counters>,
    ) -> Self {
        Event {
            imp,
            health,
            counters,
        }
    }

    pub(crate) fn backend(&self) -> &dyn EventBackend {
        self.imp.as_ref()
    }

    /// Waits for the work before the event.
    pub fn synchronize(&self) -> Result<()> {
        self.health.check()?;
        count(&self.counters, Call::HostSync);
        crate::wait::blocking(|| self.imp.synchronize())?;
        self.health.check()
    }

    /// True once the work before the event has finished.
    pub fn is_complete(&self) -> bool {
        self.imp.is_complete()
    }

    /// Milliseconds between this event and `end` when both have completed, without waiting
    /// (and so without a host synchronisation); `None` while either is pending.
    pub fn try_elapsed_ms(&self, end: &Event) -> Result<Option<f32>> {
        self.health.check()?;
        if !(self.imp.is_complete() && end.imp.is_complete()) {
            return Ok(None);
        }
        self.imp.elapsed_ms(end.imp.as_ref()).map(Some)
    }

    /// Milliseconds between this event and `end` (device time on `cuda`, host time on the
    /// emulator). Waits for `end`.
    pub fn elapsed_ms(&self, end: &Event) -> Result<f32> {
        self.health.check()?;
        count(&self.counters, Call::HostSync);
        crate::wait::blocking(|| self.imp.elapsed_ms(end.imp.as_ref()))
    }
}
