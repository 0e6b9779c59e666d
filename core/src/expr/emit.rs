//! The kernel IR → CUDA C. Each node becomes a few declarations in the row loop, calling only
//! helpers from `kernels/cuda/common/*.cuh`: the semantics live there (and are tested there,
//! `kernels/tests/expr_helpers.rs`), the choices in [`super::lower`]. This file writes names,
//! types and literals, and turns CASE and COALESCE into guards on the errors their children
//! raise.

use std::fmt::Write as _;

use super::ir::{Arith, BitOp, Cast, Check, Cmp, Const, LikePattern, Node, OnFail, Op, VecSide};
use super::types::DevType;
use crate::vector::Metric;

/// An emitted value: C expressions for its value and its null flag. A string's value is a byte
/// pointer with its length in a companion `<value>_n` variable.
#[derive(Debug, Clone)]
pub(crate) struct Operand {
    pub value: String,
    pub null: String,
    pub ty: DevType,
}

/// Prints the nodes of one kernel into its row loop (`i` is the input row).
#[derive(Default)]
pub(crate) struct Emitter {
    /// The row loop's body.
    pub body: String,
    next: usize,
    /// Conditions (C expressions) under which the CPU evaluates the code being emitted: a CASE
    /// branch only for the rows that take it, a COALESCE argument only for the rows whose
    /// earlier arguments are NULL. Errors are raised only where all of them hold.
    guards: Vec<String>,
    /// What the kernel can raise: the error-word bit and the message, each once.
    pub checks: Vec<(u32, String)>,
    /// The parts of each concatenation emitted (by the operand's value): its bytes are these
    /// strings' one after the other, `<value>_n` in all.
    concats: Vec<(String, Vec<String>)>,
    /// The strings computed a byte at a time (`upper`, `replace`), by the operand's value: a
    /// `spate::StrStream` (`upper.cuh`).
    streams: Vec<String>,
    /// Whether a vector distance was emitted.
    vectors: bool,
}

/// `10^k` as an i128 literal (`k` <= 38, as the planner guarantees).
pub(crate) fn pow10(k: i8) -> String {
    debug_assert!((0..=38).contains(&k), "10^{k} does not fit an i128");
    i128_literal(10i128.pow(u32::from(k.clamp(0, 38).unsigned_abs())))
}

/// An i128 literal.
pub(crate) fn i128_literal(v: i128) -> String {
    if let Ok(small) = i64::try_from(v) {
        format!("((i128)(i64){}ull)", small as u64)
    } else {
        let hi = (v >> 64) as i64;
        let lo = v as u64;
        format!("((((i128)(i64){}ull) << 64) | (i128){lo}ull)", hi as u64)
    }
}

