//! CUDA source for one GPU aggregation: the key hash, the hash-table build, the group
//! numbering, the accumulate kernel and the finish kernel, generated together as one program
//! from an [`AggSpec`].
//!
//! Kernel parameters (every column takes the five-parameter layout of `crate::expr::abi`;
//! `live` is a device row count the rows stop at, or null for `n`, see `spate::live_rows`):
//! - `hash(keys…, const u32* live, u64 n, u64* hashes)`: XXH64 of each key (a NULL hashes to
//!   `SPATE_NULL_HASH`), combined left to right.
//! - `build(keys…, const u32* live, u64 n, const u64* hashes, u32* table, u64 mask,
//!   u32* slot_of_row)`: inserts
//!   every row into an open-addressing table of `mask + 1` slots (linear probing). A slot holds
//!   `row + 1` of the first row of its group (0 is empty) and is claimed with `atomicCAS`; a row
//!   whose key equals a slot's row (NULL equals NULL, floats by bit pattern, strings by bytes)
//!   joins it. Float keys hash and compare with -0.0 folded into +0.0.
//! - `flags(const u32* table, u64 cap, u32* flags)`: 1 for an occupied slot; their exclusive
//!   scan numbers the groups.
//! - `assign(const u32* table, const u32* group_of_slot, u64 cap, const u32* slot_of_row,
//!   const u32* live, u64 n, u32* gid, u32* reps)`: each row's group, and each group's first
//!   row.
//! - `update(args…, const u32* live, u64 n, const u32* gid, u64 groups, u64* acc, u32* seen)`:
//!   folds each row (up to a device row count `live`, when not null)
//!   into its group's accumulators with atomics. With at most [`SMALL_GROUPS`] groups, each block
//!   first folds into shared memory and then adds its partial results to `acc` once, so a
//!   handful of hot groups does not serialise every thread on the same global words.
//! - `dhash<j>`, `dbuild<j>` (as `hash` and `build`, keyed by the group keys and the value of
//!   COUNT(DISTINCT) slot `j`) and `dcount<j>(const u8* valid, u64 valid_offset,
//!   const u32* reps, u64 distinct, const u32* gid, u64 groups, u64* acc)`: each distinct
//!   (keys, value) pair with a non-null value adds one to its group's count.
//! - `canon(u8* data, u64 n, u64 width)`: folds -0.0 into +0.0 in a float key column, as
//!   DataFusion's group values store it.
//! - `finish(u64 groups, const u64* acc, const u32* seen, (T* out, u32* valid)…)`: the output
//!   values and their validity, one 32-bit validity word per 32 groups (`valid` is null for an
//!   output that cannot be null). Null counts are not taken: they stay on the device until a
//!   host consumer asks.
//!
//! Accumulators are `u64` words, zero-initialised, `groups` apart (`acc[word * groups + g]`):
//! integer sums and counts add as wrapping `u64` (as DataFusion's `add_wrapping`), float sums as
//! `double`, decimal sums as two words (low, high) with the carry added to the high word, and
//! MIN/MAX as an order-preserving `u64` key (MIN stores the key's complement), so both are one
//! `atomicMax`. Some slots need a second pass over the rows once `update` has finished,
//! `second(args…, const u32* live, u64 n, const u32* gid, u64 groups, u64* acc)`:
//! - MIN/MAX of a Decimal128 above 18 digits take two words, which is exact without a 128-bit
//!   atomic: `update` takes the `atomicMax` of the high 64 bits' order key, then `second` takes
//!   the `atomicMax` of the low 64 bits (unsigned) over the rows whose high key equals the
//!   winner;
//! - variance and standard deviation keep DataFusion's state (count, mean, m2): `update` counts
//!   and sums, then `second` adds each row's squared distance from its group's mean to m2 (the
//!   two-pass algorithm, as exact as DataFusion's Welford updates up to rounding); merging
//!   states, `update` adds the counts and `count * mean`, and `second` adds each state's
//!   `m2 + count * (mean - group mean)^2`.
//!
//! `seen[slot * groups + g]` is set once a non-null value reached the slot.

