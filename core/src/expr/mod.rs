//! `PhysicalExpr` → CUDA source: the expression JIT behind GPU filters.
//!
//! A predicate compiles to one kernel that evaluates it row by row and writes a byte per row:
//! 1 when the predicate is TRUE, 0 when it is FALSE or NULL (SQL's `WHERE` keeps only TRUE).
//! Every sub-expression yields a value and a null flag, so AND, OR and NOT follow SQL's
//! three-valued logic exactly.
//!
//! Semantics match DataFusion's CPU kernels:
//! - comparisons of floats use IEEE total order after normalising -0.0 to +0.0, as DataFusion
//!   does (NaN equals NaN and is greater than +inf; -0.0 equals +0.0);
//! - integer `+ - *` wrap on overflow, as DataFusion's do;
//! - decimals of precision up to 18 compare as scaled 64-bit integers (both sides share a
//!   scale after DataFusion's type coercion).
//!
//! Anything else (strings, casts, CASE, division, decimal arithmetic) is reported as
//! [`Unsupported`] with the expression named, and the operator stays on the CPU.

use std::fmt::Write as _;

use arrow::datatypes::{DataType, Schema};
use datafusion::common::ScalarValue;
use datafusion::logical_expr::Operator;
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_expr::expressions::{
    BinaryExpr, Column, IsNotNullExpr, IsNullExpr, Literal, NotExpr,
};

/// Why an expression cannot run on the GPU.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unsupported(pub String);

impl std::fmt::Display for Unsupported {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// Value types the generated code computes with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum DevType {
    Bool,
    Int {
        bits: u8,
        signed: bool,
    },
    F32,
    F64,
    /// A decimal of precision <= 18, held as its scaled value in an i64.
    Dec {
        scale: i8,
    },
}

impl DevType {
    fn of(data_type: &DataType) -> Option<(DevType, &'static str)> {
        use DataType::*;
        Some(match data_type {
            Boolean => (DevType::Bool, "bool"),
            Int8 => (
                DevType::Int {
                    bits: 8,
                    signed: true,
                },
                "i8",
            ),
            Int16 => (
                DevType::Int {
                    bits: 16,
                    signed: true,
                },
                "i16",
            ),
            Int32 | Date32 | Time32(_) => (
                DevType::Int {
                    bits: 32,
                    signed: true,
                },
                "i32",
            ),
            Int64 | Date64 | Time64(_) | Timestamp(_, _) | Duration(_) => (
                DevType::Int {
                    bits: 64,
                    signed: true,
                },
                "i64",
            ),
            UInt8 => (
                DevType::Int {
                    bits: 8,
                    signed: false,
                },
                "u8",
            ),
            UInt16 => (
                DevType::Int {
                    bits: 16,
                    signed: false,
                },
                "u16",
            ),
            UInt32 => (
                DevType::Int {
                    bits: 32,
                    signed: false,
                },
                "u32",
            ),
            UInt64 => (
                DevType::Int {
                    bits: 64,
                    signed: false,
                },
                "u64",
            ),
            Float32 => (DevType::F32, "f32"),
            Float64 => (DevType::F64, "f64"),
            Decimal128(p, s) if *p <= 18 => (DevType::Dec { scale: *s }, "i64"),
            _ => return None,
        })
    }

    fn c_type(self) -> &'static str {
        match self {
            DevType::Bool => "bool",
            DevType::Int { bits, signed } => match (bits, signed) {
                (8, true) => "i8",
                (16, true) => "i16",
                (32, true) => "i32",
                (64, true) => "i64",
                (8, false) => "u8",
                (16, false) => "u16",
                (32, false) => "u32",
                _ => "u64",
            },
            DevType::F32 => "f32",
            DevType::F64 => "f64",
            DevType::Dec { .. } => "i64",
        }
    }

    fn unsigned_twin(self) -> &'static str {
        match self {
            DevType::Int { bits: 8, .. } => "u8",
            DevType::Int { bits: 16, .. } => "u16",
            DevType::Int { bits: 32, .. } => "u32",
            _ => "u64",
        }
    }
}

