//! A grouped aggregation larger than its share of the device budget: its input aggregated batch
//! by batch into partial states, the states merged as they accumulate, and, when even the merged
//! groups outgrow the share, the states spilled to host memory in hash partitions and finished
//! one partition at a time.
//!
//! A final or single aggregation first collects its input on the device, as it always has, and
//! aggregates it in one pass when the input stays within [`memory::state_limit`]. Past that it
//! turns into [`Stages`]: the aggregation DataFusion would plan in two phases (`Partial`, then
//! `Final`), plus a `PartialReduce` that merges states into states. States are DataFusion's, so
//! every stage is an ordinary GPU aggregation (`plan::analyze`). Equal group keys hash alike, so
//! a group's states all land in one partition, which the `Final` stage finishes on its own; a
//! partition still over the limit is split again by the next hash bits.
//!
//! When the groups are nearly as many as the rows, partial states are larger than the rows
//! they come from and merging them does not shrink them. Once a batch's states have more than
//! half its rows, the aggregation spills the input rows themselves instead (with their group
//! key values appended, which they are partitioned by, as the states are by theirs), and each
//! partition's rows become states only when the partition is finished. (Not with grouping sets,
//! whose states carry a grouping id the rows do not: rows and states must hash alike. Float
//! keys do, -0.0 folded into +0.0 on both.)
//!
//! Not staged (they keep the one pass over the collected input): aggregations without group
//! keys (they fold batch by batch already), those whose output keeps an order (their groups
//! would come out partition by partition), and those DataFusion cannot split in two phases
//! (COUNT(DISTINCT), whose partial state is a list): those spill their rows by group key and
//! finish partition by partition instead (`partitioned.rs`).

use std::sync::Arc;

use arrow::datatypes::SchemaRef;
use datafusion::physical_plan::ExecutionPlan;
use datafusion::physical_plan::aggregates::{AggregateExec, AggregateMode};
use spate_kernels::Stream as DeviceStream;

use super::aggregate_batch;
use super::plan::{AggPlan, analyze};
use crate::column::{DeviceBatch, concat_device_batches};
use crate::device::GpuContext;
use crate::error::Result;
use crate::exec::hash_table::Kernels;
use crate::exec::spill::{HostPartitions, SpillOptions, TOP_SHIFT};

/// Pending states are merged (or spilled) once they pass this fraction of the operator's
/// limit: a merge takes about three times its input (the table, the accumulators, the output).
const MERGE_SHARE: usize = 4;

/// One stage: its plan and the schema of its output.
struct Stage {
    plan: AggPlan,
    schema: SchemaRef,
}

impl Stage {
    fn of(exec: &AggregateExec) -> Option<Stage> {
        let plan = analyze(exec).ok()?;
        Some(Stage {
            plan,
            schema: exec.schema(),
        })
    }
}

/// The three stages of a staged aggregation (see the module docs).
pub(super) struct Stages {
    /// Input rows (or the input's states, for a final aggregation) into states.
    partial: Stage,
    /// States into states.
    merge: Stage,
    /// States into the aggregation's output.
    finish: Stage,
    /// The group key columns lead each state batch: this many.
    keys: usize,
    /// Whether input rows may spill as they are (see the module docs).
    raw_spills: bool,
    /// The schema of the aggregation's input rows.
    input_schema: SchemaRef,
}

impl std::fmt::Debug for Stages {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Stages").field("keys", &self.keys).finish()
    }
}

