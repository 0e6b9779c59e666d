//! `VectorTopKExec`: the k items nearest to each query vector, on the CPU.
//!
//! Two inputs, each one embedding column: the items and the queries. The queries are read
//! whole; the items stream past them, and each query keeps its `k` nearest in a bounded heap.
//! Each input's partitions are read one after the other in partition order, so an item's (a
//! query's) position is its row in that order: file order for a scan of one file. The output
//! is one partition, query after query, each query's nearest first.
//!
//! The order is [`NearestKey`]'s: distance (the inner product reversed: larger is nearer) in
//! IEEE total order, then position, so ties keep the earlier item. An item whose distance is
//! NULL (a NULL row, a NULL element, a cosine against a zero vector) or NaN is never near, so a
//! query may have fewer than `k` rows. This is the reference the GPU's `GpuVectorTopKExec`
//! (`kernels/cuda/vector/topk.cu`) equals, row for row and bit for bit.

use std::collections::BinaryHeap;
use std::fmt;
use std::sync::Arc;

use arrow::array::{Array, ArrayRef, AsArray, Float64Array, RecordBatch, UInt64Array};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::error::{DataFusionError, Result as DFResult};
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::physical_expr::{EquivalenceProperties, PhysicalExpr};
use datafusion::physical_plan::execution_plan::{Boundedness, EmissionType};
use datafusion::physical_plan::metrics::{BaselineMetrics, ExecutionPlanMetricsSet, MetricsSet};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, ExecutionPlanProperties, Partitioning,
    PlanProperties, ReplaceChildrenOptions,
};
use futures::{StreamExt, TryStreamExt};

use super::distance::Metric;
use super::elem::Elem;
use super::lanes::{LANES, QueryLanes};

/// The output columns: the query's position, the item's position, the rank from 1, and the
/// distance (the inner product for that metric).
pub fn nearest_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("query_row", DataType::UInt64, false),
        Field::new("item_row", DataType::UInt64, false),
        Field::new("rank", DataType::UInt64, false),
        Field::new("distance", DataType::Float64, false),
    ]))
}

/// An entry's place in the order: its distance's key, then its position (smaller is nearer).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct NearestKey {
    key: u64,
    item: u64,
}

impl NearestKey {
    /// The key of distance `distance` of item `item` under `metric`; `None` for a NaN (never
    /// near).
    pub fn new(metric: Metric, distance: f64, item: u64) -> Option<NearestKey> {
        if distance.is_nan() {
            return None;
        }
        let bits = distance.to_bits();
        let total = if bits >> 63 == 1 {
            !bits
        } else {
            bits | 1 << 63
        };
        let key = if metric == Metric::Inner {
            !total
        } else {
            total
        };
        Some(NearestKey { key, item })
    }
}

/// The k items nearest to each query vector, on the CPU (see the module docs).
#[derive(Debug)]
pub struct VectorTopKExec {
    items: Arc<dyn ExecutionPlan>,
    queries: Arc<dyn ExecutionPlan>,
    k: usize,
    metric: Metric,
    properties: Arc<PlanProperties>,
    metrics: ExecutionPlanMetricsSet,
}

impl VectorTopKExec {
    /// The top-k of `items` against `queries`: each input's first column is an embedding of
    /// the same dimension (checked).
    pub fn try_new(
        items: Arc<dyn ExecutionPlan>,
        queries: Arc<dyn ExecutionPlan>,
        k: usize,
        metric: Metric,
    ) -> DFResult<Self> {
        let dim = |plan: &Arc<dyn ExecutionPlan>, what: &str| -> DFResult<usize> {
            let schema = plan.schema();
            let field = schema.fields().first().ok_or_else(|| {
                DataFusionError::Plan(format!("vector_topk: the {what} have no column"))
            })?;
            Elem::of(field.data_type()).map(|(_, d)| d).ok_or_else(|| {
                DataFusionError::Plan(format!(
                    "vector_topk: the {what}' column `{}` is {}, not an embedding \
                     (FixedSizeList of Float16, Float32 or bf16)",
                    field.name(),
                    field.data_type()
                ))
            })
        };
        let (di, dq) = (dim(&items, "items")?, dim(&queries, "queries")?);
        if di != dq {
            return Err(DataFusionError::Plan(format!(
                "vector_topk: the items have {di} elements and the queries {dq}"
            )));
        }
        let properties = PlanProperties::new(
            EquivalenceProperties::new(nearest_schema()),
            Partitioning::UnknownPartitioning(1),
            EmissionType::Final,
            Boundedness::Bounded,
        );
        Ok(VectorTopKExec {
            items,
            queries,
            k,
            metric,
            properties: Arc::new(properties),
            metrics: ExecutionPlanMetricsSet::new(),
        })
    }

