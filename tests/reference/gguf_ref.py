#!/usr/bin/env python3
"""Minimal, independent GGUF v2/v3 reader for the float64 reference forward pass.

Written from the GGUF format description only (no gguf package, no engine code), so that an error
shared by the engine's reader and this one is unlikely.

File layout (all little-endian):
    u32 magic "GGUF", u32 version (2 or 3), u64 n_tensors, u64 n_kv,
    n_kv x { string key, u32 value_type, value },
    n_tensors x { string name, u32 n_dims, u64 ne[n_dims], u32 dtype, u64 offset },
    padding to `general.alignment` (default 32), then the data section; each tensor's offset is
    relative to the start of the data section.
    string = u64 length + bytes (no NUL); array = u32 elem_type + u64 count + elements.

Tensors come back as float64 numpy arrays of shape ne[::-1] (ne[0] is the innermost, contiguous
dimension), so a matrix of ne = {in, out} is an (out, in) array. Supported dtypes: F32, F16, BF16,
Q8_0 (blocks of 32: fp16 scale d + 32 int8 q, w = d * q, exact in float64),
Q4_0 (blocks of 32, 18 bytes: fp16 d + 16 bytes; weight i < 16 is the low nibble of byte i, weight
i + 16 its high nibble; w = d * (q - 8), exact in float64),
Q4_1, Q5_0, Q5_1, IQ4_NL, IQ4_XS (qleg_ref.py: their float32 values, exact in float64),
Q4_K (super-blocks of 256, 144 bytes: fp16 d, fp16 dmin, 12 bytes of packed 6-bit sub-block scales
and mins, 128 bytes of nibbles; 8 sub-blocks of 32; w = d*sc*q - dmin*m. ggml defines the weight as
that expression evaluated in float32, where every product is exact and only the difference is
rounded, so it is computed exactly here in float64 and rounded once to float32),
Q5_K (super-blocks of 256, 176 bytes: fp16 d, fp16 dmin, Q4_K's 12 scale bytes, 32 bytes qh, Q4_K's
128 bytes of nibbles; weight 32j + l's 5th bit (value 16) is bit j of qh[l]; w = d*sc*q - dmin*m,
one float32 rounding as Q4_K),
Q6_K (super-blocks of 256, 210 bytes: 128 bytes ql of low nibbles, 64 bytes qh of 2-bit pairs, 16
int8 scales of sub-blocks of 16, fp16 d last; in each half of 128 weights, weight 32i + l takes
the low (i < 2) or high (i >= 2) nibble of ql[l + 32 (i % 2)] of that half and bits 2i, 2i+1 of
qh[l]; w = (d*sc) * (q - 32): exact in float64, one float32 rounding, the sign of a zero that of
d*sc as ggml's float32 arithmetic gives it),
Q2_K and Q3_K (super-blocks of 256 in sub-blocks of 16: q23k_ref.py).

Usage as a script: gguf_ref.py FILE  prints the metadata and tensor list.
"""
import struct
import sys

import numpy as np

import q23k_ref
import qleg_ref  # Q4_1, Q5_0, Q5_1, IQ4_NL, IQ4_XS

GGUF_MAGIC = b"GGUF"

# metadata value types
T_U8, T_I8, T_U16, T_I16, T_U32, T_I32, T_F32, T_BOOL, T_STR, T_ARR, T_U64, T_I64, T_F64 = range(13)
_SCALAR = {
    T_U8: "<B", T_I8: "<b", T_U16: "<H", T_I16: "<h", T_U32: "<I", T_I32: "<i",
    T_F32: "<f", T_BOOL: "<?", T_U64: "<Q", T_I64: "<q", T_F64: "<d",
}
_NP_SCALAR = {
    T_U8: "<u1", T_I8: "<i1", T_U16: "<u2", T_I16: "<i2", T_U32: "<u4", T_I32: "<i4",
    T_F32: "<f4", T_BOOL: "<u1", T_U64: "<u8", T_I64: "<i8", T_F64: "<f8",
}

# tensor dtypes (ggml numbering)
DT_F32, DT_F16, DT_Q4_0, DT_Q8_0, DT_Q4_K, DT_BF16 = 0, 1, 2, 8, 12, 30
DT_Q5_K, DT_Q6_K = 13, 14
DT_Q2_K, DT_Q3_K = q23k_ref.DT_Q2_K, q23k_ref.DT_Q3_K
DTYPE_NAMES = {DT_F32: "f32", DT_F16: "f16", DT_Q4_0: "q4_0", DT_Q8_0: "q8_0", DT_Q4_K: "q4_K",
               DT_BF16: "bf16", DT_Q5_K: "q5_K", DT_Q6_K: "q6_K", DT_Q2_K: "q2_K", DT_Q3_K: "q3_K"}
