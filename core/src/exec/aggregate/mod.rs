//! `GpuAggregateExec`: DataFusion's `AggregateExec` (hash aggregation) on the GPU.
//!
//! Per batch of rows:
//! 1. group keys and aggregate arguments are input columns, or computed by one generated value
//!    kernel (the expression JIT);
//! 2. with group keys, every row is hashed and inserted into an open-addressing table (the
//!    one joins share, `exec::hash_table`); the occupied slots, numbered by a prefix scan, are
//!    the groups (in hash order: results equal the CPU's up to row order, which only an
//!    ORDER BY fixes);
//! 3. one generated kernel folds every row into its group's accumulators with atomics (in
//!    shared memory first when there are few groups), and another turns the accumulators into
//!    output columns;
//! 4. the key columns are gathered from each group's first row.
//!
//! Modes: `Partial` (and `PartialReduce`) aggregates each input batch on its own and emits
//! partial states; `Final`, `FinalPartitioned`, `Single` and `SinglePartitioned` concatenate
//! their partition's batches on the device and aggregate once. State layouts and result types
//! are DataFusion's (`state_fields()`, `field()`), so a GPU partial stage can feed a CPU final
//! stage and the other way round.
//!
//! Aggregates: SUM (Int64/UInt64 wrapping, Float64, Decimal128 wrapping as DataFusion's
//! `add_wrapping`), COUNT and COUNT(*), MIN/MAX (integers, dates, times, timestamps,
//! Decimal128 up to precision 18, and floats without GROUP BY, in IEEE total order as
//! DataFusion's ungrouped MIN/MAX; its grouped float MIN/MAX depends on row order) and AVG (Float64, and Decimal128 up to
//! precision 24, so that `sum * 10^shift` cannot overflow where the CPU would raise an error).
//! COUNT(DISTINCT x) (not on floats) runs in single-stage aggregations (`Single`,
//! `SinglePartitioned`): a second hash table over (group keys, x) finds the distinct pairs.
//! In two-stage plans its partial state is a list, which stays on the CPU; DataFusion rewrites
//! a query's single COUNT(DISTINCT x) into a two-level GROUP BY, which runs here anyway. FILTER
//! clauses and ordered aggregates stay on the CPU. Grouping sets (ROLLUP, CUBE) run in the first
//! phase: each row once per set, its left-out keys NULL, with DataFusion's `__grouping_id`.
//! VAR/STDDEV keep DataFusion's (count, mean, m2) state, m2 computed in a second pass. A
//! GROUP BY with a pushed-down LIMIT computes every group; the limit above keeps k.
//!
//! Float sums are added in a different order than on the CPU, so they agree within rounding,
//! not bit for bit. Dynamic filters this aggregate would publish (MIN/MAX bounds for the scan)
//! are not updated on the GPU: they keep their initial, pass-everything value, which is correct
//! and only forgoes the pruning.

pub(crate) mod codegen;
mod segments;

pub(crate) use segments::SegmentAggregate;

use std::fmt;
use std::sync::Arc;

use arrow::datatypes::{DataType, SchemaRef};
use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::error::Result as DFResult;
use datafusion::execution::TaskContext;
use datafusion::logical_expr::Operator;
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_expr::expressions::{BinaryExpr, CastExpr, Column, Literal};
use datafusion::physical_plan::aggregates::{
    AggregateExec, AggregateInputMode, AggregateMode, AggregateOutputMode,
};
use datafusion::physical_plan::execution_plan::CardinalityEffect;
use datafusion::physical_plan::metrics::{BaselineMetrics, ExecutionPlanMetricsSet};
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, InputDistributionRequirements, InputOrderMode,
    PlanProperties, ReplaceChildrenOptions,
};
use futures::{StreamExt, TryStreamExt};
use spate_kernels::gather::bitmap_bytes;
use spate_kernels::{DeviceBuffer, KernelArg, Stream as DeviceStream};

use self::codegen::{AggProgram, AggSpec, Out, Slot, SlotKind};
use super::batching::KeepsCounts;
use super::hash_table::{Kernels, group_rows, launch};
use super::sort::Sorter;
use super::{
    DeviceBatchStream, GpuExec, TransferMetrics, check_input_types, collected_input, device_input,
    gpu_context, per_batch_input, rebuild_gpu, to_df,
};
use crate::column::{
    DeviceBatch, DeviceBytes, DeviceColumn, DeviceValidity, DeviceValues, Gather, RowCount,
    concat_device_batches, gather_columns,
};
use crate::error::{Result, SpateError};
use crate::expr::{DevType, Unsupported, ValueKernel, column_args, evaluate_values, value_kernel};

/// Where a key or argument column comes from.
#[derive(Debug, Clone, Copy)]
enum Operand {
    /// An input column.
    Input(usize),
    /// Output `k` of the generated value kernel.
    Computed(usize),
}

/// Decimal precision up to which AVG runs on the GPU: `sum * 10^4` then stays far inside i128
/// for up to 10^10 rows, so the CPU's overflow error cannot be due.
const AVG_MAX_DECIMAL_PRECISION: u8 = 24;

/// Decimal precision up to which MIN/MAX fold one 64-bit order key; wider decimals take two
/// words and two passes (`SlotKind::MinWide`, `SlotKind::MaxWide`).
const NARROW_DECIMAL_PRECISION: u8 = 18;

/// What the GPU computes for one `AggregateExec`.
#[derive(Debug)]
struct AggPlan {
    keys: Vec<Operand>,
    args: Vec<Operand>,
    computed: Option<ValueKernel>,
    spec: AggSpec,
    program: AggProgram,
    /// Aggregate each input batch on its own (partial output).
    per_batch: bool,
    /// The order the output keeps (its input is sorted on group keys): each output batch is
    /// sorted by it.
    order: Option<Vec<crate::exec::sort::SortKey>>,
}

