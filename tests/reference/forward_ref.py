#!/usr/bin/env python3
"""Float64 reference forward pass of GGUF `llama`, `qwen2`, `qwen3`, `gemma2`, `gemma3`, `phi3`,
`qwen2moe` and `qwen3moe` models (numpy only), dense or mixture-of-experts.

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

Architecture additions (llama.cpp's definitions; keys under "<arch>."):
    qwen3, gemma3, qwen3moe
                    per head, q = rmsnorm(q) * attn_q_norm, k = rmsnorm(k) * attn_k_norm before RoPE
    gemma2, gemma3  x = token_embd[tokens] * sqrt(dim); tied output; FFN down(gelu_tanh(h Wg^T) * h Wu^T);
                    each branch b is added as rmsnorm(b) * post_attention_norm / post_ffw_norm;
                    scores scaled by attn_scale = 1/sqrt(head_dim) (1/sqrt(dim/n_heads) for the 27B
                    layer counts 46 / 62); gemma2: scores s -> c tanh(s/c), c = attn_logit_softcapping
                    (50), logits l -> c tanh(l/c), c = final_logit_softcapping (30)
    sliding window  (gemma2, gemma3, llama with attention.sliding_window W) a query at p sees keys
                    p-W+1..p on local layers: layer l is local iff l % n < n-1 for the pattern n
                    (attention.sliding_window_pattern; gemma2 2, gemma3 6, llama 0 = every layer);
                    gemma3's local layers use RoPE base rope.freq_base_swa (10000), no scaling
    phi3            attn_qkv rows = Q, K, V; ffn_up rows = gate, up
    RoPE scaling    angle_i = pos * freq_scale * inv_freq_i (freq_scale = 1 / rope.scaling.factor
                    unless the type is none or llama3); yarn: angle_i = a_interp (1 - r_i) + a_extrap r_i
                    with ggml's ramp r_i over the correction dims of beta_fast 32 / beta_slow 1 and
                    cos/sin times (1 + 0.1 ln factor); cos/sin also times rope.scaling.attn_factor;
                    inv_freq_i /= rope_freqs_i, or Phi-3's rope_factors_long_i (context > the original
                    context) / rope_factors_short_i, or Llama 3's factor computed from the keys

Mixture of experts (<arch>.expert_count > 0; llama.cpp's build_moe_ffn), in place of the dense FFN:
        p = softmax(h Wr^T) over the n experts; the k = expert_used_count largest (ties: lowest id)
        w = p[sel], divided by sum(w) for llama and qwen3moe (not qwen2moe)
        x += sum_r w_r * (silu(h Wg_e^T) * (h Wu_e^T)) Wd_e^T           e = sel_r
             [+ sigmoid(h . w_shexp) * (silu(h Wg_s^T) * (h Wu_s^T)) Wd_s^T]   qwen2moe's shared expert
Weights of GGUF shape ne = {in, out} are (out, in) arrays here, so y = x @ W.T; a 3-D expert tensor
{in, out, n} is n such arrays.

Q4_K, Q2_K and Q3_K matrices are multiplied as the engine's int8 route defines it
(engine/cpu/kernels.h): x, rounded to float32, is quantised per 256 elements to int8 (d = max|x| /
127, q = round-half-even of x * (127 / max|x|), in float32) and multiplied by the weights' exact
values d*sc*q - dmin*m (Q3_K: d*sc*q).
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
ARCH_ROPE = {"llama": ROPE_NORM, "qwen2": ROPE_NEOX, "qwen3": ROPE_NEOX, "gemma2": ROPE_NEOX,
             "gemma3": ROPE_NEOX, "phi3": ROPE_NEOX, "qwen2moe": ROPE_NEOX, "qwen3moe": ROPE_NEOX}
QK_NORM = ("qwen3", "gemma3", "qwen3moe")
GEMMA = ("gemma2", "gemma3")
SWA_PATTERN = {"gemma2": 2, "gemma3": 6, "llama": 0}  # architectures that honour the window


def gelu_tanh(x):
    return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * x * (1.0 + 0.044715 * x * x)))


def yarn_corr_dim(n_dims, n_ctx_orig, n_rot, base):
    return n_dims * math.log(n_ctx_orig / (n_rot * 2.0 * math.pi)) / (2.0 * math.log(base))


class I8Linear:
    """A matrix whose matmul takes int8 activations (engine/cpu/kernels.h: Q4_K, Q5_K, Q6_K and
    IQ4_XS with x in blocks of 256, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1 and IQ4_NL with x in blocks of
    32): its exact weight values, (out, in) float64."""

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
        self.ctx_len = int(hp("context_length", 2048))
        # rope scaling: positions times pos_scale (1 / factor); yarn and magnitude below
        st = g.get("%s.rope.scaling.type" % arch, "linear")
        factor = float(hp("rope.scaling.factor", hp("rope.scale_linear", 0.0)))
        if factor == 0.0 or st in ("none", "llama3"):
            factor = 1.0
        self.pos_scale = 1.0 / factor
        self.orig_ctx = int(hp("rope.scaling.original_context_length", self.ctx_len))
        self.attn_factor = float(hp("rope.scaling.attn_factor", 1.0))
        self.mscale = self.attn_factor
        self.yarn = None
        if st == "yarn":
            lo = math.floor(yarn_corr_dim(self.rope_dim, self.orig_ctx, float(hp("rope.scaling.yarn_beta_fast", 32.0)),
                                          self.rope_base))
            hi = math.ceil(yarn_corr_dim(self.rope_dim, self.orig_ctx, float(hp("rope.scaling.yarn_beta_slow", 1.0)),
                                         self.rope_base))
            self.yarn = (max(0.0, lo), min(self.rope_dim - 1.0, hi))
            self.mscale *= 1.0 + 0.1 * math.log(factor)
        # architecture features
        self.qk_norm = arch in QK_NORM
        self.gemma = arch in GEMMA
        self.embd_scale = math.sqrt(self.dim) if self.gemma else 1.0
        self.attn_scale = 1.0 / math.sqrt(self.head_dim)
        if (arch, self.n_layers) in (("gemma2", 46), ("gemma3", 62)):
            self.attn_scale = 1.0 / math.sqrt(self.dim // self.n_heads)
        self.attn_softcap = float(hp("attn_logit_softcapping", 50.0)) if arch == "gemma2" else 0.0
        self.logit_softcap = float(hp("final_logit_softcapping", 30.0)) if arch == "gemma2" else 0.0
        self.window = int(hp("attention.sliding_window", 0)) if arch in SWA_PATTERN else 0
        pattern = int(hp("attention.sliding_window_pattern", SWA_PATTERN.get(arch, 0)))
        self.local = [self.window > 0 and (pattern == 0 or i % pattern < pattern - 1)
                      for i in range(self.n_layers)]
        self.rope_base_swa = float(hp("rope.freq_base_swa", 10000.0)) if arch == "gemma3" else self.rope_base
        if self.n_heads % self.n_kv_heads:
            raise gguf_ref.GGUFError("n_heads %d not a multiple of n_kv_heads %d" %
                                     (self.n_heads, self.n_kv_heads))
        if self.rope_dim % 2 or self.rope_dim > self.head_dim:
            raise gguf_ref.GGUFError("bad rope dimension %d" % self.rope_dim)
        self.n_expert = int(hp("expert_count", 0))
        self.n_expert_used = int(hp("expert_used_count", 0)) if self.n_expert else 0
        if arch in ("qwen2moe", "qwen3moe") and not self.n_expert:
            raise gguf_ref.GGUFError("%s: %s without experts" % (path, arch))
        if self.n_expert and not 0 < self.n_expert_used <= self.n_expert:
            raise gguf_ref.GGUFError("bad expert_used_count %d" % self.n_expert_used)
        self.moe_norm_topk = arch != "qwen2moe"
        # a list to make route() append each call's per-token margins to (see route), else None
        self.route_margins = None

        T = g.tensor

        def M(name):  # a matrix used by a matmul
            if g.tensor_dtype(name) in (gguf_ref.DT_Q4_K, gguf_ref.DT_Q5_K, gguf_ref.DT_Q6_K,
                                        qleg_ref.DT_IQ4_XS, gguf_ref.DT_Q2_K, gguf_ref.DT_Q3_K):
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
        ffname = "rope_freqs.weight"
        if not g.has_tensor(ffname):
            ffname = "rope_factors_long.weight" if self.ctx_len > self.orig_ctx else "rope_factors_short.weight"
        if g.has_tensor(ffname):
            ff = T(ffname).reshape(-1)
            if ff.shape[0] != half:
                raise gguf_ref.GGUFError("%s has %d entries, want %d" % (ffname, ff.shape[0], half))
            inv_freq = inv_freq / ff
        elif st == "llama3":
            f = float(hp("rope.scaling.factor", 1.0))
            lo_f = float(hp("rope.scaling.low_freq_factor", 1.0))
            hi_f = float(hp("rope.scaling.high_freq_factor", 4.0))
            wl = 2.0 * math.pi / inv_freq
            lo_wl, hi_wl = self.orig_ctx / lo_f, self.orig_ctx / hi_f
            smooth = (self.orig_ctx / wl - lo_f) / (hi_f - lo_f)
            fac = np.where(wl > lo_wl, f, np.where(wl < hi_wl, 1.0, 1.0 / ((1.0 - smooth) / f + smooth)))
            if f > 1.0:
                inv_freq = inv_freq / fac
        self.inv_freq = inv_freq                                     # (rope_dim/2,)
        self.inv_freq_swa = self.rope_base_swa ** (-2.0 * np.arange(half, dtype=np.float64) / self.rope_dim)

        def opt(name):
            return T(name) if g.has_tensor(name) else None

        def M3(name):  # a 3-D expert tensor: one matrix per expert
            w = g.tensor(name, exact_q4k=True) if g.tensor_dtype(name) == gguf_ref.DT_Q4_K else g.tensor(name)
            if w.ndim != 3 or w.shape[0] != self.n_expert:
                raise gguf_ref.GGUFError("%s: shape %s, want (%d, out, in)" % (name, w.shape, self.n_expert))
            blk = {gguf_ref.DT_Q4_K: 256, gguf_ref.DT_Q8_0: 32, gguf_ref.DT_Q4_0: 32}.get(g.tensor_dtype(name))
            return [I8Linear(w[e], blk) if blk else w[e] for e in range(self.n_expert)]

        self.layers = []
        qd, kvd = self.n_heads * self.head_dim, self.n_kv_heads * self.head_dim
        for i in range(self.n_layers):
            p = "blk.%d." % i
            L = {
                "attn_norm": T(p + "attn_norm.weight"),
                "wo": M(p + "attn_output.weight"),  # (dim, n_heads*hd)
                "bq": opt(p + "attn_q.bias"),
                "bk": opt(p + "attn_k.bias"),
                "bv": opt(p + "attn_v.bias"),
                "ffn_norm": T(p + "ffn_norm.weight"),
                "q_norm": T(p + "attn_q_norm.weight") if self.qk_norm else None,
                "k_norm": T(p + "attn_k_norm.weight") if self.qk_norm else None,
                "post_attn_norm": T(p + "post_attention_norm.weight") if self.gemma else None,
                "post_ffn_norm": T(p + "post_ffw_norm.weight") if self.gemma else None,
            }
            if arch == "phi3" and g.has_tensor(p + "attn_qkv.weight"):
                w = M(p + "attn_qkv.weight")
                if isinstance(w, I8Linear):
                    raise gguf_ref.GGUFError("fused attn_qkv with int8 activations not supported by the reference")
                L["wq"], L["wk"], L["wv"] = w[:qd], w[qd:qd + kvd], w[qd + kvd:]
            else:
                L["wq"] = M(p + "attn_q.weight")    # (n_heads*hd, dim)
                L["wk"] = M(p + "attn_k.weight")    # (n_kv*hd, dim)
                L["wv"] = M(p + "attn_v.weight")    # (n_kv*hd, dim)
            if self.n_expert:
                L["router"] = M(p + "ffn_gate_inp.weight")        # (n_expert, dim)
                L["gate_exps"] = M3(p + "ffn_gate_exps.weight")   # n_expert x (eff, dim)
                L["up_exps"] = M3(p + "ffn_up_exps.weight")
                L["down_exps"] = M3(p + "ffn_down_exps.weight")   # n_expert x (dim, eff)
                if g.has_tensor(p + "ffn_gate_inp_shexp.weight"):
                    L["shexp_gate"] = T(p + "ffn_gate_inp_shexp.weight").reshape(1, -1)  # (1, dim)
                    L["w_gate"] = M(p + "ffn_gate_shexp.weight")
                    L["w_up"] = M(p + "ffn_up_shexp.weight")
                    L["w_down"] = M(p + "ffn_down_shexp.weight")
                elif arch == "qwen2moe":
                    raise gguf_ref.GGUFError("%s: qwen2moe layer %d without a shared expert" % (path, i))
            elif arch == "phi3":
                w = M(p + "ffn_up.weight")
                if isinstance(w, I8Linear):
                    raise gguf_ref.GGUFError("fused ffn_up with int8 activations not supported by the reference")
                nf = w.shape[0] // 2
                L["w_gate"], L["w_up"] = w[:nf], w[nf:]
                L["w_down"] = M(p + "ffn_down.weight")  # (dim, ffn)
            else:
                L["w_gate"] = M(p + "ffn_gate.weight")  # (ffn, dim)
                L["w_up"] = M(p + "ffn_up.weight")      # (ffn, dim)
                L["w_down"] = M(p + "ffn_down.weight")  # (dim, ffn)
            self.layers.append(L)

    def rmsnorm(self, x, w):
        return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + self.eps) * w

    def rope(self, x, pos, local=False):
        """x: (n, heads, head_dim), pos: (n,) -> rotated copy (local: a sliding-window layer's table)."""
        if local and self.arch == "gemma3":
            ang = pos.astype(np.float64)[:, None] * self.inv_freq_swa[None, :]
            msc = self.attn_factor
        else:
            extrap = pos.astype(np.float64)[:, None] * self.inv_freq[None, :]       # (n, r/2)
            ang = extrap * self.pos_scale
            if self.yarn is not None:
                lo, hi = self.yarn
                y = (np.arange(self.rope_dim // 2) - lo) / max(0.001, hi - lo)
                mix = 1.0 - np.clip(y, 0.0, 1.0)
                ang = ang * (1.0 - mix) + extrap * mix
            msc = self.mscale
        c = np.cos(ang)[:, None, :] * msc
        s = np.sin(ang)[:, None, :] * msc
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
        # local layers also mask keys at or before query position - window
        mask_local = np.where(np.arange(nk)[None, :] <= pos[:, None] - self.window, -np.inf, mask)
        scale = self.attn_scale
        x = self.tok_embd[tokens].copy() * self.embd_scale          # (n, dim)
        for li, L in enumerate(self.layers):
            local = self.local[li]
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
            q = q.reshape(n, H, hd)
            k = k.reshape(n, KV, hd)
            if L["q_norm"] is not None:
                q = self.rmsnorm(q, L["q_norm"])
                k = self.rmsnorm(k, L["k_norm"])
            q = self.rope(q, pos, local)
            k = self.rope(k, pos, local)
            v = v.reshape(n, KV, hd)
            k = np.concatenate([cache[li][0], k], axis=0)            # (nk, KV, hd)
            v = np.concatenate([cache[li][1], v], axis=0)
            cache[li] = (k, v)
            kh = np.repeat(k, group, axis=1)                         # (nk, H, hd)
            vh = np.repeat(v, group, axis=1)
            sc = np.einsum("qhd,khd->hqk", q, kh) * scale             # (H, n, nk)
            if self.attn_softcap > 0:
                sc = self.attn_softcap * np.tanh(sc / self.attn_softcap)
            sc = sc + (mask_local if local else mask)
            sc = sc - sc.max(axis=-1, keepdims=True)
            p = np.exp(sc)
            p = p / p.sum(axis=-1, keepdims=True)
            att = np.einsum("hqk,khd->qhd", p, vh).reshape(n, H * hd)
            o = lin(att, L["wo"])
            if L["post_attn_norm"] is not None:
                o = self.rmsnorm(o, L["post_attn_norm"])
            x = x + o
            h = self.rmsnorm(x, L["ffn_norm"])
            if self.n_expert:
                o = self.moe(h, L)
            else:
                gt = lin(h, L["w_gate"])
                up = lin(h, L["w_up"])
                act = gelu_tanh(gt) if self.gemma else gt / (1.0 + np.exp(-gt))
                o = lin(act * up, L["w_down"])
            if L["post_ffn_norm"] is not None:
                o = self.rmsnorm(o, L["post_ffn_norm"])
            x = x + o
        h = self.rmsnorm(x, self.output_norm)
        out = lin(h, self.output)                                     # (n, vocab)
        if self.logit_softcap > 0:
            out = self.logit_softcap * np.tanh(out / self.logit_softcap)
        return out

    @staticmethod
    def ffn(h, wg, wu, wd):
        gt = lin(h, wg)
        return lin(gt / (1.0 + np.exp(-gt)) * lin(h, wu), wd)

    def route(self, h, L):
        """-> (sel, w): per token the k chosen experts in rank order (descending probability, ties
        to the lowest id) and their weights."""
        lg = lin(h, L["router"])                                      # (n, n_expert)
        p = np.exp(lg - lg.max(axis=1, keepdims=True))
        p = p / p.sum(axis=1, keepdims=True)
        order = np.argsort(-p, axis=1, kind="stable")
        sel = order[:, :self.n_expert_used]
        if self.route_margins is not None and self.n_expert_used < self.n_expert:
            # margin of the choice: k-th largest probability minus the (k+1)-th
            ps = np.take_along_axis(p, order, axis=1)
            self.route_margins.append(ps[:, self.n_expert_used - 1] - ps[:, self.n_expert_used])
        w = np.take_along_axis(p, sel, axis=1)
        if self.moe_norm_topk:
            w = w / w.sum(axis=1, keepdims=True)
        return sel, w

    def moe(self, h, L):
        sel, w = self.route(h, L)
        out = np.zeros_like(h)
        for e in range(self.n_expert):
            rows, ranks = np.nonzero(sel == e)
            if rows.size:
                y = self.ffn(h[rows], L["gate_exps"][e], L["up_exps"][e], L["down_exps"][e])
                out[rows] += w[rows, ranks][:, None] * y
        if "shexp_gate" in L:
            s = lin(h, L["shexp_gate"])                               # (n, 1)
            out = out + self.ffn(h, L["w_gate"], L["w_up"], L["w_down"]) / (1.0 + np.exp(-s))
        return out

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
