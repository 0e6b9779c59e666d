// compact.cu: stream compaction: keep the rows whose mask is true, in order.
//
// The mask is a byte per row (non-zero = keep) or an Arrow boolean bitmap with a bit offset;
// an optional validity bitmap of the mask drops rows whose mask is NULL, as SQL's WHERE does.
// Two passes: `compact_count` counts kept rows per tile; after an exclusive scan of the counts,
// `compact_indices` / `compact_values_*` write each kept row at its tile's offset plus its rank
// in the tile, so the output keeps input order (stable).
#include "common/prelude.cuh"
#include "common/bitmap.cuh"
#include "common/block_scan.cuh"

namespace spate {

// How the mask is stored. Mirrored by `spate_kernels::compact::MaskKind`.
#define SPATE_MASK_BYTES 0u
#define SPATE_MASK_BITS 1u

struct Mask {
    const u8* data;
    u64 offset;  // bit offset, only for SPATE_MASK_BITS
    u32 kind;
    const u8* validity;
    u64 validity_offset;

    __device__ __forceinline__ bool keep(u64 i) const {
        bool v = kind == SPATE_MASK_BITS ? bit_is_set(data, offset, i) : data[i] != 0;
        return v && row_is_valid(validity, validity_offset, i);
    }
};

// Flags for this thread's SPATE_ITEMS_PER_THREAD consecutive rows of the tile.
__device__ __forceinline__ u32 tile_flags(const Mask& m, u64 n, u64 tile_start, bool (&keep)[SPATE_ITEMS_PER_THREAD]) {
    u32 count = 0;
#pragma unroll
    for (u32 k = 0; k < SPATE_ITEMS_PER_THREAD; ++k) {
        u64 i = tile_start + (u64)threadIdx.x * SPATE_ITEMS_PER_THREAD + k;
        keep[k] = i < n && m.keep(i);
        count += keep[k];
    }
    return count;
}

// Calls `emit(row, position)` for every kept row of this block's tile.
template <typename Emit>
__device__ __forceinline__ void for_each_kept(const Mask& m, u64 n, const u32* tile_offsets, Emit emit) {
    u64 tile_start = (u64)blockIdx.x * SPATE_TILE;
    bool keep[SPATE_ITEMS_PER_THREAD];
    u32 count = tile_flags(m, n, tile_start, keep);
    u32 total;
    u32 pos = block_exclusive_sum(count, total) + tile_offsets[blockIdx.x];
#pragma unroll
    for (u32 k = 0; k < SPATE_ITEMS_PER_THREAD; ++k) {
        if (keep[k]) emit(tile_start + (u64)threadIdx.x * SPATE_ITEMS_PER_THREAD + k, pos++);
    }
}

template <typename T>
__device__ void compact_values(Mask m, u64 n, const u32* tile_offsets, const T* __restrict__ values, T* __restrict__ out) {
    for_each_kept(m, n, tile_offsets, [&](u64 row, u32 pos) { out[pos] = values[row]; });
}

}  // namespace spate

/**
 * @brief Counts the kept rows of each tile.
 *
 * @param mask             byte mask (`mask_kind` 0) or bitmap (`mask_kind` 1)
 * @param mask_offset      bit offset into the bitmap
 * @param validity         validity bitmap of the mask, or null when it has no nulls
 * @param validity_offset  bit offset into `validity`
 * @param n                number of rows
 * @param tile_counts      one count per tile of SPATE_TILE rows
 *
 * Launch: SPATE_BLOCK_THREADS threads, one block per tile, static shared only.
 * Memory: caller allocates `tile_counts`.
 * Nulls:  a NULL mask value drops the row.
 * Stream: asynchronous on the launch stream.
 */
extern "C" __global__ void __launch_bounds__(SPATE_BLOCK_THREADS) compact_count(const u8* mask, u64 mask_offset, u32 mask_kind,
                                                                              const u8* validity, u64 validity_offset, u64 n,
                                                                              u32* tile_counts) {
    spate::Mask m{mask, mask_offset, mask_kind, validity, validity_offset};
    bool keep[SPATE_ITEMS_PER_THREAD];
    u32 count = spate::tile_flags(m, n, (u64)blockIdx.x * SPATE_TILE, keep);
    u32 total = spate::block_reduce(count, [](u32 a, u32 b) { return a + b; });
    if (threadIdx.x == 0) tile_counts[blockIdx.x] = total;
}
SPATE_EXPORT(compact_count)

/**
 * @brief Writes the index of every kept row, in input order.
 *
 * @param tile_offsets  exclusive scan of compact_count's tile counts
 * @param out           kept row indices; sized by the total count
 *
 * Launch: as compact_count.
 * Memory: caller allocates `out`.
 * Nulls:  a NULL mask value drops the row.
 * Stream: asynchronous on the launch stream.
 */
extern "C" __global__ void __launch_bounds__(SPATE_BLOCK_THREADS) compact_indices(const u8* mask, u64 mask_offset, u32 mask_kind,
                                                                                const u8* validity, u64 validity_offset, u64 n,
                                                                                const u32* tile_offsets, u32* out) {
    spate::Mask m{mask, mask_offset, mask_kind, validity, validity_offset};
    spate::for_each_kept(m, n, tile_offsets, [&](u64 row, u32 pos) { out[pos] = (u32)row; });
}
SPATE_EXPORT(compact_indices)

/**
 * @brief Writes the value of every kept row, in input order, for one element width.
 *
 * @param values  the column's values, `n` of them
 * @param out     kept values; sized by the total count
 *
 * Launch: as compact_count.
 * Memory: caller allocates `out`.
 * Nulls:  a NULL mask value drops the row; the column's own validity is compacted separately
 *         (gather_bitmap with the kept indices).
 * Stream: asynchronous on the launch stream.
 */
#define SPATE_COMPACT_VALUES(T)                                                                                   \
    extern "C" __global__ void __launch_bounds__(SPATE_BLOCK_THREADS)                                             \
        compact_values_##T(const u8* mask, u64 mask_offset, u32 mask_kind, const u8* validity, u64 validity_offset, \
                           u64 n, const u32* tile_offsets, const T* values, T* out) {                             \
        spate::Mask m{mask, mask_offset, mask_kind, validity, validity_offset};                                  \
        spate::compact_values<T>(m, n, tile_offsets, values, out);                                                \
    }                                                                                                             \
    SPATE_EXPORT(compact_values_##T)

SPATE_COMPACT_VALUES(u8)
SPATE_COMPACT_VALUES(u16)
SPATE_COMPACT_VALUES(u32)
SPATE_COMPACT_VALUES(u64)
SPATE_COMPACT_VALUES(u128)
