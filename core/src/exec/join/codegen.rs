//! CUDA source for one GPU hash join, generated from the join keys' device types.
//!
//! Kernels (columns take the five-parameter layout of `crate::expr::abi`; `k` columns
//! are the build side's keys, `p` columns the probe side's):
//! - `hash`, `build`, `flags`, `assign`: the build side's table and its groups of equal keys,
//!   the shared hash table's (see `exec::hash_table`).
//! - `bcount(const u32* gid, const u32* live, u64 n, u32* sizes, u32* largest)`: rows per
//!   group, and the largest group's size (`largest` starts at 0; null: not wanted). `live`
//!   (here and below) is the build side's device row count, or null for `n` rows.
//! - `bscatter(const u32* gid, const u32* live, u64 n, const u32* group_start, u32* fill,
//!   u32* rows_by_group)`: the build rows listed group by group (CSR), `group_start` being the
//!   scan of `sizes`.
//! - `probe(p…, k…, const u32* live, u64 n, const u64* bhashes, const u32* table, u64 mask,
//!   const u32* group_of_slot, const u32* sizes, u32 null_equal, u32 outer, u32* pgroup,
//!   u64* counts, u32* matched)`: per probe row, the build group with equal keys (or `NONE`),
//!   and how many output rows it makes (`outer`: at least one). A probe row with a NULL key
//!   matches nothing unless `null_equal`. Marks `matched[group]` when `matched` is not null.
//!   Rows at or past the probe batch's device count (`live`, when not null) are not rows:
//!   `NONE` and no output, whatever `outer` says.
//! - `pairs(const u32* pgroup, const u64* offsets, u64 n, u64 first, u64 count,
//!   const u32* group_start, const u32* rows_by_group, u32* out_probe, u32* out_build)`: the
//!   (probe row, build row) pairs `first..first + count` (one chunk of the output), `offsets`
//!   being the exclusive scan of `counts`. One thread per output pair finds
//!   its probe row by binary search over `offsets`, so a key with millions of matches spreads
//!   over the whole grid instead of one thread (load-balanced expansion, as in ModernGPU's
//!   "load-balancing search"). An unmatched probe row of an outer join (a count of one)
//!   pairs with `SPATE_NULL_INDEX`.
//! - `dpairs(const u32* pgroup, const u64* offsets, u64 n, const u64* total, u64 bound,
//!   const u32* group_start, const u32* rows_by_group, u32* out_probe, u32* out_build,
//!   u32* count)`: `pairs` for a probe of unique probe keys, whose pairs cannot outnumber the
//!   build rows: all of them, `*total` (the scan's total, on the device) but at most `bound`,
//!   their count written to `count` for the output's device row count.
//! - `ubuild(const u32* probe_rows, const u32* live, u64 n, const u32* pgroup,
//!   const u32* group_start, const u32* rows_by_group, u32* out_build)`: for a build side whose
//!   groups are single rows, the build row of each matched probe row in `probe_rows` (the first
//!   `*live` of `n`; the rest are not written).
//! - `cuts(const u64* offsets, u64 row_lo, u64 row_hi, u64 pairs_hi, u64 pairs_lo, u64 step,
//!   u64 cuts, u64* out)`: where chunks of about `step` pairs start, at whole probe rows:
//!   for cut `c`, the first row whose pairs start at or after `pairs_lo + (c + 1) * step`,
//!   and the pair it starts at.
//! - `shift(u32* rows, u64 n, u32 by)`: adds `by` to every row index.
//! - `pmask(const u32* pgroup, u64 n, u32 want_match, u8* mask)` and `bmask(const u32* gid,
//!   const u32* live, u64 n, const u32* matched, u32 want_match, u8* mask)`: probe or build
//!   rows that did (or did not) match, for semi and anti joins and the unmatched rows of outer
//!   joins (rows past `live` are not selected).
//! - With a residual join filter, matches are decided per row pair: `mark(const u32* rows,
//!   const u8* keep, u64 total, u32* flags)` flags the rows of the pairs the filter kept, and
//!   `fmask(const u32* flags, const u32* live, u64 n, u32 want, u8* mask)` selects the rows
//!   flagged (or not), up to `live`.
//! - Mark joins: `iota(u32* rows, u64 n, u32 from)` lists rows `from..from + n`, and
//!   `bits(const u8* mask, u64 n, u32* words)` packs a byte mask into an Arrow bitmap (the
//!   `mark` column), one 32-bit word per thread.