struct Operands<'a> {
    schema: &'a arrow::datatypes::Schema,
    computed: Vec<Arc<dyn PhysicalExpr>>,
}

impl Operands<'_> {
    fn add(
        &mut self,
        expr: &Arc<dyn PhysicalExpr>,
    ) -> std::result::Result<(Operand, DevType), Unsupported> {
        let data_type = expr
            .data_type(self.schema)
            .map_err(|e| Unsupported(format!("`{expr}`: {e}")))?;
        let ty = DevType::of(&data_type).ok_or_else(|| {
            Unsupported(format!(
                "`{expr}` has type {data_type}, which GPU aggregation does not support yet"
            ))
        })?;
        if let Some(c) = expr.downcast_ref::<Column>() {
            return Ok((Operand::Input(c.index()), ty));
        }
        if let Some(k) = self.computed.iter().position(|e| e == expr) {
            return Ok((Operand::Computed(k), ty));
        }
        self.computed.push(Arc::clone(expr));
        Ok((Operand::Computed(self.computed.len() - 1), ty))
    }
}

fn dev_type(data_type: &DataType, what: &str) -> std::result::Result<DevType, Unsupported> {
    DevType::of(data_type).ok_or_else(|| {
        Unsupported(format!(
            "{what} has type {data_type}, which the GPU does not support yet"
        ))
    })
}

/// Per grouping set, the keys it leaves NULL (bit `k` for key `k`) and its `__grouping_id`,
/// and that column's type, as DataFusion computes them (`group_id_array`): the low bits are the
/// NULL keys with the first key as the most significant, the high bits the set's ordinal among
/// the sets with the same pattern; the type is the smallest unsigned integer that holds both.
fn grouping_sets(
    groups: &[Vec<bool>],
) -> std::result::Result<(Vec<(u64, u64)>, DataType), Unsupported> {
    let n = groups.first().map_or(0, Vec::len);
    if n > 64 {
        return Err(Unsupported(format!(
            "grouping sets over {n} columns do not run on the GPU"
        )));
    }
    let mut ordinals: Vec<(&[bool], u64)> = Vec::new();
    let mut sets = Vec::with_capacity(groups.len());
    for group in groups {
        let ordinal = match ordinals.iter_mut().find(|(g, _)| *g == group.as_slice()) {
            Some((_, next)) => {
                *next += 1;
                *next
            }
            None => {
                ordinals.push((group, 0));
                0
            }
        };
        let mask = group
            .iter()
            .enumerate()
            .fold(0u64, |m, (k, &null)| m | (u64::from(null) << k));
        let semantic = group
            .iter()
            .fold(0u64, |acc, &null| (acc << 1) | u64::from(null));
        sets.push((mask, semantic | ordinal.checked_shl(n as u32).unwrap_or(0)));
    }
    let max_ordinal = ordinals.iter().map(|(_, o)| *o).max().unwrap_or(0);
    let total_bits = n + (64 - max_ordinal.leading_zeros() as usize);
    if n > 64 || total_bits > 64 {
        return Err(Unsupported(format!(
            "grouping sets over {n} columns do not run on the GPU"
        )));
    }
    let id_type = match total_bits {
        0..=8 => DataType::UInt8,
        9..=16 => DataType::UInt16,
        17..=32 => DataType::UInt32,
        _ => DataType::UInt64,
    };
    Ok((sets, id_type))
}

