//! The build side of a GPU hash join, and how long its device memory must live.
//!
//! In `CollectLeft` mode one build side, built on a stream of its own, is read by the probe
//! kernels of every probe partition, each on its partition's stream (left, full, semi and anti
//! joins also write its `matched` flags). Its buffers are freed in the order of the stream
//! they were allocated on, which by itself does not wait for other streams: a probe kernel
//! still queued on a probe stream (after a cancellation, an early stop, or simply because the
//! host ran ahead) would read memory the pool has handed out again. So every probe stream
//! records an event when its probe ends, and the build side's stream waits for all of them
//! before the frees are queued behind it. Likewise every probe stream waits, on the device, for
//! an event recorded when the build side was complete: building it costs the host no wait.

use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex, OnceLock};

use spate_kernels::{DeviceBuffer, Event, KernelArg, Stream as DeviceStream};

use super::JoinPlan;
use crate::column::{DeviceBatch, DeviceColumn};
use crate::error::{Result, SpateError};
use crate::exec::hash_table::{GroupCount, Grouping, Kernels, build_table, launch};

/// The build side: the left input's rows, grouped by key and listed group by group.
pub(super) struct BuildSide {
    pub(super) batch: DeviceBatch,
    pub(super) keys: Vec<DeviceColumn>,
    pub(super) grouping: Grouping,
    pub(super) sizes: DeviceBuffer<u32>,
    pub(super) group_start: DeviceBuffer<u32>,
    pub(super) rows_by_group: DeviceBuffer<u32>,
    /// The largest group's size, on the device, when the join could use it (see
    /// `ProbeState::probes_unique`).
    pub(super) largest: Option<DeviceBuffer<u32>>,
    /// Whether every group is one build row, once a probe read `largest` back (with a pair
    /// total: no readback of its own). A probe row then matches at most one, so a probe's
    /// output is no larger than its input and its count can stay on the device.
    pub(super) unique: OnceLock<bool>,
    /// Per group (per build row with a residual filter), set when a probe row matched it
    /// (left, full, left semi and anti joins).
    pub(super) matched: Option<DeviceBuffer<u32>>,
    /// Null-aware anti joins (`NOT IN`): some probe row had a NULL key (then no build row is
    /// emitted), and some probe row arrived at all (then build rows with a NULL key are not
    /// emitted). Shared by every probe partition of this build side, as on the CPU.
    pub(super) probe_has_null: AtomicBool,
    pub(super) probe_non_empty: AtomicBool,
    /// The stream the build side was built on: its frees are ordered there.
    pub(super) stream: Arc<DeviceStream>,
    /// Recorded on that stream when the build side is complete: other streams wait for it on
    /// the device, not the host.
    built: Event,
    /// An event per probe stream that read it, recorded when that probe ended.
    readers: Mutex<Vec<Event>>,
    /// An event per probe stream that marked `matched`, recorded when it had queued its last
    /// mark: the partition that emits the build rows waits for them on the device.
    marked: Mutex<Vec<Event>>,
}

impl BuildSide {
    /// Makes later work on `stream` wait (on the device) until the build side is complete.
    pub(super) fn order_before(&self, stream: &Arc<DeviceStream>) -> Result<()> {
        if Arc::ptr_eq(stream, &self.stream) {
            return Ok(()); // Same stream: stream order covers it.
        }
        Ok(stream.wait_event(&self.built)?)
    }

    /// Records that `stream` has queued all its marks of `matched`.
    pub(super) fn marks_queued(&self, stream: &DeviceStream) -> Result<()> {
        let event = stream.record_event()?;
        self.marked
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(event);
        Ok(())
    }

    /// Makes later work on `stream` wait (on the device) for the marks of every probe stream
    /// that has called [`Self::marks_queued`].
    pub(super) fn order_after_marks(&self, stream: &DeviceStream) -> Result<()> {
        let marked = self.marked.lock().unwrap_or_else(|p| p.into_inner());
        for event in marked.iter() {
            stream.wait_event(event)?;
        }
        Ok(())
    }

