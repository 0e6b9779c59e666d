// reduce.cu: SUM, MIN, MAX and COUNT over whole columns and over segments, skipping NULLs.
//
// Accumulators: sums of i32/i64 accumulate in i64 and of u32/u64 in u64, both wrapping like
// DataFusion's integer SUM; sums of f32/f64 accumulate in f64. MIN/MAX keep the input type and
// order floats by IEEE total order (NaN above +inf, -0.0 below +0.0), as Arrow's min/max do.
// Every kernel also returns how many non-null values it saw: a count of 0 means the SQL result
// is NULL. Whole-column reductions are two launches (per-block partials, then one block over
// the partials, see `spate_kernels::reduce`), so the float summation order is fixed and results
// repeat exactly from run to run.
#include "common/prelude.cuh"
#include "common/bitmap.cuh"
#include "common/block_scan.cuh"
#include "common/order.cuh"

namespace spate {

template <typename T>
struct Less {
    __device__ __forceinline__ static bool lt(T a, T b) { return a < b; }
};
template <>
struct Less<f32> {
    __device__ __forceinline__ static bool lt(f32 a, f32 b) { return total_order(a) < total_order(b); }
};
template <>
struct Less<f64> {
    __device__ __forceinline__ static bool lt(f64 a, f64 b) { return total_order(a) < total_order(b); }
};

template <typename T>
struct Limits;
template <>
struct Limits<i32> {
    __device__ __forceinline__ static i32 lowest() { return (i32)0x80000000u; }
    __device__ __forceinline__ static i32 highest() { return 0x7fffffff; }
};
template <>
struct Limits<i64> {
    __device__ __forceinline__ static i64 lowest() { return (i64)0x8000000000000000ull; }
    __device__ __forceinline__ static i64 highest() { return 0x7fffffffffffffffll; }
};
template <>
struct Limits<u32> {
    __device__ __forceinline__ static u32 lowest() { return 0; }
    __device__ __forceinline__ static u32 highest() { return 0xffffffffu; }
};
template <>
struct Limits<u64> {
    __device__ __forceinline__ static u64 lowest() { return 0; }
    __device__ __forceinline__ static u64 highest() { return 0xffffffffffffffffull; }
};
// The extremes of the total order: -NaN with every payload bit set, and +NaN likewise.
template <>
struct Limits<f32> {
    __device__ __forceinline__ static f32 lowest() { return __uint_as_float(0xffffffffu); }
    __device__ __forceinline__ static f32 highest() { return __uint_as_float(0x7fffffffu); }
};
template <>
struct Limits<f64> {
    __device__ __forceinline__ static f64 lowest() { return __longlong_as_double((i64)0xffffffffffffffffull); }
    __device__ __forceinline__ static f64 highest() { return __longlong_as_double(0x7fffffffffffffffll); }
};

template <typename T, typename A>
struct SumOp {
    typedef A Acc;
    __device__ __forceinline__ static A identity() { return A(0); }
    __device__ __forceinline__ static A lift(T v) { return (A)v; }
    __device__ __forceinline__ static A combine(A a, A b) { return a + b; }
};

template <typename T>
struct MinOp {
    typedef T Acc;
    __device__ __forceinline__ static T identity() { return Limits<T>::highest(); }
    __device__ __forceinline__ static T lift(T v) { return v; }
    __device__ __forceinline__ static T combine(T a, T b) { return Less<T>::lt(b, a) ? b : a; }
};

template <typename T>
struct MaxOp {
    typedef T Acc;
    __device__ __forceinline__ static T identity() { return Limits<T>::lowest(); }
    __device__ __forceinline__ static T lift(T v) { return v; }
    __device__ __forceinline__ static T combine(T a, T b) { return Less<T>::lt(a, b) ? b : a; }
};

// Wrapping integer sums: do signed adds in unsigned arithmetic so overflow is defined.
template <>
struct SumOp<i32, i64> {
    typedef i64 Acc;
    __device__ __forceinline__ static i64 identity() { return 0; }
    __device__ __forceinline__ static i64 lift(i32 v) { return (i64)v; }
    __device__ __forceinline__ static i64 combine(i64 a, i64 b) { return (i64)((u64)a + (u64)b); }
};
template <>
struct SumOp<i64, i64> {
    typedef i64 Acc;
    __device__ __forceinline__ static i64 identity() { return 0; }
    __device__ __forceinline__ static i64 lift(i64 v) { return v; }
    __device__ __forceinline__ static i64 combine(i64 a, i64 b) { return (i64)((u64)a + (u64)b); }
};

// One block reduces its grid-stride share of [0, n) into partials[blockIdx.x].
template <typename T, typename Op>
__device__ void reduce_column(const T* __restrict__ values, const u8* __restrict__ validity, u64 validity_offset, u64 n,
                              typename Op::Acc* __restrict__ partials, u64* __restrict__ counts) {
    typedef typename Op::Acc A;
    A acc = Op::identity();
    u64 seen = 0;
    for (u64 i = global_thread_index(); i < n; i += grid_stride()) {
        if (row_is_valid(validity, validity_offset, i)) {
            acc = Op::combine(acc, Op::lift(values[i]));
            ++seen;
        }
    }
    A total = block_reduce(acc, [](A a, A b) { return Op::combine(a, b); });
    u64 total_seen = block_reduce(seen, [](u64 a, u64 b) { return a + b; });
    if (threadIdx.x == 0) {
        partials[blockIdx.x] = total;
        if (counts != nullptr) counts[blockIdx.x] = total_seen;
    }
}

// One warp per segment: segment s is rows [seg_offsets[s], seg_offsets[s + 1]).
template <typename T, typename Op>
__device__ void reduce_segments(const T* __restrict__ values, const u8* __restrict__ validity, u64 validity_offset,
                                const u32* __restrict__ seg_offsets, u64 num_segments, typename Op::Acc* __restrict__ out,
                                u64* __restrict__ counts) {
    typedef typename Op::Acc A;
    const u64 warps_in_grid = grid_stride() / 32;
    // Every lane of a warp runs the same number of iterations (the loop bound is per warp), so
    // the shuffles below always see all 32 lanes.
    for (u64 s = global_thread_index() / 32; s < num_segments; s += warps_in_grid) {
        u32 begin = seg_offsets[s];
        u32 end = seg_offsets[s + 1];
        A acc = Op::identity();
        u64 seen = 0;
        for (u64 i = begin + lane_id(); i < end; i += 32) {
            if (row_is_valid(validity, validity_offset, i)) {
                acc = Op::combine(acc, Op::lift(values[i]));
                ++seen;
            }
        }
#pragma unroll
        for (u32 d = 16; d > 0; d >>= 1) {
            acc = Op::combine(acc, __shfl_xor_sync(SPATE_FULL_MASK, acc, (int)d));
            seen += __shfl_xor_sync(SPATE_FULL_MASK, seen, (int)d);
        }
        if (lane_id() == 0) {
            out[s] = acc;
            counts[s] = seen;
        }
    }
}

}  // namespace spate

