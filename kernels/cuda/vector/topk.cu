// topk.cu: `vector_topk`, the k items nearest to each of many query vectors, without the
// distance matrix.
//
// Three steps, all on the device, no readback between them:
// 1. vector_topk_tiles: one block per (tile of SPATE_TILE items, query). It scores the tile's
//    items against the query (vector.cuh, the CPU's arithmetic) into shared memory, selects
//    the tile's k nearest with a block radix select, and writes them as candidates.
// 2. vector_topk_merge: one block per query. It selects the k nearest among the query's
//    running best (from earlier item batches) and the candidates of step 1, into the other
//    half of a ping-pong pair of running bests.
// 3. vector_topk_finish: one block per query. It sorts the running best (a bitonic sort in
//    place) and writes the output rows: query, item, rank (from 1), distance.
//
// The same steps pre-select rows for `ORDER BY <distance> LIMIT k` (core/src/exec/nearest.rs):
// one query, the keys in the sort's own order (order_key's orders 1-4), and, instead of step
// 3, vector_topk_rows, which writes the kept rows' indices in row order.
//
// Order. An entry is the pair (key, item): `key` is the distance in IEEE total order
// (reversed for the inner product, where larger is nearer), `item` the item's position. The
// pairs are unique, so "the k smallest pairs" is exact and ties in distance keep the earlier
// item. Nearest first (order 0), an item whose distance is NULL or NaN has no entry; in an
// SQL order every row has one (NULLs at their end). The select walks the 128-bit pair
// one byte at a time from the top, and stops at the first byte where the bin that holds the
// k-th entry is wanted whole (usually within the distance's bytes).
#include "common/prelude.cuh"
#include "common/bitmap.cuh"
#include "common/order.cuh"
#include "common/vector.cuh"

