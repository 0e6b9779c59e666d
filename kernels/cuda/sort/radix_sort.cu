// radix_sort.cu: stable LSD radix sort of (key, row index) pairs, 8 bits per pass.
//
// One pass over digit `shift`: `radix_histogram_*` counts each tile's digits into a digit-major
// table (hist[digit * num_tiles + tile]); an exclusive scan of that table gives, for every
// (digit, tile), where its first key goes; `radix_scatter_*` then moves each tile's keys there,
// ranking equal digits in input order, so every pass (and thus the sort) is stable.
// Key transforms map signed, floating and descending keys onto unsigned keys whose unsigned
// order is the wanted order.
#include "common/prelude.cuh"
#include "common/bitmap.cuh"
#include "common/block_scan.cuh"

#define SPATE_RADIX_BITS 8
#define SPATE_RADIX_DIGITS 256

namespace spate {

template <typename K>
__device__ void radix_histogram(const K* __restrict__ keys, u64 n, u32 shift, u32 num_tiles, u32* __restrict__ hist) {
    __shared__ u32 counts[SPATE_RADIX_DIGITS];
    for (u32 d = threadIdx.x; d < SPATE_RADIX_DIGITS; d += SPATE_BLOCK_THREADS) counts[d] = 0;
    __syncthreads();
    u64 tile_start = (u64)blockIdx.x * SPATE_TILE;
#pragma unroll
    for (u32 k = 0; k < SPATE_ITEMS_PER_THREAD; ++k) {
        u64 i = tile_start + (u64)k * SPATE_BLOCK_THREADS + threadIdx.x;
        if (i < n) atomicAdd(&counts[(u32)(keys[i] >> shift) & (SPATE_RADIX_DIGITS - 1)], 1u);
    }
    __syncthreads();
    for (u32 d = threadIdx.x; d < SPATE_RADIX_DIGITS; d += SPATE_BLOCK_THREADS) hist[(u64)d * num_tiles + blockIdx.x] = counts[d];
}

// Scatters one tile. The tile is processed in SPATE_ITEMS_PER_THREAD chunks of one key per
// thread, in order. Within a chunk, lanes with the same digit find each other with ballots
// (a warp multi-split), warps take consecutive ranges per digit, and chunks follow each other,
// which together keep equal digits in input order.
template <typename K>
__device__ void radix_scatter(const K* __restrict__ keys_in, const u32* __restrict__ values_in, u64 n, u32 shift, u32 num_tiles,
                              const u32* __restrict__ offsets, K* __restrict__ keys_out, u32* __restrict__ values_out) {
    __shared__ u32 digit_base[SPATE_RADIX_DIGITS];
    __shared__ u32 warp_counts[SPATE_WARPS_PER_BLOCK][SPATE_RADIX_DIGITS];
    for (u32 d = threadIdx.x; d < SPATE_RADIX_DIGITS; d += SPATE_BLOCK_THREADS)
        digit_base[d] = offsets[(u64)d * num_tiles + blockIdx.x];
    const u32 lane = lane_id();
    const u32 warp = warp_id();
    const u32 lanes_below = (1u << lane) - 1u;
    u64 tile_start = (u64)blockIdx.x * SPATE_TILE;
    for (u32 chunk = 0; chunk < SPATE_ITEMS_PER_THREAD; ++chunk) {
        for (u32 d = threadIdx.x; d < SPATE_WARPS_PER_BLOCK * SPATE_RADIX_DIGITS; d += SPATE_BLOCK_THREADS)
            (&warp_counts[0][0])[d] = 0;
        __syncthreads();
        u64 i = tile_start + (u64)chunk * SPATE_BLOCK_THREADS + threadIdx.x;
        bool live = i < n;
        K key = live ? keys_in[i] : K(0);
        u32 digit = (u32)(key >> shift) & (SPATE_RADIX_DIGITS - 1);
        // Lanes whose digit equals this lane's digit: intersect, bit by bit, the lanes that agree.
        u32 peers = __ballot_sync(SPATE_FULL_MASK, live);
#pragma unroll
        for (u32 b = 0; b < SPATE_RADIX_BITS; ++b) {
            bool bit = (digit >> b) & 1;
            u32 ones = __ballot_sync(SPATE_FULL_MASK, bit);
            peers &= bit ? ones : ~ones;
        }
        u32 rank = __popc(peers & lanes_below);
        if (live && rank == 0) warp_counts[warp][digit] = __popc(peers);
        __syncthreads();
        // One thread per digit turns the per-warp counts into positions.
        for (u32 d = threadIdx.x; d < SPATE_RADIX_DIGITS; d += SPATE_BLOCK_THREADS) {
            u32 running = digit_base[d];
            for (u32 w = 0; w < SPATE_WARPS_PER_BLOCK; ++w) {
                u32 c = warp_counts[w][d];
                warp_counts[w][d] = running;
                running += c;
            }
            digit_base[d] = running;
        }
        __syncthreads();
        if (live) {
            u32 pos = warp_counts[warp][digit] + rank;
            keys_out[pos] = key;
            values_out[pos] = values_in != nullptr ? values_in[i] : (u32)i;
        }
        // The next chunk rewrites warp_counts; make sure everyone has read it.
        __syncthreads();
    }
}

}  // namespace spate

