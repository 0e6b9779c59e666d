//! The SQL helpers generated expression kernels call (`kernels/cuda/common/arith.cuh`,
//! `casts.cuh`, `logic.cuh`, `strings.cuh`), each against the value Arrow's CPU kernels give,
//! on the emulated backend. `core/src/expr` prints calls to these and holds no arithmetic of
//! its own, so this is where their edge cases are pinned down: wrapping, MIN / -1, zero
//! divisors, rounding half away from zero, range limits, NaN bits, three-valued logic and UTF-8.
//!
//! Each case is a C++ statement setting `u64 r`; one thread runs them all and writes `r` per
//! case. The same source compiles under NVRTC in CI (the recorded-program check).

#![allow(
    clippy::unwrap_used,
    reason = "test helpers: a failed unwrap is a failed test"
)]

use spate_kernels::{Device, DeviceOptions, KernelArg, LaunchConfig};

/// `(what, statement setting r, expected r)`.
fn cases() -> Vec<(&'static str, &'static str, u64)> {
    let i = |v: i64| v as u64;
    let f = |v: f64| v.to_bits();
    vec![
        // Integer + - * wrap, as DataFusion's.
        (
            "i8 127 + 1",
            "r = (u64)(i64)spate::wrapping_add<i8>(127, 1);",
            i(-128),
        ),
        (
            "i16 300 * 300",
            "r = (u64)(i64)spate::wrapping_mul<i16>(300, 300);",
            i(24464),
        ),
        (
            "u16 65535 * 65535",
            "r = spate::wrapping_mul<u16>(65535, 65535);",
            1,
        ),
        (
            "i64 MIN - 1",
            "r = (u64)spate::wrapping_sub<i64>(-9223372036854775807ll - 1, 1);",
            i(i64::MAX),
        ),
        (
            "-(i32 MIN)",
            "r = (u64)(i64)spate::wrapping_neg<i32>(-2147483647 - 1);",
            i(i64::from(i32::MIN)),
        ),
        (
            "-(i128 MIN), high word",
            "r = (u64)(spate::wrapping_neg<i128>((i128)((u128i)1 << 127)) >> 64);",
            1u64 << 63,
        ),
        // Integer / and %: Arrow's checked kernels.
        (
            "i32 MIN / -1 overflows",
            "bool z, o; const i32 v = spate::checked_div<i32>(-2147483647 - 1, -1, &z, &o); r = (o ? 1 : 0) | (z ? 2 : 0) | (v == 0 ? 4 : 0);",
            5,
        ),
        (
            "7 / 0",
            "bool z, o; spate::checked_div<i32>(7, 0, &z, &o); r = (o ? 1 : 0) | (z ? 2 : 0);",
            2,
        ),
        (
            "-7 / 2 truncates",
            "bool z, o; r = (u64)(i64)spate::checked_div<i32>(-7, 2, &z, &o);",
            i(-3),
        ),
        (
            "u32 4e9 / 2",
            "bool z, o; r = spate::checked_div<u32>(4000000000u, 2u, &z, &o) | (o ? 1ull << 40 : 0);",
            2_000_000_000,
        ),
        (
            "i32 MIN % -1 is 0",
            "bool z; r = (u64)(i64)spate::checked_rem<i32>(-2147483647 - 1, -1, &z) | (z ? 1ull << 40 : 0);",
            0,
        ),
        (
            "-7 % 3",
            "bool z; r = (u64)spate::checked_rem<i64>(-7, 3, &z);",
            i(-1),
        ),
        // Floats: x86's NaN bits, Rust's `%`.
        (
            "inf + -inf is the default NaN",
            "r = (u64)__double_as_longlong(spate::float_add<f64>(__longlong_as_double(0x7ff0000000000000ll), __longlong_as_double((i64)0xfff0000000000000ull)));",
            0xfff8_0000_0000_0000,
        ),
        (
            "-7.5 % 2",
            "r = (u64)__double_as_longlong(spate::float_rem<f64>(-7.5, 2.0));",
            f(-1.5),
        ),
        // Bitwise operators, abs, round.
        ("6 ^ 3", "r = (u64)spate::bit_xor<i32>(6, 3);", 5),
        (
            "i32 1 << 33 wraps the amount",
            "r = (u64)spate::bit_shl<i32>(1, 33);",
            2,
        ),
        (
            "i32 -8 >> -1 is an arithmetic shift by 31",
            "r = (u64)(i64)spate::bit_shr<i32>(-8, -1);",
            i(-1),
        ),
        ("u8 200 << 1", "r = spate::bit_shl<u8>(200, 1);", 144),
        (
            "abs(i16 MIN) fails",
            "bool o; spate::checked_abs<i16>(-32768, &o); r = o;",
            1,
        ),
        (
            "abs(-7)",
            "bool o; r = (u64)spate::checked_abs<i32>(-7, &o) | (o ? 1ull << 40 : 0);",
            7,
        ),
        (
            "abs(-NaN) clears the sign",
            "r = (u64)__double_as_longlong(spate::float_abs(__longlong_as_double((i64)0xfff8000000000001ull)));",
            0x7ff8_0000_0000_0001,
        ),
        (
            "round(2.345, 2) as DataFusion's",
            "r = (u64)__double_as_longlong(spate::round_float<f64>(2.345, 100.0));",
            f((2.345f64 * 100.0).round() / 100.0),
        ),
        (
            "floor(-2.5)",
            "r = (u64)__double_as_longlong(spate::float_floor<f64>(-2.5));",
            f(-3.0),
        ),
        (
            "ceil(-0.5) is -0.0",
            "r = (u64)__double_as_longlong(spate::float_ceil<f64>(-0.5));",
            f(-0.0),
        ),
        (
            "floor(-NaN) keeps its sign",
            "r = (u64)__double_as_longlong(spate::float_floor<f64>(__longlong_as_double((i64)0xfff8000000000001ull)));",
            0xfff8_0000_0000_0001,
        ),
        (
            "round(-2.5) is -3",
            "r = (u64)__double_as_longlong(spate::round_float<f64>(-2.5, 1.0));",
            f(-3.0),
        ),
        (
            "round(-NaN, 2) keeps its sign",
            "r = (u64)__double_as_longlong(spate::round_float<f64>(__longlong_as_double((i64)0xfff8000000000000ull), 100.0));",
            0xfff8_0000_0000_0000,
        ),
        // Decimals.
        (
            "1.00 / 3.00 at scale 6",
            "bool z, o; r = (u64)spate::dec_div(100, 300, (i128)1000000, 1, &z, &o);",
            333_333,
        ),
        (
            "decimal / 0",
            "bool z, o; spate::dec_div(100, 0, 10, 1, &z, &o); r = (o ? 1 : 0) | (z ? 2 : 0);",
            2,
        ),
        (
            "decimal scaling overflows, not a zero divisor",
            "bool z, o; const i128 big = (i128)10000000000000000000ull * (i128)10000000000000000000ull; spate::dec_div(big, 0, 1000, 1, &z, &o); r = (o ? 1 : 0) | (z ? 2 : 0);",
            1,
        ),
        (
            "decimal -7 % 3",
            "bool z, o; r = (u64)spate::dec_rem(-7, 3, 1, 1, &z, &o);",
            i(-1),
        ),
        (
            "decimal % -1 is 0",
            "bool z, o; r = (u64)spate::dec_rem(-7, -1, 1, 1, &z, &o) | (z || o ? 1ull << 40 : 0);",
            0,
        ),
        (
            "decimal 1.5 + 0.25",
            "r = (u64)spate::dec_add(15, 25, 10, 1);",
            175,
        ),
        (
            "decimal 1.5 - 0.25",
            "r = (u64)spate::dec_sub(15, 25, 10, 1);",
            125,
        ),
        // Casts.
        (
            "128 to i8 fails",
            "bool b; spate::narrow_int<i8>(128, -128, 127, &b); r = b;",
            1,
        ),
        (
            "255 to u8",
            "bool b; r = spate::narrow_int<u8>(255, 0, 255, &b) | (b ? 1ull << 40 : 0);",
            255,
        ),
        (
            "-2.7 to i32 truncates",
            "bool b; r = (u64)(i64)spate::float_to_int<i32>(-2.7, -2147483648.0, 2147483648.0, &b);",
            i(-2),
        ),
        (
            "NaN to i32 fails",
            "bool b; spate::float_to_int<i32>(__longlong_as_double(0x7ff8000000000000ll), -2147483648.0, 2147483648.0, &b); r = b;",
            1,
        ),
        (
            "9.3e18 to i64 fails",
            "bool b; spate::float_to_int<i64>(9.3e18, -9223372036854775808.0, 9223372036854775808.0, &b); r = b;",
            1,
        ),
        (
            "-12.5 rescaled down rounds away from zero",
            "r = (u64)spate::dec_rescale_down(-125, 10);",
            i(-13),
        ),
        (
            "12.4 rescaled down",
            "r = (u64)spate::dec_rescale_down(124, 10);",
            12,
        ),
        (
            "0.9 (38 digits after the point) rescaled to a whole number rounds up",
            "const i128 p = (i128)10000000000000000000ull * (i128)10000000000000000000ull; r = (u64)spate::dec_rescale_down(p / 10 * 9, p);",
            1,
        ),
        (
            "123.45 to DECIMAL(3, 0)",
            "bool b; r = (u64)spate::to_decimal(12345, 1, 100, 1000, &b) | (b ? 1ull << 40 : 0);",
            123,
        ),
        (
            "9999.9 to DECIMAL(4, 0) rounds out of range",
            "bool b; spate::to_decimal(99999, 1, 10, 10000, &b); r = b;",
            1,
        ),
        (
            "10^37 scaled up by 100 overflows",
            "bool b; const i128 p = (i128)10000000000000000000ull * (i128)1000000000000000000ull; spate::to_decimal(p, 100, 1, p * 10, &b); r = b;",
            1,
        ),
        (
            "-2.5 to DECIMAL(5, 0) rounds away from zero",
            "bool range, b; r = (u64)spate::float_to_decimal(-2.5, 1.0, 100000, &range, &b);",
            i(-3),
        ),
        (
            "1e39 to a decimal does not fit an i128",
            "bool range, b; spate::float_to_decimal(1e39, 1.0, 1000, &range, &b); r = (range ? 1 : 0) | (b ? 2 : 0);",
            3,
        ),
        (
            "1.5e38 fits an i128 but not 38 digits",
            "bool range, b; const i128 limit = (i128)10000000000000000000ull * (i128)10000000000000000000ull; spate::float_to_decimal(1.5e38, 1.0, limit, &range, &b); r = (range ? 1 : 0) | (b ? 2 : 0);",
            2,
        ),
        (
            "123.45 as f64",
            "r = (u64)__double_as_longlong(spate::dec_to_f64(12345, 100.0));",
            f(123.45),
        ),
        (
            "-1500 ms to seconds truncates",
            "r = (u64)spate::timestamp_coarser(-1500, 1000);",
            i(-1),
        ),
        (
            "a finer unit leaves i64",
            "bool b; spate::timestamp_finer(922337203685477580ll, 1000, &b); r = b;",
            1,
        ),
        // Three-valued logic: bit 0 the value, bit 1 the null flag.
        (
            "NULL AND FALSE",
            "bool n; const bool v = spate::and3(true, true, false, false, &n); r = (v ? 1 : 0) | (n ? 2 : 0);",
            0,
        ),
        (
            "NULL AND TRUE",
            "bool n; const bool v = spate::and3(true, true, false, true, &n); r = (v ? 1 : 0) | (n ? 2 : 0);",
            2,
        ),
        (
            "NULL OR TRUE",
            "bool n; const bool v = spate::or3(true, false, false, true, &n); r = (v ? 1 : 0) | (n ? 2 : 0);",
            1,
        ),
        (
            "NULL OR FALSE",
            "bool n; const bool v = spate::or3(true, true, false, false, &n); r = (v ? 1 : 0) | (n ? 2 : 0);",
            2,
        ),
        (
            "NULL IS DISTINCT FROM NULL",
            "r = spate::is_distinct(true, true, false);",
            0,
        ),
        (
            "NULL IS DISTINCT FROM 1",
            "r = spate::is_distinct(true, false, false);",
            1,
        ),
        (
            "1 NOT IN (2, NULL)",
            "bool n; const bool v = spate::in_list(false, false, true, true, &n); r = (v ? 1 : 0) | (n ? 2 : 0);",
            3,
        ),
        (
            "1 NOT IN (1, NULL)",
            "bool n; const bool v = spate::in_list(false, true, true, true, &n); r = (v ? 1 : 0) | (n ? 2 : 0);",
            0,
        ),
        // Strings (UTF-8, bytewise).
        (
            "character_length('héllo')",
            "const u8 s[] = {'h', 0xC3, 0xA9, 'l', 'l', 'o'}; r = spate::utf8_length(s, 6);",
            5,
        ),
        (
            "substr('héllo', 2, 2) is 'él'",
            "const u8 s[] = {'h', 0xC3, 0xA9, 'l', 'l', 'o'}; u64 n; const u8* p = spate::substr_chars(s, 6, 2, 4, &n); r = (u64)(p - s) * 100 + n;",
            103,
        ),
        (
            "substr('abc', 5) is empty",
            "const u8 s[] = {'a', 'b', 'c'}; u64 n = 9; spate::substr_chars(s, 3, 5, 9223372036854775807ll, &n); r = n;",
            0,
        ),
        (
            "'abcXdefYghi' LIKE 'abc%def%ghi'",
            "const u8 s[] = {'a','b','c','X','d','e','f','Y','g','h','i'}; const u8 p[] = {'a','b','c','d','e','f','g','h','i'}; const u64 lens[] = {3, 3, 3}; r = spate::like_segments(s, 11, p, lens, 3);",
            1,
        ),
        (
            "'ab' LIKE 'ab%ab' (no overlap)",
            "const u8 s[] = {'a','b'}; const u8 p[] = {'a','b','a','b'}; const u64 lens[] = {2, 2}; r = spate::like_segments(s, 2, p, lens, 2);",
            0,
        ),
        (
            "'axb' LIKE '%x%'",
            "const u8 s[] = {'a','x','b'}; const u8 p[] = {'x'}; const u64 lens[] = {0, 1, 0}; r = spate::like_segments(s, 3, p, lens, 3);",
            1,
        ),
        (
            "btrim('xxaxbx', 'x') is 'axb'",
            "const u8 s[] = {'x','x','a','x','b','x'}; const u8 set[] = {'x'}; u64 n; const u8* p = spate::trim_bytes(s, 6, set, 1, true, true, &n); r = (u64)(p - s) * 100 + n;",
            203,
        ),
        (
            "rtrim of only trimmed bytes is empty",
            "const u8 s[] = {' ',' '}; const u8 set[] = {' '}; u64 n = 9; spate::trim_bytes(s, 2, set, 1, false, true, &n); r = n;",
            0,
        ),
        (
            "'abd' LIKE 'abc'",
            "const u8 s[] = {'a','b','d'}; const u8 p[] = {'a','b','c'}; const u64 lens[] = {3}; r = spate::like_segments(s, 3, p, lens, 1);",
            0,
        ),
    ]
}

