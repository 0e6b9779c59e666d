//! Planning a GPU aggregation: an `AggregateExec` mapped onto key and argument columns,
//! accumulator slots and outputs with DataFusion's result and state types (`analyze`), or why
//! it must stay on the CPU.

use std::sync::Arc;

use arrow::datatypes::DataType;
use datafusion::logical_expr::Operator;
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_expr::expressions::{BinaryExpr, CastExpr, Column, Literal};
use datafusion::physical_plan::aggregates::{
    AggregateExec, AggregateInputMode, AggregateMode, AggregateOutputMode,
};
use datafusion::physical_plan::{ExecutionPlan, InputOrderMode};

use super::codegen::{self, AggProgram, AggSpec, Out, Slot, SlotKind};
use spate_kernels::Stream as DeviceStream;

use crate::column::{DeviceBatch, DeviceColumn};
use crate::exec::check_input_types;
use crate::exec::hash_table::Kernels;
use crate::expr::{DevType, Unsupported, ValueKernel, evaluate_values, value_kernel};

/// Where a key or argument column comes from.
#[derive(Debug, Clone, Copy)]
pub(super) enum Operand {
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
pub(super) struct AggPlan {
    pub(super) keys: Vec<Operand>,
    pub(super) args: Vec<Operand>,
    pub(super) computed: Option<ValueKernel>,
    pub(super) spec: AggSpec,
    pub(super) program: AggProgram,
    /// Aggregate each input batch on its own (partial output).
    pub(super) per_batch: bool,
    /// The order the output keeps (its input is sorted on group keys): each output batch is
    /// sorted by it.
    pub(super) order: Option<Vec<crate::exec::sort::SortKey>>,
}

struct Operands<'a> {
    schema: &'a arrow::datatypes::Schema,
    computed: Vec<Arc<dyn PhysicalExpr>>,
}

impl Operands<'_> {
    fn add(&mut self, expr: &Arc<dyn PhysicalExpr>) -> Result<(Operand, DevType), Unsupported> {
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

fn dev_type(data_type: &DataType, what: &str) -> Result<DevType, Unsupported> {
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
fn grouping_sets(groups: &[Vec<bool>]) -> Result<(Vec<(u64, u64)>, DataType), Unsupported> {
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

pub(super) fn analyze(agg: &AggregateExec) -> Result<AggPlan, Unsupported> {
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
    for (index, f) in agg.aggr_expr().iter().enumerate() {
        let name = f.fun().name().to_ascii_lowercase();
        let label = f.name().to_string();
        let distinct = f.is_distinct();
        // FILTER (WHERE …): a boolean operand; the aggregate's slots fold only the rows where
        // it is TRUE. DataFusion filters the first phase only: a final aggregation keeps the
        // expression (over the first phase's input), and merges states whatever it says.
        let filter = match agg.filter_expr().get(index).cloned().flatten() {
            _ if !raw => None,
            None => None,
            Some(_) if distinct => {
                return Err(Unsupported(format!(
                    "`{label}`: a DISTINCT aggregate with FILTER does not run on the GPU yet"
                )));
            }
            Some(predicate) => {
                let (operand, ty) = operands.add(&predicate)?;
                if ty != DevType::Bool {
                    return Err(Unsupported(format!(
                        "`{label}`: FILTER (WHERE {predicate}) is not a boolean"
                    )));
                }
                args.push(operand);
                arg_types.push(ty);
                Some(args.len() - 1)
            }
        };
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
                .collect::<Result<Vec<_>, _>>()?
        };

        // The argument each of this aggregate's slots reads: one shared argument for raw
        // input, one state column per slot when merging.
        let mut slot_arg = |k: usize, ty: DevType| -> Result<usize, Unsupported> {
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
                    filter: None,
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
                    filter: None,
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
                    filter: None,
                });
            }
            "min" | "max" | "bool_and" | "bool_or" => {
                if name.starts_with("bool_") && arg_ty != DevType::Bool {
                    return Err(Unsupported(format!(
                        "`{label}` over {arg_type} does not run on the GPU"
                    )));
                }
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
                // Booleans order FALSE before TRUE: bool_and is their MIN, bool_or their MAX.
                let ok = match arg_ty {
                    DevType::Int { .. }
                    | DevType::F32
                    | DevType::F64
                    | DevType::Dec { .. }
                    | DevType::Bool => true,
                    DevType::Str => false,
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
                        ("min" | "bool_and", false) => SlotKind::Min,
                        ("min", true) => SlotKind::MinWide,
                        (_, false) => SlotKind::Max,
                        (_, true) => SlotKind::MaxWide,
                    },
                    arg: Some(arg),
                    filter: None,
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
                    filter: None,
                });
                slots.push(Slot {
                    kind: if out.is_some() {
                        SlotKind::SumDec
                    } else {
                        SlotKind::SumF64
                    },
                    arg: Some(sum_arg),
                    filter: None,
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
                        filter: None,
                    });
                    slots.push(Slot {
                        kind: SlotKind::SumF64,
                        arg: Some(x),
                        filter: None,
                    });
                    slots.push(Slot {
                        kind: SlotKind::M2 { count, sum },
                        arg: Some(x),
                        filter: None,
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
                        filter: None,
                    });
                    slots.push(Slot {
                        kind: SlotKind::SumF64,
                        arg: Some(args.len() - 1),
                        filter: None,
                    });
                    slots.push(Slot {
                        kind: SlotKind::M2Merge {
                            count,
                            sum,
                            mean,
                            m2,
                        },
                        arg: Some(n),
                        filter: None,
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
        for slot in &mut slots[first..] {
            slot.filter = filter;
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

impl AggPlan {
    /// Whether the whole input folds batch by batch into one row of accumulators, with no
    /// batch concatenated and no row count read back: an aggregation of every row (no group
    /// keys, not partial) whose slots fold in one pass. A second pass (wide MIN/MAX, variance)
    /// needs the final first-pass words, and COUNT(DISTINCT) a table over all rows, so those
    /// concatenate.
    pub(super) fn folds(&self) -> bool {
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

    /// The plan's program and the value kernel of its computed operands, compiled (once per
    /// session).
    pub(super) fn kernels(&self, gpu: &crate::device::GpuContext) -> crate::error::Result<Kernels> {
        Ok(Kernels {
            program: Kernels::compile(gpu, &self.program.source, &self.program.entries)?,
            computed: match &self.computed {
                Some(k) => Some(gpu.generated_kernel(&k.source, &k.entry)?),
                None => None,
            },
        })
    }

    /// The key and argument columns of `batch`: its own columns, or the value kernel's outputs
    /// over it.
    pub(super) fn operands(
        &self,
        stream: &DeviceStream,
        kernels: &Kernels,
        batch: &DeviceBatch,
    ) -> crate::error::Result<(Vec<DeviceColumn>, Vec<DeviceColumn>)> {
        let computed = match (&self.computed, &kernels.computed) {
            (Some(values), Some(kernel)) => evaluate_values(stream, kernel, values, batch)?,
            _ => Vec::new(),
        };
        let pick = |o: &Operand| match *o {
            Operand::Input(i) => batch.columns()[i].clone(),
            Operand::Computed(k) => computed[k].clone(),
        };
        Ok((
            self.keys.iter().map(pick).collect(),
            self.args.iter().map(pick).collect(),
        ))
    }
}