use std::fmt::Write as _;

use crate::exec::hash_table::codegen::{NUMBERING, finish_program, hash_and_build};
use crate::expr::{DevType, column_params};

/// Groups up to which `update` folds rows in shared memory first.
pub(super) const SMALL_GROUPS: usize = 32;

/// Shared memory `update` may use for its per-block accumulators.
const SHARED_BUDGET_BYTES: usize = 24 * 1024;

/// How an accumulator slot combines values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum SlotKind {
    /// Wrapping 64-bit integer sum.
    SumInt,
    /// `double` sum.
    SumF64,
    /// Wrapping 128-bit sum of Decimal128 values.
    SumDec,
    /// Counts non-null inputs, or (`add_values`) adds non-null counts when merging states.
    Count { add_values: bool },
    /// Smallest value in the type's order (floats: IEEE total order).
    Min,
    /// Largest value in the type's order.
    Max,
    /// MIN of a Decimal128 wider than 64 bits: two words, `[high key, low key]` (see the module
    /// docs).
    MinWide,
    /// MAX of a Decimal128 wider than 64 bits, as [`SlotKind::MinWide`].
    MaxWide,
    /// Distinct non-null values per group (COUNT(DISTINCT)): counted by `dcount` from a second
    /// hash table over (group keys, value), not by `update`.
    CountDistinct,
    /// The sum of squared distances from the group's mean (variance's m2), a `double` added by
    /// `second` from slots `count` (the non-null rows) and `sum` (their sum).
    M2 { count: usize, sum: usize },
    /// m2 of merged variance states: `second` adds each state's `m2 + n * (mean - group
    /// mean)^2`, the state's count being the slot's argument and its mean and m2 the arguments
    /// `mean` and `m2`; the group's mean is slot `sum` (the sum of `n * mean`) over slot
    /// `count`.
    M2Merge {
        count: usize,
        sum: usize,
        mean: usize,
        m2: usize,
    },
}

impl SlotKind {
    fn words(self) -> usize {
        match self {
            SlotKind::SumDec | SlotKind::MinWide | SlotKind::MaxWide => 2,
            _ => 1,
        }
    }
}

/// One accumulator.
#[derive(Debug, Clone)]
pub(super) struct Slot {
    pub(super) kind: SlotKind,
    /// The argument it reads, or `None` when every row counts (`COUNT(*)`).
    pub(super) arg: Option<usize>,
    /// A boolean argument (the aggregate's FILTER): only the rows where it is TRUE count.
    pub(super) filter: Option<usize>,
}

impl Slot {
    /// `code` run only for the rows the slot's FILTER keeps.
    fn filtered(&self, code: String) -> String {
        match self.filter {
            None => code,
            Some(f) => format!(
                "if (spate::row_is_valid(av{f}, ao{f}, i) && spate::bit_is_set(ad{f}, ab{f}, i)) {{ {code} }}"
            ),
        }
    }
}

/// How an output column is made from the accumulators.
#[derive(Debug, Clone)]
pub(super) enum Out {
    /// A slot's value (a SUM, COUNT, MIN or MAX, or one field of a partial state).
    Slot(usize),
    /// `sum / count` as `double`; NULL when the count is 0.
    AvgF64 { count: usize, sum: usize },
    /// `sum * 10^shift / count` truncated toward zero (DataFusion's `DecimalAverager`); NULL
    /// when the count is 0.
    AvgDec { count: usize, sum: usize, shift: i8 },
    /// `sum / count` as `double`, 0.0 when the count is 0 (a variance state's mean).
    Mean { count: usize, sum: usize },
    /// `m2 / (count - 1)` (`sample`) or `m2 / count`, its square root when `sqrt`; NULL without
    /// enough rows (a sample needs two, a population one), as DataFusion's.
    Variance {
        count: usize,
        m2: usize,
        sample: bool,
        sqrt: bool,
    },
}

