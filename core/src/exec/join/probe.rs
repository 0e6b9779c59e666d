//! The probe side of a GPU hash join: each probe batch looked up in the build side, and its
//! output emitted in bounded chunks.
//!
//! A probe batch of `n` rows can match any number of build rows (a hot key times a hot key),
//! so its output is cut into chunks of whole probe rows holding about `spate.gpu.batch_bytes`
//! of output each, as DataFusion's join cuts its output at `batch_size` rows: the join's
//! memory is then bounded by a chunk, not by its whole output, and a string column of a chunk
//! stays within what 32-bit offsets address (were a chunk still too large, it is cut again).
//! Chunks follow probe order, and each holds the outer (unmatched) probe rows of its own probe
//! rows, so output order stays probe order, as DataFusion's.
//!
//! Host readbacks per probe batch: the total of the match counts (to size the output), and,
//! only when the output needs more than one chunk, the chunk boundaries. Per chunk: one
//! readback of all the gathered string columns' byte totals, when there are string columns
//! (`column::gather_columns`; with a residual filter, one for the filter's input columns and
//! one for the output).
//!
//! Except for inner and left joins on unique build keys (and left semi and anti joins with a
//! filter): a probe row then makes at most one pair, so a probe batch's output fits its own
//! bound, and it is compacted on the device as a filter's is, its count left there
//! (`probe_unique`; a residual filter runs on those pairs and compacts them again, on the
//! device too): no readback at all, unless string columns without a byte bound bring the
//! count back with their totals. Whether
//! the keys are unique is learnt without a readback of its own: the build side keeps its
//! largest group's size on the device, and the second probe batch reads it back with its pair
//! total (most probes have one batch, and would only pay the bytes).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use arrow::datatypes::SchemaRef;
use arrow::record_batch::RecordBatch;
use datafusion::common::JoinType;
use datafusion::physical_plan::metrics::{BaselineMetrics, Gauge};
use spate_kernels::compact::{self, Mask};
use spate_kernels::{DeviceBuffer, DeviceSlice, KernelArg, Stream as DeviceStream};

use super::build::BuildSide;
use super::fallback::CpuProbe;
use super::mark::{marked_batch, marks_build_rows, probe_range, wants_matches};
use super::{JoinPlan, Once, assemble, assemble_counted};
use crate::column::{
    DeviceBatch, DeviceBytes, DeviceColumn, DeviceCount, DeviceValues, Gather, RowCount,
    gather_batch, gather_columns, upload_batch,
};
use crate::error::{Result, SpateError};
use crate::exec::batching::KeepsCounts;
use crate::exec::device_counts::Settlement;
use crate::exec::hash_table::{Kernels, launch};
use crate::exec::retry::{Retry, runs_out_of_device};
use crate::expr::{column_args, evaluate_predicate};

/// Candidate pairs of a join: probe rows, build rows, and how many of them are pairs.
type Pairs = (DeviceBuffer<u32>, DeviceBuffer<u32>, RowCount);

pub(super) struct ProbeState {
    pub(super) stream: Arc<DeviceStream>,
    pub(super) kernels: Arc<Kernels>,
    pub(super) plan: Arc<JoinPlan>,
    /// Set once the build side is ready.
    pub(super) build: Option<Arc<BuildSide>>,
    pub(super) join_type: JoinType,
    pub(super) null_equal: bool,
    pub(super) null_aware: bool,
    pub(super) projection: Option<Vec<usize>>,
    pub(super) schema: SchemaRef,
    pub(super) probe_schema: SchemaRef,
    pub(super) remaining: Option<usize>,
    /// The count of running probe partitions of a shared build side.
    pub(super) pending: Option<Arc<AtomicUsize>>,
    pub(super) baseline: BaselineMetrics,
    /// The device bytes of the largest output batch: what bounds the join's output.
    pub(super) largest_output_bytes: Gauge,
    /// About how many bytes one output batch may hold (`spate.gpu.batch_bytes`).
    pub(super) batch_bytes: usize,
    /// The rest of the current probe batch's output.
    pub(super) chunks: Option<Chunks>,
    /// Where `output_rows` waits for the counts of outputs left on the device.
    pub(super) settlement: Settlement,
    /// Whether the probe input's merge may leave counts on the device: set once the probe
    /// knows its build keys are unique (a probe of unique keys keeps them there).
    pub(super) keeps_counts: KeepsCounts,
    /// The plan shows the probe keys unique (and not the build keys): a probe batch's pairs
    /// fit the build side's rows, and are listed without a readback (`probe_by_build`).
    pub(super) pairs_by_build: bool,
    /// Probe batches whose pair total was read back.
    pub(super) totals_read: usize,
    /// The probe columns that came as strings with 64-bit offsets (computed strings do, even
    /// for a `Utf8` field): the all-NULL probe side of unmatched build rows takes the same
    /// layout, so that every output batch stores a column alike.
    pub(super) wide_probe_strings: Vec<bool>,
    /// Split-and-retry for a probe batch that runs out of device memory (`exec/retry.rs`).
    pub(super) retry: Retry,
    /// The halves of split probe batches still to probe, with their splits, last first.
    pub(super) split_left: Vec<(DeviceBatch, u32)>,
    /// Joins a piece that still runs out on the CPU (`fallback.rs`).
    pub(super) cpu: CpuProbe,
}