impl Stages {
    /// The stages of `agg`, when it can be staged (see the module docs).
    pub(super) fn of(agg: &AggregateExec, plan: &AggPlan) -> Option<Stages> {
        if plan.keys.is_empty() || plan.per_batch || plan.order.is_some() {
            return None;
        }
        let input = Arc::clone(agg.input());
        let input_schema = agg.input_schema();
        let (aggr, filter) = (agg.aggr_expr().to_vec(), agg.filter_expr().to_vec());
        let partial = match agg.mode() {
            AggregateMode::Single | AggregateMode::SinglePartitioned => AggregateExec::try_new(
                AggregateMode::Partial,
                agg.group_expr().clone(),
                aggr.clone(),
                filter.clone(),
                input,
                Arc::clone(&input_schema),
            ),
            AggregateMode::Final | AggregateMode::FinalPartitioned => AggregateExec::try_new(
                AggregateMode::PartialReduce,
                agg.group_expr().clone(),
                aggr.clone(),
                filter.clone(),
                input,
                Arc::clone(&input_schema),
            ),
            AggregateMode::Partial | AggregateMode::PartialReduce => return None,
        }
        .ok()?;
        let states = Arc::new(partial);
        let final_group = states.group_expr().as_final();
        let stage = |mode| {
            AggregateExec::try_new(
                mode,
                final_group.clone(),
                aggr.clone(),
                filter.clone(),
                Arc::clone(&states) as Arc<dyn ExecutionPlan>,
                Arc::clone(&input_schema),
            )
            .ok()
        };
        let (merge, finish) = (
            stage(AggregateMode::PartialReduce)?,
            stage(AggregateMode::Final)?,
        );
        // The staged result must be the aggregation's own, column for column.
        let same_types = finish.schema().fields().len() == agg.schema().fields().len()
            && finish
                .schema()
                .fields()
                .iter()
                .zip(agg.schema().fields())
                .all(|(a, b)| a.data_type() == b.data_type());
        if !same_types || merge.schema().fields() != states.schema().fields() {
            return None;
        }
        // Rows and states hash alike: float keys with -0.0 folded into +0.0 (as the states
        // hold them), by `spill::hash_keys`.
        let raw_spills = plan.spec.sets.is_empty();
        Some(Stages {
            raw_spills,
            input_schema: agg.input().schema(),
            keys: final_group.expr().len(),
            partial: Stage::of(&states)?,
            merge: Stage::of(&merge)?,
            finish: Stage {
                schema: agg.schema(),
                ..Stage::of(&finish)?
            },
        })
    }
}

/// A staged aggregation running: its compiled stages and the states so far.
pub(super) struct Staged {
    stages: Arc<Stages>,
    kernels: [Kernels; 3],
    stream: Arc<DeviceStream>,
    /// State batches not yet merged, and their device bytes.
    pending: Vec<DeviceBatch>,
    pending_bytes: usize,
    /// States spilled to the host, once merging stopped keeping them under the limit.
    spilled: Option<HostPartitions>,
    /// Input rows spilled to the host, their key values appended, once states stopped being
    /// smaller than the rows.
    raw: Option<HostPartitions>,
    /// Whether merging the pending states still shrinks them (to at most half).
    merging_shrinks: bool,
    limit: usize,
    spill: SpillOptions,
}

impl Staged {
    pub(super) fn new(
        stages: Arc<Stages>,
        gpu: &GpuContext,
        stream: Arc<DeviceStream>,
        limit: usize,
        spill: SpillOptions,
    ) -> Result<Self> {
        let kernels = [
            stages.partial.plan.kernels(gpu)?,
            stages.merge.plan.kernels(gpu)?,
            stages.finish.plan.kernels(gpu)?,
        ];
        Ok(Staged {
            stages,
            kernels,
            stream,
            pending: Vec::new(),
            pending_bytes: 0,
            spilled: None,
            raw: None,
            merging_shrinks: true,
            limit,
            spill,
        })
    }

    /// Aggregates one input batch into states, merging (and spilling) as the states grow; or,
    /// once states stopped being smaller than rows, spills the batch's rows.
    pub(super) fn push(&mut self, batch: &DeviceBatch) -> Result<()> {
        let stream = Arc::clone(&self.stream);
        let batch = batch.resolve(&stream)?;
        if self.raw.is_some() {
            return self.spill_rows(&batch);
        }
        let partial = &self.stages.partial;
        let states = aggregate_batch(
            &stream,
            &self.kernels[0],
            &partial.plan,
            &partial.schema,
            &batch,
        )?;
        if self.stages.raw_spills && states.bound() * 2 > batch.bound() {
            // Nearly a group per row: rows are smaller than their states from here on.
            let raw = self.raw_partitions(&batch)?;
            self.raw = Some(raw);
        }
        self.pending_bytes += states.device_bytes();
        self.pending.push(states);
        let needed = self.pending_bytes * MERGE_SHARE;
        if !crate::exec::memory::should_spill(needed, self.limit, stream.device())
            || self.pending.len() < 2
        {
            return Ok(());
        }
        if !self.merging_shrinks || self.raw.is_some() {
            // Merging stopped paying: the states go to the host as they are, batch by batch,
            // and are merged partition by partition at the end.
            return self.spill_pending();
        }
        let before = self.pending_bytes;
        let merged = self.merge()?;
        let after = merged.device_bytes();
        if crate::exec::memory::should_spill(after * MERGE_SHARE, self.limit, stream.device())
            || after * 2 > before
        {
            // The groups are many: merging keeps them no smaller than half, or over the share.
            self.merging_shrinks = false;
            self.spilled_partitions().spill(&stream, &merged)?;
        } else {
            self.pending_bytes = after;
            self.pending.push(merged);
        }
        Ok(())
    }

