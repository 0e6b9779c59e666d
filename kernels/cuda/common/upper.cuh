// upper.cuh: SQL `upper` as DataFusion computes it (Rust's str::to_uppercase: full Unicode
// case mapping, without locale), for generated expressions. A code point maps to up to three
// (`ß` to `SS`), so an uppercased string is read as a stream of bytes: its length, its bytes
// copied out, and bytewise comparisons with another string (uppercased or not), all without a
// buffer of its own. Tested against Rust for every code point (kernels/tests/upper_case.rs).
#pragma once
#include "common/prelude.cuh"
#include "common/strings.cuh"
#include "common/upper_table.cuh"

namespace spate {

// The uppercase of code point `cp` into `out` (up to three code points); returns how many.
__device__ inline u32 upper_char(u32 cp, u32* out) {
    if (cp < 0x80u) {
        out[0] = (cp >= 'a' && cp <= 'z') ? cp - 32u : cp;
        return 1u;
    }
    u32 lo = 0u, hi = UPPER_COUNT;
    while (lo < hi) {
        const u32 mid = (lo + hi) / 2u;
        if (UPPER_FROM[mid] < cp) {
            lo = mid + 1u;
        } else {
            hi = mid;
        }
    }
    if (lo < UPPER_COUNT && UPPER_FROM[lo] == cp) {
        u32 k = 0u;
        while (k < 3u && UPPER_TO[lo][k] != 0u) {
            out[k] = UPPER_TO[lo][k];
            ++k;
        }
        return k;
    }
    out[0] = cp;
    return 1u;
}

// `cp` as UTF-8 into `out` (up to 4 bytes); returns how many.
__device__ inline u32 utf8_encode(u32 cp, u8* out) {
    if (cp < 0x80u) {
        out[0] = (u8)cp;
        return 1u;
    }
    if (cp < 0x800u) {
        out[0] = (u8)(0xC0u | (cp >> 6));
        out[1] = (u8)(0x80u | (cp & 0x3Fu));
        return 2u;
    }
    if (cp < 0x10000u) {
        out[0] = (u8)(0xE0u | (cp >> 12));
        out[1] = (u8)(0x80u | ((cp >> 6) & 0x3Fu));
        out[2] = (u8)(0x80u | (cp & 0x3Fu));
        return 3u;
    }
    out[0] = (u8)(0xF0u | (cp >> 18));
    out[1] = (u8)(0x80u | ((cp >> 12) & 0x3Fu));
    out[2] = (u8)(0x80u | ((cp >> 6) & 0x3Fu));
    out[3] = (u8)(0x80u | (cp & 0x3Fu));
    return 4u;
}

// The bytes of a string, uppercased when `upper`, one at a time.
struct UpperBytes {
    const u8* s;
    u64 n;
    u64 i;
    bool upper;
    // The rest of the current character's uppercase.
    u8 buf[12];
    u32 len;
    u32 pos;
};

__device__ inline UpperBytes upper_bytes(const u8* s, u64 n, bool upper) {
    UpperBytes it;
    it.s = s;
    it.n = n;
    it.i = 0u;
    it.upper = upper;
    it.len = 0u;
    it.pos = 0u;
    return it;
}

// The next byte into `*b`; false at the end.
__device__ inline bool next_byte(UpperBytes* it, u8* b) {
    if (it->pos < it->len) {
        *b = it->buf[it->pos++];
        return true;
    }
    if (it->i >= it->n) return false;
    const u8 lead = it->s[it->i];
    if (!it->upper || lead < 0x80u) {
        *b = (it->upper && lead >= 'a' && lead <= 'z') ? (u8)(lead - 32u) : lead;
        ++it->i;
        return true;
    }
    const u64 w = utf8_width(lead);
    if (w == 1u || it->i + w > it->n) {
        // Not the start of a whole character (Arrow's strings are UTF-8, so never): as is.
        *b = lead;
        ++it->i;
        return true;
    }
    u32 cp = w == 2u ? (lead & 0x1Fu) : (w == 3u ? (lead & 0x0Fu) : (lead & 0x07u));
    for (u64 k = 1u; k < w; ++k) cp = (cp << 6) | (it->s[it->i + k] & 0x3Fu);
    it->i += w;
    u32 mapped[3];
    const u32 count = upper_char(cp, mapped);
    it->len = 0u;
    for (u32 k = 0u; k < count; ++k) it->len += utf8_encode(mapped[k], it->buf + it->len);
    it->pos = 1u;
    *b = it->buf[0];
    return true;
}

// Bytes in upper(s).
__device__ inline u64 upper_len(const u8* s, u64 n) {
    UpperBytes it = upper_bytes(s, n, true);
    u64 count = 0u;
    u8 b;
    while (next_byte(&it, &b)) ++count;
    return count;
}

// Writes upper(s) to `dst` (upper_len(s, n) bytes).
__device__ inline void upper_copy(const u8* s, u64 n, u8* dst) {
    UpperBytes it = upper_bytes(s, n, true);
    u8 b;
    while (next_byte(&it, &b)) *dst++ = b;
}

// Three-way bytewise comparison of `a` and `b`, each uppercased where its flag says.
__device__ inline int str_cmp_upper(const u8* a, u64 an, bool au, const u8* b, u64 bn, bool bu) {
    UpperBytes x = upper_bytes(a, an, au);
    UpperBytes y = upper_bytes(b, bn, bu);
    for (;;) {
        u8 p, q;
        const bool more_a = next_byte(&x, &p);
        const bool more_b = next_byte(&y, &q);
        if (!more_a || !more_b) return more_a ? 1 : (more_b ? -1 : 0);
        if (p != q) return p < q ? -1 : 1;
    }
}

}  // namespace spate