/// One probe batch's matches, emitted a chunk of whole probe rows at a time.
pub(super) struct Chunks {
    batch: DeviceBatch,
    /// Per probe row: its build group, or none.
    pgroup: DeviceBuffer<u32>,
    /// Per probe row: the index of its first (probe row, build row) pair.
    offsets: DeviceBuffer<u64>,
    /// Whether a probe row without a match still yields one pair (right and full joins).
    outer_probe: bool,
    /// Chunk boundaries as (first probe row, first pair), ending with (rows, pairs).
    bounds: Vec<(usize, usize)>,
    next: usize,
    /// With a filter, for right, full, right semi and right anti joins: per probe row, set
    /// when one of its pairs passed.
    probe_flags: Option<DeviceBuffer<u32>>,
}

impl Chunks {
    /// The probe batch's rows, or its bound when its count is on the device (the rows past
    /// the count make no pairs).
    fn rows(&self) -> usize {
        self.batch.bound()
    }
}

impl Drop for ProbeState {
    /// However the probe ends (its last batch, an error, a cancellation, a satisfied limit),
    /// the build side's frees wait for what this stream has queued (see `build.rs`).
    fn drop(&mut self) {
        if let Some(build) = &self.build {
            build.release_from(&self.stream);
        }
    }
}

/// Bytes a row of `columns` takes on average: fixed widths, and for strings their average
/// length plus the offset.
fn row_bytes<'a>(columns: impl Iterator<Item = &'a DeviceColumn>) -> usize {
    columns
        .map(|c| match c.values() {
            DeviceValues::Fixed { width, .. } => *width,
            DeviceValues::Bits { .. } => 1,
            DeviceValues::Utf8 { bytes, .. } => 4 + bytes.len() / c.len().max(1),
            DeviceValues::LargeUtf8 { bytes, .. } => 8 + bytes.len() / c.len().max(1),
        })
        .sum::<usize>()
        + 8
}

impl ProbeState {
    /// Takes the build side, once it is ready, before the first probe batch.
    pub(super) fn set_build(&mut self, side: Arc<BuildSide>) {
        self.build = Some(side);
        self.cpu.build = None;
        self.keeps_counts
            .set(self.probes_unique() || self.pairs_by_build);
    }

    /// The pair total of a probe batch's match `counts` and their exclusive scan. From the
    /// second probe batch on, while the build side's uniqueness is not known, its largest
    /// group size comes back in the same transfer, and once it is unique the probes after this
    /// one leave their counts on the device. (Not with the first: most probes have one batch,
    /// and those would only pay the bytes.)
    fn pair_total(
        &self,
        build: &BuildSide,
        counts: DeviceSlice<'_, u64>,
    ) -> Result<(DeviceBuffer<u64>, u64)> {
        let s = &self.stream;
        let largest = match &build.largest {
            Some(l)
                if self.totals_read > 0 && build.unique.get().is_none() && !counts.is_empty() =>
            {
                l
            }
            _ => return Ok(spate_kernels::scan::exclusive_sum_with_total(s, counts)?),
        };
        let total = s.alloc::<u64>(1)?;
        let offsets =
            spate_kernels::scan::exclusive_sum_total_on_device(s, counts, total.as_slice())?;
        let mut staging = s.device().pinned(12)?;
        s.download_pinned_at(total.as_slice(), &mut staging, 0)?;
        s.download_pinned_at(largest.as_slice(), &mut staging, 8)?;
        let host = staging.as_bytes()?;
        let word = |at: usize, n: usize| {
            host[at..at + n]
                .iter()
                .rev()
                .fold(0u64, |v, &b| (v << 8) | u64::from(b))
        };
        let _ = build.unique.set(word(8, 4) <= 1);
        self.keeps_counts
            .set(self.probes_unique() || self.pairs_by_build);
        Ok((offsets, word(0, 8)))
    }

    /// Whether each probe row makes at most one pair, and only a matched one: joins that
    /// `may_probe_unique`, on unique build keys. Such a probe leaves its output's count on
    /// the device (`probe_unique`).
    fn probes_unique(&self) -> bool {
        self.build
            .as_ref()
            .is_some_and(|b| b.unique.get() == Some(&true))
            && !self.null_aware
            && super::may_probe_unique(self.join_type, &self.plan)
    }

    pub(super) fn build(&self) -> Result<&BuildSide> {
        self.build.as_deref().ok_or_else(|| SpateError::Internal {
            message: "a GPU join probed before its build side was ready".into(),
        })
    }

    /// True while the current probe batch (or a piece of it joined on the CPU) has output left.
    pub(super) fn has_chunks(&self) -> bool {
        self.chunks.is_some() || self.has_cpu_chunks()
    }

    /// Looks a probe batch up; returns its first output batch (the rest comes from
    /// [`ProbeState::next_chunk`]). Out of device memory, the batch is split in halves: the
    /// first is probed now, the second waits in [`ProbeState::take_split`] (down to an eighth;
    /// a piece that runs out then is joined on the CPU where the join type allows it, see
    /// `fallback.rs`, and fails the query where it does not).
    pub(super) fn probe(&mut self, batch: &DeviceBatch) -> Result<Option<DeviceBatch>> {
        self.probe_piece(batch.clone(), 0)
    }

    /// [`ProbeState::probe`] of a piece of a batch split `splits` times.
    pub(super) fn probe_piece(
        &mut self,
        batch: DeviceBatch,
        splits: u32,
    ) -> Result<Option<DeviceBatch>> {
        match self.probe_once(&batch) {
            Err(e) if runs_out_of_device(&e) => match self.retry.split(&batch, splits)? {
                Some((first, second)) => {
                    self.split_left.push((second, splits + 1));
                    self.probe_piece(first, splits + 1)
                }
                None => match self.probe_on_cpu(&batch)? {
                    Some(out) => Ok(Some(out)),
                    None => Err(e),
                },
            },
            other => other,
        }
    }

    /// The next half of a split probe batch to probe, before any other probe batch.
    pub(super) fn take_split(&mut self) -> Option<(DeviceBatch, u32)> {
        self.split_left.pop()
    }