namespace spate {

// No entry (never a distance's key: the largest key of a number is +inf's).
#define SPATE_TOPK_NONE 0xFFFFFFFFFFFFFFFFull

// The select key of distance `d` under metric M: unsigned ascending is nearest first.
template <u32 M>
__device__ __forceinline__ u64 topk_key(f64 d) {
    const u64 t = total_order(d);
    return M == 1u ? ~t : t;
}

// The select key of a row under `order` (null: the row has no distance):
// 0: nearest first (topk_key); a NULL or NaN distance has no entry;
// 1-4: an SQL sort of the distance, ASC NULLS LAST, ASC NULLS FIRST, DESC NULLS LAST,
//      DESC NULLS FIRST, in total order (NaN above every number), NULLs at their end.
template <u32 M>
__device__ __forceinline__ u64 order_key(f64 d, bool null, u32 order) {
    if (order == 0u) return (null || d != d) ? SPATE_TOPK_NONE : topk_key<M>(d);
    const bool nulls_first = order == 2u || order == 4u;
    if (null) return nulls_first ? 0ull : SPATE_TOPK_NONE - 1ull;
    const u64 t = total_order(d);
    return order >= 3u ? ~t : t;
}

// The distance whose select key under metric `metric` is `key` (the inverse of topk_key).
__device__ __forceinline__ f64 topk_distance(u64 key, u32 metric) {
    const u64 t = metric == 1u ? ~key : key;
    const u64 bits = (t & 0x8000000000000000ull) ? (t & 0x7FFFFFFFFFFFFFFFull) : ~t;
    return __longlong_as_double((i64)bits);
}

__device__ __forceinline__ bool pair_at_most(u64 hi, u64 lo, u64 bound_hi, u64 bound_lo) {
    return hi < bound_hi || (hi == bound_hi && lo <= bound_lo);
}

// Block-wide: the largest pair among the k smallest of the `n` entries that `at(i, &hi, &lo)`
// yields (it returns false where index i holds no entry), in *bound_hi/*bound_lo of every
// thread; (NONE, NONE) when there are at most k entries (all are kept). Every thread of the
// block calls it.
template <typename At>
__device__ void topk_bound(u64 n, u32 k, At at, u64* bound_hi, u64* bound_lo) {
    __shared__ u32 hist[256];
    __shared__ u32 s_entries;
    __shared__ u64 s_hi, s_lo;
    __shared__ u32 s_need, s_done;
    if (threadIdx.x == 0) {
        s_entries = 0;
        s_hi = 0;
        s_lo = 0;
        s_need = k;
        s_done = 0;
    }
    __syncthreads();
    u32 mine = 0;
    for (u64 i = threadIdx.x; i < n; i += blockDim.x) {
        u64 hi, lo;
        if (at(i, &hi, &lo)) ++mine;
    }
    if (mine != 0) atomicAdd(&s_entries, mine);
    __syncthreads();
    if (s_entries <= k) {
        *bound_hi = SPATE_TOPK_NONE;
        *bound_lo = SPATE_TOPK_NONE;
        __syncthreads();
        return;
    }
    // Digit 15 is the key's top byte, digit 0 the item's bottom byte.
    for (int digit = 15; digit >= 0; --digit) {
        for (u32 b = threadIdx.x; b < 256; b += blockDim.x) hist[b] = 0;
        __syncthreads();
        const bool in_key = digit >= 8;
        const u32 shift = (u32)(digit & 7) * 8u;
        const u32 above = shift + 8u;
        const u64 prefix_hi = s_hi, prefix_lo = s_lo;
        for (u64 i = threadIdx.x; i < n; i += blockDim.x) {
            u64 hi, lo;
            if (!at(i, &hi, &lo)) continue;
            bool match;
            if (in_key) {
                match = above == 64u || (hi >> above) == (prefix_hi >> above);
            } else {
                match = hi == prefix_hi && (above == 64u || (lo >> above) == (prefix_lo >> above));
            }
            if (!match) continue;
            const u64 word = in_key ? hi : lo;
            atomicAdd(&hist[(u32)((word >> shift) & 255u)], 1u);
        }
        __syncthreads();
        if (threadIdx.x == 0) {
            u32 below = 0, chosen = 255;
            for (u32 b = 0; b < 256; ++b) {
                if (below + hist[b] >= s_need) {
                    chosen = b;
                    break;
                }
                below += hist[b];
            }
            const u32 need = s_need - below;
            const u64 low_ones = shift == 0u ? 0ull : ((1ull << shift) - 1ull);
            const u64 keep_above = above == 64u ? 0ull : ~((1ull << above) - 1ull);
            const bool whole = hist[chosen] == need;
            if (in_key) {
                s_hi = (prefix_hi & keep_above) | ((u64)chosen << shift) | (whole ? low_ones : 0ull);
                if (whole) s_lo = SPATE_TOPK_NONE;
            } else {
                s_lo = (prefix_lo & keep_above) | ((u64)chosen << shift) | (whole ? low_ones : 0ull);
            }
            s_need = need;
            s_done = whole ? 1u : 0u;
        }
        __syncthreads();
        if (s_done) break;
    }
    *bound_hi = s_hi;
    *bound_lo = s_lo;
    __syncthreads();
}

template <u32 M, u32 EA, u32 EB>
__device__ void vector_topk_tiles(const u8* items, const u8* item_validity, u64 item_offset, const u32* live,
                                  u64 bound, u64 item_base, const u8* queries, const u8* query_validity,
                                  u64 query_offset, u64 query_first, u64 d, u32 k, u32 order, u32 slots,
                                  u64* cand_hi, u64* cand_lo, u32* cand_count) {
    __shared__ u64 keys[SPATE_TILE];
    __shared__ u32 s_out;
    const u64 n = live_rows(live, bound);
    const u64 tiles = gridDim.x;
    const u64 tile = blockIdx.x;
    const u64 qi = blockIdx.y;
    const u64 q = query_first + qi;
    const u64 first = tile * (u64)SPATE_TILE;
    const u64 wa = EA == 0u ? 4u : 2u;
    const u64 wb = EB == 0u ? 4u : 2u;
    const u8* query = queries + q * d * wb;
    const bool query_valid = row_is_valid(query_validity, query_offset, q);
    for (u32 j = 0; j < SPATE_ITEMS_PER_THREAD; ++j) {
        const u64 local = (u64)j * SPATE_BLOCK_THREADS + threadIdx.x;
        const u64 row = first + local;
        u64 key = SPATE_TOPK_NONE;
        if (row < n) {
            bool null = !query_valid || !row_is_valid(item_validity, item_offset, row);
            f64 distance = 0.0;
            if (!null) distance = vec_distance<M, EA, EB>(items + row * d * wa, query, d, &null);
            key = order_key<M>(distance, null, order);
        }
        keys[local] = key;
    }
    if (threadIdx.x == 0) s_out = 0;
    __syncthreads();
    const u64 base = item_base + first;
    auto at = [&](u64 i, u64* hi, u64* lo) {
        *hi = keys[i];
        *lo = base + i;
        return *hi != SPATE_TOPK_NONE;
    };
    u64 bound_hi, bound_lo;
    topk_bound((u64)SPATE_TILE, k, at, &bound_hi, &bound_lo);
    const u64 list = qi * tiles + tile;
    for (u32 j = 0; j < SPATE_ITEMS_PER_THREAD; ++j) {
        const u64 local = (u64)j * SPATE_BLOCK_THREADS + threadIdx.x;
        const u64 key = keys[local];
        if (key == SPATE_TOPK_NONE || !pair_at_most(key, base + local, bound_hi, bound_lo)) continue;
        const u32 slot = atomicAdd(&s_out, 1u);
        cand_hi[list * slots + slot] = key;
        cand_lo[list * slots + slot] = base + local;
    }
    __syncthreads();
    if (threadIdx.x == 0) cand_count[list] = s_out;
}

}  // namespace spate