/// What the generated program computes.
#[derive(Debug, Clone)]
pub(super) struct AggSpec {
    /// The device type of each group key.
    pub(super) keys: Vec<DevType>,
    /// The device type of each aggregate argument.
    pub(super) args: Vec<DevType>,
    /// The accumulators.
    pub(super) slots: Vec<Slot>,
    /// The aggregate output columns (after the keys) and their device types.
    pub(super) outputs: Vec<(Out, DevType)>,
    /// GROUPING SETS / ROLLUP / CUBE: per set, the keys it leaves NULL (bit `k` for key `k`)
    /// and its `__grouping_id`, the last of `keys`. Empty for a plain GROUP BY.
    pub(super) sets: Vec<(u64, u64)>,
}

/// The generated program.
#[derive(Debug, Clone)]
pub(super) struct AggProgram {
    pub(super) source: String,
    /// Entry points: `(kernel, entry point)`, the kernel named as in the module docs
    /// (`hash`, `build`, ..., and `dhash<j>`, `dbuild<j>`, `dcount<j>` for COUNT(DISTINCT)
    /// slot `j`).
    pub(super) entries: Vec<(String, String)>,
    /// Accumulator words per group.
    pub(super) words: usize,
    /// Per output, whether it can be null (COUNT cannot): only those get a validity bitmap.
    pub(super) nullable: Vec<bool>,
}

const SIGN: &str = "0x8000000000000000ull";

/// The order key of a Decimal128 `v`'s high 64 bits (signed).
const HIGH_KEY: &str = "((u64)(i64)(v >> 64) ^ 0x8000000000000000ull)";

/// The order-preserving `u64` key of a MIN/MAX value `v`.
fn order_key(ty: DevType) -> String {
    match ty {
        DevType::Int { signed: true, .. } | DevType::Dec { .. } => {
            format!("((u64)(i64)v ^ {SIGN})")
        }
        DevType::Int { signed: false, .. } | DevType::Bool => "(u64)v".into(),
        DevType::F32 => "(u64)spate::total_order(v)".into(),
        _ => "spate::total_order(v)".into(),
    }
}

/// The value of order key `k` as `ty`.
fn from_order_key(ty: DevType, k: &str) -> String {
    match ty {
        DevType::Int { signed: true, .. } => format!("({})(i64)({k} ^ {SIGN})", ty.c_type()),
        DevType::Dec { .. } => format!("(i128)(i64)({k} ^ {SIGN})"),
        DevType::Int { signed: false, .. } => format!("({})({k})", ty.c_type()),
        DevType::Bool => format!("(({k}) != 0ull)"),
        DevType::F32 => format!("spate_agg_f32((u32)({k}))"),
        _ => format!("spate_agg_f64({k})"),
    }
}

struct Layout {
    /// First accumulator word of each slot.
    base: Vec<usize>,
    words: usize,
}

fn layout(slots: &[Slot]) -> Layout {
    let mut base = Vec::with_capacity(slots.len());
    let mut words = 0;
    for s in slots {
        base.push(words);
        words += s.kind.words();
    }
    Layout { base, words }
}