    fn probe_once(&mut self, batch: &DeviceBatch) -> Result<Option<DeviceBatch>> {
        self.wide_probe_strings = batch
            .columns()
            .iter()
            .map(|c| matches!(c.values(), DeviceValues::LargeUtf8 { .. }))
            .collect();
        let compute = self.baseline.elapsed_compute().clone();
        let _timer = compute.timer();
        let s = Arc::clone(&self.stream);
        let s = &s;
        // The probe kernel stops at a device row count (a probe of unique keys gets such
        // batches from its merge), and the pair total it sums is read back anyway, so the
        // count need not come to the host. Except where the probe rows without a match are
        // selected later (right semi and anti joins, and right and full joins with a filter,
        // by flags), or a NULL key is looked for (NOT IN): those joins resolve it first.
        let resolve = self.null_aware
            || match self.join_type {
                JoinType::RightSemi | JoinType::RightAnti | JoinType::RightMark => true,
                JoinType::Right | JoinType::Full => self.plan.filter.is_some(),
                _ => false,
            };
        let resolved;
        let batch = if resolve {
            resolved = batch.resolve(s)?;
            &resolved
        } else {
            batch
        };
        let n = batch.bound();
        if n >= u32::MAX as usize {
            return Err(SpateError::Unsupported {
                message: format!("a GPU join probe batch of {n} rows (the limit is 2^32 - 2)"),
            });
        }
        let build = Arc::clone(self.build.as_ref().ok_or_else(|| SpateError::Internal {
            message: "a GPU join probed before its build side was ready".into(),
        })?);
        if self.null_aware {
            if n > 0 {
                build.probe_non_empty.store(true, Ordering::Relaxed);
            }
            if batch.columns()[self.plan.probe_keys[0]].count_nulls(s)? > 0 {
                build.probe_has_null.store(true, Ordering::Relaxed);
            }
            if build.probe_has_null.load(Ordering::Relaxed) {
                // `x NOT IN (..., NULL)` is never true: nothing left to match.
                return Ok(None);
            }
        }
        let mut args = Vec::new();
        for &k in &self.plan.probe_keys {
            column_args(&batch.columns()[k], &mut args);
        }
        for k in &build.keys {
            column_args(k, &mut args);
        }
        let filtered = self.plan.filter.is_some();
        // With a residual filter, outer rows and matches are decided after the filter.
        let outer_probe = matches!(self.join_type, JoinType::Right | JoinType::Full) && !filtered;
        let pgroup = s.alloc::<u32>(n.max(1))?;
        let counts = s.alloc::<u64>(n.max(1))?;
        args.extend([
            batch.row_count().live_arg(),
            KernelArg::U64(n as u64),
            (&build.grouping.hashes).into(),
            (&build.grouping.table).into(),
            KernelArg::U64(build.grouping.table.len() as u64 - 1),
            (&build.grouping.group_of_slot).into(),
            (&build.sizes).into(),
            KernelArg::U32(u32::from(self.null_equal)),
            KernelArg::U32(u32::from(outer_probe)),
            (&pgroup).into(),
            (&counts).into(),
            if filtered {
                KernelArg::null()
            } else {
                build.matched.as_ref().into()
            },
        ]);
        launch(s, self.kernels.get("probe")?, n, &args)?;
        // A probe row makes at most one pair, and only matched rows make one: the output is
        // the matched rows, compacted on the device like a filter's.
        if self.probes_unique() {
            // Another partition may have learnt it: this one's merge keeps counts from now on.
            self.keeps_counts.set(true);
            return self.probe_unique(batch, &pgroup, &build);
        }
        if self.pairs_by_build {
            match self.probe_by_build(batch, &pgroup, &counts, &build) {
                // Strings too long for one output batch: the chunked path below cuts them.
                Err(e) if e.is_output_too_large() => {}
                other => return other,
            }
        }
        if !filtered {
            match self.join_type {
                t if marks_build_rows(t) => return Ok(None),
                JoinType::RightSemi | JoinType::RightAnti | JoinType::RightMark => {
                    return self.probe_semi(batch, &pgroup);
                }
                _ => {}
            }
        }
        let (offsets, total) = self.pair_total(&build, counts.slice(..n)?)?;
        self.totals_read += 1;
        let total = total as usize;
        let needs_flags = filtered
            && matches!(
                self.join_type,
                JoinType::Right
                    | JoinType::Full
                    | JoinType::RightSemi
                    | JoinType::RightAnti
                    | JoinType::RightMark
            );
        if total == 0 && !needs_flags {
            return Ok(None);
        }
        // About how many pairs one chunk may hold.
        let mut width = row_bytes(batch.columns().iter().chain(build.batch.columns().iter()));
        if let Some(f) = &self.plan.filter {
            width += 8 * f.columns.len();
        }
        let step = (self.batch_bytes / width.max(1)).max(1);
        let mut chunks = Chunks {
            batch: batch.clone(),
            pgroup,
            offsets,
            outer_probe,
            bounds: Vec::new(),
            next: 0,
            probe_flags: if needs_flags {
                Some(s.alloc_zeroed::<u32>(n.max(1))?)
            } else {
                None
            },
        };
        chunks.bounds = self.cut(&chunks, (0, 0), (n, total), step)?;
        self.chunks = Some(chunks);
        self.next_chunk_timed()
    }