fn analyze(agg: &AggregateExec) -> std::result::Result<AggPlan, Unsupported> {
    let input_schema = agg.input().schema();
    check_input_types(&input_schema)?;
    let group = agg.group_expr();
    let raw = agg.mode().input_mode() == AggregateInputMode::Raw;
    if !group.is_single() && !raw {
        return Err(Unsupported(
            "grouping sets (ROLLUP, CUBE, GROUPING SETS) run on the GPU only in the first \
             aggregation phase"
                .into(),
        ));
    }
    // A pushed-down LIMIT (DataFusion's limited-distinct and top-k aggregation rules) lets the
    // CPU stop at k groups; the rules keep the limit, or the top-k sort, above the aggregation,
    // so the GPU computes every group and the operator above keeps k of them.
    // Over input sorted on (some of) its group keys the CPU streams its groups out in that
    // order, and the plan above may rely on it: the GPU aggregates by hash, then sorts its
    // groups by the order the aggregation declares.
    let order = match agg.properties().output_ordering() {
        Some(ordering) if *agg.input_order_mode() != InputOrderMode::Linear => Some(
            crate::exec::sort::sort_keys(ordering.iter(), &agg.schema()).map_err(|e| {
                Unsupported(format!(
                    "its input is sorted on the group keys, and the order its output keeps \
                     needs a sort the GPU cannot do: {}",
                    e.0
                ))
            })?,
        ),
        _ => None,
    };
    if let Some(f) = agg.filter_expr().iter().flatten().next() {
        return Err(Unsupported(format!(
            "aggregate FILTER (WHERE {f}) does not run on the GPU yet"
        )));
    }
    let partial_out = agg.mode().output_mode() == AggregateOutputMode::Partial;
    let first_phase_schema = agg.input_schema();

    let mut operands = Operands {
        schema: &input_schema,
        computed: Vec::new(),
    };
    let mut keys = Vec::new();
    let mut key_types = Vec::new();
    for (expr, _) in group.expr() {
        let (operand, ty) = operands.add(expr)?;
        keys.push(operand);
        key_types.push(ty);
    }
    let sets = if group.is_single() {
        Vec::new()
    } else {
        let (sets, id_type) = grouping_sets(group.groups())?;
        key_types.push(dev_type(&id_type, "`__grouping_id`")?);
        sets
    };

    let mut args: Vec<Operand> = Vec::new();
    let mut arg_types: Vec<DevType> = Vec::new();
    let mut slots: Vec<Slot> = Vec::new();
    let mut outputs: Vec<(Out, DevType)> = Vec::new();
    let mut next_state = group.expr().len();
    for f in agg.aggr_expr() {
        let name = f.fun().name().to_ascii_lowercase();
        let label = f.name().to_string();
        let distinct = f.is_distinct();
        if distinct && (name != "count" || !raw || partial_out) {
            return Err(Unsupported(format!(
                "`{label}`: a DISTINCT aggregate runs on the GPU only as COUNT(DISTINCT) in a \
                 single-stage aggregation (its partial state is a list)"
            )));
        }
        if !f.order_bys().is_empty() {
            return Err(Unsupported(format!(
                "`{label}` is an ordered aggregate, which runs on the CPU"
            )));
        }
        let exprs = f.expressions();
        if exprs.len() != 1 {
            return Err(Unsupported(format!(
                "`{label}` takes {} arguments; GPU aggregates take one",
                exprs.len()
            )));
        }
        let states = f
            .state_fields()
            .map_err(|e| Unsupported(format!("`{label}`: {e}")))?;
        let result = f.field().data_type().clone();
        let result_ty = dev_type(&result, &format!("`{label}`"))?;
        let arg_type = exprs[0]
            .data_type(&first_phase_schema)
            .map_err(|e| Unsupported(format!("`{label}`: {e}")))?;
        let arg_ty = dev_type(&arg_type, &format!("the argument of `{label}`"))?;
        let variance = matches!(name.as_str(), "var" | "var_pop" | "stddev" | "stddev_pop");
        let expected_states = match name.as_str() {
            "avg" => 2,
            _ if variance => 3,
            _ => 1,
        };
        if states.len() != expected_states {
            return Err(Unsupported(format!(
                "`{label}` has {} state fields; the GPU expects {expected_states}",
                states.len()
            )));
        }
        // A single-stage COUNT(DISTINCT) never materialises its (list) state.
        let state_types = if distinct {
            vec![result_ty]
        } else {
            states
                .iter()
                .map(|s| dev_type(s.data_type(), &format!("the state of `{label}`")))
                .collect::<std::result::Result<Vec<_>, _>>()?
        };

        // The argument each of this aggregate's slots reads: one shared argument for raw
        // input, one state column per slot when merging.
        let mut slot_arg = |k: usize, ty: DevType| -> std::result::Result<usize, Unsupported> {
            let (operand, ty) = if raw {
                operands.add(&exprs[0])?
            } else {
                (Operand::Input(next_state + k), ty)
            };
            args.push(operand);
            arg_types.push(ty);
            Ok(args.len() - 1)
        };
        let first = slots.len();
        match name.as_str() {
            "sum" => {
                let kind = match result_ty {
                    DevType::Int { bits: 64, .. } if matches!(arg_ty, DevType::Int { .. }) => {
                        SlotKind::SumInt
                    }
                    DevType::F64 if matches!(arg_ty, DevType::F64 | DevType::F32) => {
                        SlotKind::SumF64
                    }
                    DevType::Dec { .. } if matches!(arg_ty, DevType::Dec { .. }) => {
                        SlotKind::SumDec
                    }
                    _ => {
                        return Err(Unsupported(format!(
                            "`{label}` sums {arg_type} into {result}, which the GPU does not do yet"
                        )));
                    }
                };
                let arg = slot_arg(0, state_types[0])?;
                slots.push(Slot {
                    kind,
                    arg: Some(arg),
                });
            }
            "count" if distinct => {
                if matches!(arg_ty, DevType::F32 | DevType::F64) {
                    return Err(Unsupported(format!(
                        "`{label}` over floats does not run on the GPU yet"
                    )));
                }
                let arg = match exprs[0].downcast_ref::<Column>() {
                    Some(c) => {
                        args.push(Operand::Input(c.index()));
                        arg_types.push(arg_ty);
                        args.len() - 1
                    }
                    None => slot_arg(0, state_types[0])?,
                };
                slots.push(Slot {
                    kind: SlotKind::CountDistinct,
                    arg: Some(arg),
                });
            }
            "count" => {
                let rows = raw
                    && exprs[0]
                        .downcast_ref::<Literal>()
                        .is_some_and(|l| !l.value().is_null());
                let arg = if rows {
                    None
                } else if raw && matches!(arg_ty, DevType::Str | DevType::Bool) {
                    // Only the validity is read, so a column of any type will do.
                    match exprs[0].downcast_ref::<Column>() {
                        Some(c) => {
                            args.push(Operand::Input(c.index()));
                            arg_types.push(arg_ty);
                            Some(args.len() - 1)
                        }
                        None => Some(slot_arg(0, state_types[0])?),
                    }
                } else {
                    Some(slot_arg(0, state_types[0])?)
                };
                slots.push(Slot {
                    kind: SlotKind::Count { add_values: !raw },
                    arg,
                });
            }
            "min" | "max" => {
                if matches!(arg_ty, DevType::F32 | DevType::F64) && !keys.is_empty() {
                    // DataFusion's grouped MIN/MAX on floats compares with `partial_cmp` from
                    // a starting value of MIN/MAX: a NaN is kept or dropped depending on the
                    // rows after it, and which of -0.0 and +0.0 wins depends on row order, so
                    // no parallel order reproduces it. Without GROUP BY it uses IEEE total
                    // order, which the GPU matches.
                    return Err(Unsupported(format!(
                        "`{label}` on floats with GROUP BY depends on row order on the CPU \
                         (NaN and -0.0), which the GPU cannot reproduce"
                    )));
                }
                let ok = match arg_ty {
                    DevType::Int { .. } | DevType::F32 | DevType::F64 | DevType::Dec { .. } => true,
                    DevType::Bool | DevType::Str => false,
                };
                let wide = matches!(arg_ty, DevType::Dec { precision, .. }
                    if precision > NARROW_DECIMAL_PRECISION);
                if !ok || result_ty != arg_ty {
                    return Err(Unsupported(format!(
                        "`{label}` over {arg_type} does not run on the GPU yet"
                    )));
                }
                let arg = slot_arg(0, state_types[0])?;
                slots.push(Slot {
                    kind: match (name.as_str(), wide) {
                        ("min", false) => SlotKind::Min,
                        ("min", true) => SlotKind::MinWide,
                        (_, false) => SlotKind::Max,
                        (_, true) => SlotKind::MaxWide,
                    },
                    arg: Some(arg),
                });
            }
            "avg" => {
                let out = match (arg_ty, result_ty) {
                    (DevType::F64, DevType::F64) => None,
                    (
                        DevType::Dec {
                            precision,
                            scale: s,
                        },
                        DevType::Dec { scale: rs, .. },
                    ) if precision <= AVG_MAX_DECIMAL_PRECISION && rs >= s && rs - s <= 18 => {
                        Some(rs - s)
                    }
                    _ => {
                        return Err(Unsupported(format!(
                            "`{label}` over {arg_type} does not run on the GPU yet"
                        )));
                    }
                };
                let count_arg = slot_arg(0, state_types[0])?;
                let sum_arg = slot_arg(1, state_types[1])?;
                slots.push(Slot {
                    kind: SlotKind::Count { add_values: !raw },
                    arg: Some(count_arg),
                });
                slots.push(Slot {
                    kind: if out.is_some() {
                        SlotKind::SumDec
                    } else {
                        SlotKind::SumF64
                    },
                    arg: Some(sum_arg),
                });
                if !partial_out {
                    let (count, sum) = (first, first + 1);
                    outputs.push((
                        match out {
                            Some(shift) => Out::AvgDec { count, sum, shift },
                            None => Out::AvgF64 { count, sum },
                        },
                        result_ty,
                    ));
                }
            }
            _ if variance => {
                // DataFusion's state: (count UInt64, mean Float64, m2 Float64).
                let f64_ty = DevType::F64;
                let u64_ty = DevType::Int {
                    bits: 64,
                    signed: false,
                };
                if result_ty != f64_ty
                    || (raw && arg_ty != f64_ty)
                    || state_types != [u64_ty, f64_ty, f64_ty]
                {
                    return Err(Unsupported(format!(
                        "`{label}` over {arg_type} does not run on the GPU yet"
                    )));
                }
                let (count, sum) = (first, first + 1);
                if raw {
                    let x = slot_arg(0, f64_ty)?;
                    slots.push(Slot {
                        kind: SlotKind::Count { add_values: false },
                        arg: Some(x),
                    });
                    slots.push(Slot {
                        kind: SlotKind::SumF64,
                        arg: Some(x),
                    });
                    slots.push(Slot {
                        kind: SlotKind::M2 { count, sum },
                        arg: Some(x),
                    });
                } else {
                    let n = slot_arg(0, u64_ty)?;
                    let mean = slot_arg(1, f64_ty)?;
                    let m2 = slot_arg(2, f64_ty)?;
                    // The states' count * mean, summed: the group's mean times its count.
                    let state = |k: usize| -> Arc<dyn PhysicalExpr> {
                        Arc::new(Column::new(states[k].name(), next_state + k))
                    };
                    let weighted: Arc<dyn PhysicalExpr> = Arc::new(BinaryExpr::new(
                        Arc::new(CastExpr::new(state(0), DataType::Float64, None)),
                        Operator::Multiply,
                        state(1),
                    ));
                    let (operand, ty) = operands.add(&weighted)?;
                    args.push(operand);
                    arg_types.push(ty);
                    slots.push(Slot {
                        kind: SlotKind::Count { add_values: true },
                        arg: Some(n),
                    });
                    slots.push(Slot {
                        kind: SlotKind::SumF64,
                        arg: Some(args.len() - 1),
                    });
                    slots.push(Slot {
                        kind: SlotKind::M2Merge {
                            count,
                            sum,
                            mean,
                            m2,
                        },
                        arg: Some(n),
                    });
                }
                if partial_out {
                    outputs.push((Out::Slot(count), u64_ty));
                    outputs.push((Out::Mean { count, sum }, f64_ty));
                    outputs.push((Out::Slot(first + 2), f64_ty));
                } else {
                    outputs.push((
                        Out::Variance {
                            count,
                            m2: first + 2,
                            sample: !name.ends_with("_pop"),
                            sqrt: name.starts_with("stddev"),
                        },
                        f64_ty,
                    ));
                }
            }
            other => {
                return Err(Unsupported(format!(
                    "aggregate function `{other}` does not run on the GPU yet"
                )));
            }
        }
        if variance {
            // Its outputs are made above.
        } else if partial_out {
            for (k, ty) in state_types.iter().enumerate() {
                outputs.push((Out::Slot(first + k), *ty));
            }
        } else if name != "avg" {
            outputs.push((Out::Slot(first), result_ty));
        }
        next_state += states.len();
    }

    // The output schema must be exactly keys + these outputs.
    let schema = agg.schema();
    if schema.fields().len() != key_types.len() + outputs.len() {
        return Err(Unsupported(format!(
            "its output has {} columns; the GPU plan makes {}",
            schema.fields().len(),
            key_types.len() + outputs.len()
        )));
    }
    for (field, ty) in schema.fields().iter().zip(&key_types) {
        if DevType::of(field.data_type()) != Some(*ty) {
            return Err(Unsupported(format!(
                "group key `{}` is {}, which the GPU plan does not produce",
                field.name(),
                field.data_type()
            )));
        }
    }
    for (field, (_, ty)) in schema.fields()[key_types.len()..].iter().zip(&outputs) {
        if DevType::of(field.data_type()) != Some(*ty) {
            return Err(Unsupported(format!(
                "output `{}` is {}, which the GPU plan does not produce",
                field.name(),
                field.data_type()
            )));
        }
    }

    let computed = if operands.computed.is_empty() {
        None
    } else {
        let exprs: Vec<&dyn PhysicalExpr> = operands.computed.iter().map(|e| e.as_ref()).collect();
        Some(value_kernel(&exprs, &input_schema)?)
    };
    let spec = AggSpec {
        keys: key_types,
        args: arg_types,
        slots,
        outputs,
        sets,
    };
    let program = codegen::generate(&spec, &format!("{:?} aggregate", agg.mode()));
    Ok(AggPlan {
        keys,
        args,
        computed,
        spec,
        program,
        per_batch: matches!(
            agg.mode(),
            AggregateMode::Partial | AggregateMode::PartialReduce
        ),
        order,
    })
}