/// Folds row `i` into group `g` of accumulators `acc`/`seen` laid out `stride` apart.
fn update_row(spec: &AggSpec, lay: &Layout, acc: &str, seen: &str, stride: &str) -> String {
    let mut code = String::new();
    for (j, slot) in spec.slots.iter().enumerate() {
        let w = lay.base[j];
        let word = |x: usize| format!("{acc}[{} * {stride} + g]", w + x);
        let mark = format!("if (!{seen}[{j} * {stride} + g]) {seen}[{j} * {stride} + g] = 1u;");
        if matches!(
            slot.kind,
            SlotKind::CountDistinct | SlotKind::M2 { .. } | SlotKind::M2Merge { .. }
        ) {
            continue;
        }
        let Some(a) = slot.arg else {
            let count = slot.filtered(format!("atomicAdd(&{}, 1ull);", word(0)));
            let _ = writeln!(code, "            {count}");
            continue;
        };
        let ty = spec.args[a];
        let load = match (ty, slot.kind) {
            (_, SlotKind::Count { add_values: false }) | (DevType::Str, _) => String::new(),
            // A boolean's order key is its bit.
            (DevType::Bool, SlotKind::Min | SlotKind::Max) => {
                format!("const u64 v = spate::bit_is_set(ad{a}, ab{a}, i) ? 1ull : 0ull; ")
            }
            (DevType::Bool, _) => String::new(),
            _ => format!(
                "const {} v = ((const {}*)ad{a})[i]; ",
                ty.c_type(),
                ty.c_type()
            ),
        };
        let op = match slot.kind {
            SlotKind::Count { add_values: false } => format!("atomicAdd(&{}, 1ull);", word(0)),
            SlotKind::Count { add_values: true } => {
                format!("atomicAdd(&{}, (u64)v);", word(0))
            }
            SlotKind::SumInt => {
                let widen = match ty {
                    DevType::Int { signed: true, .. } => "(u64)(i64)v",
                    _ => "(u64)v",
                };
                format!("atomicAdd(&{}, {widen}); {mark}", word(0))
            }
            SlotKind::SumF64 => format!("atomicAdd((f64*)&{}, (f64)v); {mark}", word(0)),
            SlotKind::SumDec => format!(
                "spate_agg_add128(&{}, &{}, (i128)v); {mark}",
                word(0),
                word(1)
            ),
            SlotKind::Max => format!("atomicMax(&{}, {}); {mark}", word(0), order_key(ty)),
            SlotKind::Min => format!("atomicMax(&{}, ~{}); {mark}", word(0), order_key(ty)),
            SlotKind::MaxWide => format!("atomicMax(&{}, {HIGH_KEY}); {mark}", word(0)),
            SlotKind::MinWide => format!("atomicMax(&{}, ~{HIGH_KEY}); {mark}", word(0)),
            SlotKind::CountDistinct | SlotKind::M2 { .. } | SlotKind::M2Merge { .. } => continue,
        };
        let fold = slot.filtered(format!(
            "if (spate::row_is_valid(av{a}, ao{a}, i)) {{ {load}{op} }}"
        ));
        let _ = writeln!(code, "            {fold}");
    }
    code
}

/// The `second` kernel (see the module docs), when a slot needs a second pass.
fn second_kernel(spec: &AggSpec, lay: &Layout, args: &str) -> Option<String> {
    let mut rows = String::new();
    let word = |slot: usize| format!("acc[{} * groups + g]", lay.base[slot]);
    let group_mean = |count: usize, sum: usize| {
        format!(
            "__longlong_as_double((i64){}) / (f64){}",
            word(sum),
            word(count)
        )
    };
    for (j, slot) in spec.slots.iter().enumerate() {
        let Some(a) = slot.arg else {
            continue;
        };
        let w = lay.base[j];
        let row = match slot.kind {
            SlotKind::MaxWide | SlotKind::MinWide => {
                let (hi, lo) = match slot.kind {
                    SlotKind::MaxWide => (HIGH_KEY.to_string(), "(u64)v".to_string()),
                    _ => (format!("~{HIGH_KEY}"), "~(u64)v".to_string()),
                };
                format!(
                    "const i128 v = ((const i128*)ad{a})[i]; if ({hi} == acc[{w} * groups + g]) atomicMax(&acc[{} * groups + g], {lo});",
                    w + 1
                )
            }
            SlotKind::M2 { count, sum } => format!(
                "const f64 d = ((const f64*)ad{a})[i] - ({}); atomicAdd((f64*)&{}, d * d);",
                group_mean(count, sum),
                word(j)
            ),
            SlotKind::M2Merge {
                count,
                sum,
                mean,
                m2,
            } => format!(
                "const u64 c = ((const u64*)ad{a})[i]; if (c != 0ull) {{ const f64 d = ((const f64*)ad{mean})[i] - ({}); atomicAdd((f64*)&{}, ((const f64*)ad{m2})[i] + (f64)c * d * d); }}",
                group_mean(count, sum),
                word(j)
            ),
            _ => continue,
        };
        let fold = slot.filtered(format!(
            "if (spate::row_is_valid(av{a}, ao{a}, i)) {{ {row} }}"
        ));
        let _ = writeln!(rows, "        {fold}");
    }
    (!rows.is_empty()).then(|| {
        format!(
            r#"extern "C" __global__ void __launch_bounds__(SPATE_BLOCK_THREADS) ENTRY_second({args}const u32* live, u64 n, const u32* gid, u64 groups, u64* acc) {{
    const u64 m = spate::live_rows(live, n);
    for (u64 i = spate::global_thread_index(); i < m; i += spate::grid_stride()) {{
        const u64 g = gid != nullptr ? (u64)gid[i] : 0ull;
{rows}    }}
}}
SPATE_EXPORT(ENTRY_second)

"#
        )
    })
}

