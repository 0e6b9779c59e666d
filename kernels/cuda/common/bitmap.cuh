// bitmap.cuh: Arrow validity and boolean bitmaps (LSB-first bits, with a bit offset).
//
// A null bitmap pointer means "every row valid" (Arrow's convention for no null buffer).
#pragma once
#include "common/prelude.cuh"

namespace spate {

__device__ __forceinline__ bool bit_is_set(const u8* bits, u64 offset, u64 i) {
    u64 b = offset + i;
    return (bits[b >> 3] >> (b & 7)) & 1;
}

__device__ __forceinline__ bool row_is_valid(const u8* validity, u64 offset, u64 i) {
    return validity == nullptr || bit_is_set(validity, offset, i);
}

}  // namespace spate