/// A column the generated kernel reads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KernelInput {
    /// Index in the operator's input schema.
    pub index: usize,
    /// The column's Arrow type.
    pub data_type: DataType,
}

/// A compiled-to-source predicate: its CUDA source, entry point and the columns it reads.
#[derive(Debug, Clone)]
pub struct PredicateKernel {
    /// Full source, ready for `Device::compile_generated`.
    pub source: String,
    /// The entry point, unique per source (`spate_pred_<hash>`).
    pub entry: String,
    /// The columns, in the kernel's parameter order: each contributes
    /// `(const u8* data, u64 data_bit_offset, const u8* validity, u64 validity_offset)`, followed
    /// by `u64 rows, u8* out`.
    pub inputs: Vec<KernelInput>,
}

struct Operand {
    value: String,
    null: String,
    ty: DevType,
}

struct Gen<'a> {
    schema: &'a Schema,
    body: String,
    next: usize,
    inputs: Vec<KernelInput>,
}

impl Gen<'_> {
    fn var(&mut self) -> String {
        self.next += 1;
        format!("t{}", self.next)
    }

    fn input_slot(&mut self, index: usize, data_type: &DataType) -> usize {
        if let Some(k) = self.inputs.iter().position(|i| i.index == index) {
            return k;
        }
        self.inputs.push(KernelInput {
            index,
            data_type: data_type.clone(),
        });
        self.inputs.len() - 1
    }

    fn emit(&mut self, expr: &dyn PhysicalExpr) -> Result<Operand, Unsupported> {
        if let Some(c) = expr.downcast_ref::<Column>() {
            return self.column(c);
        }
        if let Some(l) = expr.downcast_ref::<Literal>() {
            return self.literal(l.value());
        }
        if let Some(b) = expr.downcast_ref::<BinaryExpr>() {
            return self.binary(b);
        }
        if let Some(n) = expr.downcast_ref::<NotExpr>() {
            let a = self.emit(n.arg().as_ref())?;
            if a.ty != DevType::Bool {
                return Err(Unsupported(format!("NOT of a non-boolean in `{expr}`")));
            }
            return Ok(Operand {
                value: format!("(!{})", a.value),
                null: a.null,
                ty: DevType::Bool,
            });
        }
        if let Some(n) = expr.downcast_ref::<IsNullExpr>() {
            let a = self.emit(n.arg().as_ref())?;
            return Ok(Operand {
                value: a.null,
                null: "false".into(),
                ty: DevType::Bool,
            });
        }
        if let Some(n) = expr.downcast_ref::<IsNotNullExpr>() {
            let a = self.emit(n.arg().as_ref())?;
            return Ok(Operand {
                value: format!("(!{})", a.null),
                null: "false".into(),
                ty: DevType::Bool,
            });
        }
        Err(Unsupported(format!(
            "expression `{expr}` is not supported on the GPU yet"
        )))
    }

    fn column(&mut self, c: &Column) -> Result<Operand, Unsupported> {
        let field = self.schema.fields().get(c.index()).ok_or_else(|| {
            Unsupported(format!("column {} is outside the input schema", c.index()))
        })?;
        let (ty, c_type) = DevType::of(field.data_type()).ok_or_else(|| {
            Unsupported(format!(
                "column `{}` has type {}, which GPU expressions do not support yet",
                field.name(),
                field.data_type()
            ))
        })?;
        let k = self.input_slot(c.index(), field.data_type());
        let (v, n) = (self.var(), self.var());
        let load = match (ty, field.data_type()) {
            (DevType::Bool, _) => format!("spate::bit_is_set(d{k}, b{k}, i)"),
            // Decimal128 values are 16 bytes; with precision <= 18 the low word is the value.
            (_, DataType::Decimal128(_, _)) => format!("((const i64*)d{k})[2 * i]"),
            _ => format!("((const {c_type}*)d{k})[i]"),
        };
        let _ = writeln!(
            self.body,
            "        const bool {n} = !spate::row_is_valid(v{k}, o{k}, i);\n        const {} {v} = {load};",
            ty.c_type()
        );
        Ok(Operand {
            value: v,
            null: n,
            ty,
        })
    }

    fn literal(&mut self, value: &ScalarValue) -> Result<Operand, Unsupported> {
        let (ty, _) = DevType::of(&value.data_type()).ok_or_else(|| {
            Unsupported(format!(
                "literal {value} of type {} is not supported on the GPU yet",
                value.data_type()
            ))
        })?;
        if value.is_null() {
            return Ok(Operand {
                value: format!("(({})0)", ty.c_type()),
                null: "true".into(),
                ty,
            });
        }
        let text = match value {
            ScalarValue::Boolean(Some(b)) => b.to_string(),
            ScalarValue::Int8(Some(v)) => format!("((i8){v})"),
            ScalarValue::Int16(Some(v)) => format!("((i16){v})"),
            ScalarValue::Int32(Some(v)) | ScalarValue::Date32(Some(v)) => {
                format!("((i32){}u)", *v as u32)
            }
            ScalarValue::Time32Second(Some(v)) | ScalarValue::Time32Millisecond(Some(v)) => {
                format!("((i32){}u)", *v as u32)
            }
            ScalarValue::UInt8(Some(v)) => format!("((u8){v}u)"),
            ScalarValue::UInt16(Some(v)) => format!("((u16){v}u)"),
            ScalarValue::UInt32(Some(v)) => format!("((u32){v}u)"),
            ScalarValue::UInt64(Some(v)) => format!("((u64){v}ull)"),
            ScalarValue::Float32(Some(v)) => format!("__uint_as_float({}u)", v.to_bits()),
            ScalarValue::Float64(Some(v)) => {
                format!("__longlong_as_double((i64){}ull)", v.to_bits())
            }
            ScalarValue::Decimal128(Some(v), _, _) => {
                let v = i64::try_from(*v).map_err(|_| {
                    Unsupported(format!("decimal literal {value} does not fit 64 bits"))
                })?;
                format!("((i64){}ull)", v as u64)
            }
            other => {
                let bits = match other {
                    ScalarValue::Int64(Some(v))
                    | ScalarValue::Date64(Some(v))
                    | ScalarValue::Time64Microsecond(Some(v))
                    | ScalarValue::Time64Nanosecond(Some(v))
                    | ScalarValue::TimestampSecond(Some(v), _)
                    | ScalarValue::TimestampMillisecond(Some(v), _)
                    | ScalarValue::TimestampMicrosecond(Some(v), _)
                    | ScalarValue::TimestampNanosecond(Some(v), _)
                    | ScalarValue::DurationSecond(Some(v))
                    | ScalarValue::DurationMillisecond(Some(v))
                    | ScalarValue::DurationMicrosecond(Some(v))
                    | ScalarValue::DurationNanosecond(Some(v)) => *v,
                    _ => {
                        return Err(Unsupported(format!(
                            "literal {value} is not supported on the GPU yet"
                        )));
                    }
                };
                format!("((i64){}ull)", bits as u64)
            }
        };
        Ok(Operand {
            value: text,
            null: "false".into(),
            ty,
        })
    }

    fn binary(&mut self, b: &BinaryExpr) -> Result<Operand, Unsupported> {
        let l = self.emit(b.left().as_ref())?;
        let r = self.emit(b.right().as_ref())?;
        let op = b.op();
        let (v, n) = (self.var(), self.var());
        match op {
            Operator::And | Operator::Or => {
                if l.ty != DevType::Bool || r.ty != DevType::Bool {
                    return Err(Unsupported(format!("{op} of non-booleans in `{b}`")));
                }
                // Three-valued logic: a known FALSE (AND) or TRUE (OR) decides regardless of
                // the other side's NULL.
                let decides = if *op == Operator::And { "!" } else { "" };
                let _ = writeln!(
                    self.body,
                    "        const bool {n}_l = !{ln} && {decides}{lv};\n        const bool {n}_r = !{rn} && {decides}{rv};\n        const bool {n} = ({ln} || {rn}) && !({n}_l || {n}_r);\n        const bool {v} = !{n} && ({expr});",
                    ln = l.null,
                    lv = l.value,
                    rn = r.null,
                    rv = r.value,
                    expr = if *op == Operator::And {
                        format!("{} && {}", l.value, r.value)
                    } else {
                        format!("{n}_l || {n}_r")
                    },
                );
                Ok(Operand {
                    value: v,
                    null: n,
                    ty: DevType::Bool,
                })
            }
            Operator::Eq
            | Operator::NotEq
            | Operator::Lt
            | Operator::LtEq
            | Operator::Gt
            | Operator::GtEq => {
                let same = l.ty == r.ty;
                if !same {
                    return Err(Unsupported(format!(
                        "comparison of different types in `{b}` ({:?} vs {:?})",
                        l.ty, r.ty
                    )));
                }
                let c_op = match op {
                    Operator::Eq => "==",
                    Operator::NotEq => "!=",
                    Operator::Lt => "<",
                    Operator::LtEq => "<=",
                    Operator::Gt => ">",
                    _ => ">=",
                };
                let (lv, rv) = match l.ty {
                    DevType::F32 | DevType::F64 => (
                        format!("spate::compare_key({})", l.value),
                        format!("spate::compare_key({})", r.value),
                    ),
                    _ => (l.value, r.value),
                };
                let _ = writeln!(
                    self.body,
                    "        const bool {n} = {} || {};\n        const bool {v} = {lv} {c_op} {rv};",
                    l.null, r.null
                );
                Ok(Operand {
                    value: v,
                    null: n,
                    ty: DevType::Bool,
                })
            }
            Operator::Plus | Operator::Minus | Operator::Multiply => {
                if l.ty != r.ty {
                    return Err(Unsupported(format!(
                        "arithmetic on different types in `{b}`"
                    )));
                }
                let c_op = match op {
                    Operator::Plus => "+",
                    Operator::Minus => "-",
                    _ => "*",
                };
                let expr = match l.ty {
                    DevType::Int { .. } => {
                        // Wrap like DataFusion: compute in the unsigned twin type.
                        let u = l.ty.unsigned_twin();
                        format!(
                            "({})(({u}){} {c_op} ({u}){})",
                            l.ty.c_type(),
                            l.value,
                            r.value
                        )
                    }
                    DevType::F32 | DevType::F64 => format!("{} {c_op} {}", l.value, r.value),
                    _ => {
                        return Err(Unsupported(format!(
                            "arithmetic on {:?} in `{b}` is not supported on the GPU yet",
                            l.ty
                        )));
                    }
                };
                let _ = writeln!(
                    self.body,
                    "        const bool {n} = {} || {};\n        const {} {v} = {expr};",
                    l.null,
                    r.null,
                    l.ty.c_type()
                );
                Ok(Operand {
                    value: v,
                    null: n,
                    ty: l.ty,
                })
            }
            other => Err(Unsupported(format!(
                "operator {other} in `{b}` is not supported on the GPU yet"
            ))),
        }
    }
}

