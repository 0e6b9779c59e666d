// checked.cuh: 128-bit integer arithmetic that reports overflow, for Decimal128 expressions
// whose result may not fit (Arrow's checked kernels raise "Arithmetic overflow" there, and the
// GPU must fail the same query).
#pragma once
#include "common/prelude.cuh"

namespace spate {

// a + b; true when the exact sum does not fit an i128.
__device__ __forceinline__ bool add_overflows(i128 a, i128 b, i128* out) {
    const i128 r = (i128)((u128i)a + (u128i)b);
    *out = r;
    return ((a ^ r) & (b ^ r)) < 0;
}

// a - b; true when the exact difference does not fit an i128.
__device__ __forceinline__ bool sub_overflows(i128 a, i128 b, i128* out) {
    const i128 r = (i128)((u128i)a - (u128i)b);
    *out = r;
    return ((a ^ b) & (a ^ r)) < 0;
}

// a * b; true when the exact product does not fit an i128. Multiplies the magnitudes as 64-bit
// halves, so no 128-bit division is needed.
__device__ inline bool mul_overflows(i128 a, i128 b, i128* out) {
    const bool negative = (a < 0) != (b < 0);
    const u128i ua = a < 0 ? (u128i)0 - (u128i)a : (u128i)a;
    const u128i ub = b < 0 ? (u128i)0 - (u128i)b : (u128i)b;
    const u64 ah = (u64)(ua >> 64), al = (u64)ua, bh = (u64)(ub >> 64), bl = (u64)ub;
    *out = (i128)((u128i)a * (u128i)b);
    if (ah != 0 && bh != 0) return true;
    const u128i low = (u128i)al * (u128i)bl;
    const u128i cross = (u128i)ah * (u128i)bl + (u128i)al * (u128i)bh;  // one term is zero
    if ((cross >> 64) != 0) return true;
    const u128i magnitude = low + (cross << 64);
    if (magnitude < low) return true;
    const u128i limit = negative ? ((u128i)1 << 127) : (((u128i)1 << 127) - 1);
    return magnitude > limit;
}

}  // namespace spate

namespace spate {

// An integral double with |x| < 2^127 as an i128, exactly (split into 64-bit halves: dividing
// by 2^64 and multiplying back are exact in binary floating point).
__device__ inline i128 f64_to_i128(f64 x) {
    const bool negative = x < 0.0;
    const f64 a = negative ? -x : x;
    const f64 two64 = 18446744073709551616.0;
    const u64 hi = (u64)(a / two64);
    const u64 lo = (u64)(a - (f64)hi * two64);
    const u128i m = ((u128i)hi << 64) | (u128i)lo;
    return negative ? (i128)((u128i)0 - m) : (i128)m;
}

}  // namespace spate
