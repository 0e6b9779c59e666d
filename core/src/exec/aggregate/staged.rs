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
//! Not staged (they keep the one pass over the collected input): aggregations without group
//! keys (they fold batch by batch already), those whose output keeps an order (their groups
//! would come out partition by partition), and those DataFusion cannot split in two phases
//! (COUNT(DISTINCT), whose partial state is a list).

use std::sync::Arc;

use arrow::datatypes::SchemaRef;
use datafusion::execution::TaskContext;
use datafusion::physical_plan::ExecutionPlan;
use datafusion::physical_plan::aggregates::{AggregateExec, AggregateMode};
use spate_kernels::Stream as DeviceStream;

use super::plan::{AggPlan, analyze};
use super::aggregate_batch;
use crate::column::{DeviceBatch, concat_device_batches};
use crate::device::GpuContext;
use crate::error::Result;
use crate::exec::hash_table::Kernels;
use crate::exec::spill::{HostPartitions, TOP_SHIFT};

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
        let (merge, finish) = (stage(AggregateMode::PartialReduce)?, stage(AggregateMode::Final)?);
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
        Some(Stages {
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
    limit: usize,
    /// Spilled states go back up in batches of about this many bytes.
    batch_bytes: usize,
    context: Arc<TaskContext>,
    name: String,
}

impl Staged {
    pub(super) fn new(
        stages: Arc<Stages>,
        gpu: &GpuContext,
        stream: Arc<DeviceStream>,
        (limit, batch_bytes): (usize, usize),
        context: Arc<TaskContext>,
        name: String,
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
            limit,
            batch_bytes,
            context,
            name,
        })
    }

    /// Aggregates one input batch into states, merging (and spilling) as the states grow.
    pub(super) fn push(&mut self, batch: &DeviceBatch) -> Result<()> {
        let partial = &self.stages.partial;
        let states = aggregate_batch(
            &self.stream,
            &self.kernels[0],
            &partial.plan,
            &partial.schema,
            batch,
        )?;
        self.pending_bytes += states.device_bytes();
        self.pending.push(states);
        if self.pending_bytes > self.limit / 2 && self.pending.len() > 1 {
            let merged = self.merge()?;
            if merged.device_bytes() > self.limit / 2 {
                // Merging no longer keeps the groups small: they go to the host.
                let stream = Arc::clone(&self.stream);
                self.spilled_partitions().spill(&stream, &merged)?;
            } else {
                self.pending_bytes = merged.device_bytes();
                self.pending.push(merged);
            }
        }
        Ok(())
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
        aggregate_batch(&self.stream, &self.kernels[1], &merge.plan, &merge.schema, &all)
    }

    fn spilled_partitions(&mut self) -> &mut HostPartitions {
        let (schema, keys) = (
            Arc::clone(&self.stages.partial.schema),
            (0..self.stages.keys).collect(),
        );
        let (context, name, batch_bytes) = (&self.context, &self.name, self.batch_bytes);
        self.spilled
            .get_or_insert_with(|| {
                HostPartitions::new(schema, keys, TOP_SHIFT, context, name.clone(), batch_bytes)
            })
    }

    /// Finishes the states: the output batches, one per partition when they were spilled.
    pub(super) fn finish(mut self) -> Result<Finishing> {
        if self.spilled.is_none() {
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
        let pending = std::mem::take(&mut self.pending);
        self.pending_bytes = 0;
        let mut parts = self.spilled.take().expect("checked above");
        for states in pending {
            parts.spill(&self.stream, &states)?;
        }
        Ok(Finishing {
            staged: self,
            ready: None,
            stack: vec![(parts, 0)],
        })
    }

    fn finish_states(&self, states: &DeviceBatch) -> Result<DeviceBatch> {
        let finish = &self.stages.finish;
        aggregate_batch(&self.stream, &self.kernels[2], &finish.plan, &finish.schema, states)
    }
}

/// The output of a staged aggregation, produced partition by partition.
pub(super) struct Finishing {
    staged: Staged,
    ready: Option<DeviceBatch>,
    /// Spilled partitions still to finish, and the next partition of each.
    stack: Vec<(HostPartitions, usize)>,
}

impl Finishing {
    /// The next output batch, or `None` after the last.
    pub(super) fn next_batch(&mut self) -> Result<Option<DeviceBatch>> {
        if let Some(out) = self.ready.take() {
            return Ok(Some(out));
        }
        loop {
            let Some((parts, next)) = self.stack.last_mut() else {
                return Ok(None);
            };
            if *next == parts.len() {
                self.stack.pop();
                continue;
            }
            let p = *next;
            *next += 1;
            if parts.bytes(p) == 0 {
                continue;
            }
            let stream = Arc::clone(&self.staged.stream);
            if parts.with_table(p) > self.staged.limit
                && let Some(child) = parts.split(&stream, p)?
            {
                // Split again by the next bits.
                self.stack.push((child, 0));
                continue;
            }
            let Some(states) = parts.take(&stream, p)? else {
                continue;
            };
            let out = self.staged.finish_states(&states)?;
            if out.bound() > 0 {
                return Ok(Some(out));
            }
        }
    }
}
