/* engine/cpu/kernels_impl.h: the per-ISA kernel tables behind kern_get(). Internal to
 * engine/cpu/kernels*.c.
 *
 * Each table is a static const object defined in its own translation unit; the AVX2 and AVX-512
 * units compile their functions for those ISAs with `#pragma GCC target`, so a table may only
 * be used after kern_get() checked the CPU (kern_get is the only caller). */
#ifndef SPILLWAY_ENGINE_CPU_KERNELS_IMPL_H
#define SPILLWAY_ENGINE_CPU_KERNELS_IMPL_H

#include "engine/cpu/kernels.h"
#include "engine/dtype.h"

#include <string.h>

/* Quantised super-blocks of x kept on the stack (kern_q4k_matmul): Q4_K rows up to this many
 * super-blocks (57,344 elements). */
#define KERN_Q8K_STACK 224
/* Q8_0 and Q4_0 rows up to this many elements (their quantised x kept on the stack when it fits). */
#define KERN_Q8_STACK (KERN_Q8K_STACK * 256)

/* 1 when matmul supports weight type t with row length K. */
static inline int kern_wtype_ok(int t, int64_t K)
{
    switch (t) {
    case DT_F32: case DT_F16: case DT_BF16: return K >= 0;
    case DT_Q8_0: return K >= 0 && K % QK8_0 == 0 && K <= KERN_Q8_STACK;
    case DT_Q4_0: return K >= 0 && K % QK4_0 == 0 && K <= KERN_Q8_STACK;
    case DT_Q4_K: case DT_Q5_K: case DT_Q6_K: case DT_IQ4_XS: case DT_Q2_K: case DT_Q3_K:
        return K >= 0 && K % QK_K == 0 && K <= (int64_t)KERN_Q8K_STACK * QK_K;
    case DT_Q4_1: case DT_Q5_0: case DT_Q5_1: case DT_IQ4_NL:
        return K >= 0 && K % 32 == 0 && K <= KERN_Q8_STACK;
    default: return 0;
    }
}

/* ---- Streaming passes: the row order of a few tokens' pass over weights read from memory ----
 * Such a pass takes its rows [ob, oe) in tiles of R rows (R > 1), tile i < q = (oe - ob) / R
 * made of the rows ob + i + j q, j < R: each row slot of the tile walks its own run of q
 * consecutive rows, so the pass reads R sequential streams, which the hardware prefetchers
 * follow. (R consecutive rows per tile interleave the reads within a page when rows are short --
 * a 2048-wide Q4_K row is 1152 bytes -- and streamed up to 25% slower: bench/RESULTS.md,
 * 2026-12-03.) The rows ob + R q .. oe - 1 are the caller's, one at a time. A row's arithmetic
 * does not depend on the rows beside it in a tile (kernels.h's batch invariance), so the order
 * changes no value. The tile (row stride q * wrb) writes its R x C sums to t[c * R + r]
 * (t of at least KERN_SPREAD_MAX floats); kern_spread_store puts them in place. */
#define KERN_SPREAD_MAX 64 /* R * C of the largest streaming tile */

/* y[c * ldy + r * q] = t[c * R + r] for r < R, c < C; y at the tile's first row. */
static inline void kern_spread_store(const float *t, int R, int C, float *y, int64_t ldy,
                                     int64_t q)
{
    for (int c = 0; c < C; c++)
        for (int r = 0; r < R; r++) y[c * ldy + r * q] = t[c * R + r];
}

/* ---- Q4_K's int8 route (kernels.h), shared by every ISA ---- */

/* The ISA's part: y[t * ldy + o] for t < T, o in [o0, o1), from rows of nsb Q4_K super-blocks
 * and the quantised tokens xq[t * nsb + s]. */
typedef void (*kern_q4k_fn)(const char *W, size_t wrb, int64_t nsb, const kern_q8k_t *xq, int T,
                            float *y, int64_t ldy, int64_t o0, int64_t o1);

/* matmul for DT_Q4_K: quantises x with quant (kern_q8k_quantize or an ISA's version of it,
 * which must give the same bits) (all T tokens into one heap buffer, or on the stack in chunks
 * of tokens when that allocation fails) and runs fn. Returns 0, or -1 when K is not supported
 * (kern_wtype_ok). */
typedef void (*kern_q8k_fn)(const float *x, int64_t K, kern_q8k_t *out);
int kern_q4k_matmul(kern_q4k_fn fn, kern_q8k_fn quant, const void *W, size_t wrb, int64_t K, const float *x,
                    int64_t ldx, float *y, int64_t ldy, int T, int64_t o0, int64_t o1);

