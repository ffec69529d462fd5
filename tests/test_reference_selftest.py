#!/usr/bin/env python3
"""Self-test of the float64 reference (tests/reference/), independent of the engine.

Usage (ctest): test_reference_selftest.py <path-to-spillway (unused)> <models-dir>
Exit: 0 pass, 1 fail, 77 skip (numpy missing, or stories260K.gguf missing).

Checks:
  1. gguf_ref reads a GGUF v3 and a v2 file written here by hand (every metadata type; tensors
     F32, F16, BF16, Q8_0 with known values, including fp16 subnormals and a negative Q8_0 scale).
  2. stories260K.gguf hyper-parameters.
  3. Golden greedy outputs of /work/shared/models/README.md (llama2.c run.c and llama.cpp agree):
     (b1) prompt 1 403 407 261 378 -> the 60 listed ids; (a) 256 tokens from BOS whose text has the
     listed SHA-256; the whole story ends itself (BOS) after 345 tokens, 776 bytes of text.
  4. Internal consistency of the reference on stories260K:
     - one-shot forward of 257 tokens == token-by-token forward through the cache;
     - NEOX RoPE with Q/K rows permuted (per head: interleaved -> halves) == NORM RoPE;
     - GQA == the same model with its K/V heads duplicated into MHA;
     - tied output (output.weight removed, embedding set to it) == untied;
     - RoPE: linear scaling by f at position f*p == unscaled at p == rope_freqs f at f*p.
"""
import hashlib
import os
import struct
import sys
import tempfile
import time

import pycommon

np = pycommon.numpy_or_skip()
pycommon.reference_path()
import forward_ref  # noqa: E402
import gguf_ref  # noqa: E402

B1_IDS = [int(t) for t in """403 407 261 378 432 383 286 261 376 298 315 421 395 317 426 338 401 396
267 337 410 408 419 292 411 322 265 282 295 433 426 385 328 432 358 394 261 370 432 352 266 268 388
426 338 391 266 267 337 335 312 432 398 312 286 267 414 270 333 415 426 13 438 310""".split()]
A_SHA256 = "a3213f9ea026d75bf2993355ae334822d7c9d34328964c711ab030d3148e6cef"
A_BYTES = 566

failures = []


def check(cond, what):
    print("  %-4s %s" % ("ok" if cond else "FAIL", what))
    if not cond:
        failures.append(what)


# ---------------------------------------------------------------- 1. GGUF reader on known bytes

def _gstr(s):
    b = s.encode()
    return struct.pack("<Q", len(b)) + b


def write_gguf(path, version, kvs, tensors, alignment=32):
    """kvs: list of (key, type, packed value bytes); tensors: list of (name, ne, dtype, raw)."""
    out = b"GGUF" + struct.pack("<IQQ", version, len(tensors), len(kvs))
    for k, t, v in kvs:
        out += _gstr(k) + struct.pack("<I", t) + v
    offs, off = [], 0
    for name, ne, dt, raw in tensors:
        offs.append(off)
        off = (off + len(raw) + alignment - 1) // alignment * alignment
    for (name, ne, dt, raw), o in zip(tensors, offs):
        out += _gstr(name) + struct.pack("<I", len(ne)) + struct.pack("<%dQ" % len(ne), *ne)
        out += struct.pack("<IQ", dt, o)
    out += b"\0" * ((-len(out)) % alignment)
    data = bytearray(off)
    for (name, ne, dt, raw), o in zip(tensors, offs):
        data[o:o + len(raw)] = raw
    with open(path, "wb") as f:
        f.write(out + bytes(data))


