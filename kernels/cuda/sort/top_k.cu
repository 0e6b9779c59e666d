// top_k.cu: a radix select over sort keys, so that `ORDER BY ... LIMIT k` sorts only the rows
// that can be among the first k, not every row.
//
// The keys are a sort's radix keys (kernels/cuda/sort/radix_sort.cu: unsigned order is the SQL
// order, descending already folded in). A NULL row's key counts as the smallest key when NULLs
// sort first and as the largest when they sort last, so the mapped keys never order two rows
// against the sort: ties are kept, and the sort of the candidates settles them. The host walks
// the key's digits from the highest bit where the keys differ, one histogram per digit, until
// the rows whose key is at most a bound hold the first k and are few enough to sort.
#include "common/prelude.cuh"
#include "common/bitmap.cuh"

namespace spate {

// Row i's key, NULLs mapped to the end they sort at.
template <typename K>
__device__ __forceinline__ K top_k_key(const K* keys, const u8* validity, u64 offset, u32 nulls_first, u64 i) {
    if (!row_is_valid(validity, offset, i)) return nulls_first ? (K)0 : (K)~(K)0;
    return keys[i];
}

template <typename K>
__device__ void top_k_range(const K* keys, const u8* validity, u64 offset, u32 nulls_first, u64 n, K* range) {
    K low_inverted = 0, high = 0;
    for (u64 i = global_thread_index(); i < n; i += grid_stride()) {
        const K k = top_k_key<K>(keys, validity, offset, nulls_first, i);
        if ((K)~k > low_inverted) low_inverted = (K)~k;
        if (k > high) high = k;
    }
    // 0 is the identity of both maxima, so threads without rows change nothing.
    atomicMax(&range[0], low_inverted);
    atomicMax(&range[1], high);
}

template <typename K>
__device__ void top_k_histogram(const K* keys, const u8* validity, u64 offset, u32 nulls_first, u64 n, K prefix,
                                u32 shift, u32* hist) {
    __shared__ u32 local[256];
    for (u32 b = threadIdx.x; b < 256; b += blockDim.x) local[b] = 0;
    __syncthreads();
    const u32 above = shift + 8;
    const bool match_prefix = above < (u32)(sizeof(K) * 8);
    for (u64 i = global_thread_index(); i < n; i += grid_stride()) {
        const K k = top_k_key<K>(keys, validity, offset, nulls_first, i);
        if (match_prefix && (k >> above) != (prefix >> above)) continue;
        atomicAdd(&local[(u32)((k >> shift) & 255)], 1u);
    }
    __syncthreads();
    for (u32 b = threadIdx.x; b < 256; b += blockDim.x) {
        if (local[b] != 0) atomicAdd(&hist[b], local[b]);
    }
}

template <typename K>
__device__ void top_k_mask(const K* keys, const u8* validity, u64 offset, u32 nulls_first, u64 n, K bound, u8* mask) {
    for (u64 i = global_thread_index(); i < n; i += grid_stride()) {
        mask[i] = top_k_key<K>(keys, validity, offset, nulls_first, i) <= bound ? 1 : 0;
    }
}

}  // namespace spate

/**
 * @brief The smallest and largest key (NULLs mapped as the sort places them).
 *
 * @param keys         `n` radix keys
 * @param validity     the key column's validity, or null when no row is NULL
 * @param offset       bit offset of row 0 in `validity`
 * @param nulls_first  1 when NULLs sort first (their key is 0), 0 when last (all ones)
 * @param n            rows
 * @param range        two keys: range[0] receives the bitwise complement of the smallest key,
 *                     range[1] the largest; both must start zeroed
 *
 * Launch: SPATE_BLOCK_THREADS threads, grid-stride, no shared memory; two atomics per thread.
 * Memory: caller allocates and zeroes `range`.
 * Nulls:  as above.
 * Stream: asynchronous on the launch stream.
 */