    /// The items' plan.
    pub fn items(&self) -> &Arc<dyn ExecutionPlan> {
        &self.items
    }

    /// The queries' plan.
    pub fn queries(&self) -> &Arc<dyn ExecutionPlan> {
        &self.queries
    }

    /// Rows kept per query.
    pub fn k(&self) -> usize {
        self.k
    }

    /// The metric.
    pub fn metric(&self) -> Metric {
        self.metric
    }
}

/// Every partition of `plan`, one after the other in partition order.
pub(crate) fn in_partition_order(
    plan: &Arc<dyn ExecutionPlan>,
    context: &Arc<TaskContext>,
) -> SendableRecordBatchStream {
    let (plan, context) = (Arc::clone(plan), Arc::clone(context));
    let schema = plan.schema();
    let partitions = plan.output_partitioning().partition_count();
    let batches = futures::stream::iter(0..partitions)
        .map(move |p| plan.execute(p, Arc::clone(&context)))
        .try_flatten();
    Box::pin(RecordBatchStreamAdapter::new(schema, batches))
}

/// Each row of an embedding column as f32s; `None` for a NULL row or one with a NULL element.
fn vectors(column: &ArrayRef) -> Vec<Option<Vec<f32>>> {
    let Some((elem, d)) = Elem::of(column.data_type()) else {
        return Vec::new();
    };
    let list = column.as_fixed_size_list();
    let values = list.values();
    (0..list.len())
        .map(|row| {
            let range = row * d..(row + 1) * d;
            if list.is_null(row)
                || (values.null_count() > 0 && range.clone().any(|j| values.is_null(j)))
            {
                return None;
            }
            let mut out = Vec::with_capacity(d);
            elem.extend_f32(values.as_ref(), range, &mut out);
            Some(out)
        })
        .collect()
}

/// The `k` nearest of each query, kept as a max-heap (the farthest kept on top).
struct Running {
    metric: Metric,
    k: usize,
    /// The queries with a vector, [`LANES`] at a time.
    lanes: Vec<QueryLanes>,
    heaps: Vec<BinaryHeap<(NearestKey, u64)>>,
    items: u64,
}

impl Running {
    fn new(metric: Metric, k: usize, queries: &[Option<Vec<f32>>]) -> Running {
        let with_vectors: Vec<(usize, &[f32])> = queries
            .iter()
            .enumerate()
            .filter_map(|(q, v)| Some((q, v.as_deref()?)))
            .collect();
        Running {
            metric,
            k,
            lanes: with_vectors
                .chunks(LANES)
                .map(|block| QueryLanes::new(metric, block))
                .collect(),
            heaps: queries.iter().map(|_| BinaryHeap::new()).collect(),
            items: 0,
        }
    }

    fn add(&mut self, batch: &RecordBatch) {
        let mut distances = [None; LANES];
        for item in vectors(batch.column(0)) {
            let position = self.items;
            self.items += 1;
            let Some(item) = item else { continue };
            for lanes in &self.lanes {
                lanes.score(&item, &mut distances);
                for (&q, distance) in lanes.queries().iter().zip(distances) {
                    let Some(distance) = distance else { continue };
                    let Some(key) = NearestKey::new(self.metric, distance, position) else {
                        continue;
                    };
                    let heap = &mut self.heaps[q];
                    if heap.len() < self.k {
                        heap.push((key, distance.to_bits()));
                    } else if heap.peek().is_some_and(|(top, _)| key < *top) {
                        heap.pop();
                        heap.push((key, distance.to_bits()));
                    }
                }
            }
        }
    }

