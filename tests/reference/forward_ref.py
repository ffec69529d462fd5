#!/usr/bin/env python3
"""Float64 reference forward pass of GGUF `llama` and `qwen2` models (numpy only).

Independent of the engine: it reads the GGUF with gguf_ref.py and computes everything in float64
from the dequantised stored weights, whole-sequence at a time (no KV cache, no batching), so it
is the plain textbook transformer the engine must match.

Per sequence of n tokens at positions 0..n-1:
    x = token_embd[tokens]                                   (n, dim)
    per layer:
        h = rmsnorm(x) * attn_norm
        q = h Wq^T (+ bq),  k = h Wk^T (+ bk),  v = h Wv^T (+ bv)   (qwen2 has the biases)
        rope(q), rope(k)        llama: NORM pairs (x[2i], x[2i+1]); qwen2: NEOX pairs (x[i], x[i+r/2])
                                inv_freq[i] = base^(-2i/r) [/ rope_freqs[i]], angle = pos [/ factor] * inv_freq
        per query head hq, kv head hq // (n_heads / n_kv_heads):
            a = softmax_causal(q k^T / sqrt(head_dim)) v
        x += concat(a) Wo^T
        h = rmsnorm(x) * ffn_norm
        x += (silu(h Wg^T) * (h Wu^T)) Wd^T
    logits = (rmsnorm(x) * output_norm) Wout^T      Wout = output.weight, or token_embd.weight if absent

Weights of GGUF shape ne = {in, out} are (out, in) arrays here, so y = x @ W.T.

Q4_K matrices are multiplied as the engine's int8 route defines it (engine/cpu/kernels.h): x,
rounded to float32, is quantised per 256 elements to int8 (d = max|x| / 127, q = round-half-even
of x * (127 / max|x|), in float32) and multiplied by the weights' exact values d*sc*q - dmin*m.
Token embeddings are looked up as float32-rounded weights either way.

Usage as a script:
    forward_ref.py MODEL.gguf --greedy N [--prompt "1 403 ..."]   prints prompt + N greedy ids
    forward_ref.py MODEL.gguf --logits SEQS.txt -o OUT.f64          writes float64 logits
"""
import argparse
import math
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gguf_ref  # noqa: E402
import qleg_ref  # noqa: E402

ROPE_NORM, ROPE_NEOX = 0, 1
ARCH_ROPE = {"llama": ROPE_NORM, "qwen2": ROPE_NEOX}


class I8Linear:
    """A matrix whose matmul takes int8 activations (engine/cpu/kernels.h: Q4_K and IQ4_XS with x
    in blocks of 256, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1 and IQ4_NL with x in blocks of 32): its exact
    weight values, (out, in) float64."""

    def __init__(self, w, block):
        self.w = w
        self.block = block


