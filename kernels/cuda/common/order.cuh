// order.cuh: IEEE total order for floats, the order Arrow's comparison and sort kernels (and so
// DataFusion) use: -NaN < -inf < ... < -0.0 < +0.0 < ... < +inf < +NaN, and NaN == NaN; and the
// comparison key DataFusion's SQL comparisons use (total order after -0.0 becomes +0.0).
#pragma once
#include "common/prelude.cuh"

namespace spate {

__device__ __forceinline__ u32 total_order(f32 v) {
    u32 b = __float_as_uint(v);
    return (b & 0x80000000u) ? ~b : b | 0x80000000u;
}

__device__ __forceinline__ u64 total_order(f64 v) {
    u64 b = (u64)__double_as_longlong(v);
    return (b & 0x8000000000000000ull) ? ~b : b | 0x8000000000000000ull;
}

// The order of SQL comparisons in DataFusion: -0.0 is first normalised to +0.0 (so the two
// compare equal), then values compare in total order (NaN equals NaN and sorts above +inf).
__device__ __forceinline__ u32 compare_key(f32 v) {
    return total_order(v == 0.0f ? 0.0f : v);
}

__device__ __forceinline__ u64 compare_key(f64 v) {
    return total_order(v == 0.0 ? 0.0 : v);
}

}  // namespace spate

namespace spate {

// The NaN an x86-64 CPU (SSE) returns from `a op b`: the first NaN operand, quieted, or the
// "default NaN" (negative, quiet) when the operation itself creates one (inf - inf, 0 * inf).
// GPUs return a canonical positive NaN instead; since Arrow orders NaNs by their sign, the
// generated code passes float results through these to equal the CPU engine's bits.
__device__ __forceinline__ f64 cpu_nan(f64 r, f64 a, f64 b) {
    if (r == r) return r;
    if (a != a) return __longlong_as_double(__double_as_longlong(a) | 0x0008000000000000ll);
    if (b != b) return __longlong_as_double(__double_as_longlong(b) | 0x0008000000000000ll);
    return __longlong_as_double((i64)0xfff8000000000000ull);
}

__device__ __forceinline__ f32 cpu_nan(f32 r, f32 a, f32 b) {
    if (r == r) return r;
    if (a != a) return __uint_as_float(__float_as_uint(a) | 0x00400000u);
    if (b != b) return __uint_as_float(__float_as_uint(b) | 0x00400000u);
    return __uint_as_float(0xffc00000u);
}

}  // namespace spate
