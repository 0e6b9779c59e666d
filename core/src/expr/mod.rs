//! `PhysicalExpr` → CUDA source: the expression JIT behind GPU filters, projections and
//! aggregate arguments.
//!
//! A predicate compiles to one kernel that evaluates it row by row and writes a byte per row:
//! 1 when the predicate is TRUE, 0 when it is FALSE or NULL (SQL's `WHERE` keeps only TRUE).
//! Every sub-expression yields a value and a null flag, so AND, OR and NOT follow SQL's
//! three-valued logic exactly.
//!
//! Semantics match DataFusion's CPU kernels:
//! - comparisons of floats use IEEE total order after normalising -0.0 to +0.0, as DataFusion
//!   does (NaN equals NaN and is greater than +inf; -0.0 equals +0.0);
//! - integer `+ - *` wrap on overflow, as DataFusion's do; integer `/` and `%` fail on a zero
//!   divisor ("Divide by zero error") and `MIN / -1` overflows, as Arrow's checked kernels;
//!   float `/` and `%` follow IEEE;
//! - decimals are scaled 128-bit integers: they compare at equal scales, and `+ - * / %`
//!   produce DataFusion's result precision and scale (division: scale `s1 + 4`, truncated
//!   toward zero, as Arrow's); shapes that may overflow i128 run checked and fail the query with
//!   Arrow's "Arithmetic overflow", a zero divisor with "Divide by zero error";
//! - casts: widening ones directly; narrowing integer casts, floats to integers (truncated),
//!   floats to decimals (rounded half away from zero), decimals to integers (truncated),
//!   decimal rescaling (half away from zero) and casts into a smaller precision are checked,
//!   failing as Arrow's casts do (or yielding NULL for a safe cast).
//!
//! Errors are raised through a kernel's `err` word only for rows the CPU would evaluate: a
//! CASE branch for the rows that take it, a COALESCE argument for the rows still NULL. On the
//! right side of AND/OR DataFusion evaluates a batch-dependent set of rows, so expressions that
//! can fail stay on the CPU there.
//!
//! Also: `[NOT] IN (list)`, `CASE WHEN` and `CASE x WHEN` (not on floats), `coalesce`,
//! `extract(year|month|day)` and `date ± interval` (months and days, the day clamped to the
//! month's end as Arrow does) on Date32, and on strings (read as offsets + bytes) comparisons,
//! `IN`, `LIKE` (`%`, `_` and backslash escapes), `character_length`, `octet_length` and `substr`
//! with literal positions; results are never strings yet.
//!
//! Anything else (other string functions, casts from and to strings) is reported
//! as [`Unsupported`] with the expression named, and the operator stays on the CPU.

use std::fmt::Write as _;

use arrow::datatypes::{DataType, Schema, TimeUnit};
use datafusion::common::ScalarValue;
use datafusion::logical_expr::Operator;
use datafusion::physical_expr::PhysicalExpr;
use std::sync::Arc;

use datafusion::logical_expr::physical_planning_context::{ScalarSubqueryResults, SubqueryIndex};
use datafusion::physical_expr::ScalarFunctionExpr;
use datafusion::physical_expr::expressions::{
    BinaryExpr, CaseExpr, CastExpr, Column, InListExpr, IsNotNullExpr, IsNullExpr, LikeExpr,
    Literal, NegativeExpr, NotExpr,
};
use datafusion::physical_expr::scalar_subquery::ScalarSubqueryExpr;

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
pub(crate) enum DevType {
    Bool,
    Int {
        bits: u8,
        signed: bool,
    },
    F32,
    F64,
    /// A Decimal128, held as its scaled value in an i128.
    Dec {
        precision: u8,
        scale: i8,
    },
    /// A string: a byte pointer, with its length in a companion `<name>_n` variable.
    Str,
}

impl DevType {
    pub(crate) fn of(data_type: &DataType) -> Option<DevType> {
        use DataType::*;
        Some(match data_type {
            Boolean => DevType::Bool,
            Int8 => DevType::Int {
                bits: 8,
                signed: true,
            },
            Int16 => DevType::Int {
                bits: 16,
                signed: true,
            },
            Int32 | Date32 | Time32(_) => DevType::Int {
                bits: 32,
                signed: true,
            },
            Int64 | Date64 | Time64(_) | Timestamp(_, _) | Duration(_) => DevType::Int {
                bits: 64,
                signed: true,
            },
            UInt8 => DevType::Int {
                bits: 8,
                signed: false,
            },
            UInt16 => DevType::Int {
                bits: 16,
                signed: false,
            },
            UInt32 => DevType::Int {
                bits: 32,
                signed: false,
            },
            UInt64 => DevType::Int {
                bits: 64,
                signed: false,
            },
            Float32 => DevType::F32,
            Float64 => DevType::F64,
            Decimal128(p, s) => DevType::Dec {
                precision: *p,
                scale: *s,
            },
            Utf8 | LargeUtf8 | Utf8View => DevType::Str,
            _ => return None,
        })
    }

    pub(crate) fn c_type(self) -> &'static str {
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
            DevType::Dec { .. } => "i128",
            DevType::Str => "const u8*",
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

    /// Whether two operand types can be compared directly.
    fn comparable(self, other: DevType) -> bool {
        match (self, other) {
            (DevType::Dec { scale: a, .. }, DevType::Dec { scale: b, .. }) => a == b,
            (a, b) => a == b,
        }
    }

    /// Decimal digits an integer type can hold.
    fn int_digits(self) -> Option<u8> {
        match self {
            DevType::Int { bits: 8, .. } => Some(3),
            DevType::Int { bits: 16, .. } => Some(5),
            DevType::Int { bits: 32, .. } => Some(10),
            DevType::Int {
                bits: 64,
                signed: true,
            } => Some(19),
            DevType::Int {
                bits: 64,
                signed: false,
            } => Some(20),
            _ => None,
        }
    }
}

/// `10^k` as an i128 literal.
fn pow10(k: i8) -> String {
    format!(
        "((i128){}ull",
        10u64.pow(u32::from(k.unsigned_abs()).min(19))
    ) + &if k > 19 {
        format!(
            " * (i128){}ull)",
            10u64.pow(u32::from(k.unsigned_abs()) - 19)
        )
    } else {
        ")".to_string()
    }
}

