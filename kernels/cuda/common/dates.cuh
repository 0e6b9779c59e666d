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

namespace spate {

// The day number of a proleptic Gregorian date (the inverse of civil_from_days).
__device__ __forceinline__ i64 days_from_civil(i64 year, i64 month, i64 day) {
    const i64 y = year - (month <= 2 ? 1 : 0);
    const i64 era = (y >= 0 ? y : y - 399) / 400;
    const i64 yoe = y - era * 400;
    const i64 doy = (153 * (month > 2 ? month - 3 : month + 9) + 2) / 5 + day - 1;
    const i64 doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    return era * 146097 + doe - 719468;
}

__device__ __forceinline__ i64 days_in_month(i64 year, i64 month) {
    if (month == 2) {
        const bool leap = (year % 4 == 0 && year % 100 != 0) || year % 400 == 0;
        return leap ? 29 : 28;
    }
    return (month == 4 || month == 6 || month == 9 || month == 11) ? 30 : 31;
}

// A date plus whole months, the day clamped to the end of the target month (Jan 31 + 1 month is
// Feb 28 or 29), then plus days: Arrow's (and so DataFusion's) `date + interval`.
__device__ __forceinline__ i32 date_add_interval(i32 days, i64 months, i64 add_days) {
    i64 y, m, d;
    civil_from_days(days, y, m, d);
    const i64 total = y * 12 + (m - 1) + months;
    const i64 ny = total >= 0 ? total / 12 : -((-total + 11) / 12);
    const i64 nm = total - ny * 12 + 1;
    const i64 last = days_in_month(ny, nm);
    return (i32)(days_from_civil(ny, nm, d > last ? last : d) + add_days);
}

}  // namespace spate

namespace spate {

// a / b rounded toward negative infinity (b > 0).
__device__ __forceinline__ i64 floor_div(i64 a, i64 b) {
    const i64 q = a / b;
    return (a % b != 0 && a < 0) ? q - 1 : q;
}

// A calendar field of a day number, as Arrow's date_part (chrono) computes it. `field`:
// 0 year, 1 quarter, 2 month, 3 ISO week, 4 day, 5 day of the year (1-366), 6 day of the week
// (Sunday 0), 7 ISO day of the week (Monday 1 to Sunday 7); the order of `DateField` in
// core/src/expr/ir.rs. Time fields (8 and up) of a date are 0.
__device__ inline i32 date_field(i64 days, u32 field) {
    i64 y, m, d;
    civil_from_days(days, y, m, d);
    // 1970-01-01 was a Thursday: Monday-based weekday 3.
    const i64 monday_based = floor_div(days + 3, 7) * -7 + days + 3;
    switch (field) {
        case 0: return (i32)y;
        case 1: return (i32)((m - 1) / 3 + 1);
        case 2: return (i32)m;
        case 3: {
            // The ISO week of a day is the week of its week's Thursday, counted in that
            // Thursday's year.
            const i64 thursday = days - monday_based + 3;
            i64 ty, tm, td;
            civil_from_days(thursday, ty, tm, td);
            return (i32)((thursday - days_from_civil(ty, 1, 1)) / 7 + 1);
        }
        case 4: return (i32)d;
        case 5: return (i32)(days - days_from_civil(y, 1, 1) + 1);
        case 6: return (i32)((monday_based + 1) % 7);
        case 7: return (i32)(monday_based + 1);
        default: return 0;
    }
}

// Whether a date part of `value` exists: chrono, which Arrow's date_part uses, spans the days
// of years -262143 to 262142; outside them the part is NULL. `per_second` is 0 for a Date32
// (the value counts days), else the timestamp's units per second.
__device__ inline bool date_part_exists(i64 value, i64 per_second) {
    const i64 days = per_second == 0 ? value : floor_div(floor_div(value, per_second), 86400);
    return days >= -96465292ll && days <= 95026236ll;
}

// A field of a timestamp without a time zone counting `per_second` units per second: the
// fields of `date_field`, then 8 hour, 9 minute and 10 second (whole seconds of the minute).
__device__ inline i32 timestamp_field(i64 value, i64 per_second, u32 field) {
    const i64 seconds = floor_div(value, per_second);
    const i64 days = floor_div(seconds, 86400);
    const i64 of_day = seconds - days * 86400;
    switch (field) {
        case 8: return (i32)(of_day / 3600);
        case 9: return (i32)(of_day / 60 % 60);
        case 10: return (i32)(of_day % 60);
        default: return date_field(days, field);
    }
}

}  // namespace spate