QK8_0 = 32
Q8_0_BLOCK_BYTES = 2 + QK8_0
QK4_0 = 32
Q4_0_BLOCK_BYTES = 2 + QK4_0 // 2
QK_K = 256
Q4_K_BLOCK_BYTES = 2 + 2 + 12 + QK_K // 2
Q5_K_BLOCK_BYTES = 2 + 2 + 12 + QK_K // 8 + QK_K // 2
Q6_K_BLOCK_BYTES = QK_K // 2 + QK_K // 4 + QK_K // 16 + 2
# block size and bytes of the block types
_BLOCKS = {DT_Q8_0: (QK8_0, Q8_0_BLOCK_BYTES), DT_Q4_0: (QK4_0, Q4_0_BLOCK_BYTES),
           DT_Q4_K: (QK_K, Q4_K_BLOCK_BYTES), DT_Q5_K: (QK_K, Q5_K_BLOCK_BYTES),
           DT_Q6_K: (QK_K, Q6_K_BLOCK_BYTES), DT_Q2_K: (QK_K, q23k_ref.BLOCK_BYTES[DT_Q2_K]),
           DT_Q3_K: (QK_K, q23k_ref.BLOCK_BYTES[DT_Q3_K])}
DTYPE_NAMES.update(qleg_ref.NAMES)
_BLOCKS.update(qleg_ref.BLOCKS)


def q4k_scales_mins(sc):
    """sc: (nb, 12) uint8 -> (scales, mins), each (nb, 8) int: the 6-bit fields. Sub-blocks 0..3:
    low 6 bits of bytes 0..3 (scale) and 4..7 (min). Sub-blocks 4..7: scale = low nibble of byte
    j+4 plus the top 2 bits of byte j-4 as bits 4-5; min = high nibble of byte j+4 plus the top 2
    bits of byte j as bits 4-5."""
    sc = sc.astype(np.int64)
    scales = np.zeros((sc.shape[0], 8), np.int64)
    mins = np.zeros((sc.shape[0], 8), np.int64)
    for j in range(4):
        scales[:, j] = sc[:, j] & 63
        mins[:, j] = sc[:, j + 4] & 63
    for j in range(4, 8):
        scales[:, j] = (sc[:, j + 4] & 15) | ((sc[:, j - 4] >> 6) << 4)
        mins[:, j] = (sc[:, j + 4] >> 4) | ((sc[:, j] >> 6) << 4)
    return scales, mins


def q5k_values(blocks):
    """blocks: (nb, 176) uint8 -> (nb, 256) float64, the exact d*sc*q - dmin*m."""
    nb = blocks.shape[0]
    d = blocks[:, 0:2].copy().view("<f2").astype(np.float64)             # (nb, 1)
    dmin = blocks[:, 2:4].copy().view("<f2").astype(np.float64)
    scales, mins = q4k_scales_mins(blocks[:, 4:16])                       # (nb, 8) each
    qh = blocks[:, 16:48].astype(np.int64)                                # (nb, 32): qh[l]
    qs = blocks[:, 48:].astype(np.int64).reshape(nb, 4, 32)
    low = np.stack([qs & 15, qs >> 4], axis=2).reshape(nb, 8, 32)          # (nb, sub, l)
    bit = (qh[:, None, :] >> np.arange(8)[None, :, None]) & 1             # bit j of qh[l]
    q = low + 16 * bit
    w = (d[:, :, None] * scales[:, :, None]) * q - (dmin[:, :, None] * mins[:, :, None])
    return w.reshape(nb, QK_K)


def q6k_values(blocks):
    """blocks: (nb, 210) uint8 -> (nb, 256) float64, the exact (d*sc) * (q - 32)."""
    nb = blocks.shape[0]
    ql = blocks[:, 0:128].astype(np.int64).reshape(nb, 2, 2, 32)          # (half, i % 2, l)
    qh = blocks[:, 128:192].astype(np.int64).reshape(nb, 2, 32)           # (half, l)
    sc = blocks[:, 192:208].copy().view(np.int8).astype(np.float64)       # (nb, 16)
    d = blocks[:, 208:210].copy().view("<f2").astype(np.float64)         # (nb, 1)
    q = np.empty((nb, 2, 4, 32), np.int64)                                # (half, i, l)
    for i in range(4):
        nib = ql[:, :, i % 2, :]
        nib = nib & 15 if i < 2 else nib >> 4
        q[:, :, i, :] = nib | (((qh >> (2 * i)) & 3) << 4)
    ds = (d * sc).reshape(nb, 16, 1)                                      # sub-blocks of 16
    return (ds * (q.reshape(nb, 16, 16) - 32)).reshape(nb, QK_K)


