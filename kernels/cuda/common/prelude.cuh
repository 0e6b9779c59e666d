// prelude.cuh: the first include of every kernel source; the dialect's types and constants.
//
// The same source is compiled by NVRTC (SPATE_NVRTC) and, for the emulated backend, by the host
// C++ compiler (SPATE_EMULATED) with kernels/emu/spate_emu.h. Kernels use only what this file
// and spate_emu.h provide; docs/dev/kernels.md lists the rules.
#pragma once

#if defined(SPATE_EMULATED)
#include "spate_emu.h"
#else
// NVRTC ships no <cstdint>; the dialect names its own fixed-width types below.
#define SPATE_EXPORT(name)
// Dynamic shared memory as a typed pointer, the same spelling on both backends.
#define SPATE_DYNAMIC_SHARED(T, name)                                   \
    extern __shared__ __align__(16) unsigned char spate_dynamic_smem_[]; \
    T* name = reinterpret_cast<T*>(spate_dynamic_smem_)
#endif

typedef signed char i8;
typedef unsigned char u8;
typedef short i16;
typedef unsigned short u16;
typedef int i32;
typedef unsigned int u32;
typedef long long i64;
typedef unsigned long long u64;
typedef float f32;
typedef double f64;
// 128-bit integers for Decimal128 arithmetic (NVRTC needs --device-int128, which the runtime
// always passes).
typedef __int128 i128;
typedef unsigned __int128 u128i;

// A 16-byte value (Decimal128, i128) moved as two words; kernels never do arithmetic on it.
struct __align__(16) u128 {
    u64 lo;
    u64 hi;
};

// Threads per block for every fixed kernel. Mirrored by `spate_kernels::launch::BLOCK_THREADS`.
#define SPATE_BLOCK_THREADS 256
// Items per thread in tile-based kernels (scan, compaction, radix sort).
#define SPATE_ITEMS_PER_THREAD 8
// Rows per tile: one block processes one tile.
#define SPATE_TILE (SPATE_BLOCK_THREADS * SPATE_ITEMS_PER_THREAD)
#define SPATE_WARPS_PER_BLOCK (SPATE_BLOCK_THREADS / 32)
#define SPATE_FULL_MASK 0xffffffffu
// Index value meaning "no row": gathers write a zero value and a null for it.
#define SPATE_NULL_INDEX 0xffffffffu

namespace spate {

template <typename T>
__device__ __forceinline__ T min_of(T a, T b) {
    return b < a ? b : a;
}

template <typename T>
__device__ __forceinline__ T max_of(T a, T b) {
    return a < b ? b : a;
}

// Linear index of this thread in the grid, 64-bit so grids over 4G rows do not wrap.
__device__ __forceinline__ u64 global_thread_index() {
    return (u64)blockIdx.x * blockDim.x + threadIdx.x;
}

__device__ __forceinline__ u64 grid_stride() {
    return (u64)gridDim.x * blockDim.x;
}

// The rows a kernel over a batch runs to: `n`, or fewer when the batch's row count is on the
// device (`live`, one u32 written by an earlier kernel on the stream; null when the host knows
// the count and passed it as `n`). Rows at or past it were never written: no kernel reads them.
__device__ __forceinline__ u64 live_rows(const u32* live, u64 n) {
    if (live == nullptr) return n;
    u64 c = (u64)*live;
    return c < n ? c : n;
}

__device__ __forceinline__ u32 lane_id() {
    return threadIdx.x & 31u;
}

__device__ __forceinline__ u32 warp_id() {
    return threadIdx.x >> 5;
}

}  // namespace spate
