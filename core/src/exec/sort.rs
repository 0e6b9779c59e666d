//! `GpuSortExec`: DataFusion's `SortExec` (and its top-k form, `fetch`, which sorts only its
//! candidates: `top_k.rs`) on the GPU.
//!
//! A partition's device batches are concatenated on the device, then sorted with the stable
//! LSD radix sort from `spate-kernels`: one pass per key column from the least significant to
//! the most, each carrying the row permutation of the passes before it, and a 1-digit pass on
//! null ranks after a nullable column's values (NULLS FIRST/LAST). Keys map to unsigned radix
//! keys in DataFusion's order: integers by value, floats by IEEE total order (-0.0 before
//! +0.0, NaN last when ascending), descending by inverting the key. Every column is then
//! gathered by the permutation. Decimal128 keys take two 64-bit passes (low word, then the
//! signed high word). String keys sort byte-wise (UTF-8 code point order, as Arrow's): a pass
//! on the length, then one 64-bit pass per 8-byte chunk from the last chunk to the first. Rows
//! equal on every key may come out in any order, as with DataFusion. Keys that are
//! expressions (`ORDER BY a - b`) are computed by one value kernel into columns appended to
//! each input batch; they are sorted on and left out of the output.

use std::fmt;
use std::sync::Arc;

use arrow::datatypes::{DataType, Schema, SchemaRef};
use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::error::Result as DFResult;
use datafusion::execution::TaskContext;
use datafusion::physical_expr::expressions::Column;
use datafusion::physical_expr::{PhysicalExpr, PhysicalSortExpr};
use datafusion::physical_plan::metrics::{BaselineMetrics, ExecutionPlanMetricsSet, MetricBuilder};
use datafusion::physical_plan::sorts::sort::SortExec;
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, InputDistributionRequirements, PlanProperties,
    ReplaceChildrenOptions,
};
use futures::TryStreamExt;
use spate_kernels::sort::{self as ks, SortKeySource};
use spate_kernels::{DeviceBuffer, DeviceSlice, Stream as DeviceStream, gather};

use super::appended::Appended;
use super::batching::KeepsCounts;
use super::external_sort::Runs;
use super::held::HeldBatches;
use super::top_k;
use super::{
    DeviceBatchStream, GpuExec, TransferMetrics, check_input_types, collected_input, gpu_context,
    rebuild_gpu, to_df,
};
use crate::column::{DeviceBatch, DeviceValues, Gather, concat_device_batches, gather_columns};
use crate::error::{Result, SpateError};
use crate::expr::Unsupported;

/// Device bytes a sort takes per row beside two copies of its rows (its input and the sorted
/// output): radix keys and the permutation, double-buffered.
const SORT_BYTES_PER_ROW: usize = 24;

/// The radix key family of a sort column.
#[derive(Debug, Clone, Copy)]
pub(crate) enum KeyKind {
    I8,
    I16,
    U8,
    U16,
    /// Decimal128: two 64-bit passes, low word then high word.
    Dec,
    I32,
    U32,
    F32,
    I64,
    U64,
    F64,
    /// Strings (any offset width): a length pass, then one 64-bit pass per 8-byte chunk.
    Str,
}

#[derive(Debug, Clone, Copy)]
pub(crate) struct SortKey {
    pub(super) column: usize,
    pub(super) kind: KeyKind,
    pub(super) descending: bool,
    pub(super) nulls_first: bool,
}

/// A sort (or top-k) running on the GPU.
#[derive(Debug)]
pub struct GpuSortExec {
    cpu: Arc<SortExec>,
    keys: Vec<SortKey>,
    /// Sort keys that are expressions (`ORDER BY a - b`): computed into columns appended to
    /// each input batch, which `keys` then refer to, and left out of the output.
    computed: Option<Arc<Appended>>,
    metrics: ExecutionPlanMetricsSet,
}