/**
 * @brief Scores one tile of items against one query per block and writes the tile's k nearest
 *        as candidates (all of its scored items when there are at most k).
 *
 * @param items           the item embeddings: row i's `d` elements at `items + i * d * width`
 * @param item_validity   the items' row validity, or null when no row is NULL
 * @param item_offset     bit offset of row 0 in `item_validity`
 * @param live            the items' row count on the device, or null: `bound` items
 * @param bound           rows the items are allocated for (the grid covers them)
 * @param item_base       the position of row 0 among all items (the item of an entry)
 * @param queries         the query embeddings, laid out as the items
 * @param query_validity  the queries' row validity, or null
 * @param query_offset    bit offset of query 0 in `query_validity`
 * @param query_first     the query of grid row 0
 * @param d               elements per vector (items and queries alike)
 * @param k               entries kept per query
 * @param order           the order kept (order_key): 0 nearest first, 1-4 an SQL sort
 * @param slots           candidate slots per (query, tile): min(k, SPATE_TILE)
 * @param cand_hi         keys, `gridDim.y * gridDim.x * slots`, list (qi, tile) at
 *                        `(qi * gridDim.x + tile) * slots`
 * @param cand_lo         items, laid out as `cand_hi`
 * @param cand_count      entries written per list, `gridDim.y * gridDim.x`
 *
 * Launch: grid (ceil(rows / SPATE_TILE), queries in this launch), SPATE_BLOCK_THREADS threads;
 *         16 KiB of static shared memory for the tile's keys.
 * Memory: caller allocates the candidate lists and counts (every count is written).
 * Nulls:  a NULL item or query, a vector with a NULL element and a cosine against a zero
 *         vector have no distance: no entry for order 0 (nor has a NaN distance), a NULL
 *         at its end of an SQL sort for the others.
 * Stream: asynchronous on the launch stream.
 */
