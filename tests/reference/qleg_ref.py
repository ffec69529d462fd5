#!/usr/bin/env python3
"""Independent numpy dequantisers of Q4_1, Q5_0, Q5_1, IQ4_NL and IQ4_XS (ggml type numbers 3, 6,
7, 20, 23), written from the block layouts (no engine code, no gguf package).

Blocks (little-endian, fp16 = IEEE half):
    Q4_1   32 weights, 20 bytes: fp16 d, fp16 m, 16 bytes of nibbles; w = d*q + m
    Q5_0   32 weights, 22 bytes: fp16 d, u32 qh, 16 bytes of nibbles; q = nibble | bit i of qh << 4;
           w = d*(q - 16)
    Q5_1   32 weights, 24 bytes: fp16 d, fp16 m, u32 qh, 16 bytes of nibbles; w = d*q + m
    IQ4_NL 32 weights, 18 bytes: fp16 d, 16 bytes of nibbles; w = d*KV[q]
    IQ4_XS 256 weights, 136 bytes: fp16 d, u16 scales_h, 4 bytes scales_l, 128 bytes of nibbles in
           8 sub-blocks of 16 bytes; sub-block j's 6-bit scale ls = nibble j of scales_l (low nibble
           of byte j//2 first) | bits 2j, 2j+1 of scales_h << 4; w = (d*(ls - 32))*KV[q]
In a 32-weight block (or IQ4_XS sub-block) weight i < 16 is the low nibble of byte i, weight i + 16
its high nibble. KV is the fixed 16-entry non-linear grid below.

The values are computed in float32 in ggml's order: d*q and d*(ls - 32) are exact, so each weight
is rounded once (the + m, or the product with KV[q] for IQ4_XS).
"""
import numpy as np

DT_Q4_1, DT_Q5_0, DT_Q5_1, DT_IQ4_NL, DT_IQ4_XS = 3, 6, 7, 20, 23
NAMES = {DT_Q4_1: "q4_1", DT_Q5_0: "q5_0", DT_Q5_1: "q5_1", DT_IQ4_NL: "iq4_nl",
         DT_IQ4_XS: "iq4_xs"}
# elements and bytes per block
BLOCKS = {DT_Q4_1: (32, 20), DT_Q5_0: (32, 22), DT_Q5_1: (32, 24), DT_IQ4_NL: (32, 18),
          DT_IQ4_XS: (256, 136)}
KV = np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113],
              dtype=np.float32)


def _half(blocks, off):
    """The fp16 field at byte off of each block, as float32 (nb, 1)."""
    return blocks[:, off:off + 2].copy().view("<f2").astype(np.float32)


def _nibbles(qs):
    """(nb, 16) bytes -> (nb, 32) ints in weight order: low nibbles, then high nibbles."""
    qs = qs.astype(np.int64)
    return np.concatenate([qs & 15, qs >> 4], axis=1)


def _fifth_bits(qh):
    """(nb, 4) bytes, a little-endian u32 each -> (nb, 32) bits, bit i for weight i."""
    word = qh.copy().view("<u4").astype(np.int64)            # (nb, 1)
    return (word >> np.arange(32, dtype=np.int64)) & 1


def dequant(dtype, raw, n, exact=False):
    """The n float32 values of n weights of dtype stored in raw (bytes-like); exact: instead their
    exact values d*q + m and d*(ls - 32)*KV[q] in float64, before the one float32 rounding (the
    values the engine's int8 routes multiply with: engine/cpu/kernels.h)."""
    qk, bb = BLOCKS[dtype]
    nb = n // qk
    blocks = np.frombuffer(raw, dtype=np.uint8, count=nb * bb).reshape(nb, bb)
    f = np.float64 if exact else np.float32
    if dtype == DT_Q4_1:
        d, m = _half(blocks, 0).astype(f), _half(blocks, 2).astype(f)
        q = _nibbles(blocks[:, 4:]).astype(f)
        w = d * q + m
    elif dtype == DT_Q5_0:
        d = _half(blocks, 0).astype(f)
        q = _nibbles(blocks[:, 6:]) | (_fifth_bits(blocks[:, 2:6]) << 4)
        w = d * (q - 16).astype(f)
    elif dtype == DT_Q5_1:
        d, m = _half(blocks, 0).astype(f), _half(blocks, 2).astype(f)
        q = _nibbles(blocks[:, 8:]) | (_fifth_bits(blocks[:, 4:8]) << 4)
        w = d * q.astype(f) + m
    elif dtype == DT_IQ4_NL:
        d = _half(blocks, 0).astype(f)
        w = d * KV[_nibbles(blocks[:, 2:])].astype(f)
    elif dtype == DT_IQ4_XS:
        d = _half(blocks, 0).astype(f)                                # (nb, 1)
        sh = blocks[:, 2:4].copy().view("<u2").astype(np.int64)       # (nb, 1)
        sl = blocks[:, 4:8].astype(np.int64)                          # (nb, 4)
        lo = np.stack([sl & 15, sl >> 4], axis=2).reshape(nb, 8)      # nibble j of scales_l
        hi = (sh >> (2 * np.arange(8, dtype=np.int64))) & 3
        ls = lo | (hi << 4)                                           # (nb, 8)
        dl = d * (ls - 32).astype(f)                                  # exact
        qs = blocks[:, 8:].reshape(nb * 8, 16)
        idx = _nibbles(qs).reshape(nb, 8, 32)
        w = dl[:, :, None] * KV[idx].astype(f)
    else:
        raise ValueError("dtype %d is not one of this module's" % dtype)
    assert w.dtype == f
    return w.reshape(n)
