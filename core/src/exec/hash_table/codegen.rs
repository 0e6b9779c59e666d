//! CUDA source for the hash table aggregation and joins share (see [`super`]): key hashes and
//! key equality per device type, the `hash` and `build` kernels, group numbering, and the
//! naming of a generated program's kernels.

use std::fmt::Write as _;

use crate::expr::{DevType, blake3_hex, column_params};

/// The includes every program with a hash table starts with.
pub(crate) const PREAMBLE: &str = r#"#include "common/prelude.cuh"
#include "common/bitmap.cuh"
#include "common/hash.cuh"
#include "common/order.cuh"
#include "common/strings.cuh"
"#;

/// The unsigned type of a key's width, which its bits are compared as.
fn unsigned_of_width(ty: DevType) -> &'static str {
    match ty {
        DevType::Int { bits: 8, .. } => "u8",
        DevType::Int { bits: 16, .. } => "u16",
        DevType::Int { bits: 32, .. } | DevType::F32 => "u32",
        _ => "u64",
    }
}

/// A fixed-width key's width in bytes.
fn width_bytes(ty: DevType) -> u32 {
    match ty {
        DevType::Int { bits, .. } => u32::from(bits) / 8,
        DevType::F32 => 4,
        _ => 8,
    }
}

/// The hash of key column `k` (parameters prefixed `p`) at row `i`, as an expression.
pub(crate) fn key_hash(p: &str, k: usize, ty: DevType) -> String {
    let value = match ty {
        DevType::Str => format!(
            "spate::xxh64_bytes({p}e{k} + spate::string_offset({p}d{k}, {p}b{k}, i), spate::string_offset({p}d{k}, {p}b{k}, i + 1) - spate::string_offset({p}d{k}, {p}b{k}, i))"
        ),
        DevType::Bool => {
            format!("spate::xxh64_word(spate::bit_is_set({p}d{k}, {p}b{k}, i) ? 1ull : 0ull, 1)")
        }
        DevType::Dec { .. } => format!("spate::xxh64_u128(((const u128*){p}d{k})[i])"),
        DevType::F32 => {
            format!("spate::xxh64_word((u64)spate::key_bits(((const f32*){p}d{k})[i]), 4)")
        }
        DevType::F64 => format!("spate::xxh64_word(spate::key_bits(((const f64*){p}d{k})[i]), 8)"),
        _ => format!(
            "spate::xxh64_word((u64)((const {}){p}d{k})[i], {})",
            format_args!("{}*", unsigned_of_width(ty)),
            width_bytes(ty)
        ),
    };
    format!("(spate::row_is_valid({p}v{k}, {p}o{k}, i) ? {value} : SPATE_NULL_HASH)")
}

/// Code that clears `eq` unless key `k` of row `a` (of the columns prefixed `pa`) equals key
/// `k` of row `b` (prefixed `pb`); NULL equals NULL.
pub(crate) fn key_equal(pa: &str, pb: &str, k: usize, ty: DevType) -> String {
    let cmp = match ty {
        DevType::Str => format!(
            "spate::str_eq({pa}e{k} + spate::string_offset({pa}d{k}, {pa}b{k}, a), spate::string_offset({pa}d{k}, {pa}b{k}, a + 1) - spate::string_offset({pa}d{k}, {pa}b{k}, a), {pb}e{k} + spate::string_offset({pb}d{k}, {pb}b{k}, b), spate::string_offset({pb}d{k}, {pb}b{k}, b + 1) - spate::string_offset({pb}d{k}, {pb}b{k}, b))"
        ),
        DevType::Bool => {
            format!(
                "spate::bit_is_set({pa}d{k}, {pa}b{k}, a) == spate::bit_is_set({pb}d{k}, {pb}b{k}, b)"
            )
        }
        DevType::Dec { .. } => format!(
            "(((const u128*){pa}d{k})[a].lo == ((const u128*){pb}d{k})[b].lo && ((const u128*){pa}d{k})[a].hi == ((const u128*){pb}d{k})[b].hi)"
        ),
        DevType::F32 | DevType::F64 => {
            let c = ty.c_type();
            format!(
                "spate::key_bits(((const {c}*){pa}d{k})[a]) == spate::key_bits(((const {c}*){pb}d{k})[b])"
            )
        }
        _ => {
            let u = unsigned_of_width(ty);
            format!("((const {u}*){pa}d{k})[a] == ((const {u}*){pb}d{k})[b]")
        }
    };
    format!(
        "                if (eq) {{ const bool na = !spate::row_is_valid({pa}v{k}, {pa}o{k}, a); const bool nb = !spate::row_is_valid({pb}v{k}, {pb}o{k}, b); eq = na == nb && (na || {cmp}); }}\n"
    )
}