/**
 * @brief Counts the keys that share `prefix` above bit `shift + 8`, by their 8-bit digit at
 *        `shift`.
 *
 * @param keys, validity, offset, nulls_first, n  as for top_k_range
 * @param prefix  the key bits above the digit that every counted key has
 * @param shift   the digit's lowest bit
 * @param hist    256 counts; must start zeroed
 *
 * Launch: SPATE_BLOCK_THREADS threads, grid-stride; a shared 256-bin histogram per block,
 *         added to `hist` once per bin.
 * Memory: caller allocates and zeroes `hist`.
 * Nulls:  as for top_k_range.
 * Stream: asynchronous on the launch stream.
 */
/**
 * @brief mask[i] = 1 when row i's key is at most `bound`, else 0.
 *
 * @param keys, validity, offset, nulls_first, n  as for top_k_range
 * @param bound  the largest key kept
 * @param mask   `n` bytes
 *
 * Launch: SPATE_BLOCK_THREADS threads, grid-stride, no shared memory.
 * Memory: caller allocates `mask`.
 * Nulls:  as for top_k_range.
 * Stream: asynchronous on the launch stream.
 */
#define SPATE_TOP_K(K)                                                                                               \
    extern "C" __global__ void __launch_bounds__(SPATE_BLOCK_THREADS)                                                 \
        top_k_range_##K(const K* keys, const u8* validity, u64 offset, u32 nulls_first, u64 n, K* range) {           \
        spate::top_k_range<K>(keys, validity, offset, nulls_first, n, range);                                         \
    }                                                                                                                 \
    SPATE_EXPORT(top_k_range_##K)                                                                                     \
    extern "C" __global__ void __launch_bounds__(SPATE_BLOCK_THREADS)                                                 \
        top_k_histogram_##K(const K* keys, const u8* validity, u64 offset, u32 nulls_first, u64 n, K prefix,         \
                            u32 shift, u32* hist) {                                                                   \
        spate::top_k_histogram<K>(keys, validity, offset, nulls_first, n, prefix, shift, hist);                       \
    }                                                                                                                 \
    SPATE_EXPORT(top_k_histogram_##K)                                                                                 \
    extern "C" __global__ void __launch_bounds__(SPATE_BLOCK_THREADS)                                                 \
        top_k_mask_##K(const K* keys, const u8* validity, u64 offset, u32 nulls_first, u64 n, K bound, u8* mask) {   \
        spate::top_k_mask<K>(keys, validity, offset, nulls_first, n, bound, mask);                                    \
    }                                                                                                                 \
    SPATE_EXPORT(top_k_mask_##K)

SPATE_TOP_K(u32)
SPATE_TOP_K(u64)

/**
 * @brief A Decimal128 column's select keys: each value clamped to the i64 range, in the radix
 *        order of an i64. Monotone in the value (values past the range tie at its ends), so a
 *        select on them keeps whatever the full 128-bit sort puts first; one u64 key where the
 *        sort's own decimal keys need two words.
 *
 * @param in          `n` 16-byte values (low word first)
 * @param n           number of values
 * @param descending  1 to reverse the order
 * @param out         `n` keys
 *
 * Launch: SPATE_BLOCK_THREADS threads, grid-stride, no shared memory.
 * Memory: caller allocates `out`.
 * Nulls:  not handled here: the select maps NULL rows itself.
 * Stream: asynchronous on the launch stream.
 */
extern "C" __global__ void __launch_bounds__(SPATE_BLOCK_THREADS)
    top_k_decimal_keys(const u128* in, u64 n, u32 descending, u64* out) {
    for (u64 i = spate::global_thread_index(); i < n; i += spate::grid_stride()) {
        const u64 lo = in[i].lo;
        const i64 hi = (i64)in[i].hi;
        const bool fits = (hi == 0 && (lo >> 63) == 0) || (hi == -1 && (lo >> 63) == 1);
        const u64 v = fits ? lo : (hi < 0 ? 0x8000000000000000ull : 0x7FFFFFFFFFFFFFFFull);
        const u64 k = v ^ 0x8000000000000000ull;
        out[i] = descending ? ~k : k;
    }
}
SPATE_EXPORT(top_k_decimal_keys)
