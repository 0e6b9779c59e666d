//! CUDA source for one GPU window operator (see [`super`]):
//! - `bounds(p keys…, o keys…, u64 n, u32* np, u32* nq)`: 1 where a row starts a partition
//!   (`np`) and where it starts a run of peers (`nq`), comparing each row with the one before
//!   (columns take the five-parameter layout of `crate::expr::abi`);
//! - `starts(np, nq, pe, qe, u64 n, u32* pid, u32* qid, u32* pstart, u32* qstart)`: each row's
//!   partition and peer run (from the exclusive scans `pe`, `qe` of the flags), and the row each
//!   starts at;
//! - the row kernels, one value per row from the starts, all taking `(pid, qid, pstart,
//!   qstart, u64 partitions, u64 n, i64 param, T* out)`:
//!   - `numbers`: row_number (`param` 0), rank (1) or dense_rank (2), as u64;
//!   - `shift`: for `lag` and `lead`, the row `param` rows before each row (after it for a
//!     negative `param`), or `NULL_INDEX` when that row is outside the row's partition;
//!   - `ratios`: `percent_rank` ((rank - 1) / max(rows - 1, 1); `param` 0) or `cume_dist`
//!     (rows up to the last peer / rows; 1), as DataFusion computes them, as f64;
//!   - `ntile`: DataFusion's `param` buckets, the first `rows % buckets` one row larger;
//!   - `edges`: per row, its partition's first row (`param` 0), its peer run's last row (1),
//!     its partition's last row (2) or itself (3), for `first_value` and `last_value`;
//! - `running(r args…, const u32* pstart, u64 partitions, const u32* nq, u64 n, (T* out,
//!   u32* valid)…)`, when the window has running aggregates: one thread per partition walks its
//!   rows in order, as DataFusion's accumulators do, and writes each row's value (ROWS frames) or
//!   each run of peers' value at its last row (RANGE frames). `valid` starts zeroed; bits are set
//!   with `atomicOr`, since neighbouring partitions share words;
//! - `sliding((r args…, const u32* pstart, const u32* pid, u64 n, (T* out, u32* valid)…)`, when
//!   the window has sliding aggregates (ROWS BETWEEN `k` PRECEDING AND CURRENT ROW): one thread
//!   per row folds the at most `k + 1` rows of its frame, in order, into its own value (the
//!   work is rows × frame length; frames are capped at `MAX_SLIDING` rows).

use std::fmt::Write as _;

use crate::exec::hash_table::codegen::{finish_program, key_equal};
use crate::expr::{DevType, column_params};

/// How a running aggregate folds a value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum RunningKind {
    /// Wrapping 64-bit integer sum.
    SumInt,
    /// Wrapping 128-bit decimal sum (the argument's scale is the result's).
    SumDec,
    /// `double` sum, in row order from 0.0, as DataFusion's accumulator adds.
    SumF64,
    /// Non-null values (every row without an argument).
    Count,
    Min,
    Max,
}

/// One running aggregate: `SUM`, `COUNT`, `MIN` or `MAX` from the partition's first row to the
/// current row (ROWS) or to the current row's last peer (RANGE).
#[derive(Debug, Clone)]
pub(super) struct Running {
    pub(super) kind: RunningKind,
    /// Its argument among the `running` kernel's `r` columns; `None` counts rows.
    pub(super) arg: Option<usize>,
    /// The argument's device type, and the output's (and its Arrow type).
    pub(super) arg_ty: DevType,
    pub(super) out_ty: DevType,
    pub(super) out_type: arrow::datatypes::DataType,
    /// RANGE frame: peers take the value at their last row.
    pub(super) range: bool,
    /// A sliding ROWS frame of this many rows before the current one (`None`: from the
    /// partition's first row).
    pub(super) preceding: Option<u64>,
}

impl Running {
    /// Whether the `sliding` kernel computes it, one thread per row. A sliding float sum
    /// walks its partition in the `running` kernel instead, adding the entering row and then
    /// subtracting the leaving one as DataFusion's sliding accumulator does, so the two agree
    /// bit for bit (an infinity leaving the frame leaves NaN behind on both).
    pub(super) fn per_row(&self) -> bool {
        self.preceding.is_some() && self.kind != RunningKind::SumF64
    }
}

/// The most rows before the current one a sliding frame may reach on the GPU, which folds each
/// frame row by row (rows × frame work, where DataFusion's accumulators add and subtract);
/// longer frames stay on the CPU.
pub(super) const MAX_SLIDING: u64 = 1 << 10;

