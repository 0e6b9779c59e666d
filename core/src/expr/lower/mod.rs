//! `PhysicalExpr` → the kernel IR ([`super::ir`]). Every decision about an expression is made
//! here: whether the GPU runs it (anything else is [`Unsupported`], with the expression named),
//! its device type, and where it may fail. Parity with DataFusion lives here too: the decimal
//! shapes ([`arith`]) and the cast table ([`cast`]). Where an expression may fail is the
//! emitter's guards' business: a CASE branch, a COALESCE argument and the right side of AND/OR
//! fail only for the rows DataFusion evaluates them for whatever its batches
//! ([`super::emit`]).

mod arith;
mod cast;
mod vector;

pub(crate) use vector::constant_vector;

use std::sync::Arc;

use arrow::datatypes::{DataType, Schema, TimeUnit};
use datafusion::common::ScalarValue;
use datafusion::logical_expr::Operator;
use datafusion::physical_expr::expressions::{
    BinaryExpr, CaseExpr, CastExpr, Column, InListExpr, IsNotNullExpr, IsNullExpr, LikeExpr,
    Literal, NegativeExpr, NotExpr,
};
use datafusion::physical_expr::scalar_subquery::ScalarSubqueryExpr;
use datafusion::physical_expr::{PhysicalExpr, ScalarFunctionExpr};

use super::Unsupported;
use super::abi::ErrorBits;
use super::abi::KernelInput;
use super::ir::{Cast, Check, Cmp, Const, DateField, FloatFn, LikePattern, Node, OnFail, Op};
use super::scalars::{RuntimeScalar, scalar_bits};
use super::types::DevType;

/// Lowers the expressions of one kernel, collecting the columns and runtime scalars they read
/// (the kernel's parameters, in order).
pub(crate) struct Lowerer<'a> {
    schema: &'a Schema,
    pub(crate) inputs: Vec<KernelInput>,
    pub(crate) scalars: Vec<RuntimeScalar>,
    /// Constant vectors the kernel reads from device memory (a distance's query).
    pub(crate) vectors: Vec<Arc<[f32]>>,
    /// What the CASE branches being lowered know of the rows they run for: input columns that
    /// are not zero there (`Sign::Positive` when above it), from their WHEN (`WHEN c > 0 THEN
    /// x / c`). A division by such a column cannot fail.
    facts: Vec<(usize, Sign)>,
}

/// What a WHEN tells of a column's sign.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Sign {
    /// Not zero.
    NonZero,
    /// Above zero (so neither zero nor -1).
    Positive,
}

fn boxed(node: Node) -> Box<Node> {
    Box::new(node)
}

impl<'a> Lowerer<'a> {
    pub(crate) fn new(schema: &'a Schema) -> Self {
        Lowerer {
            schema,
            inputs: Vec::new(),
            scalars: Vec::new(),
            vectors: Vec::new(),
            facts: Vec::new(),
        }
    }

    /// `expr`'s Arrow type over the input schema.
    fn data_type(&self, expr: &dyn PhysicalExpr) -> Result<DataType, Unsupported> {
        expr.data_type(self.schema)
            .map_err(|e| Unsupported(format!("`{expr}`: {e}")))
    }

