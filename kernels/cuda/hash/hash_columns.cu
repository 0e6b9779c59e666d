// hash_columns.cu: 64-bit row hashes over one or more columns.
//
// Call once per key column, left to right: the first call starts from `seed`, later calls pass
// the previous call's output as `in_hashes` (it may alias `out_hashes`). common/hash.cuh
// defines the hash; a NULL hashes to SPATE_NULL_HASH, so NULL keys group together.
#include "common/prelude.cuh"
#include "common/bitmap.cuh"
#include "common/hash.cuh"

namespace spate {

__device__ __forceinline__ u64 hash_value(u8 v) { return xxh64_word(v, 1); }
__device__ __forceinline__ u64 hash_value(u16 v) { return xxh64_word(v, 2); }
__device__ __forceinline__ u64 hash_value(u32 v) { return xxh64_word(v, 4); }
__device__ __forceinline__ u64 hash_value(u64 v) { return xxh64_word(v, 8); }
__device__ __forceinline__ u64 hash_value(u128 v) { return xxh64_u128(v); }

// Floats as equality folds them: -0.0 hashes as +0.0 (NaNs by their bits).
__device__ __forceinline__ u64 hash_folded(u32 bits) { return xxh64_word(bits == 0x80000000u ? 0u : bits, 4); }
__device__ __forceinline__ u64 hash_folded(u64 bits) {
    return xxh64_word(bits == 0x8000000000000000ull ? 0ull : bits, 8);
}

// Folds each row's hash into the running hashes: `value(i)` for a valid row, SPATE_NULL_HASH
// for a NULL. Every column kind below differs only in its `value`.
template <typename Value>
__device__ void fold_hashes(Value value, const u8* __restrict__ validity, u64 validity_offset, u64 n,
                            const u64* in_hashes, u64 seed, u64* out_hashes) {
    for (u64 i = global_thread_index(); i < n; i += grid_stride()) {
        u64 h = row_is_valid(validity, validity_offset, i) ? value(i) : SPATE_NULL_HASH;
        u64 prev = in_hashes != nullptr ? in_hashes[i] : seed;
        out_hashes[i] = hash_combine(prev, h);
    }
}

}  // namespace spate

/**
 * @brief Hashes a fixed-width column into the running row hashes.
 *
 * @param values           `n` values (by element width: u8, u16, u32, u64, u128)
 * @param validity         validity bitmap, or null when no value is null
 * @param validity_offset  bit offset into `validity`
 * @param n                number of rows
 * @param in_hashes        running hashes from the previous column, or null to start at `seed`
 * @param seed             starting hash for the first column
 * @param out_hashes       `n` outputs (may alias `in_hashes`)
 *
 * Launch: SPATE_BLOCK_THREADS threads, grid-stride over `n`, no shared memory.
 * Memory: caller allocates `out_hashes`.
 * Nulls:  a NULL contributes SPATE_NULL_HASH.
 * Stream: asynchronous on the launch stream.
 */
#define SPATE_HASH_FIXED(T)                                                                                 \
    extern "C" __global__ void __launch_bounds__(SPATE_BLOCK_THREADS)                                       \
        hash_##T(const T* values, const u8* validity, u64 validity_offset, u64 n, const u64* in_hashes,      \
                 u64 seed, u64* out_hashes) {                                                               \
        spate::fold_hashes([&](u64 i) { return spate::hash_value(values[i]); }, validity, validity_offset, n,   \
                           in_hashes, seed, out_hashes);                                                    \
    }                                                                                                       \
    SPATE_EXPORT(hash_##T)

SPATE_HASH_FIXED(u8)
SPATE_HASH_FIXED(u16)
SPATE_HASH_FIXED(u32)
SPATE_HASH_FIXED(u64)
SPATE_HASH_FIXED(u128)

/**
 * @brief Hashes a string column (Arrow offsets + bytes) into the running row hashes.
 *
 * @param offsets  `n + 1` offsets into `bytes` (i32 for Utf8, i64 for LargeUtf8)
 * @param bytes    the UTF-8 data
 *
 * Other parameters, Launch, Memory, Nulls and Stream as hash_T; one thread hashes one string.
 */
#define SPATE_HASH_STRINGS(Off)                                                                             \
    extern "C" __global__ void __launch_bounds__(SPATE_BLOCK_THREADS)                                       \
        hash_strings_##Off(const Off* offsets, const u8* bytes, const u8* validity, u64 validity_offset,     \
                           u64 n, const u64* in_hashes, u64 seed, u64* out_hashes) {                        \
        auto value = [&](u64 i) {                                                                           \
            u64 start = (u64)offsets[i];                                                                    \
            return spate::xxh64_bytes(bytes + start, (u64)offsets[i + 1] - start);                         \
        };                                                                                                  \
        spate::fold_hashes(value, validity, validity_offset, n, in_hashes, seed, out_hashes);               \
    }                                                                                                       \
    SPATE_EXPORT(hash_strings_##Off)

SPATE_HASH_STRINGS(i32)
SPATE_HASH_STRINGS(i64)

/**
 * @brief Hashes a float column (f32 or f64, by its bits) into the running row hashes, -0.0 as
 *        +0.0: for partitions that must agree with a hash table that folds them (joins and
 *        aggregations spilled to the host).
 *
 * Parameters, Launch, Memory, Nulls and Stream as hash_T.
 */
#define SPATE_HASH_FLOATS(Name, Bits)                                                                        \
    extern "C" __global__ void __launch_bounds__(SPATE_BLOCK_THREADS)                                       \
        hash_##Name##_folded(const Bits* values, const u8* validity, u64 validity_offset, u64 n,           \
                             const u64* in_hashes, u64 seed, u64* out_hashes) {                             \
        spate::fold_hashes([&](u64 i) { return spate::hash_folded(values[i]); }, validity, validity_offset, n,  \
                           in_hashes, seed, out_hashes);                                                    \
    }                                                                                                       \
    SPATE_EXPORT(hash_##Name##_folded)

SPATE_HASH_FLOATS(f32, u32)
SPATE_HASH_FLOATS(f64, u64)

/**
 * @brief Hashes a boolean column (an Arrow bitmap from bit `bit_offset`) into the running row
 *        hashes: each value as the byte 0 or 1.
 *
 * @param bits        the values' bitmap
 * @param bit_offset  bit index of row 0 in `bits`
 *
 * Other parameters, Launch, Memory, Nulls and Stream as hash_T.
 */
extern "C" __global__ void __launch_bounds__(SPATE_BLOCK_THREADS)
    hash_bits(const u8* bits, u64 bit_offset, const u8* validity, u64 validity_offset, u64 n, const u64* in_hashes,
              u64 seed, u64* out_hashes) {
    auto value = [&](u64 i) { return spate::xxh64_word(spate::bit_is_set(bits, bit_offset, i) ? 1 : 0, 1); };
    spate::fold_hashes(value, validity, validity_offset, n, in_hashes, seed, out_hashes);
}
SPATE_EXPORT(hash_bits)
