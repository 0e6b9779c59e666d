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
