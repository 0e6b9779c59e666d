//! One GPU partition per device, with several devices.
//!
//! With one device, `plan/regions.rs` gives every GPU region one partition. With `N` devices a
//! GPU region runs `N` partitions instead, partition `p` on device `p % N` (the stream
//! `exec::execute_for_host` and the exchanges open), and the exchanges DataFusion planned for
//! CPU parallelism become exchanges between devices ([`GpuExchangeExec`]):
//! - A CPU input under a GPU operator is spread: its partitions uploaded to the devices in turn
//!   (round-robin repartitioned on the host first when their count is not a multiple of `N`).
//! - A GPU operator gets each input as the CPU operator it replaces requires it:
//!   - hash-partitioned (a final aggregation, a partitioned join, a window): a shuffle by the
//!     keys, unless the input is already partitioned so (a join over the output of another join
//!     on the same keys, say: a co-partitioned join needs no exchange);
//!   - in one partition (a global sort, a final limit, an ungrouped final aggregation): a
//!     gather onto one device;
//!   - anything else: as it comes.
//! - A `CollectLeft` join whose output depends on each probe row alone (inner, right, right
//!   semi, anti and mark) gets its build side broadcast to every device (each device's share
//!   to every device) and probes where the probe rows are, when that moves fewer bytes than
//!   shuffling both sides by the keys (`broadcast_pays`). Otherwise, and for the join types
//!   that emit unmatched build rows once, it becomes a partitioned join over both sides
//!   shuffled by the keys. A null-aware anti join (`NOT IN`) runs on one device, both sides
//!   gathered there, and so does a cross join.
//! - A pair of aggregations the GPU cannot run in two stages (COUNT(DISTINCT), whose partial
//!   state is a list) runs as one stage over its input shuffled by the group keys, each
//!   device aggregating whole groups (or gathered, without group keys).
//! - An exchange the GPU operators would leave on the host between them (a hash or
//!   round-robin repartition, a merge of partitions) leaves the plan; a merge of GPU
//!   partitions becomes a gather, and a sorted merge of them a gather and a sort on the
//!   device (at the top of the plan too, so the result leaves from one device).
//!
//! A plan this pass cannot place (a shuffle by keys that are not columns, a shape it does not
//! know) keeps one device: the caller falls back to `plan/regions.rs`. The rewrite is checked
//! with DataFusion's `SanityCheckPlan` as that one is.

use std::sync::Arc;

use datafusion::common::JoinType;
use datafusion::common::config::ConfigOptions;
use datafusion::error::{DataFusionError, Result as DFResult};
use datafusion::physical_expr::OrderingRequirements;
use datafusion::physical_optimizer::PhysicalOptimizerRule;
use datafusion::physical_optimizer::sanity_checker::SanityCheckPlan;
use datafusion::physical_plan::aggregates::{AggregateExec, AggregateMode};
use datafusion::physical_plan::joins::{HashJoinExec, PartitionMode};
use datafusion::physical_plan::repartition::RepartitionExec;
use datafusion::physical_plan::sorts::sort::SortExec;
use datafusion::physical_plan::sorts::sort_preserving_merge::SortPreservingMergeExec;
use datafusion::physical_plan::statistics::{StatisticsArgs, StatisticsContext};
use datafusion::physical_plan::{
    Distribution, ExecutionPlan, ExecutionPlanProperties, Partitioning,
    replace_children_if_necessary,
};

use super::offload::PLUMBING;
use super::regions::pairs_partitions;
use crate::exec::{
    GpuAggregateExec, GpuCachedScanExec, GpuCoalescePartitionsExec, GpuCrossJoinExec,
    GpuExchangeExec, GpuExec, GpuHashJoinExec, GpuSortExec, as_gpu_exec,
};

/// Why a plan keeps one device (the rewrite gives up).
fn cannot(why: &str) -> DataFusionError {
    DataFusionError::NotImplemented(format!("placing a plan on several devices: {why}"))
}

/// `plan` with every GPU region spread over `devices` devices (see the module docs), or `None`
/// when this pass cannot place it (the caller keeps one device).
pub fn across_devices(
    plan: Arc<dyn ExecutionPlan>,
    config: &ConfigOptions,
    devices: usize,
) -> Option<Arc<dyn ExecutionPlan>> {
    let placer = Placer { devices };
    let placed = match placer.place(plan, false) {
        Ok(p) => p,
        Err(e) => {
            log::debug!("{e}: the plan runs on one device");
            return None;
        }
    };
    match SanityCheckPlan::new().optimize(Arc::clone(&placed), config) {
        Ok(_) => Some(placed),
        Err(e) => {
            log::debug!("a plan over {devices} devices failed its check ({e}): one device");
            None
        }
    }
}

struct Placer {
    devices: usize,
}