class GGUFError(Exception):
    pass


class Tensor:
    """Tensor info; .array() dequantises the stored bytes to float64."""

    def __init__(self, name, ne, dtype, offset, raw):
        self.name = name
        self.ne = ne          # list, ne[0] innermost
        self.dtype = dtype
        self.offset = offset
        self.raw = raw        # memoryview of exactly the tensor's bytes

    @property
    def shape(self):
        return tuple(reversed(self.ne))

    def array(self, exact_q4k=False):
        """exact_q4k: K-quant (Q4_K, Q5_K, Q6_K, Q2_K) weights as their exact values (d*sc*q -
        dmin*m, (d*sc) * (q - 32)), not rounded to float32 (the values the engine's int8 route
        multiplies with: engine/cpu/kernels.h, kernels_q56k.h, q23k.h; Q3_K's are exact anyway);
        the same for Q4_1, Q5_1 (d*q + m) and IQ4_XS (d*(ls - 32)*KV[q])."""
        n = 1
        for d in self.ne:
            n *= d
        if self.dtype == DT_F32:
            flat = np.frombuffer(self.raw, dtype="<f4", count=n).astype(np.float64)
        elif self.dtype == DT_F16:
            flat = np.frombuffer(self.raw, dtype="<f2", count=n).astype(np.float64)
        elif self.dtype == DT_BF16:
            u16 = np.frombuffer(self.raw, dtype="<u2", count=n).astype(np.uint32)
            flat = (u16 << 16).astype("<u4").view("<f4").astype(np.float64)
        elif self.dtype == DT_Q8_0:
            nb = n // QK8_0
            blocks = np.frombuffer(self.raw, dtype=np.uint8, count=nb * Q8_0_BLOCK_BYTES)
            blocks = blocks.reshape(nb, Q8_0_BLOCK_BYTES)
            d = blocks[:, :2].copy().view("<f2").astype(np.float64)          # (nb, 1)
            q = blocks[:, 2:].copy().view(np.int8).astype(np.float64)        # (nb, 32)
            flat = (d * q).reshape(n)
        elif self.dtype == DT_Q4_0:
            nb = n // QK4_0
            blocks = np.frombuffer(self.raw, dtype=np.uint8, count=nb * Q4_0_BLOCK_BYTES)
            blocks = blocks.reshape(nb, Q4_0_BLOCK_BYTES)
            d = blocks[:, :2].copy().view("<f2").astype(np.float64)          # (nb, 1)
            qs = blocks[:, 2:].astype(np.int64)                               # (nb, 16)
            q = np.concatenate([qs & 15, qs >> 4], axis=1) - 8                # (nb, 32)
            flat = (d * q).reshape(n)
        elif self.dtype == DT_Q4_K:
            nb = n // QK_K
            blocks = np.frombuffer(self.raw, dtype=np.uint8, count=nb * Q4_K_BLOCK_BYTES)
            blocks = blocks.reshape(nb, Q4_K_BLOCK_BYTES)
            d = blocks[:, 0:2].copy().view("<f2").astype(np.float64)         # (nb, 1)
            dmin = blocks[:, 2:4].copy().view("<f2").astype(np.float64)      # (nb, 1)
            scales, mins = q4k_scales_mins(blocks[:, 4:16])                   # (nb, 8) each
            qs = blocks[:, 16:].astype(np.int64).reshape(nb, 4, 32)           # 4 chunks of 32 bytes
            # sub-block 2c = low nibbles of chunk c, sub-block 2c+1 = its high nibbles
            q = np.stack([qs & 15, qs >> 4], axis=2).reshape(nb, 8, 32)       # (nb, sub, 32)
            w = (d[:, :, None] * scales[:, :, None]) * q - (dmin[:, :, None] * mins[:, :, None])
            flat = (w if exact_q4k else w.astype(np.float32).astype(np.float64)).reshape(n)
        elif self.dtype in (DT_Q2_K, DT_Q3_K):
            flat = q23k_ref.dequant(self.dtype, self.raw, n, exact_q4k)
        elif self.dtype in (DT_Q5_K, DT_Q6_K):
            nb = n // QK_K
            bb = _BLOCKS[self.dtype][1]
            blocks = np.frombuffer(self.raw, dtype=np.uint8, count=nb * bb).reshape(nb, bb)
            w = q5k_values(blocks) if self.dtype == DT_Q5_K else q6k_values(blocks)
            flat = (w if exact_q4k else w.astype(np.float32).astype(np.float64)).reshape(n)
        elif self.dtype in qleg_ref.BLOCKS:
            flat = qleg_ref.dequant(self.dtype, self.raw, n, exact=exact_q4k).astype(np.float64)
        else:
            raise GGUFError("tensor %s: unsupported dtype %d" % (self.name, self.dtype))
        return flat.reshape(self.shape)


