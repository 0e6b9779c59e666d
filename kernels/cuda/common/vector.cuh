// vector.cuh: distances between embeddings for generated expressions, computed as
// spate::vector::score computes them on the CPU: accumulated in f32, one element after the other
// in element order, each operation rounded (kernels compile without multiply-add contraction),
// then finished in f64. So a GPU distance equals the CPU's bit for bit (a NaN is the one
// canonical NaN on both).
//
// Element codes (spate::vector::Elem::code): 0 f32, 1 f16, 2 bf16; 3 is a query vector (f32, no
// NULL elements). A NULL element is held as a NaN with a payload of its own
// (Elem::null_bits): a vector holding one has no distance (NULL).
// Metric codes (spate::vector::Metric::code): 0 cosine distance, 1 inner product, 2 Euclidean.
#pragma once
#include "common/prelude.cuh"

namespace spate {

// An IEEE half's bits as the f32 of the same value (exact).
__device__ __forceinline__ f32 half_bits_to_f32(u32 h) {
    const u32 sign = (h & 0x8000u) << 16;
    const u32 exp = (h >> 10) & 0x1Fu;
    u32 man = h & 0x3FFu;
    u32 bits;
    if (exp == 0u) {
        if (man == 0u) {
            bits = sign;
        } else {
            // A subnormal: shift the mantissa up to its leading one.
            u32 shifts = 0u;
            while ((man & 0x400u) == 0u) {
                man <<= 1;
                ++shifts;
            }
            bits = sign | ((113u - shifts) << 23) | ((man & 0x3FFu) << 13);
        }
    } else if (exp == 0x1Fu) {
        bits = sign | 0x7F800000u | (man << 13);
    } else {
        bits = sign | ((exp + 112u) << 23) | (man << 13);
    }
    return __uint_as_float(bits);
}

// Element j of a vector of element type E at p; sets *hole when it is a NULL element.
template <u32 E>
__device__ __forceinline__ f32 vec_element(const u8* p, u64 j, bool* hole) {
    if (E == 0u || E == 3u) {
        const u32 b = ((const u32*)p)[j];
        if (E == 0u && b == 0x7FC5A11Eu) *hole = true;
        return __uint_as_float(b);
    }
    const u32 b = ((const u16*)p)[j];
    if (E == 1u) {
        if (b == 0x7E5Bu) *hole = true;
        return half_bits_to_f32(b);
    }
    if (b == 0x7FDBu) *hole = true;
    return __uint_as_float(b << 16);
}

// The distance M between the d-element vectors at a (element type EA) and b (EB); sets *null
// (and returns 0) when either holds a NULL element, or, for the cosine distance, when either's
// sum of squares is 0 in f32. A NaN result is the canonical positive quiet NaN, as
// spate::vector::score returns it (a CPU carries input NaN payloads through, a GPU does not).
template <u32 M, u32 EA, u32 EB>
__device__ inline f64 vec_distance_raw(const u8* a, const u8* b, u64 d, bool* null) {
    bool hole = false;
    f32 dot = 0.0f, sa = 0.0f, sb = 0.0f, sum = 0.0f;
    for (u64 j = 0; j < d; ++j) {
        const f32 x = vec_element<EA>(a, j, &hole);
        const f32 y = vec_element<EB>(b, j, &hole);
        if (M == 2u) {
            const f32 diff = x - y;
            sum = sum + diff * diff;
        } else {
            dot = dot + x * y;
            if (M == 0u) {
                sa = sa + x * x;
                sb = sb + y * y;
            }
        }
    }
    if (hole) {
        *null = true;
        return 0.0;
    }
    if (M == 0u) {
        if (sa == 0.0f || sb == 0.0f) {
            *null = true;
            return 0.0;
        }
        return 1.0 - (f64)dot / (sqrt((f64)sa) * sqrt((f64)sb));
    }
    if (M == 1u) return (f64)dot;
    return sqrt((f64)sum);
}

template <u32 M, u32 EA, u32 EB>
__device__ inline f64 vec_distance(const u8* a, const u8* b, u64 d, bool* null) {
    const f64 r = vec_distance_raw<M, EA, EB>(a, b, d, null);
    return r != r ? __longlong_as_double(0x7FF8000000000000ll) : r;
}

}  // namespace spate