/// Generates the predicate kernel for `predicate` over rows of `input_schema`.
pub fn predicate_kernel(
    predicate: &dyn PhysicalExpr,
    input_schema: &Schema,
) -> Result<PredicateKernel, Unsupported> {
    let mut g = Gen {
        schema: input_schema,
        body: String::new(),
        next: 0,
        inputs: Vec::new(),
    };
    let root = g.emit(predicate)?;
    if root.ty != DevType::Bool {
        return Err(Unsupported(format!(
            "predicate `{predicate}` is not boolean"
        )));
    }
    let mut params = String::new();
    for k in 0..g.inputs.len() {
        let _ = write!(
            params,
            "const u8* d{k}, u64 b{k}, const u8* v{k}, u64 o{k}, "
        );
    }
    let body = format!(
        "extern \"C\" __global__ void __launch_bounds__(SPATE_BLOCK_THREADS) ENTRY({params}u64 n, u8* out) {{\n    for (u64 i = spate::global_thread_index(); i < n; i += spate::grid_stride()) {{\n{}        out[i] = (!{} && {}) ? 1 : 0;\n    }}\n}}\nSPATE_EXPORT(ENTRY)\n",
        g.body, root.null, root.value
    );
    let hash = blake3_hex(&body);
    let entry = format!("spate_pred_{hash}");
    let source = format!(
        "// Generated by spate::expr from `{}`.\n#include \"common/prelude.cuh\"\n#include \"common/bitmap.cuh\"\n#include \"common/order.cuh\"\n\n{}",
        predicate.to_string().replace('\n', " "),
        body.replace("ENTRY", &entry)
    );
    Ok(PredicateKernel {
        source,
        entry,
        inputs: g.inputs,
    })
}