def _nbytes(dtype, ne, name):
    n = 1
    for d in ne:
        n *= d
    if dtype == DT_F32:
        return 4 * n
    if dtype in (DT_F16, DT_BF16):
        return 2 * n
    if dtype in _BLOCKS:
        qk, bb = _BLOCKS[dtype]
        if ne[0] % qk:
            raise GGUFError("tensor %s: %s row of %d not a multiple of %d" %
                            (name, DTYPE_NAMES[dtype], ne[0], qk))
        return n // qk * bb
    return None  # unknown size: listed, but not readable


class GGUF:
    def __init__(self, path):
        with open(path, "rb") as f:
            self.buf = f.read()
        self.path = path
        self.pos = 0
        if self._take(4) != GGUF_MAGIC:
            raise GGUFError("%s: not a GGUF file" % path)
        self.version = self._u("<I")
        if self.version not in (2, 3):
            raise GGUFError("%s: GGUF version %d unsupported" % (path, self.version))
        n_tensors = self._u("<Q")
        n_kv = self._u("<Q")
        self.kv = {}
        self.kv_types = {}
        for _ in range(n_kv):
            key = self._str()
            vt = self._u("<I")
            self.kv[key] = self._value(vt)
            self.kv_types[key] = vt
        infos = []
        for _ in range(n_tensors):
            name = self._str()
            n_dims = self._u("<I")
            if not 1 <= n_dims <= 4:
                raise GGUFError("tensor %s: %d dims" % (name, n_dims))
            ne = [self._u("<Q") for _ in range(n_dims)]
            dtype = self._u("<I")
            offset = self._u("<Q")
            infos.append((name, ne, dtype, offset))
        self.alignment = int(self.kv.get("general.alignment", 32))
        a = self.alignment
        self.data_start = (self.pos + a - 1) // a * a
        self.tensors = {}
        mv = memoryview(self.buf)
        for name, ne, dtype, offset in infos:
            nb = _nbytes(dtype, ne, name)
            start = self.data_start + offset
            if nb is not None and start + nb > len(self.buf):
                raise GGUFError("tensor %s: data beyond end of file" % name)
            raw = mv[start:start + nb] if nb is not None else None
            self.tensors[name] = Tensor(name, ne, dtype, offset, raw)

    # -- low-level readers --
    def _take(self, n):
        if self.pos + n > len(self.buf):
            raise GGUFError("%s: truncated at byte %d" % (self.path, self.pos))
        b = self.buf[self.pos:self.pos + n]
        self.pos += n
        return b

    def _u(self, fmt):
        return struct.unpack(fmt, self._take(struct.calcsize(fmt)))[0]

    def _str(self):
        n = self._u("<Q")
        return self._take(n).decode("utf-8", errors="replace")

    def _value(self, vt):
        if vt in _SCALAR:
            return self._u(_SCALAR[vt])
        if vt == T_STR:
            return self._str()
        if vt == T_ARR:
            et = self._u("<I")
            n = self._u("<Q")
            if et in _NP_SCALAR:
                size = np.dtype(_NP_SCALAR[et]).itemsize
                arr = np.frombuffer(self._take(n * size), dtype=_NP_SCALAR[et])
                return arr
            return [self._value(et) for _ in range(n)]
        raise GGUFError("%s: bad metadata type %d at byte %d" % (self.path, vt, self.pos))

    # -- accessors --
    def get(self, key, default=None):
        return self.kv.get(key, default)

    def has_tensor(self, name):
        return name in self.tensors

    def tensor(self, name, exact_q4k=False):
        t = self.tensors.get(name)
        if t is None:
            raise GGUFError("%s: tensor %s missing" % (self.path, name))
        return t.array(exact_q4k)

    def tensor_dtype(self, name):
        return self.tensors[name].dtype


def main(argv):
    if len(argv) != 2:
        print("usage: gguf_ref.py FILE", file=sys.stderr)
        return 2
    g = GGUF(argv[1])
    print("version %d, alignment %d, %d kv, %d tensors" %
          (g.version, g.alignment, len(g.kv), len(g.tensors)))
    for k, v in g.kv.items():
        if isinstance(v, (list, np.ndarray)):
            head = v[:4].tolist() if isinstance(v, np.ndarray) else v[:4]
            s = "[%d] %s" % (len(v), head)
        else:
            s = repr(v)
        print("  %-45s %s" % (k, s[:100]))
    for t in g.tensors.values():
        print("  %-32s %-5s ne=%s" % (t.name, DTYPE_NAMES.get(t.dtype, str(t.dtype)), t.ne))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
