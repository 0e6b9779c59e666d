//! The kernel IR: one row's computation as a typed tree, between DataFusion's `PhysicalExpr`
//! and CUDA C.
//!
//! [`super::lower`] builds it and makes every decision on the way: what runs on the GPU, the
//! result types (decimal shapes, the cast table) and which checks each operation makes.
//! [`super::emit`] prints it, as calls into `kernels/cuda/common/*.cuh`, and guards each check
//! by the rows the CPU evaluates it for.
//!
//! Every node carries its device type and whether it can be NULL; the checks a node makes (a
//! zero divisor, an overflow, a value a cast cannot represent) are in its operation. CASE,
//! COALESCE, AND and OR are nodes of their own, and their children are evaluated only for the
//! rows the CPU evaluates them for: an error raised in a THEN branch, an ELSE, a later COALESCE
//! argument or the right side of AND/OR counts only for those rows (the emitter turns the
//! structure into guards).

use super::types::DevType;
use crate::vector::{Elem, Metric};

/// A failure a node can raise: its bit in the kernel's error word ([`super::abi::ErrorBits`])
/// and the message the query then fails with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Check {
    pub code: u32,
    pub message: String,
}

/// A typed expression over one row.
#[derive(Debug, Clone)]
pub(crate) struct Node {
    pub ty: DevType,
    /// Whether the value can be NULL. A node that cannot yields a constant null flag.
    pub nullable: bool,
    pub op: Op,
}

/// One side of a vector distance.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum VecSide {
    /// An embedding column: the kernel's input column `slot`, of rows of `elem`s.
    Column { slot: usize, elem: Elem },
    /// A constant vector: the kernel's query vector `slot` (f32, no NULL element).
    Query { slot: usize },
}

/// A constant's value.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Const {
    /// A fixed-width value's bits, as two 64-bit words (low, high); see
    /// [`super::scalars::scalar_bits`].
    Bits(u64, u64),
    /// A string's bytes.
    Bytes(Vec<u8>),
}

/// `= <> < <= > >=`, and Arrow's `eq`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Cmp {
    /// Arrow's `eq` kernel, which `CASE x WHEN v` uses: on floats, equality in IEEE total
    /// order (-0.0 differs from +0.0, NaN equals NaN); on other types, `=`.
    TotalEq,
    Eq,
    NotEq,
    Lt,
    LtEq,
    Gt,
    GtEq,
}

/// `+ - *`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Arith {
    Add,
    Sub,
    Mul,
}

/// `& | ^ << >>` on integers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum BitOp {
    And,
    Or,
    Xor,
    /// Wrapping: the shift amount is taken modulo the width, as Rust's `wrapping_shl`.
    ShiftLeft,
    /// Arithmetic for signed types; wrapping as [`BitOp::ShiftLeft`].
    ShiftRight,
}

/// A field `extract` reads from a Date32.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum DateField {
    Year,
    Quarter,
    Month,
    /// The ISO 8601 week (1-53, weeks start on Monday, week 1 holds the year's first Thursday).
    Week,
    Day,
    /// Day of the year, 1-366.
    DayOfYear,
    /// Day of the week, Sunday 0 to Saturday 6.
    DayOfWeek,
    /// Day of the week, Monday 1 to Sunday 7.
    IsoDayOfWeek,
    Hour,
    Minute,
    /// Whole seconds of the minute.
    Second,
}

impl DateField {
    /// The field's number in `dates.cuh`'s `date_field`.
    pub(crate) fn code(self) -> u32 {
        self as u32
    }

    /// Whether the field is part of the time of day (a date has none).
    pub(crate) fn of_time(self) -> bool {
        matches!(
            self,
            DateField::Hour | DateField::Minute | DateField::Second
        )
    }
}

/// DataFusion's float math functions the GPU runs, by their helper in `math.cuh`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum FloatFn {
    Sqrt,
    Cbrt,
    Ln,
    Log10,
    Log2,
    /// `log(x)`: ln(x) / ln(10), as Rust's `log(10.0)`.
    LogTen,
    Exp,
    Power,
    Signum,
    Trunc,
}

impl FloatFn {
    /// The DataFusion function, if it is one of these (`log` of one argument is `log10`).
    pub(crate) fn of(name: &str, args: usize) -> Option<FloatFn> {
        Some(match (name, args) {
            ("sqrt", 1) => FloatFn::Sqrt,
            ("cbrt", 1) => FloatFn::Cbrt,
            ("ln", 1) => FloatFn::Ln,
            ("log10", 1) => FloatFn::Log10,
            ("log", 1) => FloatFn::LogTen,
            ("log2", 1) => FloatFn::Log2,
            ("exp", 1) => FloatFn::Exp,
            ("power" | "pow", 2) => FloatFn::Power,
            ("signum", 1) => FloatFn::Signum,
            ("trunc", 1) => FloatFn::Trunc,
            _ => return None,
        })
    }

