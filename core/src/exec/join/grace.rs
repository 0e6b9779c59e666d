//! A grace hash join: a build side larger than the join's share of the device budget is
//! spilled to host memory in partitions by the hash of its keys, the probe side after it by
//! the hash of its own keys, and each partition's build side is built and probed on its own.
//!
//! Equal keys hash alike on both sides (the key types are the same, and the hash is the row
//! hash of `spate_kernels::hash`), so a build row meets every probe row it can match in its
//! partition, and every row is in exactly one partition: inner, outer, semi, anti and mark
//! joins are the union of their partitions' results. Each partition's build rows that did
//! (not) match are emitted once its probe rows are done.
//!
//! A partition still over the limit that cannot be split (one hot key holds its rows) is joined
//! in chunks where the join allows it: its build rows in pieces that fit, each built and probed
//! by all the partition's probe rows in turn. That is right for joins whose probe rows are
//! emitted only with a match (inner, and left outer, semi, anti and mark, which decide on build
//! rows: each build row is in one chunk and meets every probe row there). Right and full outer,
//! right semi, anti and mark joins decide on probe rows over the whole build side, so their
//! unsplittable partition is built whole, over the limit.
//!
//! Not spilled (they build in memory as before): null-aware anti joins (`NOT IN`: a NULL
//! anywhere on the probe side empties the result, which no partition sees alone), and a shared
//! build side probed by several partitions. Float and boolean keys partition too (floats with
//! -0.0 folded into +0.0, as the join compares them).

use std::sync::Arc;

use arrow::array::RecordBatch;
use arrow::datatypes::SchemaRef;
use datafusion::physical_plan::metrics::Count;

use super::build::build_side;
use super::probe::ProbeState;
use crate::column::{DeviceBatch, upload_batch, upload_batches};
use crate::error::Result;
use crate::exec::spill::{Charges, HostPartitions};
use crate::expr::DevType;

/// Metric of a grace join: build chunks joined one at a time, in partitions one hot key holds.
pub(crate) const JOIN_CHUNKS: &str = "join_chunks";

/// Whether a join of `join_type` may join a partition's build side in chunks (see the module
/// docs).
pub(super) fn can_chunk(join_type: datafusion::common::JoinType) -> bool {
    use datafusion::common::JoinType;
    matches!(
        join_type,
        JoinType::Inner
            | JoinType::Left
            | JoinType::LeftSemi
            | JoinType::LeftAnti
            | JoinType::LeftMark
    )
}

/// Whether a join with these key types can spill its sides (see the module docs).
pub(super) fn can_spill(keys: &[DevType], null_aware: bool) -> bool {
    !null_aware && !keys.is_empty()
}

/// What one step of a grace join gives.
pub(super) enum Step {
    /// An output batch, or nothing this time.
    Out(Option<DeviceBatch>),
    /// Every partition is done.
    Done,
}

/// One level of partitions: the build and probe rows split by the same hash bits, and the
/// partition being probed.
struct Level {
    build: HostPartitions,
    probe: HostPartitions,
    p: usize,
    /// Whether an oversized partition of this level is split again: not below a split that
    /// left every build row in one partition (one hot key, or NULL keys).
    splits: bool,
}

/// A grace join's partitions, probed one at a time. A partition whose build side (with its
/// hash table) is still over the limit is split again, both sides by the next hash bits.
pub(super) struct Grace {
    /// The levels of partitions, the one being probed last.
    levels: Vec<Level>,
    build_schema: SchemaRef,
    probe_schema: SchemaRef,
    /// The current partition's build side is set and these probe batches are left, last first.
    started: bool,
    probe_left: Vec<Vec<RecordBatch>>,
    limit: usize,
    track: bool,
    check_unique: bool,
    known_unique: bool,
    /// Counts the chunks joined, when the join allows them.
    chunkable: Option<Count>,
    /// The build chunks of a partition joined in chunks still to join, last first, and the
    /// partition's probe groups that each of them is probed by.
    chunks: Vec<Vec<RecordBatch>>,
    chunk_probe: Vec<Vec<RecordBatch>>,
    /// What the current partition's host batches are charged to DataFusion's memory pool.
    charges: (Charges, Charges),
}

impl Grace {
    pub(super) fn new(
        build: HostPartitions,
        probe: HostPartitions,
        build_schema: SchemaRef,
        limit: usize,
        (track, check_unique, known_unique): (bool, bool, bool),
        chunkable: Option<Count>,
    ) -> Self {
        Grace {
            probe_schema: Arc::clone(probe.schema()),
            levels: vec![Level {
                build,
                probe,
                p: 0,
                splits: true,
            }],
            build_schema,
            started: false,
            probe_left: Vec::new(),
            limit,
            track,
            check_unique,
            known_unique,
            chunkable,
            chunks: Vec::new(),
            chunk_probe: Vec::new(),
            charges: (Charges::default(), Charges::default()),
        }
    }