/// Exchanges that only serve CPU parallelism, dropped under a GPU consumer (its requirement
/// is placed again below it).
fn is_cpu_exchange(node: &dyn ExecutionPlan) -> bool {
    match node.name() {
        "RepartitionExec" | "CoalesceBatchesExec" => node.children().len() == 1,
        "CoalescePartitionsExec" => node.fetch().is_none(),
        _ => node.downcast_ref::<GpuCoalescePartitionsExec>().is_some(),
    }
}

/// Join types whose output depends on each probe row alone: their build side may be copied to
/// every device that probes.
fn broadcast_safe(join_type: JoinType) -> bool {
    matches!(
        join_type,
        JoinType::Inner
            | JoinType::Right
            | JoinType::RightSemi
            | JoinType::RightAnti
            | JoinType::RightMark
    )
}

impl Placer {
    /// `node` placed; `gpu_consumer`: the nearest computing node above it (through plumbing)
    /// is a GPU operator.
    fn place(
        &self,
        node: Arc<dyn ExecutionPlan>,
        gpu_consumer: bool,
    ) -> DFResult<Arc<dyn ExecutionPlan>> {
        if gpu_consumer && is_cpu_exchange(node.as_ref()) {
            return self.place(Arc::clone(node.children()[0]), true);
        }
        // Its rows' positions are its inputs' partitions read in order, on one device.
        if super::in_order::reads_in_order(node.as_ref()) {
            return Err(cannot(
                "an operator that reads its inputs' partitions in order stays on one device",
            ));
        }
        // A sorted merge of GPU partitions: on the device, also at the top of the plan (the
        // result then crosses the bus once, from one device).
        if let Some(merge) = node.downcast_ref::<SortPreservingMergeExec>()
            && (gpu_consumer || as_gpu_exec(merge.input().as_ref()).is_some())
        {
            return self.sorted_merge(merge);
        }
        // A merge of GPU partitions onto one stream: a gather, so that each partition runs on
        // its own device.
        if let Some(merge) = node.downcast_ref::<GpuCoalescePartitionsExec>() {
            let input = self.place(Arc::clone(merge.children()[0]), true)?;
            return Ok(self.to_one(self.on_devices(input)?));
        }
        if let Some(scan) = node.downcast_ref::<GpuCachedScanExec>() {
            return Ok(Arc::new(scan.with_shard_partitioning()?));
        }
        if let Some(fused) = self.single_stage(&node)? {
            return Ok(fused);
        }
        let on_gpu = as_gpu_exec(node.as_ref()).is_some();
        let below = on_gpu || (gpu_consumer && PLUMBING.contains(&node.name()));
        let mut children = node
            .children()
            .into_iter()
            .map(|c| self.place(Arc::clone(c), below))
            .collect::<DFResult<Vec<_>>>()?;
        if !on_gpu {
            // A CPU consumer takes a GPU input's partitions as they are (each downloaded on its
            // device), except one that pairs its inputs' partitions: it gets them as planned.
            if children.len() > 1 && pairs_partitions(node.as_ref()) {
                for (child, before) in children.iter_mut().zip(node.children()) {
                    let planned = before.output_partitioning();
                    // A GPU child's hash partitioning is Spate's hash: a CPU operator pairing
                    // it with DataFusion's would pair different keys. It is hashed again.
                    if as_gpu_exec(child.as_ref()).is_some()
                        || child.output_partitioning().partition_count()
                            != planned.partition_count()
                    {
                        *child = Arc::new(RepartitionExec::try_new(
                            Arc::clone(child),
                            match planned {
                                Partitioning::Hash(..) => planned.clone(),
                                _ => Partitioning::RoundRobinBatch(planned.partition_count()),
                            },
                        )?);
                    }
                }
            }
            return replace_children_if_necessary(node, children);
        }
        if let Some(join) = node.downcast_ref::<GpuHashJoinExec>()
            && let Some(cpu) = join
                .replaces()
                .and_then(|c| c.downcast_ref::<HashJoinExec>())
            && cpu.partition_mode() == &PartitionMode::CollectLeft
        {
            let [left, right]: [Arc<dyn ExecutionPlan>; 2] = children
                .try_into()
                .map_err(|_| cannot("a join without two inputs"))?;
            let left = self.on_devices(left)?;
            let right = self.on_devices(right)?;
            if cpu.null_aware {
                // NOT IN: one NULL key anywhere decides for every row, on one device.
                return replace_children_if_necessary(
                    node,
                    vec![self.to_one(left), self.to_one(right)],
                );
            }
            if broadcast_safe(*cpu.join_type()) && self.broadcast_pays(cpu)? {
                // Every device's share of the build side, to every device.
                let left = Arc::new(GpuExchangeExec::broadcast(left, self.devices)) as _;
                return replace_children_if_necessary(node, vec![left, right]);
            }
            // Both sides shuffled by the keys: each device joins its share.
            let partitioned = cpu
                .builder()
                .with_partition_mode(PartitionMode::Partitioned)
                .with_new_children(vec![Arc::clone(&left), Arc::clone(&right)])?
                .recompute_properties()
                .build()?;
            let need = partitioned
                .input_distribution_requirements()
                .into_per_child();
            let gpu = GpuHashJoinExec::try_new(Arc::new(partitioned)).map_err(|e| cannot(&e.0))?;
            let children = vec![
                self.as_required(left, &need[0])?,
                self.as_required(right, &need[1])?,
            ];
            return replace_children_if_necessary(Arc::new(gpu), children);
        }
        if node.downcast_ref::<GpuCrossJoinExec>().is_some() {
            let children = children
                .into_iter()
                .map(|c| Ok(self.to_one(self.on_devices(c)?)))
                .collect::<DFResult<Vec<_>>>()?;
            return replace_children_if_necessary(node, children);
        }
        let cpu = as_gpu_exec(node.as_ref()).and_then(|g| g.replaces());
        let required = match cpu {
            Some(cpu) => cpu.input_distribution_requirements().into_per_child(),
            None => vec![Distribution::UnspecifiedDistribution; children.len()],
        };
        let children = children
            .into_iter()
            .zip(required)
            .map(|(child, need)| self.as_required(self.on_devices(child)?, &need))
            .collect::<DFResult<Vec<_>>>()?;
        // GPU operators do not state the input order they need (the sanity check cannot see
        // it): the CPU operator they replace does. An exchange placed between an order and
        // the operator that needs it loses it, and the plan keeps one device instead.
        if let Some(cpu) = cpu {
            for (child, order) in children.iter().zip(cpu.required_input_ordering()) {
                if let Some(OrderingRequirements::Hard(alternatives)) = order
                    && !alternatives.into_iter().any(|required| {
                        child
                            .equivalence_properties()
                            .ordering_satisfy_requirement(required)
                            .unwrap_or(false)
                    })
                {
                    return Err(cannot("an exchange would lose an order an operator needs"));
                }
            }
        }
        replace_children_if_necessary(node, children)
    }