    /// The helper's name after `float_`.
    pub(crate) fn helper(self) -> &'static str {
        match self {
            FloatFn::Sqrt => "sqrt",
            FloatFn::Cbrt => "cbrt",
            FloatFn::Ln => "ln",
            FloatFn::Log10 => "log10",
            FloatFn::Log2 => "log2",
            FloatFn::LogTen => "log_ten",
            FloatFn::Exp => "exp",
            FloatFn::Power => "power",
            FloatFn::Signum => "signum",
            FloatFn::Trunc => "trunc",
        }
    }
}

/// A LIKE pattern, compiled.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum LikePattern {
    /// Literal text and `%` only: the segments between the `%`s, empty ones included.
    Segments(Vec<Vec<u8>>),
    /// With `_` or escapes: a token per byte or wildcard for `spate::like_match` (kind 0: the
    /// literal byte beside it, 1: `_`, 2: `%`).
    Tokens { kinds: Vec<u8>, bytes: Vec<u8> },
}

/// A conversion from the argument's type to the node's.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Cast {
    /// A C conversion that keeps every value: integer widening, integers and f32 to floats.
    Convert,
    /// An integer or decimal times `10^shift`, into a decimal with room for every value.
    ScaleUp { shift: i8 },
    /// A decimal of scale `scale` to f64 (Arrow's: the unscaled value over `10^scale`).
    DecimalToFloat { scale: i8 },
    /// A timestamp to a coarser unit: divided by `by`, truncating.
    TimestampCoarser { by: i64 },
    /// A timestamp to a finer unit: multiplied by `by`; fails outside i64.
    TimestampFiner { by: i64 },
    /// An integer, or a decimal's whole part (`scale` > 0: divided by `10^scale`, truncating),
    /// to an integer in `[lo, hi]`.
    ToInt { scale: i8, lo: i128, hi: i128 },
    /// A float to an integer: truncated, which must lie in `[lo, hi)`.
    FloatToInt { lo: f64, hi: f64 },
    /// An integer or decimal of scale `from` to a decimal of `(precision, to)`: rescaled
    /// (checked up, rounded half away from zero down), then within the precision.
    ToDecimal { from: i8, to: i8, precision: u8 },
    /// A float to a decimal of `(precision, scale)`: rounded half away from zero, which must fit
    /// an i128 (else `range` fails, when the cast raises) and then the precision.
    FloatToDecimal {
        scale: i8,
        precision: u8,
        range: Check,
    },
}

/// What a cast does with a value it cannot represent.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum OnFail {
    /// Every value is representable (the planner proved it).
    Never,
    /// NULL, for a safe cast (`TRY_CAST`).
    Null,
    /// Fails the query.
    Raise(Check),
}