/* ---- Q4_K, Q5_K, Q6_K, IQ4_XS and Q8_0 packed in groups of 16 rows (kern_table_t.pack_bytes/pack/matmul_packed;
 * engine/cpu/kpack*.c) ----
 * Rows 16g .. 16g+15 of a matrix (rows past the last: zero blocks) form group g; its
 * super-block s (nsb = K / 256 per row) is the SB_BYTES at (g * nsb + s) * SB_BYTES (Q8_0: its
 * pair of blocks p at (g * ceil(nb / 2) + p) * PAIR_BYTES, nb = K / 32), the same
 * bytes as the 16 rows' blocks, rearranged so that one 64-byte line holds the same 4 quant bytes
 * of all 16 rows, a row per 32-bit lane (row r's bytes at 4 r): one int8 dot-product instruction
 * multiplies them with 4 of a token's xq at once, and a group is one sequential stream.
 * Q4_K (2304 bytes):
 *   0..31     d of rows 0..15 (fp16), 32..63 their dmin (fp16);
 *   64..255   word w (< 3) of the rows' 12 scale bytes at 64 + 64 w;
 *   256..2303 word i (< 32) of the rows' 128 qs bytes at 256 + 64 i.
 * Q5_K (2816 bytes): Q4_K's first 256 bytes, then 40 lines at 256 + 64 line in the order one
 *   token's pass first reads them: word m (< 8) of the rows' 32 qh bytes at line 2m, word m of
 *   their qs at line 2m + 1, word 8c + m of their qs (c = 1..3) at line 8 + 8c + m
 *   (kern_q5k_line).
 * Q6_K (3392 bytes: the rows' 3360 and 32 of padding, so that every line of quants is a whole
 * cache line):
 *   0..31      d of rows 0..15 (fp16);
 *   32..287    scales 2p, 2p + 1 (p < 8; int8) of row r at 32 + 32 p + 2 r;
 *   288..319   zero;
 *   320..3391  48 lines in the order one token's pass reads them: for h < 2 and wi < 8, word
 *              16h + wi of ql, word 16h + 8 + wi of ql, word 8h + wi of qh (line 24h + 3wi + 0,
 *              1, 2 at 320 + 64 line).
 * IQ4_XS (2176 bytes):
 *   0..31     d of rows 0..15 (fp16), 32..63 their scales_h (16 bits each), 64..127 their
 *             scales_l (4 bytes each);
 *   128..2175 word i (< 32) of the rows' 128 qs bytes at 128 + 64 i.
 * Q8_0 (1088 bytes per pair of blocks 2p, 2p + 1 of 32 weights; an odd last block alone in a
 * whole pair, its second half zero):
 *   0..63      d of rows 0..15 (fp16), block 2p then block 2p + 1;
 *   64..1087   word m (< 8) of block 2p + h's quants at 64 + 512 h + 64 m, each byte q + 128
 *              (its top bit flipped: unsigned, as vpdpbusd's first operand wants).
 * F16 (1024 bytes per unit of 32 columns; K a multiple of 32): column k's 16 halves (rows
 *   0..15) at 32 (k mod 32), so a group's whole matrix is column after column, 32 bytes each. */
#define KERN_F16X16_UNIT_BYTES 1024
#define KERN_Q4KX16_SB_BYTES 2304
#define KERN_Q5KX16_SB_BYTES 2816
/* The line (< 40) of qs word i (< 32) of a packed Q5_K super-block, or of qh word m (< 8) as
 * kern_q5k_line(-1, m): see the layout above. */
static inline int kern_q5k_line(int i, int m)
{
    if (i < 0) return 2 * m;
    return i < 8 ? 2 * i + 1 : 8 + i;
}
#define KERN_Q6KX16_SB_BYTES 3392
#define KERN_Q6KX16_QOFF 320
#define KERN_Q8X16_PAIR_BYTES 1088
#define KERN_IQ4XSX16_SB_BYTES 2176
/* Bytes of the packed copy of a rows x K matrix of wtype: 0 unless wtype is DT_Q4_K, DT_Q5_K, DT_Q6_K,
 * DT_IQ4_XS, DT_Q8_0 or DT_F16 (K a multiple of 32), rows >= 1 and kern_wtype_ok(wtype, K) with
 * K > 0. */
size_t kern_kx16_bytes(int wtype, int64_t rows, int64_t K);
/* Packs W (rows x K, row o at (const char *)W + o * wrb) into dst (kern_kx16_bytes long). */
void kern_kx16_pack(int wtype, const void *W, size_t wrb, int64_t rows, int64_t K, void *dst);
#ifdef __x86_64__
/* matmul_packed of the avx512-vnni table (engine/cpu/kpack_avx512.c). */
int kern_kx16_matmul_vnni(int wtype, const void *P, int64_t K, const float *x, int64_t ldx,
                          float *y, int64_t ldy, int T, int64_t o0, int64_t o1);
#endif

/* ---- the int8 route of Q8_0 and Q4_0 (kernels.h), shared by every ISA ---- */