impl GpuSortExec {
    /// The GPU version of `sort`, or why it must stay on the CPU.
    pub fn try_new(sort: Arc<SortExec>) -> std::result::Result<Self, Unsupported> {
        let schema = sort.input().schema();
        check_input_types(&schema)?;
        let width = schema.fields().len();
        let mut ordering = Vec::with_capacity(sort.expr().len());
        let mut computed: Vec<&dyn PhysicalExpr> = Vec::new();
        for e in sort.expr().iter() {
            if e.expr.downcast_ref::<Column>().is_some() {
                ordering.push(e.clone());
                continue;
            }
            let name = format!("__spate_sort_key_{}", computed.len());
            ordering.push(PhysicalSortExpr {
                expr: Arc::new(Column::new(&name, width + computed.len())),
                options: e.options,
            });
            computed.push(e.expr.as_ref());
        }
        let computed = Appended::new(&computed, &schema, "__spate_sort_key_")?.map(Arc::new);
        let keys = match &computed {
            Some(c) => sort_keys(ordering.iter(), c.wide())?,
            None => sort_keys(ordering.iter(), &schema)?,
        };
        Ok(GpuSortExec {
            cpu: sort,
            keys,
            computed,
            metrics: ExecutionPlanMetricsSet::new(),
        })
    }

    fn rebuild(cpu: Arc<dyn ExecutionPlan>) -> DFResult<Arc<dyn ExecutionPlan>> {
        rebuild_gpu::<SortExec, _>(cpu, GpuSortExec::try_new)
    }
}

/// The GPU sort keys of `ordering` over `schema`: each a column of a type GPU sorts take.
pub(crate) fn sort_keys<'a>(
    ordering: impl IntoIterator<Item = &'a PhysicalSortExpr>,
    schema: &Schema,
) -> std::result::Result<Vec<SortKey>, Unsupported> {
    let mut keys = Vec::new();
    for e in ordering {
        let column = e
            .expr
            .downcast_ref::<Column>()
            .ok_or_else(|| Unsupported(format!("sort key `{}` is not a column", e.expr)))?;
        let data_type = schema.field(column.index()).data_type();
        use DataType::*;
        let kind = match data_type {
            Int8 => KeyKind::I8,
            Int16 => KeyKind::I16,
            UInt8 => KeyKind::U8,
            UInt16 => KeyKind::U16,
            Decimal128(_, _) => KeyKind::Dec,
            Int32 | Date32 | Time32(_) => KeyKind::I32,
            UInt32 => KeyKind::U32,
            Float32 => KeyKind::F32,
            Int64 | Date64 | Time64(_) | Timestamp(_, _) | Duration(_) => KeyKind::I64,
            UInt64 => KeyKind::U64,
            Float64 => KeyKind::F64,
            Utf8 | LargeUtf8 | Utf8View => KeyKind::Str,
            other => {
                return Err(Unsupported(format!(
                    "sort key `{}` has type {other}, which GPU sorts do not support yet",
                    e.expr
                )));
            }
        };
        keys.push(SortKey {
            column: column.index(),
            kind,
            descending: e.options.descending,
            nulls_first: e.options.nulls_first,
        });
    }
    Ok(keys)
}

/// A sort by fixed keys with its kernels compiled, for operators that sort their own output
/// (an aggregation that keeps the order of its sorted input).
pub(crate) struct Sorter {
    keys: Vec<SortKey>,
    null_kernels: (spate_kernels::Kernel, spate_kernels::Kernel),
}

impl Sorter {
    /// Compiles the sort's kernels (once per session) for `keys`.
    pub(crate) fn new(gpu: &crate::device::GpuContext, keys: Vec<SortKey>) -> Result<Self> {
        Ok(Sorter {
            keys,
            null_kernels: null_kernels(gpu)?,
        })
    }

