// cross.cu: the row pairs of a cross join.
#include "common/prelude.cuh"

/**
 * @brief The pairs of left rows `first_left..first_left + n / right_rows` with every right row:
 *        pair i is left row first_left + i / right_rows and right row i % right_rows.
 *
 * @param first_left  the first left row of this output
 * @param right_rows  rows of the right side (at least 1)
 * @param n           pairs (a multiple of right_rows)
 * @param left        `n` left row indices
 * @param right       `n` right row indices
 *
 * Launch: SPATE_BLOCK_THREADS threads, grid-stride over `n`, no shared memory.
 * Memory: caller allocates both outputs.
 * Nulls:  none: every pair is a row of the output.
 * Stream: asynchronous on the launch stream.
 */
extern "C" __global__ void __launch_bounds__(SPATE_BLOCK_THREADS)
    cross_pairs(u64 first_left, u64 right_rows, u64 n, u32* left, u32* right) {
    for (u64 i = spate::global_thread_index(); i < n; i += spate::grid_stride()) {
        left[i] = (u32)(first_left + i / right_rows);
        right[i] = (u32)(i % right_rows);
    }
}
SPATE_EXPORT(cross_pairs)