fn blake3_hex(text: &str) -> String {
    spate_kernels::compile::cache_key(&[text.as_bytes()])[..16].to_string()
}

#[cfg(test)]
mod tests;

/// Runs a compiled predicate over a device batch (the operator's input) and returns a byte
/// mask: 1 where the predicate is TRUE.
pub fn evaluate_predicate(
    stream: &spate_kernels::Stream,
    kernel: &spate_kernels::Kernel,
    predicate: &PredicateKernel,
    batch: &crate::column::DeviceBatch,
) -> crate::error::Result<spate_kernels::DeviceBuffer<u8>> {
    use crate::column::DeviceValues;
    use spate_kernels::{KernelArg, LaunchConfig};

    let n = batch.num_rows();
    let out = stream.alloc::<u8>(n)?;
    if n == 0 {
        return Ok(out);
    }
    let mut args = Vec::with_capacity(predicate.inputs.len() * 4 + 2);
    for input in &predicate.inputs {
        let column =
            batch
                .columns()
                .get(input.index)
                .ok_or_else(|| crate::error::SpateError::Internal {
                    message: format!("predicate reads column {} of a narrower batch", input.index),
                })?;
        let (data, bit_offset) = match column.values() {
            DeviceValues::Fixed { bytes, .. } => (bytes.as_slice().address(), 0),
            DeviceValues::Bits { bytes, offset } => (bytes.as_slice().address(), *offset),
            DeviceValues::Utf8 { .. } | DeviceValues::LargeUtf8 { .. } => {
                return Err(crate::error::SpateError::Internal {
                    message: "predicate kernels do not read strings".into(),
                });
            }
        };
        args.push(KernelArg::Ptr(data));
        args.push(KernelArg::U64(bit_offset as u64));
        match column.validity() {
            Some(v) => {
                args.push(KernelArg::Ptr(v.bytes.as_slice().address()));
                args.push(KernelArg::U64(v.offset as u64));
            }
            None => {
                args.push(KernelArg::null());
                args.push(KernelArg::U64(0));
            }
        }
    }
    args.push(KernelArg::U64(n as u64));
    args.push((&out).into());
    let cfg = LaunchConfig::blocks(stream.device().grid_stride_blocks(n));
    // SAFETY: the arguments follow `PredicateKernel::inputs`' documented layout; each column
    // holds `n` rows of the type the generated code reads (checked when it was generated), and
    // `out` holds `n` bytes.
    unsafe { stream.launch(kernel, cfg, &args)? };
    Ok(out)
}