    pub(crate) fn lower(&mut self, expr: &dyn PhysicalExpr) -> Result<Node, Unsupported> {
        if let Some(c) = expr.downcast_ref::<Column>() {
            return self.column(c);
        }
        if let Some(l) = expr.downcast_ref::<Literal>() {
            return literal(l.value());
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
            match f.name() {
                "coalesce" => return self.coalesce(f.args()),
                "date_part" => return self.date_part(f),
                "character_length" | "octet_length" => return self.length(f),
                "substr" | "substring" => return self.substr(f),
                "abs" => return self.abs(f),
                "round" => return self.round(f),
                "floor" | "ceil" => return self.floor_ceil(f),
                "btrim" | "ltrim" | "rtrim" => return self.trim(f),
                "upper" => return self.upper(f),
                "replace" => return self.replace(f),
                "starts_with" | "ends_with" => return self.affix(f),
                "strpos" | "instr" | "position" => return self.position(f),
                "nullif" => return self.nullif(f),
                name => {
                    if let Some(func) = FloatFn::of(name, f.args().len()) {
                        return self.float_math(f, func);
                    }
                    if let Some(metric) = crate::vector::Metric::of_function(name) {
                        return self.distance(f, metric);
                    }
                }
            }
        }
        if let Some(n) = expr.downcast_ref::<NotExpr>() {
            let a = self.lower(n.arg().as_ref())?;
            if a.ty != DevType::Bool {
                return Err(Unsupported(format!("NOT of a non-boolean in `{expr}`")));
            }
            return Ok(Node::new(DevType::Bool, Op::Not(boxed(a))));
        }
        if let Some(neg) = expr.downcast_ref::<NegativeExpr>() {
            let a = self.lower(neg.arg().as_ref())?;
            if !matches!(
                a.ty,
                DevType::Int { signed: true, .. }
                    | DevType::Dec { .. }
                    | DevType::F32
                    | DevType::F64
            ) {
                return Err(Unsupported(format!(
                    "negation of {:?} in `{expr}` is not supported on the GPU yet",
                    a.ty
                )));
            }
            return Ok(Node::new(a.ty, Op::Negate(boxed(a))));
        }
        if let Some(n) = expr.downcast_ref::<IsNullExpr>() {
            let arg = boxed(self.lower(n.arg().as_ref())?);
            return Ok(Node::new(
                DevType::Bool,
                Op::IsNull {
                    arg,
                    negated: false,
                },
            ));
        }
        if let Some(n) = expr.downcast_ref::<IsNotNullExpr>() {
            let arg = boxed(self.lower(n.arg().as_ref())?);
            return Ok(Node::new(DevType::Bool, Op::IsNull { arg, negated: true }));
        }
        Err(Unsupported(format!(
            "expression `{expr}` is not supported on the GPU yet"
        )))
    }

    fn column(&mut self, c: &Column) -> Result<Node, Unsupported> {
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
        let slot = self.input_slot(c.index(), field.data_type());
        Ok(Node::new(ty, Op::Column { slot }))
    }

    /// The kernel's parameter slot of input column `index`, added on first use.
    fn input_slot(&mut self, index: usize, data_type: &DataType) -> usize {
        match self.inputs.iter().position(|i| i.index == index) {
            Some(slot) => slot,
            None => {
                self.inputs.push(KernelInput {
                    index,
                    data_type: data_type.clone(),
                });
                self.inputs.len() - 1
            }
        }
    }