/**
 * @brief Counts each tile's radix digits for one pass.
 *
 * @param keys       `n` keys
 * @param n          number of keys
 * @param shift      the pass's lowest bit (0, 8, 16, ...)
 * @param num_tiles  ceil(n / SPATE_TILE), the grid size
 * @param hist       256 * num_tiles counts, digit-major: hist[digit * num_tiles + tile]
 *
 * Launch: SPATE_BLOCK_THREADS threads, one block per tile, shared-memory atomics.
 * Memory: caller allocates `hist`.
 * Nulls:  none; nulls are partitioned out by the caller.
 * Stream: asynchronous on the launch stream.
 */
extern "C" __global__ void __launch_bounds__(SPATE_BLOCK_THREADS)
    radix_histogram_u32(const u32* keys, u64 n, u32 shift, u32 num_tiles, u32* hist) {
    spate::radix_histogram<u32>(keys, n, shift, num_tiles, hist);
}
SPATE_EXPORT(radix_histogram_u32)

/// As radix_histogram_u32, for u64 keys.
extern "C" __global__ void __launch_bounds__(SPATE_BLOCK_THREADS)
    radix_histogram_u64(const u64* keys, u64 n, u32 shift, u32 num_tiles, u32* hist) {
    spate::radix_histogram<u64>(keys, n, shift, num_tiles, hist);
}
SPATE_EXPORT(radix_histogram_u64)

/**
 * @brief Moves keys and their row indices to their place for one pass (stable).
 *
 * @param keys_in     `n` keys
 * @param values_in   `n` row indices, or null to use 0..n
 * @param offsets     the exclusive scan of radix_histogram's table
 * @param keys_out    `n` keys, ordered by this pass's digit
 * @param values_out  `n` row indices moved with their keys
 *
 * Launch: SPATE_BLOCK_THREADS threads, one block per tile, static shared (digit table and
 *         per-warp digit counts); full-warp ballots.
 * Memory: caller allocates the outputs; they must not alias the inputs.
 * Nulls:  none.
 * Stream: asynchronous on the launch stream.
 */
extern "C" __global__ void __launch_bounds__(SPATE_BLOCK_THREADS)
    radix_scatter_u32(const u32* keys_in, const u32* values_in, u64 n, u32 shift, u32 num_tiles, const u32* offsets,
                      u32* keys_out, u32* values_out) {
    spate::radix_scatter<u32>(keys_in, values_in, n, shift, num_tiles, offsets, keys_out, values_out);
}
SPATE_EXPORT(radix_scatter_u32)

/// As radix_scatter_u32, for u64 keys.
extern "C" __global__ void __launch_bounds__(SPATE_BLOCK_THREADS)
    radix_scatter_u64(const u64* keys_in, const u32* values_in, u64 n, u32 shift, u32 num_tiles, const u32* offsets,
                      u64* keys_out, u32* values_out) {
    spate::radix_scatter<u64>(keys_in, values_in, n, shift, num_tiles, offsets, keys_out, values_out);
}
SPATE_EXPORT(radix_scatter_u64)

