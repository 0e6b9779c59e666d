// gather.cu: gather and scatter of fixed-width values, validity bitmaps and strings.
//
// Gather: out[i] = in[indices[i]]. Scatter: out[indices[i]] = in[i]. An index equal to
// SPATE_NULL_INDEX means "no row": gathers write a zero value and a null validity bit, scatters
// skip the row. Indices are u32 (a device batch holds at most 2^32 - 1 rows).
#include "common/prelude.cuh"
#include "common/bitmap.cuh"

namespace spate {

template <typename T>
__device__ void gather_values(const T* __restrict__ in, const u32* __restrict__ indices, const u32* live, u64 n,
                              T* __restrict__ out) {
    const u64 m = live_rows(live, n);
    for (u64 i = global_thread_index(); i < m; i += grid_stride()) {
        u32 idx = indices[i];
        T v{};
        if (idx != SPATE_NULL_INDEX) v = in[idx];
        out[i] = v;
    }
}

template <typename T>
__device__ void gather_row_words(const T* __restrict__ in, u64 words, const u32* __restrict__ indices,
                                 const u32* live, u64 n, T* __restrict__ out) {
    const u64 total = live_rows(live, n) * words;
    for (u64 t = global_thread_index(); t < total; t += grid_stride()) {
        const u64 i = t / words;
        const u64 j = t - i * words;
        const u32 idx = indices[i];
        T v{};
        if (idx != SPATE_NULL_INDEX) v = in[(u64)idx * words + j];
        out[t] = v;
    }
}

template <typename T>
__device__ void scatter_values(const T* __restrict__ in, const u32* __restrict__ indices, u64 n, T* __restrict__ out) {
    for (u64 i = global_thread_index(); i < n; i += grid_stride()) {
        u32 idx = indices[i];
        if (idx != SPATE_NULL_INDEX) out[idx] = in[i];
    }
}

}  // namespace spate

/**
 * @brief Gathers fixed-width values: out[i] = in[indices[i]].
 *
 * @param in       source values
 * @param indices  `n` row indices into `in`; SPATE_NULL_INDEX writes zero
 * @param live     the device row count (see live_rows), or null: rows at or past it are not
 *                 read or written
 * @param n        number of output rows
 * @param out      `n` output values
 *
 * Launch: SPATE_BLOCK_THREADS threads, grid-stride over `n`, no shared memory.
 * Memory: caller allocates `out`; every index must be < len(in) or SPATE_NULL_INDEX.
 * Nulls:  values only; validity is gathered by gather_bitmap.
 * Stream: asynchronous on the launch stream.
 */
