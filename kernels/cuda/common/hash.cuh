// hash.cuh: 64-bit row hashing shared by hash partitioning, hash aggregation and hash joins.
//
// A value hashes as XXH64 (seed 0) of its little-endian bytes: fixed-width values by their
// bits (so floats hash by bit pattern, matching Arrow's total-order equality) and strings by
// their UTF-8 bytes. Columns combine left to right with `hash_combine`; a NULL contributes
// SPATE_NULL_HASH. `spate_kernels::reference::hash` is the bit-exact CPU twin.
#pragma once
#include "common/prelude.cuh"

#define SPATE_NULL_HASH 0x9ae16a3b2f90404full

namespace spate {

constexpr u64 kXxP1 = 11400714785074694791ull;
constexpr u64 kXxP2 = 14029467366897019727ull;
constexpr u64 kXxP3 = 1609587929392839161ull;
constexpr u64 kXxP4 = 9650029242287828579ull;
constexpr u64 kXxP5 = 2870177450012600261ull;

__device__ __forceinline__ u64 rotl64(u64 x, u32 r) {
    return (x << r) | (x >> (64 - r));
}

__device__ __forceinline__ u64 xx_round(u64 acc, u64 input) {
    acc += input * kXxP2;
    acc = rotl64(acc, 31);
    return acc * kXxP1;
}

__device__ __forceinline__ u64 xx_merge(u64 acc, u64 v) {
    acc ^= xx_round(0, v);
    return acc * kXxP1 + kXxP4;
}

__device__ __forceinline__ u64 xx_avalanche(u64 h) {
    h ^= h >> 33;
    h *= kXxP2;
    h ^= h >> 29;
    h *= kXxP3;
    h ^= h >> 32;
    return h;
}

// Byte loads only: string data has no alignment, and GPUs fault on misaligned wide loads.
__device__ __forceinline__ u64 load_le(const u8* p, u32 bytes) {
    u64 v = 0;
    for (u32 i = 0; i < bytes; ++i) v |= (u64)p[i] << (8 * i);
    return v;
}

// XXH64 with seed 0 of `len` bytes at `p`.
__device__ inline u64 xxh64_bytes(const u8* p, u64 len) {
    u64 h;
    u64 i = 0;
    if (len >= 32) {
        u64 v1 = kXxP1 + kXxP2, v2 = kXxP2, v3 = 0, v4 = 0 - kXxP1;
        for (; i + 32 <= len; i += 32) {
            v1 = xx_round(v1, load_le(p + i, 8));
            v2 = xx_round(v2, load_le(p + i + 8, 8));
            v3 = xx_round(v3, load_le(p + i + 16, 8));
            v4 = xx_round(v4, load_le(p + i + 24, 8));
        }
        h = rotl64(v1, 1) + rotl64(v2, 7) + rotl64(v3, 12) + rotl64(v4, 18);
        h = xx_merge(h, v1);
        h = xx_merge(h, v2);
        h = xx_merge(h, v3);
        h = xx_merge(h, v4);
    } else {
        h = kXxP5;
    }
    h += len;
    for (; i + 8 <= len; i += 8) {
        h ^= xx_round(0, load_le(p + i, 8));
        h = rotl64(h, 27) * kXxP1 + kXxP4;
    }
    if (i + 4 <= len) {
        h ^= load_le(p + i, 4) * kXxP1;
        h = rotl64(h, 23) * kXxP2 + kXxP3;
        i += 4;
    }
    for (; i < len; ++i) {
        h ^= (u64)p[i] * kXxP5;
        h = rotl64(h, 11) * kXxP1;
    }
    return xx_avalanche(h);
}

// XXH64 with seed 0 of a fixed-width value of `bytes` (1, 2, 4 or 8) bytes held in `v`.
__device__ __forceinline__ u64 xxh64_word(u64 v, u32 bytes) {
    u64 h = kXxP5 + bytes;
    if (bytes == 8) {
        h ^= xx_round(0, v);
        return xx_avalanche(rotl64(h, 27) * kXxP1 + kXxP4);
    }
    u32 i = 0;
    if (bytes >= 4) {
        h ^= (v & 0xffffffffull) * kXxP1;
        h = rotl64(h, 23) * kXxP2 + kXxP3;
        i = 4;
    }
    for (; i < bytes; ++i) {
        h ^= ((v >> (8 * i)) & 0xff) * kXxP5;
        h = rotl64(h, 11) * kXxP1;
    }
    return xx_avalanche(h);
}

// XXH64 with seed 0 of a 16-byte value (low word first).
__device__ __forceinline__ u64 xxh64_u128(u128 v) {
    u64 h = kXxP5 + 16;
    h ^= xx_round(0, v.lo);
    h = rotl64(h, 27) * kXxP1 + kXxP4;
    h ^= xx_round(0, v.hi);
    h = rotl64(h, 27) * kXxP1 + kXxP4;
    return xx_avalanche(h);
}

// Folds the hash of the next column into a row's running hash (order-dependent).
__device__ __forceinline__ u64 hash_combine(u64 seed, u64 h) {
    return seed ^ (h + 0x9e3779b97f4a7c15ull + (seed << 6) + (seed >> 2));
}

// Group and join keys compare floats as DataFusion's group values do: by bit pattern after
// folding -0.0 into +0.0 (so each NaN payload is its own group).
__device__ __forceinline__ u32 key_bits(f32 v) {
    return v == 0.0f ? 0u : __float_as_uint(v);
}

__device__ __forceinline__ u64 key_bits(f64 v) {
    return v == 0.0 ? 0ull : (u64)__double_as_longlong(v);
}

}  // namespace spate
