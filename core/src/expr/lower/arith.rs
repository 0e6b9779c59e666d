//! Binary operators: logic, comparisons, and arithmetic with DataFusion's result types and
//! failures (integers wrap, integer division checks its divisor, decimals take DataFusion's
//! result precision and scale and run checked where they may overflow i128).

use arrow::datatypes::DataType;
use datafusion::common::ScalarValue;
use datafusion::logical_expr::Operator;
use datafusion::physical_expr::expressions::{BinaryExpr, Literal};

use super::{INT32, Lowerer, Sign, boxed};
use crate::expr::Unsupported;
use crate::expr::abi::ErrorBits;
use crate::expr::ir::{Arith, BitOp, Check, Cmp, Node, Op};
use crate::expr::types::DevType;

/// `(precision, scale)`.
type Shape = (u8, i8);

impl Lowerer<'_> {
    pub(super) fn binary(&mut self, b: &BinaryExpr) -> Result<Node, Unsupported> {
        let op = b.op();
        if matches!(op, Operator::Plus | Operator::Minus)
            && b.left().data_type(self.schema).ok() == Some(DataType::Date32)
            && let Some(interval) = b.right().downcast_ref::<Literal>().map(Literal::value)
            && matches!(interval.data_type(), DataType::Interval(_))
        {
            let date = self.lower(b.left().as_ref())?;
            return date_interval(b, date, interval);
        }
        let l = self.lower(b.left().as_ref())?;
        let r = self.lower(b.right().as_ref())?;
        match op {
            Operator::And | Operator::Or => {
                if l.ty != DevType::Bool || r.ty != DevType::Bool {
                    return Err(Unsupported(format!("{op} of non-booleans in `{b}`")));
                }
                Ok(Node::new(
                    DevType::Bool,
                    Op::Logic {
                        and: *op == Operator::And,
                        left: boxed(l),
                        right: boxed(r),
                    },
                ))
            }
            Operator::Eq => self.compare(b, Cmp::Eq, l, r),
            Operator::NotEq => self.compare(b, Cmp::NotEq, l, r),
            Operator::Lt => self.compare(b, Cmp::Lt, l, r),
            Operator::LtEq => self.compare(b, Cmp::LtEq, l, r),
            Operator::Gt => self.compare(b, Cmp::Gt, l, r),
            Operator::GtEq => self.compare(b, Cmp::GtEq, l, r),
            Operator::IsDistinctFrom | Operator::IsNotDistinctFrom => {
                if !l.ty.comparable(r.ty) {
                    return Err(Unsupported(format!(
                        "comparison of different types in `{b}` ({:?} vs {:?})",
                        l.ty, r.ty
                    )));
                }
                Ok(Node::new(
                    DevType::Bool,
                    Op::Distinct {
                        not: *op == Operator::IsNotDistinctFrom,
                        left: boxed(l),
                        right: boxed(r),
                    },
                ))
            }
            Operator::Plus | Operator::Minus | Operator::Multiply => {
                let arith = match op {
                    Operator::Plus => Arith::Add,
                    Operator::Minus => Arith::Sub,
                    _ => Arith::Mul,
                };
                if matches!(l.ty, DevType::Dec { .. }) || matches!(r.ty, DevType::Dec { .. }) {
                    return self.decimal_arithmetic(b, arith, l, r);
                }
                if l.ty != r.ty {
                    return Err(Unsupported(format!(
                        "arithmetic on different types in `{b}`"
                    )));
                }
                if !matches!(l.ty, DevType::Int { .. } | DevType::F32 | DevType::F64) {
                    return Err(Unsupported(format!(
                        "arithmetic on {:?} in `{b}` is not supported on the GPU yet",
                        l.ty
                    )));
                }
                Ok(Node::new(
                    l.ty,
                    Op::Arith {
                        op: arith,
                        left: boxed(l),
                        right: boxed(r),
                    },
                ))
            }
            Operator::BitwiseAnd
            | Operator::BitwiseOr
            | Operator::BitwiseXor
            | Operator::BitwiseShiftLeft
            | Operator::BitwiseShiftRight => {
                if l.ty != r.ty || !matches!(l.ty, DevType::Int { .. }) {
                    return Err(unsupported(b, "bitwise operators on these types"));
                }
                let op = match op {
                    Operator::BitwiseAnd => BitOp::And,
                    Operator::BitwiseOr => BitOp::Or,
                    Operator::BitwiseXor => BitOp::Xor,
                    Operator::BitwiseShiftLeft => BitOp::ShiftLeft,
                    _ => BitOp::ShiftRight,
                };
                Ok(Node::new(
                    l.ty,
                    Op::Bitwise {
                        op,
                        left: boxed(l),
                        right: boxed(r),
                    },
                ))
            }
            // `||`: NULL when either side is. The parts of a concatenation of concatenations
            // are flattened.
            Operator::StringConcat => {
                if l.ty != DevType::Str || r.ty != DevType::Str {
                    return Err(unsupported(b, "`||` of non-strings"));
                }
                let mut parts = Vec::new();
                for side in [l, r] {
                    match side.op {
                        Op::Concat(inner) => parts.extend(inner),
                        _ => parts.push(side),
                    }
                }
                Ok(Node::new(DevType::Str, Op::Concat(parts)))
            }
            Operator::Divide | Operator::Modulo
                if matches!(l.ty, DevType::Dec { .. }) || matches!(r.ty, DevType::Dec { .. }) =>
            {
                self.decimal_divide(b, l, r)
            }
            Operator::Divide | Operator::Modulo => {
                let sign = self.sign_of(&r);
                divide(b, l, r, sign)
            }
            other => Err(Unsupported(format!(
                "operator {other} in `{b}` is not supported on the GPU yet"
            ))),
        }
    }

    /// The shapes of both decimal operands, and DataFusion's result type for `b`.
    fn decimal_shapes(
        &self,
        b: &BinaryExpr,
        l: &Node,
        r: &Node,
    ) -> Result<(Shape, Shape, Shape, DevType), Unsupported> {
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
            return Err(unsupported(b, "mixing decimals with other types"));
        };
        let result = self.data_type(b)?;
        let Some(
            ty @ DevType::Dec {
                precision: p,
                scale: s,
            },
        ) = DevType::of(&result)
        else {
            return Err(unsupported(b, "a non-decimal result"));
        };
        Ok(((p1, s1), (p2, s2), (p, s), ty))
    }

    /// Decimal `+ - *` with DataFusion's result type: directly when no value can overflow
    /// i128, else checked (an overflow fails the query as the CPU's checked kernels do).
    fn decimal_arithmetic(
        &self,
        b: &BinaryExpr,
        op: Arith,
        l: Node,
        r: Node,
    ) -> Result<Node, Unsupported> {
        let ((p1, s1), (p2, s2), (_, s), ty) = self.decimal_shapes(b, &l, &r)?;
        let (p1, p2) = (i32::from(p1), i32::from(p2));
        let (s1i, s2i, si) = (i32::from(s1), i32::from(s2), i32::from(s));
        let node = |left_shift: i8, right_shift: i8, overflow: Option<Check>| {
            Node::new(
                ty,
                Op::Decimal {
                    op,
                    left: boxed(l),
                    right: boxed(r),
                    left_shift,
                    right_shift,
                    overflow,
                },
            )
        };
        // Shapes that may overflow i128 run checked: an overflow in a row that is not NULL
        // fails the query as the CPU's checked kernels do.
        let checked = match op {
            Arith::Add | Arith::Sub => {
                s1 == s && s2 == s && s >= 0 && (p1 - s1i).max(p2 - s2i) + si + 1 > 38
            }
            Arith::Mul => si == s1i + s2i && s1 >= 0 && s2 >= 0 && p1 + p2 > 38,
        };
        if checked {
            return Ok(node(0, 0, Some(overflow(b))));
        }
        match op {
            Arith::Add | Arith::Sub => {
                if si != s1i.max(s2i) || (p1 - s1i).max(p2 - s2i) + si + 1 > 38 || s1 < 0 || s2 < 0
                {
                    return Err(unsupported(b, "this decimal precision and scale"));
                }
                Ok(node(s - s1, s - s2, None))
            }
            Arith::Mul => {
                if si != s1i + s2i || p1 + p2 > 38 {
                    return Err(unsupported(b, "this decimal precision and scale"));
                }
                Ok(node(0, 0, None))
            }
        }
    }

    /// Decimal `/` and `%` as Arrow's kernels. Division: the result scale is `s1 + 4` (at most
    /// 38); the dividend is multiplied by `10^(scale - s1 + s2)` (checked) and divided by the
    /// divisor, truncating toward zero. Remainder: both sides at the larger scale, the sign of
    /// the dividend. A zero divisor fails with "Divide by zero error".
    fn decimal_divide(&self, b: &BinaryExpr, l: Node, r: Node) -> Result<Node, Unsupported> {
        let ((p1, s1), (p2, s2), (_, s), ty) = self.decimal_shapes(b, &l, &r)?;
        if s1 < 0 || s2 < 0 || p1 > 38 || p2 > 38 {
            return Err(unsupported(b, "negative decimal scales"));
        }
        let remainder = *b.op() == Operator::Modulo;
        let (left_shift, right_shift) = if remainder {
            if s != s1.max(s2) {
                return Err(unsupported(b, "this decimal remainder scale"));
            }
            (s - s1, s - s2)
        } else {
            if s != s1.saturating_add(4).min(38) {
                return Err(unsupported(b, "this decimal division scale"));
            }
            let shift = i32::from(s) - i32::from(s1) + i32::from(s2);
            // |shift| <= 38 + 38: the scales are at most 38.
            if shift >= 0 {
                (shift as i8, 0)
            } else {
                (0, (-shift) as i8)
            }
        };
        if left_shift > 38 || right_shift > 38 {
            return Err(unsupported(b, "a decimal scaling beyond 10^38"));
        }
        Ok(Node::new(
            ty,
            Op::DecimalDivide {
                remainder,
                left: boxed(l),
                right: boxed(r),
                left_shift,
                right_shift,
                zero: divide_by_zero(),
                overflow: overflow(b),
            },
        ))
    }
}