    /// `batch` sorted.
    pub(crate) fn sort(&self, stream: &DeviceStream, batch: &DeviceBatch) -> Result<DeviceBatch> {
        sort_batch(
            stream,
            batch,
            &self.keys,
            None,
            &self.null_kernels,
            batch.schema(),
        )
    }
}

/// The kernels that zero NULL rows' keys, `(u32 keys, u64 keys)`.
fn null_kernels(
    gpu: &crate::device::GpuContext,
) -> Result<(spate_kernels::Kernel, spate_kernels::Kernel)> {
    match gpu
        .generated_kernels(
            NULL_KEYS_SOURCE,
            &["spate_sort_null_keys_u32", "spate_sort_null_keys_u64"],
        )?
        .as_slice()
    {
        [u32_keys, u64_keys] => Ok((u32_keys.clone(), u64_keys.clone())),
        _ => Err(SpateError::Internal {
            message: "the sort's NULL-key kernels did not compile as two entries".into(),
        }),
    }
}

/// Zeroes the sort keys of a key column's NULL rows, so that NULLs tie on this column and
/// keep the order the less significant keys gave them (their slots hold arbitrary values).
const NULL_KEYS_SOURCE: &str = r#"// spate::exec::sort: the sort keys of NULL rows, zeroed.
#include "common/prelude.cuh"
#include "common/bitmap.cuh"

extern "C" __global__ void __launch_bounds__(SPATE_BLOCK_THREADS) spate_sort_null_keys_u32(u32* keys, const u8* validity, u64 offset, u64 n) {
    for (u64 i = spate::global_thread_index(); i < n; i += spate::grid_stride()) if (!spate::row_is_valid(validity, offset, i)) keys[i] = 0u;
}
SPATE_EXPORT(spate_sort_null_keys_u32)

extern "C" __global__ void __launch_bounds__(SPATE_BLOCK_THREADS) spate_sort_null_keys_u64(u64* keys, const u8* validity, u64 offset, u64 n) {
    for (u64 i = spate::global_thread_index(); i < n; i += spate::grid_stride()) if (!spate::row_is_valid(validity, offset, i)) keys[i] = 0ull;
}
SPATE_EXPORT(spate_sort_null_keys_u64)
"#;

/// The key column's validity and the kernels that zero its NULL rows' keys.
struct NullKeys<'a> {
    validity: &'a crate::column::DeviceValidity,
    /// `(u32 keys, u64 keys)`.
    kernels: &'a (spate_kernels::Kernel, spate_kernels::Kernel),
}

/// One stable radix pass: `keys` (one per row, in row order; NULL rows' keys zeroed first when
/// `nulls` is given) put in the order so far (`order`, or row order), then sorted; returns the
/// new order.
fn stable_pass<K: ks::RadixKey + gather::GatherElem>(
    stream: &DeviceStream,
    keys: DeviceBuffer<K>,
    order: Option<&DeviceBuffer<u32>>,
    nulls: Option<&NullKeys<'_>>,
) -> Result<DeviceBuffer<u32>> {
    if let Some(nulls) = nulls
        && !keys.is_empty()
    {
        let kernel = if K::BITS == 32 {
            &nulls.kernels.0
        } else {
            &nulls.kernels.1
        };
        let n = keys.len();
        let cfg = spate_kernels::LaunchConfig::blocks(stream.device().grid_stride_blocks(n));
        let args = [
            (&keys).into(),
            spate_kernels::KernelArg::Ptr(nulls.validity.bytes.as_slice().address()),
            spate_kernels::KernelArg::U64(nulls.validity.offset as u64),
            spate_kernels::KernelArg::U64(n as u64),
        ];
        // SAFETY: `keys` holds one key of K::BITS bits per row and the validity bitmap covers
        // those rows from `offset`, as the kernel of that width takes them.
        unsafe { stream.launch(kernel, cfg, &args)? };
    }
    let keys = match order {
        Some(p) => gather::gather(stream, keys.as_slice(), p.as_slice())?,
        None => keys,
    };
    Ok(ks::sort_pairs(
        stream,
        keys.as_slice(),
        order.map(DeviceBuffer::as_slice),
        K::BITS,
    )?
    .values)
}

