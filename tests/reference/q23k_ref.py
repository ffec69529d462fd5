#!/usr/bin/env python3
"""Independent numpy dequantisers of the GGUF block types Q2_K and Q3_K (ggml types 10 and 11).

Written from the format description (llama.cpp ggml-common.h block layouts, ggml-quants.c
dequantisation), not from the engine's code; the 6-bit Q3_K scales are read bit by bit here where
the engine unpacks whole words.

Both have super-blocks of 256 weights in 16 sub-blocks of 16; weight k = 128c + 32p + l of a
super-block (c < 2, p < 4, l < 32) is bit pair p of byte 32c + l of qs, in sub-block k // 16.
  Q2_K (84 bytes): scales[16] (low nibble: the sub-block's scale sc, high nibble: its min m),
    qs[64], fp16 d, fp16 dmin.  w = d*sc*q - dmin*m, q in [0, 3]: in float32 every product is
    exact and the difference is rounded once (ggml), so it is computed exactly in float64 and
    rounded once to float32 (exact=True: not rounded, the value the engine's int8 route uses).
  Q3_K (110 bytes): hmask[32], qs[64], scales[12], fp16 d.  The 16 scales are 6-bit fields, minus
    32: field j's bits 0..3 are bits 4 (j // 8) .. 4 (j // 8) + 3 of byte j % 8, its bits 4..5
    are bits 2 (j // 4), 2 (j // 4) + 1 of byte 8 + j % 4. Weight k's high bit is bit 4c + p of
    hmask[l]; q = (bit pair) - (0 if the high bit is set else 4), in [-4, 3]. w = d*sc*q, exact in
    float32.
"""
import numpy as np

DT_Q2_K, DT_Q3_K = 10, 11
QK_K = 256
BLOCK_BYTES = {DT_Q2_K: 84, DT_Q3_K: 110}


def _two_bit_fields(qs):
    """qs (nb, 64) uint8 -> (nb, 256) int64: the bit pairs in weight order (c, p, l)."""
    nb = qs.shape[0]
    chunks = qs.astype(np.int64).reshape(nb, 2, 1, 32)
    shifts = (2 * np.arange(4, dtype=np.int64)).reshape(1, 1, 4, 1)
    return ((chunks >> shifts) & 3).reshape(nb, QK_K)


def q3k_scale_fields(sc):
    """sc (nb, 12) uint8 -> (nb, 16) int64: the signed scales (6-bit field - 32), bit by bit."""
    bits = np.unpackbits(sc, axis=1, bitorder="little").astype(np.int64)  # (nb, 96), byte i: 8i..
    out = np.zeros((sc.shape[0], 16), np.int64)
    for j in range(16):
        for b in range(4):
            out[:, j] |= bits[:, 8 * (j % 8) + 4 * (j // 8) + b] << b
        for b in range(2):
            out[:, j] |= bits[:, 64 + 8 * (j % 4) + 2 * (j // 4) + b] << (4 + b)
    return out - 32


def dequant(dtype, raw, n, exact=False):
    """raw: the bytes of n / 256 super-blocks -> (n,) float64 weights."""
    nb = n // QK_K
    blocks = np.frombuffer(raw, dtype=np.uint8, count=nb * BLOCK_BYTES[dtype]).reshape(nb, -1)
    if dtype == DT_Q2_K:
        scales = blocks[:, 0:16].astype(np.int64)
        q = _two_bit_fields(blocks[:, 16:80])
        d = blocks[:, 80:82].copy().view("<f2").astype(np.float64)       # (nb, 1)
        dmin = blocks[:, 82:84].copy().view("<f2").astype(np.float64)
        sc = np.repeat(scales & 15, 16, axis=1)                           # (nb, 256)
        m = np.repeat(scales >> 4, 16, axis=1)
        w = d * sc * q - dmin * m        # exact in float64 (at most ~50 significant bits)
        if not exact:
            w = w.astype(np.float32).astype(np.float64)
        return w.reshape(n)
    if dtype == DT_Q3_K:
        hbits = np.unpackbits(blocks[:, 0:32], axis=1, bitorder="little").reshape(nb, 32, 8)
        # weight (c, p, l): bit 4c + p of hmask[l]
        h = hbits.transpose(0, 2, 1).reshape(nb, 2, 4, 32).astype(np.int64).reshape(nb, QK_K)
        q = _two_bit_fields(blocks[:, 32:96]) - 4 * (1 - h)
        sc = np.repeat(q3k_scale_fields(blocks[:, 96:108]), 16, axis=1)
        d = blocks[:, 108:110].copy().view("<f2").astype(np.float64)
        return (d * sc * q).reshape(n)   # exact in float32 and float64
    raise ValueError("q23k_ref: dtype %d is not Q2_K or Q3_K" % dtype)