fn unsupported(b: &BinaryExpr, why: &str) -> Unsupported {
    Unsupported(format!("`{b}`: {why} on the GPU is not supported yet"))
}

fn overflow(b: &BinaryExpr) -> Check {
    Check {
        code: ErrorBits::OVERFLOW,
        message: format!("Overflow happened on: {b} (on the GPU)"),
    }
}

fn divide_by_zero() -> Check {
    Check {
        code: ErrorBits::DIVIDE_BY_ZERO,
        message: String::new(),
    }
}

/// Integer and float `/` and `%` as Arrow's checked kernels: an integer division by zero fails
/// with "Divide by zero error", a signed `MIN / -1` with an overflow (`MIN % -1` is 0); floats
/// follow IEEE (`%` is C's `fmod`, as Rust's).
/// A divisor a CASE branch knows not to be zero (`sign`) needs no check, nor one above zero
/// (so not -1) the overflow check.
fn divide(b: &BinaryExpr, l: Node, r: Node, sign: Option<Sign>) -> Result<Node, Unsupported> {
    if l.ty != r.ty {
        return Err(unsupported(b, "division of different types"));
    }
    let remainder = *b.op() == Operator::Modulo;
    let (zero, overflow) = match l.ty {
        DevType::Int { signed, .. } => (
            sign.is_none().then(divide_by_zero),
            (signed && !remainder && sign != Some(Sign::Positive)).then(|| overflow(b)),
        ),
        DevType::F32 | DevType::F64 => (None, None),
        _ => {
            return Err(Unsupported(format!(
                "`{b}`: division of {:?} on the GPU is not supported yet",
                l.ty
            )));
        }
    };
    Ok(Node::new(
        l.ty,
        Op::Divide {
            remainder,
            left: boxed(l),
            right: boxed(r),
            zero,
            overflow,
        },
    ))
}

/// `date ± interval` for Date32 and a literal interval of months and days (no time part):
/// months first, the day clamped to the month's end, then days, as Arrow does.
fn date_interval(b: &BinaryExpr, date: Node, interval: &ScalarValue) -> Result<Node, Unsupported> {
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
    Ok(Node::new(
        INT32,
        Op::DateAddInterval {
            arg: boxed(date),
            months: sign * months,
            days: sign * days,
        },
    ))
}
