// upper.cuh: strings computed a byte at a time, for generated expressions: SQL `upper` as
// DataFusion computes it (Rust's str::to_uppercase: full Unicode case mapping, without locale;
// a code point maps to up to three, `ß` to `SS`) and `replace` of a literal by a literal (Rust's
// str::replace). Their length, their bytes copied out, and bytewise comparisons with another
// string need no buffer of their own. `upper` is tested against Rust for every code point, and
// `replace` case by case (kernels/tests/upper_case.rs).
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

// A string read a byte at a time: as it is (mode 0), uppercased (1), or with every
// non-overlapping occurrence of `from` (non-empty) replaced by `to`, left to right, as Rust's
// str::replace (2). Generated expressions compare such strings and store them without a buffer
// of their own.
struct StrStream {
    const u8* s;
    u64 n;
    u64 i;
    u32 mode;
    const u8* from;
    u64 from_n;
    const u8* to;
    u64 to_n;
    // Mode 2: the next byte of `to` being emitted (`to_n` when none).
    u64 to_i;
    // Mode 1: the rest of the current character's uppercase.
    u8 buf[12];
    u32 len;
    u32 pos;
};

__device__ inline StrStream plain_stream(const u8* s, u64 n) {
    StrStream it;
    it.s = s;
    it.n = n;
    it.i = 0u;
    it.mode = 0u;
    it.from = nullptr;
    it.from_n = 0u;
    it.to = nullptr;
    it.to_n = 0u;
    it.to_i = 0u;
    it.len = 0u;
    it.pos = 0u;
    return it;
}

__device__ inline StrStream upper_stream(const u8* s, u64 n) {
    StrStream it = plain_stream(s, n);
    it.mode = 1u;
    return it;
}

__device__ inline StrStream replace_stream(const u8* s, u64 n, const u8* from, u64 from_n, const u8* to, u64 to_n) {
    StrStream it = plain_stream(s, n);
    it.mode = 2u;
    it.from = from;
    it.from_n = from_n;
    it.to = to;
    it.to_n = to_n;
    it.to_i = to_n;
    return it;
}

// The next byte into `*b`; false at the end.
__device__ inline bool next_byte(StrStream* it, u8* b) {
    for (;;) {
        if (it->pos < it->len) {
            *b = it->buf[it->pos++];
            return true;
        }
        if (it->to_i < it->to_n) {
            *b = it->to[it->to_i++];
            return true;
        }
        if (it->i >= it->n) return false;
        if (it->mode == 2u && it->from_n > 0u && it->i + it->from_n <= it->n &&
            str_eq(it->s + it->i, it->from_n, it->from, it->from_n)) {
            it->i += it->from_n;
            it->to_i = 0u;
            continue;
        }
        const u8 lead = it->s[it->i];
        if (it->mode != 1u || lead < 0x80u) {
            *b = (it->mode == 1u && lead >= 'a' && lead <= 'z') ? (u8)(lead - 32u) : lead;
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
}

// Bytes in the stream.
__device__ inline u64 stream_len(StrStream it) {
    u64 count = 0u;
    u8 b;
    while (next_byte(&it, &b)) ++count;
    return count;
}

// Writes the stream's bytes to `dst` (stream_len of them).
__device__ inline void stream_copy(StrStream it, u8* dst) {
    u8 b;
    while (next_byte(&it, &b)) *dst++ = b;
}

// Three-way bytewise comparison of two streams.
__device__ inline int stream_cmp(StrStream x, StrStream y) {
    for (;;) {
        u8 p, q;
        const bool more_a = next_byte(&x, &p);
        const bool more_b = next_byte(&y, &q);
        if (!more_a || !more_b) return more_a ? 1 : (more_b ? -1 : 0);
        if (p != q) return p < q ? -1 : 1;
    }
}

}  // namespace spate