/// The window program for partition keys and ORDER BY keys of these (exact) types, the
/// running aggregates over `args` argument columns, and its `(name, entry)` pairs.
pub(super) fn program(
    partition: &[DevType],
    order: &[DevType],
    running: &[Running],
    args: usize,
    label: &str,
) -> (String, Vec<(String, String)>) {
    let equal = |prefix: &str, keys: &[DevType]| -> String {
        keys.iter()
            .enumerate()
            .map(|(k, ty)| key_equal(prefix, prefix, k, *ty))
            .collect()
    };
    let (pparams, oparams) = (
        column_params("p", partition.len()),
        column_params("o", order.len()),
    );
    let (pequal, oequal) = (equal("p", partition), equal("o", order));
    let mut body = String::from("#include \"common/arith.cuh\"\n\n");
    let _ = write!(
        body,
        r#"extern "C" __global__ void __launch_bounds__(SPATE_BLOCK_THREADS) ENTRY_bounds({pparams}{oparams}u64 n, u32* np, u32* nq) {{
    for (u64 i = spate::global_thread_index(); i < n; i += spate::grid_stride()) {{
        bool newp = i == 0ull;
        if (!newp) {{
            const u64 a = i - 1ull;
            const u64 b = i;
            bool eq = true;
{pequal}            newp = !eq;
        }}
        bool newq = newp;
        if (!newq) {{
            const u64 a = i - 1ull;
            const u64 b = i;
            bool eq = true;
{oequal}            newq = !eq;
        }}
        np[i] = newp ? 1u : 0u;
        nq[i] = newq ? 1u : 0u;
    }}
}}
SPATE_EXPORT(ENTRY_bounds)

extern "C" __global__ void __launch_bounds__(SPATE_BLOCK_THREADS) ENTRY_starts(const u32* np, const u32* nq, const u32* pe, const u32* qe, u64 n, u32* pid, u32* qid, u32* pstart, u32* qstart) {{
    for (u64 i = spate::global_thread_index(); i < n; i += spate::grid_stride()) {{
        const u32 p = pe[i] + np[i] - 1u;
        const u32 q = qe[i] + nq[i] - 1u;
        pid[i] = p;
        qid[i] = q;
        if (np[i] != 0u) pstart[p] = (u32)i;
        if (nq[i] != 0u) qstart[q] = (u32)i;
    }}
}}
SPATE_EXPORT(ENTRY_starts)

extern "C" __global__ void __launch_bounds__(SPATE_BLOCK_THREADS) ENTRY_numbers(const u32* pid, const u32* qid, const u32* pstart, const u32* qstart, u64 partitions, u64 n, i64 param, u64* out) {{
    const u64 kind = (u64)param;
    for (u64 i = spate::global_thread_index(); i < n; i += spate::grid_stride()) {{
        const u32 s = pstart[pid[i]];
        u64 v;
        if (kind == 0ull) v = i - (u64)s + 1ull;
        else if (kind == 1ull) v = (u64)qstart[qid[i]] - (u64)s + 1ull;
        else v = (u64)qid[i] - (u64)qid[s] + 1ull;
        out[i] = v;
    }}
}}
SPATE_EXPORT(ENTRY_numbers)

extern "C" __global__ void __launch_bounds__(SPATE_BLOCK_THREADS) ENTRY_shift(const u32* pid, const u32* qid, const u32* pstart, const u32* qstart, u64 partitions, u64 n, i64 param, u32* out) {{
    const i64 offset = param;
    for (u64 i = spate::global_thread_index(); i < n; i += spate::grid_stride()) {{
        const u64 p = pid[i];
        const i64 start = (i64)pstart[p];
        const i64 end = p + 1ull < partitions ? (i64)pstart[p + 1ull] : (i64)n;
        const i64 j = (i64)i - offset;
        out[i] = (j >= start && j < end) ? (u32)j : SPATE_NULL_INDEX;
    }}
}}
SPATE_EXPORT(ENTRY_shift)

extern "C" __global__ void __launch_bounds__(SPATE_BLOCK_THREADS) ENTRY_ratios(const u32* pid, const u32* qid, const u32* pstart, const u32* qstart, u64 partitions, u64 n, i64 param, f64* out) {{
    const bool cume = param != 0ll;
    const u64 last_q = qid[n - 1ull];
    for (u64 i = spate::global_thread_index(); i < n; i += spate::grid_stride()) {{
        const u64 p = pid[i];
        const u64 q = qid[i];
        const u64 ps = pstart[p];
        const u64 pe = p + 1ull < partitions ? (u64)pstart[p + 1ull] : n;
        const u64 rows = pe - ps;
        if (cume) {{
            const u64 qe = q < last_q ? (u64)qstart[q + 1ull] : n;
            out[i] = (f64)(qe - ps) / (f64)rows;
        }} else {{
            const f64 d = (f64)rows - 1.0;
            out[i] = (f64)((u64)qstart[q] - ps) / (d > 1.0 ? d : 1.0);
        }}
    }}
}}
SPATE_EXPORT(ENTRY_ratios)