/// Adds a block's shared accumulators for groups `t` to the global ones.
fn flush_shared(spec: &AggSpec, lay: &Layout) -> String {
    let small = SMALL_GROUPS;
    let mut code = String::new();
    for (j, slot) in spec.slots.iter().enumerate() {
        let w = lay.base[j];
        let sh = |x: usize| format!("sacc[{} * {small} + t]", w + x);
        let gl = |x: usize| format!("acc[{} * groups + t]", w + x);
        let seen = format!("sseen[{j} * {small} + t]");
        let mark = format!("seen[{j} * groups + t] = 1u;");
        let body = match slot.kind {
            SlotKind::CountDistinct | SlotKind::M2 { .. } | SlotKind::M2Merge { .. } => continue,
            SlotKind::Count { .. } => {
                format!("if ({} != 0) atomicAdd(&{}, {});", sh(0), gl(0), sh(0))
            }
            SlotKind::SumInt => {
                format!("if ({seen}) {{ atomicAdd(&{}, {}); {mark} }}", gl(0), sh(0))
            }
            SlotKind::SumF64 => format!(
                "if ({seen}) {{ atomicAdd((f64*)&{}, __longlong_as_double((i64){})); {mark} }}",
                gl(0),
                sh(0)
            ),
            SlotKind::SumDec => format!(
                "if ({seen}) {{ spate_agg_add128(&{}, &{}, (i128)(((u128i){} << 64) | (u128i){})); {mark} }}",
                gl(0),
                gl(1),
                sh(1),
                sh(0)
            ),
            // The wide kinds' low words are folded by `second`, straight into `acc`.
            SlotKind::Min | SlotKind::Max | SlotKind::MinWide | SlotKind::MaxWide => {
                format!("if ({seen}) {{ atomicMax(&{}, {}); {mark} }}", gl(0), sh(0))
            }
        };
        let _ = writeln!(
            code,
            "        for (u64 t = threadIdx.x; t < groups; t += blockDim.x) {{ {body} }}"
        );
    }
    code
}

