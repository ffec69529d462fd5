#!/usr/bin/env python3
"""spillway's next-token distributions against llama.cpp's, on llama.cpp's own chunks.

llama.cpp's `llama-perplexity -f TEXT -c N --kl-divergence-base FILE.kld` writes the log-probs it
computed; this module reads that file (format below, defined by llama.cpp's
tools/perplexity/perplexity.cpp), runs `spillway logits` on exactly the token sequences llama.cpp
evaluated, and compares the two distributions at every scored position.

.kld layout (little-endian):
    8 bytes "_logits_", int32 n_ctx, int32 n_vocab, int32 n_chunk,
    int32 tokens[n_chunk * n_ctx]   (the text's tokens; when run, the first token of each chunk is
                                     replaced by BOS if the vocabulary adds one)
    then per chunk, per scored position j = n_ctx/2 .. n_ctx-2 (the logits at j predict token j+1):
    nv = 2 * ceil(n_vocab / 2) + 4 uint16: float32 scale, float32 min_log_prob (as 4 uint16), then
    n_vocab uint16 q with log p(i) = min_log_prob + scale * q(i) (clipped 16 nats below the top).

Figures (llama-perplexity's --kl-divergence definitions): KLD(llama.cpp || spillway) =
sum_i p_ref(i) (log p_ref(i) - log p(i)) per position over the ids whose stored log p_ref(i) is
above -16 (as llama.cpp sums: the stored values are clipped at 16 nats below the top, so below
that they are not p_ref's; on a peaked model, e.g. stories260K, summing the clipped ids too adds
~2e-4 nats of bias), its mean; top-1 agreement = share of
positions whose argmax is the same (ties broken to the lowest id on both sides); also the mean
NLL of the actual next tokens under each side (-> perplexity over the same scored positions).

Usage: kld.py SPILLWAY MODEL.gguf FILE.kld [--kv-type f16|f32] [--threads N]
Prints one line of figures; exit 0 (the caller judges bounds), 2 when spillway refuses the model.
"""
import os
import struct
import subprocess
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "reference"))
import gguf_ref  # noqa: E402