#[test]
fn expression_helpers_compute_what_arrow_computes() {
    let cases = cases();
    let mut body = String::new();
    for (k, (_, statement, _)) in cases.iter().enumerate() {
        body.push_str(&format!("    {{ u64 r = 0; {statement} out[{k}] = r; }}\n"));
    }
    let source = format!(
        "#include \"common/prelude.cuh\"\n#include \"common/arith.cuh\"\n#include \"common/casts.cuh\"\n#include \"common/logic.cuh\"\n#include \"common/strings.cuh\"\n\nextern \"C\" __global__ void helpers(u64* out) {{\n    if (spate::global_thread_index() != 0) return;\n{body}}}\nSPATE_EXPORT(helpers)\n"
    );
    let device = Device::emulated(DeviceOptions::default()).unwrap();
    let kernels = device
        .compile_generated("expr_helpers", &source, &["helpers"])
        .unwrap();
    let stream = device.new_stream().unwrap();
    let out = stream.alloc_zeroed::<u64>(cases.len()).unwrap();
    let cfg = LaunchConfig {
        grid: (1, 1, 1),
        block: (32, 1, 1),
        shared_mem_bytes: 0,
    };
    // SAFETY: the kernel writes one u64 per case into `out`, which holds that many.
    unsafe { stream.launch(&kernels[0], cfg, &[KernelArg::from(&out)]) }.unwrap();
    let got = stream.to_vec(&out).unwrap();
    let wrong: Vec<String> = cases
        .iter()
        .zip(&got)
        .filter(|((_, _, want), got)| *want != **got)
        .map(|((what, _, want), got)| format!("{what}: got {got:#x}, want {want:#x}"))
        .collect();
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}