/// The value and validity of output `o` for group `g`.
fn finish_value(spec: &AggSpec, lay: &Layout, out: &Out, ty: DevType) -> (String, String) {
    let word = |slot: usize, x: usize| format!("acc[{} * groups + g]", lay.base[slot] + x);
    let seen = |slot: usize| format!("(seen[{slot} * groups + g] != 0u)");
    match *out {
        Out::Slot(j) => match spec.slots[j].kind {
            SlotKind::Count { .. } | SlotKind::CountDistinct => {
                (format!("({})({})", ty.c_type(), word(j, 0)), "true".into())
            }
            SlotKind::M2 { .. } | SlotKind::M2Merge { .. } => (
                format!("__longlong_as_double((i64){})", word(j, 0)),
                "true".into(),
            ),
            SlotKind::SumInt => (format!("({})({})", ty.c_type(), word(j, 0)), seen(j)),
            SlotKind::SumF64 => (
                format!("__longlong_as_double((i64){})", word(j, 0)),
                seen(j),
            ),
            SlotKind::SumDec => (
                format!(
                    "(i128)(((u128i){} << 64) | (u128i){})",
                    word(j, 1),
                    word(j, 0)
                ),
                seen(j),
            ),
            SlotKind::Max => (from_order_key(ty, &word(j, 0)), seen(j)),
            SlotKind::Min => (from_order_key(ty, &format!("~{}", word(j, 0))), seen(j)),
            SlotKind::MaxWide => (
                format!(
                    "(i128)(((u128i)({} ^ {SIGN}) << 64) | (u128i){})",
                    word(j, 0),
                    word(j, 1)
                ),
                seen(j),
            ),
            SlotKind::MinWide => (
                format!(
                    "(i128)(((u128i)(~{} ^ {SIGN}) << 64) | (u128i)(~{}))",
                    word(j, 0),
                    word(j, 1)
                ),
                seen(j),
            ),
        },
        Out::AvgF64 { count, sum } => (
            format!(
                "({c} != 0ull ? __longlong_as_double((i64){s}) / (f64){c} : 0.0)",
                c = word(count, 0),
                s = word(sum, 0)
            ),
            format!("({} != 0ull)", word(count, 0)),
        ),
        Out::Mean { count, sum } => (
            format!(
                "({c} != 0ull ? __longlong_as_double((i64){s}) / (f64){c} : 0.0)",
                c = word(count, 0),
                s = word(sum, 0)
            ),
            "true".into(),
        ),
        Out::Variance {
            count,
            m2,
            sample,
            sqrt,
        } => {
            let c = word(count, 0);
            let (divisor, least) = if sample {
                (format!("(f64)({c} - 1ull)"), 2)
            } else {
                (format!("(f64){c}"), 1)
            };
            let variance = format!("(__longlong_as_double((i64){}) / {divisor})", word(m2, 0));
            let value = if sqrt {
                format!("sqrt({variance})")
            } else {
                variance
            };
            (
                format!("({c} >= {least}ull ? {value} : 0.0)"),
                format!("({c} >= {least}ull)"),
            )
        }
        Out::AvgDec { count, sum, shift } => (
            format!(
                "({c} != 0ull ? ((i128)(((u128i){hi} << 64) | (u128i){lo}) * (i128){mul}ull) / (i128){c} : (i128)0)",
                c = word(count, 0),
                hi = word(sum, 1),
                lo = word(sum, 0),
                mul = 10u64.pow(u32::from(shift.unsigned_abs()))
            ),
            format!("({} != 0ull)", word(count, 0)),
        ),
    }
}

/// `expand(u64 n, u32* rows, u32* key_rows, ID* ids)` for grouping sets: output row
/// `o = set * n + r` reads input row `r` (`rows[o]`), key `k` of it or NULL when the set leaves
/// key `k` out (`key_rows[k * n * sets + o]`, `SPATE_NULL_INDEX` for NULL), and its set's
/// `__grouping_id` (`ids[o]`). `None` without grouping sets.
fn expand_kernel(spec: &AggSpec) -> Option<String> {
    let (&id_ty, keys) = spec.keys.split_last()?;
    if spec.sets.is_empty() {
        return None;
    }
    let mut cases = String::new();
    for (s, (mask, id)) in spec.sets.iter().enumerate() {
        let _ = write!(cases, "case {s}: mask = {mask}ull; id = {id}ull; break; ");
    }
    let (sets, nkeys, id_c) = (spec.sets.len(), keys.len(), id_ty.c_type());
    Some(format!(
        r#"extern "C" __global__ void __launch_bounds__(SPATE_BLOCK_THREADS) ENTRY_expand(u64 n, u32* rows, u32* key_rows, {id_c}* ids) {{
    const u64 total = n * {sets}ull;
    for (u64 o = spate::global_thread_index(); o < total; o += spate::grid_stride()) {{
        const u64 s = o / n;
        const u32 r = (u32)(o - s * n);
        u64 mask = 0ull, id = 0ull;
        switch (s) {{ {cases}default: break; }}
        rows[o] = r;
        for (u64 k = 0; k < {nkeys}ull; ++k) key_rows[k * total + o] = ((mask >> k) & 1ull) ? SPATE_NULL_INDEX : r;
        ids[o] = ({id_c})id;
    }}
}}
SPATE_EXPORT(ENTRY_expand)

"#
    ))
}