    /// Sets `rows` (a partition's build rows, or a chunk of them) as the build side, and the
    /// probe groups left to probe it.
    fn start(
        &mut self,
        state: &mut ProbeState,
        rows: DeviceBatch,
        mut probe: Vec<Vec<RecordBatch>>,
    ) -> Result<()> {
        probe.reverse();
        self.probe_left = probe;
        let side = build_side(
            &state.stream,
            &state.kernels,
            &state.plan,
            rows,
            self.track,
            self.check_unique,
        )?;
        if self.known_unique {
            let _ = side.unique.set(true);
        }
        state.set_build(Arc::new(side));
        self.started = true;
        Ok(())
    }

    /// The next step: builds the next partition's side, probes one of its probe batches, or
    /// emits its build rows once its probe rows are done. `state` must have no shared build
    /// side (`pending` is `None`): each partition emits its own build rows.
    pub(super) fn step(&mut self, state: &mut ProbeState) -> Result<Step> {
        let stream = Arc::clone(&state.stream);
        while !self.started {
            if let Some(chunk) = self.chunks.pop() {
                let rows = upload_batches(&stream, &self.build_schema, &chunk)?;
                drop(chunk);
                let probe = self.chunk_probe.clone();
                self.start(state, rows, probe)?;
                break;
            }
            let Some(level) = self.levels.last_mut() else {
                return Ok(Step::Done);
            };
            let p = level.p;
            if p == level.build.len() {
                self.levels.pop();
                continue;
            }
            let over = level.build.with_table(p) > self.limit;
            if level.splits
                && over
                && let Some(build) = level.build.split(&stream, p)?
            {
                let probe = match level.probe.split(&stream, p)? {
                    Some(probe) => probe,
                    None => {
                        return Err(crate::error::SpateError::Internal {
                            message: "a join's sides split to different depths".into(),
                        });
                    }
                };
                level.p += 1;
                let splits = !build.is_degenerate();
                self.levels.push(Level {
                    build,
                    probe,
                    p: 0,
                    splits,
                });
                continue;
            }
            if over && let Some(count) = &self.chunkable {
                // Past splitting and still over the limit: in chunks.
                let (groups, build_charges) = level.build.take_host_grouped(p)?;
                self.chunks = chunks(groups, self.limit / 2);
                count.add(self.chunks.len());
                self.chunks.reverse();
                let (probe, probe_charges) = level.probe.take_host_grouped(p)?;
                self.chunk_probe = probe;
                self.charges = (build_charges, probe_charges);
                continue;
            }
            let batch = match level.build.take(&stream, p)? {
                Some(b) => b,
                None => upload_batch(
                    &stream,
                    &RecordBatch::new_empty(Arc::clone(&self.build_schema)),
                )?,
            };
            let (probe, probe_charges) = level.probe.take_host_grouped(p)?;
            self.charges = (Charges::default(), probe_charges);
            self.start(state, batch, probe)?;
        }
        if let Some(group) = self.probe_left.pop() {
            let batch = upload_batches(&stream, &self.probe_schema, &group)?;
            return Ok(Step::Out(state.probe(&batch)?));
        }
        let out = state.finish_partition()?;
        if self.chunks.is_empty() {
            // The partition is done (the last of its chunks, when in chunks).
            self.chunk_probe.clear();
            self.charges = (Charges::default(), Charges::default());
            if let Some(level) = self.levels.last_mut() {
                level.p += 1;
            }
        }
        self.started = false;
        Ok(Step::Out(out))
    }
}

/// `groups` (host batches of about a device batch each) packed into chunks whose rows, with a
/// hash table over them, take about `limit` device bytes; one group at least per chunk.
fn chunks(groups: Vec<Vec<RecordBatch>>, limit: usize) -> Vec<Vec<RecordBatch>> {
    let mut out: Vec<Vec<RecordBatch>> = Vec::new();
    let mut bytes = 0;
    for group in groups {
        let size: usize = group
            .iter()
            .map(|b| {
                crate::exec::upload::sliced_bytes(b)
                    + b.num_rows() * crate::exec::memory::TABLE_BYTES_PER_ROW
            })
            .sum();
        match out.last_mut() {
            Some(chunk) if bytes + size <= limit => {
                bytes += size;
                chunk.extend(group);
            }
            _ => {
                bytes = size;
                out.push(group);
            }
        }
    }
    out
}