/// An aggregation running on the GPU.
#[derive(Debug)]
pub struct GpuAggregateExec {
    cpu: Arc<AggregateExec>,
    plan: Arc<AggPlan>,
    metrics: ExecutionPlanMetricsSet,
}

impl GpuAggregateExec {
    /// The GPU version of `aggregate`, or why it must stay on the CPU.
    pub fn try_new(aggregate: Arc<AggregateExec>) -> std::result::Result<Self, Unsupported> {
        let plan = analyze(&aggregate)?;
        Ok(GpuAggregateExec {
            cpu: aggregate,
            plan: Arc::new(plan),
            metrics: ExecutionPlanMetricsSet::new(),
        })
    }

    fn rebuild(cpu: Arc<dyn ExecutionPlan>) -> DFResult<Arc<dyn ExecutionPlan>> {
        rebuild_gpu::<AggregateExec, _>(cpu, GpuAggregateExec::try_new)
    }

    /// The CPU aggregation this one computes.
    pub fn cpu(&self) -> &Arc<AggregateExec> {
        &self.cpu
    }
}

impl AggPlan {
    /// Whether the whole input folds batch by batch into one row of accumulators, with no
    /// batch concatenated and no row count read back: an aggregation of every row (no group
    /// keys, not partial) whose slots fold in one pass. A second pass (wide MIN/MAX, variance)
    /// needs the final first-pass words, and COUNT(DISTINCT) a table over all rows, so those
    /// concatenate.
    fn folds(&self) -> bool {
        self.keys.is_empty()
            && !self.per_batch
            && !self
                .program
                .entries
                .iter()
                .any(|(name, _)| name == "second")
            && !self
                .spec
                .slots
                .iter()
                .any(|s| matches!(s.kind, SlotKind::CountDistinct))
    }
}