/// Helpers of the aggregation kernels, ahead of them in the program.
const AGG_HELPERS: &str = r#"
// A wrapping 128-bit atomic add as two 64-bit ones: the low word's carry goes to the high word.
__device__ __forceinline__ void spate_agg_add128(u64* lo, u64* hi, i128 v) {
    const u64 vl = (u64)v;
    const u64 vh = (u64)((u128i)v >> 64);
    const u64 old = atomicAdd(lo, vl);
    const u64 add = vh + ((old + vl < old) ? 1ull : 0ull);
    if (add != 0ull) atomicAdd(hi, add);
}

// The inverses of spate::total_order.
__device__ __forceinline__ f64 spate_agg_f64(u64 k) {
    const u64 b = (k & 0x8000000000000000ull) ? (k ^ 0x8000000000000000ull) : ~k;
    return __longlong_as_double((i64)b);
}
__device__ __forceinline__ f32 spate_agg_f32(u32 k) {
    const u32 b = (k & 0x80000000u) ? (k ^ 0x80000000u) : ~k;
    return __uint_as_float(b);
}

"#;

/// Generates the program for `spec`; `label` names the aggregation in a comment.
pub(super) fn generate(spec: &AggSpec, label: &str) -> AggProgram {
    let lay = layout(&spec.slots);
    let args = column_params("a", spec.args.len());
    let mut body = String::from(AGG_HELPERS);

    body.push_str(&hash_and_build(&spec.keys, "hash", "build"));
    body.push_str(NUMBERING);
    let _ = write!(
        body,
        r#"extern "C" __global__ void __launch_bounds__(SPATE_BLOCK_THREADS) ENTRY_canon(u8* data, u64 n, u64 width) {{
    for (u64 i = spate::global_thread_index(); i < n; i += spate::grid_stride()) {{
        if (width == 4ull) {{ u32* p = (u32*)data; if (p[i] == 0x80000000u) p[i] = 0u; }}
        else {{ u64* p = (u64*)data; if (p[i] == 0x8000000000000000ull) p[i] = 0ull; }}
    }}
}}
SPATE_EXPORT(ENTRY_canon)

"#
    );

    // update
    let small = SMALL_GROUPS;
    let shared_bytes = small * (lay.words * 8 + spec.slots.len() * 4);
    let global_rows = update_row(spec, &lay, "acc", "seen", "groups");
    let privatized = if shared_bytes <= SHARED_BUDGET_BYTES && lay.words > 0 {
        format!(
            r#"    if (groups <= {small}ull) {{
        __shared__ u64 sacc[{sw}];
        __shared__ u32 sseen[{ss}];
        for (u32 t = threadIdx.x; t < {sw}u; t += blockDim.x) sacc[t] = 0ull;
        for (u32 t = threadIdx.x; t < {ss}u; t += blockDim.x) sseen[t] = 0u;
        __syncthreads();
        for (u64 i = spate::global_thread_index(); i < m; i += spate::grid_stride()) {{
            const u64 g = gid != nullptr ? (u64)gid[i] : 0ull;
{rows}        }}
        __syncthreads();
{flush}        return;
    }}
"#,
            sw = lay.words * small,
            ss = spec.slots.len().max(1) * small,
            rows = update_row(spec, &lay, "sacc", "sseen", &format!("{small}ull")),
            flush = flush_shared(spec, &lay),
        )
    } else {
        String::new()
    };
    let _ = write!(
        body,
        r#"extern "C" __global__ void __launch_bounds__(SPATE_BLOCK_THREADS) ENTRY_update({args}const u32* live, u64 n, const u32* gid, u64 groups, u64* acc, u32* seen) {{
    const u64 m = spate::live_rows(live, n);
{privatized}    for (u64 i = spate::global_thread_index(); i < m; i += spate::grid_stride()) {{
        const u64 g = gid != nullptr ? (u64)gid[i] : 0ull;
{global_rows}    }}
}}
SPATE_EXPORT(ENTRY_update)

