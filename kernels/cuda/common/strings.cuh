// strings.cuh: byte-string helpers for generated expressions (Arrow's string order is bytewise).
#pragma once
#include "common/prelude.cuh"

namespace spate {

// Offset `i` of a string column whose offsets are 4 (Utf8) or 8 (LargeUtf8) bytes wide.
__device__ __forceinline__ u64 string_offset(const u8* offsets, u64 width, u64 i) {
    return width == 8 ? (u64)((const i64*)offsets)[i] : (u64)((const i32*)offsets)[i];
}

// Three-way bytewise comparison: <0, 0 or >0.
__device__ inline int str_cmp(const u8* a, u64 an, const u8* b, u64 bn) {
    u64 m = an < bn ? an : bn;
    for (u64 i = 0; i < m; ++i) {
        if (a[i] != b[i]) return a[i] < b[i] ? -1 : 1;
    }
    return an < bn ? -1 : (an > bn ? 1 : 0);
}

__device__ inline bool str_eq(const u8* a, u64 an, const u8* b, u64 bn) {
    if (an != bn) return false;
    for (u64 i = 0; i < an; ++i) {
        if (a[i] != b[i]) return false;
    }
    return true;
}

__device__ inline bool str_starts(const u8* a, u64 an, const u8* p, u64 pn) {
    return an >= pn && str_eq(a, pn, p, pn);
}

__device__ inline bool str_ends(const u8* a, u64 an, const u8* p, u64 pn) {
    return an >= pn && str_eq(a + (an - pn), pn, p, pn);
}

// First position >= from where `p` occurs in `a`, or -1.
__device__ inline i64 str_find(const u8* a, u64 an, u64 from, const u8* p, u64 pn) {
    if (pn == 0) return from <= an ? (i64)from : -1;
    for (u64 i = from; i + pn <= an; ++i) {
        if (str_eq(a + i, pn, p, pn)) return (i64)i;
    }
    return -1;
}

// Bytes in the UTF-8 character that starts with `lead` (1 for a stray continuation byte).
__device__ __forceinline__ u64 utf8_width(u8 lead) {
    return lead < 0xC0 ? 1 : (lead < 0xE0 ? 2 : (lead < 0xF0 ? 3 : 4));
}

// SQL LIKE over a pattern compiled to tokens: kinds[k] is 0 for the literal byte bytes[k], 1 for
// `_` (one character) and 2 for `%` (any run of characters). Greedy matching that backtracks to
// the last `%`, which is exact for these two wildcards; text and pattern advance by whole UTF-8
// characters, so a literal never matches from the middle of one.
__device__ inline bool like_match(const u8* s, u64 sn, const u8* kinds, const u8* bytes, u64 pn) {
    u64 si = 0, pi = 0, star_s = 0;
    u64 star_p = ~0ull;
    while (si < sn) {
        if (pi < pn && kinds[pi] == 1) {
            const u64 w = utf8_width(s[si]);
            si = si + w < sn ? si + w : sn;
            ++pi;
        } else if (pi < pn && kinds[pi] == 0 && s[si] == bytes[pi]) {
            ++si;
            ++pi;
        } else if (pi < pn && kinds[pi] == 2) {
            star_p = pi++;
            star_s = si;
        } else if (star_p != ~0ull) {
            pi = star_p + 1;
            const u64 w = utf8_width(s[star_s]);
            star_s = star_s + w < sn ? star_s + w : sn;
            si = star_s;
        } else {
            return false;
        }
    }
    while (pi < pn && kinds[pi] == 2) ++pi;
    return pi == pn;
}

// Characters (code points) in UTF-8 text: its bytes that do not continue a character.
__device__ inline u64 utf8_length(const u8* s, u64 n) {
    u64 count = 0;
    for (u64 k = 0; k < n; ++k) count += ((s[k] & 0xC0) != 0x80) ? 1 : 0;
    return count;
}

// strpos(s, p) as DataFusion's: the 1-based character position of p's first occurrence in s,
// 0 when there is none, 1 for an empty p. (A match of valid UTF-8 in valid UTF-8 starts on a
// character.)
__device__ inline i64 str_position(const u8* s, u64 sn, const u8* p, u64 pn) {
    if (pn == 0) return 1;
    const i64 at = str_find(s, sn, 0, p, pn);
    return at < 0 ? 0 : (i64)utf8_length(s, (u64)at) + 1;
}

// SQL substr by character positions, as DataFusion (and PostgreSQL) define it: the characters
// at 1-based positions [from, to) that exist (`from` >= 1). Returns where they start and writes
// their length in bytes.
__device__ inline const u8* substr_chars(const u8* s, u64 n, i64 from, i64 to, u64* out_n) {
    if (to <= from) {
        *out_n = 0;
        return s;
    }
    u64 lo = n, hi = n;
    i64 pos = 1;
    for (u64 b = 0; b < n; b += utf8_width(s[b]), ++pos) {
        if (pos == from) lo = b;
        if (pos == to) {
            hi = b;
            break;
        }
    }
    if (hi < lo) hi = lo;
    *out_n = hi - lo;
    return s + lo;
}

// A string without its leading (`left`) and trailing (`right`) bytes that are in `set` (`sn`
// ASCII bytes), as DataFusion's btrim/ltrim/rtrim. Returns where the rest starts and writes its
// length.
__device__ inline const u8* trim_bytes(const u8* s, u64 n, const u8* set, u64 sn, bool left, bool right, u64* out_n) {
    u64 lo = 0, hi = n;
    if (left) {
        while (lo < hi) {
            bool in = false;
            for (u64 k = 0; k < sn; ++k) in = in || s[lo] == set[k];
            if (!in) break;
            ++lo;
        }
    }
    if (right) {
        while (hi > lo) {
            bool in = false;
            for (u64 k = 0; k < sn; ++k) in = in || s[hi - 1] == set[k];
            if (!in) break;
            --hi;
        }
    }
    *out_n = hi - lo;
    return s + lo;
}

// SQL LIKE for a pattern of literal text and `%` only, given as its `count` segments between
// the `%`s (their bytes concatenated in `bytes`, their lengths in `lens`, empty ones included):
// a single segment must equal the text; else the first must start it, the last end it, and the
// middle ones occur in order without overlapping.
__device__ inline bool like_segments(const u8* s, u64 sn, const u8* bytes, const u64* lens, u64 count) {
    if (count == 1) return str_eq(s, sn, bytes, lens[0]);
    u64 pos = 0;
    const u8* seg = bytes;
    for (u64 k = 0; k < count; ++k) {
        const u64 len = lens[k];
        if (len != 0) {
            if (k == 0) {
                if (!str_starts(s, sn, seg, len)) return false;
                pos = len;
            } else if (k == count - 1) {
                if (sn < pos + len || !str_ends(s, sn, seg, len)) return false;
            } else {
                const i64 found = str_find(s, sn, pos, seg, len);
                if (found < 0) return false;
                pos = (u64)found + len;
            }
        }
        seg += len;
    }
    return true;
}

}  // namespace spate