    /// Records that `stream` is done reading this build side: the frees wait for it.
    pub(super) fn release_from(&self, stream: &Arc<DeviceStream>) {
        if Arc::ptr_eq(stream, &self.stream) {
            return; // Same stream: stream order covers it.
        }
        match stream.record_event() {
            Ok(e) => self
                .readers
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push(e),
            // Only an unhealthy device refuses an event, and it runs nothing any more.
            Err(e) => log::warn!("a probe stream could not record its end: {e}"),
        }
    }
}

impl Drop for BuildSide {
    fn drop(&mut self) {
        let readers = std::mem::take(self.readers.get_mut().unwrap_or_else(|p| p.into_inner()));
        for e in &readers {
            // The fields (and their frees) drop after this body: queued behind these waits.
            if let Err(err) = self.stream.wait_event(e) {
                log::warn!("a join build side is freed without waiting for a probe: {err}");
            }
        }
    }
}

/// Groups the build rows and lists them group by group.
pub(super) fn build_side(
    stream: &Arc<DeviceStream>,
    kernels: &Kernels,
    plan: &JoinPlan,
    batch: DeviceBatch,
    track_matches: bool,
    check_unique: bool,
) -> Result<BuildSide> {
    // A row count on the device stays there: the table and the per-row and per-group buffers
    // are sized by the bound, and the kernels stop at the count.
    let n = batch.bound();
    let live = batch.row_count().live_arg();
    if n >= u32::MAX as usize {
        return Err(SpateError::Unsupported {
            message: format!("a GPU join build side of {n} rows (the limit is 2^32 - 2)"),
        });
    }
    let keys: Vec<DeviceColumn> = plan
        .build_keys
        .iter()
        .map(|&k| batch.columns()[k].clone())
        .collect();
    // The group count stays on the device: per-group buffers get room for one group per row.
    let grouping = build_table(
        stream,
        kernels,
        ("hash", "build"),
        &keys,
        batch.row_count(),
        GroupCount::OnDevice,
    )?;
    let groups = grouping.groups.capacity();
    let sizes = stream.alloc_zeroed::<u32>(groups.max(1))?;
    // Only for a join whose probe could use it (`ProbeState::probes_unique`).
    let largest = if check_unique {
        Some(stream.alloc_zeroed::<u32>(1)?)
    } else {
        None
    };
    launch(
        stream,
        kernels.get("bcount")?,
        n,
        &[
            (&grouping.gid).into(),
            live,
            KernelArg::U64(n as u64),
            (&sizes).into(),
            largest.as_ref().into(),
        ],
    )?;
    let group_start = spate_kernels::scan::exclusive_sum(stream, sizes.as_slice())?;
    let fill = stream.alloc_zeroed::<u32>(groups.max(1))?;
    let rows_by_group = stream.alloc::<u32>(n.max(1))?;
    launch(
        stream,
        kernels.get("bscatter")?,
        n,
        &[
            (&grouping.gid).into(),
            live,
            KernelArg::U64(n as u64),
            (&group_start).into(),
            (&fill).into(),
            (&rows_by_group).into(),
        ],
    )?;
    // With a residual filter a match is decided per row pair, so per build row.
    let flags = if plan.filter.is_some() { n } else { groups };
    let matched = if track_matches {
        Some(stream.alloc_zeroed::<u32>(flags.max(1))?)
    } else {
        None
    };
    let built = stream.record_event()?;
    Ok(BuildSide {
        batch,
        keys,
        grouping,
        sizes,
        group_start,
        rows_by_group,
        largest,
        unique: OnceLock::new(),
        matched,
        probe_has_null: AtomicBool::new(false),
        probe_non_empty: AtomicBool::new(false),
        stream: Arc::clone(stream),
        built,
        readers: Mutex::new(Vec::new()),
        marked: Mutex::new(Vec::new()),
    })
}
