// arith.cuh: SQL arithmetic as DataFusion's CPU kernels compute it, for generated expression
// kernels (core/src/expr/emit.rs prints calls to these; it writes no arithmetic rule itself).
// - Integer + - * and negation wrap on overflow (two's complement), as DataFusion's do.
// - Integer / and % fail on a zero divisor, and MIN / -1 overflows (MIN % -1 is 0), as Arrow's
//   checked kernels; the helpers report the failure and never divide by zero themselves.
// - Float results carry the NaN bits an x86-64 CPU produces (order.cuh's cpu_nan).
// - Decimals are scaled i128s: the caller passes the powers of ten that bring both sides to the
//   result scale.
#pragma once
#include "common/prelude.cuh"
#include "common/checked.cuh"
#include "common/order.cuh"

namespace spate {

// The unsigned type of the same width (`type`), and the type a product of two of them is
// computed in without C's promotion to a signed int (`wide`).
template <typename T>
struct unsigned_twin;
template <>
struct unsigned_twin<i8> {
    typedef u8 type;
    typedef u32 wide;
};
template <>
struct unsigned_twin<u8> {
    typedef u8 type;
    typedef u32 wide;
};
template <>
struct unsigned_twin<i16> {
    typedef u16 type;
    typedef u32 wide;
};
template <>
struct unsigned_twin<u16> {
    typedef u16 type;
    typedef u32 wide;
};
template <>
struct unsigned_twin<i32> {
    typedef u32 type;
    typedef u32 wide;
};
template <>
struct unsigned_twin<u32> {
    typedef u32 type;
    typedef u32 wide;
};
template <>
struct unsigned_twin<i64> {
    typedef u64 type;
    typedef u64 wide;
};
template <>
struct unsigned_twin<u64> {
    typedef u64 type;
    typedef u64 wide;
};
template <>
struct unsigned_twin<i128> {
    typedef u128i type;
    typedef u128i wide;
};

template <typename T>
__device__ __forceinline__ T wrapping_add(T a, T b) {
    typedef typename unsigned_twin<T>::wide W;
    typedef typename unsigned_twin<T>::type U;
    return (T)(U)((W)(U)a + (W)(U)b);
}

template <typename T>
__device__ __forceinline__ T wrapping_sub(T a, T b) {
    typedef typename unsigned_twin<T>::wide W;
    typedef typename unsigned_twin<T>::type U;
    return (T)(U)((W)(U)a - (W)(U)b);
}

template <typename T>
__device__ __forceinline__ T wrapping_mul(T a, T b) {
    typedef typename unsigned_twin<T>::wide W;
    typedef typename unsigned_twin<T>::type U;
    return (T)(U)((W)(U)a * (W)(U)b);
}

// Arrow's neg_wrapping: -MIN is MIN.
template <typename T>
__device__ __forceinline__ T wrapping_neg(T a) {
    typedef typename unsigned_twin<T>::wide W;
    typedef typename unsigned_twin<T>::type U;
    return (T)(U)((W)0 - (W)(U)a);
}

// Whether a / b is a signed MIN / -1, whose quotient does not fit.
template <typename T>
__device__ __forceinline__ bool min_over_minus_one(T a, T b) {
    typedef typename unsigned_twin<T>::type U;
    if ((T)-1 > (T)0) return false;  // unsigned
    const T min = (T)((U)1 << (sizeof(T) * 8 - 1));
    return a == min && b == (T)-1;
}

// Integer a / b; `*zero` for a zero divisor, `*overflow` for MIN / -1, and 0 then.
template <typename T>
__device__ __forceinline__ T checked_div(T a, T b, bool* zero, bool* overflow) {
    *zero = b == (T)0;
    *overflow = min_over_minus_one(a, b);
    return (*zero || *overflow) ? (T)0 : (T)(a / b);
}

// Integer a % b; `*zero` for a zero divisor (0 then). MIN % -1 is 0.
template <typename T>
__device__ __forceinline__ T checked_rem(T a, T b, bool* zero) {
    *zero = b == (T)0;
    return (*zero || min_over_minus_one(a, b)) ? (T)0 : (T)(a % b);
}

template <typename F>
__device__ __forceinline__ F float_add(F a, F b) {
    return cpu_nan((F)(a + b), a, b);
}

template <typename F>
__device__ __forceinline__ F float_sub(F a, F b) {
    return cpu_nan((F)(a - b), a, b);
}

template <typename F>
__device__ __forceinline__ F float_mul(F a, F b) {
    return cpu_nan((F)(a * b), a, b);
}

template <typename F>
__device__ __forceinline__ F float_div(F a, F b) {
    return cpu_nan((F)(a / b), a, b);
}

// Rust's (and so Arrow's) float `%`: C's fmod.
template <typename F>
__device__ __forceinline__ F float_rem(F a, F b) {
    return cpu_nan((F)fmod(a, b), a, b);
}

// Decimal a + b and a - b with both sides brought to the result scale (`a_mul`, `b_mul`:
// powers of ten), where the planner proved the result fits an i128.
__device__ __forceinline__ i128 dec_add(i128 a, i128 b, i128 a_mul, i128 b_mul) {
    return a * a_mul + b * b_mul;
}

__device__ __forceinline__ i128 dec_sub(i128 a, i128 b, i128 a_mul, i128 b_mul) {
    return a * a_mul - b * b_mul;
}

// Decimal a * b at scale s1 + s2, where the planner proved the product fits an i128.
__device__ __forceinline__ i128 dec_mul(i128 a, i128 b) {
    return a * b;
}

// Decimal a / b as Arrow's: (a * a_mul) / (b * b_mul), truncated toward zero. `*overflow` when
// a scaling overflows i128 or the quotient is MIN / -1; else `*zero` for a zero divisor. 0 then.
__device__ inline i128 dec_div(i128 a, i128 b, i128 a_mul, i128 b_mul, bool* zero, bool* overflow) {
    i128 l, r;
    const bool scaling = mul_overflows(a, a_mul, &l) || mul_overflows(b, b_mul, &r);
    *zero = !scaling && r == 0;
    *overflow = scaling || min_over_minus_one(l, r);
    return (*zero || *overflow) ? (i128)0 : l / r;
}

// Decimal a % b as Arrow's: both sides at the larger scale, the sign of the dividend.
// `*overflow` when a scaling overflows; else `*zero` for a zero divisor. 0 then.
__device__ inline i128 dec_rem(i128 a, i128 b, i128 a_mul, i128 b_mul, bool* zero, bool* overflow) {
    i128 l, r;
    *overflow = mul_overflows(a, a_mul, &l) || mul_overflows(b, b_mul, &r);
    *zero = !*overflow && r == 0;
    return (*zero || *overflow || r == -1) ? (i128)0 : l % r;
}

// Bitwise operators on integers, as Arrow's kernels. Shifts wrap: the amount is taken modulo the
// width (Rust's wrapping_shl/shr over `b as usize as u32`); `>>` is arithmetic for signed types.
template <typename T>
__device__ __forceinline__ T bit_and(T a, T b) {
    return (T)(a & b);
}

template <typename T>
__device__ __forceinline__ T bit_or(T a, T b) {
    return (T)(a | b);
}

template <typename T>
__device__ __forceinline__ T bit_xor(T a, T b) {
    return (T)(a ^ b);
}

template <typename T>
__device__ __forceinline__ u32 shift_amount(T b) {
    return (u32)(u64)(i64)b & (u32)(sizeof(T) * 8 - 1);
}

template <typename T>
__device__ __forceinline__ T bit_shl(T a, T b) {
    typedef typename unsigned_twin<T>::wide W;
    typedef typename unsigned_twin<T>::type U;
    return (T)(U)((W)(U)a << shift_amount(b));
}

template <typename T>
__device__ __forceinline__ T bit_shr(T a, T b) {
    return (T)(a >> shift_amount(b));
}

// abs of a signed integer: `*overflow` (and MIN) for MIN, as Rust's checked_abs.
template <typename T>
__device__ __forceinline__ T checked_abs(T a, bool* overflow) {
    typedef typename unsigned_twin<T>::type U;
    const T min = (T)((U)1 << (sizeof(T) * 8 - 1));
    *overflow = a == min;
    return a < (T)0 && !*overflow ? (T)-a : a;
}

// abs of a decimal: wrapping (abs(MIN) is MIN), as Arrow's wrapping_abs.
__device__ __forceinline__ i128 wrapping_abs(i128 a) {
    return a < 0 ? wrapping_neg<i128>(a) : a;
}

// abs of a float: the sign bit cleared (NaN's too), as Rust's.
__device__ __forceinline__ f64 float_abs(f64 a) {
    return __longlong_as_double(__double_as_longlong(a) & 0x7fffffffffffffffll);
}

__device__ __forceinline__ f32 float_abs(f32 a) {
    return __uint_as_float(__float_as_uint(a) & 0x7fffffffu);
}

// floor and ceil of a float, as Rust's: a NaN comes back quieted, with its sign and payload.
template <typename F>
__device__ __forceinline__ F float_floor(F x) {
    return cpu_nan((F)floor(x), x, x);
}

template <typename F>
__device__ __forceinline__ F float_ceil(F x) {
    return cpu_nan((F)ceil(x), x, x);
}

// round(x, dp) on a float as DataFusion's: (x * factor).round() / factor with factor = 10^dp,
// rounding half away from zero. A NaN product comes back as it is, as the CPU's round and
// division pass it through.
template <typename F>
__device__ __forceinline__ F round_float(F x, F factor) {
    const F m = float_mul<F>(x, factor);
    if (m != m) return m;
    return float_div<F>((F)round(m), factor);
}

}  // namespace spate