use std::fmt::Write as _;

use crate::exec::hash_table::codegen::{
    NUMBERING, finish_program, hash_and_build, key_equal, key_hash,
};
use crate::expr::{DevType, column_params};

/// The generated program: its source and `(kernel, entry point)` pairs.
#[derive(Debug, Clone)]
pub(super) struct JoinProgram {
    pub(super) source: String,
    pub(super) entries: Vec<(String, String)>,
}

const FIXED: &str = r#"#define SPATE_JOIN_NONE 0xFFFFFFFFu

extern "C" __global__ void __launch_bounds__(SPATE_BLOCK_THREADS) ENTRY_bcount(const u32* gid, const u32* live, u64 n, u32* sizes, u32* largest) {
    const u64 m = spate::live_rows(live, n);
    for (u64 i = spate::global_thread_index(); i < m; i += spate::grid_stride()) {
        const u32 size = atomicAdd(&sizes[gid[i]], 1u) + 1u;
        // Sizes only grow, so the last add to a group raises `largest` to its size.
        if (largest != nullptr) atomicMax(largest, size);
    }
}
SPATE_EXPORT(ENTRY_bcount)

extern "C" __global__ void __launch_bounds__(SPATE_BLOCK_THREADS) ENTRY_bscatter(const u32* gid, const u32* live, u64 n, const u32* group_start, u32* fill, u32* rows_by_group) {
    const u64 m = spate::live_rows(live, n);
    for (u64 i = spate::global_thread_index(); i < m; i += spate::grid_stride()) {
        const u32 g = gid[i];
        rows_by_group[group_start[g] + atomicAdd(&fill[g], 1u)] = (u32)i;
    }
}
SPATE_EXPORT(ENTRY_bscatter)

extern "C" __global__ void __launch_bounds__(SPATE_BLOCK_THREADS) ENTRY_pairs(const u32* pgroup, const u64* offsets, u64 n, u64 first, u64 count, const u32* group_start, const u32* rows_by_group, u32* out_probe, u32* out_build) {
    for (u64 j = spate::global_thread_index(); j < count; j += spate::grid_stride()) {
        const u64 o = first + j;
        // The probe row whose output range holds `o`: the last row with offsets[row] <= o
        // (rows that make no output share their successor's offset and are skipped).
        u64 lo = 0ull, hi = n;
        while (hi - lo > 1ull) {
            const u64 mid = lo + (hi - lo) / 2ull;
            if (offsets[mid] <= o) lo = mid; else hi = mid;
        }
        const u32 g = pgroup[lo];
        out_probe[j] = (u32)lo;
        out_build[j] = g == SPATE_JOIN_NONE ? SPATE_NULL_INDEX : rows_by_group[group_start[g] + (u32)(o - offsets[lo])];
    }
}
SPATE_EXPORT(ENTRY_pairs)

extern "C" __global__ void __launch_bounds__(SPATE_BLOCK_THREADS) ENTRY_dpairs(const u32* pgroup, const u64* offsets, u64 n, const u64* total, u64 bound, const u32* group_start, const u32* rows_by_group, u32* out_probe, u32* out_build, u32* count) {
    const u64 m = *total < bound ? *total : bound;
    if (spate::global_thread_index() == 0ull) *count = (u32)m;
    for (u64 o = spate::global_thread_index(); o < m; o += spate::grid_stride()) {
        u64 lo = 0ull, hi = n;
        while (hi - lo > 1ull) {
            const u64 mid = lo + (hi - lo) / 2ull;
            if (offsets[mid] <= o) lo = mid; else hi = mid;
        }
        out_probe[o] = (u32)lo;
        out_build[o] = rows_by_group[group_start[pgroup[lo]] + (u32)(o - offsets[lo])];
    }
}
SPATE_EXPORT(ENTRY_dpairs)