/**
 * @brief Whole-column reduction, step 1: one partial result and count per block.
 *
 * @param values           `n` values
 * @param validity         validity bitmap, or null when no value is null
 * @param validity_offset  bit offset into `validity`
 * @param n                number of rows
 * @param partials         gridDim.x accumulators (step 2 reduces them with one block)
 * @param counts           gridDim.x non-null counts, or null when not wanted
 *
 * Launch: SPATE_BLOCK_THREADS threads, grid-stride, static shared for the block reduction.
 * Memory: caller allocates `partials` and `counts`.
 * Nulls:  skipped; counts say how many values were seen.
 * Stream: asynchronous on the launch stream.
 *
 * reduce_segments_OP_T: as above per segment, one warp per segment, grid-stride over
 * `num_segments`; `seg_offsets` holds num_segments + 1 row offsets; `out` and `counts` hold one
 * result per segment.
 */
#define SPATE_REDUCE(NAME, OP, T)                                                                                   \
    extern "C" __global__ void __launch_bounds__(SPATE_BLOCK_THREADS)                                               \
        reduce_##NAME##_##T(const T* values, const u8* validity, u64 validity_offset, u64 n, OP::Acc* partials,      \
                            u64* counts) {                                                                          \
        spate::reduce_column<T, OP>(values, validity, validity_offset, n, partials, counts);                        \
    }                                                                                                               \
    SPATE_EXPORT(reduce_##NAME##_##T)                                                                               \
    extern "C" __global__ void __launch_bounds__(SPATE_BLOCK_THREADS)                                               \
        reduce_segments_##NAME##_##T(const T* values, const u8* validity, u64 validity_offset, const u32* seg_offsets, \
                                     u64 num_segments, OP::Acc* out, u64* counts) {                                 \
        spate::reduce_segments<T, OP>(values, validity, validity_offset, seg_offsets, num_segments, out, counts);   \
    }                                                                                                               \
    SPATE_EXPORT(reduce_segments_##NAME##_##T)

#define SPATE_REDUCE_TYPE(T, SUM_ACC)                      \
    SPATE_REDUCE(sum, spate::SumOp<T COMMA SUM_ACC>, T)    \
    SPATE_REDUCE(min, spate::MinOp<T>, T)                  \
    SPATE_REDUCE(max, spate::MaxOp<T>, T)

#define COMMA ,
SPATE_REDUCE_TYPE(i32, i64)
SPATE_REDUCE_TYPE(i64, i64)
SPATE_REDUCE_TYPE(u32, u64)
SPATE_REDUCE_TYPE(u64, u64)
SPATE_REDUCE_TYPE(f32, f64)
SPATE_REDUCE_TYPE(f64, f64)
#undef COMMA

/**
 * @brief Counts the set bits of a bitmap (the non-null rows of a column): step 1 of 2.
 *
 * @param bits      the bitmap
 * @param offset    bit offset of row 0
 * @param n         number of rows
 * @param partials  gridDim.x partial counts; step 2 is reduce_sum_u64 over them with one block
 *
 * Launch: SPATE_BLOCK_THREADS threads, grid-stride, static shared for the block reduction.
 * Memory: caller allocates `partials`.
 * Nulls:  this counts them.
 * Stream: asynchronous on the launch stream.
 */
extern "C" __global__ void __launch_bounds__(SPATE_BLOCK_THREADS) count_set_bits(const u8* bits, u64 offset, u64 n, u64* partials) {
    u64 seen = 0;
    for (u64 i = spate::global_thread_index(); i < n; i += spate::grid_stride()) seen += spate::bit_is_set(bits, offset, i);
    u64 total = spate::block_reduce(seen, [](u64 a, u64 b) { return a + b; });
    if (threadIdx.x == 0) partials[blockIdx.x] = total;
}
SPATE_EXPORT(count_set_bits)