/// What a node computes.
#[derive(Debug, Clone)]
pub(crate) enum Op {
    /// The kernel's input column `slot` ([`super::abi`]).
    Column {
        slot: usize,
    },
    /// The kernel's runtime scalar `slot`.
    Scalar {
        slot: usize,
    },
    /// A constant; `None` is NULL.
    Const(Option<Const>),
    Not(Box<Node>),
    /// `IS NULL`, or `IS NOT NULL` when `negated`.
    IsNull {
        arg: Box<Node>,
        negated: bool,
    },
    /// Arrow's `neg_wrapping`: integers and decimals wrap, floats flip the sign bit.
    Negate(Box<Node>),
    /// Three-valued AND (`and`) or OR.
    Logic {
        and: bool,
        left: Box<Node>,
        right: Box<Node>,
    },
    /// A comparison of two values of one type (floats by DataFusion's comparison key, strings
    /// bytewise).
    Compare {
        cmp: Cmp,
        left: Box<Node>,
        right: Box<Node>,
    },
    /// `IS DISTINCT FROM`, or `IS NOT DISTINCT FROM` when `not`.
    Distinct {
        not: bool,
        left: Box<Node>,
        right: Box<Node>,
    },
    /// Integer (wrapping) or float `+ - *`, both sides of the node's type.
    Arith {
        op: Arith,
        left: Box<Node>,
        right: Box<Node>,
    },
    /// Bitwise operators on two integers of the node's type.
    Bitwise {
        op: BitOp,
        left: Box<Node>,
        right: Box<Node>,
    },
    /// `abs`: floats clear the sign bit, decimals wrap, signed integers raise `overflow` for
    /// MIN (unsigned ones are never lowered to it).
    Abs {
        arg: Box<Node>,
        overflow: Option<Check>,
    },
    /// `floor(x)` or `ceil(x)` (`ceil`) on a float, as Rust's (NaN stays itself, quieted).
    FloorCeil {
        arg: Box<Node>,
        ceil: bool,
    },
    /// A float math function of one argument, or two for `power` (`math.cuh`); `fails` for
    /// those that can (sqrt of a negative number, zero to a negative power).
    FloatMath {
        func: FloatFn,
        args: Vec<Node>,
        fails: Option<Check>,
    },
    /// `round(x, dp)` on a float: `(x * factor).round() / factor` with `factor = 10^dp`,
    /// half away from zero, as DataFusion's.
    RoundFloat {
        arg: Box<Node>,
        factor: f64,
    },
    /// `a || b || ...`: a string made of the parts' bytes, NULL when any part is. Only a
    /// value kernel's output is one (its bytes are never contiguous before they are stored).
    Concat(Vec<Node>),
    /// Decimal `+ - *` at the node's scale. `+ -` multiply the sides by `10^left_shift` and
    /// `10^right_shift`; with `overflow` the result may not fit an i128 and is checked (the
    /// shifts are then 0).
    Decimal {
        op: Arith,
        left: Box<Node>,
        right: Box<Node>,
        left_shift: i8,
        right_shift: i8,
        overflow: Option<Check>,
    },
    /// Integer or float `/`, or `%` when `remainder`. Integers raise `zero` for a zero divisor
    /// and, when given, `overflow` for `MIN / -1`.
    Divide {
        remainder: bool,
        left: Box<Node>,
        right: Box<Node>,
        zero: Option<Check>,
        overflow: Option<Check>,
    },
    /// Decimal `/` or `%`: each side multiplied by `10^shift` (checked), then divided.
    DecimalDivide {
        remainder: bool,
        left: Box<Node>,
        right: Box<Node>,
        left_shift: i8,
        right_shift: i8,
        zero: Check,
        overflow: Check,
    },
    Cast {
        arg: Box<Node>,
        cast: Cast,
        fail: OnFail,
    },
    /// `arg [NOT] IN (items)`; floats match by total order (`total_order`).
    InList {
        arg: Box<Node>,
        items: Vec<Node>,
        total_order: bool,
        negated: bool,
    },
    /// Searched CASE: the value of the first branch whose condition is TRUE, else `otherwise`,
    /// else NULL. A branch's condition is evaluated for the rows no earlier branch took, its
    /// value for the rows it takes.
    Case {
        branches: Vec<(Node, Node)>,
        otherwise: Option<Box<Node>>,
    },
    /// The first non-NULL argument; each is evaluated for the rows the earlier left NULL.
    Coalesce(Vec<Node>),
    Like {
        arg: Box<Node>,
        pattern: LikePattern,
        negated: bool,
    },
    /// The length of a string, in characters (`chars`) or bytes.
    Length {
        arg: Box<Node>,
        chars: bool,
    },
    /// A string without the leading (`left`) and trailing (`right`) bytes found in `chars`
    /// (ASCII, so a byte is a character).
    Trim {
        arg: Box<Node>,
        chars: Vec<u8>,
        left: bool,
        right: bool,
    },
    /// `upper`: the string with every character uppercased as Rust's `to_uppercase` does. Its
    /// bytes are never stored in the row: it is read as a stream, so it may only be compared
    /// (`Compare`, `Distinct`) or be a value kernel's output (see `builder::misplaced_upper`).
    Upper(Box<Node>),
    /// `replace(arg, from, to)` with literal `from` (not empty) and `to`: streamed as `Upper`.
    Replace {
        arg: Box<Node>,
        from: Vec<u8>,
        to: Vec<u8>,
    },
    /// `strpos(arg, sub)`: the 1-based character position of `sub` in `arg`, 0 if absent.
    Position {
        arg: Box<Node>,
        sub: Box<Node>,
    },
    /// Whether a string starts (or, `ends`, ends) with another.
    Affix {
        arg: Box<Node>,
        affix: Box<Node>,
        ends: bool,
    },
    /// The characters of a string at 1-based positions `[from, to)` (`from` >= 1).
    Substr {
        arg: Box<Node>,
        from: i64,
        to: i64,
    },
    /// A Date32 plus months, then days (the day clamped to the month's end, as Arrow does).
    DateAddInterval {
        arg: Box<Node>,
        months: i64,
        days: i64,
    },
    /// A distance between two vectors of `dim` elements (`vector.cuh`), as an f64: NULL when
    /// a side's row is NULL or holds a NULL element, and (cosine) when a side's sum of squares is 0.
    Distance {
        metric: Metric,
        left: VecSide,
        right: VecSide,
        dim: usize,
    },
    /// A field of a Date32 (`per_second` is `None`: the value counts days) or of a timestamp
    /// without a time zone (the value counts `1 / per_second` seconds).
    DatePart {
        arg: Box<Node>,
        field: DateField,
        per_second: Option<i64>,
    },
}