namespace spate {

// Signed: flipping the sign bit maps two's complement order onto unsigned order.
__device__ __forceinline__ u32 order_key(i8 v) { return (u32)(i32)v ^ 0x80000000u; }
__device__ __forceinline__ u32 order_key(i16 v) { return (u32)(i32)v ^ 0x80000000u; }
__device__ __forceinline__ u32 order_key(u8 v) { return (u32)v; }
__device__ __forceinline__ u32 order_key(u16 v) { return (u32)v; }
__device__ __forceinline__ u32 order_key(i32 v) { return (u32)v ^ 0x80000000u; }
__device__ __forceinline__ u64 order_key(i64 v) { return (u64)v ^ 0x8000000000000000ull; }
__device__ __forceinline__ u32 order_key(u32 v) { return v; }
__device__ __forceinline__ u64 order_key(u64 v) { return v; }
// Floats: IEEE total order (-NaN < -inf < ... < -0.0 < +0.0 < ... < +inf < +NaN), the order of
// f32::total_cmp that Arrow's sort kernels (and so DataFusion) use. Negative values have every
// bit flipped, positive ones only the sign bit.
__device__ __forceinline__ u32 order_key(f32 v) {
    u32 b = __float_as_uint(v);
    return (b & 0x80000000u) ? ~b : b | 0x80000000u;
}
__device__ __forceinline__ u64 order_key(f64 v) {
    u64 b = (u64)__double_as_longlong(v);
    return (b & 0x8000000000000000ull) ? ~b : b | 0x8000000000000000ull;
}

template <typename T, typename K>
__device__ void make_keys(const T* __restrict__ in, u64 n, u32 descending, K* __restrict__ out) {
    for (u64 i = global_thread_index(); i < n; i += grid_stride()) {
        K k = order_key(in[i]);
        out[i] = descending ? ~k : k;
    }
}

}  // namespace spate

/**
 * @brief Turns a column into radix keys whose unsigned order is the column's sort order.
 *
 * @param in          `n` values
 * @param n           number of values
 * @param descending  1 to reverse the order (bitwise NOT of the key)
 * @param out         `n` keys (u32 for 4-byte types, u64 for 8-byte types)
 *
 * Launch: SPATE_BLOCK_THREADS threads, grid-stride, no shared memory.
 * Memory: caller allocates `out`.
 * Nulls:  not handled here; the sort operator places nulls first or last by partitioning.
 * Stream: asynchronous on the launch stream.
 */