extern "C" __global__ void __launch_bounds__(SPATE_BLOCK_THREADS) ENTRY_ntile(const u32* pid, const u32* qid, const u32* pstart, const u32* qstart, u64 partitions, u64 n, i64 param, u64* out) {{
    const u64 buckets = (u64)param;
    for (u64 i = spate::global_thread_index(); i < n; i += spate::grid_stride()) {{
        const u64 p = pid[i];
        const u64 ps = pstart[p];
        const u64 rows = (p + 1ull < partitions ? (u64)pstart[p + 1ull] : n) - ps;
        const u64 k = i - ps;
        const u64 base = rows / buckets;
        const u64 rem = rows % buckets;
        const u64 large_rows = rem * (base + 1ull);
        out[i] = k < large_rows ? k / (base + 1ull) + 1ull : rem + (k - large_rows) / base + 1ull;
    }}
}}
SPATE_EXPORT(ENTRY_ntile)

extern "C" __global__ void __launch_bounds__(SPATE_BLOCK_THREADS) ENTRY_edges(const u32* pid, const u32* qid, const u32* pstart, const u32* qstart, u64 partitions, u64 n, i64 param, u32* out) {{
    const u64 which = (u64)param;
    const u64 last_q = qid[n - 1ull];
    for (u64 i = spate::global_thread_index(); i < n; i += spate::grid_stride()) {{
        const u64 p = pid[i];
        const u64 q = qid[i];
        u64 r;
        if (which == 0ull) r = pstart[p];
        else if (which == 1ull) r = (q < last_q ? (u64)qstart[q + 1ull] : n) - 1ull;
        else if (which == 2ull) r = (p + 1ull < partitions ? (u64)pstart[p + 1ull] : n) - 1ull;
        else r = i;
        out[i] = (u32)r;
    }}
}}
SPATE_EXPORT(ENTRY_edges)

"#
    );
    let mut names = vec![
        "bounds".to_string(),
        "starts".into(),
        "numbers".into(),
        "shift".into(),
        "ratios".into(),
        "ntile".into(),
        "edges".into(),
    ];
    if running.iter().any(|r| !r.per_row()) {
        body.push_str(&running_kernel(running, args));
        names.push("running".into());
    }
    if running.iter().any(Running::per_row) {
        body.push_str(&sliding_kernel(running, args));
        names.push("sliding".into());
    }
    finish_program(
        &body,
        &names,
        "window",
        &format!("spate::exec::window for {label}"),
    )
}

/// How running aggregate `j` folds row `row` into `acc{j}` (setting `seen{j}`), or None when
/// it folds nothing (an aggregate other than COUNT without an argument).
fn fold_row(j: usize, r: &Running, row: &str) -> Option<String> {
    let c = r.out_ty.c_type();
    let load = |a: usize| format!("((const {t}*)rd{a})[{row}]", t = r.arg_ty.c_type());
    let update = match (r.kind, r.arg) {
        (RunningKind::Count, None) => format!("acc{j} += 1; seen{j} = true;"),
        (_, None) => return None,
        (RunningKind::Count, Some(_)) => format!("acc{j} += 1; seen{j} = true;"),
        (RunningKind::SumInt, Some(a)) => format!(
            "acc{j} = (i64)((u64)acc{j} + (u64)(i64){}); seen{j} = true;",
            load(a)
        ),
        (RunningKind::SumDec, Some(a)) => format!(
            "acc{j} = spate::wrapping_add<i128>(acc{j}, (i128){}); seen{j} = true;",
            load(a)
        ),
        (RunningKind::SumF64, Some(a)) => format!(
            "acc{j} = spate::float_add<f64>(acc{j}, (f64){}); seen{j} = true;",
            load(a)
        ),
        (RunningKind::Min, Some(a)) => format!(
            "{{ const {c} v = {}; if (!seen{j} || v < acc{j}) acc{j} = v; seen{j} = true; }}",
            load(a)
        ),
        (RunningKind::Max, Some(a)) => format!(
            "{{ const {c} v = {}; if (!seen{j} || v > acc{j}) acc{j} = v; seen{j} = true; }}",
            load(a)
        ),
    };
    Some(match r.arg {
        Some(a) => format!("if (spate::row_is_valid(rv{a}, ro{a}, {row})) {{ {update} }}"),
        None => update,
    })
}

