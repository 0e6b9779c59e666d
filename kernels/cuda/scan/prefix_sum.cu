// prefix_sum.cu: exclusive and inclusive prefix sums of u32 and u64 columns (reduce-then-scan).
//
// Three steps, all launched by `spate_kernels::scan`: `scan_tile_sums_*` sums every tile, the
// tile sums are scanned (recursively, with these same kernels), and `scan_tiles_*` scans every
// tile starting from its tile's offset. Reduce-then-scan needs no inter-block waiting, which the
// dialect forbids (blocks have no forward-progress guarantee on either backend).
#include "common/prelude.cuh"
#include "common/block_scan.cuh"

namespace spate {

// Loads a tile striped (coalesced) into shared memory, then gives each thread its
// SPATE_ITEMS_PER_THREAD consecutive items.
template <typename T>
__device__ __forceinline__ void load_blocked(const T* in, u64 n, u64 tile_start, T* smem, T (&items)[SPATE_ITEMS_PER_THREAD]) {
#pragma unroll
    for (u32 k = 0; k < SPATE_ITEMS_PER_THREAD; ++k) {
        u64 i = tile_start + (u64)k * SPATE_BLOCK_THREADS + threadIdx.x;
        smem[k * SPATE_BLOCK_THREADS + threadIdx.x] = i < n ? in[i] : T(0);
    }
    __syncthreads();
#pragma unroll
    for (u32 k = 0; k < SPATE_ITEMS_PER_THREAD; ++k) items[k] = smem[threadIdx.x * SPATE_ITEMS_PER_THREAD + k];
}

template <typename T>
__device__ void tile_sums(const T* __restrict__ in, u64 n, T* __restrict__ sums) {
    u64 tile_start = (u64)blockIdx.x * SPATE_TILE;
    T local = 0;
#pragma unroll
    for (u32 k = 0; k < SPATE_ITEMS_PER_THREAD; ++k) {
        u64 i = tile_start + (u64)k * SPATE_BLOCK_THREADS + threadIdx.x;
        if (i < n) local += in[i];
    }
    T total = block_reduce(local, [](T a, T b) { return a + b; });
    if (threadIdx.x == 0) sums[blockIdx.x] = total;
}

template <typename T>
__device__ void scan_tiles(const T* in, u64 n, const T* __restrict__ tile_offsets, T* out, u32 inclusive, T* total) {
    __shared__ T smem[SPATE_TILE];
    u64 tile_start = (u64)blockIdx.x * SPATE_TILE;
    T items[SPATE_ITEMS_PER_THREAD];
    load_blocked(in, n, tile_start, smem, items);
    T thread_sum = 0;
#pragma unroll
    for (u32 k = 0; k < SPATE_ITEMS_PER_THREAD; ++k) thread_sum += items[k];
    T block_total;
    T running = block_exclusive_sum(thread_sum, block_total);
    if (tile_offsets != nullptr) running += tile_offsets[blockIdx.x];
    // All threads have read their items from smem (block_exclusive_sum has barriers), so the
    // tile can be reused to stage the output for a coalesced store.
#pragma unroll
    for (u32 k = 0; k < SPATE_ITEMS_PER_THREAD; ++k) {
        T v = items[k];
        smem[threadIdx.x * SPATE_ITEMS_PER_THREAD + k] = inclusive ? running + v : running;
        running += v;
    }
    // The last thread of the last tile has summed every value (the padding is zero): the total.
    if (total != nullptr && blockIdx.x == (n - 1) / SPATE_TILE && threadIdx.x == SPATE_BLOCK_THREADS - 1) *total = running;
    __syncthreads();
#pragma unroll
    for (u32 k = 0; k < SPATE_ITEMS_PER_THREAD; ++k) {
        u64 i = tile_start + (u64)k * SPATE_BLOCK_THREADS + threadIdx.x;
        if (i < n) out[i] = smem[k * SPATE_BLOCK_THREADS + threadIdx.x];
    }
}

}  // namespace spate

/**
 * @brief Sums each tile of `in` into `sums[tile]`.
 *
 * @param in    input values, `n` of them
 * @param n     number of values
 * @param sums  one output per tile: ceil(n / SPATE_TILE) values
 *
 * Launch: SPATE_BLOCK_THREADS threads, one block per tile of SPATE_TILE values, static shared.
 * Memory: caller allocates `sums`.
 * Nulls:  none; the input has no validity.
 * Stream: asynchronous on the launch stream.
 */
extern "C" __global__ void __launch_bounds__(SPATE_BLOCK_THREADS) scan_tile_sums_u32(const u32* in, u64 n, u32* sums) {
    spate::tile_sums<u32>(in, n, sums);
}
SPATE_EXPORT(scan_tile_sums_u32)

/// As scan_tile_sums_u32, for u64 values.
extern "C" __global__ void __launch_bounds__(SPATE_BLOCK_THREADS) scan_tile_sums_u64(const u64* in, u64 n, u64* sums) {
    spate::tile_sums<u64>(in, n, sums);
}
SPATE_EXPORT(scan_tile_sums_u64)

/**
 * @brief Prefix-sums each tile, starting from `tile_offsets[tile]` (0 when null).
 *
 * @param in            input values (may alias `out`: each block reads its tile before writing)
 * @param n             number of values
 * @param tile_offsets  exclusive scan of the tile sums, or null for a single tile
 * @param out           output values, `n` of them
 * @param inclusive     1 for an inclusive scan, 0 for exclusive
 * @param total         where the sum of all `n` values goes (one value), or null
 *
 * Launch: SPATE_BLOCK_THREADS threads, one block per tile, SPATE_TILE values of static shared.
 * Memory: caller allocates `out` (and `total`).
 * Nulls:  none; sums wrap modulo 2^32 (2^64) like unsigned arithmetic.
 * Stream: asynchronous on the launch stream.
 */
extern "C" __global__ void __launch_bounds__(SPATE_BLOCK_THREADS)
    scan_tiles_u32(const u32* in, u64 n, const u32* tile_offsets, u32* out, u32 inclusive, u32* total) {
    spate::scan_tiles<u32>(in, n, tile_offsets, out, inclusive, total);
}
SPATE_EXPORT(scan_tiles_u32)

/// As scan_tiles_u32, for u64 values.
extern "C" __global__ void __launch_bounds__(SPATE_BLOCK_THREADS)
    scan_tiles_u64(const u64* in, u64 n, const u64* tile_offsets, u64* out, u32 inclusive, u64* total) {
    spate::scan_tiles<u64>(in, n, tile_offsets, out, inclusive, total);
}
SPATE_EXPORT(scan_tiles_u64)