    /// Whether broadcasting `join`'s build side moves fewer bytes than shuffling both sides:
    /// a broadcast sends the build side's `B` bytes to the `N - 1` other devices, a shuffle
    /// `(N - 1) / N` of both sides' `B + P`, so it pays while `B <= P / (N - 1)`. Without
    /// estimates of both (the planner's statistics), the build side is taken to be small, as
    /// DataFusion took it in choosing to collect it.
    fn broadcast_pays(&self, join: &HashJoinExec) -> DFResult<bool> {
        let statistics = StatisticsContext::new();
        let bytes = |side: &Arc<dyn ExecutionPlan>| -> DFResult<Option<usize>> {
            Ok(statistics
                .compute(side.as_ref(), &StatisticsArgs::new())?
                .total_byte_size
                .get_value()
                .copied())
        };
        Ok(match (bytes(join.left())?, bytes(join.right())?) {
            (Some(build), Some(probe)) => build.saturating_mul(self.devices - 1) <= probe,
            _ => true,
        })
    }

    /// `input` on the devices: a CPU input spread to them, a GPU one as it is.
    fn on_devices(&self, input: Arc<dyn ExecutionPlan>) -> DFResult<Arc<dyn ExecutionPlan>> {
        if as_gpu_exec(input.as_ref()).is_some() {
            return Ok(input);
        }
        let count = input.output_partitioning().partition_count();
        let input = if count.is_multiple_of(self.devices) {
            input
        } else {
            Arc::new(RepartitionExec::try_new(
                input,
                Partitioning::RoundRobinBatch(self.devices),
            )?) as Arc<dyn ExecutionPlan>
        };
        Ok(Arc::new(GpuExchangeExec::spread(input, self.devices)))
    }

    /// `input` (on the devices) in one partition: gathered when it has several.
    fn to_one(&self, input: Arc<dyn ExecutionPlan>) -> Arc<dyn ExecutionPlan> {
        if input.output_partitioning().partition_count() <= 1 {
            return input;
        }
        Arc::new(GpuExchangeExec::gather(input, self.devices))
    }