    /// A scalar subquery's result, read from the kernel's parameters.
    fn scalar_subquery(&mut self, q: &ScalarSubqueryExpr) -> Result<Node, Unsupported> {
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
        #[allow(
            deprecated,
            reason = "the index is the only handle on the subquery's result; the accessor is \
                      deprecated only for protobuf serialization"
        )]
        let index = q.index();
        self.scalars.push(RuntimeScalar {
            results: q.results().clone(),
            index,
            data_type,
        });
        Ok(Node::new(
            ty,
            Op::Scalar {
                slot: self.scalars.len() - 1,
            },
        ))
    }

    /// `x [NOT] IN (list)`.
    fn in_list(&mut self, l: &InListExpr) -> Result<Node, Unsupported> {
        let x = self.lower(l.expr().as_ref())?;
        let float = matches!(x.ty, DevType::F32 | DevType::F64);
        let mut items = Vec::with_capacity(l.list().len());
        for item in l.list() {
            let o = self.lower(item.as_ref())?;
            if !x.ty.comparable(o.ty) || x.ty == DevType::Bool {
                return Err(Unsupported(format!(
                    "IN list of mixed or boolean types in `{l}` is not supported on the GPU yet"
                )));
            }
            // DataFusion matches a list of float literals through a set, by total-order
            // equality: -0.0 does not match 0.0 there (unlike `=`), NaN matches NaN.
            if float && item.downcast_ref::<Literal>().is_none() {
                return Err(Unsupported(format!(
                    "a float IN list with non-literal values in `{l}` is not supported on the \
                     GPU yet"
                )));
            }
            items.push(o);
        }
        Ok(Node::new(
            DevType::Bool,
            Op::InList {
                arg: boxed(x),
                items,
                total_order: float,
                negated: l.negated(),
            },
        ))
    }

    /// `CASE [x] WHEN ... THEN ... [ELSE ...] END`. `CASE x WHEN v` matches where Arrow's `eq`
    /// (which DataFusion's CASE uses) finds `x` and `v` equal (a NULL x matches nothing), so it
    /// lowers to a searched CASE over that comparison.
    fn case(&mut self, c: &CaseExpr) -> Result<Node, Unsupported> {
        let base = match c.expr() {
            Some(base) => Some(self.lower(base.as_ref())?),
            None => None,
        };
        let data_type = self.data_type(c)?;
        let ty = DevType::of(&data_type).ok_or_else(|| {
            Unsupported(format!(
                "CASE yielding {data_type} is not supported on the GPU yet"
            ))
        })?;
        let mut branches = Vec::with_capacity(c.when_then_expr().len());
        for (when, then) in c.when_then_expr() {
            let w = self.lower(when.as_ref())?;
            let cond = match &base {
                Some(base) => {
                    if !base.ty.comparable(w.ty) {
                        return Err(Unsupported(format!(
                            "`CASE <expr> WHEN ...` comparing {:?} with {:?} in `{c}` is not \
                             supported on the GPU yet",
                            base.ty, w.ty
                        )));
                    }
                    Node::new(
                        DevType::Bool,
                        Op::Compare {
                            cmp: Cmp::TotalEq,
                            left: boxed(base.clone()),
                            right: boxed(w),
                        },
                    )
                }
                None => w,
            };
            if cond.ty != DevType::Bool {
                return Err(Unsupported(format!("a non-boolean WHEN in `{c}`")));
            }
            // The THEN runs only where the WHEN is TRUE: what that tells holds there.
            let known = self.facts.len();
            if base.is_none() {
                sign_facts(when.as_ref(), &mut self.facts);
            }
            let value = self.lower(then.as_ref());
            self.facts.truncate(known);
            let value = value?;
            if value.ty != ty {
                return Err(Unsupported(format!(
                    "CASE branches of different types in `{c}`"
                )));
            }
            branches.push((cond, value));
        }
        let otherwise = match c.else_expr() {
            Some(e) => {
                let value = self.lower(e.as_ref())?;
                if value.ty != ty {
                    return Err(Unsupported(format!(
                        "CASE branches of different types in `{c}`"
                    )));
                }
                Some(boxed(value))
            }
            None => None,
        };
        Ok(Node::new(
            ty,
            Op::Case {
                branches,
                otherwise,
            },
        ))
    }

    /// `coalesce(a, b, ...)`: the first non-NULL argument.
    fn coalesce(&mut self, args: &[Arc<dyn PhysicalExpr>]) -> Result<Node, Unsupported> {
        let mut lowered = Vec::with_capacity(args.len());
        for a in args {
            let node = self.lower(a.as_ref())?;
            if lowered.first().is_some_and(|f: &Node| f.ty != node.ty) {
                return Err(Unsupported(
                    "coalesce of different types on the GPU is not supported yet".into(),
                ));
            }
            lowered.push(node);
        }
        let Some(ty) = lowered.first().map(|n| n.ty) else {
            return Err(Unsupported("coalesce() without arguments".into()));
        };
        Ok(Node::new(ty, Op::Coalesce(lowered)))
    }

    /// `s [NOT] LIKE 'pattern'` (case-sensitive, a literal pattern).
    fn like(&mut self, l: &LikeExpr) -> Result<Node, Unsupported> {
        let unsupported =
            |why: &str| Unsupported(format!("`{l}`: {why} is not supported on the GPU yet"));
        if l.case_insensitive() {
            return Err(unsupported("ILIKE"));
        }
        let pattern = match string_literal(l.pattern().as_ref()) {
            Some(p) => p.to_string(),
            None => return Err(unsupported("a LIKE pattern that is not a string literal")),
        };
        let arg = self.lower(l.expr().as_ref())?;
        if arg.ty != DevType::Str {
            return Err(unsupported("LIKE on a non-string"));
        }
        Ok(Node::new(
            DevType::Bool,
            Op::Like {
                arg: boxed(arg),
                pattern: like_pattern(&pattern),
                negated: l.negated(),
            },
        ))
    }

    /// `character_length(s)` (also `length`, `char_length`: code points) and
    /// `octet_length(s)` (bytes), typed as DataFusion types them (Int32, or Int64 for
    /// LargeUtf8).
    fn length(&mut self, f: &ScalarFunctionExpr) -> Result<Node, Unsupported> {
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
        let a = self.lower(arg.as_ref())?;
        if a.ty != DevType::Str {
            return Err(unsupported());
        }
        Ok(Node::new(
            ty,
            Op::Length {
                arg: boxed(a),
                chars: f.name() != "octet_length",
            },
        ))
    }

    /// `substr(s, start[, count])` with literal positions: the characters at 1-based positions
    /// `[start, start + count)` that exist, as DataFusion (and PostgreSQL) define it. A
    /// negative count is an error on the CPU, so it stays there.
    fn substr(&mut self, f: &ScalarFunctionExpr) -> Result<Node, Unsupported> {
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
        let a = self.lower(arg.as_ref())?;
        if a.ty != DevType::Str {
            return Err(unsupported());
        }
        Ok(Node::new(
            DevType::Str,
            Op::Substr {
                arg: boxed(a),
                from: start.max(1),
                to: count.map_or(i64::MAX, |c| start.saturating_add(c)),
            },
        ))
    }

    /// `extract(field FROM x)` (DataFusion's `date_part`) of a Date32 or a timestamp without a
    /// zone, as Int32: year, quarter, month, ISO week, day, doy, dow, isodow, and of timestamps
    /// hour, minute and second.
    fn date_part(&mut self, f: &ScalarFunctionExpr) -> Result<Node, Unsupported> {
        let unsupported = || Unsupported(format!("`{f}` is not supported on the GPU yet"));
        let [part, arg] = f.args() else {
            return Err(unsupported());
        };
        let part = string_literal(part.as_ref())
            .ok_or_else(unsupported)?
            .to_lowercase();
        let field = match part.as_str() {
            "year" => DateField::Year,
            "quarter" => DateField::Quarter,
            "month" => DateField::Month,
            "week" => DateField::Week,
            "day" => DateField::Day,
            "doy" => DateField::DayOfYear,
            "dow" => DateField::DayOfWeek,
            "isodow" => DateField::IsoDayOfWeek,
            "hour" => DateField::Hour,
            "minute" => DateField::Minute,
            "second" => DateField::Second,
            _ => return Err(unsupported()),
        };
        // Dates count days; timestamps without a zone count their unit (a zone would need its
        // offsets on the device).
        let per_second = match arg.data_type(self.schema).ok() {
            Some(DataType::Date32) if !field.of_time() => None,
            Some(DataType::Timestamp(unit, None)) => Some(match unit {
                TimeUnit::Second => 1,
                TimeUnit::Millisecond => 1_000,
                TimeUnit::Microsecond => 1_000_000,
                TimeUnit::Nanosecond => 1_000_000_000,
            }),
            _ => return Err(unsupported()),
        };
        if f.return_type() != &DataType::Int32 {
            return Err(unsupported());
        }
        let a = self.lower(arg.as_ref())?;
        Ok(Node::new(
            INT32,
            Op::DatePart {
                arg: boxed(a),
                field,
                per_second,
            },
        ))
    }

    /// `abs(x)` as DataFusion's: floats clear the sign bit, decimals wrap, unsigned integers
    /// are themselves, and a signed integer's MIN fails ("overflow on abs").
    fn abs(&mut self, f: &ScalarFunctionExpr) -> Result<Node, Unsupported> {
        let unsupported = || Unsupported(format!("`{f}` is not supported on the GPU yet"));
        let [arg] = f.args() else {
            return Err(unsupported());
        };
        let a = self.lower(arg.as_ref())?;
        if DevType::of(f.return_type()) != Some(a.ty) {
            return Err(unsupported());
        }
        let overflow = match a.ty {
            DevType::Int { signed: false, .. } => return Ok(a),
            DevType::Int { bits, signed: true } => {
                let array = format!("Int{bits}Array");
                let min = -(1i128 << (bits - 1));
                Some(Check {
                    code: ErrorBits::COMPUTE,
                    message: format!("{array} overflow on abs({min}) (on the GPU)"),
                })
            }
            DevType::F32 | DevType::F64 | DevType::Dec { .. } => None,
            _ => return Err(unsupported()),
        };
        Ok(Node::new(
            a.ty,
            Op::Abs {
                arg: boxed(a),
                overflow,
            },
        ))
    }

    /// `floor(x)` and `ceil(x)` on floats (DataFusion's keep the type: Rust's `f64::floor`).
    fn floor_ceil(&mut self, f: &ScalarFunctionExpr) -> Result<Node, Unsupported> {
        let unsupported = || Unsupported(format!("`{f}` is not supported on the GPU yet"));
        let [arg] = f.args() else {
            return Err(unsupported());
        };
        let a = self.lower(arg.as_ref())?;
        if !matches!(a.ty, DevType::F32 | DevType::F64)
            || DevType::of(f.return_type()) != Some(a.ty)
        {
            return Err(unsupported());
        }
        Ok(Node::new(
            a.ty,
            Op::FloorCeil {
                arg: boxed(a),
                ceil: f.name() == "ceil",
            },
        ))
    }

    /// A float math function (`sqrt`, `ln`, `power`, ...) on Float32 or Float64, whose result
    /// has its arguments' type, as DataFusion's (which casts other numbers to Float64 first).
    fn float_math(&mut self, f: &ScalarFunctionExpr, func: FloatFn) -> Result<Node, Unsupported> {
        let ty = DevType::of(f.return_type())
            .filter(|t| matches!(t, DevType::F32 | DevType::F64))
            .ok_or_else(|| Unsupported(format!("`{f}` is not supported on the GPU yet")))?;
        let args = f
            .args()
            .iter()
            .map(|a| self.lower(a.as_ref()))
            .collect::<Result<Vec<_>, _>>()?;
        if args.iter().any(|a| a.ty != ty) {
            return Err(Unsupported(format!(
                "`{f}` with arguments of another type is not supported on the GPU yet"
            )));
        }
        // Power runs on Float64 only, as DataFusion's.
        if func == FloatFn::Power && ty != DevType::F64 {
            return Err(Unsupported(format!(
                "`{f}` is not supported on the GPU yet"
            )));
        }
        let fails = match func {
            FloatFn::Sqrt => Some("cannot take square root of a negative number"),
            FloatFn::Power => Some("zero raised to a negative power is undefined"),
            _ => None,
        }
        .map(|why| Check {
            code: ErrorBits::COMPUTE,
            message: format!("Compute error: {why} (on the GPU)"),
        });
        Ok(Node::new(ty, Op::FloatMath { func, args, fails }))
    }

    /// `btrim`, `ltrim` and `rtrim`, as DataFusion's: without a second argument they remove
    /// spaces; with a literal one, any of its characters (ASCII ones here).
    fn trim(&mut self, f: &ScalarFunctionExpr) -> Result<Node, Unsupported> {
        let unsupported = || Unsupported(format!("`{f}` is not supported on the GPU yet"));
        let (arg, chars) = match f.args() {
            [arg] => (arg, b" ".to_vec()),
            [arg, chars] => match string_literal(chars.as_ref()) {
                Some(c) if c.is_ascii() => (arg, c.as_bytes().to_vec()),
                _ => return Err(unsupported()),
            },
            _ => return Err(unsupported()),
        };
        let a = self.lower(arg.as_ref())?;
        if a.ty != DevType::Str || DevType::of(f.return_type()) != Some(DevType::Str) {
            return Err(unsupported());
        }
        let name = f.name();
        Ok(Node::new(
            DevType::Str,
            Op::Trim {
                arg: boxed(a),
                chars,
                left: name != "rtrim",
                right: name != "ltrim",
            },
        ))
    }

    /// `upper(s)`, with Rust's full Unicode case mapping (as DataFusion's).
    fn upper(&mut self, f: &ScalarFunctionExpr) -> Result<Node, Unsupported> {
        let unsupported = || Unsupported(format!("`{f}` is not supported on the GPU yet"));
        let [arg] = f.args() else {
            return Err(unsupported());
        };
        let a = self.lower(arg.as_ref())?;
        if a.ty != DevType::Str || DevType::of(f.return_type()) != Some(DevType::Str) {
            return Err(unsupported());
        }
        Ok(Node::new(DevType::Str, Op::Upper(boxed(a))))
    }

    /// `replace(s, from, to)` with literal strings, `from` not empty (an empty one puts `to`
    /// between every character, which stays on the CPU).
    fn replace(&mut self, f: &ScalarFunctionExpr) -> Result<Node, Unsupported> {
        let unsupported = || Unsupported(format!("`{f}` is not supported on the GPU yet"));
        let [arg, from, to] = f.args() else {
            return Err(unsupported());
        };
        let text =
            |e: &Arc<dyn PhysicalExpr>| string_literal(e.as_ref()).map(|t| t.as_bytes().to_vec());
        let (Some(from), Some(to)) = (text(from), text(to)) else {
            return Err(unsupported());
        };
        let a = self.lower(arg.as_ref())?;
        if from.is_empty()
            || a.ty != DevType::Str
            || DevType::of(f.return_type()) != Some(DevType::Str)
        {
            return Err(unsupported());
        }
        Ok(Node::new(
            DevType::Str,
            Op::Replace {
                arg: boxed(a),
                from,
                to,
            },
        ))
    }

    /// `strpos(s, sub)` (also `instr`, `position`): Int32, or Int64 over LargeUtf8.
    fn position(&mut self, f: &ScalarFunctionExpr) -> Result<Node, Unsupported> {
        let unsupported = || Unsupported(format!("`{f}` is not supported on the GPU yet"));
        let [arg, sub] = f.args() else {
            return Err(unsupported());
        };
        let (a, p) = (self.lower(arg.as_ref())?, self.lower(sub.as_ref())?);
        let ty = DevType::of(f.return_type())
            .filter(|t| matches!(t, DevType::Int { signed: true, .. }))
            .ok_or_else(unsupported)?;
        if a.ty != DevType::Str || p.ty != DevType::Str {
            return Err(unsupported());
        }
        Ok(Node::new(
            ty,
            Op::Position {
                arg: boxed(a),
                sub: boxed(p),
            },
        ))
    }

    /// `starts_with(s, prefix)` and `ends_with(s, suffix)`, bytewise.
    fn affix(&mut self, f: &ScalarFunctionExpr) -> Result<Node, Unsupported> {
        let unsupported = || Unsupported(format!("`{f}` is not supported on the GPU yet"));
        let [arg, affix] = f.args() else {
            return Err(unsupported());
        };
        let (a, p) = (self.lower(arg.as_ref())?, self.lower(affix.as_ref())?);
        if a.ty != DevType::Str || p.ty != DevType::Str || f.return_type() != &DataType::Boolean {
            return Err(unsupported());
        }
        Ok(Node::new(
            DevType::Bool,
            Op::Affix {
                arg: boxed(a),
                affix: boxed(p),
                ends: f.name() == "ends_with",
            },
        ))
    }

    /// `nullif(a, b)`: NULL where Arrow's `eq` finds `a` and `b` equal (floats in total order),
    /// else `a`, as DataFusion's.
    fn nullif(&mut self, f: &ScalarFunctionExpr) -> Result<Node, Unsupported> {
        let [a, b] = f.args() else {
            return Err(Unsupported(format!("`{f}` takes two arguments")));
        };
        let (a, b) = (self.lower(a.as_ref())?, self.lower(b.as_ref())?);
        if !a.ty.comparable(b.ty) || DevType::of(f.return_type()) != Some(a.ty) {
            return Err(Unsupported(format!(
                "`{f}` over {:?} and {:?} is not supported on the GPU yet",
                a.ty, b.ty
            )));
        }
        let equal = Node::new(
            DevType::Bool,
            Op::Compare {
                cmp: Cmp::TotalEq,
                left: boxed(a.clone()),
                right: boxed(b),
            },
        );
        let ty = a.ty;
        Ok(Node::new(
            ty,
            Op::Case {
                branches: vec![(equal, Node::new(ty, Op::Const(None)))],
                otherwise: Some(boxed(a)),
            },
        ))
    }

    /// `round(x[, dp])` with a literal `dp`, as DataFusion's: floats through
    /// `(x * 10^dp).round() / 10^dp`; a decimal rounds half away from zero to scale `dp` (its
    /// result type's scale) when `dp` is below its scale, else stays as it is; an integer with
    /// `dp >= 0` stays as it is.
    fn round(&mut self, f: &ScalarFunctionExpr) -> Result<Node, Unsupported> {
        let unsupported = || Unsupported(format!("`{f}` is not supported on the GPU yet"));
        let (arg, dp) = match f.args() {
            [arg] => (arg, 0),
            [arg, dp] => {
                let dp = match dp.downcast_ref::<Literal>().map(Literal::value) {
                    Some(ScalarValue::Int32(Some(v))) => i64::from(*v),
                    Some(ScalarValue::Int64(Some(v))) => *v,
                    _ => return Err(unsupported()),
                };
                (arg, i32::try_from(dp).map_err(|_| unsupported())?)
            }
            _ => return Err(unsupported()),
        };
        let a = self.lower(arg.as_ref())?;
        let to = DevType::of(f.return_type()).ok_or_else(unsupported)?;
        match (a.ty, to) {
            (DevType::F32 | DevType::F64, _) if to == a.ty => Ok(Node::new(
                to,
                Op::RoundFloat {
                    arg: boxed(a),
                    factor: 10f64.powi(dp),
                },
            )),
            (DevType::Int { .. }, _) if to == a.ty && dp >= 0 => Ok(a),
            (
                DevType::Dec {
                    precision: p1,
                    scale: s1,
                },
                DevType::Dec {
                    precision: p2,
                    scale: s2,
                },
            ) if p1 == p2 && dp >= 0 && s1 >= 0 => {
                if i32::from(s1) <= dp {
                    return if s2 == s1 { Ok(a) } else { Err(unsupported()) };
                }
                if i32::from(s2) != dp {
                    return Err(unsupported());
                }
                // Fewer digits after the point, as many before (or one more, the carry, which
                // the precision leaves room for): the rescale cannot fail.
                Ok(Node::new(
                    to,
                    Op::Cast {
                        arg: boxed(a),
                        cast: Cast::ToDecimal {
                            from: s1,
                            to: s2,
                            precision: p2,
                        },
                        fail: OnFail::Never,
                    },
                ))
            }
            _ => Err(unsupported()),
        }
    }

    /// What the CASE branches being lowered know of input column `index`'s sign.
    pub(super) fn sign_of(&self, node: &Node) -> Option<Sign> {
        let slot = match &node.op {
            Op::Column { slot } => *slot,
            Op::Cast {
                arg,
                cast: Cast::Convert,
                ..
            } => return self.sign_of(arg),
            _ => return None,
        };
        let index = self.inputs.get(slot)?.index;
        let mut known = None;
        for (column, sign) in &self.facts {
            if *column == index {
                known = Some(match (known, sign) {
                    (Some(Sign::Positive), _) | (_, Sign::Positive) => Sign::Positive,
                    _ => Sign::NonZero,
                });
            }
        }
        known
    }

    /// A comparison, after both sides were lowered.
    fn compare(&self, b: &BinaryExpr, cmp: Cmp, l: Node, r: Node) -> Result<Node, Unsupported> {
        if !l.ty.comparable(r.ty) {
            return Err(Unsupported(format!(
                "comparison of different types in `{b}` ({:?} vs {:?})",
                l.ty, r.ty
            )));
        }
        Ok(Node::new(
            DevType::Bool,
            Op::Compare {
                cmp,
                left: boxed(l),
                right: boxed(r),
            },
        ))
    }
}