/* The ISA's part: y[t * ldy + o] for t < T, o in [o0, o1), from rows of nb blocks of 32 and the
 * quantised tokens: token t's quants at xq + t * nb * 32, its block scales at xd + t * nb. */
typedef void (*kern_b32_fn)(const char *W, size_t wrb, int64_t nb, const int8_t *xq,
                            const float *xd, int T, float *y, int64_t ldy, int64_t o0, int64_t o1);
/* kern_q8_quantize or an ISA's version of it (the same bits). */
typedef void (*kern_q8_fn)(const float *x, int64_t K, int8_t *q, float *d);

/* matmul for wtype DT_Q8_0 or DT_Q4_0: quantises the T tokens with quant (into one heap buffer,
 * or on the stack in chunks of tokens when that is too small and the allocation fails) and runs
 * fn. Returns 0, or -1 when K is not supported (kern_wtype_ok). */
int kern_b32_matmul(int wtype, kern_b32_fn fn, kern_q8_fn quant, const void *W, size_t wrb,
                    int64_t K, const float *x, int64_t ldx, float *y, int64_t ldy, int T,
                    int64_t o0, int64_t o1);

/* The 8 scales and 8 mins of a Q4_K super-block as four words whose bytes, stored, are sc 0..3,
 * sc 4..7, m 0..3, m 4..7 (byte-wise operations on words loaded and stored in host order). */
static inline void q4k_unpack_words(const uint8_t *scales, uint32_t v[4])
{
    uint32_t a, b, c;
    memcpy(&a, scales, 4);
    memcpy(&b, scales + 4, 4);
    memcpy(&c, scales + 8, 4);
    v[0] = a & 0x3f3f3f3fu;
    v[1] = (c & 0x0f0f0f0fu) | ((a >> 6) & 0x03030303u) << 4;
    v[2] = b & 0x3f3f3f3fu;
    v[3] = ((c >> 4) & 0x0f0f0f0fu) | ((b >> 6) & 0x03030303u) << 4;
}

/* q4k_unpack_words as two 64-bit words, scale (min) i at bits 8i on a little-endian CPU (x86:
 * one move each into a vector register). */
static inline void q4k_unpack64(const uint8_t *scales, uint64_t *sc, uint64_t *mn)
{
    uint32_t v[4];
    q4k_unpack_words(scales, v);
    *sc = v[0] | (uint64_t)v[1] << 32;
    *mn = v[2] | (uint64_t)v[3] << 32;
}

/* The software prefetch of weights streamed from memory in one pass (decode: each weight byte
 * read once per step): the line at p into L2 and the outer levels but not into L1
 * (`prefetcht1` on x86), so that lines fetched kilobytes ahead for several rows at once do not
 * evict the lines the loads use now. A volatile asm, like attn_prefetch_line. Performance only. */
static inline void kern_pf_stream(const void *p)
{
#if defined(__x86_64__) || defined(__i386__)
    __asm__ volatile("prefetcht1 %0" : : "m"(*(const char *)p));
#else
    __builtin_prefetch(p, 0, 2);
#endif
}

/* The three lines of the Q4_K super-block pfd bytes past b, streamed (kern_pf_stream; pfd 0:
 * none). */
static inline void q4k_prefetch(const void *b, size_t pfd)
{
    if (!pfd) return;
    for (int i = 0; i < 3; i++) kern_pf_stream((const char *)b + pfd + 64 * i);
}

/* The two lines pfd bytes past b, streamed (kern_pf_stream; pfd 0: none): a block of <= 128
 * bytes followed by the next ones, so consecutive blocks cover every line. */
static inline void kern_pf_stream2(const void *b, size_t pfd)
{
    if (!pfd) return;
    kern_pf_stream((const char *)b + pfd);
    kern_pf_stream((const char *)b + pfd + 64);
}

/* The 8 scales and 8 mins of a Q4_K super-block (engine/dtype.h's q4k_scale_min, all at once). */
static inline void q4k_unpack(const uint8_t *scales, uint8_t sc[8], uint8_t mn[8])
{
    uint32_t v[4];
    q4k_unpack_words(scales, v);
    memcpy(sc, v, 8);
    memcpy(mn, v + 2, 8);
}

extern const kern_table_t kern_table_scalar;
#if defined(__x86_64__) && defined(__GNUC__)
#define KERN_HAVE_X86 1
extern const kern_table_t kern_table_avx2;
extern const kern_table_t kern_table_avx512;
extern const kern_table_t kern_table_avx512_vnni;
/* The AVX2 and AVX-512 versions of kern_q8k_quantize (the same bits), for other route files. */
void kern_q8k_quantize_avx2(const float *x, int64_t K, kern_q8k_t *out);
void kern_q8k_quantize_avx512(const float *x, int64_t K, kern_q8k_t *out);
void kern_q8_quantize_avx512(const float *x, int64_t K, int8_t *q, float *d);
#endif

#endif