"#
    );

    // finish
    let mut params = String::new();
    let mut compute = String::new();
    let mut publish = String::new();
    let mut nullable = Vec::with_capacity(spec.outputs.len());
    let mut declare = String::new();
    for (j, (out, ty)) in spec.outputs.iter().enumerate() {
        let c = ty.c_type();
        let (value, valid) = finish_value(spec, &lay, out, *ty);
        nullable.push(valid != "true");
        let _ = writeln!(declare, "        bool ok{j} = false;");
        if *ty == DevType::Bool {
            // Booleans are bits, published a warp's word at a time like the validity.
            let _ = write!(params, ", u32* out{j}, u32* valid{j}");
            let _ = writeln!(declare, "        bool set{j} = false;");
            let _ = writeln!(
                compute,
                "            ok{j} = {valid};\n            set{j} = ok{j} && ({value});"
            );
            let _ = writeln!(
                publish,
                "        {{ const u32 w = __ballot_sync(SPATE_FULL_MASK, set{j}); if (spate::lane_id() == 0) out{j}[base / 32] = w; }}"
            );
        } else {
            let _ = write!(params, ", {c}* out{j}, u32* valid{j}");
            let _ = writeln!(
                compute,
                "            ok{j} = {valid};\n            out{j}[g] = ok{j} ? ({c})({value}) : ({c})0;"
            );
        }
        let _ = writeln!(
            publish,
            "        if (valid{j} != nullptr) {{ const u32 v = __ballot_sync(SPATE_FULL_MASK, ok{j}); if (spate::lane_id() == 0) valid{j}[base / 32] = v; }}"
        );
    }
    let _ = write!(
        body,
        r#"extern "C" __global__ void __launch_bounds__(SPATE_BLOCK_THREADS) ENTRY_finish(u64 groups, const u64* acc, const u32* seen{params}) {{
    const u64 warps = spate::grid_stride() / 32;
    for (u64 base = (spate::global_thread_index() / 32) * 32; base < groups; base += warps * 32) {{
        const u64 g = base + spate::lane_id();
{declare}        if (g < groups) {{
{compute}        }}
{publish}    }}
}}
SPATE_EXPORT(ENTRY_finish)
"#
    );

    // COUNT(DISTINCT): a second table over (group keys, value) per slot; each distinct pair
    // with a non-null value adds one to its group.
    let mut names: Vec<String> = [
        "hash", "build", "flags", "assign", "update", "finish", "canon",
    ]
    .iter()
    .map(|n| n.to_string())
    .collect();
    if let Some(second) = second_kernel(spec, &lay, &args) {
        body.push_str(&second);
        names.push("second".into());
    }
    if let Some(expand) = expand_kernel(spec) {
        body.push_str(&expand);
        names.push("expand".into());
    }
    for (j, slot) in spec.slots.iter().enumerate() {
        let (SlotKind::CountDistinct, Some(a)) = (slot.kind, slot.arg) else {
            continue;
        };
        let mut keys = spec.keys.clone();
        keys.push(spec.args[a]);
        body.push_str(&hash_and_build(
            &keys,
            &format!("dhash{j}"),
            &format!("dbuild{j}"),
        ));
        let _ = write!(
            body,
            r#"extern "C" __global__ void __launch_bounds__(SPATE_BLOCK_THREADS) ENTRY_dcount{j}(const u8* valid, u64 valid_offset, const u32* reps, u64 distinct, const u32* gid, u64 groups, u64* acc) {{
    for (u64 r = spate::global_thread_index(); r < distinct; r += spate::grid_stride()) {{
        const u64 row = reps[r];
        if (spate::row_is_valid(valid, valid_offset, row)) atomicAdd(&acc[{w}ull * groups + (gid != nullptr ? (u64)gid[row] : 0ull)], 1ull);
    }}
}}
SPATE_EXPORT(ENTRY_dcount{j})

"#,
            w = lay.base[j]
        );
        names.extend([
            format!("dhash{j}"),
            format!("dbuild{j}"),
            format!("dcount{j}"),
        ]);
    }

    let (source, entries) = finish_program(
        &body,
        &names,
        "agg",
        &format!("spate::exec::aggregate for {label}"),
    );
    AggProgram {
        source,
        entries,
        words: lay.words,
        nullable,
    }
}