def test_reader(tmp):
    print("gguf_ref on hand-written files:")
    f32 = np.array([1.5, -2.25, 3e-8, 65504.0, -0.0, 1e30], dtype="<f4")          # ne {3, 2}
    f16_bits = np.array([0x3C00, 0xC000, 0x0001, 0x03FF, 0x7BFF, 0x8400], dtype="<u2")
    f16_want = np.array([1.0, -2.0, 2.0 ** -24, 1023 * 2.0 ** -24, 65504.0, -2.0 ** -14])
    bf16_bits = np.array([0x3F80, 0xC040, 0x0001, 0x7F7F], dtype="<u2")
    bf16_want = np.array([1.0, -3.0, 2.0 ** -133, 255 * 2.0 ** 120])
    # Q8_0: 2 blocks; block 0 d = 0.5 (0x3800), q = -128..-97; block 1 d = -0.25 (0xB400), q = 0..31
    q0 = np.arange(-128, -96, dtype=np.int8)
    q1 = np.arange(0, 32, dtype=np.int8)
    q8_raw = (struct.pack("<H", 0x3800) + q0.tobytes() + struct.pack("<H", 0xB400) + q1.tobytes())
    q8_want = np.concatenate([0.5 * q0.astype(np.float64), -0.25 * q1.astype(np.float64)])
    kvs = [
        ("general.architecture", 8, _gstr("llama")),
        ("k.u8", 0, struct.pack("<B", 200)), ("k.i8", 1, struct.pack("<b", -5)),
        ("k.u16", 2, struct.pack("<H", 60000)), ("k.i16", 3, struct.pack("<h", -300)),
        ("k.u32", 4, struct.pack("<I", 4000000000)), ("k.i32", 5, struct.pack("<i", -7)),
        ("k.f32", 6, struct.pack("<f", 0.125)), ("k.bool", 7, struct.pack("<?", True)),
        ("k.u64", 10, struct.pack("<Q", 2 ** 40)), ("k.i64", 11, struct.pack("<q", -2 ** 40)),
        ("k.f64", 12, struct.pack("<d", 1e-300)),
        ("k.arr_i32", 9, struct.pack("<IQ", 5, 3) + struct.pack("<3i", 1, -2, 3)),
        ("k.arr_str", 9, struct.pack("<IQ", 8, 2) + _gstr("a b") + _gstr("")),
    ]
    tensors = [("t.f32", [3, 2], 0, f32.tobytes()), ("t.f16", [6], 1, f16_bits.tobytes()),
               ("t.bf16", [2, 2], 30, bf16_bits.tobytes()), ("t.q8", [32, 2], 8, q8_raw)]
    for version, align in ((3, 32), (2, 64)):
        path = os.path.join(tmp, "v%d.gguf" % version)
        kv = kvs + ([("general.alignment", 4, struct.pack("<I", align))] if align != 32 else [])
        write_gguf(path, version, kv, tensors, align)
        g = gguf_ref.GGUF(path)
        check(g.version == version and g.alignment == align, "v%d: version and alignment" % version)
        want = {"k.u8": 200, "k.i8": -5, "k.u16": 60000, "k.i16": -300, "k.u32": 4000000000,
                "k.i32": -7, "k.f32": 0.125, "k.bool": True, "k.u64": 2 ** 40, "k.i64": -2 ** 40,
                "k.f64": 1e-300, "general.architecture": "llama"}
        check(all(g.get(k) == v for k, v in want.items()), "v%d: scalar metadata" % version)
        check(list(g.get("k.arr_i32")) == [1, -2, 3] and g.get("k.arr_str") == ["a b", ""],
              "v%d: array metadata" % version)
        a = g.tensor("t.f32")
        check(a.shape == (2, 3) and a.dtype == np.float64 and
              np.array_equal(a.reshape(-1), f32.astype(np.float64)), "v%d: F32 tensor" % version)
        check(np.array_equal(g.tensor("t.f16"), f16_want), "v%d: F16 incl. subnormals" % version)
        b = g.tensor("t.bf16")
        check(b.shape == (2, 2) and np.array_equal(b.reshape(-1), bf16_want), "v%d: BF16" % version)
        q = g.tensor("t.q8")
        check(q.shape == (2, 32) and np.array_equal(q.reshape(-1), q8_want), "v%d: Q8_0" % version)
    bad = os.path.join(tmp, "bad.gguf")
    good = os.path.join(tmp, "v3.gguf")
    with open(good, "rb") as f:
        data = f.read()
    g = gguf_ref.GGUF(good)
    with open(bad, "wb") as f:  # ends inside the last tensor's data
        f.write(data[:g.data_start + g.tensors["t.q8"].offset + 10])
    try:
        gguf_ref.GGUF(bad)
        check(False, "truncated file refused")
    except gguf_ref.GGUFError:
        check(True, "truncated file refused")


# ---------------------------------------------------------------- 2-4. stories260K

def decode_runc(tokens, ids):
    """llama2.c run.c text of a greedy run from BOS: pieces with U+2581 as space, <0xXX> as
    bytes, the leading space after BOS dropped, then run.c's final newline."""
    out = b""
    prev = 1
    for t in ids:
        p = tokens[t]
        if len(p) == 6 and p.startswith("<0x") and p.endswith(">"):
            b = bytes([int(p[3:5], 16)])
        else:
            b = p.replace("\u2581", " ").encode()
        if prev == 1 and b.startswith(b" "):
            b = b[1:]
        out += b
        prev = t
    return out + b"\n"


def rel_err(a, b):
    return float(np.max(np.abs(a - b)) / np.max(np.abs(b)))