/// Radix keys of one width, one per row.
pub(crate) enum RadixKeys {
    U32(DeviceBuffer<u32>),
    U64(DeviceBuffer<u64>),
}

/// The radix keys of a fixed-width key column of `kind`, whose unsigned order is the column's
/// (reversed when `descending`); `None` for a decimal or a string, which take several words.
pub(crate) fn fixed_radix_keys(
    stream: &DeviceStream,
    kind: KeyKind,
    bytes: &crate::column::DeviceBytes,
    descending: bool,
) -> Result<Option<RadixKeys>> {
    fn keys<T: SortKeySource>(
        stream: &DeviceStream,
        bytes: &crate::column::DeviceBytes,
        descending: bool,
    ) -> Result<DeviceBuffer<T::Key>> {
        Ok(ks::sort_keys(stream, bytes.typed::<T>()?, descending)?)
    }
    let d = descending;
    Ok(Some(match kind {
        KeyKind::I8 => RadixKeys::U32(keys::<i8>(stream, bytes, d)?),
        KeyKind::I16 => RadixKeys::U32(keys::<i16>(stream, bytes, d)?),
        KeyKind::U8 => RadixKeys::U32(keys::<u8>(stream, bytes, d)?),
        KeyKind::U16 => RadixKeys::U32(keys::<u16>(stream, bytes, d)?),
        KeyKind::I32 => RadixKeys::U32(keys::<i32>(stream, bytes, d)?),
        KeyKind::U32 => RadixKeys::U32(keys::<u32>(stream, bytes, d)?),
        KeyKind::F32 => RadixKeys::U32(keys::<f32>(stream, bytes, d)?),
        KeyKind::I64 => RadixKeys::U64(keys::<i64>(stream, bytes, d)?),
        KeyKind::U64 => RadixKeys::U64(keys::<u64>(stream, bytes, d)?),
        KeyKind::F64 => RadixKeys::U64(keys::<f64>(stream, bytes, d)?),
        KeyKind::Dec | KeyKind::Str => return Ok(None),
    }))
}

/// Decimal128 keys: the low words (unsigned), then the high words (signed), both stable.
fn decimal_pass(
    stream: &DeviceStream,
    values: DeviceSlice<'_, i128>,
    descending: bool,
    perm: Option<&DeviceBuffer<u32>>,
    nulls: Option<&NullKeys<'_>>,
) -> Result<DeviceBuffer<u32>> {
    let low = ks::decimal_sort_keys(stream, values, descending, false)?;
    let perm = stable_pass(stream, low, perm, nulls)?;
    let high = ks::decimal_sort_keys(stream, values, descending, true)?;
    stable_pass(stream, high, Some(&perm), nulls)
}

/// String keys in byte-wise order: the length key first (least significant), then 8-byte
/// chunks from the last to the first, all stable.
fn string_pass<O: gather::OffsetElem>(
    stream: &DeviceStream,
    strings: gather::DeviceStrings<'_, O>,
    descending: bool,
    perm: Option<&DeviceBuffer<u32>>,
    nulls: Option<&NullKeys<'_>>,
) -> Result<DeviceBuffer<u32>> {
    let lengths = ks::string_sort_keys(stream, strings, None, descending)?;
    let mut order = stable_pass(stream, lengths, perm, nulls)?;
    let chunks = ks::string_max_len(stream, strings)?.div_ceil(8) as usize;
    for chunk in (0..chunks).rev() {
        let keys = ks::string_sort_keys(stream, strings, Some(chunk), descending)?;
        order = stable_pass(stream, keys, Some(&order), nulls)?;
    }
    Ok(order)
}