extern "C" __global__ void __launch_bounds__(SPATE_BLOCK_THREADS) ENTRY_ubuild(const u32* probe_rows, const u32* live, u64 n, const u32* pgroup, const u32* group_start, const u32* rows_by_group, u32* out_build) {
    const u64 m = spate::live_rows(live, n);
    for (u64 j = spate::global_thread_index(); j < m; j += spate::grid_stride())
        out_build[j] = rows_by_group[group_start[pgroup[probe_rows[j]]]];
}
SPATE_EXPORT(ENTRY_ubuild)

extern "C" __global__ void __launch_bounds__(SPATE_BLOCK_THREADS) ENTRY_cuts(const u64* offsets, u64 row_lo, u64 row_hi, u64 pairs_hi, u64 pairs_lo, u64 step, u64 cuts, u64* out) {
    for (u64 c = spate::global_thread_index(); c < cuts; c += spate::grid_stride()) {
        // The first probe row in [row_lo, row_hi) whose pairs start at or after the target.
        const u64 target = pairs_lo + (c + 1ull) * step;
        u64 lo = row_lo, hi = row_hi;
        while (lo < hi) {
            const u64 mid = lo + (hi - lo) / 2ull;
            if (offsets[mid] < target) lo = mid + 1ull; else hi = mid;
        }
        out[2ull * c] = lo;
        out[2ull * c + 1ull] = lo < row_hi ? offsets[lo] : pairs_hi;
    }
}
SPATE_EXPORT(ENTRY_cuts)

extern "C" __global__ void __launch_bounds__(SPATE_BLOCK_THREADS) ENTRY_shift(u32* rows, u64 n, u32 by) {
    for (u64 i = spate::global_thread_index(); i < n; i += spate::grid_stride()) rows[i] += by;
}
SPATE_EXPORT(ENTRY_shift)

extern "C" __global__ void __launch_bounds__(SPATE_BLOCK_THREADS) ENTRY_pmask(const u32* pgroup, u64 n, u32 want_match, u8* mask) {
    for (u64 i = spate::global_thread_index(); i < n; i += spate::grid_stride())
        mask[i] = ((pgroup[i] != SPATE_JOIN_NONE) == (want_match != 0u)) ? 1 : 0;
}
SPATE_EXPORT(ENTRY_pmask)

extern "C" __global__ void __launch_bounds__(SPATE_BLOCK_THREADS) ENTRY_mark(const u32* rows, const u8* keep, u64 total, u32* flags) {
    for (u64 p = spate::global_thread_index(); p < total; p += spate::grid_stride())
        if (keep[p] != 0 && rows[p] != SPATE_NULL_INDEX) flags[rows[p]] = 1u;
}
SPATE_EXPORT(ENTRY_mark)

extern "C" __global__ void __launch_bounds__(SPATE_BLOCK_THREADS) ENTRY_fmask(const u32* flags, const u32* live, u64 n, u32 want, u8* mask) {
    const u64 m = spate::live_rows(live, n);
    for (u64 i = spate::global_thread_index(); i < n; i += spate::grid_stride())
        mask[i] = (i < m && (flags[i] != 0u) == (want != 0u)) ? 1 : 0;
}
SPATE_EXPORT(ENTRY_fmask)

extern "C" __global__ void __launch_bounds__(SPATE_BLOCK_THREADS) ENTRY_bmask(const u32* gid, const u32* live, u64 n, const u32* matched, u32 want_match, u8* mask) {
    const u64 m = spate::live_rows(live, n);
    for (u64 i = spate::global_thread_index(); i < n; i += spate::grid_stride())
        mask[i] = (i < m && (matched[gid[i]] != 0u) == (want_match != 0u)) ? 1 : 0;
}
SPATE_EXPORT(ENTRY_bmask)