    /// Chunk boundaries of `from..to` (probe rows, pairs) about `step` pairs apart, at whole
    /// probe rows; the first is `from` and the last `to`.
    fn cut(
        &self,
        chunks: &Chunks,
        from: (usize, usize),
        to: (usize, usize),
        step: usize,
    ) -> Result<Vec<(usize, usize)>> {
        let pairs = to.1 - from.1;
        if pairs <= step {
            return Ok(vec![from, to]);
        }
        let s = &self.stream;
        let cuts = pairs.div_ceil(step) - 1;
        let out = s.alloc::<u64>(2 * cuts)?;
        launch(
            s,
            self.kernels.get("cuts")?,
            cuts,
            &[
                (&chunks.offsets).into(),
                KernelArg::U64(from.0 as u64),
                KernelArg::U64(to.0 as u64),
                KernelArg::U64(to.1 as u64),
                KernelArg::U64(from.1 as u64),
                KernelArg::U64(step as u64),
                KernelArg::U64(cuts as u64),
                (&out).into(),
            ],
        )?;
        let host = s.to_vec(&out)?;
        let mut bounds = vec![from];
        for c in host.chunks_exact(2) {
            let cut = (c[0] as usize, c[1] as usize);
            // Rows after the last pair join the chunk before them: a chunk of no pairs would
            // be an empty batch.
            if cut.0 > bounds[bounds.len() - 1].0 && cut.0 < to.0 && cut.1 < to.1 {
                bounds.push(cut);
            }
        }
        bounds.push(to);
        Ok(bounds)
    }

    /// The next chunk of the current probe batch's output, if any is left.
    pub(super) fn next_chunk(&mut self) -> Result<Option<DeviceBatch>> {
        let compute = self.baseline.elapsed_compute().clone();
        let _timer = compute.timer();
        self.next_chunk_timed()
    }

    fn next_chunk_timed(&mut self) -> Result<Option<DeviceBatch>> {
        loop {
            let Some(mut chunks) = self.chunks.take() else {
                return self.next_cpu_chunk();
            };
            if chunks.next + 1 >= chunks.bounds.len() {
                return Ok(None);
            }
            let (from, to) = (chunks.bounds[chunks.next], chunks.bounds[chunks.next + 1]);
            let out = match self.emit(&chunks, from, to) {
                Err(e) if e.is_output_too_large() && to.0 - from.0 > 1 => {
                    // Still too large for 32-bit string offsets: cut it in two and retry.
                    let half = ((to.1 - from.1) / 2).max(1);
                    let finer = self.cut(&chunks, from, to, half)?;
                    if finer.len() <= 2 {
                        return Err(e);
                    }
                    chunks.bounds.splice(chunks.next..chunks.next + 2, finer);
                    self.chunks = Some(chunks);
                    continue;
                }
                other => other?,
            };
            chunks.next += 1;
            if chunks.next + 1 < chunks.bounds.len() {
                self.chunks = Some(chunks);
            }
            if out.is_some() {
                return Ok(out);
            }
        }
    }

    /// The output of probe rows `from.0..to.0`, whose pairs are `from.1..to.1`.
    fn emit(
        &self,
        chunks: &Chunks,
        from: (usize, usize),
        to: (usize, usize),
    ) -> Result<Option<DeviceBatch>> {
        let s = &self.stream;
        let build = self.build()?;
        let pairs = to.1 - from.1;
        if pairs == 0 && self.plan.filter.is_none() {
            return Ok(None);
        }
        if pairs >= u32::MAX as usize {
            return Err(SpateError::Unsupported {
                message: format!(
                    "a GPU join chunk of {pairs} pairs: one probe row matches more than 2^32 - 2 \
                     build rows"
                ),
            });
        }
        let out_probe = s.alloc::<u32>(pairs.max(1))?;
        let out_build = s.alloc::<u32>(pairs.max(1))?;
        launch(
            s,
            self.kernels.get("pairs")?,
            pairs,
            &[
                (&chunks.pgroup).into(),
                (&chunks.offsets).into(),
                KernelArg::U64(chunks.rows() as u64),
                KernelArg::U64(from.1 as u64),
                KernelArg::U64(pairs as u64),
                (&build.group_start).into(),
                (&build.rows_by_group).into(),
                (&out_probe).into(),
                (&out_build).into(),
            ],
        )?;
        let (probe_rows, build_rows) = (out_probe.slice(..pairs)?, out_build.slice(..pairs)?);
        if self.plan.filter.is_none() {
            return assemble(
                s,
                &self.schema,
                self.projection.as_deref(),
                Some((&build.batch, build_rows, chunks.outer_probe)),
                Some((&chunks.batch, probe_rows, false)),
                pairs,
            )
            .map(Some);
        }
        self.emit_filtered(chunks, from, to, probe_rows, build_rows)
    }