/// An f64 literal, exactly (by its bits).
fn f64_literal(v: f64) -> String {
    format!("__longlong_as_double((i64){}ull)", v.to_bits())
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

fn either_null(l: &Operand, r: &Operand) -> String {
    format!("({} || {})", l.null, r.null)
}

impl Emitter {
    fn var(&mut self) -> String {
        self.next += 1;
        format!("t{}", self.next)
    }

    fn line(&mut self, code: &str) {
        for l in code.lines() {
            let _ = writeln!(self.body, "        {l}");
        }
    }

    /// Emits code that raises `check` when `failed` holds in a row the CPU evaluates the node
    /// for.
    fn raise(&mut self, failed: &str, check: &Check) {
        let mut condition = failed.to_string();
        for g in &self.guards {
            condition = format!("{g} && {condition}");
        }
        self.line(&format!("if ({condition}) atomicOr(err, {}u);", check.code));
        if !self
            .checks
            .iter()
            .any(|(c, m)| *c == check.code && *m == check.message)
        {
            self.checks.push((check.code, check.message.clone()));
        }
    }

    /// Emits `node` under `guard` (errors below it are raised only where it holds).
    fn guarded(&mut self, guard: String, node: &Node) -> Operand {
        self.guards.push(guard);
        let o = self.node(node);
        self.guards.pop();
        o
    }

    /// A fresh `spate::StrStream` variable holding `stream`, NULL where `null` holds.
    fn stream(&mut self, ty: DevType, stream: String, null: String) -> Operand {
        let v = self.var();
        self.line(&format!("const spate::StrStream {v} = {stream};"));
        self.streams.push(v.clone());
        Operand { value: v, null, ty }
    }

    /// A fresh variable holding `value` of type `ty`, NULL where `null` holds.
    fn bind(&mut self, ty: DevType, value: &str, null: String) -> Operand {
        let v = self.var();
        self.line(&format!("const {} {v} = {value};", ty.c_type()));
        Operand { value: v, null, ty }
    }

    /// The parts of `operand` when it is a concatenation: the string operands whose bytes
    /// follow one another.
    fn parts_of(&self, operand: &Operand) -> Option<&[String]> {
        self.concats
            .iter()
            .find(|(v, _)| *v == operand.value)
            .map(|(_, parts)| parts.as_slice())
    }

    fn is_stream(&self, operand: &Operand) -> bool {
        self.streams.contains(&operand.value)
    }

    /// Whether a kernel emitted so far needs `upper.cuh`.
    pub(crate) fn uses_streams(&self) -> bool {
        !self.streams.is_empty()
    }

    /// C for string `operand` as a `spate::StrStream`.
    fn stream_of(&self, operand: &Operand) -> String {
        if self.is_stream(operand) {
            operand.value.clone()
        } else {
            format!("spate::plain_stream({v}, {v}_n)", v = operand.value)
        }
    }

    /// C for the byte length of string `operand` as stored.
    pub(crate) fn stored_len(&self, operand: &Operand) -> String {
        if self.is_stream(operand) {
            format!("spate::stream_len({})", operand.value)
        } else {
            format!("(u64){}_n", operand.value)
        }
    }

    /// C statements copying string `operand`'s bytes to `u8* dst`.
    pub(crate) fn store_bytes(&self, operand: &Operand) -> String {
        match self.parts_of(operand) {
            // A concatenation's parts one after the other.
            Some(parts) => parts
                .iter()
                .map(|p| format!("for (u64 k = 0; k < {p}_n; ++k) *dst++ = {p}[k]; "))
                .collect(),
            None if self.is_stream(operand) => {
                format!("spate::stream_copy({}, dst); ", operand.value)
            }
            None => format!(
                "for (u64 k = 0; k < {v}_n; ++k) dst[k] = {v}[k]; ",
                v = operand.value
            ),
        }
    }

    /// C for the three-way comparison of strings `l` and `r`, either of them streamed.
    fn str_cmp(&self, l: &Operand, r: &Operand) -> String {
        if !self.is_stream(l) && !self.is_stream(r) {
            return format!(
                "spate::str_cmp({a}, {a}_n, {b}, {b}_n)",
                a = l.value,
                b = r.value
            );
        }
        format!(
            "spate::stream_cmp({}, {})",
            self.stream_of(l),
            self.stream_of(r)
        )
    }

    pub(crate) fn node(&mut self, node: &Node) -> Operand {
        let o = self.op(node);
        if node.nullable {
            o
        } else {
            Operand {
                null: "false".into(),
                ..o
            }
        }
    }

    fn op(&mut self, node: &Node) -> Operand {
        let ty = node.ty;
        let c = ty.c_type();
        match &node.op {
            Op::Column { slot } => self.column(*slot, ty),
            Op::Scalar { slot: k } => {
                let value = match ty {
                    DevType::Bool => format!("(sa{k} != 0ull)"),
                    DevType::F32 => format!("__uint_as_float((u32)sa{k})"),
                    DevType::F64 => format!("__longlong_as_double((i64)sa{k})"),
                    DevType::Dec { .. } => format!("((((i128)(i64)sb{k}) << 64) | (i128)sa{k})"),
                    _ => format!("(({c})sa{k})"),
                };
                Operand {
                    value,
                    null: format!("(sn{k} != 0u)"),
                    ty,
                }
            }
            Op::Const(None) if ty == DevType::Str => Operand {
                null: "true".into(),
                ..self.string_literal(b"")
            },
            Op::Const(None) => Operand {
                value: format!("(({c})0)"),
                null: "true".into(),
                ty,
            },
            Op::Const(Some(Const::Bytes(bytes))) => self.string_literal(bytes),
            Op::Const(Some(Const::Bits(lo, hi))) => Operand {
                value: match ty {
                    DevType::Bool => (*lo != 0).to_string(),
                    DevType::F32 => format!("__uint_as_float({lo}u)"),
                    DevType::F64 => format!("__longlong_as_double((i64){lo}ull)"),
                    DevType::Dec { .. } => {
                        i128_literal((i128::from(*hi as i64) << 64) | i128::from(*lo))
                    }
                    _ => format!("(({c}){lo}ull)"),
                },
                null: "false".into(),
                ty,
            },
            Op::Not(a) => {
                let a = self.node(a);
                Operand {
                    value: format!("(!{})", a.value),
                    null: a.null,
                    ty,
                }
            }
            Op::IsNull { arg, negated } => {
                let a = self.node(arg);
                Operand {
                    value: format!("({}{})", if *negated { "!" } else { "" }, a.null),
                    null: "false".into(),
                    ty,
                }
            }
            Op::Negate(a) => {
                let a = self.node(a);
                let value = match ty {
                    DevType::F32 | DevType::F64 => format!("(-{})", a.value),
                    _ => format!("spate::wrapping_neg<{c}>({})", a.value),
                };
                self.bind(ty, &value, a.null)
            }
            Op::Logic { and, left, right } => {
                // DataFusion evaluates the right side of AND for all rows, or only where the
                // left is TRUE, or (when the left is FALSE for the whole batch) for none: the
                // rows it always evaluates, whatever its batches, are those where the left is
                // not FALSE (not TRUE for OR), and there alone the right side may fail (so
                // the GPU fails where the CPU does one row at a time).
                let l = self.node(left);
                let guard = if *and {
                    format!("({} || {})", l.null, l.value)
                } else {
                    format!("({} || !{})", l.null, l.value)
                };
                let r = self.guarded(guard, right);
                let (v, n) = (self.var(), self.var());
                let f = if *and { "and3" } else { "or3" };
                self.line(&format!(
                    "bool {n};\nconst bool {v} = spate::{f}({}, {}, {}, {}, &{n});",
                    l.null, l.value, r.null, r.value
                ));
                Operand {
                    value: v,
                    null: n,
                    ty,
                }
            }
            Op::Compare { cmp, left, right } => {
                let (l, r) = (self.node(left), self.node(right));
                if *cmp == Cmp::TotalEq && matches!(l.ty, DevType::F32 | DevType::F64) {
                    let value = format!(
                        "spate::total_order({}) == spate::total_order({})",
                        l.value, r.value
                    );
                    return self.bind(ty, &value, either_null(&l, &r));
                }
                let op = match cmp {
                    Cmp::TotalEq | Cmp::Eq => "==",
                    Cmp::NotEq => "!=",
                    Cmp::Lt => "<",
                    Cmp::LtEq => "<=",
                    Cmp::Gt => ">",
                    Cmp::GtEq => ">=",
                };
                let value = match l.ty {
                    DevType::Str => format!("{} {op} 0", self.str_cmp(&l, &r)),
                    DevType::F32 | DevType::F64 => format!(
                        "spate::compare_key({}) {op} spate::compare_key({})",
                        l.value, r.value
                    ),
                    _ => format!("{} {op} {}", l.value, r.value),
                };
                self.bind(ty, &value, either_null(&l, &r))
            }
            Op::Distinct { not, left, right } => {
                let (l, r) = (self.node(left), self.node(right));
                let equal = match l.ty {
                    DevType::Str => format!("{} == 0", self.str_cmp(&l, &r)),
                    DevType::F32 | DevType::F64 => format!(
                        "spate::compare_key({}) == spate::compare_key({})",
                        l.value, r.value
                    ),
                    _ => format!("{} == {}", l.value, r.value),
                };
                let value = format!(
                    "{}spate::is_distinct({}, {}, {equal})",
                    if *not { "!" } else { "" },
                    l.null,
                    r.null
                );
                self.bind(ty, &value, "false".into())
            }
            Op::Arith { op, left, right } => {
                let (l, r) = (self.node(left), self.node(right));
                let family = if matches!(ty, DevType::F32 | DevType::F64) {
                    "float"
                } else {
                    "wrapping"
                };
                let value = format!(
                    "spate::{family}_{}<{c}>({}, {})",
                    arith_name(*op),
                    l.value,
                    r.value
                );
                self.bind(ty, &value, either_null(&l, &r))
            }
            Op::Bitwise { op, left, right } => {
                let (l, r) = (self.node(left), self.node(right));
                let f = match op {
                    BitOp::And => "bit_and",
                    BitOp::Or => "bit_or",
                    BitOp::Xor => "bit_xor",
                    BitOp::ShiftLeft => "bit_shl",
                    BitOp::ShiftRight => "bit_shr",
                };
                let value = format!("spate::{f}<{c}>({}, {})", l.value, r.value);
                self.bind(ty, &value, either_null(&l, &r))
            }
            Op::Abs { arg, overflow } => {
                let a = self.node(arg);
                match (ty, overflow) {
                    (DevType::F32 | DevType::F64, _) => {
                        self.bind(ty, &format!("spate::float_abs({})", a.value), a.null)
                    }
                    (DevType::Dec { .. }, _) => {
                        self.bind(ty, &format!("spate::wrapping_abs({})", a.value), a.null)
                    }
                    (_, check) => {
                        let v = self.var();
                        self.line(&format!(
                            "bool {v}_ovf;\nconst {c} {v} = spate::checked_abs<{c}>({}, &{v}_ovf);",
                            a.value
                        ));
                        if let Some(check) = check {
                            self.raise(&format!("!{} && {v}_ovf", a.null), check);
                        }
                        Operand {
                            value: v,
                            null: a.null,
                            ty,
                        }
                    }
                }
            }
            Op::FloorCeil { arg, ceil } => {
                let a = self.node(arg);
                let f = if *ceil { "float_ceil" } else { "float_floor" };
                self.bind(ty, &format!("spate::{f}<{c}>({})", a.value), a.null)
            }
            Op::FloatMath { func, args, fails } => {
                let operands: Vec<Operand> = args.iter().map(|a| self.node(a)).collect();
                let values: Vec<&str> = operands.iter().map(|o| o.value.as_str()).collect();
                let nulls: Vec<&str> = operands.iter().map(|o| o.null.as_str()).collect();
                let (values, null) = (values.join(", "), format!("({})", nulls.join(" || ")));
                if let Some(check) = fails {
                    let failed = format!(
                        "!{null} && spate::float_{}_fails<{c}>({values})",
                        func.helper()
                    );
                    self.raise(&failed, check);
                }
                let value = format!("spate::float_{}<{c}>({values})", func.helper());
                self.bind(ty, &value, null)
            }
            Op::RoundFloat { arg, factor } => {
                let a = self.node(arg);
                let factor = match ty {
                    DevType::F32 => format!("__uint_as_float({}u)", (*factor as f32).to_bits()),
                    _ => f64_literal(*factor),
                };
                let value = format!("spate::round_float<{c}>({}, {factor})", a.value);
                self.bind(ty, &value, a.null)
            }
            Op::Concat(parts) => {
                let operands: Vec<Operand> = parts.iter().map(|p| self.node(p)).collect();
                let v = self.var();
                let lengths: Vec<String> =
                    operands.iter().map(|o| format!("{}_n", o.value)).collect();
                let nulls: Vec<String> = operands.iter().map(|o| o.null.clone()).collect();
                self.line(&format!(
                    "const u8* {v} = nullptr;\nconst u64 {v}_n = {};",
                    lengths.join(" + ")
                ));
                self.concats
                    .push((v.clone(), operands.into_iter().map(|o| o.value).collect()));
                Operand {
                    value: v,
                    null: format!("({})", nulls.join(" || ")),
                    ty,
                }
            }
            Op::Decimal {
                op,
                left,
                right,
                left_shift,
                right_shift,
                overflow,
            } => {
                let (l, r) = (self.node(left), self.node(right));
                let null = either_null(&l, &r);
                match overflow {
                    Some(check) => {
                        let (v, n) = (self.var(), self.var());
                        self.line(&format!(
                            "const bool {n} = {null};\ni128 {v};\nconst bool {v}_ovf = spate::{}_overflows({}, {}, &{v});",
                            arith_name(*op),
                            l.value,
                            r.value
                        ));
                        self.raise(&format!("!{n} && {v}_ovf"), check);
                        Operand {
                            value: v,
                            null: n,
                            ty,
                        }
                    }
                    None => {
                        let value = match op {
                            Arith::Mul => format!("spate::dec_mul({}, {})", l.value, r.value),
                            _ => format!(
                                "spate::dec_{}({}, {}, {}, {})",
                                arith_name(*op),
                                l.value,
                                r.value,
                                pow10(*left_shift),
                                pow10(*right_shift)
                            ),
                        };
                        self.bind(ty, &value, null)
                    }
                }
            }
            Op::Divide {
                remainder,
                left,
                right,
                zero,
                overflow,
            } => {
                let (l, r) = (self.node(left), self.node(right));
                let null = either_null(&l, &r);
                if matches!(ty, DevType::F32 | DevType::F64) {
                    let f = if *remainder { "float_rem" } else { "float_div" };
                    let value = format!("spate::{f}<{c}>({}, {})", l.value, r.value);
                    return self.bind(ty, &value, null);
                }
                let (v, n) = (self.var(), self.var());
                let call = if *remainder {
                    format!(
                        "bool {v}_zero;\nconst {c} {v} = spate::checked_rem<{c}>({}, {}, &{v}_zero);",
                        l.value, r.value
                    )
                } else {
                    format!(
                        "bool {v}_zero, {v}_ovf;\nconst {c} {v} = spate::checked_div<{c}>({}, {}, &{v}_zero, &{v}_ovf);",
                        l.value, r.value
                    )
                };
                self.line(&format!("const bool {n} = {null};\n{call}"));
                if let Some(check) = zero {
                    self.raise(&format!("!{n} && {v}_zero"), check);
                }
                if let Some(check) = overflow {
                    self.raise(&format!("!{n} && {v}_ovf"), check);
                }
                Operand {
                    value: v,
                    null: n,
                    ty,
                }
            }
            Op::DecimalDivide {
                remainder,
                left,
                right,
                left_shift,
                right_shift,
                zero,
                overflow,
            } => {
                let (l, r) = (self.node(left), self.node(right));
                let (v, n) = (self.var(), self.var());
                self.line(&format!(
                    "const bool {n} = {};\nbool {v}_zero, {v}_ovf;\nconst i128 {v} = spate::dec_{}({}, {}, {}, {}, &{v}_zero, &{v}_ovf);",
                    either_null(&l, &r),
                    if *remainder { "rem" } else { "div" },
                    l.value,
                    r.value,
                    pow10(*left_shift),
                    pow10(*right_shift)
                ));
                self.raise(&format!("!{n} && {v}_zero"), zero);
                self.raise(&format!("!{n} && {v}_ovf"), overflow);
                Operand {
                    value: v,
                    null: n,
                    ty,
                }
            }
            Op::Cast { arg, cast, fail } => self.cast(ty, arg, cast, fail),
            Op::InList {
                arg,
                items,
                total_order,
                negated,
            } => {
                let x = self.node(arg);
                let mut matched = Vec::with_capacity(items.len());
                let mut nulls = Vec::with_capacity(items.len());
                for item in items {
                    let o = self.node(item);
                    let eq = match x.ty {
                        DevType::Str => format!(
                            "spate::str_eq({a}, {a}_n, {b}, {b}_n)",
                            a = x.value,
                            b = o.value
                        ),
                        _ if *total_order => format!(
                            "spate::total_order({}) == spate::total_order({})",
                            x.value, o.value
                        ),
                        _ => format!("{} == {}", x.value, o.value),
                    };
                    matched.push(format!("(!{} && {eq})", o.null));
                    nulls.push(o.null);
                }
                let any = |terms: Vec<String>| {
                    if terms.is_empty() {
                        "false".to_string()
                    } else {
                        terms.join(" || ")
                    }
                };
                let (v, n) = (self.var(), self.var());
                self.line(&format!(
                    "bool {n};\nconst bool {v} = spate::in_list({}, {}, {}, {negated}, &{n});",
                    x.null,
                    any(matched),
                    any(nulls)
                ));
                Operand {
                    value: v,
                    null: n,
                    ty,
                }
            }
            Op::Case {
                branches,
                otherwise,
            } => {
                let (v, n) = (self.var(), self.var());
                self.line(&format!(
                    "{}\nbool {n} = true;\nbool {v}_done = false;",
                    declare(ty, &v)
                ));
                for (when, then) in branches {
                    // Each WHEN is evaluated for the rows no earlier WHEN took, each THEN for
                    // the rows its WHEN took; the code runs for every row, but raises errors
                    // only there.
                    let cond = self.guarded(format!("!{v}_done"), when);
                    let taken = format!("(!{v}_done && !{} && {})", cond.null, cond.value);
                    let value = self.guarded(taken.clone(), then);
                    self.line(&format!(
                        "if {taken} {{ {v}_done = true; {} {n} = {}; }}",
                        assign(ty, &v, &value.value),
                        value.null
                    ));
                }
                if let Some(e) = otherwise {
                    let value = self.guarded(format!("!{v}_done"), e);
                    self.line(&format!(
                        "if (!{v}_done) {{ {} {n} = {}; }}",
                        assign(ty, &v, &value.value),
                        value.null
                    ));
                }
                Operand {
                    value: v,
                    null: n,
                    ty,
                }
            }
            Op::Coalesce(args) => {
                let (v, n) = (self.var(), self.var());
                self.line(&format!("{}\nbool {n} = true;", declare(ty, &v)));
                for (k, a) in args.iter().enumerate() {
                    // A later argument is evaluated only for the rows the earlier ones left
                    // NULL.
                    let o = if k == 0 {
                        self.node(a)
                    } else {
                        self.guarded(n.clone(), a)
                    };
                    self.line(&format!(
                        "if ({n} && !{}) {{ {} {n} = false; }}",
                        o.null,
                        assign(ty, &v, &o.value)
                    ));
                }
                Operand {
                    value: v,
                    null: n,
                    ty,
                }
            }
            Op::Like {
                arg,
                pattern,
                negated,
            } => {
                let a = self.node(arg);
                let not = if *negated { "!" } else { "" };
                let value = match pattern {
                    LikePattern::Segments(segments) => {
                        let bytes = self.string_literal(&segments.concat());
                        let lens = self.var();
                        let items: Vec<String> =
                            segments.iter().map(|s| format!("{}ull", s.len())).collect();
                        self.line(&format!("const u64 {lens}[] = {{{}}};", items.join(", ")));
                        format!(
                            "{not}spate::like_segments({a}, {a}_n, {}, {lens}, {})",
                            bytes.value,
                            segments.len(),
                            a = a.value
                        )
                    }
                    LikePattern::Tokens { kinds, bytes } => {
                        let k = self.string_literal(kinds);
                        let b = self.string_literal(bytes);
                        format!(
                            "{not}spate::like_match({a}, {a}_n, {}, {}, {})",
                            k.value,
                            b.value,
                            kinds.len(),
                            a = a.value
                        )
                    }
                };
                self.bind(ty, &value, a.null)
            }
            Op::Length { arg, chars } => {
                let a = self.node(arg);
                let value = if *chars {
                    format!("({c})spate::utf8_length({a}, {a}_n)", a = a.value)
                } else {
                    format!("({c}){}_n", a.value)
                };
                self.bind(ty, &value, a.null)
            }
            Op::Trim {
                arg,
                chars,
                left,
                right,
            } => {
                let a = self.node(arg);
                let set = self.string_literal(chars);
                let v = self.var();
                self.line(&format!(
                    "u64 {v}_n;\nconst u8* {v} = spate::trim_bytes({a}, {a}_n, {s}, {s}_n, {left}, {right}, &{v}_n);",
                    a = a.value,
                    s = set.value
                ));
                Operand {
                    value: v,
                    null: a.null,
                    ty,
                }
            }
            Op::Upper(arg) => {
                let a = self.node(arg);
                let stream = format!("spate::upper_stream({a}, {a}_n)", a = a.value);
                self.stream(ty, stream, a.null)
            }
            Op::Replace { arg, from, to } => {
                let a = self.node(arg);
                let (f, t) = (self.string_literal(from), self.string_literal(to));
                let stream = format!(
                    "spate::replace_stream({a}, {a}_n, {f}, {f}_n, {t}, {t}_n)",
                    a = a.value,
                    f = f.value,
                    t = t.value
                );
                self.stream(ty, stream, a.null)
            }
            Op::Position { arg, sub } => {
                let (a, p) = (self.node(arg), self.node(sub));
                let value = format!(
                    "({c})spate::str_position({a}, {a}_n, {p}, {p}_n)",
                    a = a.value,
                    p = p.value
                );
                self.bind(ty, &value, either_null(&a, &p))
            }
            Op::Affix { arg, affix, ends } => {
                let (a, p) = (self.node(arg), self.node(affix));
                let f = if *ends { "str_ends" } else { "str_starts" };
                let value = format!(
                    "spate::{f}({a}, {a}_n, {p}, {p}_n)",
                    a = a.value,
                    p = p.value
                );
                self.bind(ty, &value, either_null(&a, &p))
            }
            Op::Substr { arg, from, to } => {
                let a = self.node(arg);
                let v = self.var();
                self.line(&format!(
                    "u64 {v}_n;\nconst u8* {v} = spate::substr_chars({a}, {a}_n, {from}ll, {to}ll, &{v}_n);",
                    a = a.value
                ));
                Operand {
                    value: v,
                    null: a.null,
                    ty,
                }
            }
            Op::DateAddInterval { arg, months, days } => {
                let a = self.node(arg);
                let value = format!(
                    "spate::date_add_interval({}, (i64){months}ll, (i64){days}ll)",
                    a.value
                );
                self.bind(ty, &value, a.null)
            }
            Op::Distance {
                metric,
                left,
                right,
                dim,
            } => self.distance(*metric, left, right, *dim),
            Op::DatePart {
                arg,
                field,
                per_second,
            } => {
                let a = self.node(arg);
                let null = format!(
                    "({} || !spate::date_part_exists((i64){}, {}ll))",
                    a.null,
                    a.value,
                    per_second.unwrap_or(0)
                );
                let value = match per_second {
                    None => format!("spate::date_field((i64){}, {}u)", a.value, field.code()),
                    Some(n) => format!(
                        "spate::timestamp_field((i64){}, {n}ll, {}u)",
                        a.value,
                        field.code()
                    ),
                };
                self.bind(ty, &value, null)
            }
        }
    }

    /// Input column `k`'s value at row `i`, with the parameter names of [`super::abi`].
    fn column(&mut self, k: usize, ty: DevType) -> Operand {
        let (v, n) = (self.var(), self.var());
        self.line(&format!(
            "const bool {n} = !spate::row_is_valid(v{k}, o{k}, i);"
        ));
        match ty {
            // d = offsets (b = their width in bytes), e = the bytes.
            DevType::Str => self.line(&format!(
                "const u64 {v}_s = spate::string_offset(d{k}, b{k}, i);\nconst u64 {v}_n = spate::string_offset(d{k}, b{k}, i + 1) - {v}_s;\nconst u8* {v} = e{k} + {v}_s;"
            )),
            DevType::Bool => self.line(&format!(
                "const bool {v} = spate::bit_is_set(d{k}, b{k}, i);"
            )),
            _ => self.line(&format!(
                "const {c} {v} = ((const {c}*)d{k})[i];",
                c = ty.c_type()
            )),
        }
        Operand {
            value: v,
            null: n,
            ty,
        }
    }

    /// A distance between two vectors (`vector.cuh`).
    fn distance(&mut self, metric: Metric, left: &VecSide, right: &VecSide, dim: usize) -> Operand {
        self.vectors = true;
        let side = |s: &VecSide| match s {
            VecSide::Column { slot: k, elem } => (
                format!("(d{k} + i * {}ull)", dim * elem.width()),
                format!("!spate::row_is_valid(v{k}, o{k}, i)"),
                elem.code(),
            ),
            // Code 3: an f32 vector without NULL elements.
            VecSide::Query { slot: k } => (format!("(const u8*)qv{k}"), "false".into(), 3),
        };
        let ((a, a_null, ea), (b, b_null, eb)) = (side(left), side(right));
        let (v, n) = (self.var(), self.var());
        self.line(&format!(
            "bool {n} = {a_null} || {b_null};\nf64 {v} = 0.0;\nif (!{n}) {v} = spate::vec_distance<{}u, {ea}u, {eb}u>({a}, {b}, {dim}ull, &{n});",
            metric.code()
        ));
        Operand {
            value: v,
            null: n,
            ty: DevType::F64,
        }
    }

    /// Whether a kernel emitted so far needs `vector.cuh`.
    pub(crate) fn uses_vectors(&self) -> bool {
        self.vectors
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
        self.line(&format!(
            "const u8 {v}_lit[] = {{{items}}};\nconst u8* {v} = {v}_lit;\nconst u64 {v}_n = {};",
            bytes.len()
        ));
        Operand {
            value: v,
            null: "false".into(),
            ty: DevType::Str,
        }
    }

    fn cast(&mut self, to: DevType, arg: &Node, cast: &Cast, fail: &OnFail) -> Operand {
        let a = self.node(arg);
        let t = to.c_type();
        let v = self.var();
        let x = &a.value;
        // The conversion, writing `{v}_bad` when it can fail.
        let code = match cast {
            Cast::Convert => format!("const {t} {v} = (({t}){x});"),
            Cast::ScaleUp { shift } => format!(
                "const i128 {v} = spate::dec_scale_up((i128){x}, {});",
                pow10(*shift)
            ),
            Cast::DecimalToFloat { scale } => format!(
                "const f64 {v} = spate::dec_to_f64({x}, {});",
                f64_literal(10f64.powi(i32::from(*scale)))
            ),
            Cast::TimestampCoarser { by } => {
                format!("const i64 {v} = spate::timestamp_coarser((i64){x}, {by}ll);")
            }
            Cast::TimestampFiner { by } => format!(
                "bool {v}_bad;\nconst i64 {v} = spate::timestamp_finer((i64){x}, {by}ll, &{v}_bad);"
            ),
            Cast::ToInt { scale, lo, hi } => {
                let whole = if *scale > 0 {
                    format!("spate::dec_whole({x}, {})", pow10(*scale))
                } else {
                    format!("(i128){x}")
                };
                format!(
                    "bool {v}_bad;\nconst {t} {v} = spate::narrow_int<{t}>({whole}, {}, {}, &{v}_bad);",
                    i128_literal(*lo),
                    i128_literal(*hi)
                )
            }
            Cast::FloatToInt { lo, hi } => format!(
                "bool {v}_bad;\nconst {t} {v} = spate::float_to_int<{t}>((f64){x}, {}, {}, &{v}_bad);",
                f64_literal(*lo),
                f64_literal(*hi)
            ),
            Cast::ToDecimal {
                from,
                to: scale,
                precision,
            } => {
                let (up, down) = if scale >= from {
                    (pow10(scale - from), pow10(0))
                } else {
                    (pow10(0), pow10(from - scale))
                };
                format!(
                    "bool {v}_bad;\nconst i128 {v} = spate::to_decimal((i128){x}, {up}, {down}, {}, &{v}_bad);",
                    pow10(*precision as i8)
                )
            }
            Cast::FloatToDecimal {
                scale, precision, ..
            } => format!(
                "bool {v}_range, {v}_bad;\nconst i128 {v} = spate::float_to_decimal((f64){x}, {}, {}, &{v}_range, &{v}_bad);",
                f64_literal(10f64.powi(i32::from(*scale))),
                pow10(*precision as i8)
            ),
        };
        self.line(&code);
        let n = self.var();
        match fail {
            OnFail::Never => self.line(&format!("const bool {n} = {};", a.null)),
            OnFail::Null => self.line(&format!("const bool {n} = {} || {v}_bad;", a.null)),
            OnFail::Raise(check) => {
                self.line(&format!("const bool {n} = {};", a.null));
                if let Cast::FloatToDecimal { range, .. } = cast {
                    // Arrow fails a value that does not fit an i128 as a cast error, and one
                    // that does but exceeds the precision as an invalid argument.
                    self.raise(&format!("!{n} && {v}_range"), range);
                    self.raise(&format!("!{n} && {v}_bad && !{v}_range"), check);
                } else {
                    self.raise(&format!("!{n} && {v}_bad"), check);
                }
            }
        }
        Operand {
            value: v,
            null: n,
            ty: to,
        }
    }
}

fn arith_name(op: Arith) -> &'static str {
    match op {
        Arith::Add => "add",
        Arith::Sub => "sub",
        Arith::Mul => "mul",
    }
}