    /// The pending states moved to the host, batch by batch.
    fn spill_pending(&mut self) -> Result<()> {
        let stream = Arc::clone(&self.stream);
        let pending = std::mem::take(&mut self.pending);
        self.pending_bytes = 0;
        for states in pending {
            self.spilled_partitions().spill(&stream, &states)?;
        }
        Ok(())
    }

    /// The input rows of `batch` with their group key values appended (see [`keyed_rows`]).
    fn keyed_rows(&self, batch: &DeviceBatch) -> Result<DeviceBatch> {
        keyed_rows(
            &self.stream,
            &self.stages.partial.plan,
            &self.kernels[0],
            batch,
        )
    }

    /// Empty partitions for input rows keyed as `batch`'s are (see [`Staged::keyed_rows`]).
    fn raw_partitions(&self, batch: &DeviceBatch) -> Result<HostPartitions> {
        let keyed = self.keyed_rows(batch)?;
        let width = batch.columns().len();
        Ok(HostPartitions::new(
            Arc::clone(keyed.schema()),
            (width..keyed.columns().len()).collect(),
            TOP_SHIFT,
            &self.spill,
        ))
    }

    /// Moves `batch`'s rows to the host, keyed.
    fn spill_rows(&mut self, batch: &DeviceBatch) -> Result<()> {
        let keyed = self.keyed_rows(batch)?;
        let stream = Arc::clone(&self.stream);
        match &mut self.raw {
            Some(raw) => raw.spill(&stream, &keyed),
            None => Err(crate::error::SpateError::Internal {
                message: "an aggregation spilled rows without row partitions".into(),
            }),
        }
    }

    /// The pending states merged into one batch (the pending list left empty).
    fn merge(&mut self) -> Result<DeviceBatch> {
        let merge = &self.stages.merge;
        let all = concat_device_batches(
            &self.stream,
            &self.stages.partial.schema,
            std::mem::take(&mut self.pending),
        )?;
        self.pending_bytes = 0;
        aggregate_batch(
            &self.stream,
            &self.kernels[1],
            &merge.plan,
            &merge.schema,
            &all,
        )
    }

    fn spilled_partitions(&mut self) -> &mut HostPartitions {
        let (schema, keys) = (
            Arc::clone(&self.stages.partial.schema),
            (0..self.stages.keys).collect(),
        );
        let spill = &self.spill;
        self.spilled
            .get_or_insert_with(|| HostPartitions::new(schema, keys, TOP_SHIFT, spill))
    }

    /// Finishes the states: the output batches, one per partition when they were spilled.
    pub(super) fn finish(mut self) -> Result<Finishing> {
        if self.spilled.is_none() && self.raw.is_none() {
            // The final stage merges the states' duplicate groups itself.
            let states = concat_device_batches(
                &self.stream,
                &self.stages.partial.schema,
                std::mem::take(&mut self.pending),
            )?;
            let out = self.finish_states(&states)?;
            return Ok(Finishing {
                staged: self,
                ready: Some(out),
                stack: Vec::new(),
            });
        }
        self.spill_pending()?;
        self.spilled_partitions();
        let states = self
            .spilled
            .take()
            .ok_or_else(|| crate::error::SpateError::Internal {
                message: "a spilled aggregation without state partitions".into(),
            })?;
        let raw = self.raw.take();
        Ok(Finishing {
            staged: self,
            ready: None,
            stack: vec![Level {
                states,
                raw,
                p: 0,
                splits: true,
            }],
        })
    }