    fn finish(self, schema: SchemaRef) -> DFResult<RecordBatch> {
        let (mut q, mut i, mut r, mut d) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for (query, heap) in self.heaps.into_iter().enumerate() {
            for (rank, (key, bits)) in heap.into_sorted_vec().into_iter().enumerate() {
                q.push(query as u64);
                i.push(key.item);
                r.push(rank as u64 + 1);
                d.push(f64::from_bits(bits));
            }
        }
        let columns: Vec<ArrayRef> = vec![
            Arc::new(UInt64Array::from(q)),
            Arc::new(UInt64Array::from(i)),
            Arc::new(UInt64Array::from(r)),
            Arc::new(Float64Array::from(d)),
        ];
        Ok(RecordBatch::try_new(schema, columns)?)
    }
}

impl DisplayAs for VectorTopKExec {
    fn fmt_as(&self, t: DisplayFormatType, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match t {
            DisplayFormatType::TreeRender => {
                write!(f, "k={}\nmetric={}", self.k, self.metric.function())
            }
            _ => write!(
                f,
                "VectorTopKExec: k={}, metric={}",
                self.k,
                self.metric.function()
            ),
        }
    }
}

impl ExecutionPlan for VectorTopKExec {
    fn name(&self) -> &str {
        "VectorTopKExec"
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        &self.properties
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![&self.items, &self.queries]
    }

    fn apply_expressions(
        &self,
        _f: &mut dyn FnMut(&Arc<dyn PhysicalExpr>) -> DFResult<TreeNodeRecursion>,
    ) -> DFResult<TreeNodeRecursion> {
        Ok(TreeNodeRecursion::Continue)
    }

    /// Positions are rows in partition order: splitting the inputs further would not change
    /// them, but nothing would be gained either.
    fn benefits_from_input_partitioning(&self) -> Vec<bool> {
        vec![false, false]
    }

    fn replace_children(
        self: Arc<Self>,
        children: Vec<Arc<dyn ExecutionPlan>>,
        _options: ReplaceChildrenOptions,
    ) -> DFResult<Arc<dyn ExecutionPlan>> {
        let [items, queries]: [Arc<dyn ExecutionPlan>; 2] = children
            .try_into()
            .map_err(|_| DataFusionError::Internal("VectorTopKExec takes two children".into()))?;
        Ok(Arc::new(VectorTopKExec::try_new(
            items,
            queries,
            self.k,
            self.metric,
        )?))
    }

    #[allow(deprecated)]
    fn with_new_children(
        self: Arc<Self>,
        children: Vec<Arc<dyn ExecutionPlan>>,
    ) -> DFResult<Arc<dyn ExecutionPlan>> {
        self.replace_children(
            children,
            ReplaceChildrenOptions::new(
                datafusion::physical_plan::ChildrenPropertiesMode::Recompute,
            ),
        )
    }

    fn execute(
        &self,
        partition: usize,
        context: Arc<TaskContext>,
    ) -> DFResult<SendableRecordBatchStream> {
        if partition != 0 {
            return Err(DataFusionError::Internal(format!(
                "VectorTopKExec has one partition, not {partition}"
            )));
        }
        let baseline = BaselineMetrics::new(&self.metrics, partition);
        let items = in_partition_order(&self.items, &context);
        let queries = in_partition_order(&self.queries, &context);
        let (k, metric, schema) = (self.k, self.metric, self.schema());
        let out_schema = Arc::clone(&schema);
        let result = futures::stream::once(async move {
            let timer = baseline.elapsed_compute().clone();
            let queries: Vec<RecordBatch> = queries.try_collect().await?;
            let queries: Vec<Option<Vec<f32>>> =
                queries.iter().flat_map(|b| vectors(b.column(0))).collect();
            let mut running = Running::new(metric, k, &queries);
            let mut items = items;
            while let Some(batch) = items.next().await {
                let batch = batch?;
                let _time = timer.timer();
                running.add(&batch);
            }
            let out = running.finish(out_schema)?;
            baseline.record_output(out.num_rows());
            Ok(out)
        });
        Ok(Box::pin(RecordBatchStreamAdapter::new(schema, result)))
    }

    fn metrics(&self) -> Option<MetricsSet> {
        Some(self.metrics.clone_inner())
    }
}