extern "C" __global__ void __launch_bounds__(SPATE_BLOCK_THREADS) ENTRY_iota(u32* rows, u64 n, u32 from) {
    for (u64 i = spate::global_thread_index(); i < n; i += spate::grid_stride()) rows[i] = from + (u32)i;
}
SPATE_EXPORT(ENTRY_iota)

extern "C" __global__ void __launch_bounds__(SPATE_BLOCK_THREADS) ENTRY_bits(const u8* mask, u64 n, u32* words) {
    const u64 count = (n + 31ull) / 32ull;
    for (u64 w = spate::global_thread_index(); w < count; w += spate::grid_stride()) {
        u32 word = 0u;
        for (u32 j = 0u; j < 32u; ++j) {
            const u64 i = w * 32ull + j;
            if (i < n && mask[i] != 0) word |= 1u << j;
        }
        words[w] = word;
    }
}
SPATE_EXPORT(ENTRY_bits)

"#;

/// Generates the join program for keys of `keys` (the same device types on both sides).
pub(super) fn generate(keys: &[DevType], label: &str) -> JoinProgram {
    let mut body = hash_and_build(keys, "hash", "build");
    body.push_str(NUMBERING);
    body.push_str(FIXED);
    let pparams = column_params("p", keys.len());
    let kparams = column_params("k", keys.len());
    let mut any_null = String::from("        bool any_null = false;\n");
    let mut hash = String::from("            u64 h = 0ull;\n");
    let mut equal = String::new();
    for (k, ty) in keys.iter().enumerate() {
        let _ = writeln!(
            any_null,
            "        any_null = any_null || !spate::row_is_valid(pv{k}, po{k}, i);"
        );
        let _ = writeln!(
            hash,
            "            h = spate::hash_combine(h, {});",
            key_hash("p", k, *ty)
        );
        equal.push_str(&key_equal("k", "p", k, *ty));
    }
    let _ = write!(
        body,
        r#"extern "C" __global__ void __launch_bounds__(SPATE_BLOCK_THREADS) ENTRY_probe({pparams}{kparams}const u32* live, u64 n, const u64* bhashes, const u32* table, u64 mask, const u32* group_of_slot, const u32* sizes, u32 null_equal, u32 outer, u32* pgroup, u64* counts, u32* matched) {{
    const u64 m = spate::live_rows(live, n);
    for (u64 i = spate::global_thread_index(); i < n; i += spate::grid_stride()) {{
        if (i >= m) {{
            // Past the batch's device row count: not a row, so no match and no output.
            pgroup[i] = SPATE_JOIN_NONE;
            counts[i] = 0ull;
            continue;
        }}
{any_null}        u32 g = SPATE_JOIN_NONE;
        if (null_equal != 0u || !any_null) {{
{hash}            u64 s = h & mask;
            for (;;) {{
                const u32 cur = table[s];
                if (cur == 0u) break;
                const u64 a = (u64)(cur - 1u);
                const u64 b = i;
                bool eq = bhashes[a] == h;
{equal}                if (eq) {{
                    g = group_of_slot[s];
                    break;
                }}
                s = (s + 1ull) & mask;
            }}
        }}
        pgroup[i] = g;
        const u64 size = g == SPATE_JOIN_NONE ? 0ull : (u64)sizes[g];
        if (matched != nullptr && g != SPATE_JOIN_NONE) matched[g] = 1u;
        counts[i] = (outer != 0u && size == 0ull) ? 1ull : size;
    }}
}}
SPATE_EXPORT(ENTRY_probe)
"#
    );
    let names: Vec<String> = [
        "hash", "build", "flags", "assign", "bcount", "bscatter", "probe", "pairs", "dpairs",
        "ubuild", "cuts", "shift", "pmask", "bmask", "mark", "fmask", "iota", "bits",
    ]
    .iter()
    .map(|n| n.to_string())
    .collect();
    let (source, entries) = finish_program(
        &body,
        &names,
        "join",
        &format!("spate::exec::join for {label}"),
    );
    JoinProgram { source, entries }
}