    /// A chunk of a join with a residual filter: the candidate pairs, filtered.
    fn emit_filtered(
        &self,
        chunks: &Chunks,
        from: (usize, usize),
        to: (usize, usize),
        probe_rows: DeviceSlice<'_, u32>,
        build_rows: DeviceSlice<'_, u32>,
    ) -> Result<Option<DeviceBatch>> {
        let s = &self.stream;
        let build = self.build()?;
        let batch = &chunks.batch;
        let pairs = to.1 - from.1;
        let Some(filter) = &self.plan.filter else {
            return Ok(None);
        };
        // The filter's input: its columns gathered from both sides by the pairs.
        let gathers: Vec<Gather<'_>> = filter
            .columns
            .iter()
            .map(|&(from_build, c)| {
                if from_build {
                    Gather::rows(&build.batch.columns()[c], build_rows)
                } else {
                    Gather::rows(&batch.columns()[c], probe_rows)
                }
            })
            .collect();
        let columns = gather_columns(s, &gathers)?;
        let candidates = DeviceBatch::try_new(Arc::clone(&filter.schema), columns, pairs)?;
        let filter_kernel = self
            .kernels
            .computed
            .as_ref()
            .ok_or_else(|| SpateError::Internal {
                message: "a GPU join filter without its kernel".into(),
            })?;
        let keep = evaluate_predicate(s, filter_kernel, &filter.predicate, &candidates)?;
        let mark = |rows: DeviceSlice<'_, u32>, flags: &DeviceBuffer<u32>| {
            launch(
                s,
                self.kernels.get("mark")?,
                pairs,
                &[
                    rows.into(),
                    (&keep).into(),
                    KernelArg::U64(pairs as u64),
                    flags.into(),
                ],
            )
        };
        if let Some(matched) = &build.matched {
            mark(build_rows, matched)?;
        }
        if let Some(flags) = &chunks.probe_flags {
            mark(probe_rows, flags)?;
        }
        // The probe rows of this chunk whose flag is (not) set, as absolute row indices.
        let select = |flags: &DeviceBuffer<u32>, want: bool| -> Result<DeviceBuffer<u32>> {
            let rows = to.0 - from.0;
            let mask = s.alloc::<u8>(rows.max(1))?;
            launch(
                s,
                self.kernels.get("fmask")?,
                rows,
                &[
                    flags.slice(from.0..to.0)?.into(),
                    KernelArg::null(),
                    KernelArg::U64(rows as u64),
                    KernelArg::U32(u32::from(want)),
                    (&mask).into(),
                ],
            )?;
            let kept = compact::select_indices(s, Mask::Bytes(mask.slice(..rows)?), None, rows)?;
            launch(
                s,
                self.kernels.get("shift")?,
                kept.len(),
                &[
                    (&kept).into(),
                    KernelArg::U64(kept.len() as u64),
                    KernelArg::U32(from.0 as u32),
                ],
            )?;
            Ok(kept)
        };
        match self.join_type {
            t if marks_build_rows(t) => Ok(None),
            JoinType::RightMark => {
                let Some(flags) = &chunks.probe_flags else {
                    return Ok(None);
                };
                let rows = to.0 - from.0;
                if rows == 0 {
                    return Ok(None);
                }
                let matched = s.alloc::<u8>(rows)?;
                launch(
                    s,
                    self.kernels.get("fmask")?,
                    rows,
                    &[
                        flags.slice(from.0..to.0)?.into(),
                        KernelArg::null(),
                        KernelArg::U64(rows as u64),
                        KernelArg::U32(1),
                        (&matched).into(),
                    ],
                )?;
                let columns = probe_range(s, &self.kernels, batch, from.0, rows)?;
                marked_batch(
                    s,
                    &self.kernels,
                    &self.schema,
                    self.projection.as_deref(),
                    columns,
                    matched.as_slice(),
                    RowCount::Host(rows),
                )
                .map(Some)
            }
            JoinType::RightSemi | JoinType::RightAnti => {
                let Some(flags) = &chunks.probe_flags else {
                    return Ok(None);
                };
                let kept = select(flags, self.join_type == JoinType::RightSemi)?;
                if kept.is_empty() {
                    return Ok(None);
                }
                assemble(
                    s,
                    &self.schema,
                    self.projection.as_deref(),
                    None,
                    Some((batch, kept.as_slice(), false)),
                    kept.len(),
                )
                .map(Some)
            }
            _ => {
                let passing =
                    compact::select_indices(s, Mask::Bytes(keep.slice(..pairs)?), None, pairs)?;
                let p = spate_kernels::gather::gather(s, probe_rows, passing.as_slice())?;
                let b = spate_kernels::gather::gather(s, build_rows, passing.as_slice())?;
                let lonely = match &chunks.probe_flags {
                    Some(flags) => select(flags, false)?,
                    None => s.alloc::<u32>(0)?,
                };
                let rows = passing.len() + lonely.len();
                if rows == 0 {
                    return Ok(None);
                }
                if lonely.is_empty() {
                    return assemble(
                        s,
                        &self.schema,
                        self.projection.as_deref(),
                        Some((&build.batch, b.as_slice(), false)),
                        Some((batch, p.as_slice(), false)),
                        rows,
                    )
                    .map(Some);
                }
                // Right and full outer: the probe rows no kept pair matched join NULLs. Kept
                // pairs are in probe order; a stable sort on the probe row merges the two
                // lists back into probe order, as DataFusion's output is.
                let mut all_probe = s.alloc::<u32>(rows)?;
                s.copy_device(p.as_slice(), &mut all_probe, 0)?;
                s.copy_device(lonely.as_slice(), &mut all_probe, p.len())?;
                let mut all_build = s.alloc::<u32>(rows)?;
                s.copy_device(b.as_slice(), &mut all_build, 0)?;
                let nothing =
                    s.from_host(&vec![spate_kernels::launch::NULL_INDEX; lonely.len()])?;
                s.copy_device(nothing.as_slice(), &mut all_build, b.len())?;
                let sorted = spate_kernels::sort::sort_pairs(s, all_probe.as_slice(), None, 32)?;
                let build_order = spate_kernels::gather::gather(
                    s,
                    all_build.as_slice(),
                    sorted.values.as_slice(),
                )?;
                assemble(
                    s,
                    &self.schema,
                    self.projection.as_deref(),
                    Some((&build.batch, build_order.as_slice(), true)),
                    Some((batch, sorted.keys.as_slice(), false)),
                    rows,
                )
                .map(Some)
            }
        }
    }

    /// Joins on a build side of unique keys: each matched probe row with its one build row,
    /// through the residual filter when there is one. The pair count stays on the device
    /// (nothing waits), unless string columns read their byte totals back with it.
    fn probe_unique(
        &self,
        batch: &DeviceBatch,
        pgroup: &DeviceBuffer<u32>,
        build: &BuildSide,
    ) -> Result<Option<DeviceBatch>> {
        let s = &self.stream;
        let n = batch.bound();
        if n == 0 {
            return Ok(None);
        }
        // Rows past the batch's device count have no group, so they are not kept.
        let mask = s.alloc::<u8>(n)?;
        launch(
            s,
            self.kernels.get("pmask")?,
            n,
            &[
                pgroup.into(),
                KernelArg::U64(n as u64),
                KernelArg::U32(1),
                (&mask).into(),
            ],
        )?;
        let word = DeviceCount::new(s.alloc::<u32>(1)?)?;
        let probe_rows = compact::select_indices_on_device(
            s,
            Mask::Bytes(mask.as_slice()),
            None,
            n,
            word.as_slice(),
        )?;
        let build_rows = s.alloc::<u32>(n)?;
        launch(
            s,
            self.kernels.get("ubuild")?,
            n,
            &[
                (&probe_rows).into(),
                word.as_slice().into(),
                KernelArg::U64(n as u64),
                pgroup.into(),
                (&build.group_start).into(),
                (&build.rows_by_group).into(),
                (&build_rows).into(),
            ],
        )?;
        let rows = RowCount::Device { bound: n, word };
        let (probe_rows, build_rows, rows) = match &self.plan.filter {
            None => (probe_rows, build_rows, rows),
            Some(filter) => {
                match self.filter_pairs(
                    filter,
                    batch,
                    build,
                    (probe_rows, build_rows, rows),
                    Once::Probe,
                )? {
                    Some(kept) => kept,
                    None => return Ok(None),
                }
            }
        };
        if marks_build_rows(self.join_type) {
            // The filter marked the build rows; they come out when the probe ends.
            return Ok(None);
        }
        let out = assemble_counted(
            s,
            &self.schema,
            self.projection.as_deref(),
            Some((&build.batch, build_rows.as_slice(), false)),
            Some((batch, probe_rows.as_slice(), false)),
            &rows,
            Once::Probe,
        )?;
        // The string totals may have brought the count back.
        Ok((out.host_rows() != Some(0)).then_some(out))
    }

    /// Joins whose probe keys are unique (those that `may_probe_unique`): a build row pairs
    /// with one probe row at most, so a probe batch's pairs fit the build side's rows. They
    /// are listed for that many, their count left on the device (`dpairs`), and go through
    /// the residual filter as a probe of unique build keys does: nothing waits, unless string
    /// columns without a byte bound read their totals back.
    fn probe_by_build(
        &self,
        batch: &DeviceBatch,
        pgroup: &DeviceBuffer<u32>,
        counts: &DeviceBuffer<u64>,
        build: &BuildSide,
    ) -> Result<Option<DeviceBatch>> {
        let s = &self.stream;
        let n = batch.bound();
        // The pairs' bound is the build side's row count, read back once per build side (4
        // bytes) when it is on the device and the pairs make output: its bound may be far
        // larger (the rows its filters and joins came from), and outputs sized by it would
        // compound down the plan. A semi or anti join's pairs only mark build rows, and are
        // dropped before the next probe batch: its bound does.
        let bound = match build.batch.row_count() {
            RowCount::Host(rows) => *rows,
            RowCount::Device { bound, .. } if marks_build_rows(self.join_type) => *bound,
            RowCount::Device { word, .. } => word.read(s)?,
        };
        if n == 0 || bound == 0 {
            return Ok(None);
        }
        let total = s.alloc::<u64>(1)?;
        let offsets = spate_kernels::scan::exclusive_sum_total_on_device(
            s,
            counts.slice(..n)?,
            total.as_slice(),
        )?;
        let word = DeviceCount::new(s.alloc::<u32>(1)?)?;
        let probe_rows = s.alloc::<u32>(bound)?;
        let build_rows = s.alloc::<u32>(bound)?;
        launch(
            s,
            self.kernels.get("dpairs")?,
            bound,
            &[
                pgroup.into(),
                (&offsets).into(),
                KernelArg::U64(n as u64),
                (&total).into(),
                KernelArg::U64(bound as u64),
                (&build.group_start).into(),
                (&build.rows_by_group).into(),
                (&probe_rows).into(),
                (&build_rows).into(),
                word.as_slice().into(),
            ],
        )?;
        let rows = RowCount::Device { bound, word };
        let (probe_rows, build_rows, rows) = match &self.plan.filter {
            None => (probe_rows, build_rows, rows),
            Some(filter) => match self.filter_pairs(
                filter,
                batch,
                build,
                (probe_rows, build_rows, rows),
                Once::Build,
            )? {
                Some(kept) => kept,
                None => return Ok(None),
            },
        };
        if marks_build_rows(self.join_type) {
            return Ok(None);
        }
        let out = assemble_counted(
            s,
            &self.schema,
            self.projection.as_deref(),
            Some((&build.batch, build_rows.as_slice(), false)),
            Some((batch, probe_rows.as_slice(), false)),
            &rows,
            Once::Build,
        )?;
        Ok((out.host_rows() != Some(0)).then_some(out))
    }

    /// The residual filter of a probe of unique keys, on its candidate pairs (`probe_rows`
    /// with `build_rows`, `rows` of them), where the side `once` takes each of its rows at
    /// most once. Marks the build rows of the pairs that pass (for left, semi and anti joins),
    /// and returns those pairs, their count on the device as the candidates' was: the
    /// filter's inputs are gathered, evaluated and compacted without a readback, when their
    /// string columns have byte bounds (the side taken once by its own bytes, the other by its
    /// longest string). `None` when nothing is left to emit (the string totals brought a count
    /// of 0 back, or a semi or anti join only marks).
    fn filter_pairs(
        &self,
        filter: &super::FilterPlan,
        batch: &DeviceBatch,
        build: &BuildSide,
        (probe_rows, build_rows, rows): Pairs,
        once: Once,
    ) -> Result<Option<Pairs>> {
        let s = &self.stream;
        let n = rows.bound();
        let (probe_at, build_at) = (probe_rows.slice(..n)?, build_rows.slice(..n)?);
        let gathers: Vec<Gather<'_>> = filter
            .columns
            .iter()
            .map(|&(from_build, c)| {
                let (gather, taken_once) = if from_build {
                    (
                        Gather::rows(&build.batch.columns()[c], build_at),
                        once == Once::Build,
                    )
                } else {
                    (
                        Gather::rows(&batch.columns()[c], probe_at),
                        once == Once::Probe,
                    )
                };
                if taken_once {
                    gather.each_row_once()
                } else {
                    gather
                }
            })
            .collect();
        let candidates = gather_batch(s, Arc::clone(&filter.schema), &gathers, &rows)?;
        // The string totals may have brought the count back, and cut the candidates to it.
        let m = candidates.bound();
        if m == 0 {
            return Ok(None);
        }
        let filter_kernel = self
            .kernels
            .computed
            .as_ref()
            .ok_or_else(|| SpateError::Internal {
                message: "a GPU join filter without its kernel".into(),
            })?;
        // 0 for the candidates past a device count.
        let keep = evaluate_predicate(s, filter_kernel, &filter.predicate, &candidates)?;
        if let Some(matched) = &build.matched {
            launch(
                s,
                self.kernels.get("mark")?,
                m,
                &[
                    build_rows.slice(..m)?.into(),
                    (&keep).into(),
                    KernelArg::U64(m as u64),
                    matched.into(),
                ],
            )?;
        }
        if marks_build_rows(self.join_type) {
            return Ok(None);
        }
        let word = DeviceCount::new(s.alloc::<u32>(1)?)?;
        let passing = compact::select_indices_on_device(
            s,
            Mask::Bytes(keep.slice(..m)?),
            None,
            m,
            word.as_slice(),
        )?;
        let live = Some(word.as_slice());
        let p = spate_kernels::gather::gather_live(
            s,
            probe_rows.slice(..m)?,
            passing.as_slice(),
            live,
        )?;
        let b = spate_kernels::gather::gather_live(
            s,
            build_rows.slice(..m)?,
            passing.as_slice(),
            live,
        )?;
        Ok(Some((p, b, RowCount::Device { bound: m, word })))
    }

    /// Right semi, anti and mark joins without a filter: the probe rows that did (not) match,
    /// or all of them with their marks.
    fn probe_semi(
        &self,
        batch: &DeviceBatch,
        pgroup: &DeviceBuffer<u32>,
    ) -> Result<Option<DeviceBatch>> {
        let s = &self.stream;
        let n = batch.bound();
        let mask = s.alloc::<u8>(n.max(1))?;
        launch(
            s,
            self.kernels.get("pmask")?,
            n,
            &[
                pgroup.into(),
                KernelArg::U64(n as u64),
                KernelArg::U32(u32::from(wants_matches(self.join_type))),
                (&mask).into(),
            ],
        )?;
        if self.join_type == JoinType::RightMark {
            if n == 0 {
                return Ok(None);
            }
            return marked_batch(
                s,
                &self.kernels,
                &self.schema,
                self.projection.as_deref(),
                batch.columns().to_vec(),
                mask.as_slice(),
                batch.row_count().clone(),
            )
            .map(Some);
        }
        let kept = compact::select_indices(s, Mask::Bytes(mask.as_slice()), None, n)?;
        let rows = kept.len();
        if rows == 0 {
            return Ok(None);
        }
        assemble(
            s,
            &self.schema,
            self.projection.as_deref(),
            None,
            Some((batch, kept.as_slice(), false)),
            rows,
        )
        .map(Some)
    }

    /// After the last probe batch: the build rows that matched (left semi) or did not (left
    /// anti, and with NULLs for the probe side, left and full outer).
    fn finish(&self) -> Result<Option<DeviceBatch>> {
        let _timer = self.baseline.elapsed_compute().timer();
        let s = &self.stream;
        let build = self.build()?;
        let Some(matched) = &build.matched else {
            return Ok(None);
        };
        let n = build.batch.bound();
        if n == 0 {
            return Ok(None);
        }
        let (probe_has_null, probe_non_empty) = (
            build.probe_has_null.load(Ordering::Relaxed),
            build.probe_non_empty.load(Ordering::Relaxed),
        );
        if self.null_aware && probe_has_null {
            return Ok(None);
        }
        // `NULL NOT IN (rows)` is NULL, but `NULL NOT IN (empty)` is true.
        let key_validity = if self.null_aware && probe_non_empty {
            build.keys[0].validity().map(|v| v.bitmap())
        } else {
            None
        };
        let mask = s.alloc::<u8>(n)?;
        let want = KernelArg::U32(u32::from(wants_matches(self.join_type)));
        if self.plan.filter.is_some() {
            // Matches were flagged per build row.
            launch(
                s,
                self.kernels.get("fmask")?,
                n,
                &[
                    matched.into(),
                    build.batch.row_count().live_arg(),
                    KernelArg::U64(n as u64),
                    want,
                    (&mask).into(),
                ],
            )?;
        } else {
            launch(
                s,
                self.kernels.get("bmask")?,
                n,
                &[
                    (&build.grouping.gid).into(),
                    build.batch.row_count().live_arg(),
                    KernelArg::U64(n as u64),
                    matched.into(),
                    want,
                    (&mask).into(),
                ],
            )?;
        }
        if self.join_type == JoinType::LeftMark {
            // Every build row, with its mark. The build side's columns leave the join as they
            // are: allocated on a shared build side's own stream, their frees must then wait
            // for the work this stream's consumers queue on them.
            if !Arc::ptr_eq(&build.stream, &self.stream) {
                build.batch.share_across_streams();
            }
            // The count is read back here (one word): a shared build side's count and string
            // byte words live on its own stream, and must not outlive it on this one's.
            let all = build.batch.resolve(s)?;
            return marked_batch(
                s,
                &self.kernels,
                &self.schema,
                self.projection.as_deref(),
                all.columns().to_vec(),
                mask.as_slice(),
                all.row_count().clone(),
            )
            .map(Some);
        }
        if marks_build_rows(self.join_type) {
            // Each build row at most once: the rows keep their count on the device.
            let word = DeviceCount::new(s.alloc::<u32>(1)?)?;
            let kept = compact::select_indices_on_device(
                s,
                Mask::Bytes(mask.as_slice()),
                key_validity,
                n,
                word.as_slice(),
            )?;
            let out = assemble_counted(
                s,
                &self.schema,
                self.projection.as_deref(),
                Some((&build.batch, kept.as_slice(), false)),
                None,
                &RowCount::Device { bound: n, word },
                Once::Build,
            )?;
            // The string totals may have brought the count back.
            return Ok((out.host_rows() != Some(0)).then_some(out));
        }
        let kept = compact::select_indices(s, Mask::Bytes(mask.as_slice()), key_validity, n)?;
        let rows = kept.len();
        if rows == 0 {
            return Ok(None);
        }
        // Left and full outer: the probe side is all NULL.
        let nothing = s.from_host(&vec![spate_kernels::launch::NULL_INDEX; rows])?;
        let empty = self.empty_probe_batch()?;
        assemble(
            s,
            &self.schema,
            self.projection.as_deref(),
            Some((&build.batch, kept.as_slice(), false)),
            Some((&empty, nothing.as_slice(), true)),
            rows,
        )
        .map(Some)
    }

    /// The end of this partition's probe rows. With a shared build side only the last probe
    /// partition to finish emits the build rows. Every partition records an event once its
    /// marks are queued, and the last one waits for them all on the device before it reads the
    /// marks: no partition waits on the host.
    pub(super) fn finish_partition(&self) -> Result<Option<DeviceBatch>> {
        let Some(pending) = &self.pending else {
            return self.finish();
        };
        let build = self.build()?;
        if build.matched.is_none() {
            return Ok(None);
        }
        // The last partition reads every partition's marks: it waits for them on the device.
        build.marks_queued(&self.stream)?;
        if pending.fetch_sub(1, Ordering::AcqRel) == 1 {
            build.order_after_marks(&self.stream)?;
            self.finish()
        } else {
            Ok(None)
        }
    }

    /// A probe batch of no rows, its string columns stored as the probe batches stored them.
    fn empty_probe_batch(&self) -> Result<DeviceBatch> {
        let s = &self.stream;
        let empty = upload_batch(s, &RecordBatch::new_empty(Arc::clone(&self.probe_schema)))?;
        if !self.wide_probe_strings.iter().any(|&w| w) {
            return Ok(empty);
        }
        let mut columns = Vec::with_capacity(empty.columns().len());
        for (k, c) in empty.columns().iter().enumerate() {
            let wide = self.wide_probe_strings.get(k).copied().unwrap_or(false);
            columns.push(match c.values() {
                DeviceValues::Utf8 { .. } if wide => DeviceColumn::new(
                    c.data_type().clone(),
                    0,
                    0,
                    None,
                    DeviceValues::LargeUtf8 {
                        offsets: DeviceBytes::new(s.alloc_zeroed::<i64>(1)?.into_bytes()),
                        bytes: DeviceBytes::new(s.alloc::<u8>(0)?),
                    },
                ),
                _ => c.clone(),
            });
        }
        DeviceBatch::try_new(Arc::clone(&self.probe_schema), columns, 0)
    }

    /// Counts an output batch.
    pub(super) fn record(&self, batch: &DeviceBatch) {
        match batch.row_count() {
            RowCount::Host(rows) => self.baseline.record_output(*rows),
            // Whoever reads the count back adds it (`probe_unique`'s output).
            RowCount::Device { word, .. } => {
                self.settlement
                    .count_rows(word, self.baseline.output_rows(), &self.stream)
            }
        }
        self.baseline.output_batches().add(1);
        self.largest_output_bytes.set_max(batch.device_bytes());
    }

    /// Applies the join's fetch (LIMIT) to an output batch.
    pub(super) fn limit(&mut self, batch: DeviceBatch) -> Result<Option<DeviceBatch>> {
        let Some(remaining) = self.remaining.as_mut() else {
            return Ok(Some(batch));
        };
        // Under a fetch the host counts, to stop at it.
        let batch = batch.resolve(&self.stream)?;
        let rows = batch.bound().min(*remaining);
        *remaining -= rows;
        if rows == 0 {
            return Ok(None);
        }
        if rows == batch.bound() {
            return Ok(Some(batch));
        }
        let first: Vec<u32> = (0..rows as u32).collect();
        let first = self.stream.from_host(&first)?;
        let gathers: Vec<Gather<'_>> = batch
            .columns()
            .iter()
            .map(|c| Gather::rows(c, first.as_slice()))
            .collect();
        let columns = gather_columns(&self.stream, &gathers)?;
        DeviceBatch::try_new(Arc::clone(batch.schema()), columns, rows).map(Some)
    }
}
