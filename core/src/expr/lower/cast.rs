//! The cast table: which casts the GPU runs, and how each may fail, as Arrow's cast kernels.
//! Widening casts convert directly. Narrowing integer casts, floats to integers (truncated),
//! floats to decimals (rounded half away from zero), decimals to integers (truncated), decimal
//! rescaling down (half away from zero) and casts into a smaller precision are checked, failing
//! as Arrow's casts do, or yielding NULL for a safe cast.

use arrow::datatypes::{DataType, Schema, TimeUnit};
use datafusion::common::ScalarValue;
use datafusion::logical_expr::interval_arithmetic::Interval;
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_expr::expressions::{CastExpr, Column, Literal};

use super::{Lowerer, boxed};
use crate::expr::Unsupported;
use crate::expr::abi::ErrorBits;
use crate::expr::ir::{Cast, Check, Node, OnFail, Op};
use crate::expr::types::DevType;

impl Lowerer<'_> {
    pub(super) fn cast(&mut self, c: &CastExpr) -> Result<Node, Unsupported> {
        let from_type = self.data_type(c.expr().as_ref())?;
        let to_type = c.cast_type();
        let safe = c.cast_options().safe;
        if let (DataType::Timestamp(from_unit, from_zone), DataType::Timestamp(to_unit, to_zone)) =
            (&from_type, to_type)
            && from_unit != to_unit
            && !(from_zone.is_none() && to_zone.is_some())
        {
            let a = self.lower(c.expr().as_ref())?;
            return Ok(timestamp_unit_cast(c, a, *from_unit, *to_unit, safe));
        }
        if !bit_preserving_temporal_cast(&from_type, to_type) {
            return Err(Unsupported(format!(
                "cast from {from_type} to {to_type} in `{c}` is not supported on the GPU yet"
            )));
        }
        let a = self.lower(c.expr().as_ref())?;
        let to = DevType::of(to_type).ok_or_else(|| {
            Unsupported(format!("cast to {to_type} is not supported on the GPU yet"))
        })?;
        let unsupported = || {
            Unsupported(format!(
                "cast from {:?} to {to_type} in `{c}` is not supported on the GPU yet",
                a.ty
            ))
        };
        if a.ty == DevType::Str || to == DevType::Str {
            // Between string types (Utf8 / Utf8View / LargeUtf8) the bytes are the same.
            if a.ty == to {
                return Ok(a);
            }
            return Err(unsupported());
        }
        let exact = |a: Node, cast: Cast| Node::new(to, cast_op(a, cast, OnFail::Never));
        let cast = match (a.ty, to) {
            (x, y) if x == y => return Ok(a),
            (
                DevType::Int {
                    bits: b1,
                    signed: s1,
                },
                DevType::Int {
                    bits: b2,
                    signed: s2,
                },
            ) if b2 > b1 && (s1 == s2 || (!s1 && s2)) || (b2 == b1 && s1 == s2) => Cast::Convert,
            (DevType::Int { .. } | DevType::F32, DevType::F64)
            | (DevType::Int { .. }, DevType::F32) => Cast::Convert,
            (DevType::Int { .. }, DevType::Dec { precision, scale })
                if scale >= 0
                    && a.ty.int_digits().is_some_and(|d| {
                        i32::from(d) + i32::from(scale) <= i32::from(precision)
                    }) =>
            {
                Cast::ScaleUp { shift: scale }
            }
            (DevType::Dec { scale, .. }, DevType::F64) if (0..=22).contains(&scale) => {
                Cast::DecimalToFloat { scale }
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
                Cast::ScaleUp { shift: s2 - s1 }
            }
            _ => {
                let reason = unsupported();
                return self.checked_cast(c, a, to)?.ok_or(reason);
            }
        };
        Ok(exact(a, cast))
    }

    /// Casts that can fail, as Arrow's: integers to narrower integers and floats to integers
    /// fail with "Can't cast value" when out of range (floats truncate toward zero; NaN
    /// fails), decimals to integers truncate, decimals rescale down rounding half away from
    /// zero, and a decimal result out of its precision's range fails with "too large or too
    /// small to store". A safe cast (`CastOptions::safe`) yields NULL instead.
    ///
    /// `Ok(None)`: a cast this does not handle.
    fn checked_cast(
        &mut self,
        c: &CastExpr,
        a: Node,
        to: DevType,
    ) -> Result<Option<Node>, Unsupported> {
        let doesnt_fit = || Check {
            code: ErrorBits::CAST,
            message: format!(
                "Cast error: a value of `{c}` does not fit {} (on the GPU)",
                c.cast_type()
            ),
        };
        // A cast that cannot fail raises nothing: its kernel then needs no error word.
        let mut infallible = false;
        let (cast, check) = match (a.ty, to) {
            (DevType::Int { .. } | DevType::Dec { .. }, DevType::Int { bits, signed }) => {
                let scale = match a.ty {
                    DevType::Dec { scale, .. } if scale >= 0 => scale,
                    DevType::Dec { .. } => return Ok(None),
                    _ => 0,
                };
                let (lo, hi) = if signed {
                    (-(1i128 << (bits - 1)), (1i128 << (bits - 1)) - 1)
                } else {
                    (0, (1i128 << bits) - 1)
                };
                (Cast::ToInt { scale, lo, hi }, doesnt_fit())
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
                (Cast::FloatToInt { lo, hi }, doesnt_fit())
            }
            (DevType::F32 | DevType::F64, DevType::Dec { precision, scale })
                if (0..=38).contains(&scale) && precision <= 38 =>
            {
                infallible =
                    value_bounds(c.expr().as_ref(), self.schema).is_some_and(|(lo, hi)| {
                        // Half the limit: room for the rounding of the bounds and of the scaling.
                        let limit = 0.5 * 10f64.powi(i32::from(precision) - i32::from(scale));
                        lo > -limit && hi < limit
                    });
                // Arrow fails a value that does not fit an i128 as a cast error, and one that
                // does but exceeds the precision as an invalid argument.
                let range = Check {
                    code: ErrorBits::CAST,
                    message: format!(
                        "Cannot cast to {}. Overflowing on a value of `{c}` (on the GPU)",
                        c.cast_type()
                    ),
                };
                (
                    Cast::FloatToDecimal {
                        scale,
                        precision,
                        range,
                    },
                    too_large(c, &c.cast_type().to_string()),
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
                (
                    Cast::ToDecimal {
                        from: s1,
                        to: s2,
                        precision: p2,
                    },
                    too_large(c, &format!("Decimal128 of precision {p2}")),
                )
            }
            _ => return Ok(None),
        };
        let fail = if c.cast_options().safe {
            OnFail::Null
        } else if infallible {
            OnFail::Never
        } else {
            OnFail::Raise(check)
        };
        Ok(Some(Node::new(to, cast_op(a, cast, fail))))
    }
}