/// An aggregation without group keys ([`AggPlan::folds`]): each input batch is folded into the
/// accumulators as it comes, up to its row count, which may stay on the device; the one
/// output row is finished after the last.
fn fold(
    input: DeviceBatchStream,
    stream: Arc<DeviceStream>,
    kernels: Arc<Kernels>,
    plan: Arc<AggPlan>,
    schema: SchemaRef,
    baseline: BaselineMetrics,
) -> DeviceBatchStream {
    Box::pin(futures::stream::once(async move {
        let acc = Accumulators::new(&stream, &plan, 1).map_err(to_df)?;
        let mut input = input;
        while let Some(batch) = input.next().await {
            let batch = batch?;
            let _timer = baseline.elapsed_compute().timer();
            if batch.is_certainly_empty() {
                continue;
            }
            let computed = match (&plan.computed, &kernels.computed) {
                (Some(values), Some(kernel)) => {
                    evaluate_values(&stream, kernel, values, &batch).map_err(to_df)?
                }
                _ => Vec::new(),
            };
            let args: Vec<DeviceColumn> = plan
                .args
                .iter()
                .map(|o| match *o {
                    Operand::Input(i) => batch.columns()[i].clone(),
                    Operand::Computed(k) => computed[k].clone(),
                })
                .collect();
            acc.update(&stream, &kernels, &args, batch.row_count(), None, 1)
                .map_err(to_df)?;
        }
        let _timer = baseline.elapsed_compute().timer();
        let columns = finish_outputs(&stream, &kernels, &plan, &schema, 1, &acc.acc, &acc.seen)
            .map_err(to_df)?;
        let out = DeviceBatch::try_new(schema, columns, 1).map_err(to_df)?;
        baseline.record_output(1);
        Ok(out)
    }))
}