/// `batch` sorted by `keys` (the first `fetch` rows of it), with the columns of `output`: the
/// batch's first ones (a sort drops the keys it computed).
fn sort_batch(
    stream: &DeviceStream,
    batch: &DeviceBatch,
    keys: &[SortKey],
    fetch: Option<usize>,
    null_kernels: &(spate_kernels::Kernel, spate_kernels::Kernel),
    output: &SchemaRef,
) -> Result<DeviceBatch> {
    // The radix passes size their histograms by the row count: it must be on the host.
    let batch = &batch.resolve(stream)?;
    let n = batch.bound();
    let mut perm: Option<DeviceBuffer<u32>> = None;
    for key in keys.iter().rev() {
        let column = &batch.columns()[key.column];
        let (d, p) = (key.descending, perm.as_ref());
        let nulls = column.validity().map(|validity| NullKeys {
            validity,
            kernels: null_kernels,
        });
        let nk = nulls.as_ref();
        let next = match (key.kind, column.values()) {
            (KeyKind::Str, DeviceValues::Utf8 { offsets, bytes }) => string_pass(
                stream,
                gather::DeviceStrings::<i32> {
                    offsets: offsets.typed()?,
                    bytes: bytes.as_slice(),
                },
                d,
                p,
                nk,
            )?,
            (KeyKind::Str, DeviceValues::LargeUtf8 { offsets, bytes }) => string_pass(
                stream,
                gather::DeviceStrings::<i64> {
                    offsets: offsets.typed()?,
                    bytes: bytes.as_slice(),
                },
                d,
                p,
                nk,
            )?,
            (KeyKind::Dec, DeviceValues::Fixed { bytes, .. }) => {
                decimal_pass(stream, bytes.typed()?, d, p, nk)?
            }
            (kind, DeviceValues::Fixed { bytes, .. }) => {
                match fixed_radix_keys(stream, kind, bytes, d)? {
                    Some(RadixKeys::U32(k)) => stable_pass(stream, k, p, nk)?,
                    Some(RadixKeys::U64(k)) => stable_pass(stream, k, p, nk)?,
                    None => {
                        return Err(SpateError::Internal {
                            message: "a GPU string sort key is laid out as fixed-width values"
                                .into(),
                        });
                    }
                }
            }
            _ => {
                return Err(SpateError::Internal {
                    message: format!(
                        "GPU sort key column {} does not have the layout of its type",
                        key.column
                    ),
                });
            }
        };
        perm = Some(next);
        if let Some(validity) = column.validity() {
            let ranks = ks::null_ranks(stream, validity.bitmap(), n, key.nulls_first)?;
            let current = perm.as_ref().map(DeviceBuffer::as_slice);
            let ranks = match current {
                Some(p) => gather::gather(stream, ranks.as_slice(), p)?,
                None => ranks,
            };
            perm = Some(ks::sort_pairs(stream, ranks.as_slice(), current, 8)?.values);
        }
    }
    let width = output.fields().len();
    let Some(perm) = perm else {
        let columns = batch.columns()[..width].to_vec();
        return DeviceBatch::try_new_counted(
            Arc::clone(output),
            columns,
            batch.row_count().clone(),
        );
    };
    let rows = fetch.map_or(n, |k| k.min(n));
    let indices = perm.slice(..rows)?;
    let gathers: Vec<Gather<'_>> = batch.columns()[..width]
        .iter()
        .map(|c| Gather::rows(c, indices))
        .collect();
    let columns = gather_columns(stream, &gathers)?;
    DeviceBatch::try_new(Arc::clone(output), columns, rows)
}

impl DisplayAs for GpuSortExec {
    fn fmt_as(&self, t: DisplayFormatType, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        crate::exec::display_gpu(self.cpu.as_ref(), t, f)
    }
}

impl ExecutionPlan for GpuSortExec {
    fn name(&self) -> &str {
        "GpuSortExec"
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        self.cpu.properties()
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![self.cpu.input()]
    }