def test_stories(path):
    print("stories260K.gguf:")
    m = forward_ref.RefModel(path)
    check((m.arch, m.dim, m.n_layers, m.n_heads, m.n_kv_heads, m.head_dim, m.n_vocab,
           m.layers[0]["w_gate"].shape[0], m.rope_dim, m.rope_kind, m.tied) ==
          ("llama", 64, 5, 8, 4, 8, 512, 172, 8, forward_ref.ROPE_NORM, False),
          "hyper-parameters (dim 64, 5 layers, 8 heads / 4 kv, vocab 512, ffn 172, untied)")
    check(abs(m.eps - 1e-5) < 1e-12 and m.rope_base == 10000.0, "eps 1e-5, rope base 10000")

    got = m.greedy([1] + B1_IDS[:4], 60)
    check(got == B1_IDS[4:], "(b1) greedy ids after 1 403 407 261 378 match the README")
    if got != B1_IDS[4:]:
        print("       got:  %s\n       want: %s" % (got, B1_IDS[4:]))

    toks = m.g.get("tokenizer.ggml.tokens")
    a_ids = m.greedy([1], 256, stop=1)
    text = decode_runc(toks, a_ids)
    check(len(a_ids) == 256 and len(text) == A_BYTES and hashlib.sha256(text).hexdigest() == A_SHA256,
          "(a) 256 greedy tokens from BOS: %d bytes, SHA-256 %s..." % (len(text),
                                                                       hashlib.sha256(text).hexdigest()[:16]))
    story = m.greedy([1], 511, stop=1)
    check(len(story) == 345 and len(decode_runc(toks, story)) == 776,
          "whole greedy story ends with BOS after %d tokens, %d bytes (want 345, 776)" %
          (len(story), len(decode_runc(toks, story))))

    seq = [1] + a_ids
    full = m.forward(seq)
    cache = m.new_cache()
    inc = np.concatenate([m.forward(seq[:5], cache)] + [m.forward([t], cache) for t in seq[5:]])
    e = rel_err(inc, full)
    check(e < 1e-12, "one-shot forward == cached prefill(5) + decode, 257 positions (rel %.1e)" % e)
    check(all(int(np.argmax(full[i])) == seq[i + 1] for i in range(len(seq) - 1)),
          "teacher-forced argmax reproduces the greedy story")

    ref_seq = seq[:40]
    ref = m.forward(ref_seq)

    # NEOX with rows permuted per head so that pair (2i, 2i+1) becomes (i, i + hd/2)
    hd = m.head_dim
    perm_head = np.concatenate([np.arange(0, hd, 2), np.arange(1, hd, 2)])

    def permute_rows(w, heads):
        idx = np.concatenate([h * hd + perm_head for h in range(heads)])
        return w[idx]

    mn = forward_ref.RefModel(path)
    mn.rope_kind = forward_ref.ROPE_NEOX
    for L in mn.layers:
        L["wq"] = permute_rows(L["wq"], mn.n_heads)
        L["wk"] = permute_rows(L["wk"], mn.n_kv_heads)
    e = rel_err(mn.forward(ref_seq), ref)
    check(e < 1e-12, "NEOX RoPE on permuted Q/K rows == NORM RoPE (rel %.1e)" % e)

    # GQA -> MHA by duplicating each kv head's rows for its query heads
    mm = forward_ref.RefModel(path)
    group = mm.n_heads // mm.n_kv_heads
    for L in mm.layers:
        for key in ("wk", "wv"):
            w = L[key].reshape(mm.n_kv_heads, hd, mm.dim)
            L[key] = np.repeat(w, group, axis=0).reshape(mm.n_heads * hd, mm.dim)
    mm.n_kv_heads = mm.n_heads
    e = rel_err(mm.forward(ref_seq), ref)
    check(e < 1e-12, "GQA == same model expanded to MHA (rel %.1e)" % e)

    # RoPE scaling: linear factor f at position f*p == unscaled at p; rope_freqs = f (Llama 3
    # style, dividing the inverse frequencies) == linear factor f
    x = np.random.default_rng(5).normal(size=(6, 3, hd))
    p = np.arange(6)
    mr = forward_ref.RefModel(path)
    base = mr.rope(x, p)
    mr.pos_scale = 0.25
    e1 = rel_err(mr.rope(x, 4 * p), base)
    mr.pos_scale = 1.0
    mr.inv_freq = m.inv_freq / 4.0
    e2 = rel_err(mr.rope(x, 4 * p), base)
    check(e1 < 1e-14 and e2 < 1e-14, "RoPE linear scaling and rope_freqs division (rel %.1e, %.1e)" % (e1, e2))
    check(np.array_equal(m.rope(x, np.zeros(6, dtype=np.int64)), x), "RoPE at position 0 is the identity")

    # stories' output.weight is a copy of the embedding: tied and untied must agree exactly
    mt = forward_ref.RefModel(path)
    check(np.array_equal(mt.output, mt.tok_embd), "stories output.weight equals token_embd")
    mt.output = mt.tok_embd
    check(np.array_equal(mt.forward(ref_seq), ref), "tied output == untied copy")


def main(argv):
    if not pycommon.args_ok(argv):
        return 2
    t0 = time.time()
    with tempfile.TemporaryDirectory(prefix="spillway-refself-") as tmp:
        test_reader(tmp)
    path = os.path.join(argv[2], "stories260K.gguf")
    if not os.path.exists(path):
        print("SKIP: %s not found" % path)
        return 77
    test_stories(path)
    print("%d failure(s), %.1f s" % (len(failures), time.time() - t0))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