/// Aggregates one device batch into one batch of groups.
fn aggregate_batch(
    stream: &DeviceStream,
    kernels: &Kernels,
    plan: &AggPlan,
    schema: &SchemaRef,
    batch: &DeviceBatch,
) -> Result<DeviceBatch> {
    // The grouping kernels size their tables by the row count: it must be on the host.
    let batch = &batch.resolve(stream)?;
    let n = batch.bound();
    if n >= u32::MAX as usize {
        return Err(SpateError::Unsupported {
            message: format!(
                "a GPU aggregation over one batch of {n} rows (the limit is 2^32 - 2)"
            ),
        });
    }
    let computed = match (&plan.computed, &kernels.computed) {
        (Some(values), Some(kernel)) => evaluate_values(stream, kernel, values, batch)?,
        _ => Vec::new(),
    };
    let pick = |o: &Operand| -> DeviceColumn {
        match *o {
            Operand::Input(i) => batch.columns()[i].clone(),
            Operand::Computed(k) => computed[k].clone(),
        }
    };
    let keys: Vec<DeviceColumn> = plan.keys.iter().map(pick).collect();
    let args: Vec<DeviceColumn> = plan.args.iter().map(pick).collect();
    // Grouping sets: every row once per set, with the set's keys NULL and its id.
    let (keys, args, n) = if plan.spec.sets.is_empty() {
        (keys, args, n)
    } else {
        expand_sets(stream, kernels, plan, keys, args, n)?
    };
    let rows = RowCount::Host(n);
    let row_count = if plan.spec.sets.is_empty() {
        batch.row_count()
    } else {
        &rows
    };

    let (gid, reps, groups) = if keys.is_empty() {
        (None, None, 1)
    } else {
        let (gid, reps, groups) = group_rows(stream, kernels, ("hash", "build"), &keys, n)?;
        (Some(gid), Some(reps), groups)
    };

    let acc = Accumulators::new(stream, plan, groups)?;
    if groups > 0 {
        acc.update(stream, kernels, &args, row_count, gid.as_ref(), groups)?;
    }
    let Accumulators { acc, seen } = acc;
    for (j, slot) in plan.spec.slots.iter().enumerate() {
        let (SlotKind::CountDistinct, Some(arg)) = (slot.kind, slot.arg) else {
            continue;
        };
        if n == 0 {
            continue;
        }
        let value = &args[arg];
        let mut pair = keys.clone();
        pair.push(value.clone());
        let (hash, build) = (format!("dhash{j}"), format!("dbuild{j}"));
        let (_, pair_reps, distinct) = group_rows(stream, kernels, (&hash, &build), &pair, n)?;
        let (valid, offset) = match value.validity() {
            Some(v) => (
                KernelArg::Ptr(v.bytes.as_slice().address()),
                v.offset as u64,
            ),
            None => (KernelArg::null(), 0),
        };
        launch(
            stream,
            kernels.get(&format!("dcount{j}"))?,
            distinct,
            &[
                valid,
                KernelArg::U64(offset),
                (&pair_reps).into(),
                KernelArg::U64(distinct as u64),
                gid.as_ref().into(),
                KernelArg::U64(groups as u64),
                (&acc).into(),
            ],
        )?;
    }

    let mut columns = Vec::with_capacity(keys.len() + plan.spec.outputs.len());
    match &reps {
        Some(reps) => {
            let reps = reps.slice(..groups)?;
            // One readback for the byte totals of all the string keys.
            let gathers: Vec<Gather<'_>> = keys.iter().map(|k| Gather::rows(k, reps)).collect();
            let gathered = gather_columns(stream, &gathers)?;
            for (column, ty) in gathered.into_iter().zip(&plan.spec.keys) {
                if matches!(ty, DevType::F32 | DevType::F64)
                    && let DeviceValues::Fixed { bytes, width } = column.values()
                {
                    // The gathered column is new, so folding -0.0 in place touches no input.
                    launch(
                        stream,
                        kernels.get("canon")?,
                        groups,
                        &[
                            KernelArg::Ptr(bytes.as_slice().address()),
                            KernelArg::U64(groups as u64),
                            KernelArg::U64(*width as u64),
                        ],
                    )?;
                }
                columns.push(column);
            }
        }
        None => debug_assert!(keys.is_empty()),
    }
    columns.extend(finish_outputs(
        stream, kernels, plan, schema, groups, &acc, &seen,
    )?);
    DeviceBatch::try_new(Arc::clone(schema), columns, groups)
}

/// The key and argument columns of `n` rows expanded for grouping sets: `n * sets` rows, set
/// by set, each set's left-out keys NULL, and its `__grouping_id` as one more key.
fn expand_sets(
    stream: &DeviceStream,
    kernels: &Kernels,
    plan: &AggPlan,
    keys: Vec<DeviceColumn>,
    args: Vec<DeviceColumn>,
    n: usize,
) -> Result<(Vec<DeviceColumn>, Vec<DeviceColumn>, usize)> {
    let total = n * plan.spec.sets.len();
    if total >= u32::MAX as usize {
        return Err(SpateError::Unsupported {
            message: format!(
                "a GPU aggregation over grouping sets of {total} rows (the limit is 2^32 - 2)"
            ),
        });
    }
    let id_type = match plan.spec.keys.last() {
        Some(DevType::Int { bits, .. }) => match bits {
            8 => DataType::UInt8,
            16 => DataType::UInt16,
            32 => DataType::UInt32,
            _ => DataType::UInt64,
        },
        _ => {
            return Err(SpateError::Internal {
                message: "grouping sets without an integer `__grouping_id` key".into(),
            });
        }
    };
    let width = id_type.primitive_width().unwrap_or(8);
    let rows = stream.alloc::<u32>(total.max(1))?;
    let key_rows = stream.alloc::<u32>((total * keys.len()).max(1))?;
    let ids = stream.alloc::<u8>((total * width).max(16))?;
    launch(
        stream,
        kernels.get("expand")?,
        total,
        &[
            KernelArg::U64(n as u64),
            (&rows).into(),
            (&key_rows).into(),
            (&ids).into(),
        ],
    )?;
    let mut gathers = Vec::with_capacity(keys.len() + args.len());
    for (k, key) in keys.iter().enumerate() {
        let indices = key_rows.slice(k * total..(k + 1) * total)?;
        gathers.push(Gather::rows_or_null(key, indices));
    }
    let indices = rows.slice(..total)?;
    gathers.extend(args.iter().map(|a| Gather::rows(a, indices)));
    let mut columns = gather_columns(stream, &gathers)?;
    let expanded_args = columns.split_off(keys.len());
    columns.push(DeviceColumn::new(
        id_type,
        total,
        0,
        None,
        DeviceValues::Fixed {
            bytes: DeviceBytes::new(ids),
            width,
        },
    ));
    Ok((columns, expanded_args, total))
}