    fn apply_expressions(
        &self,
        f: &mut dyn FnMut(&Arc<dyn PhysicalExpr>) -> DFResult<TreeNodeRecursion>,
    ) -> DFResult<TreeNodeRecursion> {
        self.cpu.apply_expressions(f)
    }

    fn input_distribution_requirements(&self) -> InputDistributionRequirements {
        self.cpu.input_distribution_requirements()
    }

    fn benefits_from_input_partitioning(&self) -> Vec<bool> {
        self.cpu.benefits_from_input_partitioning()
    }

    fn replace_children(
        self: Arc<Self>,
        children: Vec<Arc<dyn ExecutionPlan>>,
        options: ReplaceChildrenOptions,
    ) -> DFResult<Arc<dyn ExecutionPlan>> {
        let cpu = Arc::clone(&self.cpu).replace_children(children, options)?;
        Self::rebuild(cpu)
    }

    crate::exec::gpu_plan_methods!(cpu);

    fn fetch(&self) -> Option<usize> {
        self.cpu.fetch()
    }
}

impl GpuExec for GpuSortExec {
    fn plan_metrics(&self) -> &ExecutionPlanMetricsSet {
        &self.metrics
    }

    fn replaces(&self) -> Option<&dyn ExecutionPlan> {
        Some(self.cpu.as_ref())
    }

    fn device_metrics(&self) -> Option<&ExecutionPlanMetricsSet> {
        Some(&self.metrics)
    }