/// An i128 literal.
fn i128_literal(v: i128) -> String {
    if let Ok(small) = i64::try_from(v) {
        format!("((i128)(i64){}ull)", small as u64)
    } else {
        let hi = (v >> 64) as i64;
        let lo = v as u64;
        format!("((((i128)(i64){}ull) << 64) | (i128){lo}ull)", hi as u64)
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

/// A value known only when the query runs, passed to the kernel at each launch: today the
/// result of an uncorrelated scalar subquery (`ScalarSubqueryExpr`), which DataFusion's
/// `ScalarSubqueryExec` computes before the operators that read it start. Passing it as a
/// parameter keeps the generated source, and so the compiled kernel, the same whatever the
/// subquery returns.
#[derive(Debug, Clone)]
pub struct RuntimeScalar {
    results: ScalarSubqueryResults,
    index: SubqueryIndex,
    data_type: DataType,
}

impl RuntimeScalar {
    /// The value's `(low, high, null)` kernel parameters: the bits of the value (a Decimal128
    /// uses both words), and 1 for NULL.
    fn launch_args(&self) -> crate::error::Result<[spate_kernels::KernelArg; 3]> {
        use spate_kernels::KernelArg;
        let internal = |message: String| crate::error::SpateError::Internal { message };
        let value = self.results.get(self.index).ok_or_else(|| {
            internal("a GPU kernel ran before the scalar subquery it reads".into())
        })?;
        if value.data_type() != self.data_type {
            return Err(internal(format!(
                "scalar subquery returned {}, planned as {}",
                value.data_type(),
                self.data_type
            )));
        }
        if value.is_null() {
            return Ok([KernelArg::U64(0), KernelArg::U64(0), KernelArg::U32(1)]);
        }
        let (lo, hi) = scalar_bits(&value)
            .ok_or_else(|| internal(format!("scalar subquery value {value} on the GPU")))?;
        Ok([KernelArg::U64(lo), KernelArg::U64(hi), KernelArg::U32(0)])
    }
}

/// The bits of a non-null fixed-width scalar as two 64-bit words (low, high); `None` for
/// types the generated code does not take as a parameter (strings).
fn scalar_bits(value: &ScalarValue) -> Option<(u64, u64)> {
    use ScalarValue::*;
    let signed = |v: i64| Some((v as u64, if v < 0 { u64::MAX } else { 0 }));
    match value {
        Boolean(Some(b)) => Some((u64::from(*b), 0)),
        Int8(Some(v)) => signed(i64::from(*v)),
        Int16(Some(v)) => signed(i64::from(*v)),
        Int32(Some(v)) | Date32(Some(v)) | Time32Second(Some(v)) | Time32Millisecond(Some(v)) => {
            signed(i64::from(*v))
        }
        Int64(Some(v))
        | Date64(Some(v))
        | Time64Microsecond(Some(v))
        | Time64Nanosecond(Some(v))
        | TimestampSecond(Some(v), _)
        | TimestampMillisecond(Some(v), _)
        | TimestampMicrosecond(Some(v), _)
        | TimestampNanosecond(Some(v), _)
        | DurationSecond(Some(v))
        | DurationMillisecond(Some(v))
        | DurationMicrosecond(Some(v))
        | DurationNanosecond(Some(v)) => signed(*v),
        UInt8(Some(v)) => Some((u64::from(*v), 0)),
        UInt16(Some(v)) => Some((u64::from(*v), 0)),
        UInt32(Some(v)) => Some((u64::from(*v), 0)),
        UInt64(Some(v)) => Some((*v, 0)),
        Float32(Some(v)) => Some((u64::from(v.to_bits()), 0)),
        Float64(Some(v)) => Some((v.to_bits(), 0)),
        Decimal128(Some(v), _, _) => Some((*v as u64, (*v >> 64) as u64)),
        _ => None,
    }
}

/// A compiled-to-source predicate: its CUDA source, entry point and the columns it reads.
#[derive(Debug, Clone)]
pub struct PredicateKernel {
    /// Full source, ready for `Device::compile_generated`.
    pub source: String,
    /// The entry point, unique per source (`spate_pred_<hash>`).
    pub entry: String,
    /// The columns, in the kernel's parameter order: each contributes
    /// `(const u8* data, const u8* extra, u64 aux, const u8* validity, u64 validity_offset)`
    /// (for strings `data` holds the offsets, `extra` the bytes and `aux` the offset width; for
    /// booleans `aux` is the bit offset), then `(u64 low, u64 high, u32 null)` per runtime
    /// scalar, followed by `u64 rows, u8* out` and, when `checks` is not empty, `u32* err`.
    pub inputs: Vec<KernelInput>,
    /// Values read at launch (scalar subquery results), in parameter order.
    pub scalars: Vec<RuntimeScalar>,
    /// What can fail (overflow, division by zero, a cast): an `ErrorFlag` bit and the message
    /// the query fails with when the kernel sets it in `*err`.
    pub checks: Vec<(u32, String)>,
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
    /// Runtime scalars the kernel takes as parameters (`sa<k>`, `sb<k>`, `sn<k>`).
    scalars: Vec<RuntimeScalar>,
    /// How deep the expression being generated sits on the right side of AND/OR, which
    /// DataFusion evaluates for all rows, some rows or none depending on the whole batch: an
    /// error raised there cannot match the CPU's row for row.
    conditional: usize,
    /// Conditions (C expressions) under which the CPU evaluates the code being generated: a
    /// CASE branch only for the rows that take it, a COALESCE argument only for the rows whose
    /// earlier arguments are NULL. Errors are raised only where all of them hold.
    guards: Vec<String>,
    /// What can fail (overflow, division by zero, casts), reported through `err`: the
    /// `ErrorFlag` bit and the message.
    checks: Vec<(u32, String)>,
}

impl Gen<'_> {
    /// Emits code that raises error `code` (an `ErrorFlag` bit) when `failed` holds in a row
    /// the CPU evaluates `expr` for; the query then fails with `message`.
    fn raise(
        &mut self,
        failed: &str,
        code: u32,
        expr: &dyn std::fmt::Display,
        message: String,
    ) -> Result<(), Unsupported> {
        if self.conditional > 0 {
            return Err(Unsupported(format!(
                "`{expr}` can fail, and inside AND/OR the CPU evaluates it for a batch-dependent \
                 set of rows"
            )));
        }
        let mut condition = failed.to_string();
        for g in &self.guards {
            condition = format!("{g} && {condition}");
        }
        let _ = writeln!(
            self.body,
            "        if ({condition}) atomicOr(err, {code}u);"
        );
        if !self.checks.iter().any(|(c, m)| *c == code && *m == message) {
            self.checks.push((code, message));
        }
        Ok(())
    }

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
        if let Some(q) = expr.downcast_ref::<ScalarSubqueryExpr>() {
            return self.scalar_subquery(q);
        }
        if let Some(b) = expr.downcast_ref::<BinaryExpr>() {
            return self.binary(b);
        }
        if let Some(c) = expr.downcast_ref::<CastExpr>() {
            return self.cast(c);
        }
        if let Some(l) = expr.downcast_ref::<LikeExpr>() {
            return self.like(l);
        }
        if let Some(l) = expr.downcast_ref::<InListExpr>() {
            return self.in_list(l);
        }
        if let Some(c) = expr.downcast_ref::<CaseExpr>() {
            return self.case(c);
        }
        if let Some(f) = expr.downcast_ref::<ScalarFunctionExpr>() {
            if f.name() == "coalesce" {
                return self.coalesce(f.args());
            }
            if f.name() == "date_part" {
                return self.date_part(f);
            }
            if matches!(f.name(), "character_length" | "octet_length") {
                return self.length(f);
            }
            if matches!(f.name(), "substr" | "substring") {
                return self.substr(f);
            }
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
        if let Some(neg) = expr.downcast_ref::<NegativeExpr>() {
            // Arrow's neg_wrapping: integers and decimals wrap (-MIN == MIN), floats flip the
            // sign bit (NaN included).
            let a = self.emit(neg.arg().as_ref())?;
            let value = match a.ty {
                DevType::Int { signed: true, .. } => format!(
                    "(({})(({})0 - ({}){}))",
                    a.ty.c_type(),
                    a.ty.unsigned_twin(),
                    a.ty.unsigned_twin(),
                    a.value
                ),
                DevType::Dec { .. } => format!("((i128)((u128i)0 - (u128i){}))", a.value),
                DevType::F32 | DevType::F64 => format!("(-{})", a.value),
                _ => {
                    return Err(Unsupported(format!(
                        "negation of {:?} in `{expr}` is not supported on the GPU yet",
                        a.ty
                    )));
                }
            };
            let v = self.var();
            let _ = writeln!(self.body, "        const {} {v} = {value};", a.ty.c_type());
            return Ok(Operand {
                value: v,
                null: a.null,
                ty: a.ty,
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
        let ty = DevType::of(field.data_type()).ok_or_else(|| {
            Unsupported(format!(
                "column `{}` has type {}, which GPU expressions do not support yet",
                field.name(),
                field.data_type()
            ))
        })?;
        let k = self.input_slot(c.index(), field.data_type());
        let (v, n) = (self.var(), self.var());
        if ty == DevType::Str {
            // d = offsets (b = their width in bytes), e = the bytes.
            let _ = writeln!(
                self.body,
                "        const bool {n} = !spate::row_is_valid(v{k}, o{k}, i);\n        const u64 {v}_s = spate::string_offset(d{k}, b{k}, i);\n        const u64 {v}_n = spate::string_offset(d{k}, b{k}, i + 1) - {v}_s;\n        const u8* {v} = e{k} + {v}_s;"
            );
            return Ok(Operand {
                value: v,
                null: n,
                ty,
            });
        }
        let load = match ty {
            DevType::Bool => format!("spate::bit_is_set(d{k}, b{k}, i)"),
            _ => format!("((const {}*)d{k})[i]", ty.c_type()),
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

    /// A scalar subquery's result, read from the kernel's parameters.
    fn scalar_subquery(&mut self, q: &ScalarSubqueryExpr) -> Result<Operand, Unsupported> {
        let data_type = q
            .return_field(self.schema)
            .map_err(|e| Unsupported(format!("`{q}`: {e}")))?
            .data_type()
            .clone();
        let ty = DevType::of(&data_type)
            .filter(|t| *t != DevType::Str)
            .ok_or_else(|| {
                Unsupported(format!(
                    "a scalar subquery of type {data_type} is not supported on the GPU yet"
                ))
            })?;
        let k = self.scalars.len();
        #[allow(
            deprecated,
            reason = "the index is the only handle on the subquery's result; the accessor is                       deprecated only for protobuf serialization"
        )]
        let index = q.index();
        self.scalars.push(RuntimeScalar {
            results: q.results().clone(),
            index,
            data_type,
        });
        let value = match ty {
            DevType::Bool => format!("(sa{k} != 0ull)"),
            DevType::F32 => format!("__uint_as_float((u32)sa{k})"),
            DevType::F64 => format!("__longlong_as_double((i64)sa{k})"),
            DevType::Dec { .. } => format!("((((i128)(i64)sb{k}) << 64) | (i128)sa{k})"),
            _ => format!("(({})sa{k})", ty.c_type()),
        };
        Ok(Operand {
            value,
            null: format!("(sn{k} != 0u)"),
            ty,
        })
    }

    fn literal(&mut self, value: &ScalarValue) -> Result<Operand, Unsupported> {
        let ty = DevType::of(&value.data_type()).ok_or_else(|| {
            Unsupported(format!(
                "literal {value} of type {} is not supported on the GPU yet",
                value.data_type()
            ))
        })?;
        if value.is_null() {
            if ty == DevType::Str {
                // A string operand is a variable with a length beside it.
                let empty = self.string_literal(b"");
                return Ok(Operand {
                    null: "true".into(),
                    ..empty
                });
            }
            return Ok(Operand {
                value: format!("(({})0)", ty.c_type()),
                null: "true".into(),
                ty,
            });
        }
        if let ScalarValue::Utf8(Some(text))
        | ScalarValue::LargeUtf8(Some(text))
        | ScalarValue::Utf8View(Some(text)) = value
        {
            return Ok(self.string_literal(text.as_bytes()));
        }
        let (lo, hi) = scalar_bits(value).ok_or_else(|| {
            Unsupported(format!("literal {value} is not supported on the GPU yet"))
        })?;
        let text = match ty {
            DevType::Bool => (lo != 0).to_string(),
            DevType::F32 => format!("__uint_as_float({lo}u)"),
            DevType::F64 => format!("__longlong_as_double((i64){lo}ull)"),
            DevType::Dec { .. } => i128_literal((i128::from(hi as i64) << 64) | i128::from(lo)),
            _ => format!("(({}){lo}ull)", ty.c_type()),
        };
        Ok(Operand {
            value: text,
            null: "false".into(),
            ty,
        })
    }

    /// A string literal as a local byte array.
    fn string_literal(&mut self, bytes: &[u8]) -> Operand {
        let v = self.var();
        let items: Vec<String> = bytes.iter().map(u8::to_string).collect();
        let items = if items.is_empty() {
            "0".to_string()
        } else {
            items.join(", ")
        };
        let _ = writeln!(
            self.body,
            "        const u8 {v}_lit[] = {{{items}}};\n        const u8* {v} = {v}_lit;\n        const u64 {v}_n = {};",
            bytes.len()
        );
        Operand {
            value: v,
            null: "false".into(),
            ty: DevType::Str,
        }
    }

    /// `s [NOT] LIKE 'pattern'` for patterns made of literal text and `%` (no `_`, no escapes,
    /// case-sensitive): anchored first and last segments, the middle ones found in order.
    /// LIKE with `_` or escapes: the pattern becomes tokens for `spate::like_match`. As
    /// Arrow's LIKE: `\\x` is a literal `x` (a trailing `\\` is itself), `_` one character, `%`
    /// any run of characters.
    fn like_tokens(&mut self, l: &LikeExpr, a: &Operand, pattern: &str) -> Operand {
        let (mut kinds, mut bytes) = (Vec::new(), Vec::new());
        let mut chars = pattern.chars();
        while let Some(ch) = chars.next() {
            let (kind, literal) = match ch {
                '%' => (2u8, None),
                '_' => (1, None),
                '\\' => (0, Some(chars.next().unwrap_or('\\'))),
                other => (0, Some(other)),
            };
            match literal {
                None => {
                    kinds.push(kind);
                    bytes.push(0);
                }
                Some(c) => {
                    let mut buf = [0u8; 4];
                    for b in c.encode_utf8(&mut buf).bytes() {
                        kinds.push(0);
                        bytes.push(b);
                    }
                }
            }
        }
        let k = self.string_literal(&kinds);
        let b = self.string_literal(&bytes);
        let (v, n) = (self.var(), self.var());
        let _ = writeln!(
            self.body,
            "        const bool {n} = {};\n        const bool {v} = {}spate::like_match({a}, {a}_n, {k}, {b}, {});",
            a.null,
            if l.negated() { "!" } else { "" },
            kinds.len(),
            a = a.value,
            k = k.value,
            b = b.value,
        );
        Operand {
            value: v,
            null: n,
            ty: DevType::Bool,
        }
    }

    fn like(&mut self, l: &LikeExpr) -> Result<Operand, Unsupported> {
        let unsupported =
            |why: &str| Unsupported(format!("`{l}`: {why} is not supported on the GPU yet"));
        if l.case_insensitive() {
            return Err(unsupported("ILIKE"));
        }
        let pattern = match l.pattern().downcast_ref::<Literal>().map(Literal::value) {
            Some(
                ScalarValue::Utf8(Some(p))
                | ScalarValue::LargeUtf8(Some(p))
                | ScalarValue::Utf8View(Some(p)),
            ) => p.clone(),
            _ => return Err(unsupported("a LIKE pattern that is not a string literal")),
        };
        let a = self.emit(l.expr().as_ref())?;
        if a.ty != DevType::Str {
            return Err(unsupported("LIKE on a non-string"));
        }
        if pattern.contains('_') || pattern.contains('\\') {
            return Ok(self.like_tokens(l, &a, &pattern));
        }
        let segments: Vec<&str> = pattern.split('%').collect();
        let (v, n) = (self.var(), self.var());
        let _ = writeln!(
            self.body,
            "        bool {v}_ok = true;\n        u64 {v}_pos = 0;"
        );
        let last = segments.len() - 1;
        for (k, seg) in segments.iter().enumerate() {
            if seg.is_empty() {
                continue;
            }
            let lit = self.string_literal(seg.as_bytes());
            let (sp, sn) = (lit.value.clone(), format!("{}_n", lit.value));
            let (ap, an) = (a.value.clone(), format!("{}_n", a.value));
            if segments.len() == 1 {
                let _ = writeln!(
                    self.body,
                    "        {v}_ok = spate::str_eq({ap}, {an}, {sp}, {sn});"
                );
            } else if k == 0 {
                let _ = writeln!(
                    self.body,
                    "        {v}_ok = {v}_ok && spate::str_starts({ap}, {an}, {sp}, {sn});\n        {v}_pos = {sn};"
                );
            } else if k == last {
                let _ = writeln!(
                    self.body,
                    "        {v}_ok = {v}_ok && {an} >= {v}_pos + {sn} && spate::str_ends({ap}, {an}, {sp}, {sn});"
                );
            } else {
                let _ = writeln!(
                    self.body,
                    "        {{ const i64 f = {v}_ok ? spate::str_find({ap}, {an}, {v}_pos, {sp}, {sn}) : -1; {v}_ok = f >= 0; if ({v}_ok) {v}_pos = (u64)f + {sn}; }}"
                );
            }
        }
        let _ = writeln!(
            self.body,
            "        const bool {n} = {};\n        const bool {v} = {}{v}_ok;",
            a.null,
            if l.negated() { "!" } else { "" }
        );
        Ok(Operand {
            value: v,
            null: n,
            ty: DevType::Bool,
        })
    }

    /// `(precision, scale)` of both decimal operands and of DataFusion's result type for `b`,
    /// and that type.
    #[allow(clippy::type_complexity)]
    fn decimal_shapes(
        &self,
        b: &BinaryExpr,
        l: &Operand,
        r: &Operand,
    ) -> Result<((u8, i8), (u8, i8), (u8, i8), DataType), Unsupported> {
        let unsupported =
            |why: &str| Unsupported(format!("`{b}`: {why} on the GPU is not supported yet"));
        let (
            DevType::Dec {
                precision: p1,
                scale: s1,
            },
            DevType::Dec {
                precision: p2,
                scale: s2,
            },
        ) = (l.ty, r.ty)
        else {
            return Err(unsupported("mixing decimals with other types"));
        };
        let result = b
            .data_type(self.schema)
            .map_err(|e| Unsupported(format!("`{b}`: {e}")))?;
        let Some(DevType::Dec {
            precision: p,
            scale: s,
        }) = DevType::of(&result)
        else {
            return Err(unsupported("a non-decimal result"));
        };
        Ok(((p1, s1), (p2, s2), (p, s), result))
    }

    /// Decimal `+ - *` with DataFusion's result type: directly when no value can overflow
    /// i128, else checked (an overflow fails the query as the CPU's checked kernels do).
    fn decimal_arithmetic(
        &mut self,
        b: &BinaryExpr,
        op: &Operator,
        l: Operand,
        r: Operand,
        v: String,
        n: String,
    ) -> Result<Operand, Unsupported> {
        let unsupported =
            |why: &str| Unsupported(format!("`{b}`: {why} on the GPU is not supported yet"));
        let ((p1, s1), (p2, s2), (p, s), result) = self.decimal_shapes(b, &l, &r)?;
        let (p1, p2, p) = (i32::from(p1), i32::from(p2), i32::from(p));
        let (s1i, s2i, si) = (i32::from(s1), i32::from(s2), i32::from(s));
        // Shapes that may overflow i128 run checked: an overflow in a row that is not NULL
        // fails the query as the CPU's checked kernels do. The CPU may skip rows of a
        // conditional branch, so there they stay on the CPU.
        let checked = match op {
            Operator::Plus | Operator::Minus => {
                s1 == s && s2 == s && s >= 0 && (p1 - s1i).max(p2 - s2i) + si + 1 > 38
            }
            Operator::Multiply => si == s1i + s2i && s1 >= 0 && s2 >= 0 && p1 + p2 > 38,
            _ => false,
        };
        if checked {
            let function = match op {
                Operator::Plus => "add_overflows",
                Operator::Minus => "sub_overflows",
                _ => "mul_overflows",
            };
            let _ = writeln!(
                self.body,
                "        const bool {n} = {ln} || {rn};\n        i128 {v};\n        const bool {v}_ovf = spate::{function}({lv}, {rv}, &{v});",
                ln = l.null,
                rn = r.null,
                lv = l.value,
                rv = r.value,
            );
            self.raise(
                &format!("!{n} && {v}_ovf"),
                ErrorFlag::OVERFLOW,
                b,
                format!("Overflow happened on: {b} (on the GPU)"),
            )?;
            return Ok(Operand {
                value: v,
                null: n,
                ty: DevType::of(&result).unwrap_or(l.ty),
            });
        }
        let expr = match op {
            Operator::Plus | Operator::Minus => {
                if si != s1i.max(s2i) || (p1 - s1i).max(p2 - s2i) + si + 1 > 38 || s1 < 0 || s2 < 0
                {
                    return Err(unsupported("this decimal precision and scale"));
                }
                let c_op = if *op == Operator::Plus { "+" } else { "-" };
                format!(
                    "({} * {}) {c_op} ({} * {})",
                    l.value,
                    pow10(s - s1),
                    r.value,
                    pow10(s - s2)
                )
            }
            _ => {
                if si != s1i + s2i || p1 + p2 > 38 {
                    return Err(unsupported("this decimal precision and scale"));
                }
                format!("{} * {}", l.value, r.value)
            }
        };
        let _ = p;
        let _ = writeln!(
            self.body,
            "        const bool {n} = {} || {};\n        const i128 {v} = {expr};",
            l.null, r.null
        );
        Ok(Operand {
            value: v,
            null: n,
            ty: DevType::of(&result).unwrap_or(l.ty),
        })
    }

    /// Casts that cannot fail or lose information: integer widening, integers and f32 to
    /// floats, integers to decimals with room for every value, and decimal rescaling upwards.
    fn cast(&mut self, c: &CastExpr) -> Result<Operand, Unsupported> {
        let from_type = c
            .expr()
            .data_type(self.schema)
            .map_err(|e| Unsupported(format!("`{c}`: {e}")))?;
        if let (DataType::Timestamp(from_unit, from_zone), DataType::Timestamp(to_unit, to_zone)) =
            (&from_type, c.cast_type())
            && from_unit != to_unit
            && !(from_zone.is_none() && to_zone.is_some())
        {
            let a = self.emit(c.expr().as_ref())?;
            return self.timestamp_unit_cast(c, a, *from_unit, *to_unit);
        }
        if !bit_preserving_temporal_cast(&from_type, c.cast_type()) {
            return Err(Unsupported(format!(
                "cast from {from_type} to {} in `{c}` is not supported on the GPU yet",
                c.cast_type()
            )));
        }
        let a = self.emit(c.expr().as_ref())?;
        let to = DevType::of(c.cast_type()).ok_or_else(|| {
            Unsupported(format!(
                "cast to {} is not supported on the GPU yet",
                c.cast_type()
            ))
        })?;
        let unsupported = || {
            Unsupported(format!(
                "cast from {:?} to {} in `{c}` is not supported on the GPU yet",
                a.ty,
                c.cast_type()
            ))
        };
        if a.ty == DevType::Str || to == DevType::Str {
            // Between string types (Utf8 / Utf8View / LargeUtf8) the bytes are the same.
            if a.ty == to {
                return Ok(a);
            }
            return Err(unsupported());
        }
        let value = match (a.ty, to) {
            (x, y) if x == y => a.value.clone(),
            (
                DevType::Int {
                    bits: b1,
                    signed: s1,
                },
                DevType::Int {
                    bits: b2,
                    signed: s2,
                },
            ) if b2 > b1 && (s1 == s2 || (!s1 && s2)) || (b2 == b1 && s1 == s2) => {
                format!("(({}){})", to.c_type(), a.value)
            }
            (DevType::Int { .. } | DevType::F32, DevType::F64)
            | (DevType::Int { .. }, DevType::F32) => format!("(({}){})", to.c_type(), a.value),
            (DevType::Int { .. }, DevType::Dec { precision, scale })
                if scale >= 0
                    && a.ty.int_digits().is_some_and(|d| {
                        i32::from(d) + i32::from(scale) <= i32::from(precision)
                    }) =>
            {
                format!("((i128){} * {})", a.value, pow10(scale))
            }
            // Arrow's cast: the unscaled value as a float, divided by 10^scale as a float.
            (DevType::Dec { scale, .. }, DevType::F64) if (0..=22).contains(&scale) => {
                let divisor = 10f64.powi(i32::from(scale));
                format!(
                    "(({})((f64){} / __longlong_as_double((i64){}ull)))",
                    to.c_type(),
                    a.value,
                    divisor.to_bits()
                )
            }
            (
                DevType::Dec {
                    precision: p1,
                    scale: s1,
                },
                DevType::Dec {
                    precision: p2,
                    scale: s2,
                },
            ) if s2 >= s1 && i32::from(p2) - i32::from(s2) >= i32::from(p1) - i32::from(s1) => {
                format!("({} * {})", a.value, pow10(s2 - s1))
            }
            _ => {
                let reason = unsupported();
                return self.checked_cast(c, a, to)?.ok_or(reason);
            }
        };
        let v = self.var();
        let _ = writeln!(self.body, "        const {} {v} = {value};", to.c_type());
        Ok(Operand {
            value: v,
            null: a.null,
            ty: to,
        })
    }

    /// `x [NOT] IN (list)`: TRUE on a match; else NULL if `x` or any list value is NULL; else
    /// FALSE. NOT IN negates that, NULL staying NULL.
    fn in_list(&mut self, l: &InListExpr) -> Result<Operand, Unsupported> {
        let x = self.emit(l.expr().as_ref())?;
        let mut matched = Vec::new();
        let mut nulls = vec![x.null.clone()];
        for item in l.list() {
            let o = self.emit(item.as_ref())?;
            if !x.ty.comparable(o.ty) || x.ty == DevType::Bool {
                return Err(Unsupported(format!(
                    "IN list of mixed or boolean types in `{l}` is not supported on the GPU yet"
                )));
            }
            let eq = match x.ty {
                DevType::Str => format!(
                    "(!{} && spate::str_eq({}, {}_n, {}, {}_n))",
                    o.null, x.value, x.value, o.value, o.value
                ),
                // DataFusion matches a list of float literals through a set, by total-order
                // equality: -0.0 does not match 0.0 there (unlike `=`), NaN matches NaN.
                DevType::F32 | DevType::F64 => {
                    if item.downcast_ref::<Literal>().is_none() {
                        return Err(Unsupported(format!(
                            "a float IN list with non-literal values in `{l}` is not supported \
                             on the GPU yet"
                        )));
                    }
                    format!(
                        "(!{} && spate::total_order({}) == spate::total_order({}))",
                        o.null, x.value, o.value
                    )
                }
                _ => format!("(!{} && {} == {})", o.null, x.value, o.value),
            };
            matched.push(eq);
            nulls.push(o.null);
        }
        let (v, n) = (self.var(), self.var());
        let any = if matched.is_empty() {
            "false".to_string()
        } else {
            matched.join(" || ")
        };
        let _ = writeln!(
            self.body,
            "        const bool {v}_m = !{} && ({any});\n        const bool {n} = !{v}_m && ({});\n        const bool {v} = {}{v}_m;",
            x.null,
            nulls.join(" || "),
            if l.negated() { "!" } else { "" }
        );
        Ok(Operand {
            value: v,
            null: n,
            ty: DevType::Bool,
        })
    }

    /// Searched `CASE WHEN c THEN v ... [ELSE e] END`: the first TRUE condition's value (a
    /// NULL condition counts as not TRUE), else the ELSE value, else NULL.
    fn case(&mut self, c: &CaseExpr) -> Result<Operand, Unsupported> {
        if let Some(base) = c.expr() {
            // `CASE x WHEN v` matches where `x = v` is TRUE (a NULL x matches nothing). Floats
            // stay on the CPU: its CASE compares them with Arrow's `eq`, not SQL's `=`.
            let base_type = base
                .data_type(self.schema)
                .map_err(|e| Unsupported(format!("`{c}`: {e}")))?;
            if matches!(
                DevType::of(&base_type),
                None | Some(DevType::F32 | DevType::F64)
            ) {
                return Err(Unsupported(format!(
                    "`CASE <expr> WHEN ...` on {base_type} in `{c}` is not supported on the GPU yet"
                )));
            }
        }
        let data_type = c
            .data_type(self.schema)
            .map_err(|e| Unsupported(format!("`{c}`: {e}")))?;
        let ty = DevType::of(&data_type).ok_or_else(|| {
            Unsupported(format!(
                "CASE yielding {data_type} is not supported on the GPU yet"
            ))
        })?;
        let (v, n) = (self.var(), self.var());
        let _ = writeln!(
            self.body,
            "        {}\n        bool {n} = true;\n        bool {v}_done = false;",
            declare(ty, &v)
        );
        let depth = self.guards.len();
        let branches = self.case_branches(c, ty, &v, &n);
        self.guards.truncate(depth);
        branches?;
        Ok(Operand {
            value: v,
            null: n,
            ty,
        })
    }

    fn case_branches(
        &mut self,
        c: &CaseExpr,
        ty: DevType,
        v: &str,
        n: &str,
    ) -> Result<(), Unsupported> {
        for (when, then) in c.when_then_expr() {
            // Each WHEN is evaluated for the rows no earlier WHEN took, each THEN for the rows
            // its WHEN took; the code runs for every row, but raises errors only there.
            self.guards.push(format!("!{v}_done"));
            let cond = match c.expr() {
                Some(base) => {
                    let eq = BinaryExpr::new(Arc::clone(base), Operator::Eq, Arc::clone(when));
                    self.binary(&eq)
                }
                None => self.emit(when.as_ref()),
            };
            self.guards.pop();
            let cond = cond?;
            if cond.ty != DevType::Bool {
                return Err(Unsupported(format!("a non-boolean WHEN in `{c}`")));
            }
            self.guards
                .push(format!("(!{v}_done && !{} && {})", cond.null, cond.value));
            let value = self.emit(then.as_ref())?;
            self.guards.pop();
            if value.ty != ty {
                return Err(Unsupported(format!(
                    "CASE branches of different types in `{c}`"
                )));
            }
            let _ = writeln!(
                self.body,
                "        if (!{v}_done && !{} && {}) {{ {v}_done = true; {} {n} = {}; }}",
                cond.null,
                cond.value,
                assign(ty, v, &value.value),
                value.null
            );
        }
        if let Some(e) = c.else_expr() {
            self.guards.push(format!("!{v}_done"));
            let value = self.emit(e.as_ref())?;
            self.guards.pop();
            if value.ty != ty {
                return Err(Unsupported(format!(
                    "CASE branches of different types in `{c}`"
                )));
            }
            let _ = writeln!(
                self.body,
                "        if (!{v}_done) {{ {} {n} = {}; }}",
                assign(ty, v, &value.value),
                value.null
            );
        }
        Ok(())
    }

    /// A timestamp to another unit, as Arrow's cast: to a coarser unit the value divides,
    /// truncating toward zero; to a finer one it multiplies, and a product outside Int64 fails
    /// (NULL for a safe cast). The zone stays (the callers leave a naive-to-zoned
    /// cast, which shifts the value, to the CPU).
    fn timestamp_unit_cast(
        &mut self,
        c: &CastExpr,
        a: Operand,
        from: TimeUnit,
        to: TimeUnit,
    ) -> Result<Operand, Unsupported> {
        let per_second = |u: TimeUnit| -> i64 {
            match u {
                TimeUnit::Second => 1,
                TimeUnit::Millisecond => 1_000,
                TimeUnit::Microsecond => 1_000_000,
                TimeUnit::Nanosecond => 1_000_000_000,
            }
        };
        let (f, t) = (per_second(from), per_second(to));
        let v = self.var();
        if f > t {
            let _ = writeln!(
                self.body,
                "        const i64 {v} = (i64){} / (i64){}ll;",
                a.value,
                f / t
            );
            return Ok(Operand {
                value: v,
                null: a.null,
                ty: a.ty,
            });
        }
        let bad = self.var();
        let _ = writeln!(
            self.body,
            "        const i128 {v}_w = (i128){} * (i128){}ll;\n        const bool {bad} = {v}_w < {} || {v}_w > {};\n        const i64 {v} = {bad} ? (i64)0 : (i64){v}_w;",
            a.value,
            t / f,
            i128_literal(i128::from(i64::MIN)),
            i128_literal(i128::from(i64::MAX)),
        );
        let n = self.var();
        if c.cast_options().safe {
            let _ = writeln!(self.body, "        const bool {n} = {} || {bad};", a.null);
        } else {
            let _ = writeln!(self.body, "        const bool {n} = {};", a.null);
            self.raise(
                &format!("!{n} && {bad}"),
                ErrorFlag::OVERFLOW,
                c,
                format!(
                    "Cannot cast a value of `{c}` to {}: converted value exceeds the \
                     representable i64 range (on the GPU)",
                    c.cast_type()
                ),
            )?;
        }
        Ok(Operand {
            value: v,
            null: n,
            ty: a.ty,
        })
    }

    /// Casts that can fail, as Arrow's: integers to narrower integers and floats to integers
    /// fail with "Can't cast value" when out of range (floats truncate toward zero; NaN
    /// fails), decimals to integers truncate, decimals rescale down rounding half away from
    /// zero, and a decimal result out of its precision's range fails with "too large or too
    /// small to store".
    /// A safe cast (`CastOptions::safe`) yields NULL instead.
    ///
    /// `Ok(None)`: a cast this does not handle.
    fn checked_cast(
        &mut self,
        c: &CastExpr,
        a: Operand,
        to: DevType,
    ) -> Result<Option<Operand>, Unsupported> {
        let (v, bad) = (self.var(), self.var());
        let t = to.c_type();
        let int_range = |ty: DevType| -> Option<(i128, i128)> {
            match ty {
                DevType::Int { bits, signed: true } => {
                    Some((-(1i128 << (bits - 1)), (1i128 << (bits - 1)) - 1))
                }
                DevType::Int {
                    bits,
                    signed: false,
                } => Some((0, (1i128 << bits) - 1)),
                _ => None,
            }
        };
        // A cast that cannot fail raises nothing: its kernel then needs no error word.
        let mut infallible = false;
        let (compute, code, what) = match (a.ty, to) {
            (DevType::Int { .. } | DevType::Dec { .. }, DevType::Int { .. }) => {
                let Some((lo, hi)) = int_range(to) else {
                    return Ok(None);
                };
                let whole = match a.ty {
                    DevType::Dec { scale, .. } if scale >= 0 => {
                        format!("({} / {})", a.value, pow10(scale))
                    }
                    DevType::Dec { .. } => return Ok(None),
                    _ => format!("((i128){})", a.value),
                };
                (
                    format!(
                        "        const i128 {v}_w = {whole};\n        const bool {bad} = {v}_w < {} || {v}_w > {};\n        const {t} {v} = {bad} ? ({t})0 : ({t}){v}_w;",
                        i128_literal(lo),
                        i128_literal(hi)
                    ),
                    ErrorFlag::CAST,
                    format!(
                        "Cast error: a value of `{c}` does not fit {} (on the GPU)",
                        c.cast_type()
                    ),
                )
            }
            (DevType::F32 | DevType::F64, DevType::Int { bits, signed }) => {
                // NumCast's bounds: the truncated value must lie in [MIN, MAX + 1).
                let (lo, hi) = if signed {
                    (
                        -(2f64.powi(i32::from(bits) - 1)),
                        2f64.powi(i32::from(bits) - 1),
                    )
                } else {
                    (0.0, 2f64.powi(i32::from(bits)))
                };
                (
                    format!(
                        "        const f64 {v}_t = trunc((f64){});\n        const bool {bad} = !({v}_t >= __longlong_as_double((i64){}ull) && {v}_t < __longlong_as_double((i64){}ull));\n        const {t} {v} = {bad} ? ({t})0 : ({t}){v}_t;",
                        a.value,
                        lo.to_bits(),
                        hi.to_bits()
                    ),
                    ErrorFlag::CAST,
                    format!(
                        "Cast error: a value of `{c}` does not fit {} (on the GPU)",
                        c.cast_type()
                    ),
                )
            }
            (
                DevType::F32 | DevType::F64,
                DevType::Dec {
                    precision: p2,
                    scale: s2,
                },
            ) if (0..=38).contains(&s2) && p2 <= 38 => {
                // Arrow's cast: round(value * 10^scale), half away from zero, which must fit
                // an i128 and then the precision.
                infallible =
                    value_bounds(c.expr().as_ref(), self.schema).is_some_and(|(lo, hi)| {
                        // Half the limit: room for the rounding of the bounds and of the scaling.
                        let limit = 0.5 * 10f64.powi(i32::from(p2) - i32::from(s2));
                        lo > -limit && hi < limit
                    });
                let mul = 10f64.powi(i32::from(s2));
                let bound = 2f64.powi(127);
                let limit = pow10(i8::try_from(p2).unwrap_or(38));
                (
                    format!(
                        "        const f64 {v}_x = round(__longlong_as_double((i64){}ull) * (f64){});\n        const bool {v}_o = !({v}_x >= -__longlong_as_double((i64){b}ull) && {v}_x < __longlong_as_double((i64){b}ull));\n        const i128 {v}_r = {v}_o ? (i128)0 : spate::f64_to_i128({v}_x);\n        const bool {bad} = {v}_o || {v}_r >= {limit} || {v}_r <= -{limit};\n        const i128 {v} = {bad} ? (i128)0 : {v}_r;",
                        mul.to_bits(),
                        a.value,
                        b = bound.to_bits()
                    ),
                    ErrorFlag::CAST,
                    format!(
                        "Cannot cast to {}. Overflowing on a value of `{c}` (on the GPU)",
                        c.cast_type()
                    ),
                )
            }
            (
                DevType::Int { .. } | DevType::Dec { .. },
                DevType::Dec {
                    precision: p2,
                    scale: s2,
                },
            ) => {
                let (p1, s1) = match a.ty {
                    DevType::Dec { precision, scale } => (precision, scale),
                    ty => match ty.int_digits() {
                        Some(digits) => (digits, 0),
                        None => return Ok(None),
                    },
                };
                if s1 < 0 || s2 < 0 || p2 > 38 || p1 > 38 {
                    return Ok(None);
                }
                // Widening: every value of (p1, s1) has room in (p2, s2), digits before the
                // point and after it (`CAST(l_quantity AS DECIMAL(30, 15))` in TPC-H q17).
                infallible =
                    s2 >= s1 && i16::from(p2) - i16::from(s2) >= i16::from(p1) - i16::from(s1);
                let scaled = if s2 >= s1 {
                    format!(
                        "        i128 {v}_r;\n        const bool {v}_o = spate::mul_overflows((i128){}, {}, &{v}_r);",
                        a.value,
                        pow10(s2 - s1)
                    )
                } else {
                    // Round half away from zero, as Arrow's decimal rescale.
                    format!(
                        "        const i128 {v}_d = {};\n        i128 {v}_r = (i128){} / {v}_d;\n        const i128 {v}_m = (i128){} % {v}_d;\n        if (({v}_m < 0 ? -{v}_m : {v}_m) * 2 >= {v}_d) {v}_r += ((i128){} < 0 ? -1 : 1);\n        const bool {v}_o = false;",
                        pow10(s1 - s2),
                        a.value,
                        a.value,
                        a.value
                    )
                };
                let limit = pow10(i8::try_from(p2).unwrap_or(38));
                (
                    format!(
                        "{scaled}\n        const bool {bad} = {v}_o || {v}_r >= {limit} || {v}_r <= -{limit};\n        const i128 {v} = {bad} ? (i128)0 : {v}_r;"
                    ),
                    ErrorFlag::PRECISION,
                    format!(
                        "a value of `{c}` is too large or too small to store in a Decimal128 of precision \
                         {p2} (on the GPU)"
                    ),
                )
            }
            _ => return Ok(None),
        };
        let _ = writeln!(self.body, "{compute}");
        let n = self.var();
        if c.cast_options().safe {
            let _ = writeln!(self.body, "        const bool {n} = {} || {bad};", a.null);
        } else if infallible {
            let _ = writeln!(self.body, "        const bool {n} = {};", a.null);
        } else {
            let _ = writeln!(self.body, "        const bool {n} = {};", a.null);
            if (a.ty == DevType::F32 || a.ty == DevType::F64) && matches!(to, DevType::Dec { .. }) {
                // Arrow fails a value that does not fit an i128 as a cast error, and one that
                // does but exceeds the precision as an invalid argument.
                self.raise(&format!("!{n} && {v}_o"), code, c, what)?;
                self.raise(
                    &format!("!{n} && {bad} && !{v}_o"),
                    ErrorFlag::PRECISION,
                    c,
                    format!(
                        "a value of `{c}` is too large or too small to store in a {} (on the GPU)",
                        c.cast_type()
                    ),
                )?;
            } else {
                self.raise(&format!("!{n} && {bad}"), code, c, what)?;
            }
        }
        Ok(Some(Operand {
            value: v,
            null: n,
            ty: to,
        }))
    }

    /// `character_length(s)` (also `length`, `char_length`: code points, counted as the
    /// UTF-8 bytes that do not continue a character) and `octet_length(s)` (bytes), typed as
    /// DataFusion types them (Int32, or Int64 for LargeUtf8).
    fn length(&mut self, f: &ScalarFunctionExpr) -> Result<Operand, Unsupported> {
        let unsupported = || Unsupported(format!("`{f}` is not supported on the GPU yet"));
        let [arg] = f.args() else {
            return Err(unsupported());
        };
        let ty = DevType::of(f.return_type())
            .filter(|t| {
                matches!(
                    t,
                    DevType::Int {
                        bits: 32 | 64,
                        signed: true
                    }
                )
            })
            .ok_or_else(unsupported)?;
        let a = self.emit(arg.as_ref())?;
        if a.ty != DevType::Str {
            return Err(unsupported());
        }
        let v = self.var();
        let c = ty.c_type();
        if f.name() == "octet_length" {
            let _ = writeln!(self.body, "        const {c} {v} = ({c}){}_n;", a.value);
        } else {
            let _ = writeln!(
                self.body,
                "        {c} {v} = 0;\n        for (u64 k = 0; k < {a}_n; ++k) {v} += ((({a})[k] & 0xC0) != 0x80) ? 1 : 0;",
                a = a.value
            );
        }
        Ok(Operand {
            value: v,
            null: a.null,
            ty,
        })
    }

    /// `substr(s, start[, count])` with literal positions, as a string operand (for
    /// comparisons, IN, LIKE and lengths): the characters at 1-based positions
    /// `[start, start + count)` that exist, as DataFusion (and PostgreSQL) define it. A
    /// negative count is an error on the CPU, so it stays there.
    fn substr(&mut self, f: &ScalarFunctionExpr) -> Result<Operand, Unsupported> {
        let unsupported = || Unsupported(format!("`{f}` is not supported on the GPU yet"));
        let literal_int = |e: &Arc<dyn PhysicalExpr>| match e.downcast_ref::<Literal>()?.value() {
            ScalarValue::Int64(Some(v)) => Some(*v),
            ScalarValue::Int32(Some(v)) => Some(i64::from(*v)),
            _ => None,
        };
        let (arg, start, count) = match f.args() {
            [arg, start] => (arg, literal_int(start).ok_or_else(unsupported)?, None),
            [arg, start, count] => (
                arg,
                literal_int(start).ok_or_else(unsupported)?,
                Some(literal_int(count).ok_or_else(unsupported)?),
            ),
            _ => return Err(unsupported()),
        };
        if count.is_some_and(|c| c < 0) {
            return Err(unsupported());
        }
        let a = self.emit(arg.as_ref())?;
        if a.ty != DevType::Str {
            return Err(unsupported());
        }
        let lo = start.max(1);
        let hi = count.map_or(i64::MAX, |c| start.saturating_add(c));
        let v = self.var();
        let _ = writeln!(
            self.body,
            "        const u8* {v} = {a};\n        u64 {v}_n = 0;",
            a = a.value
        );
        if hi > lo {
            let _ = writeln!(
                self.body,
                "        {{ u64 lo_b = {a}_n, hi_b = {a}_n; i64 pos = 1; for (u64 bi = 0; bi < {a}_n; bi += spate::utf8_width({a}[bi]), ++pos) {{ if (pos == {lo}ll) lo_b = bi; if (pos == {hi}ll) {{ hi_b = bi; break; }} }} if (hi_b < lo_b) hi_b = lo_b; {v} = {a} + lo_b; {v}_n = hi_b - lo_b; }}",
                a = a.value
            );
        }
        Ok(Operand {
            value: v,
            null: a.null,
            ty: DevType::Str,
        })
    }

    /// `date ± interval` for Date32 and a literal interval of months and days (no time part):
    /// months first, the day clamped to the month's end, then days, as Arrow does.
    fn date_interval(
        &mut self,
        b: &BinaryExpr,
        date: Operand,
        interval: &ScalarValue,
        v: String,
        n: String,
    ) -> Result<Operand, Unsupported> {
        let (months, days) = match interval {
            ScalarValue::IntervalYearMonth(Some(m)) => (i64::from(*m), 0),
            ScalarValue::IntervalDayTime(Some(d)) if d.milliseconds == 0 => (0, i64::from(d.days)),
            ScalarValue::IntervalMonthDayNano(Some(i)) if i.nanoseconds == 0 => {
                (i64::from(i.months), i64::from(i.days))
            }
            _ => {
                return Err(Unsupported(format!(
                    "`{b}`: intervals with a time part on dates are not supported on the GPU yet"
                )));
            }
        };
        let sign = if *b.op() == Operator::Minus { -1 } else { 1 };
        let _ = writeln!(
            self.body,
            "        const bool {n} = {};\n        const i32 {v} = spate::date_add_interval({}, (i64){}ll, (i64){}ll);",
            date.null,
            date.value,
            sign * months,
            sign * days
        );
        Ok(Operand {
            value: v,
            null: n,
            ty: DevType::Int {
                bits: 32,
                signed: true,
            },
        })
    }

    /// `extract(year|month|day FROM <Date32>)` (DataFusion's `date_part`), as Int32.
    fn date_part(&mut self, f: &ScalarFunctionExpr) -> Result<Operand, Unsupported> {
        let unsupported = || Unsupported(format!("`{f}` is not supported on the GPU yet"));
        let [part, arg] = f.args() else {
            return Err(unsupported());
        };
        let part = match part.downcast_ref::<Literal>().map(Literal::value) {
            Some(ScalarValue::Utf8(Some(p)) | ScalarValue::Utf8View(Some(p))) => p.to_lowercase(),
            _ => return Err(unsupported()),
        };
        let helper = match part.as_str() {
            "year" => "date_year",
            "month" => "date_month",
            "day" => "date_day",
            _ => return Err(unsupported()),
        };
        if arg.data_type(self.schema).ok() != Some(DataType::Date32)
            || f.return_type() != &DataType::Int32
        {
            return Err(unsupported());
        }
        let a = self.emit(arg.as_ref())?;
        let v = self.var();
        let _ = writeln!(
            self.body,
            "        const i32 {v} = spate::{helper}({});",
            a.value
        );
        Ok(Operand {
            value: v,
            null: a.null,
            ty: DevType::Int {
                bits: 32,
                signed: true,
            },
        })
    }

    /// `coalesce(a, b, ...)`: the first non-NULL argument.
    fn coalesce(&mut self, args: &[Arc<dyn PhysicalExpr>]) -> Result<Operand, Unsupported> {
        let Some((first, rest)) = args.split_first() else {
            return Err(Unsupported("coalesce() without arguments".into()));
        };
        let first = self.emit(first.as_ref())?;
        let ty = first.ty;
        let (v, n) = (self.var(), self.var());
        let _ = writeln!(
            self.body,
            "        {}\n        bool {n} = true;\n        if (!{}) {{ {} {n} = false; }}",
            declare(ty, &v),
            first.null,
            assign(ty, &v, &first.value)
        );
        // A later argument is evaluated only for the rows the earlier ones left NULL.
        for a in rest {
            self.guards.push(n.clone());
            let o = self.emit(a.as_ref());
            self.guards.pop();
            let o = o?;
            if o.ty != ty {
                return Err(Unsupported(
                    "coalesce of different types on the GPU is not supported yet".into(),
                ));
            }
            let _ = writeln!(
                self.body,
                "        if ({n} && !{}) {{ {} {n} = false; }}",
                o.null,
                assign(ty, &v, &o.value)
            );
        }
        Ok(Operand {
            value: v,
            null: n,
            ty,
        })
    }

    fn binary(&mut self, b: &BinaryExpr) -> Result<Operand, Unsupported> {
        let op = b.op();
        if matches!(op, Operator::Plus | Operator::Minus)
            && b.left().data_type(self.schema).ok() == Some(DataType::Date32)
            && let Some(interval) = b.right().downcast_ref::<Literal>().map(Literal::value)
            && matches!(interval.data_type(), DataType::Interval(_))
        {
            let date = self.emit(b.left().as_ref())?;
            let (v, n) = (self.var(), self.var());
            return self.date_interval(b, date, interval, v, n);
        }
        let l = self.emit(b.left().as_ref())?;
        // DataFusion may skip the right side of AND/OR when the left decides the whole batch.
        let logical = matches!(op, Operator::And | Operator::Or);
        self.conditional += usize::from(logical);
        let r = self.emit(b.right().as_ref());
        self.conditional -= usize::from(logical);
        let r = r?;
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
                if !l.ty.comparable(r.ty) {
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
                if l.ty == DevType::Str {
                    let _ = writeln!(
                        self.body,
                        "        const bool {n} = {} || {};\n        const bool {v} = spate::str_cmp({}, {}_n, {}, {}_n) {c_op} 0;",
                        l.null, r.null, l.value, l.value, r.value, r.value
                    );
                    return Ok(Operand {
                        value: v,
                        null: n,
                        ty: DevType::Bool,
                    });
                }
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
            Operator::IsDistinctFrom | Operator::IsNotDistinctFrom => {
                if !l.ty.comparable(r.ty) {
                    return Err(Unsupported(format!(
                        "comparison of different types in `{b}` ({:?} vs {:?})",
                        l.ty, r.ty
                    )));
                }
                // Never NULL: two NULLs are not distinct, a NULL and a value are; two values
                // compare as `=` does.
                let equal = match l.ty {
                    DevType::Str => format!(
                        "spate::str_cmp({}, {}_n, {}, {}_n) == 0",
                        l.value, l.value, r.value, r.value
                    ),
                    DevType::F32 | DevType::F64 => format!(
                        "spate::compare_key({}) == spate::compare_key({})",
                        l.value, r.value
                    ),
                    _ => format!("{} == {}", l.value, r.value),
                };
                let not = if *op == Operator::IsDistinctFrom {
                    "!"
                } else {
                    ""
                };
                let _ = writeln!(
                    self.body,
                    "        const bool {n} = false;\n        const bool {v} = {not}(({ln} && {rn}) || (!{ln} && !{rn} && ({equal})));",
                    ln = l.null,
                    rn = r.null,
                );
                Ok(Operand {
                    value: v,
                    null: n,
                    ty: DevType::Bool,
                })
            }
            Operator::Plus | Operator::Minus | Operator::Multiply
                if matches!(l.ty, DevType::Dec { .. }) || matches!(r.ty, DevType::Dec { .. }) =>
            {
                self.decimal_arithmetic(b, op, l, r, v, n)
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
                    // The NaN bits an x86 CPU would produce (see common/order.cuh).
                    DevType::F32 | DevType::F64 => format!(
                        "spate::cpu_nan(({c}){l} {c_op} {r}, {l}, {r})",
                        c = l.ty.c_type(),
                        l = l.value,
                        r = r.value
                    ),
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
            Operator::Divide | Operator::Modulo
                if matches!(l.ty, DevType::Dec { .. }) || matches!(r.ty, DevType::Dec { .. }) =>
            {
                self.decimal_divide(b, op, l, r, v, n)
            }
            Operator::Divide | Operator::Modulo => self.divide(b, op, l, r, v, n),
            other => Err(Unsupported(format!(
                "operator {other} in `{b}` is not supported on the GPU yet"
            ))),
        }
    }

    /// Decimal `/` and `%` as Arrow's kernels. Division: the result scale is `s1 + 4` (at most
    /// 38); the dividend is multiplied by `10^(scale - s1 + s2)` (checked) and divided by the
    /// divisor, truncating toward zero. Remainder: both sides at the larger scale, the sign of
    /// the dividend. A zero divisor fails with "Divide by zero error".
    fn decimal_divide(
        &mut self,
        b: &BinaryExpr,
        op: &Operator,
        l: Operand,
        r: Operand,
        v: String,
        n: String,
    ) -> Result<Operand, Unsupported> {
        let unsupported =
            |why: &str| Unsupported(format!("`{b}`: {why} on the GPU is not supported yet"));
        let ((p1, s1), (p2, s2), (_, s), result) = self.decimal_shapes(b, &l, &r)?;
        if s1 < 0 || s2 < 0 || p1 > 38 || p2 > 38 {
            return Err(unsupported("negative decimal scales"));
        }
        let (lv, rv) = (&l.value, &r.value);
        let _ = writeln!(
            self.body,
            "        const bool {n} = {} || {};",
            l.null, r.null
        );
        let divide = *op == Operator::Divide;
        if divide {
            let expected = s1.saturating_add(4).min(38);
            if s != expected {
                return Err(unsupported("this decimal division scale"));
            }
            let shift = i32::from(s) - i32::from(s1) + i32::from(s2);
            let (l_mul, r_mul) = if shift >= 0 {
                (pow10(shift as i8), pow10(0))
            } else {
                (pow10(0), pow10((-shift) as i8))
            };
            let _ = writeln!(
                self.body,
                "        i128 {v}_l, {v}_r;\n        const bool {v}_ovf = spate::mul_overflows({lv}, {l_mul}, &{v}_l) || spate::mul_overflows({rv}, {r_mul}, &{v}_r);\n        const bool {v}_zero = {v}_r == 0;\n        const bool {v}_ovf2 = {v}_ovf || ({v}_l == (i128)((u128i)1 << 127) && {v}_r == -1);\n        const i128 {v} = ({n} || {v}_ovf2 || {v}_zero) ? (i128)0 : {v}_l / {v}_r;"
            );
        } else {
            if s != s1.max(s2) {
                return Err(unsupported("this decimal remainder scale"));
            }
            let _ = writeln!(
                self.body,
                "        i128 {v}_l, {v}_r;\n        const bool {v}_ovf = spate::mul_overflows({lv}, {}, &{v}_l) || spate::mul_overflows({rv}, {}, &{v}_r);\n        const bool {v}_zero = {v}_r == 0;\n        const bool {v}_ovf2 = {v}_ovf;\n        const i128 {v} = ({n} || {v}_ovf2 || {v}_zero || {v}_r == -1) ? (i128)0 : {v}_l % {v}_r;",
                pow10(s - s1),
                pow10(s - s2)
            );
        }
        self.raise(
            &format!("!{n} && {v}_zero && !{v}_ovf"),
            ErrorFlag::DIVIDE_BY_ZERO,
            b,
            String::new(),
        )?;
        self.raise(
            &format!("!{n} && {v}_ovf2"),
            ErrorFlag::OVERFLOW,
            b,
            format!("Overflow happened on: {b} (on the GPU)"),
        )?;
        Ok(Operand {
            value: v,
            null: n,
            ty: DevType::of(&result).unwrap_or(l.ty),
        })
    }

    /// Integer and float `/` and `%` as Arrow's checked kernels: an integer division by zero
    /// fails with "Divide by zero error", `MIN / -1` with an overflow (`MIN % -1` is 0); floats
    /// follow IEEE (`%` is C's `fmod`, as Rust's). The code never divides by zero itself.
    fn divide(
        &mut self,
        b: &BinaryExpr,
        op: &Operator,
        l: Operand,
        r: Operand,
        v: String,
        n: String,
    ) -> Result<Operand, Unsupported> {
        if l.ty != r.ty {
            return Err(Unsupported(format!(
                "`{b}`: division of different types on the GPU is not supported yet"
            )));
        }
        let c = l.ty.c_type();
        let (lv, rv) = (&l.value, &r.value);
        let divide = *op == Operator::Divide;
        match l.ty {
            DevType::Int { bits, signed } => {
                let min = if signed {
                    format!("(({c})(({})1 << {}))", l.ty.unsigned_twin(), bits - 1)
                } else {
                    format!("(({c})0)")
                };
                let special = if signed {
                    format!("({lv} == {min} && {rv} == ({c})-1)")
                } else {
                    "false".to_string()
                };
                let c_op = if divide { "/" } else { "%" };
                let _ = writeln!(
                    self.body,
                    "        const bool {n} = {} || {};\n        const bool {v}_zero = {rv} == ({c})0;\n        const bool {v}_min = {special};\n        const {c} {v} = ({n} || {v}_zero || {v}_min) ? ({c})0 : ({c})({lv} {c_op} {rv});",
                    l.null, r.null
                );
                self.raise(
                    &format!("!{n} && {v}_zero"),
                    ErrorFlag::DIVIDE_BY_ZERO,
                    b,
                    String::new(),
                )?;
                if divide && signed {
                    self.raise(
                        &format!("!{n} && {v}_min"),
                        ErrorFlag::OVERFLOW,
                        b,
                        format!("Overflow happened on: {b} (on the GPU)"),
                    )?;
                }
            }
            DevType::F32 | DevType::F64 => {
                let value = if divide {
                    format!("({c})({lv} / {rv})")
                } else {
                    format!("({c})fmod({lv}, {rv})")
                };
                let _ = writeln!(
                    self.body,
                    "        const bool {n} = {} || {};\n        const {c} {v} = spate::cpu_nan({value}, {lv}, {rv});",
                    l.null, r.null
                );
            }
            _ => {
                return Err(Unsupported(format!(
                    "`{b}`: division of {:?} on the GPU is not supported yet",
                    l.ty
                )));
            }
        }
        Ok(Operand {
            value: v,
            null: n,
            ty: l.ty,
        })
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
        scalars: Vec::new(),
        conditional: 0,
        guards: Vec::new(),
        checks: Vec::new(),
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
            "const u8* d{k}, const u8* e{k}, u64 b{k}, const u8* v{k}, u64 o{k}, "
        );
    }
    for k in 0..g.scalars.len() {
        let _ = write!(params, "u64 sa{k}, u64 sb{k}, u32 sn{k}, ");
    }
    let err = if g.checks.is_empty() {
        ""
    } else {
        ", u32* err"
    };
    let body = format!(
        "extern \"C\" __global__ void __launch_bounds__(SPATE_BLOCK_THREADS) ENTRY({params}const u32* live, u64 n, u8* out{err}) {{\n    const u64 m = spate::live_rows(live, n);\n    for (u64 i = spate::global_thread_index(); i < n; i += spate::grid_stride()) {{\n        if (i >= m) {{ out[i] = 0; continue; }}\n{}        out[i] = (!{} && {}) ? 1 : 0;\n    }}\n}}\nSPATE_EXPORT(ENTRY)\n",
        g.body, root.null, root.value
    );
    let hash = blake3_hex(&body);
    let entry = format!("spate_pred_{hash}");
    let source = format!(
        "// Generated by spate::expr from `{}`.\n#include \"common/prelude.cuh\"\n#include \"common/bitmap.cuh\"\n#include \"common/order.cuh\"\n#include \"common/strings.cuh\"\n#include \"common/dates.cuh\"\n#include \"common/checked.cuh\"\n\n{}",
        predicate.to_string().replace('\n', " "),
        body.replace("ENTRY", &entry)
    );
    Ok(PredicateKernel {
        source,
        entry,
        inputs: g.inputs,
        scalars: g.scalars,
        checks: g.checks,
    })
}

/// A compiled-to-source list of value expressions (a projection): one kernel computes every
/// output column, with its validity.
#[derive(Debug, Clone)]
pub struct ValueKernel {
    /// Full source, ready for `Device::compile_generated`.
    pub source: String,
    /// The entry point (`spate_proj_<hash>`).
    pub entry: String,
    /// The columns read, then the runtime scalars, laid out as in
    /// [`PredicateKernel::inputs`], followed by `const u32* live` (the batch's device row
    /// count, or null: rows at or past it are not computed, and their values, validity words
    /// and string lengths are not written), `u64 n`,
    /// `const u32* rows` (output `o` reads input row `rows[o]`, or row `o` when null: a filter's
    /// kept rows, so the gather is fused into the kernel), `u32 pass` and then, per output,
    /// `(T* values, u32* validity_words)`, or for a string output
    /// `(u64* offsets, u8* bytes, u32* validity_words)`, then `u32* err` when `checks` is not
    /// empty. Every output gets a validity bitmap, and its nulls are not counted: the count
    /// stays on the device until a host consumer asks for it
    /// ([`crate::column::DeviceColumn::count_nulls`]). Without string outputs the kernel runs once
    /// (`pass` 0). With them it runs twice: pass 0 computes every output and writes each
    /// string's length to `offsets`, which the host turns into offsets by an exclusive scan;
    /// pass 1 copies each string's bytes there.
    pub inputs: Vec<KernelInput>,
    /// As [`PredicateKernel::scalars`].
    pub scalars: Vec<RuntimeScalar>,
    /// As [`PredicateKernel::checks`].
    pub checks: Vec<(u32, String)>,
    /// The Arrow type of each output.
    pub outputs: Vec<DataType>,
}

/// Generates one kernel computing `exprs` over rows of `input_schema`.
pub fn value_kernel(
    exprs: &[&dyn PhysicalExpr],
    input_schema: &Schema,
) -> Result<ValueKernel, Unsupported> {
    let mut g = Gen {
        schema: input_schema,
        body: String::new(),
        next: 0,
        inputs: Vec::new(),
        scalars: Vec::new(),
        conditional: 0,
        guards: Vec::new(),
        checks: Vec::new(),
    };
    let mut outputs = Vec::new();
    let mut finals = Vec::new();
    for expr in exprs {
        let data_type = expr
            .data_type(input_schema)
            .map_err(|e| Unsupported(format!("`{expr}`: {e}")))?;
        let want = DevType::of(&data_type).ok_or_else(|| {
            Unsupported(format!(
                "`{expr}` yields {data_type}, which GPU expressions do not compute yet"
            ))
        })?;
        let got = g.emit(*expr)?;
        if got.ty != want {
            return Err(Unsupported(format!(
                "`{expr}` computes {:?} on the GPU but DataFusion types it {data_type}",
                got.ty
            )));
        }
        outputs.push(data_type);
        finals.push(got);
    }
    let mut params = String::new();
    for k in 0..g.inputs.len() {
        let _ = write!(
            params,
            "const u8* d{k}, const u8* e{k}, u64 b{k}, const u8* v{k}, u64 o{k}, "
        );
    }
    for k in 0..g.scalars.len() {
        let _ = write!(params, "u64 sa{k}, u64 sb{k}, u32 sn{k}, ");
    }
    params.push_str("const u32* live, u64 n, const u32* rows, u32 pass");
    let mut declare = String::new();
    let mut store = String::new();
    let mut publish = String::new();
    for (j, (f, ty)) in finals.iter().zip(&outputs).enumerate() {
        let dev = DevType::of(ty).unwrap_or(DevType::Bool);
        if dev == DevType::Str {
            // Pass 0 writes each string's length into `offs`, which the host turns into
            // offsets by an exclusive scan; pass 1 copies the bytes to them.
            let _ = write!(params, ", u64* offs{j}, u8* bytes{j}, u32* valid{j}");
            let _ = writeln!(declare, "        bool ok{j} = false;");
            let _ = writeln!(
                store,
                "            ok{j} = !{null};\n            if (pass == 0u) {{ offs{j}[o] = ok{j} ? (u64){v}_n : 0ull; }} else if (ok{j}) {{ u8* dst = bytes{j} + offs{j}[o]; for (u64 k = 0; k < {v}_n; ++k) dst[k] = {v}[k]; }}",
                null = f.null,
                v = f.value
            );
            let _ = writeln!(
                publish,
                "        if (pass == 0u) {{ const u32 v = __ballot_sync(SPATE_FULL_MASK, ok{j}); if (spate::lane_id() == 0) {{ valid{j}[base / 32] = v; }} }}"
            );
        } else if dev == DevType::Bool {
            let _ = write!(params, ", u32* out{j}, u32* valid{j}");
            let _ = writeln!(
                declare,
                "        bool set{j} = false;\n        bool ok{j} = false;"
            );
            let _ = writeln!(
                store,
                "            ok{j} = !{};\n            set{j} = ok{j} && {};",
                f.null, f.value
            );
            let _ = writeln!(
                publish,
                "        if (pass == 0u) {{ const u32 w = __ballot_sync(SPATE_FULL_MASK, set{j}); const u32 v = __ballot_sync(SPATE_FULL_MASK, ok{j}); if (spate::lane_id() == 0) {{ out{j}[base / 32] = w; valid{j}[base / 32] = v; }} }}"
            );
        } else {
            let c = dev.c_type();
            let _ = write!(params, ", {c}* out{j}, u32* valid{j}");
            let _ = writeln!(declare, "        bool ok{j} = false;");
            let _ = writeln!(
                store,
                "            ok{j} = !{};\n            if (pass == 0u) out{j}[o] = ok{j} ? ({c}){} : ({c})0;",
                f.null, f.value
            );
            let _ = writeln!(
                publish,
                "        if (pass == 0u) {{ const u32 v = __ballot_sync(SPATE_FULL_MASK, ok{j}); if (spate::lane_id() == 0) {{ valid{j}[base / 32] = v; }} }}"
            );
        }
    }
    if !g.checks.is_empty() {
        params.push_str(", u32* err");
    }
    // Warp-strided rows: a warp owns 32 consecutive rows per step, so every ballot sees all 32
    // lanes and one lane writes each 32-bit validity word.
    let body = format!(
        "extern \"C\" __global__ void __launch_bounds__(SPATE_BLOCK_THREADS) ENTRY({params}) {{\n    const u64 m = spate::live_rows(live, n);\n    const u64 warps = spate::grid_stride() / 32;\n    for (u64 base = (spate::global_thread_index() / 32) * 32; base < m; base += warps * 32) {{\n        const u64 o = base + spate::lane_id();\n{declare}        if (o < m) {{\n            const u64 i = rows != nullptr ? (u64)rows[o] : o;\n{}{store}        }}\n{publish}    }}\n}}\nSPATE_EXPORT(ENTRY)\n",
        indent(&g.body)
    );
    let entry = format!("spate_proj_{}", blake3_hex(&body));
    let names: Vec<String> = exprs.iter().map(|e| e.to_string()).collect();
    let source = format!(
        "// Generated by spate::expr from [{}].\n#include \"common/prelude.cuh\"\n#include \"common/bitmap.cuh\"\n#include \"common/order.cuh\"\n#include \"common/strings.cuh\"\n#include \"common/dates.cuh\"\n#include \"common/checked.cuh\"\n\n{}",
        names.join(", ").replace('\n', " "),
        body.replace("ENTRY", &entry)
    );
    Ok(ValueKernel {
        source,
        entry,
        inputs: g.inputs,
        scalars: g.scalars,
        outputs,
        checks: g.checks,
    })
}

/// Whether a cast involving a date, time, timestamp, duration or interval keeps the value's
/// bits, the only temporal casts the GPU does: the same type, a timestamp with a time zone to
/// the same unit in another zone or in none (the UTC value stays), or a temporal type to or
/// from the integer it is stored as (Date32 and Int32, Timestamp and Int64). Others change
/// the value and stay on the CPU: units (a timestamp to a date divides by the day), and a
/// timestamp without a zone to one with a zone, which Arrow reads as local time in that zone
/// and shifts by its offset. Casts between non-temporal types return true.
fn bit_preserving_temporal_cast(from: &DataType, to: &DataType) -> bool {
    use DataType::*;
    let temporal = |t: &DataType| {
        matches!(
            t,
            Date32 | Date64 | Timestamp(_, _) | Time32(_) | Time64(_) | Duration(_) | Interval(_)
        )
    };
    match (from, to) {
        _ if !temporal(from) && !temporal(to) => true,
        _ if from == to => true,
        (Timestamp(a, from_zone), Timestamp(b, to_zone)) => {
            a == b && !(from_zone.is_none() && to_zone.is_some())
        }
        (t, Int32) | (Int32, t) => matches!(t, Date32 | Time32(_)),
        (t, Int64) | (Int64, t) => {
            matches!(t, Date64 | Timestamp(_, _) | Time64(_) | Duration(_))
        }
        _ => false,
    }
}

/// Declares a result variable `v` of type `ty`, zero (a string: empty, with its length in
/// `v_n`).
fn declare(ty: DevType, v: &str) -> String {
    if ty == DevType::Str {
        format!("const u8* {v} = nullptr; u64 {v}_n = 0;")
    } else {
        format!("{c} {v} = ({c})0;", c = ty.c_type())
    }
}

/// Assigns operand value `value` to result variable `v` (a string: its length too).
fn assign(ty: DevType, v: &str, value: &str) -> String {
    if ty == DevType::Str {
        format!("{v} = {value}; {v}_n = {value}_n;")
    } else {
        format!("{v} = {value};")
    }
}

fn indent(body: &str) -> String {
    body.lines().map(|l| format!("    {l}\n")).collect()
}

/// Device pointers and bit offsets of a kernel's input columns, in its parameter layout.
fn input_args(
    inputs: &[KernelInput],
    scalars: &[RuntimeScalar],
    batch: &crate::column::DeviceBatch,
) -> crate::error::Result<Vec<spate_kernels::KernelArg>> {
    let mut args = Vec::with_capacity(inputs.len() * 5 + 2);
    for input in inputs {
        let column =
            batch
                .columns()
                .get(input.index)
                .ok_or_else(|| crate::error::SpateError::Internal {
                    message: format!("a kernel reads column {} of a narrower batch", input.index),
                })?;
        column_args(column, &mut args);
    }
    for scalar in scalars {
        args.extend(scalar.launch_args()?);
    }
    Ok(args)
}

/// The five kernel parameters of one input column, as every generated kernel takes them:
/// `(const u8* data, const u8* extra, u64 aux, const u8* validity, u64 validity_offset)`. For
/// strings `data` holds the offsets, `extra` the bytes and `aux` the offset width in bytes; for
/// booleans `aux` is the bit offset of row 0.
pub(crate) fn column_args(
    column: &crate::column::DeviceColumn,
    args: &mut Vec<spate_kernels::KernelArg>,
) {
    use crate::column::DeviceValues;
    use spate_kernels::KernelArg;
    let (data, extra, aux) = match column.values() {
        DeviceValues::Fixed { bytes, .. } => (bytes.as_slice().address(), 0, 0),
        DeviceValues::Bits { bytes, offset } => (bytes.as_slice().address(), 0, *offset),
        DeviceValues::Utf8 { offsets, bytes } => {
            (offsets.as_slice().address(), bytes.as_slice().address(), 4)
        }
        DeviceValues::LargeUtf8 { offsets, bytes } => {
            (offsets.as_slice().address(), bytes.as_slice().address(), 8)
        }
    };
    args.push(KernelArg::Ptr(data));
    args.push(KernelArg::Ptr(extra));
    args.push(KernelArg::U64(aux as u64));
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

/// Runs a value kernel over a device batch and returns its output columns, one value per row.
pub fn evaluate_values(
    stream: &spate_kernels::Stream,
    kernel: &spate_kernels::Kernel,
    values: &ValueKernel,
    batch: &crate::column::DeviceBatch,
) -> crate::error::Result<Vec<crate::column::DeviceColumn>> {
    evaluate_values_at(
        stream,
        kernel,
        values,
        batch,
        None,
        batch.row_count().live(),
    )
}

/// [`evaluate_values`] for the listed rows only (in that order): a gather fused into the
/// kernel. Every index in `rows` must be below the batch's row count (they come from a
/// filter's compaction), as the kernel reads the columns at them unchecked. `live` is the
/// device count of the rows computed (of `rows` when given, else of the batch), or `None` when
/// all `n` are.
pub(crate) fn evaluate_values_at(
    stream: &spate_kernels::Stream,
    kernel: &spate_kernels::Kernel,
    values: &ValueKernel,
    batch: &crate::column::DeviceBatch,
    rows: Option<spate_kernels::DeviceSlice<'_, u32>>,
    live: Option<spate_kernels::DeviceSlice<'_, u32>>,
) -> crate::error::Result<Vec<crate::column::DeviceColumn>> {
    use crate::column::{DeviceBytes, DeviceColumn, DeviceValidity, DeviceValues, device_layout};
    use spate_kernels::gather::bitmap_bytes;
    use spate_kernels::{DeviceBuffer, KernelArg, LaunchConfig};

    let n = rows.map_or(batch.bound(), |r| r.len());
    let mut args = input_args(&values.inputs, &values.scalars, batch)?;
    args.push(live.map_or_else(KernelArg::null, KernelArg::from));
    args.push(KernelArg::U64(n as u64));
    args.push(rows.map_or_else(KernelArg::null, KernelArg::from));
    let pass_arg = args.len();
    args.push(KernelArg::U32(0));
    /// Where one output's values go.
    enum Buffers {
        /// Values (or bits) and validity.
        Fixed(DeviceBuffer<u8>, DeviceBuffer<u8>),
        /// Lengths, then offsets (`n + 1`); the bytes once their total is known; validity.
        Strings(
            DeviceBuffer<u64>,
            Option<DeviceBuffer<u8>>,
            DeviceBuffer<u8>,
        ),
    }
    let mut buffers = Vec::with_capacity(values.outputs.len());
    // Argument index of each string output's byte pointer, filled in for pass 1.
    let mut byte_args = Vec::new();
    for data_type in &values.outputs {
        let validity = stream.alloc::<u8>(bitmap_bytes(n).max(4))?;
        match device_layout(data_type) {
            Some(crate::column::Layout::Strings | crate::column::Layout::LargeStrings) => {
                let offsets = stream.alloc_zeroed::<u64>(n + 1)?;
                args.push((&offsets).into());
                byte_args.push(args.len());
                args.push(KernelArg::null());
                args.push((&validity).into());
                buffers.push(Buffers::Strings(offsets, None, validity));
            }
            layout => {
                let bytes = match layout {
                    Some(crate::column::Layout::Fixed(width)) => n * width,
                    Some(crate::column::Layout::Bits) => bitmap_bytes(n),
                    _ => {
                        return Err(crate::error::SpateError::Internal {
                            message: format!("value kernels cannot produce {data_type}"),
                        });
                    }
                };
                // At least one 16-byte value, so that an empty column still views as any
                // width.
                let data = stream.alloc::<u8>(bytes.max(16))?;
                args.push((&data).into());
                args.push((&validity).into());
                buffers.push(Buffers::Fixed(data, validity));
            }
        }
    }
    // Everything the host reads after the first launch comes back in one readback: each string
    // output's byte total, then the error word (a u32 in the last u64). A kernel with neither
    // reads nothing back: its null counts stay on the device.
    // Without string outputs, the error word comes back alone: 4 bytes, not a u64.
    let strings = byte_args.len();
    let checked = !values.checks.is_empty();
    // Kept alive to the end: pass 1 may still write the error word.
    let mut readback = match strings {
        0 => None,
        _ => Some(stream.alloc_zeroed::<u64>(strings + usize::from(checked))?),
    };
    let error_alone = match (checked, &readback) {
        (true, None) => Some(stream.alloc_zeroed::<u32>(1)?),
        _ => None,
    };
    match (checked, &readback, &error_alone) {
        (true, Some(r), _) => args.push(KernelArg::Ptr(r.slice(strings..)?.address())),
        (true, None, Some(word)) => args.push(word.into()),
        _ => {}
    }
    if n > 0 {
        let cfg = LaunchConfig::blocks(stream.device().grid_stride_blocks(n));
        // SAFETY: the arguments follow `ValueKernel`'s documented layout; inputs hold the
        // batch's rows of the types the generated code reads, `rows` (when given) holds `n`
        // indices of those rows (a filter's kept rows), outputs `n` values (or bits, or
        // string lengths) and a validity word per 32 of them.
        unsafe { stream.launch(kernel, cfg, &args)? };
        if let Some(word) = &error_alone {
            ErrorFlag::raise(
                stream.to_vec(word)?.first().copied().unwrap_or(0),
                &values.checks,
            )?;
        }
        let mut totals = Vec::new();
        if let Some(readback) = &mut readback {
            // Every string output's lengths become offsets, their totals go next to the error
            // word, and all of it comes back at once.
            let mut k = 0;
            for b in &mut buffers {
                if let Buffers::Strings(offsets, _, _) = b {
                    spate_kernels::scan::exclusive_sum_in_place(stream, offsets)?;
                    stream.copy_device(offsets.slice(n..)?, readback, k)?;
                    k += 1;
                }
            }
            totals = stream.to_vec(&*readback)?;
            if checked {
                // Little-endian: the u32 error word is the low half of the last u64. Raised
                // before any string buffer is sized from totals an error left meaningless.
                let error_word = totals.pop().unwrap_or(0) as u32;
                ErrorFlag::raise(error_word, &values.checks)?;
            }
        }
        if strings > 0 {
            for (b, (&at, &total)) in buffers
                .iter_mut()
                .filter(|b| matches!(b, Buffers::Strings(..)))
                .zip(byte_args.iter().zip(&totals))
            {
                let Buffers::Strings(_, bytes, _) = b else {
                    continue;
                };
                // Exactly `total` bytes: Arrow validates the whole buffer as UTF-8.
                let out = stream.alloc::<u8>(total as usize)?;
                args[at] = (&out).into();
                *bytes = Some(out);
            }
            args[pass_arg] = KernelArg::U32(1);
            // SAFETY: as above; each string output now has its offsets and room for its
            // bytes.
            unsafe { stream.launch(kernel, cfg, &args)? };
        }
    }
    let mut columns = Vec::with_capacity(buffers.len());
    for (b, data_type) in buffers.into_iter().zip(&values.outputs) {
        let validity_of = |validity| {
            Some(DeviceValidity {
                bytes: DeviceBytes::new(validity),
                offset: 0,
            })
        };
        let (values, validity) = match b {
            Buffers::Strings(offsets, bytes, validity) => {
                let bytes = match bytes {
                    Some(bytes) => bytes,
                    None => stream.alloc::<u8>(0)?,
                };
                (
                    DeviceValues::LargeUtf8 {
                        offsets: DeviceBytes::new(offsets.into_bytes()),
                        bytes: DeviceBytes::new(bytes),
                    },
                    validity_of(validity),
                )
            }
            Buffers::Fixed(data, validity) => (
                match device_layout(data_type) {
                    Some(crate::column::Layout::Fixed(width)) => DeviceValues::Fixed {
                        bytes: DeviceBytes::new(data),
                        width,
                    },
                    _ => DeviceValues::Bits {
                        bytes: DeviceBytes::new(data),
                        offset: 0,
                    },
                },
                validity_of(validity),
            ),
        };
        columns.push(DeviceColumn::with_uncounted_nulls(
            data_type.clone(),
            n,
            validity,
            values,
        ));
    }
    Ok(columns)
}

/// Finite bounds of the values `expr` can take over rows of `schema`, as f64, when they can be
/// shown: from the ranges of its decimal columns' types and its literals, through DataFusion's
/// interval arithmetic (`PhysicalExpr::evaluate_bounds`, which rounds float bounds outward).
/// Lets a float-to-decimal cast of a bounded value (`CAST(0.2 * CAST(avg(q) AS DOUBLE) AS
/// DECIMAL(30, 15))` in TPC-H q17) drop a check that can never fire. NULLs need no bound: a
/// cast of NULL is NULL.
fn value_bounds(expr: &dyn PhysicalExpr, schema: &Schema) -> Option<(f64, f64)> {
    use datafusion::logical_expr::interval_arithmetic::Interval;

    fn interval(expr: &dyn PhysicalExpr, schema: &Schema) -> Option<Interval> {
        if let Some(c) = expr.downcast_ref::<Column>() {
            return match *schema.fields().get(c.index())?.data_type() {
                DataType::Decimal128(p, s) => {
                    let max = 10i128.checked_pow(u32::from(p))? - 1;
                    Interval::try_new(
                        ScalarValue::Decimal128(Some(-max), p, s),
                        ScalarValue::Decimal128(Some(max), p, s),
                    )
                    .ok()
                }
                _ => None,
            };
        }
        if let Some(l) = expr.downcast_ref::<Literal>() {
            let v = l.value();
            return (!v.is_null()).then(|| Interval::try_new(v.clone(), v.clone()).ok())?;
        }
        let children = expr
            .children()
            .into_iter()
            .map(|c| interval(c.as_ref(), schema))
            .collect::<Option<Vec<_>>>()?;
        if children.is_empty() {
            return None;
        }
        let refs: Vec<&Interval> = children.iter().collect();
        expr.evaluate_bounds(&refs).ok()
    }

    let bounds = interval(expr, schema)?;
    let as_f64 = |v: &ScalarValue| match v.cast_to(&DataType::Float64).ok()? {
        ScalarValue::Float64(Some(x)) if x.is_finite() => Some(x),
        _ => None,
    };
    Some((as_f64(bounds.lower())?, as_f64(bounds.upper())?))
}

pub(crate) fn blake3_hex(text: &str) -> String {
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
    use spate_kernels::{KernelArg, LaunchConfig};

    let n = batch.bound();
    let out = stream.alloc::<u8>(n)?;
    if n == 0 {
        return Ok(out);
    }
    let mut args = input_args(&predicate.inputs, &predicate.scalars, batch)?;
    args.push(batch.row_count().live_arg());
    args.push(KernelArg::U64(n as u64));
    args.push((&out).into());
    let err = ErrorFlag::new(stream, &predicate.checks, &mut args)?;
    let cfg = LaunchConfig::blocks(stream.device().grid_stride_blocks(n));
    // SAFETY: the arguments follow `PredicateKernel::inputs`' documented layout; each column
    // holds `n` rows of the type the generated code reads (checked when it was generated), and
    // `out` holds `n` bytes.
    unsafe { stream.launch(kernel, cfg, &args)? };
    err.check(stream, &predicate.checks)?;
    Ok(out)
}

/// The `err` word of a kernel whose expressions can fail: a bit per kind of error.
struct ErrorFlag(Option<spate_kernels::DeviceBuffer<u32>>);

impl ErrorFlag {
    /// An arithmetic overflow.
    const OVERFLOW: u32 = 1;
    /// An integer division (or remainder) by zero.
    const DIVIDE_BY_ZERO: u32 = 2;
    /// A value a cast cannot represent in the target type.
    const CAST: u32 = 4;
    /// A decimal too large for its target precision.
    const PRECISION: u32 = 8;

    /// A zeroed flag passed as the kernel's last argument, when it has checks.
    fn new(
        stream: &spate_kernels::Stream,
        checks: &[(u32, String)],
        args: &mut Vec<spate_kernels::KernelArg>,
    ) -> crate::error::Result<Self> {
        if checks.is_empty() {
            return Ok(ErrorFlag(None));
        }
        let flag = stream.alloc_zeroed::<u32>(1)?;
        args.push((&flag).into());
        Ok(ErrorFlag(Some(flag)))
    }

    /// Fails as the CPU's checked kernels do when a check fired (waits for the stream).
    fn check(
        self,
        stream: &spate_kernels::Stream,
        checks: &[(u32, String)],
    ) -> crate::error::Result<()> {
        let Some(flag) = self.0 else {
            return Ok(());
        };
        let bits = stream.to_vec(&flag)?.first().copied().unwrap_or(0);
        Self::raise(bits, checks)
    }

    /// The error the CPU raises for the error word `bits` (none when it is zero).
    fn raise(bits: u32, checks: &[(u32, String)]) -> crate::error::Result<()> {
        use arrow::error::ArrowError;
        if bits == 0 {
            return Ok(());
        }
        // The CPU fails on the first error it meets; with several kinds in one batch, report
        // the most specific.
        let message = |code: u32| {
            checks
                .iter()
                .filter(|(c, _)| *c == code)
                .map(|(_, m)| m.as_str())
                .collect::<Vec<_>>()
                .join("; ")
        };
        Err(if bits & Self::DIVIDE_BY_ZERO != 0 {
            ArrowError::DivideByZero
        } else if bits & Self::CAST != 0 {
            ArrowError::CastError(message(Self::CAST))
        } else if bits & Self::PRECISION != 0 {
            ArrowError::InvalidArgumentError(message(Self::PRECISION))
        } else {
            ArrowError::ArithmeticOverflow(message(Self::OVERFLOW))
        }
        .into())
    }
}