fn cast_op(a: Node, cast: Cast, fail: OnFail) -> Op {
    Op::Cast {
        arg: boxed(a),
        cast,
        fail,
    }
}

fn too_large(c: &CastExpr, target: &str) -> Check {
    Check {
        code: ErrorBits::PRECISION,
        message: format!(
            "a value of `{c}` is too large or too small to store in a {target} (on the GPU)"
        ),
    }
}

/// A timestamp to another unit, as Arrow's cast: to a coarser unit the value divides,
/// truncating toward zero; to a finer one it multiplies, and a product outside Int64 fails
/// (NULL for a safe cast). The zone stays (the caller leaves a naive-to-zoned cast, which
/// shifts the value, to the CPU).
fn timestamp_unit_cast(c: &CastExpr, a: Node, from: TimeUnit, to: TimeUnit, safe: bool) -> Node {
    let per_second = |u: TimeUnit| -> i64 {
        match u {
            TimeUnit::Second => 1,
            TimeUnit::Millisecond => 1_000,
            TimeUnit::Microsecond => 1_000_000,
            TimeUnit::Nanosecond => 1_000_000_000,
        }
    };
    let (f, t) = (per_second(from), per_second(to));
    let ty = a.ty;
    if f > t {
        return Node::new(
            ty,
            cast_op(a, Cast::TimestampCoarser { by: f / t }, OnFail::Never),
        );
    }
    let fail = if safe {
        OnFail::Null
    } else {
        OnFail::Raise(Check {
            code: ErrorBits::OVERFLOW,
            message: format!(
                "Cannot cast a value of `{c}` to {}: converted value exceeds the representable \
                 i64 range (on the GPU)",
                c.cast_type()
            ),
        })
    };
    Node::new(ty, cast_op(a, Cast::TimestampFiner { by: t / f }, fail))
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

/// Finite bounds of the values `expr` can take over rows of `schema`, as f64, when they can be
/// shown: from the ranges of its decimal columns' types and its literals, through DataFusion's
/// interval arithmetic (`PhysicalExpr::evaluate_bounds`, which rounds float bounds outward).
/// Lets a float-to-decimal cast of a bounded value (`CAST(0.2 * CAST(avg(q) AS DOUBLE) AS
/// DECIMAL(30, 15))` in TPC-H q17) drop a check that can never fire. NULLs need no bound: a
/// cast of NULL is NULL.
fn value_bounds(expr: &dyn PhysicalExpr, schema: &Schema) -> Option<(f64, f64)> {
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
