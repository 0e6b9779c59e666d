// math.cuh: DataFusion's float math functions (sqrt, cbrt, ln, log10, log2, log, exp, power,
// signum, trunc) for generated expressions, on Float32 and Float64 as Rust's f32/f64 methods
// compute them, with DataFusion's own rules: sqrt fails on a negative number, power on zero
// raised to a negative power, `log(x)` is ln(x) / ln(10) (Rust's `log(10)`, not log10), and
// signum and trunc of either zero are +0. NaN results carry the bits an x86-64 CPU gives (order.cuh's cpu_nan). On the
// emulator these are the host's libm calls, as on the CPU; a GPU's ln, exp and pow may differ in
// the last place (sqrt is exact on both).
#pragma once
#include "common/prelude.cuh"
#include "common/order.cuh"

namespace spate {

// The libm function of each width by name (logf for f32, log for f64), as Rust's f32 and f64
// methods call them: never a double computation rounded to float.
#define SPATE_LIBM_PAIR(name)                                              \
    __device__ __forceinline__ f32 libm_##name(f32 x) { return name##f(x); } \
    __device__ __forceinline__ f64 libm_##name(f64 x) { return name(x); }
SPATE_LIBM_PAIR(sqrt)
SPATE_LIBM_PAIR(cbrt)
SPATE_LIBM_PAIR(log)
SPATE_LIBM_PAIR(log10)
SPATE_LIBM_PAIR(log2)
SPATE_LIBM_PAIR(exp)
SPATE_LIBM_PAIR(trunc)
#undef SPATE_LIBM_PAIR
__device__ __forceinline__ f32 libm_pow(f32 x, f32 y) { return powf(x, y); }
__device__ __forceinline__ f64 libm_pow(f64 x, f64 y) { return pow(x, y); }

template <typename F>
__device__ __forceinline__ F float_sqrt(F x) {
    return cpu_nan(libm_sqrt(x), x, x);
}

template <typename F>
__device__ __forceinline__ F float_cbrt(F x) {
    return cpu_nan(libm_cbrt(x), x, x);
}

template <typename F>
__device__ __forceinline__ F float_ln(F x) {
    return cpu_nan(libm_log(x), x, x);
}

template <typename F>
__device__ __forceinline__ F float_log10(F x) {
    return cpu_nan(libm_log10(x), x, x);
}

template <typename F>
__device__ __forceinline__ F float_log2(F x) {
    return cpu_nan(libm_log2(x), x, x);
}

// log(x) of one argument: Rust's x.log(10.0), ln(x) / ln(10).
template <typename F>
__device__ __forceinline__ F float_log_ten(F x) {
    return cpu_nan((F)(libm_log(x) / libm_log((F)10)), x, x);
}

template <typename F>
__device__ __forceinline__ F float_exp(F x) {
    return cpu_nan(libm_exp(x), x, x);
}

template <typename F>
__device__ __forceinline__ F float_power(F x, F y) {
    return cpu_nan(libm_pow(x, y), x, y);
}

// DataFusion's signum: 0 for either zero, else Rust's (±1, NaN for NaN).
template <typename F>
__device__ __forceinline__ F float_signum(F x) {
    if (x == (F)0) return (F)0;
    if (x != x) return cpu_nan(x, x, x);
    return x < (F)0 ? (F)-1 : (F)1;
}

template <typename F>
__device__ __forceinline__ F float_trunc(F x) {
    if (x == (F)0) return (F)0;
    return cpu_nan(libm_trunc(x), x, x);
}

// Where DataFusion's sqrt fails: a number below zero (-0.0 and NaN are not).
template <typename F>
__device__ __forceinline__ bool float_sqrt_fails(F x) {
    return x < (F)0;
}

// Where DataFusion's power fails: zero raised to a negative power.
template <typename F>
__device__ __forceinline__ bool float_power_fails(F x, F y) {
    return x == (F)0 && y < (F)0;
}

}  // namespace spate