#define SPATE_GATHER(T)                                                                                              \
    extern "C" __global__ void __launch_bounds__(SPATE_BLOCK_THREADS) gather_##T(const T* in, const u32* indices,          \
                                                                                const u32* live, u64 n, T* out) {    \
        spate::gather_values<T>(in, indices, live, n, out);                                                                \
    }                                                                                                                \
    SPATE_EXPORT(gather_##T)                                                                                         \
    extern "C" __global__ void __launch_bounds__(SPATE_BLOCK_THREADS) scatter_##T(const T* in, const u32* indices, u64 n, \
                                                                                 T* out) {                           \
        spate::scatter_values<T>(in, indices, n, out);                                                               \
    }                                                                                                                \
    SPATE_EXPORT(scatter_##T)

// scatter_T: out[indices[i]] = in[i] for the `n` input rows; SPATE_NULL_INDEX rows are skipped.
// Launch, Memory, Nulls and Stream as gather_T; indices must be distinct (a permutation or an
// injective map), otherwise which value lands is unspecified.
SPATE_GATHER(u8)
SPATE_GATHER(u16)
SPATE_GATHER(u32)
SPATE_GATHER(u64)
SPATE_GATHER(u128)

/**
 * @brief Gathers rows of `words` values each (a value wider than 16 bytes, such as an
 *        embedding): out[i * words + j] = in[indices[i] * words + j].
 *
 * @param in       source rows, `words` values each
 * @param words    values per row, at least 1
 * @param indices  `n` row indices into `in`; SPATE_NULL_INDEX writes a row of zeros
 * @param live     the device row count (see live_rows), or null: rows at or past it are not
 *                 read or written
 * @param n        number of output rows
 * @param out      `n * words` output values
 *
 * Launch: SPATE_BLOCK_THREADS threads, grid-stride over `n * words`, no shared memory.
 * Memory: caller allocates `out`; every index must be < len(in) / words or SPATE_NULL_INDEX.
 * Nulls:  values only; validity is gathered by gather_bitmap.
 * Stream: asynchronous on the launch stream.
 */
#define SPATE_GATHER_ROWS(T)                                                                                         \
    extern "C" __global__ void __launch_bounds__(SPATE_BLOCK_THREADS)                                                \
        gather_rows_##T(const T* in, u64 words, const u32* indices, const u32* live, u64 n, T* out) {                \
        spate::gather_row_words<T>(in, words, indices, live, n, out);                                                \
    }                                                                                                                \
    SPATE_EXPORT(gather_rows_##T)

SPATE_GATHER_ROWS(u16)
SPATE_GATHER_ROWS(u32)
SPATE_GATHER_ROWS(u64)
SPATE_GATHER_ROWS(u128)

/**
 * @brief Gathers a validity bitmap: bit i of `out` = bit indices[i] of `in`.
 *
 * @param in         source bitmap, or null when every source row is valid
 * @param in_offset  bit offset of row 0 in `in`
 * @param indices    `n` row indices; SPATE_NULL_INDEX gives a null (0) bit
 * @param live       the device row count (see live_rows), or null; words past it are not
 *                   written, bits past it in its last word are 0
 * @param n          number of output rows
 * @param out        output bitmap as ceil(n / 32) words, bit offset 0; bits past `n` are 0
 *
 * Launch: SPATE_BLOCK_THREADS threads, grid-stride over output words, no shared memory. Each
 *         thread builds a whole word, so no atomics are needed.
 * Memory: caller allocates `out` (a multiple of 4 bytes).
 * Nulls:  this is the null propagation itself.
 * Stream: asynchronous on the launch stream.
 */
extern "C" __global__ void __launch_bounds__(SPATE_BLOCK_THREADS) gather_bitmap(const u8* in, u64 in_offset, const u32* indices,
                                                                              const u32* live, u64 n, u32* out) {
    n = spate::live_rows(live, n);
    u64 words = (n + 31) / 32;
    for (u64 w = spate::global_thread_index(); w < words; w += spate::grid_stride()) {
        u32 word = 0;
        u64 base = w * 32;
        for (u32 b = 0; b < 32 && base + b < n; ++b) {
            u32 idx = indices[base + b];
            bool valid = idx != SPATE_NULL_INDEX && spate::row_is_valid(in, in_offset, idx);
            word |= (u32)valid << b;
        }
        out[w] = word;
    }
}
SPATE_EXPORT(gather_bitmap)

/**
 * @brief Scatters a validity bitmap: bit indices[i] of `out` = bit i of `in`.
 *
 * @param in         source bitmap, or null when every source row is valid
 * @param in_offset  bit offset of row 0 in `in`
 * @param indices    `n` destination rows; SPATE_NULL_INDEX rows are skipped
 * @param n          number of source rows
 * @param out        destination bitmap as words, bit offset 0; must start all zero (null)
 *
 * Launch: SPATE_BLOCK_THREADS threads, grid-stride over `n`; atomicOr on the output words.
 * Memory: caller allocates and zeroes `out`.
 * Nulls:  destination rows nobody writes stay null.
 * Stream: asynchronous on the launch stream.
 */
extern "C" __global__ void __launch_bounds__(SPATE_BLOCK_THREADS) scatter_bitmap(const u8* in, u64 in_offset, const u32* indices,
                                                                               u64 n, u32* out) {
    for (u64 i = spate::global_thread_index(); i < n; i += spate::grid_stride()) {
        u32 idx = indices[i];
        if (idx != SPATE_NULL_INDEX && spate::row_is_valid(in, in_offset, i)) atomicOr(&out[idx >> 5], 1u << (idx & 31));
    }
}
SPATE_EXPORT(scatter_bitmap)

namespace spate {

template <typename Off>
__device__ void string_lengths(const Off* __restrict__ offsets, const u32* __restrict__ indices, const u32* live, u64 n,
                               u64* __restrict__ lengths) {
    const u64 m = live_rows(live, n);
    for (u64 i = global_thread_index(); i <= n; i += grid_stride()) {
        u64 len = 0;
        if (i < m) {
            u32 idx = indices != nullptr ? indices[i] : (u32)i;
            if (idx != SPATE_NULL_INDEX) len = (u64)(offsets[idx + 1] - offsets[idx]);
        }
        lengths[i] = len;
    }
}

template <typename Off>
__device__ void gather_bytes(const Off* __restrict__ in_offsets, const u8* __restrict__ in_bytes, const u32* __restrict__ indices,
                             const u64* __restrict__ out_starts, const u32* live, u64 n, Off* __restrict__ out_offsets,
                             u8* __restrict__ out_bytes) {
    const u64 m = live_rows(live, n);
    for (u64 i = global_thread_index(); i <= n; i += grid_stride()) {
        u64 dst = out_starts[i];
        out_offsets[i] = (Off)dst;
        if (i >= m) continue;
        u32 idx = indices[i];
        if (idx == SPATE_NULL_INDEX) continue;
        u64 src = (u64)in_offsets[idx];
        u64 len = out_starts[i + 1] - dst;
        for (u64 b = 0; b < len; ++b) out_bytes[dst + b] = in_bytes[src + b];
    }
}

template <typename Off>
__device__ void scatter_bytes(const Off* __restrict__ in_offsets, const u8* __restrict__ in_bytes, const u32* __restrict__ indices,
                              const u64* __restrict__ out_starts, u64 n, u64 n_out, Off* __restrict__ out_offsets,
                              u8* __restrict__ out_bytes) {
    u64 rows = n > n_out + 1 ? n : n_out + 1;
    for (u64 i = global_thread_index(); i < rows; i += grid_stride()) {
        if (i <= n_out) out_offsets[i] = (Off)out_starts[i];
        if (i >= n) continue;
        u32 idx = indices[i];
        if (idx == SPATE_NULL_INDEX) continue;
        u64 src = (u64)in_offsets[i];
        u64 len = (u64)(in_offsets[i + 1] - in_offsets[i]);
        u64 dst = out_starts[idx];
        for (u64 b = 0; b < len; ++b) out_bytes[dst + b] = in_bytes[src + b];
    }
}

}  // namespace spate

/**
 * @brief Step 1 of a string gather: the byte length of every gathered string.
 *
 * @param offsets  source offsets (len(source) + 1 of them)
 * @param indices  `n` source rows (null: row i itself); SPATE_NULL_INDEX gives length 0
 * @param live     the device row count (see live_rows), or null: rows at or past it get
 *                 length 0, so their offsets all equal the total and they own no bytes
 * @param n        number of output rows
 * @param lengths  `n + 1` outputs; lengths[n] = 0 so an exclusive scan yields the total last
 *
 * Launch: SPATE_BLOCK_THREADS threads, grid-stride over `n + 1`, no shared memory.
 * Memory: caller allocates `lengths`.
 * Nulls:  a null row is an empty string; validity is gathered by gather_bitmap.
 * Stream: asynchronous on the launch stream.
 *
 * Step 2 is an exclusive u64 scan of `lengths` (the output starts); step 3 is
 * gather_string_bytes_*, which also writes the output offsets in the column's offset type.
 */
#define SPATE_STRINGS(Off)                                                                                           \
    extern "C" __global__ void __launch_bounds__(SPATE_BLOCK_THREADS)                                                 \
        gather_string_lengths_##Off(const Off* offsets, const u32* indices, const u32* live, u64 n, u64* lengths) {  \
        spate::string_lengths<Off>(offsets, indices, live, n, lengths);                                                     \
    }                                                                                                                 \
    SPATE_EXPORT(gather_string_lengths_##Off)                                                                         \
    extern "C" __global__ void __launch_bounds__(SPATE_BLOCK_THREADS)                                                 \
        gather_string_bytes_##Off(const Off* in_offsets, const u8* in_bytes, const u32* indices, const u64* out_starts, \
                                  const u32* live, u64 n, Off* out_offsets, u8* out_bytes) {                          \
        spate::gather_bytes<Off>(in_offsets, in_bytes, indices, out_starts, live, n, out_offsets, out_bytes);               \
    }                                                                                                                 \
    SPATE_EXPORT(gather_string_bytes_##Off)                                                                           \
    extern "C" __global__ void __launch_bounds__(SPATE_BLOCK_THREADS)                                                 \
        scatter_string_bytes_##Off(const Off* in_offsets, const u8* in_bytes, const u32* indices, const u64* out_starts, \
                                   u64 n, u64 n_out, Off* out_offsets, u8* out_bytes) {                               \
        spate::scatter_bytes<Off>(in_offsets, in_bytes, indices, out_starts, n, n_out, out_offsets, out_bytes);       \
    }                                                                                                                 \
    SPATE_EXPORT(scatter_string_bytes_##Off)

// gather_string_bytes_Off: copies each gathered string below `live` (see live_rows) to
//   out_bytes[out_starts[i]..] and writes out_offsets[0..=n] = out_starts (narrowed to Off; the
//   launcher checks the total fits).
// scatter_string_bytes_Off: copies input string i to out_bytes[out_starts[indices[i]]..] and
//   writes out_offsets[0..=n_out] = out_starts; the launcher computes out_starts by scattering
//   the lengths (scatter_u64) and scanning them.
// Launch: SPATE_BLOCK_THREADS threads, grid-stride over rows, one thread copies one string.
// Memory: caller allocates every output. Nulls: null rows copy nothing. Stream: asynchronous.
SPATE_STRINGS(i32)
SPATE_STRINGS(i64)

/**
 * @brief Copies `n` bits of a bitmap to bit `dst_offset` of another (concatenation).
 *
 * @param src         source bitmap, or null for "all set" (a column without nulls)
 * @param src_offset  bit offset of row 0 in `src`
 * @param n           bits to copy
 * @param dst         destination words; must start zeroed where the copy lands
 * @param dst_offset  bit offset of the first copied bit in `dst`
 *
 * Launch: SPATE_BLOCK_THREADS threads, grid-stride over `n`; atomicOr, since copies of
 *         neighbouring ranges may share a boundary word.
 * Memory: caller allocates and zeroes `dst`.
 * Nulls:  this is how validity is concatenated.
 * Stream: asynchronous on the launch stream.
 */
extern "C" __global__ void __launch_bounds__(SPATE_BLOCK_THREADS) copy_bitmap(const u8* src, u64 src_offset, u64 n, u32* dst,
                                                                            u64 dst_offset) {
    for (u64 i = spate::global_thread_index(); i < n; i += spate::grid_stride()) {
        if (spate::row_is_valid(src, src_offset, i)) {
            u64 b = dst_offset + i;
            atomicOr(&dst[b >> 5], 1u << (b & 31));
        }
    }
}
SPATE_EXPORT(copy_bitmap)

/**
 * @brief Copies `n` string offsets adding `delta` (concatenating string columns).
 *
 * @param src    offsets to copy
 * @param n      how many
 * @param delta  added to each (the byte position of the source's data in the result)
 * @param dst    destination offsets
 *
 * Launch: SPATE_BLOCK_THREADS threads, grid-stride, no shared memory.
 * Memory: caller allocates `dst`.
 * Nulls:  none.
 * Stream: asynchronous on the launch stream.
 */
#define SPATE_ADD_OFFSETS(Off)                                                                                      \
    extern "C" __global__ void __launch_bounds__(SPATE_BLOCK_THREADS) add_offsets_##Off(const Off* src, u64 n, Off delta, \
                                                                                       Off* dst) {                  \
        for (u64 i = spate::global_thread_index(); i < n; i += spate::grid_stride()) dst[i] = src[i] + delta;       \
    }                                                                                                               \
    SPATE_EXPORT(add_offsets_##Off)

SPATE_ADD_OFFSETS(i32)
SPATE_ADD_OFFSETS(i64)

/**
 * @brief Widens 32-bit string offsets to 64 bits while adding `delta`: a Utf8 part of a
 *        concatenation whose other parts (or total) need 64-bit offsets.
 *
 * @param src    `n` offsets
 * @param n      number of offsets
 * @param delta  added to each
 * @param dst    `n` outputs
 *
 * Launch: SPATE_BLOCK_THREADS threads, grid-stride over `n`, no shared memory.
 * Memory: caller allocates `dst`.
 * Nulls:  none; offsets of NULL rows are copied like any other.
 * Stream: asynchronous on the launch stream.
 */
extern "C" __global__ void __launch_bounds__(SPATE_BLOCK_THREADS)
    widen_offsets_i32(const i32* src, u64 n, i64 delta, i64* dst) {
    for (u64 i = spate::global_thread_index(); i < n; i += spate::grid_stride()) dst[i] = (i64)src[i] + delta;
}
SPATE_EXPORT(widen_offsets_i32)

// The most parts one append_parts launch takes (each part is four parameters).
#define SPATE_APPEND_PARTS 16

namespace spate {

// One part of an append: its values or bitmap, and its row count.
struct AppendPart {
    const u8* src;
    u64 src_offset;
    const u32* live;
    u64 n;
};

__device__ void append_parts(u64 width, u32 parts, const AppendPart* part, u8* dst, u32* count) {
    // Each part lands after the live rows of the parts before it: every thread sums them
    // (at most SPATE_APPEND_PARTS words), so no cursor is kept between launches.
    u64 start[SPATE_APPEND_PARTS];
    u64 rows[SPATE_APPEND_PARTS];
    u64 total = 0;
    for (u32 k = 0; k < parts; ++k) {
        rows[k] = live_rows(part[k].live, part[k].n);
        start[k] = total;
        total += rows[k];
    }
    if (count != nullptr && global_thread_index() == 0) *count = (u32)total;
    if (dst == nullptr) return;
    for (u32 k = 0; k < parts; ++k) {
        if (width > 0) {
            const u64 m = rows[k] * width;
            u8* out = dst + start[k] * width;
            for (u64 b = global_thread_index(); b < m; b += grid_stride()) out[b] = part[k].src[b];
        } else {
            u32* words = (u32*)dst;
            for (u64 i = global_thread_index(); i < rows[k]; i += grid_stride()) {
                if (row_is_valid(part[k].src, part[k].src_offset, i)) {
                    const u64 b = start[k] + i;
                    atomicOr(&words[b >> 5], 1u << (b & 31));
                }
            }
        }
    }
}

}  // namespace spate

#define SPATE_APPEND_PART_PARAMS(k) const u8 *src##k, u64 off##k, const u32 *live##k, u64 n##k
#define SPATE_APPEND_PART(k) {src##k, off##k, live##k, n##k}

/**
 * @brief Appends the live rows of up to SPATE_APPEND_PARTS parts, in order, to one column of a
 *        batch being merged, without any count coming to the host: part k lands after the
 *        live rows of parts 0..k-1, which every thread sums from their `live` words.
 *
 * @param width   bytes per row, or 0 for a bitmap (validity, or boolean values)
 * @param parts   how many of the part parameters are used (at most SPATE_APPEND_PARTS)
 * @param srcK    part K's values, or its bitmap (null: every row set)
 * @param offK    bit offset of row 0 in part K's bitmap (0 for values)
 * @param liveK   part K's device row count (see live_rows), or null for `nK` rows
 * @param nK      part K's bound
 * @param dst     the merged column, allocated for the sum of the parts' bounds (a bitmap must
 *                start zeroed and hold whole words), or null to write only `count`
 * @param count   where the merged row count goes (one u32), or null
 *
 * Launch: SPATE_BLOCK_THREADS threads, grid-stride over each part's rows (in bytes for
 *         values); no shared memory; bitmaps use atomicOr, since parts meet inside a word.
 * Memory: caller allocates `dst` for the sum of the bounds, so no part passes its end.
 * Nulls:  validity travels as a bitmap, appended with width 0.
 * Stream: asynchronous; the parts' counts must be written earlier on the stream.
 */
extern "C" __global__ void __launch_bounds__(SPATE_BLOCK_THREADS)
    append_parts(u64 width, u32 parts, SPATE_APPEND_PART_PARAMS(0), SPATE_APPEND_PART_PARAMS(1),
                 SPATE_APPEND_PART_PARAMS(2), SPATE_APPEND_PART_PARAMS(3), SPATE_APPEND_PART_PARAMS(4),
                 SPATE_APPEND_PART_PARAMS(5), SPATE_APPEND_PART_PARAMS(6), SPATE_APPEND_PART_PARAMS(7),
                 SPATE_APPEND_PART_PARAMS(8), SPATE_APPEND_PART_PARAMS(9), SPATE_APPEND_PART_PARAMS(10),
                 SPATE_APPEND_PART_PARAMS(11), SPATE_APPEND_PART_PARAMS(12), SPATE_APPEND_PART_PARAMS(13),
                 SPATE_APPEND_PART_PARAMS(14), SPATE_APPEND_PART_PARAMS(15), u8* dst, u32* count) {
    const spate::AppendPart part[SPATE_APPEND_PARTS] = {
        SPATE_APPEND_PART(0),  SPATE_APPEND_PART(1),  SPATE_APPEND_PART(2),  SPATE_APPEND_PART(3),
        SPATE_APPEND_PART(4),  SPATE_APPEND_PART(5),  SPATE_APPEND_PART(6),  SPATE_APPEND_PART(7),
        SPATE_APPEND_PART(8),  SPATE_APPEND_PART(9),  SPATE_APPEND_PART(10), SPATE_APPEND_PART(11),
        SPATE_APPEND_PART(12), SPATE_APPEND_PART(13), SPATE_APPEND_PART(14), SPATE_APPEND_PART(15)};
    spate::append_parts(width, parts < SPATE_APPEND_PARTS ? parts : SPATE_APPEND_PARTS, part, dst, count);
}
SPATE_EXPORT(append_parts)
