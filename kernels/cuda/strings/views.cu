// views.cu: Arrow Utf8View columns, uploaded as their views and data buffers, turned into the
// offsets + bytes every other kernel reads.
//
// A view is 16 bytes: the string's length (u32), then either the string itself (length <= 12,
// zero-padded) or its first four bytes, the index of the data buffer that holds it (u32) and
// its offset there (u32). The uploader lays the data buffers of a column end to end and passes
// where each starts; a view's buffer index counts across every batch the upload merged.
#include "common/prelude.cuh"
#include "common/bitmap.cuh"

// The longest string a view holds inline.
#define SPATE_VIEW_INLINE 12

namespace spate {

// Row i's length: 0 for a null row (a null view's bytes mean nothing) and for i == n.
__device__ __forceinline__ u64 view_length(const u32* views, const u8* validity, u64 validity_offset, u64 n, u64 i) {
    if (i >= n || !row_is_valid(validity, validity_offset, i)) return 0;
    return (u64)views[4 * i];
}

template <typename Off>
__device__ void view_bytes(const u32* __restrict__ views, const u8* __restrict__ validity, u64 validity_offset,
                           const u8* __restrict__ data, const u64* __restrict__ buffer_starts,
                           const u64* __restrict__ starts, u64 n, Off* __restrict__ out_offsets,
                           u8* __restrict__ out_bytes) {
    for (u64 i = global_thread_index(); i <= n; i += grid_stride()) {
        const u64 dst = starts[i];
        out_offsets[i] = (Off)dst;
        const u64 len = view_length(views, validity, validity_offset, n, i);
        if (len == 0) continue;
        const u32* view = views + 4 * i;
        const u8* src = len <= SPATE_VIEW_INLINE ? (const u8*)(view + 1) : data + buffer_starts[view[2]] + view[3];
        for (u64 b = 0; b < len; ++b) out_bytes[dst + b] = src[b];
    }
}

}  // namespace spate

/**
 * @brief The length of each row of a Utf8View column, the first step of turning it into
 *        offsets + bytes (then an exclusive u64 scan of the lengths, then view_bytes_*).
 *
 * @param views            `n` views, 16 bytes each (read as four u32 words)
 * @param validity         the column's validity bitmap, or null when no row is null
 * @param validity_offset  bit offset of row 0 in `validity`
 * @param n                rows
 * @param lengths          `n + 1` outputs; lengths[n] = 0, so the scan's last value is the total
 *
 * Launch: SPATE_BLOCK_THREADS threads, grid-stride over `n + 1`, no shared memory.
 * Memory: caller allocates `lengths`; `views` must be 4-byte aligned.
 * Nulls:  a null row has length 0, whatever its view says.
 * Stream: asynchronous on the launch stream.
 */
extern "C" __global__ void __launch_bounds__(SPATE_BLOCK_THREADS)
    view_lengths(const u32* views, const u8* validity, u64 validity_offset, u64 n, u64* lengths) {
    for (u64 i = spate::global_thread_index(); i <= n; i += spate::grid_stride()) {
        lengths[i] = spate::view_length(views, validity, validity_offset, n, i);
    }
}
SPATE_EXPORT(view_lengths)

/**
 * @brief Copies each row of a Utf8View column to out_bytes[starts[i]..] and writes
 *        out_offsets[0..=n] = starts (narrowed to Off; the launcher checks the total fits).
 *
 * @param views            `n` views, as for view_lengths
 * @param validity         as for view_lengths
 * @param validity_offset  as for view_lengths
 * @param data             the column's data buffers, end to end
 * @param buffer_starts    where each data buffer starts in `data`, by a view's buffer index
 * @param starts           the exclusive scan of view_lengths' output (n + 1 values)
 * @param n                rows
 * @param out_offsets      `n + 1` offsets
 * @param out_bytes        starts[n] bytes
 *
 * Launch: SPATE_BLOCK_THREADS threads, grid-stride over `n + 1`; one thread copies one string.
 * Memory: caller allocates the outputs; every view of a valid row longer than 12 bytes must
 *         name a buffer of `buffer_starts` and a range inside it (Arrow's validation of the
 *         uploaded array guarantees it).
 * Nulls:  null rows copy nothing; validity stays the column's own.
 * Stream: asynchronous on the launch stream.
 */
#define SPATE_VIEW_BYTES(Off)                                                                                         \
    extern "C" __global__ void __launch_bounds__(SPATE_BLOCK_THREADS)                                                 \
        view_bytes_##Off(const u32* views, const u8* validity, u64 validity_offset, const u8* data,                    \
                         const u64* buffer_starts, const u64* starts, u64 n, Off* out_offsets, u8* out_bytes) {        \
        spate::view_bytes<Off>(views, validity, validity_offset, data, buffer_starts, starts, n, out_offsets,          \
                               out_bytes);                                                                           \
    }                                                                                                                 \
    SPATE_EXPORT(view_bytes_##Off)

SPATE_VIEW_BYTES(i32)
SPATE_VIEW_BYTES(i64)