    fn execute_device(
        &self,
        partition: usize,
        context: Arc<TaskContext>,
        stream: Arc<DeviceStream>,
    ) -> DFResult<DeviceBatchStream> {
        let gpu = gpu_context(&context)?;
        let null_kernels = null_kernels(&gpu).map_err(to_df)?;
        // Computed keys: their kernel, and what computes them.
        let computed = match &self.computed {
            Some(c) => Some((c.kernel(&gpu).map_err(to_df)?, Arc::clone(c))),
            None => None,
        };
        let transfer = TransferMetrics::new(&self.metrics, partition);
        let input = collected_input(
            self.cpu.input(),
            partition,
            &context,
            &stream,
            &transfer,
            KeepsCounts::never(),
        )?;
        let baseline = BaselineMetrics::new(&self.metrics, partition);
        // EXPLAIN ANALYZE: the rows a top-k kept of those it narrowed.
        let narrowed = MetricBuilder::new(&self.metrics).counter("topk_narrowed_rows", partition);
        let kept_rows = MetricBuilder::new(&self.metrics).counter("topk_kept_rows", partition);
        let keys = self.keys.clone();
        let fetch = self.cpu.fetch();
        let output = self.schema();
        let schema = computed
            .as_ref()
            .map_or_else(|| Arc::clone(&output), |(_, c)| Arc::clone(c.wide()));
        let limit = super::memory::state_limit(&gpu, context.session_config().options());
        let spill =
            super::spill::SpillOptions::new(&context, self.name(), &self.metrics, partition)?;
        // A sort's input waits on the device, where the coordinator may move it to the host
        // for an operator below that runs out (`held.rs`); a top-k's candidates stay.
        let parked = HeldBatches::register(&gpu, Arc::clone(&stream), &spill);
        let sorted = futures::stream::once(async move {
            let mut input = input;
            let mut held: Vec<DeviceBatch> = Vec::new();
            // Past the sort's share of the budget, what it holds is sorted into a run on the
            // host (`external_sort.rs`).
            let mut runs = Runs::new(spill);
            let (mut held_bytes, mut held_rows) = (0usize, 0usize);
            // A top-k narrows what it holds to its candidates as its input arrives
            // (`top_k.rs`); once it has a bound, each batch keeps only its rows within it.
            let mut top = fetch.and_then(|k| top_k::TopK::new(&keys, k));
            while let Some(batch) = input.try_next().await? {
                let batch = match &computed {
                    Some((kernel, c)) => {
                        let _timer = baseline.elapsed_compute().timer();
                        c.append(&stream, kernel, batch).map_err(to_df)?
                    }
                    None => batch,
                };
                let Some(top) = top.as_mut() else {
                    held_bytes += batch.device_bytes();
                    held_rows += batch.bound();
                    parked.push(batch);
                    let needed = 2 * held_bytes + SORT_BYTES_PER_ROW * held_rows;
                    if super::memory::should_spill(needed, limit, stream.device()) {
                        let _timer = baseline.elapsed_compute().timer();
                        let parts = parked.take().map_err(to_df)?;
                        let all = concat_device_batches(&stream, &schema, parts).map_err(to_df)?;
                        let run = sort_batch(&stream, &all, &keys, None, &null_kernels, &schema)
                            .map_err(to_df)?;
                        drop(all);
                        runs.push(&stream, &run).map_err(to_df)?;
                        (held_bytes, held_rows) = (0, 0);
                    }
                    continue;
                };
                let _timer = baseline.elapsed_compute().timer();
                held.push(top.admit(&stream, batch).map_err(to_df)?);
                let rows: usize = held.iter().map(DeviceBatch::bound).sum();
                if top.should_narrow(rows) {
                    let all = concat_device_batches(&stream, &schema, std::mem::take(&mut held))
                        .map_err(to_df)?;
                    narrowed.add(all.bound());
                    let kept = top.narrow(&stream, all).map_err(to_df)?;
                    kept_rows.add(kept.bound());
                    held.push(kept);
                }
            }
            let _timer = baseline.elapsed_compute().timer();
            held.extend(parked.take().map_err(to_df)?);
            let all = concat_device_batches(&stream, &schema, held).map_err(to_df)?;
            if runs.is_empty() {
                let out = sort_batch(&stream, &all, &keys, fetch, &null_kernels, &output)
                    .map_err(to_df)?;
                baseline.record_output(out.bound());
                let one: DeviceBatchStream =
                    Box::pin(futures::stream::once(futures::future::ready(Ok(out))));
                return Ok::<DeviceBatchStream, datafusion::error::DataFusionError>(one);
            }
            let last =
                sort_batch(&stream, &all, &keys, None, &null_kernels, &schema).map_err(to_df)?;
            drop(all);
            runs.push(&stream, &last).map_err(to_df)?;
            drop(last);
            let merge = runs.merge(&keys).map_err(to_df)?;
            // Each round's rows sorted on the device, until the fetch is met.
            drop(_timer);
            let state = (merge, fetch, stream, baseline);
            let rounds = futures::stream::unfold(Some(state), move |state| {
                let (keys, null_kernels, output) =
                    (keys.clone(), null_kernels.clone(), Arc::clone(&output));
                async move {
                    let (mut merge, mut remaining, stream, baseline) = state?;
                    if remaining == Some(0) {
                        return None;
                    }
                    let _timer = baseline.elapsed_compute().timer();
                    let round = match merge.next_round(&stream) {
                        Ok(Some(round)) => round,
                        Ok(None) => return None,
                        Err(e) => return Some((Err(to_df(e)), None)),
                    };
                    match sort_batch(&stream, &round, &keys, remaining, &null_kernels, &output) {
                        Ok(out) => {
                            if let Some(r) = remaining.as_mut() {
                                *r = r.saturating_sub(out.bound());
                            }
                            baseline.record_output(out.bound());
                            drop(_timer);
                            Some((Ok(out), Some((merge, remaining, stream, baseline))))
                        }
                        Err(e) => Some((Err(to_df(e)), None)),
                    }
                }
            });
            Ok::<DeviceBatchStream, datafusion::error::DataFusionError>(Box::pin(rounds))
        })
        .try_flatten();
        Ok(Box::pin(
            sorted.try_filter(|b| futures::future::ready(b.bound() > 0)),
        ))
    }
}