const INT32: DevType = DevType::Int {
    bits: 32,
    signed: true,
};

/// The signs of input columns that `when` being TRUE implies: `c > 0`, `c <> 0`, `c < 0`
/// (and `0 < c`, ...), and each side of an AND.
fn sign_facts(when: &dyn PhysicalExpr, facts: &mut Vec<(usize, Sign)>) {
    let Some(b) = when.downcast_ref::<BinaryExpr>() else {
        return;
    };
    if *b.op() == Operator::And {
        sign_facts(b.left().as_ref(), facts);
        sign_facts(b.right().as_ref(), facts);
        return;
    }
    let zero = |e: &Arc<dyn PhysicalExpr>| {
        e.downcast_ref::<Literal>().is_some_and(|l| {
            l.value().data_type().is_integer() && scalar_bits(l.value()) == Some((0, 0))
        })
    };
    let column = |e: &Arc<dyn PhysicalExpr>| e.downcast_ref::<Column>().map(Column::index);
    let (c, op) = match (column(b.left()), column(b.right())) {
        (Some(c), None) if zero(b.right()) => (c, *b.op()),
        (None, Some(c)) if zero(b.left()) => match b.op().swap() {
            Some(op) => (c, op),
            None => return,
        },
        _ => return,
    };
    match op {
        Operator::Gt => facts.push((c, Sign::Positive)),
        Operator::NotEq | Operator::Lt => facts.push((c, Sign::NonZero)),
        _ => {}
    }
}

