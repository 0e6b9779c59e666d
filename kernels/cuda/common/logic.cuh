// logic.cuh: SQL's three-valued logic for generated expression kernels. A boolean operand is a
// value and a null flag; a NULL operand's value is meaningless and never decides a result.
#pragma once
#include "common/prelude.cuh"

namespace spate {

// AND: FALSE when either side is a known FALSE, else NULL when either is NULL, else TRUE.
// Returns the value (false when NULL) and sets `*null`.
__device__ __forceinline__ bool and3(bool a_null, bool a, bool b_null, bool b, bool* null) {
    const bool a_false = !a_null && !a;
    const bool b_false = !b_null && !b;
    *null = (a_null || b_null) && !(a_false || b_false);
    return !*null && !a_false && !b_false;
}

// OR: TRUE when either side is a known TRUE, else NULL when either is NULL, else FALSE.
__device__ __forceinline__ bool or3(bool a_null, bool a, bool b_null, bool b, bool* null) {
    const bool a_true = !a_null && a;
    const bool b_true = !b_null && b;
    *null = (a_null || b_null) && !(a_true || b_true);
    return a_true || b_true;
}

// IS DISTINCT FROM (never NULL): two NULLs are not distinct, a NULL and a value are, two values
// are when they are not equal (`equal`, compared as `=` compares them).
__device__ __forceinline__ bool is_distinct(bool a_null, bool b_null, bool equal) {
    return !((a_null && b_null) || (!a_null && !b_null && equal));
}

// x [NOT] IN (list): TRUE on a match (`matched`: some non-NULL item equals x); else NULL when x or
// any item is NULL (`any_null`); else FALSE. NOT IN negates that, NULL staying NULL.
__device__ __forceinline__ bool in_list(bool x_null, bool matched, bool any_null, bool negated,
                                        bool* null) {
    const bool m = !x_null && matched;
    *null = !m && (x_null || any_null);
    return negated ? !m : m;
}

}  // namespace spate