/// `flags` and `assign` (see the module docs): numbering the occupied slots of a table built
/// by `build`.
pub(crate) const NUMBERING: &str = r#"extern "C" __global__ void __launch_bounds__(SPATE_BLOCK_THREADS) ENTRY_flags(const u32* table, u64 cap, u32* flags) {
    for (u64 s = spate::global_thread_index(); s < cap; s += spate::grid_stride()) flags[s] = table[s] != 0u ? 1u : 0u;
}
SPATE_EXPORT(ENTRY_flags)

extern "C" __global__ void __launch_bounds__(SPATE_BLOCK_THREADS) ENTRY_assign(const u32* table, const u32* group_of_slot, u64 cap, const u32* slot_of_row, const u32* live, u64 n, u32* gid, u32* reps) {
    const u64 m = spate::live_rows(live, n);
    for (u64 i = spate::global_thread_index(); i < m; i += spate::grid_stride()) gid[i] = group_of_slot[slot_of_row[i]];
    for (u64 s = spate::global_thread_index(); s < cap; s += spate::grid_stride()) {
        const u32 row = table[s];
        if (row != 0u) reps[group_of_slot[s]] = row - 1u;
    }
}
SPATE_EXPORT(ENTRY_assign)

"#;

/// The `hash` and `build` kernels (named `hash_name`, `build_name`) for rows keyed by columns
/// of `keys`, passed as `k<i>` columns.
pub(crate) fn hash_and_build(keys: &[DevType], hash_name: &str, build_name: &str) -> String {
    let params = column_params("k", keys.len());
    let mut hash = String::from("        u64 h = 0ull;\n");
    for (k, ty) in keys.iter().enumerate() {
        let _ = writeln!(
            hash,
            "        h = spate::hash_combine(h, {});",
            key_hash("k", k, *ty)
        );
    }
    let equal: String = keys
        .iter()
        .enumerate()
        .map(|(k, ty)| key_equal("k", "k", k, *ty))
        .collect();
    format!(
        r#"extern "C" __global__ void __launch_bounds__(SPATE_BLOCK_THREADS) ENTRY_{hash_name}({params}const u32* live, u64 n, u64* hashes) {{
    const u64 m = spate::live_rows(live, n);
    for (u64 i = spate::global_thread_index(); i < m; i += spate::grid_stride()) {{
{hash}        hashes[i] = h;
    }}
}}
SPATE_EXPORT(ENTRY_{hash_name})

extern "C" __global__ void __launch_bounds__(SPATE_BLOCK_THREADS) ENTRY_{build_name}({params}const u32* live, u64 n, const u64* hashes, u32* table, u64 mask, u32* slot_of_row) {{
    const u64 m = spate::live_rows(live, n);
    for (u64 i = spate::global_thread_index(); i < m; i += spate::grid_stride()) {{
        const u64 h = hashes[i];
        u64 s = h & mask;
        for (;;) {{
            u32 cur = *(volatile u32*)&table[s];
            if (cur == 0u) {{
                cur = atomicCAS(&table[s], 0u, (u32)(i + 1));
                if (cur == 0u) break;
            }}
            const u64 a = (u64)(cur - 1u);
            const u64 b = i;
            bool eq = hashes[a] == h;
{equal}            if (eq) break;
            s = (s + 1ull) & mask;
        }}
        slot_of_row[i] = (u32)s;
    }}
}}
SPATE_EXPORT(ENTRY_{build_name})

"#
    )
}

/// Names a generated program's kernels: each `ENTRY_<name>` in `body` becomes
/// `spate_<family>_<name>_<hash of the body>`. Returns the full source (with the preamble and
/// a comment naming `origin`) and the `(name, entry point)` pairs.
pub(crate) fn finish_program(
    body: &str,
    names: &[String],
    family: &str,
    origin: &str,
) -> (String, Vec<(String, String)>) {
    let tag = blake3_hex(body);
    let entries: Vec<(String, String)> = names
        .iter()
        .map(|n| (n.clone(), format!("spate_{family}_{n}_{tag}")))
        .collect();
    // Longest names first, so that no name is replaced inside a longer one.
    let mut by_length: Vec<&(String, String)> = entries.iter().collect();
    by_length.sort_by_key(|(n, _)| std::cmp::Reverse(n.len()));
    let mut text = body.to_string();
    for (n, entry) in by_length {
        text = text.replace(&format!("ENTRY_{n}("), &format!("{entry}("));
        text = text.replace(&format!("ENTRY_{n})"), &format!("{entry})"));
    }
    let source = format!(
        "// Generated by {}.\n{PREAMBLE}\n{text}",
        origin.replace('\n', " ")
    );
    (source, entries)
}