#define SPATE_VECTOR_TOPK_TILES(M, EA, EB)                                                                        \
    extern "C" __global__ void __launch_bounds__(SPATE_BLOCK_THREADS) vector_topk_tiles_##M##_##EA##_##EB(      \
        const u8* items, const u8* item_validity, u64 item_offset, const u32* live, u64 bound, u64 item_base,  \
        const u8* queries, const u8* query_validity, u64 query_offset, u64 query_first, u64 d, u32 k,          \
        u32 order, u32 slots, u64* cand_hi, u64* cand_lo, u32* cand_count) {                                   \
        spate::vector_topk_tiles<M, EA, EB>(items, item_validity, item_offset, live, bound, item_base, queries, \
                                            query_validity, query_offset, query_first, d, k, order, slots,     \
                                            cand_hi, cand_lo, cand_count);                                     \
    }                                                                                                          \
    SPATE_EXPORT(vector_topk_tiles_##M##_##EA##_##EB)

#define SPATE_VECTOR_TOPK_TILES_QUERIES(M, EA) \
    SPATE_VECTOR_TOPK_TILES(M, EA, 0)          \
    SPATE_VECTOR_TOPK_TILES(M, EA, 1)          \
    SPATE_VECTOR_TOPK_TILES(M, EA, 2)

#define SPATE_VECTOR_TOPK_TILES_ITEMS(M)     \
    SPATE_VECTOR_TOPK_TILES_QUERIES(M, 0)    \
    SPATE_VECTOR_TOPK_TILES_QUERIES(M, 1)    \
    SPATE_VECTOR_TOPK_TILES_QUERIES(M, 2)

SPATE_VECTOR_TOPK_TILES_ITEMS(0)
SPATE_VECTOR_TOPK_TILES_ITEMS(1)
SPATE_VECTOR_TOPK_TILES_ITEMS(2)

/**
 * @brief Per query, the k smallest entries among its running best and its candidate lists,
 *        written as its new running best.
 *
 * @param cand_hi, cand_lo, cand_count  the candidates of vector_topk_tiles, `tiles` lists per
 *                                      query of this launch, `slots` slots each
 * @param tiles        candidate lists per query
 * @param slots        slots per list
 * @param query_first  the query of block 0
 * @param k            entries kept per query
 * @param stride       slots per query in the running bests (a power of two, at least k)
 * @param in_hi, in_lo, in_count     the running best before (query q's at `q * stride`)
 * @param out_hi, out_lo, out_count  the running best after (distinct from the one before)
 *
 * Launch: one block of SPATE_BLOCK_THREADS per query of this launch.
 * Memory: caller allocates the running bests; `in_count` starts zeroed before the first merge.
 * Nulls:  none: entries are only distances.
 * Stream: asynchronous on the launch stream.
 */
extern "C" __global__ void __launch_bounds__(SPATE_BLOCK_THREADS)
    vector_topk_merge(const u64* cand_hi, const u64* cand_lo, const u32* cand_count, u64 tiles, u32 slots,
                      u64 query_first, u32 k, u32 stride, const u64* in_hi, const u64* in_lo, const u32* in_count,
                      u64* out_hi, u64* out_lo, u32* out_count) {
    __shared__ u32 s_out;
    const u64 qi = blockIdx.x;
    const u64 q = query_first + qi;
    const u32 held = in_count[q];
    const u64 n = (u64)k + tiles * (u64)slots;
    auto at = [&](u64 i, u64* hi, u64* lo) {
        if (i < k) {
            if (i >= held) return false;
            *hi = in_hi[q * stride + i];
            *lo = in_lo[q * stride + i];
            return true;
        }
        const u64 list = qi * tiles + (i - k) / slots;
        const u64 slot = (i - k) % slots;
        if (slot >= cand_count[list]) return false;
        *hi = cand_hi[list * slots + slot];
        *lo = cand_lo[list * slots + slot];
        return true;
    };
    if (threadIdx.x == 0) s_out = 0;
    u64 bound_hi, bound_lo;
    spate::topk_bound(n, k, at, &bound_hi, &bound_lo);
    for (u64 i = threadIdx.x; i < n; i += blockDim.x) {
        u64 hi, lo;
        if (!at(i, &hi, &lo) || !spate::pair_at_most(hi, lo, bound_hi, bound_lo)) continue;
        const u32 slot = atomicAdd(&s_out, 1u);
        out_hi[q * stride + slot] = hi;
        out_lo[q * stride + slot] = lo;
    }
    __syncthreads();
    if (threadIdx.x == 0) out_count[q] = s_out;
}
SPATE_EXPORT(vector_topk_merge)

/**
 * @brief Sorts each query's running best nearest first and writes its output rows.
 *
 * @param hi, lo      the running bests, `stride` slots per query (sorted in place; the slots
 *                    past a query's count are overwritten)
 * @param count       entries per query
 * @param stride      slots per query (a power of two)
 * @param metric      the metric's code (vector.cuh), to turn keys back into distances
 * @param query_base  the position of query 0 among all queries
 * @param offsets     the first output row of each query (an exclusive sum of `count`)
 * @param out_query, out_item, out_rank, out_distance  the output columns
 *
 * Launch: one block of SPATE_BLOCK_THREADS per query.
 * Memory: caller allocates the outputs, sum(count) rows.
 * Nulls:  none.
 * Stream: asynchronous on the launch stream.
 */
extern "C" __global__ void __launch_bounds__(SPATE_BLOCK_THREADS)
    vector_topk_finish(u64* hi, u64* lo, const u32* count, u32 stride, u32 metric, u64 query_base,
                       const u32* offsets, u64* out_query, u64* out_item, u64* out_rank, f64* out_distance) {
    const u64 q = blockIdx.x;
    u64* h = hi + q * stride;
    u64* l = lo + q * stride;
    const u32 c = count[q];
    for (u32 i = c + threadIdx.x; i < stride; i += blockDim.x) {
        h[i] = SPATE_TOPK_NONE;
        l[i] = SPATE_TOPK_NONE;
    }
    __syncthreads();
    // Bitonic sort of `stride` pairs, ascending.
    for (u32 size = 2; size <= stride; size <<= 1) {
        for (u32 step = size >> 1; step > 0; step >>= 1) {
            for (u32 i = threadIdx.x; i < stride / 2; i += blockDim.x) {
                const u32 a = 2u * i - (i & (step - 1u));
                const u32 b = a + step;
                const bool ascending = (a & size) == 0u;
                const bool greater = h[a] > h[b] || (h[a] == h[b] && l[a] > l[b]);
                if (greater == ascending) {
                    const u64 th = h[a], tl = l[a];
                    h[a] = h[b];
                    l[a] = l[b];
                    h[b] = th;
                    l[b] = tl;
                }
            }
            __syncthreads();
        }
    }
    const u64 at = offsets[q];
    for (u32 r = threadIdx.x; r < c; r += blockDim.x) {
        out_query[at + r] = query_base + q;
        out_item[at + r] = l[r];
        out_rank[at + r] = (u64)r + 1u;
        out_distance[at + r] = spate::topk_distance(h[r], metric);
    }
}
SPATE_EXPORT(vector_topk_finish)

/**
 * @brief One query's running best as row indices, in row order: the rows a pre-selection
 *        keeps.
 *
 * @param lo      the running best's items (query 0's, `stride` slots; sorted in place, the
 *                slots past the count overwritten)
 * @param count   entries (one u32)
 * @param stride  slots (a power of two)
 * @param rows    `count` u32 row indices, ascending
 *
 * Launch: one block of SPATE_BLOCK_THREADS.
 * Memory: caller allocates `rows`, at least `count`.
 * Nulls:  none.
 * Stream: asynchronous on the launch stream.
 */
extern "C" __global__ void __launch_bounds__(SPATE_BLOCK_THREADS)
    vector_topk_rows(u64* lo, const u32* count, u32 stride, u32* rows) {
    const u32 c = count[0];
    for (u32 i = c + threadIdx.x; i < stride; i += blockDim.x) lo[i] = SPATE_TOPK_NONE;
    __syncthreads();
    for (u32 size = 2; size <= stride; size <<= 1) {
        for (u32 step = size >> 1; step > 0; step >>= 1) {
            for (u32 i = threadIdx.x; i < stride / 2; i += blockDim.x) {
                const u32 a = 2u * i - (i & (step - 1u));
                const u32 b = a + step;
                const bool ascending = (a & size) == 0u;
                if ((lo[a] > lo[b]) == ascending) {
                    const u64 t = lo[a];
                    lo[a] = lo[b];
                    lo[b] = t;
                }
            }
            __syncthreads();
        }
    }
    for (u32 r = threadIdx.x; r < c; r += blockDim.x) rows[r] = (u32)lo[r];
}
SPATE_EXPORT(vector_topk_rows)