class KldFile:
    """A parsed .kld file: n_ctx, n_vocab, n_chunk, tokens [n_chunk][n_ctx] int32 and logp
    [n_chunk][n_ctx//2 - 1][n_vocab] float64 (llama.cpp's log-probs at the scored positions)."""

    def __init__(self, path):
        with open(path, "rb") as f:
            data = f.read()
        if data[:8] != b"_logits_":
            raise ValueError(f"{path}: not a llama.cpp logits file (magic {data[:8]!r})")
        self.n_ctx, self.n_vocab, self.n_chunk = struct.unpack_from("<iii", data, 8)
        if self.n_ctx < 4 or self.n_vocab < 2 or self.n_chunk < 1:
            raise ValueError(f"{path}: bad header {self.n_ctx} {self.n_vocab} {self.n_chunk}")
        off = 20
        nt = self.n_chunk * self.n_ctx
        self.tokens = np.frombuffer(data, dtype="<i4", count=nt, offset=off).reshape(
            self.n_chunk, self.n_ctx)
        off += 4 * nt
        nv = 2 * ((self.n_vocab + 1) // 2) + 4
        self.n_scored = self.n_ctx - 1 - self.n_ctx // 2
        n_rec = self.n_chunk * self.n_scored
        if len(data) != off + 2 * nv * n_rec:
            raise ValueError(f"{path}: {len(data)} bytes, expected {off + 2 * nv * n_rec}")
        rec = np.frombuffer(data, dtype="<u2", count=nv * n_rec, offset=off).reshape(n_rec, nv)
        head = rec[:, :4].copy().view("<f4")  # [n_rec][2]: scale, min_log_prob
        q = rec[:, 4:4 + self.n_vocab].astype(np.float64)
        logp = head[:, 1:2].astype(np.float64) + head[:, 0:1].astype(np.float64) * q
        self.logp = logp.reshape(self.n_chunk, self.n_scored, self.n_vocab)


def log_softmax(x):
    m = x.max(axis=-1, keepdims=True)
    z = x - m
    return z - np.log(np.exp(z).sum(axis=-1, keepdims=True))


def run_spillway(spillway, model, kld, kv_type="f16", threads=None, mode="batch"):
    """spillway's log-probs at kld's scored positions: [n_chunk][n_scored][n_vocab] float64.
    Raises RuntimeError with spillway's message when it refuses the model."""
    g = gguf_ref.GGUF(model)
    add_bos = g.get("tokenizer.ggml.add_bos_token", True)
    bos = g.get("tokenizer.ggml.bos_token_id", 1)
    with tempfile.TemporaryDirectory() as tmp:
        seqs = os.path.join(tmp, "seqs.txt")
        out = os.path.join(tmp, "logits.f32")
        with open(seqs, "w") as f:
            for c in range(kld.n_chunk):
                toks = [int(t) for t in kld.tokens[c]]
                if add_bos:
                    toks[0] = int(bos)
                f.write(" ".join(map(str, toks)) + "\n")
        cmd = [spillway, "logits", "-m", model, "-i", seqs, "-o", out, "--mode", mode,
               "--kv-type", kv_type, "--ctx", str(kld.n_ctx)]
        if threads:
            cmd += ["--threads", str(threads)]
        p = subprocess.run(cmd, capture_output=True, text=True)
        if p.returncode != 0:
            raise RuntimeError((p.stderr or p.stdout).strip().splitlines()[-1:] or ["failed"])
        lg = np.fromfile(out, dtype="<f4")
    n_vocab = lg.size // (kld.n_chunk * kld.n_ctx)
    if n_vocab != kld.n_vocab or lg.size != kld.n_chunk * kld.n_ctx * n_vocab:
        raise RuntimeError(f"spillway wrote {lg.size} logits, expected "
                           f"{kld.n_chunk} x {kld.n_ctx} x {kld.n_vocab}")
    lg = lg.reshape(kld.n_chunk, kld.n_ctx, n_vocab).astype(np.float64)
    first = kld.n_ctx // 2
    return log_softmax(lg[:, first:first + kld.n_scored, :])


def kl_div(lp, lq):
    """KLD(p || q) per position from log-probs lp (llama.cpp's, as stored) and lq, over the last
    axis, summing only the ids with lp > -16 (llama-perplexity's --kl-divergence convention)."""
    return np.where(lp > -16.0, np.exp(lp) * (lp - lq), 0.0).sum(axis=-1)


def compare(model, kld_path, spillway, kv_type="f16", threads=None):
    """Figures of spillway on model against llama.cpp's kld_path, as a dict."""
    kld = KldFile(kld_path)
    lq = run_spillway(spillway, model, kld, kv_type=kv_type, threads=threads)
    lp = kld.logp
    per_pos = kl_div(lp, lq)  # [n_chunk][n_scored]
    top_ref = lp.argmax(axis=-1)
    top_sp = lq.argmax(axis=-1)
    first = kld.n_ctx // 2
    nxt = kld.tokens[:, first + 1:first + 1 + kld.n_scored]
    ci, si = np.meshgrid(np.arange(kld.n_chunk), np.arange(kld.n_scored), indexing="ij")
    nll_ref = -lp[ci, si, nxt].mean()
    nll_sp = -lq[ci, si, nxt].mean()
    return {
        "positions": int(per_pos.size),
        "kld_mean": float(per_pos.mean()),
        "kld_max": float(per_pos.max()),
        "kld_p99": float(np.percentile(per_pos, 99)),
        "top1": float((top_ref == top_sp).mean()),
        "ppl_ref": float(np.exp(nll_ref)),
        "ppl_spillway": float(np.exp(nll_sp)),
        "disagree": [(int(c), int(first + s)) for c, s in zip(*np.nonzero(top_ref != top_sp))],
    }


def fmt(r):
    return (f"positions {r['positions']}  mean KLD {r['kld_mean']:.3e}  p99 {r['kld_p99']:.3e}  "
            f"max {r['kld_max']:.3e}  top-1 {100 * r['top1']:.2f}%  "
            f"PPL spillway {r['ppl_spillway']:.4f} llama.cpp {r['ppl_ref']:.4f}")


def main(argv):
    import argparse
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("spillway")
    ap.add_argument("model")
    ap.add_argument("kld")
    ap.add_argument("--kv-type", default="f16")
    ap.add_argument("--threads", type=int)
    a = ap.parse_args(argv[1:])
    try:
        r = compare(a.model, a.kld, a.spillway, kv_type=a.kv_type, threads=a.threads)
    except RuntimeError as e:
        print(f"refused: {e}")
        return 2
    print(fmt(r))
    if r["disagree"]:  # the first 20
        print("top-1 disagreements (chunk, position):", r["disagree"][:20])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
