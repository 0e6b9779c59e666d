// partition.cu: rows split into 2^bits partitions by bits of their key hashes, for operators
// that spill part of their input to the host (grace hash joins, aggregations).
//
// The partition is `(hash >> shift) & mask`. Callers take high bits, which the hash tables
// (indexed by low bits) do not use, so that the rows of one partition still spread over a
// table built from them.
#include "common/prelude.cuh"

/**
 * @brief Each row's partition from its hash, and the number of rows per partition.
 *
 * @param hashes  `n` row hashes
 * @param n       number of rows
 * @param shift   the partition is `(hash >> shift) & mask`
 * @param mask    `partitions - 1`, at most 255
 * @param pids    `n` outputs: each row's partition
 * @param counts  `mask + 1` counters, zeroed by the caller; receive the rows per partition
 *
 * Launch: SPATE_BLOCK_THREADS threads, grid-stride over `n`, 256 u32 of static shared memory.
 * Memory: caller allocates `pids` and zeroes `counts`.
 * Nulls:  none; a NULL key has its own hash.
 * Stream: asynchronous on the launch stream.
 */
extern "C" __global__ void __launch_bounds__(SPATE_BLOCK_THREADS)
    partition_ids(const u64* hashes, u64 n, u32 shift, u32 mask, u32* pids, u32* counts) {
    __shared__ u32 local[256];
    for (u32 p = threadIdx.x; p <= mask; p += blockDim.x) local[p] = 0;
    __syncthreads();
    for (u64 i = spate::global_thread_index(); i < n; i += spate::grid_stride()) {
        u32 p = (u32)(hashes[i] >> shift) & mask;
        pids[i] = p;
        atomicAdd(&local[p], 1u);
    }
    __syncthreads();
    for (u32 p = threadIdx.x; p <= mask; p += blockDim.x) {
        if (local[p] != 0) atomicAdd(&counts[p], local[p]);
    }
}
SPATE_EXPORT(partition_ids)
