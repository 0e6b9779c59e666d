// dates.cuh: calendar fields of Date32 values (days since 1970-01-01, proleptic Gregorian).
#pragma once
#include "common/prelude.cuh"

namespace spate {

// Year, month (1-12) and day (1-31) of a day number; Howard Hinnant's civil_from_days, in
// integer arithmetic so every day in Date32's range converts exactly.
__device__ __forceinline__ void civil_from_days(i64 days, i64& year, i64& month, i64& day) {
    const i64 z = days + 719468;
    const i64 era = (z >= 0 ? z : z - 146096) / 146097;
    const i64 doe = z - era * 146097;
    const i64 yoe = (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365;
    const i64 doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    const i64 mp = (5 * doy + 2) / 153;
    day = doy - (153 * mp + 2) / 5 + 1;
    month = mp < 10 ? mp + 3 : mp - 9;
    year = yoe + era * 400 + (month <= 2 ? 1 : 0);
}

__device__ __forceinline__ i32 date_year(i32 days) {
    i64 y, m, d;
    civil_from_days(days, y, m, d);
    return (i32)y;
}

__device__ __forceinline__ i32 date_month(i32 days) {
    i64 y, m, d;
    civil_from_days(days, y, m, d);
    return (i32)m;
}

__device__ __forceinline__ i32 date_day(i32 days) {
    i64 y, m, d;
    civil_from_days(days, y, m, d);
    return (i32)d;
}

}  // namespace spate