/// The groups a partition that saw no rows still produces, as DataFusion's: one per grouping
/// set that leaves every key NULL (its "grand total"), with the accumulators' values over no
/// rows (COUNT 0, SUM NULL). `None` without such a set.
fn empty_sets_batch(
    stream: &DeviceStream,
    kernels: &Kernels,
    plan: &AggPlan,
    schema: &SchemaRef,
) -> Result<Option<DeviceBatch>> {
    let keys = plan.keys.len();
    let all = if keys >= 64 {
        u64::MAX
    } else {
        (1u64 << keys) - 1
    };
    let ids: Vec<u64> = plan
        .spec
        .sets
        .iter()
        .filter(|(mask, _)| *mask == all)
        .map(|(_, id)| *id)
        .collect();
    if ids.is_empty() {
        return Ok(None);
    }
    let m = ids.len();
    let mut columns = Vec::with_capacity(schema.fields().len());
    for field in &schema.fields()[..keys] {
        columns.push(DeviceColumn::nulls(stream, field.data_type(), m)?);
    }
    // The ids, `width` little-endian bytes each: a few bytes cross the bus.
    let id_field = schema.field(keys);
    let width = id_field.data_type().primitive_width().unwrap_or(8);
    let mut padded: Vec<u8> = ids
        .iter()
        .flat_map(|id| id.to_le_bytes()[..width].to_vec())
        .collect();
    padded.resize(padded.len().max(16), 0);
    columns.push(DeviceColumn::new(
        id_field.data_type().clone(),
        m,
        0,
        None,
        DeviceValues::Fixed {
            bytes: DeviceBytes::new(stream.from_host(&padded)?),
            width,
        },
    ));
    let acc = Accumulators::new(stream, plan, m)?;
    columns.extend(finish_outputs(
        stream, kernels, plan, schema, m, &acc.acc, &acc.seen,
    )?);
    Ok(Some(DeviceBatch::try_new(Arc::clone(schema), columns, m)?))
}

/// The accumulators of an aggregation: `acc` words and `seen` flags for `groups` groups,
/// zeroed (see `codegen`'s module docs).
struct Accumulators {
    acc: DeviceBuffer<u64>,
    seen: DeviceBuffer<u32>,
}

impl Accumulators {
    fn new(stream: &DeviceStream, plan: &AggPlan, groups: usize) -> Result<Self> {
        Ok(Accumulators {
            acc: stream.alloc_zeroed::<u64>((plan.program.words * groups).max(1))?,
            seen: stream.alloc_zeroed::<u32>((plan.spec.slots.len() * groups).max(1))?,
        })
    }

    /// Folds the rows of `args` (up to `rows`, whose count may be on the device) into the
    /// accumulators, row `i` into group `gid[i]` (all into group 0 without `gid`).
    fn update(
        &self,
        stream: &DeviceStream,
        kernels: &Kernels,
        args: &[DeviceColumn],
        rows: &RowCount,
        gid: Option<&DeviceBuffer<u32>>,
        groups: usize,
    ) -> Result<()> {
        if self.seen.is_empty() || args.iter().any(|a| a.len() != rows.bound()) {
            return Err(SpateError::Internal {
                message: "aggregate arguments of another length than their rows".into(),
            });
        }
        let n = rows.bound();
        let mut a = Vec::with_capacity(args.len() * 5 + 6);
        for c in args {
            column_args(c, &mut a);
        }
        a.extend([
            rows.live_arg(),
            KernelArg::U64(n as u64),
            gid.into(),
            KernelArg::U64(groups as u64),
            (&self.acc).into(),
            (&self.seen).into(),
        ]);
        launch(stream, kernels.get("update")?, n, &a)?;
        if kernels.program.contains_key("second") {
            // The same arguments, without `seen`, once every first-pass word is final: the
            // low words of wide MIN/MAX, variance's m2.
            a.pop();
            launch(stream, kernels.get("second")?, n, &a)?;
        }
        Ok(())
    }
}

/// The aggregate output columns of `groups` groups, from their accumulators (no readback: the
/// null counts stay on the device until a host consumer asks for them).
fn finish_outputs(
    stream: &DeviceStream,
    kernels: &Kernels,
    plan: &AggPlan,
    schema: &SchemaRef,
    groups: usize,
    acc: &DeviceBuffer<u64>,
    seen: &DeviceBuffer<u32>,
) -> Result<Vec<DeviceColumn>> {
    let mut outputs = Vec::with_capacity(plan.spec.outputs.len());
    let mut a = vec![KernelArg::U64(groups as u64), acc.into(), seen.into()];
    for (j, (_, ty)) in plan.spec.outputs.iter().enumerate() {
        let field = schema.field(plan.spec.keys.len() + j);
        let width = match ty {
            DevType::Int { bits, .. } => usize::from(*bits) / 8,
            DevType::F32 => 4,
            DevType::F64 => 8,
            DevType::Dec { .. } => 16,
            DevType::Bool | DevType::Str => {
                return Err(SpateError::Internal {
                    message: format!("a GPU aggregate output is {}", field.data_type()),
                });
            }
        };
        let data = stream.alloc::<u8>((groups * width).max(16))?;
        // No bitmap for an output that cannot be null (COUNT); the kernel skips a null one.
        let valid = match plan.program.nullable.get(j) {
            Some(false) => None,
            _ => Some(stream.alloc::<u8>(bitmap_bytes(groups).max(4))?),
        };
        a.push((&data).into());
        a.push(valid.as_ref().into());
        outputs.push((data, valid, width, field.data_type().clone()));
    }
    launch(stream, kernels.get("finish")?, groups, &a)?;
    let mut columns = Vec::with_capacity(outputs.len());
    for (data, valid, width, data_type) in outputs {
        let validity = valid.map(|valid| DeviceValidity {
            bytes: DeviceBytes::new(valid),
            offset: 0,
        });
        columns.push(DeviceColumn::with_uncounted_nulls(
            data_type,
            groups,
            validity,
            DeviceValues::Fixed {
                bytes: DeviceBytes::new(data),
                width,
            },
        ));
    }
    Ok(columns)
}