/// Writes aggregate `j`'s value for row `row`: COUNT is never NULL, the others are until a
/// value arrives.
fn write_row(j: usize, r: &Running, row: &str) -> String {
    let valid = if r.kind == RunningKind::Count {
        "true".to_string()
    } else {
        format!("seen{j}")
    };
    format!(
        "out{j}[{row}] = acc{j}; if ({valid}) atomicOr(&valid{j}[{row} / 32ull], 1u << ({row} % 32ull));"
    )
}

/// The `sliding` kernel (see the module docs).
fn sliding_kernel(running: &[Running], args: usize) -> String {
    let mut params = column_params("r", args);
    params.push_str("const u32* pstart, const u32* pid, u64 n");
    let mut body = String::new();
    for (j, r) in running.iter().enumerate() {
        let c = r.out_ty.c_type();
        let _ = write!(params, ", {c}* out{j}, u32* valid{j}");
        let (true, Some(k)) = (r.per_row(), r.preceding) else {
            continue;
        };
        let fold = fold_row(j, r, "w").unwrap_or_default();
        let _ = write!(
            body,
            r#"        {{
            {c} acc{j} = ({c})0;
            bool seen{j} = false;
            const u64 lo = i - s > {k}ull ? i - {k}ull : s;
            for (u64 w = lo; w <= i; ++w) {{
                {fold}
            }}
            {write}
        }}
"#,
            write = write_row(j, r, "i")
        );
    }
    format!(
        r#"extern "C" __global__ void __launch_bounds__(SPATE_BLOCK_THREADS) ENTRY_sliding({params}) {{
    for (u64 i = spate::global_thread_index(); i < n; i += spate::grid_stride()) {{
        const u64 s = pstart[pid[i]];
{body}    }}
}}
SPATE_EXPORT(ENTRY_sliding)

"#
    )
}

/// The `running` kernel (see the module docs): the aggregates from the partition's first row.
fn running_kernel(running: &[Running], args: usize) -> String {
    let mut params = column_params("r", args);
    params.push_str("const u32* pstart, u64 partitions, const u32* nq, u64 n");
    let (mut state, mut fold, mut rows_write, mut range_write) =
        (String::new(), String::new(), String::new(), String::new());
    for (j, r) in running.iter().enumerate() {
        let c = r.out_ty.c_type();
        let _ = write!(params, ", {c}* out{j}, u32* valid{j}");
        if r.per_row() {
            continue;
        }
        let Some(update) = fold_row(j, r, "i") else {
            continue;
        };
        let _ = writeln!(
            state,
            "        {c} acc{j} = ({c})0;\n        bool seen{j} = false;"
        );
        let _ = writeln!(fold, "            {update}");
        if let (Some(k), Some(a)) = (r.preceding, r.arg) {
            // A sliding float sum: the values in the frame are counted, and the row leaving
            // it is subtracted after the entering one is added.
            let _ = writeln!(state, "        u64 held{j} = 0ull;");
            let _ = writeln!(
                fold,
                "            if (spate::row_is_valid(rv{a}, ro{a}, i)) held{j} += 1ull;\n            \
                 if (i - s > {k}ull) {{ const u64 o = i - {k}ull - 1ull; \
                 if (spate::row_is_valid(rv{a}, ro{a}, o)) {{ acc{j} = spate::float_sub<f64>(acc{j}, ((const f64*)rd{a})[o]); held{j} -= 1ull; }} }}\n            \
                 seen{j} = held{j} != 0ull;"
            );
        }
        if r.range {
            let _ = writeln!(
                range_write,
                "                for (u64 k = run; k <= i; ++k) {{ {} }}",
                write_row(j, r, "k")
            );
        } else {
            let _ = writeln!(rows_write, "            {}", write_row(j, r, "i"));
        }
    }
    format!(
        r#"extern "C" __global__ void __launch_bounds__(SPATE_BLOCK_THREADS) ENTRY_running({params}) {{
    for (u64 p = spate::global_thread_index(); p < partitions; p += spate::grid_stride()) {{
        const u64 s = pstart[p];
        const u64 e = p + 1ull < partitions ? (u64)pstart[p + 1ull] : n;
{state}        u64 run = s;
        for (u64 i = s; i < e; ++i) {{
{fold}{rows_write}            if (i + 1ull == e || nq[i + 1ull] != 0u) {{
{range_write}                run = i + 1ull;
            }}
        }}
    }}
}}
SPATE_EXPORT(ENTRY_running)

"#
    )
}
