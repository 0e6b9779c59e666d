// block_scan.cuh: warp- and block-wide sums and scans built from full-warp shuffles.
//
// Contract: every thread of the block calls these functions (they contain barriers), with
// SPATE_BLOCK_THREADS threads per block.
#pragma once
#include "common/prelude.cuh"

namespace spate {

template <typename T>
__device__ __forceinline__ T warp_inclusive_sum(T v) {
    const u32 lane = lane_id();
#pragma unroll
    for (u32 d = 1; d < 32; d <<= 1) {
        T other = __shfl_up_sync(SPATE_FULL_MASK, v, d);
        if (lane >= d) v += other;
    }
    return v;
}

template <typename T>
__device__ __forceinline__ T warp_sum(T v) {
#pragma unroll
    for (u32 d = 16; d > 0; d >>= 1) v += __shfl_xor_sync(SPATE_FULL_MASK, v, (int)d);
    return v;
}

// Exclusive prefix sum of one value per thread across the block; `total` receives the sum of
// all values. Starts with a barrier so that back-to-back calls never overwrite warp sums
// another thread still reads.
template <typename T>
__device__ __forceinline__ T block_exclusive_sum(T v, T& total) {
    __shared__ T warp_totals[SPATE_WARPS_PER_BLOCK];
    __syncthreads();
    T inclusive = warp_inclusive_sum(v);
    if (lane_id() == 31) warp_totals[warp_id()] = inclusive;
    __syncthreads();
    T warp_offset = 0;
    T sum = 0;
#pragma unroll
    for (u32 w = 0; w < SPATE_WARPS_PER_BLOCK; ++w) {
        T t = warp_totals[w];
        if (w < warp_id()) warp_offset += t;
        sum += t;
    }
    total = sum;
    return warp_offset + inclusive - v;
}

// Reduces one value per thread with `op` (associative); the result is valid in every thread.
template <typename T, typename Op>
__device__ __forceinline__ T block_reduce(T v, Op op) {
    __shared__ T warp_partials[SPATE_WARPS_PER_BLOCK];
    __syncthreads();
#pragma unroll
    for (u32 d = 16; d > 0; d >>= 1) v = op(v, __shfl_xor_sync(SPATE_FULL_MASK, v, (int)d));
    if (lane_id() == 0) warp_partials[warp_id()] = v;
    __syncthreads();
    T r = warp_partials[0];
#pragma unroll
    for (u32 w = 1; w < SPATE_WARPS_PER_BLOCK; ++w) r = op(r, warp_partials[w]);
    return r;
}

}  // namespace spate