impl DisplayAs for GpuAggregateExec {
    fn fmt_as(&self, t: DisplayFormatType, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        crate::exec::display_gpu(self.cpu.as_ref(), t, f)
    }
}

impl ExecutionPlan for GpuAggregateExec {
    fn name(&self) -> &str {
        "GpuAggregateExec"
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

    fn maintains_input_order(&self) -> Vec<bool> {
        vec![false]
    }

    fn cardinality_effect(&self) -> CardinalityEffect {
        CardinalityEffect::LowerEqual
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
}

impl GpuExec for GpuAggregateExec {
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
        let program = &self.plan.program;
        let kernels = Kernels {
            program: Kernels::compile(&gpu, &program.source, &program.entries).map_err(to_df)?,
            computed: match &self.plan.computed {
                Some(k) => Some(gpu.generated_kernel(&k.source, &k.entry).map_err(to_df)?),
                None => None,
            },
        };
        let kernels = Arc::new(kernels);
        let transfer = TransferMetrics::new(&self.metrics, partition);
        if self.plan.folds() {
            let input = device_input(self.cpu.input(), partition, &context, &stream, &transfer)?;
            return Ok(fold(
                input,
                stream,
                kernels,
                Arc::clone(&self.plan),
                self.schema(),
                BaselineMetrics::new(&self.metrics, partition),
            ));
        }
        let input = if self.plan.per_batch {
            per_batch_input(
                self.cpu.input(),
                partition,
                &context,
                &stream,
                &transfer,
                KeepsCounts::never(),
            )?
        } else {
            collected_input(
                self.cpu.input(),
                partition,
                &context,
                &stream,
                &transfer,
                KeepsCounts::never(),
            )?
        };
        let baseline = BaselineMetrics::new(&self.metrics, partition);
        let plan = Arc::clone(&self.plan);
        let schema = self.schema();
        let grouped = !plan.keys.is_empty();
        // Groups sorted by the order the output keeps. Per batch, that is still the order of
        // the whole output: over sorted input a later batch's groups come after an earlier's.
        let sorter = match &plan.order {
            Some(keys) => Some(Arc::new(Sorter::new(&gpu, keys.clone()).map_err(to_df)?)),
            None => None,
        };
        let ordered = move |stream: &DeviceStream, out: DeviceBatch| match &sorter {
            Some(sorter) => sorter.sort(stream, &out),
            None => Ok(out),
        };
        if plan.per_batch {
            // Whether any group came out: a partition that saw no rows still produces the
            // groups of its empty grouping sets, at the end.
            let produced = Arc::new(std::sync::atomic::AtomicBool::new(false));
            let (seen, last) = (Arc::clone(&produced), Arc::clone(&stream));
            let (last_kernels, last_plan, last_schema) =
                (Arc::clone(&kernels), Arc::clone(&plan), Arc::clone(&schema));
            let out = input.map(move |batch| {
                let batch = batch?;
                let _timer = baseline.elapsed_compute().timer();
                let out =
                    aggregate_batch(&stream, &kernels, &plan, &schema, &batch).map_err(to_df)?;
                let out = ordered(&stream, out).map_err(to_df)?;
                baseline.record_output(out.bound());
                if out.bound() > 0 {
                    seen.store(true, std::sync::atomic::Ordering::Relaxed);
                }
                Ok(out)
            });
            let empty_sets = futures::stream::once(async move {
                if produced.load(std::sync::atomic::Ordering::Relaxed) {
                    return Ok(None);
                }
                empty_sets_batch(&last, &last_kernels, &last_plan, &last_schema).map_err(to_df)
            })
            .filter_map(|b: DFResult<Option<DeviceBatch>>| futures::future::ready(b.transpose()));
            return Ok(Box::pin(
                out.chain(empty_sets)
                    .try_filter(|b| futures::future::ready(b.bound() > 0)),
            ));
        }
        let input_schema = self.cpu.input().schema();
        let once = futures::stream::once(async move {
            let batches: Vec<DeviceBatch> = input.try_collect().await?;
            let _timer = baseline.elapsed_compute().timer();
            let all = concat_device_batches(&stream, &input_schema, batches).map_err(to_df)?;
            let out = aggregate_batch(&stream, &kernels, &plan, &schema, &all).map_err(to_df)?;
            let out = match out.bound() {
                0 => empty_sets_batch(&stream, &kernels, &plan, &schema)
                    .map_err(to_df)?
                    .unwrap_or(out),
                _ => out,
            };
            let out = ordered(&stream, out).map_err(to_df)?;
            baseline.record_output(out.bound());
            Ok(out)
        });
        // Without group keys the one output row is always produced (COUNT of nothing is 0).
        Ok(Box::pin(once.try_filter(move |b| {
            futures::future::ready(!grouped || b.bound() > 0)
        })))
    }
}