def quant_i8(x, block):
    """x (n, K), K a multiple of block -> the dequantised int8 activations of the int8 route."""
    n, k = x.shape
    x32 = x.astype(np.float32).reshape(n, k // block, block)
    amax = np.abs(x32).max(axis=-1, keepdims=True)
    d = (amax / np.float32(127)).astype(np.float32)
    safe = np.where(amax > 0, amax, np.float32(1))
    iscale = np.where(amax > 0, np.float32(127) / safe, np.float32(0)).astype(np.float32)
    q = np.clip(np.rint((x32 * iscale).astype(np.float32)), -127, 127)
    return (d.astype(np.float64) * q).reshape(n, k)


def lin(x, w):
    """x (n, in) @ w^T for a plain (out, in) array or an I8Linear."""
    if isinstance(w, I8Linear):
        return quant_i8(x, w.block) @ w.w.T
    return x @ w.T


class RefModel:
    def __init__(self, path):
        g = gguf_ref.GGUF(path)
        self.g = g
        arch = g.get("general.architecture")
        if arch not in ARCH_ROPE:
            raise gguf_ref.GGUFError("%s: architecture %r not supported by the reference" % (path, arch))
        self.arch = arch

        def hp(key, default=None):
            v = g.get("%s.%s" % (arch, key), default)
            if v is None:
                raise gguf_ref.GGUFError("%s: metadata %s.%s missing" % (path, arch, key))
            return v

        self.dim = int(hp("embedding_length"))
        self.n_layers = int(hp("block_count"))
        self.n_heads = int(hp("attention.head_count"))
        self.n_kv_heads = int(hp("attention.head_count_kv", self.n_heads))
        self.head_dim = int(hp("attention.key_length", self.dim // self.n_heads))
        self.eps = float(hp("attention.layer_norm_rms_epsilon"))
        self.rope_base = float(hp("rope.freq_base", 10000.0))
        self.rope_dim = int(hp("rope.dimension_count", self.head_dim))
        self.rope_kind = ARCH_ROPE[arch]
        # linear rope scaling: positions divided by factor
        self.pos_scale = 1.0
        st = g.get("%s.rope.scaling.type" % arch)
        if st == "linear":
            self.pos_scale = 1.0 / float(hp("rope.scaling.factor"))
        elif g.get("%s.rope.scale_linear" % arch) is not None:
            self.pos_scale = 1.0 / float(hp("rope.scale_linear"))
        if self.n_heads % self.n_kv_heads:
            raise gguf_ref.GGUFError("n_heads %d not a multiple of n_kv_heads %d" %
                                     (self.n_heads, self.n_kv_heads))
        if self.rope_dim % 2 or self.rope_dim > self.head_dim:
            raise gguf_ref.GGUFError("bad rope dimension %d" % self.rope_dim)

        T = g.tensor

        def M(name):  # a matrix used by a matmul
            if g.tensor_dtype(name) in (gguf_ref.DT_Q4_K, qleg_ref.DT_IQ4_XS):
                return I8Linear(g.tensor(name, exact_q4k=True), 256)
            if g.tensor_dtype(name) in (gguf_ref.DT_Q8_0, gguf_ref.DT_Q4_0, qleg_ref.DT_Q4_1,
                                        qleg_ref.DT_Q5_0, qleg_ref.DT_Q5_1, qleg_ref.DT_IQ4_NL):
                return I8Linear(g.tensor(name, exact_q4k=True), 32)
            return g.tensor(name)

        self.tok_embd = T("token_embd.weight")                       # (vocab, dim)
        self.n_vocab = self.tok_embd.shape[0]
        self.output_norm = T("output_norm.weight")                   # (dim,)
        self.tied = not g.has_tensor("output.weight")
        self.output = M("token_embd.weight" if self.tied else "output.weight")  # (vocab, dim)
        half = self.rope_dim // 2
        inv_freq = self.rope_base ** (-2.0 * np.arange(half, dtype=np.float64) / self.rope_dim)
        if g.has_tensor("rope_freqs.weight"):
            ff = T("rope_freqs.weight").reshape(-1)
            if ff.shape[0] != half:
                raise gguf_ref.GGUFError("rope_freqs.weight has %d entries, want %d" % (ff.shape[0], half))
            inv_freq = inv_freq / ff
        self.inv_freq = inv_freq                                     # (rope_dim/2,)

        def opt(name):
            return T(name) if g.has_tensor(name) else None

        self.layers = []
        for i in range(self.n_layers):
            p = "blk.%d." % i
            L = {
                "attn_norm": T(p + "attn_norm.weight"),
                "wq": M(p + "attn_q.weight"),      # (n_heads*hd, dim)
                "wk": M(p + "attn_k.weight"),      # (n_kv*hd, dim)
                "wv": M(p + "attn_v.weight"),      # (n_kv*hd, dim)
                "wo": M(p + "attn_output.weight"),  # (dim, n_heads*hd)
                "bq": opt(p + "attn_q.bias"),
                "bk": opt(p + "attn_k.bias"),
                "bv": opt(p + "attn_v.bias"),
                "ffn_norm": T(p + "ffn_norm.weight"),
                "w_gate": M(p + "ffn_gate.weight"),  # (ffn, dim)
                "w_up": M(p + "ffn_up.weight"),      # (ffn, dim)
                "w_down": M(p + "ffn_down.weight"),  # (dim, ffn)
            }
            self.layers.append(L)

    def rmsnorm(self, x, w):
        return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + self.eps) * w

    def rope(self, x, pos):
        """x: (n, heads, head_dim), pos: (n,) -> rotated copy."""
        ang = (pos.astype(np.float64) * self.pos_scale)[:, None] * self.inv_freq[None, :]  # (n, r/2)
        c = np.cos(ang)[:, None, :]
        s = np.sin(ang)[:, None, :]
        out = x.copy()
        r = self.rope_dim
        if self.rope_kind == ROPE_NORM:
            a = x[:, :, 0:r:2]
            b = x[:, :, 1:r:2]
            out[:, :, 0:r:2] = a * c - b * s
            out[:, :, 1:r:2] = a * s + b * c
        else:
            a = x[:, :, 0:r // 2]
            b = x[:, :, r // 2:r]
            out[:, :, 0:r // 2] = a * c - b * s
            out[:, :, r // 2:r] = a * s + b * c
        return out

    def forward(self, tokens, cache=None):
        """tokens: ids -> logits (n, n_vocab) float64.

        Without cache the tokens sit at positions 0..n-1. With cache (a list from new_cache()) they
        continue the sequence already in it, at positions len..len+n-1, and their rotated K and V
        are appended: the same arithmetic, used by greedy() to avoid recomputing the prefix."""
        tokens = np.asarray(tokens, dtype=np.int64)
        n = tokens.shape[0]
        if n == 0:
            return np.zeros((0, self.n_vocab))
        if tokens.min() < 0 or tokens.max() >= self.n_vocab:
            raise ValueError("token id out of range")
        if cache is None:
            cache = self.new_cache()
        start = cache[0][0].shape[0]
        pos = np.arange(start, start + n)
        H, KV, hd = self.n_heads, self.n_kv_heads, self.head_dim
        group = H // KV
        nk = start + n
        # mask[i, j] = -inf when key j is after query i (query i is at position start + i)
        mask = np.where(np.arange(nk)[None, :] > pos[:, None], -np.inf, 0.0)  # (n, nk)
        scale = 1.0 / math.sqrt(hd)
        x = self.tok_embd[tokens].copy()                             # (n, dim)
        for li, L in enumerate(self.layers):
            h = self.rmsnorm(x, L["attn_norm"])
            q = lin(h, L["wq"])
            k = lin(h, L["wk"])
            v = lin(h, L["wv"])
            if L["bq"] is not None:
                q = q + L["bq"]
            if L["bk"] is not None:
                k = k + L["bk"]
            if L["bv"] is not None:
                v = v + L["bv"]
            q = self.rope(q.reshape(n, H, hd), pos)
            k = self.rope(k.reshape(n, KV, hd), pos)
            v = v.reshape(n, KV, hd)
            k = np.concatenate([cache[li][0], k], axis=0)            # (nk, KV, hd)
            v = np.concatenate([cache[li][1], v], axis=0)
            cache[li] = (k, v)
            kh = np.repeat(k, group, axis=1)                         # (nk, H, hd)
            vh = np.repeat(v, group, axis=1)
            sc = np.einsum("qhd,khd->hqk", q, kh) * scale + mask     # (H, n, nk)
            sc = sc - sc.max(axis=-1, keepdims=True)
            p = np.exp(sc)
            p = p / p.sum(axis=-1, keepdims=True)
            att = np.einsum("hqk,khd->qhd", p, vh).reshape(n, H * hd)
            x = x + lin(att, L["wo"])
            h = self.rmsnorm(x, L["ffn_norm"])
            gt = lin(h, L["w_gate"])
            up = lin(h, L["w_up"])
            x = x + lin(gt / (1.0 + np.exp(-gt)) * up, L["w_down"])
        h = self.rmsnorm(x, self.output_norm)
        return lin(h, self.output)                                    # (n, vocab)

    def new_cache(self):
        """Per layer (K, V), each (0, n_kv_heads, head_dim): an empty sequence."""
        e = np.zeros((0, self.n_kv_heads, self.head_dim))
        return [(e, e) for _ in self.layers]

    def greedy(self, prompt, n_new, stop=None):
        """Greedy continuation of prompt: up to n_new ids (fewer if id `stop` is produced; it is
        not included). Ties go to the lowest id."""
        cache = self.new_cache()
        logits = self.forward(prompt, cache)
        out = []
        while len(out) < n_new:
            nxt = int(np.argmax(logits[-1]))
            if nxt == stop:
                break
            out.append(nxt)
            logits = self.forward([nxt], cache)
        return out


def read_seqs(path):
    seqs = []
    with open(path) as f:
        for line in f:
            if line.strip():
                seqs.append([int(t) for t in line.split()])
    return seqs


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model")
    ap.add_argument("--greedy", type=int, help="generate this many tokens greedily")
    ap.add_argument("--prompt", default="1", help="space-separated prompt ids (default: BOS=1)")
    ap.add_argument("--logits", help="SEQS.txt: one sequence of ids per line")
    ap.add_argument("-o", "--out", help="output for --logits: raw float64 [positions][n_vocab]")
    a = ap.parse_args(argv[1:])
    m = RefModel(a.model)
    if a.greedy is not None:
        prompt = [int(t) for t in a.prompt.split()]
        print(" ".join(str(t) for t in prompt + m.greedy(prompt, a.greedy)))
    if a.logits:
        if not a.out:
            ap.error("--logits needs -o")
        with open(a.out, "wb") as f:
            for s in read_seqs(a.logits):
                f.write(m.forward(s).astype("<f8").tobytes())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