/// The text of a non-null string literal.
fn string_literal(e: &dyn PhysicalExpr) -> Option<&str> {
    match e.downcast_ref::<Literal>().map(Literal::value)? {
        ScalarValue::Utf8(Some(t))
        | ScalarValue::LargeUtf8(Some(t))
        | ScalarValue::Utf8View(Some(t)) => Some(t),
        _ => None,
    }
}

/// A literal as a constant node.
fn literal(value: &ScalarValue) -> Result<Node, Unsupported> {
    let ty = DevType::of(&value.data_type()).ok_or_else(|| {
        Unsupported(format!(
            "literal {value} of type {} is not supported on the GPU yet",
            value.data_type()
        ))
    })?;
    if value.is_null() {
        return Ok(Node::new(ty, Op::Const(None)));
    }
    if let ScalarValue::Utf8(Some(text))
    | ScalarValue::LargeUtf8(Some(text))
    | ScalarValue::Utf8View(Some(text)) = value
    {
        return Ok(Node::new(
            ty,
            Op::Const(Some(Const::Bytes(text.as_bytes().to_vec()))),
        ));
    }
    let (lo, hi) = scalar_bits(value)
        .ok_or_else(|| Unsupported(format!("literal {value} is not supported on the GPU yet")))?;
    Ok(Node::new(ty, Op::Const(Some(Const::Bits(lo, hi)))))
}

/// A LIKE pattern compiled, as Arrow's LIKE reads it: `\x` is a literal `x` (a trailing `\` is
/// itself), `_` one character, `%` any run of characters.
fn like_pattern(pattern: &str) -> LikePattern {
    if !pattern.contains('_') && !pattern.contains('\\') {
        return LikePattern::Segments(pattern.split('%').map(|s| s.as_bytes().to_vec()).collect());
    }
    let (mut kinds, mut bytes) = (Vec::new(), Vec::new());
    let mut chars = pattern.chars();
    while let Some(ch) = chars.next() {
        let literal = match ch {
            '%' | '_' => {
                kinds.push(if ch == '%' { 2 } else { 1 });
                bytes.push(0);
                continue;
            }
            '\\' => chars.next().unwrap_or('\\'),
            other => other,
        };
        let mut buf = [0u8; 4];
        for b in literal.encode_utf8(&mut buf).bytes() {
            kinds.push(0);
            bytes.push(b);
        }
    }
    LikePattern::Tokens { kinds, bytes }
}
