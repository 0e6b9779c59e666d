// casts.cuh: casts as Arrow's cast kernels compute them, for generated expression kernels.
// A cast that can fail reports it through `*bad` and returns 0; the generated code then fails
// the query with Arrow's message, or yields NULL for a safe cast (`TRY_CAST`).
#pragma once
#include "common/prelude.cuh"
#include "common/checked.cuh"

namespace spate {

// An integer (or a decimal's whole part, already divided) narrowed to T: `*bad` outside
// [lo, hi].
template <typename T>
__device__ __forceinline__ T narrow_int(i128 w, i128 lo, i128 hi, bool* bad) {
    *bad = w < lo || w > hi;
    return *bad ? (T)0 : (T)w;
}

// A float to the integer type T as NumCast does: truncated toward zero, which must lie in
// [lo, hi) (NaN never does).
template <typename T>
__device__ __forceinline__ T float_to_int(f64 x, f64 lo, f64 hi, bool* bad) {
    const f64 t = trunc(x);
    *bad = !(t >= lo && t < hi);
    return *bad ? (T)0 : (T)t;
}

// A decimal's whole part: the value divided by 10^scale (`divisor`), truncated toward zero.
__device__ __forceinline__ i128 dec_whole(i128 v, i128 divisor) {
    return v / divisor;
}

// A decimal as a double, as Arrow's cast: the unscaled value as a float divided by 10^scale as
// a float.
__device__ __forceinline__ f64 dec_to_f64(i128 v, f64 divisor) {
    return (f64)v / divisor;
}

// An integer or decimal times a power of ten the planner proved leaves room for every value
// (integer to decimal, decimal to a larger scale).
__device__ __forceinline__ i128 dec_scale_up(i128 v, i128 mul) {
    return v * mul;
}

// A decimal rescaled down by `divisor` (a power of ten), rounding half away from zero, as
// Arrow's rescale.
__device__ __forceinline__ i128 dec_rescale_down(i128 v, i128 divisor) {
    i128 r = v / divisor;
    const i128 m = v % divisor;
    const i128 a = m < 0 ? -m : m;
    // a * 2 >= divisor, without overflowing at divisor = 10^38.
    if (a >= divisor - a) r += v < 0 ? -1 : 1;
    return r;
}

// Whether a decimal's unscaled value has at most `precision` digits: |v| < limit = 10^precision.
__device__ __forceinline__ bool dec_fits(i128 v, i128 limit) {
    return v < limit && v > -limit;
}

// An integer or decimal to a decimal: multiplied by `up` (checked) when the scale grows, or
// rescaled down by `down` (> 1) when it shrinks; `*bad` when that overflows an i128 or the
// result has more digits than the target precision allows (`limit`, 10^precision).
__device__ inline i128 to_decimal(i128 v, i128 up, i128 down, i128 limit, bool* bad) {
    i128 r;
    bool overflow = false;
    if (down > 1) {
        r = dec_rescale_down(v, down);
    } else {
        overflow = mul_overflows(v, up, &r);
    }
    *bad = overflow || !dec_fits(r, limit);
    return *bad ? (i128)0 : r;
}

// A float to a decimal, as Arrow's cast: round(x * 10^scale) half away from zero (`mul`), which
// must fit an i128 (`*range` otherwise) and then the precision (`limit`, 10^precision). `*bad`
// for either.
__device__ inline i128 float_to_decimal(f64 x, f64 mul, i128 limit, bool* range, bool* bad) {
    const f64 r = round(mul * x);
    const f64 bound = 170141183460469231731687303715884105728.0;  // 2^127
    *range = !(r >= -bound && r < bound);
    const i128 v = *range ? (i128)0 : f64_to_i128(r);
    *bad = *range || !dec_fits(v, limit);
    return *bad ? (i128)0 : v;
}

// A timestamp to a coarser unit: divided, truncating toward zero.
__device__ __forceinline__ i64 timestamp_coarser(i64 v, i64 by) {
    return v / by;
}

// A timestamp to a finer unit: multiplied; `*bad` (and 0) when the product leaves i64.
__device__ __forceinline__ i64 timestamp_finer(i64 v, i64 by, bool* bad) {
    const i128 w = (i128)v * (i128)by;
    *bad = w < (i128)(-9223372036854775807ll - 1) || w > (i128)9223372036854775807ll;
    return *bad ? (i64)0 : (i64)w;
}

}  // namespace spate