#define SPATE_RADIX_KEY(T, K)                                                                                   \
    extern "C" __global__ void __launch_bounds__(SPATE_BLOCK_THREADS) radix_key_##T(const T* in, u64 n, u32 descending, \
                                                                                  K* out) {                     \
        spate::make_keys<T, K>(in, n, descending, out);                                                         \
    }                                                                                                           \
    SPATE_EXPORT(radix_key_##T)

SPATE_RADIX_KEY(i8, u32)
SPATE_RADIX_KEY(i16, u32)
SPATE_RADIX_KEY(u8, u32)
SPATE_RADIX_KEY(u16, u32)
SPATE_RADIX_KEY(i32, u32)
SPATE_RADIX_KEY(u32, u32)
SPATE_RADIX_KEY(f32, u32)
SPATE_RADIX_KEY(i64, u64)
SPATE_RADIX_KEY(u64, u64)
SPATE_RADIX_KEY(f64, u64)

/**
 * @brief Sort ranks for NULL placement: 0 for rows that sort first, 1 for the others.
 *
 * @param validity     validity bitmap of the key column
 * @param offset       bit offset of row 0
 * @param n            rows
 * @param nulls_first  1 to place NULLs first, 0 to place them last
 * @param out          `n` ranks, sorted on with 8 key bits after the column's values
 *
 * Launch: SPATE_BLOCK_THREADS threads, grid-stride, no shared memory.
 * Memory: caller allocates `out`.
 * Nulls:  this encodes them.
 * Stream: asynchronous on the launch stream.
 */
extern "C" __global__ void __launch_bounds__(SPATE_BLOCK_THREADS) null_ranks(const u8* validity, u64 offset, u64 n, u32 nulls_first,
                                                                           u32* out) {
    for (u64 i = spate::global_thread_index(); i < n; i += spate::grid_stride()) {
        bool valid = spate::row_is_valid(validity, offset, i);
        out[i] = valid == (nulls_first != 0) ? 1u : 0u;
    }
}
SPATE_EXPORT(null_ranks)

/**
 * @brief Radix keys of a Decimal128 (i128) column, as two 64-bit words: sort by the low word,
 *        then (stably) by the high word, for the 128-bit signed order.
 *
 * @param in          `n` 16-byte values (low word first)
 * @param n           number of values
 * @param descending  1 to reverse the order
 * @param high        0 for the low word's keys (unsigned), 1 for the high word's (signed)
 * @param out         `n` keys
 *
 * Launch: SPATE_BLOCK_THREADS threads, grid-stride, no shared memory.
 * Memory: caller allocates `out`.
 * Nulls:  not handled here (see radix_key_T).
 * Stream: asynchronous on the launch stream.
 */
extern "C" __global__ void __launch_bounds__(SPATE_BLOCK_THREADS) radix_key_i128(const u128* in, u64 n, u32 descending, u32 high,
                                                                               u64* out) {
    for (u64 i = spate::global_thread_index(); i < n; i += spate::grid_stride()) {
        u64 k = high ? in[i].hi ^ 0x8000000000000000ull : in[i].lo;
        out[i] = descending ? ~k : k;
    }
}
SPATE_EXPORT(radix_key_i128)

namespace spate {

template <typename Off>
__device__ void string_keys(const Off* __restrict__ offsets, const u8* __restrict__ bytes, u64 n, u64 chunk, u32 length_key,
                            u32 descending, u64* __restrict__ out) {
    for (u64 i = global_thread_index(); i < n; i += grid_stride()) {
        const u64 start = (u64)offsets[i];
        const u64 len = (u64)offsets[i + 1] - start;
        u64 k = 0;
        if (length_key) {
            k = len;
        } else {
            const u64 from = chunk * 8;
            for (u32 b = 0; b < 8; ++b) {
                const u64 at = from + b;
                k = (k << 8) | (at < len ? (u64)bytes[start + at] : 0ull);
            }
        }
        out[i] = descending ? ~k : k;
    }
}

}  // namespace spate

/**
 * @brief Radix keys of a string column, 8 bytes at a time, for a byte-wise (UTF-8 code point)
 *        order: sort stably by the length key, then by chunks from the last to the first.
 *
 * Chunk `c` is bytes [8c, 8c + 8) read big-endian, zero past the end. Two strings whose chunks
 * are all equal differ only by trailing zero bytes, so the shorter one sorts first, which the
 * length key (the least significant one) decides.
 *
 * @param offsets     `n + 1` offsets (i32 or i64 by entry point)
 * @param bytes       the string bytes
 * @param n           rows
 * @param chunk       which 8-byte chunk to key on
 * @param length_key  1 for the length key instead of a chunk
 * @param descending  1 to reverse the order
 * @param out         `n` keys
 *
 * Launch: SPATE_BLOCK_THREADS threads, grid-stride, no shared memory.
 * Memory: caller allocates `out`.
 * Nulls:  not handled here (see null_ranks); a NULL row's key is that of its (empty) slot.
 * Stream: asynchronous on the launch stream.
 */
#define SPATE_STRING_KEYS(O, SUFFIX)                                                                                   \
    extern "C" __global__ void __launch_bounds__(SPATE_BLOCK_THREADS)                                                 \
        radix_key_string_##SUFFIX(const O* offsets, const u8* bytes, u64 n, u64 chunk, u32 length_key, u32 descending, \
                                  u64* out) {                                                                          \
        spate::string_keys<O>(offsets, bytes, n, chunk, length_key, descending, out);                                  \
    }                                                                                                                  \
    SPATE_EXPORT(radix_key_string_##SUFFIX)
SPATE_STRING_KEYS(i32, i32)
SPATE_STRING_KEYS(i64, i64)