impl Node {
    /// A node of type `ty` computing `op`; its nullability follows from `op`.
    pub(crate) fn new(ty: DevType, op: Op) -> Node {
        Node {
            ty,
            nullable: nullable(&op),
            op,
        }
    }
}

impl Node {
    /// The nodes this one computes from, in evaluation order.
    pub(crate) fn children(&self) -> Vec<&Node> {
        match &self.op {
            Op::Column { .. } | Op::Scalar { .. } | Op::Const(_) | Op::Distance { .. } => {
                Vec::new()
            }
            Op::Not(a) | Op::Negate(a) | Op::Upper(a) => vec![a],
            Op::IsNull { arg, .. }
            | Op::Abs { arg, .. }
            | Op::RoundFloat { arg, .. }
            | Op::FloorCeil { arg, .. }
            | Op::Trim { arg, .. }
            | Op::Cast { arg, .. }
            | Op::Like { arg, .. }
            | Op::Length { arg, .. }
            | Op::Substr { arg, .. }
            | Op::Replace { arg, .. }
            | Op::DateAddInterval { arg, .. }
            | Op::DatePart { arg, .. } => vec![arg],
            Op::Logic { left, right, .. }
            | Op::Compare { left, right, .. }
            | Op::Distinct { left, right, .. }
            | Op::Arith { left, right, .. }
            | Op::Bitwise { left, right, .. }
            | Op::Affix {
                arg: left,
                affix: right,
                ..
            }
            | Op::Position {
                arg: left,
                sub: right,
            }
            | Op::Decimal { left, right, .. }
            | Op::Divide { left, right, .. }
            | Op::DecimalDivide { left, right, .. } => vec![left, right],
            Op::InList { arg, items, .. } => std::iter::once(&**arg).chain(items).collect(),
            Op::Case {
                branches,
                otherwise,
            } => branches
                .iter()
                .flat_map(|(c, v)| [c, v])
                .chain(otherwise.as_deref())
                .collect(),
            Op::Coalesce(args) | Op::Concat(args) | Op::FloatMath { args, .. } => {
                args.iter().collect()
            }
        }
    }
}

/// Whether a node computing `op` can be NULL.
fn nullable(op: &Op) -> bool {
    let either = |l: &Node, r: &Node| l.nullable || r.nullable;
    match op {
        // A column's validity is what counts, whatever the schema says.
        Op::Column { .. } | Op::Scalar { .. } => true,
        Op::Const(value) => value.is_none(),
        Op::Not(a) | Op::Negate(a) | Op::Upper(a) => a.nullable,
        Op::Abs { arg, .. }
        | Op::RoundFloat { arg, .. }
        | Op::FloorCeil { arg, .. }
        | Op::Trim { arg, .. }
        | Op::Length { arg, .. }
        | Op::Substr { arg, .. }
        | Op::Replace { arg, .. }
        | Op::DateAddInterval { arg, .. }
        | Op::Like { arg, .. } => arg.nullable,
        // NULL past chrono's years too.
        Op::DatePart { .. } => true,
        Op::Distance { .. } => true,
        Op::Affix { arg, affix, .. } => either(arg, affix),
        Op::Position { arg, sub } => either(arg, sub),
        Op::Concat(parts) | Op::FloatMath { args: parts, .. } => parts.iter().any(|p| p.nullable),
        Op::IsNull { .. } | Op::Distinct { .. } => false,
        Op::Bitwise { left, right, .. }
        | Op::Logic { left, right, .. }
        | Op::Compare { left, right, .. }
        | Op::Arith { left, right, .. }
        | Op::Decimal { left, right, .. }
        | Op::Divide { left, right, .. }
        | Op::DecimalDivide { left, right, .. } => either(left, right),
        Op::Cast { arg, fail, .. } => arg.nullable || *fail == OnFail::Null,
        Op::InList { arg, items, .. } => arg.nullable || items.iter().any(|i| i.nullable),
        Op::Case {
            branches,
            otherwise,
        } => {
            otherwise.as_ref().is_none_or(|e| e.nullable)
                || branches.iter().any(|(_, v)| v.nullable)
        }
        Op::Coalesce(args) => args.iter().all(|a| a.nullable),
    }
}