    fn finish_states(&self, states: &DeviceBatch) -> Result<DeviceBatch> {
        let finish = &self.stages.finish;
        aggregate_batch(
            &self.stream,
            &self.kernels[2],
            &finish.plan,
            &finish.schema,
            states,
        )
    }
}

/// The input rows of `batch` with the values of `plan`'s group keys appended, as partitions
/// spill them: rows are partitioned by these last columns.
pub(super) fn keyed_rows(
    stream: &DeviceStream,
    plan: &AggPlan,
    kernels: &Kernels,
    batch: &DeviceBatch,
) -> Result<DeviceBatch> {
    let (keys, _) = plan.operands(stream, kernels, batch)?;
    let mut fields: Vec<arrow::datatypes::FieldRef> =
        batch.schema().fields().iter().cloned().collect();
    let mut columns = batch.columns().to_vec();
    for (i, key) in keys.into_iter().enumerate() {
        fields.push(Arc::new(arrow::datatypes::Field::new(
            format!("__spate_group_key_{i}"),
            key.data_type().clone(),
            true,
        )));
        columns.push(key);
    }
    let schema = Arc::new(arrow::datatypes::Schema::new(fields));
    DeviceBatch::try_new(schema, columns, batch.bound())
}

/// One level of spilled partitions: states, and input rows when they spilled too, split by
/// the same hash bits.
struct Level {
    states: HostPartitions,
    raw: Option<HostPartitions>,
    p: usize,
    /// Whether an oversized partition of this level is split again.
    splits: bool,
}

impl Level {
    /// Device bytes partition `p` takes once uploaded, with its tables.
    fn with_table(&self, p: usize) -> usize {
        self.states.with_table(p) + self.raw.as_ref().map_or(0, |r| r.with_table(p))
    }
}

/// The output of a staged aggregation, produced partition by partition.
pub(super) struct Finishing {
    staged: Staged,
    ready: Option<DeviceBatch>,
    /// Spilled partitions still to finish, the innermost level last.
    stack: Vec<Level>,
}

impl Finishing {
    /// The next output batch, or `None` after the last.
    pub(super) fn next_batch(&mut self) -> Result<Option<DeviceBatch>> {
        if let Some(out) = self.ready.take() {
            return Ok(Some(out));
        }
        let stream = Arc::clone(&self.staged.stream);
        loop {
            let Some(level) = self.stack.last_mut() else {
                return Ok(None);
            };
            if level.p == level.states.len() {
                self.stack.pop();
                continue;
            }
            let p = level.p;
            level.p += 1;
            if level.splits
                && level.with_table(p) > self.staged.limit
                && let Some(states) = level.states.split(&stream, p)?
            {
                // Split again by the next bits, both sides alike; a split that left every row
                // in one partition is not tried again below it.
                let raw = match &mut level.raw {
                    Some(raw) => raw.split(&stream, p)?,
                    None => None,
                };
                let splits =
                    !states.is_degenerate() || raw.as_ref().is_some_and(|r| !r.is_degenerate());
                self.stack.push(Level {
                    states,
                    raw,
                    p: 0,
                    splits,
                });
                continue;
            }
            // The partition's rows become states, beside its spilled states.
            let mut parts: Vec<DeviceBatch> = level.states.take(&stream, p)?.into_iter().collect();
            if let Some(raw) = &mut level.raw {
                let width = raw.schema().fields().len() - self.staged.stages.keys;
                let (groups, _charges) = raw.take_host_grouped(p)?;
                for group in groups {
                    let rows = crate::column::upload_batches(&stream, raw.schema(), &group)?;
                    drop(group);
                    let input = DeviceBatch::try_new(
                        Arc::clone(&self.staged.stages.input_schema),
                        rows.columns()[..width].to_vec(),
                        rows.bound(),
                    )?;
                    let partial = &self.staged.stages.partial;
                    parts.push(aggregate_batch(
                        &stream,
                        &self.staged.kernels[0],
                        &partial.plan,
                        &partial.schema,
                        &input,
                    )?);
                }
            }
            if parts.is_empty() {
                continue;
            }
            let states = concat_device_batches(&stream, &self.staged.stages.partial.schema, parts)?;
            let out = self.staged.finish_states(&states)?;
            if out.bound() > 0 {
                return Ok(Some(out));
            }
        }
    }
}