    /// `input` (on the devices) distributed as `need` says.
    fn as_required(
        &self,
        input: Arc<dyn ExecutionPlan>,
        need: &Distribution,
    ) -> DFResult<Arc<dyn ExecutionPlan>> {
        let satisfied = match need {
            Distribution::UnspecifiedDistribution => true,
            Distribution::SinglePartition => input.output_partitioning().partition_count() == 1,
            _ => {
                let partitioning = input.output_partitioning();
                partitioning.partition_count() == self.devices
                    && matches!(partitioning, Partitioning::Hash(..))
                    && partitioning
                        // Exactly the keys: a side hashed on some of a join's keys would
                        // not meet the other side's rows.
                        .satisfaction(need, input.equivalence_properties(), false)
                        .is_satisfied()
            }
        };
        if satisfied {
            return Ok(input);
        }
        // An order a GPU sort establishes per partition stays above the exchange.
        if let Some(sort) = input.downcast_ref::<GpuSortExec>()
            && let Some(cpu) = sort.replaces().and_then(|c| c.downcast_ref::<SortExec>())
        {
            let below = self.as_required(Arc::clone(cpu.input()), need)?;
            let sort = SortExec::new(cpu.expr().clone(), below)
                .with_preserve_partitioning(true)
                .with_fetch(cpu.fetch());
            return GpuSortExec::try_new(Arc::new(sort))
                .map(|s| Arc::new(s) as Arc<dyn ExecutionPlan>)
                .map_err(|e| cannot(&e.0));
        }
        match need {
            Distribution::SinglePartition => Ok(self.to_one(input)),
            #[expect(
                deprecated,
                reason = "HashPartitioned is what DataFusion 55 still plans"
            )]
            Distribution::HashPartitioned(keys) | Distribution::KeyPartitioned(keys) => {
                GpuExchangeExec::shuffle(input, keys, self.devices)
                    .map(|s| Arc::new(s) as Arc<dyn ExecutionPlan>)
                    .ok_or_else(|| cannot("a shuffle by keys that are not columns"))
            }
            Distribution::UnspecifiedDistribution => Ok(input),
        }
    }

    /// A sorted merge under a GPU consumer: its GPU input gathered and sorted on one device
    /// (a per-partition top-k below stays, so each device sends its best rows only).
    fn sorted_merge(&self, merge: &SortPreservingMergeExec) -> DFResult<Arc<dyn ExecutionPlan>> {
        let input = self.place(Arc::clone(merge.input()), true)?;
        if as_gpu_exec(input.as_ref()).is_none() {
            return Err(cannot(
                "a sorted merge under a GPU operator over a CPU input",
            ));
        }
        let gathered = self.to_one(input);
        let sort = SortExec::new(merge.expr().clone(), gathered).with_fetch(merge.fetch());
        GpuSortExec::try_new(Arc::new(sort))
            .map(|s| Arc::new(s) as Arc<dyn ExecutionPlan>)
            .map_err(|e| cannot(&e.0))
    }

    /// A final aggregation over a partial one that the GPU cannot run in two stages (CPU
    /// stages over a GPU input: COUNT(DISTINCT)), as one GPU stage over the partial's input
    /// shuffled by the group keys, or gathered without them; `None` where that does not apply.
    fn single_stage(
        &self,
        node: &Arc<dyn ExecutionPlan>,
    ) -> DFResult<Option<Arc<dyn ExecutionPlan>>> {
        let Some(last) = node.downcast_ref::<AggregateExec>() else {
            return Ok(None);
        };
        if !matches!(
            last.mode(),
            AggregateMode::Final | AggregateMode::FinalPartitioned
        ) {
            return Ok(None);
        }
        let mut below = last.input();
        while is_cpu_exchange(below.as_ref()) {
            below = below.children()[0];
        }
        let Some(first) = below.downcast_ref::<AggregateExec>() else {
            return Ok(None);
        };
        if first.mode() != &AggregateMode::Partial || first.group_expr().has_grouping_set() {
            return Ok(None);
        }
        let mut input = Arc::clone(first.input());
        while is_cpu_exchange(input.as_ref()) {
            input = Arc::clone(input.children()[0]);
        }
        if as_gpu_exec(input.as_ref()).is_none() {
            return Ok(None);
        }
        let grouped = !first.group_expr().expr().is_empty();
        let mode = if grouped {
            AggregateMode::SinglePartitioned
        } else {
            AggregateMode::Single
        };
        let input = self.place(input, true)?;
        let Ok(single) = AggregateExec::try_new(
            mode,
            first.group_expr().clone(),
            first.aggr_expr().to_vec(),
            first.filter_expr().to_vec(),
            Arc::clone(&input),
            input.schema(),
        ) else {
            return Ok(None);
        };
        if single.schema() != last.schema() {
            return Ok(None);
        }
        let single = single.with_limit_options(last.limit_options());
        let need = single.input_distribution_requirements().into_per_child();
        let Ok(gpu) = GpuAggregateExec::try_new(Arc::new(single)) else {
            return Ok(None);
        };
        let gpu: Arc<dyn ExecutionPlan> = Arc::new(gpu);
        let input = self.as_required(input, &need[0])?;
        replace_children_if_necessary(gpu, vec![input]).map(Some)
    }
}
