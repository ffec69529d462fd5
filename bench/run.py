#!/usr/bin/env python3
"""bench/run.py: the engine benchmark of issues 8 and 19, side by side with llama.cpp when given its binaries.

One command: builds Release (spillway, bench_engine, bench_prefix, bench_kernels), makes the
synthetic models it needs with `spillway mkmodel` (under BUILD/models, reused when present) and
prints one table of min / median / max figures, with the ratio spillway median / llama.cpp median
and a goal column. The table and notes are appended to bench/RESULTS.md with the date, git
revision, CPU model and command line (--no-record: not).

Figures (each measured --reps times unless stated):
  (e) ceilings, in the same run (first and last): bench_kernels --ceilings --json: memory read
      bandwidth (2 threads), copy bandwidth (bytes read + written per second, STREAM's convention),
      the best OpenBLAS sgemm rate and the best rate of our own matmul (over f32/f16/bf16/q8_0),
      both at M = 512 on SmolLM2-135M matrix shapes. Each is the best of --kernel-rounds rounds of
      both runs.
  (a) prefill tokens/s of one --prompt-token prompt (512): bench_engine vs llama-bench -p 512.
  (b) single-stream decode tokens/s, --gen tokens (128): bench_engine vs llama-bench -n 128.
  (c) batched decode, generated tokens/s of N sequences (--batches 4,16,64) with 16-token prompts:
      bench_engine vs llama-batched-bench -npp 16 -ntg 128 -npl 4,16,64 (its S_TG figure).
  (d) the shared-prefix workload (--prefix-dtypes, default the first dtype): 64 requests, each a
      1,024-token shared prefix + 32 unique tokens, generating 32 tokens each, all submitted at
      once (bench_prefix --workloads shared). Figure, the same on both sides: OUTPUT tokens per
      second over the whole workload = 64 x 32 / wall seconds from the first prompt token to the
      last generated token. spillway with its prefix cache on (--reps times) and off (--reps-long
      times, default 1: the long one) against llama-batched-bench:
        no sharing:  -npp 1056 -ntg 32 -npl 64. Exactly our workload: 64 x 1,056 prompt tokens,
                     then 32 decode steps of 64 sequences. Compared with spillway cache on (the
                     goal, >= 3x) and cache off (engine against engine, no goal).
        -pps (fair): -npp 1024 -ntg 64 -npl 64 -pps. llama-batched-bench cannot give each sequence
                     unique prompt tokens after a shared prompt: it computes the 1,024 shared
                     tokens once, copies their KV to the 64 sequences, and decodes. The 32 unique
                     tokens per sequence are therefore run as 32 extra decode steps of all 64
                     sequences (same tokens, same KV positions 1024..1087, matmuls of 64 rows
                     per step): the same 1,024 + 64 x 64 = 5,120 token computations as spillway
                     with the cache. The output figure still counts 64 x 32 tokens, over the
                     whole time (t_pp + t_tg). This is the goal row (>= 1.2x). It is fair at 64
                     sequences, where a decode step is a 64-row matmul running near the GEMM rate
                     (bench_kernels: T=64 within ~10% of T=512), plus 32 steps' overhead; with few
                     requests (--quick, --prefix-requests 2) it penalises llama.cpp, whose suffix
                     steps are then weight-bandwidth-bound.
        -pps (literal): -npp 1024 -ntg 32 -npl 64 -pps: drops the unique suffixes, 40% fewer token
                     computations than our workload, so it favours llama.cpp: printed, no goal.
                     The fair figure lies between the two -pps rows.
      llama-batched-bench excludes from its times the KV copy (and the dummy token that applies
      it) that -pps does after the shared prompt; with --llama-kvu it shares the prompt's KV cells
      instead (-kvu, unified KV cache) and copies nothing.
  Derived (from the same samples, so min / median / max carry over):
    decode at batch 1 as achieved GB/s of weights streamed = weight bytes per token x tokens/s,
    against the measured 2-thread read bandwidth twice: the best of the run's two ceiling
    measurements (bench_kernels, first and last), and the median of the ones bench_engine takes
    between its decode-1 repetitions (a shared machine's bandwidth changes from minute to minute:
    on the Zen 5 build machine F16 decode ran 159 tok/s in one run and 237 ten minutes later, the
    same code; the second figure compares with what the machine gave at that time), and, third,
    each repetition against the two probes taken just before and after it in the same process
    (the share per repetition, then min / median / max over them; goal on the median): on a
    guest whose bandwidth jumps between two levels from minute to minute (bench/RESULTS.md,
    AMD EPYC), only a probe adjacent in time measures what that repetition could get. Weight bytes
    per token = every tensor of the GGUF
    (matrices and norms; the embedding counted once when tied, as it is the output head; left
    out when an untied output head exists, as decode reads one row of it); the KV cache read
    (16-128 positions) is not counted.
    prefill GFLOP/s = FLOPs of the P-token prompt / seconds, FLOPs = 2 x P x (parameters of the
    layers' matrices) + 2 x dim x vocab (the output head, for the last token only) + causal
    attention 4 x n_heads x head_dim x P(P+1)/2 per layer (QK^T and PV; about 8% of the total at
    P = 512 on SmolLM2-135M), against the best GEMM rate measured (max of sgemm and our matmul).

Dtypes (--dtypes, default f16,q8_0,q4_k): f32, f16, bf16, q8_0, q4_0 come straight from
`spillway mkmodel --preset P --dtype T`. q4_k: SmolLM2-135M's dim 576 is not a multiple of Q4_K's
256-weight super-block, so `--dtype q4_k` alone writes Q4_0 for all but ffn_down; run.py instead
converts the F32 model with `mkmodel --from F32 --dtype q4_k --pad 256` (--q4k-pad; dim padded to
768 with zeros, an equivalent model; attn_output stays Q4_0: its rows are n_heads x head_dim =
576): a true Q4_K model, a bit larger than SmolLM2-135M. --q4k-pad 0 uses the unpadded file.
Both sides always read the same GGUF file. llama.cpp's own mixes and K-quants (--dtypes q4_k_m,
q6_k, or any other llama-quantize type name in lower case, e.g. q5_k_m, iq4_xs) are made by
`llama-quantize MODEL-f16.gguf OUT TYPE` (--llama-quantize, or llama-quantize in --llama-dir) from
the preset's F16 file; without llama-quantize those dtypes are skipped with a note.

Presets (--preset): 135m (= smollm2-135m, the default: dim 576, 30 layers, 9/3 heads, ffn 1536,
vocab 49152, tied) and llama-1b (= llama-3.2-1b: the Llama-3.2-1B shape, dim 2048, 16 layers,
32/8 heads, ffn 8192, vocab 128256, tied; defaults --dtypes f16,q8_0,q4_k_m,q6_k --batches 16
and no shared-prefix workload, which would take hours at this size on 2 threads); any other
`spillway mkmodel --preset` name is passed through. A dtype spillway refuses to load (a weight
type it does not support yet) is reported as "refused" rows with llama.cpp's figures alone; the
run goes on.

Goals (GOALS below; 2 threads, printed whatever the settings). smollm2-135m (issue 8): F16
prefill >= 1.0x llama.cpp, F16 single-stream decode >= 1.0x, F16 decode at 16 sequences >= 1.5x;
Q8_0 and Q4_K single-stream decode >= 1.0x; batch-1 decode >= 80% of the measured read bandwidth
and prefill >= 70% of the best GEMM rate (every dtype); shared prefix >= 3x llama-batched-bench
without sharing and >= 1.2x with -pps (fair row). llama-3.2-1b (issue 19), every dtype: prefill
and single-stream decode >= 1.0x llama.cpp, decode at 16 sequences >= 1.3x, single-stream decode
>= 85% of the read bandwidth (no prefill GEMM goal: its rate is printed). Other presets: no goal.

--interleave runs the engines in turns: each of --reps rounds runs one repetition of spillway's
bench_engine, then one of llama-bench and llama-batched-bench, and a figure's min / median / max
are over the rounds. On a machine whose memory bandwidth or CPU share moves within minutes (a
shared VM) both sides then see the same minutes; without it all of spillway's repetitions run
before all of llama.cpp's. It costs a model load per round.

Without --llama-bench / --llama-batched-bench (or --llama-dir) only spillway is measured; a
llama.cpp run that fails (e.g. a GGUF it refuses) is reported in the notes and its cells left
empty. --quick shrinks every workload (prompt 128, 32 generated, batches 4,16, shared prefix
8 x (256 + 16) -> 16, one repetition, kernels 1 round of 0.05 s per cell) to test the harness.

Full run: 10-15 min on a quiet 2-core machine (579 s at caf93f0, 836 s at 1af0fb2), plus the
build on a fresh checkout; --quick takes ~2 min. Run it on a quiet machine: the notes give the
load average and the CPUs other processes (and a hypervisor's steal) took during the run, and call
the run busy above 0.25 of a CPU; llama.cpp's spinning OpenMP threads lose up to 40x when other
processes take the cores:
  bench/run.py --dtypes f16,q8_0,q4_k --reps 3 --llama-dir /work/peer/llama.cpp/build/bin
"""
import argparse
import datetime
import json
import mmap
import os
import shlex
import statistics
import struct
import subprocess
import sys
import tempfile
import time

from machine import cpu_model, cpu_snapshot, others_cpus

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
T0 = time.monotonic()

# ---------------------------------------------------------------------------- helpers


def log(msg):
    print(f"[run.py {time.monotonic() - T0:7.1f}s] {msg}", file=sys.stderr, flush=True)


def sh(cmd, **kw):
    log("$ " + " ".join(shlex.quote(c) for c in cmd))
    return subprocess.run(cmd, check=True, text=True, **kw)


def mmm(vals):
    vals = sorted(vals)
    return vals[0], statistics.median(vals), vals[-1]


def merge_rounds(rounds):
    """bench_engine's records of several runs (a list per run) as one run's: per workload the
    min / median / max over the runs' medians (each run's own when there is one run)."""
    if len(rounds) == 1:
        return rounds[0]
    out, seen = [], {}
    for recs in rounds:
        for r in recs:
            key = (r.get("workload"), r.get("n"), r.get("gen"))
            if key not in seen:
                seen[key] = dict(r, _vals=[])
                out.append(seen[key])
            elif "pairs" in r:  # decode1_pairs: every run's repetitions
                seen[key]["pairs"] = seen[key]["pairs"] + r["pairs"]
            if "median" in r:
                seen[key]["_vals"].append(r["median"])
    for r in out:
        vals = r.pop("_vals")
        if vals:
            r["min"], r["median"], r["max"] = mmm(vals)
    return out


def scale(t, k):
    return None if t is None else tuple(v * k for v in t)


def ints(s):
    return [int(x) for x in s.split(",") if x.strip()]


# ---------------------------------------------------------------------------- GGUF header

# ggml type id -> (name, elements per block, bytes per block)
GGML_TYPES = {0: ("f32", 1, 4), 1: ("f16", 1, 2), 2: ("q4_0", 32, 18), 3: ("q4_1", 32, 20),
              6: ("q5_0", 32, 22), 7: ("q5_1", 32, 24), 8: ("q8_0", 32, 34), 9: ("q8_1", 32, 36),
              10: ("q2_K", 256, 84), 11: ("q3_K", 256, 110), 12: ("q4_K", 256, 144),
              13: ("q5_K", 256, 176), 14: ("q6_K", 256, 210), 15: ("q8_K", 256, 292),
              30: ("bf16", 1, 2)}
_SCALAR = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q",
           12: "<d"}


def read_gguf(path):
    """Metadata (arrays of more than 16 elements skipped) and tensor infos of a GGUF file:
    {"kv": {key: value}, "tensors": [(name, ne list, type id, nbytes)]}."""
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
        if m[:4] != b"GGUF":
            raise ValueError(f"{path}: not a GGUF file")
        version, n_t, n_kv = struct.unpack_from("<IQQ", m, 4)
        off = 24

        def rd(fmt):
            nonlocal off
            v = struct.unpack_from(fmt, m, off)[0]
            off += struct.calcsize(fmt)
            return v

        def rstr():
            nonlocal off
            n = rd("<Q")
            s = bytes(m[off:off + n]).decode("utf-8", "replace")
            off += n
            return s

        def rval(t):
            if t in _SCALAR:
                return rd(_SCALAR[t])
            if t == 8:
                return rstr()
            if t == 9:
                et, n = rd("<I"), rd("<Q")
                vals = [rval(et) for _ in range(n)]
                return vals if n <= 16 else f"[{n} values]"
            raise ValueError(f"{path}: GGUF value type {t} unknown")

        kv = {}
        for _ in range(n_kv):
            k = rstr()
            kv[k] = rval(rd("<I"))
        tensors = []
        for _ in range(n_t):
            name = rstr()
            nd = rd("<I")
            ne = [rd("<Q") for _ in range(nd)]
            t = rd("<I")
            rd("<Q")
            n = 1
            for d in ne:
                n *= d
            _, bs, bb = GGML_TYPES.get(t, (str(t), 1, 0))
            tensors.append((name, ne, t, n // bs * bb))
        return {"version": version, "kv": kv, "tensors": tensors}


def model_figures(path):
    """Shapes, type census, decode bytes per token and a prefill FLOP function of a GGUF model."""
    g = read_gguf(path)
    kv, ts = g["kv"], g["tensors"]
    arch = kv.get("general.architecture", "llama")
    by = {name: (ne, t, nb) for name, ne, t, nb in ts}
    n_layers = int(kv.get(f"{arch}.block_count", 0))
    n_heads = int(kv.get(f"{arch}.attention.head_count", 1))
    q = by.get("blk.0.attn_q.weight")
    head_dim = q[0][1] // n_heads if q else 0
    emb = by.get("token_embd.weight")
    dim, vocab = (emb[0][0], emb[0][1]) if emb else (0, 0)
    untied = "output.weight" in by
    bytes_tok = sum(nb for name, _, _, nb in ts if not (untied and name == "token_embd.weight"))
    layer_params = sum(ne[0] * ne[1] for name, ne, _, _ in ts if name.startswith("blk.") and len(ne) == 2)
    census = {}
    for name, ne, t, _ in ts:
        if len(ne) == 2:
            tn = GGML_TYPES.get(t, (str(t),))[0]
            census[tn] = census.get(tn, 0) + 1

    def prefill_flops(p):
        return (2.0 * p * layer_params + 2.0 * dim * vocab
                + n_layers * 4.0 * n_heads * head_dim * p * (p + 1) / 2)

    return {"arch": arch, "dim": dim, "vocab": vocab, "layers": n_layers, "heads": n_heads,
            "head_dim": head_dim, "bytes_per_token": bytes_tok,
            "total_bytes": sum(nb for *_, nb in ts), "census": census,
            "params": sum(ne[0] * (ne[1] if len(ne) > 1 else 1) for _, ne, _, _ in ts),
            "prefill_flops": prefill_flops}


# ---------------------------------------------------------------------------- llama.cpp


def json_lines(text):
    """Every line of text that parses as a JSON object (llama.cpp mixes them with its logs)."""
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("{") and line.endswith("}"):
            try:
                out.append(json.loads(line))
            except ValueError:
                pass
    return out


def run_peer(cmd, notes, what, timeout):
    """Runs a llama.cpp command; its stdout + stderr, or None (a note says why) when it fails."""
    log("$ " + " ".join(shlex.quote(c) for c in cmd))
    try:
        r = subprocess.run(cmd, text=True, capture_output=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired) as e:
        notes.append(f"llama.cpp {what}: {e}")
        return None
    if r.returncode != 0:
        tail = [l for l in (r.stderr + r.stdout).splitlines() if l.strip()]
        errs = [l for l in tail if any(w in l.lower() for w in ("error", "failed", "invalid"))]
        notes.append(f"llama.cpp {what} exited {r.returncode}: " + " / ".join((errs or tail)[-4:]))
        return None
    return r.stdout + "\n" + r.stderr


def llama_bench(args, model, p, g, notes, info, reps=None):
    """{"prefill": [samples], "decode": [samples]} tokens/s from llama-bench -o jsonl, -r reps
    (default args.reps)."""
    cmd = [args.llama_bench, "-m", model, "-p", str(p), "-n", str(g), "-t", str(args.threads),
           "-r", str(reps or args.reps), "-o", "jsonl"] + shlex.split(args.llama_args)
    out = run_peer(cmd, notes, f"llama-bench on {os.path.basename(model)}", args.timeout)
    res = {}
    for r in json_lines(out or ""):
        samples = r.get("samples_ts") or ([r["avg_ts"]] if "avg_ts" in r else [])
        if not samples:
            continue
        if r.get("n_prompt") == p and r.get("n_gen") == 0:
            res["prefill"] = list(samples)
        elif r.get("n_gen") == g and r.get("n_prompt") == 0:
            res["decode"] = list(samples)
        for k in ("build_commit", "build_number", "model_size", "model_n_params", "model_type",
                  "flash_attn", "n_threads", "cpu_info", "backends", "type_k"):
            if k in r:
                info[k] = r[k]
    if out is not None and len(res) < 2:
        notes.append(f"llama-bench on {os.path.basename(model)}: expected pp{p} and tg{g} results, "
                     f"parsed {sorted(res)}")
    return res


def batched_bench(args, model, npp, ntg, npl, pps, notes, what):
    """[jsonl record] of one llama-batched-bench run of -npp npp -ntg ntg -npl npl[,...]."""
    kvu = pps and args.llama_kvu
    pls = npl if isinstance(npl, list) else [npl]
    ctx = max((npp if kvu else pl * npp) + pl * ntg if pps else pl * (npp + ntg) for pl in pls)
    cmd = [args.llama_batched_bench, "-m", model, "-c", str(ctx + 256), "-b", "2048", "-ub", "512",
           "-npp", str(npp), "-ntg", str(ntg), "-npl", ",".join(map(str, pls)), "-t", str(args.threads),
           "--output-format", "jsonl"] + (["-pps"] if pps else []) + (["-kvu"] if kvu else [])
    cmd += shlex.split(args.llama_args)
    out = run_peer(cmd, notes, f"llama-batched-bench {what} on {os.path.basename(model)}", args.timeout)
    recs = [r for r in json_lines(out or "") if "speed_tg" in r and "pl" in r]
    if out is not None and len(recs) < len(pls):
        notes.append(f"llama-batched-bench {what}: {len(recs)} results parsed, {len(pls)} expected")
    return recs


# ---------------------------------------------------------------------------- goals

class Row:
    def __init__(self, label, ours=None, peer=None, goal=None, ceil=None):
        self.label, self.ours, self.peer = label, ours, peer
        self.goal = goal    # (kind, threshold): "ratio" against llama.cpp, or "ceil" with ceil
        self.ceil = ceil    # (dict, name): the ceiling dict[name] of "ceil" goals, read when printed

    def ratio(self):
        if self.ours and self.peer and self.peer[1] > 0:
            return self.ours[1] / self.peer[1]
        return None

    def goal_text(self):
        if not self.goal:
            return ""
        kind, thr = self.goal
        if kind == "ratio":
            r = self.ratio()
            if r is None:
                return f">= {thr:g}x: n/a" + ("" if self.ours else " (not measured)")
            return f">= {thr:g}x: {'met' if r >= thr else 'NOT MET'}"
        if kind == "share":  # ours: the shares in percent, paired sample by sample
            if not self.ours:
                return f">= {thr:.0%}: n/a"
            return f"median >= {thr:.0%}: {'met' if self.ours[1] >= 100 * thr else 'NOT MET'}"
        c, name = self.ceil or ({}, "")
        val = c.get(name)
        if not self.ours or not val:
            return f">= {thr:.0%} of {name}: n/a"
        f = self.ours[1] / val
        s = f"{f:.0%} of {name} {val:.1f} (goal >= {thr:.0%}): {'met' if f >= thr else 'NOT MET'}"
        if self.peer:
            s += f"; llama.cpp {self.peer[1] / val:.0%}"
        return s


def fmt(t, i):
    if t is None or t[i] is None:
        return ""
    v = t[i]
    return f"{v:.1f}" if v >= 10 else f"{v:.2f}"


def table(rows, have_peer):
    hdr = "| figure | spillway min | median | max |"
    sep = "|---|---:|---:|---:|"
    if have_peer:
        hdr += " llama.cpp min | median | max | ratio |"
        sep += "---:|---:|---:|---:|"
    hdr += " goal |"
    sep += "---|"
    lines = [hdr, sep]
    for r in rows:
        line = f"| {r.label} | {fmt(r.ours, 0)} | {fmt(r.ours, 1)} | {fmt(r.ours, 2)} |"
        if have_peer:
            rt = r.ratio()
            line += (f" {fmt(r.peer, 0)} | {fmt(r.peer, 1)} | {fmt(r.peer, 2)} |"
                     f" {'' if rt is None else f'{rt:.2f}x'} |")
        line += f" {r.goal_text()} |"
        lines.append(line)
    return "\n".join(lines)


# ---------------------------------------------------------------------------- main


# --preset aliases -> spillway mkmodel presets; per-preset defaults of the other options
PRESETS = {"135m": "smollm2-135m", "llama-1b": "llama-3.2-1b"}
PRESET_DEFAULTS = {"llama-3.2-1b": {"dtypes": "f16,q8_0,q4_k_m,q6_k", "batches": "16", "no_prefix": True}}
# dtypes spillway mkmodel writes itself; any other name is a llama-quantize type
MKMODEL_DTYPES = ("f32", "f16", "bf16", "q8_0", "q4_0", "q4_k")
# Goals per preset (2 threads): ratios against llama.cpp, a dict by dtype ("*": every dtype), and
# shares of the measured ceilings, a number; None: no goal.
GOALS = {
    "smollm2-135m": {"prefill": {"f16": 1.0}, "decode1": {"f16": 1.0, "q8_0": 1.0, "q4_k": 1.0},
                     "decode16": {"f16": 1.5}, "decode1_bw": 0.80, "prefill_gemm": 0.70,
                     "prefix_noshare": {"*": 3.0}, "prefix_pps": {"*": 1.2}},
    "llama-3.2-1b": {"prefill": {"*": 1.0}, "decode1": {"*": 1.0}, "decode16": {"*": 1.3},
                     "decode1_bw": 0.85, "prefill_gemm": None},
}


def goal_for(preset, what, dt=None):
    """The goal of row kind `what` for dtype dt in preset: ("ratio", x), ("ceil", x) or None."""
    g = GOALS.get(preset, {}).get(what)
    if g is None:
        return None
    if not isinstance(g, dict):  # a share of a ceiling, the same for every dtype
        return ("ceil", g)
    v = g.get(dt, g.get("*"))
    return ("ratio", v) if v is not None else None


def make_model(spillway, bd, preset, dt, pad, llama_quantize=None, threads=2):
    """The model file of dtype dt (made once, reused); None when dt needs llama-quantize and
    llama_quantize is None."""
    d = os.path.join(bd, "models")
    os.makedirs(d, exist_ok=True)

    def direct(t):
        path = os.path.join(d, f"{preset}-{t}.gguf")
        if not os.path.exists(path):
            sh([spillway, "mkmodel", "-o", path + ".tmp", "--preset", preset, "--dtype", t])
            os.replace(path + ".tmp", path)
        return path

    if dt not in MKMODEL_DTYPES:  # llama.cpp's type (e.g. q4_k_m, q6_k), from the F16 file
        if not llama_quantize:
            return None
        path = os.path.join(d, f"{preset}-{dt}-llama-quantize.gguf")
        if not os.path.exists(path):
            sh([llama_quantize, direct("f16"), path + ".tmp", dt.upper(), str(threads)],
               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            os.replace(path + ".tmp", path)
        return path
    if dt != "q4_k" or not pad:
        return direct(dt)
    path = os.path.join(d, f"{preset}-q4_k-pad{pad}.gguf")
    if not os.path.exists(path):
        base = direct("f32")
        try:  # mkmodel reports every fallback matrix on stderr: shown only on failure
            sh([spillway, "mkmodel", "--from", base, "--dtype", "q4_k", "--pad", str(pad), "-o", path + ".tmp"],
               stderr=subprocess.PIPE)
        except subprocess.CalledProcessError as e:
            sys.stderr.write(e.stderr or "")
            raise
        os.replace(path + ".tmp", path)
    return path


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", default="135m", help="135m (default), llama-1b, or a mkmodel preset")
    ap.add_argument("--dtypes", default="f16,q8_0,q4_k")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=3, help="repetitions of each figure (default 3)")
    ap.add_argument("--reps-long", type=int, default=1,
                    help="repetitions of the non-shared 64 x 1,056 workloads, both sides (default 1)")
    ap.add_argument("--prompt", type=int, default=512, help="prefill prompt tokens (512)")
    ap.add_argument("--gen", type=int, default=128, help="decode tokens (128)")
    ap.add_argument("--batches", default="4,16,64")
    ap.add_argument("--prefix-dtypes", help="dtypes of the shared-prefix workload (default: the first)")
    ap.add_argument("--prefix-requests", type=int, default=64)
    ap.add_argument("--prefix-len", type=int, default=1024)
    ap.add_argument("--suffix-len", type=int, default=32)
    ap.add_argument("--prefix-gen", type=int, default=32)
    ap.add_argument("--no-prefix", action="store_true", help="skip the shared-prefix workload")
    ap.add_argument("--no-kernels", action="store_true", help="skip the ceilings (their goals read n/a)")
    ap.add_argument("--kernel-rounds", type=int, default=3)
    ap.add_argument("--kernel-seconds", type=float, default=0.2)
    ap.add_argument("--q4k-pad", type=int, default=256, help="--pad for the q4_k model (0: none)")
    ap.add_argument("--interleave", action="store_true",
                    help="alternate the engines: each round runs one repetition of spillway, then of llama.cpp "
                         "(--reps rounds), so that both sides see the same minutes of a shared machine")
    ap.add_argument("--quick", action="store_true", help="small workloads, 1 repetition: tests the harness")
    ap.add_argument("--llama-dir", help="directory holding llama-bench and llama-batched-bench")
    ap.add_argument("--llama-bench", help="path of llama.cpp's llama-bench")
    ap.add_argument("--llama-batched-bench", help="path of llama.cpp's llama-batched-bench")
    ap.add_argument("--llama-quantize", help="path of llama.cpp's llama-quantize (dtypes it makes)")
    ap.add_argument("--llama-kvu", action="store_true", help="-pps runs with -kvu (unified KV cache)")
    ap.add_argument("--llama-args", default="", help="extra arguments for both llama.cpp tools, e.g. '-fa on'")
    ap.add_argument("--timeout", type=float, default=None, help="seconds allowed to each llama.cpp run")
    ap.add_argument("--build-dir", default=os.path.join(ROOT, "build-bench"))
    ap.add_argument("--no-build", action="store_true")
    ap.add_argument("--no-record", action="store_true", help="do not append to bench/RESULTS.md")
    pre = ap.parse_known_args()[0].preset
    ap.set_defaults(**PRESET_DEFAULTS.get(PRESETS.get(pre, pre), {}))
    if "--quick" in sys.argv[1:]:  # smaller defaults; flags given explicitly still win
        ap.set_defaults(reps=1, reps_long=1, prompt=128, gen=32, batches="4,16", prefix_requests=8,
                        prefix_len=256, suffix_len=16, prefix_gen=16, kernel_rounds=1, kernel_seconds=0.05)
    args = ap.parse_args()
    args.preset = PRESETS.get(args.preset, args.preset)
    if args.llama_dir:
        args.llama_quantize = args.llama_quantize or os.path.join(args.llama_dir, "llama-quantize")
        args.llama_bench = args.llama_bench or os.path.join(args.llama_dir, "llama-bench")
        args.llama_batched_bench = args.llama_batched_bench or os.path.join(args.llama_dir, "llama-batched-bench")
    notes = []
    for attr in ("llama_bench", "llama_batched_bench", "llama_quantize"):
        p = getattr(args, attr)
        if p and not os.access(p, os.X_OK):
            notes.append(f"{p}: not an executable: llama.cpp side skipped")
            setattr(args, attr, None)
    dtypes = [d.strip() for d in args.dtypes.split(",") if d.strip()]
    prefix_dtypes = [] if args.no_prefix else \
        [d.strip() for d in (args.prefix_dtypes or (dtypes + [""])[0]).split(",") if d.strip()]
    if not dtypes and not prefix_dtypes:
        ap.error("nothing to measure: give --dtypes and/or --prefix-dtypes")
    batches = ints(args.batches)

    load0 = os.getloadavg()[0]
    snap0 = cpu_snapshot()
    bd = args.build_dir
    if not args.no_build:
        sh(["cmake", "-S", ROOT, "-B", bd, "-DCMAKE_BUILD_TYPE=Release"], stdout=subprocess.DEVNULL)
        sh(["cmake", "--build", bd, "-j", str(os.cpu_count() or 2), "--target", "spillway", "bench_engine",
            "bench_prefix", "bench_kernels"], stdout=subprocess.DEVNULL)
    spillway = os.path.join(bd, "spillway")
    rows = []
    tmp = tempfile.TemporaryDirectory()

    # ---- (e) ceilings
    ceil = {}  # "read bw", "best GEMM": the ceilings, filled in after the last kernel run

    def kernels(n):
        kj = os.path.join(tmp.name, f"kernels-{n}.json")
        sh([os.path.join(bd, "bench_kernels"), str(args.threads), str(args.kernel_rounds),
            str(args.kernel_seconds), "--ceilings", "--json", kj], stdout=sys.stderr)
        with open(kj) as f:
            return json.load(f)

    k_first = None if args.no_kernels else kernels(1)
    peer_info = {}
    models = {}

    for dt in dtypes:
        model = make_model(spillway, bd, args.preset, dt, args.q4k_pad, args.llama_quantize, args.threads)
        if model is None:
            notes.append(f"{dt}: made by llama-quantize, which was not given (--llama-quantize or --llama-dir): skipped")
            continue
        models[dt] = model
        mf = model_figures(model)
        census = ", ".join(f"{n} {t}" for t, n in sorted(mf["census"].items(), key=lambda x: -x[1]))
        notes.append(f"{dt}: {os.path.relpath(model, ROOT)}: {mf['arch']} dim {mf['dim']}, {mf['layers']} layers, "
                     f"{mf['heads']} heads x {mf['head_dim']}, vocab {mf['vocab']}, {mf['params'] / 1e6:.1f} M "
                     f"parameters, {mf['total_bytes'] / 1e6:.1f} MB; matrices: {census}; decode reads "
                     f"{mf['bytes_per_token'] / 1e6:.1f} MB per token")
        refused = None
        ours = []
        peer = {}
        lb_samples, tg_samples = {}, {}
        # --interleave: one repetition of each side at a time, spillway then llama.cpp, args.reps
        # rounds; else all of spillway's repetitions, then all of llama.cpp's
        rounds, per = (args.reps, 1) if args.interleave else (1, args.reps)
        for rnd in range(rounds):
            if refused is None:
                jf = os.path.join(tmp.name, f"engine-{dt}-{rnd}.jsonl")
                try:  # a model spillway does not load (a weight type it lacks): refused rows, the run goes on
                    sh([os.path.join(bd, "bench_engine"), model, "--threads", str(args.threads), "--reps",
                        str(per), "--prompt", str(args.prompt), "--gen", str(args.gen), "--batches",
                        args.batches, "--json", jf], stdout=sys.stderr, stderr=subprocess.PIPE)
                    with open(jf) as f:
                        ours.append([json.loads(l) for l in f if l.strip()])
                except subprocess.CalledProcessError as e:
                    sys.stderr.write(e.stderr or "")
                    lines = [l for l in (e.stderr or "").splitlines() if l.strip()]
                    refused = (lines[-1] if lines else f"exit {e.returncode}").strip()
                    notes.append(f"{dt}: spillway refused {os.path.basename(model)}: {refused}")
            if args.llama_bench:
                pi = {}
                lb = llama_bench(args, model, args.prompt, args.gen, notes, pi, per)
                peer_info.update(pi)
                if rnd == 0 and "model_size" in pi and pi["model_size"] != mf["total_bytes"]:
                    notes.append(f"{dt}: llama.cpp's model_size {pi['model_size']} bytes, the GGUF's tensors "
                                 f"{mf['total_bytes']}")
                if rnd == 0 and "model_n_params" in pi and pi["model_n_params"] != mf["params"]:
                    notes.append(f"{dt}: llama.cpp counts {pi['model_n_params']} parameters, the GGUF holds "
                                 f"{mf['params']}")
                for k, v in lb.items():
                    lb_samples.setdefault(k, []).extend(v)
            if args.llama_batched_bench:
                for _ in range(per):
                    for r in batched_bench(args, model, 16, args.gen, batches, False, notes, "decode"):
                        tg_samples.setdefault(r["pl"], []).append(r["speed_tg"])
        ours = merge_rounds(ours)
        if args.llama_bench:
            peer[("prefill", args.prompt)] = mmm(lb_samples["prefill"]) if "prefill" in lb_samples else None
            peer[("decode", 1)] = mmm(lb_samples["decode"]) if "decode" in lb_samples else None
        for pl, v in tg_samples.items():
            peer[("decode", pl)] = mmm(v)
        if refused is not None:
            lab = f"{dt} (spillway: refused)"
            gb = mf["bytes_per_token"] / 1e9
            rows.append(Row(f"{lab} prefill {args.prompt} tokens (tokens/s)", None, peer.get(("prefill", args.prompt))))
            for n in [1] + [b for b in batches if b != 1]:
                rows.append(Row(f"{lab} decode {'1 sequence' if n == 1 else f'{n} sequences'} x {args.gen} "
                                f"tokens (tokens/s)", None, peer.get(("decode", n))))
                if n == 1:
                    rows.append(Row(f"{lab} decode 1 sequence (GB/s of weights)", None,
                                    scale(peer.get(("decode", 1)), gb), goal_for(args.preset, "decode1_bw"),
                                    (ceil, "read bw")))
        for r in ours:
            if r["workload"] == "info":
                if r["weight_bytes"] != mf["total_bytes"]:
                    notes.append(f"{dt}: engine weight_bytes {r['weight_bytes']} != GGUF tensor bytes {mf['total_bytes']}")
                continue
            if r["workload"] == "decode1_pairs":  # each repetition against its own probes
                g = goal_for(args.preset, "decode1_bw")
                shares = [100 * t * mf["bytes_per_token"] / 1e9 / ((b + a) / 2)
                          for b, t, a in r["pairs"] if b + a > 0]
                rows.append(Row(f"{dt} decode 1 sequence, weights streamed as % of the read bandwidth "
                                f"probed just before and after the same repetition ({len(shares)} repetitions)",
                                mmm(shares) if shares else None, None, ("share", g[1]) if g else None))
                continue
            o = (r["min"], r["median"], r["max"])
            if r["workload"] == "read_bw":  # after the decode-1 figure it was measured with
                rows.append(Row(f"{dt}: read bandwidth measured between the decode-1 repetitions (GB/s)", o))
                rows.append(Row(f"{dt} decode 1 sequence (GB/s of weights), against that bandwidth", dec1,
                                scale(peer.get(("decode", 1)), mf["bytes_per_token"] / 1e9),
                                goal_for(args.preset, "decode1_bw"), ({"read bw": o[1]}, "read bw")))
                continue
            if r["workload"] == "prefill":
                key = ("prefill", r["n"])
                g = goal_for(args.preset, "prefill", dt)
                rows.append(Row(f"{dt} prefill {r['n']} tokens (tokens/s)", o, peer.get(key), g))
                fl = mf["prefill_flops"](r["n"]) / r["n"] / 1e9
                rows.append(Row(f"{dt} prefill {r['n']} tokens (GFLOP/s, matmuls + attention)", scale(o, fl),
                                scale(peer.get(key), fl), goal_for(args.preset, "prefill_gemm"),
                                (ceil, "best GEMM")))
            else:
                n = r["n"]
                key = ("decode", n)
                g = goal_for(args.preset, "decode1" if n == 1 else f"decode{n}", dt)
                lab = "1 sequence" if n == 1 else f"{n} sequences"
                rows.append(Row(f"{dt} decode {lab} x {r['gen']} tokens (tokens/s)", o, peer.get(key), g))
                if n == 1:
                    gb = mf["bytes_per_token"] / 1e9
                    dec1 = scale(o, gb)
                    rows.append(Row(f"{dt} decode 1 sequence (GB/s of weights)", dec1,
                                    scale(peer.get(key), gb), goal_for(args.preset, "decode1_bw"),
                                    (ceil, "read bw")))

    # ---- (d) shared prefix
    for dt in prefix_dtypes:
        model = models.get(dt) or make_model(spillway, bd, args.preset, dt, args.q4k_pad, args.llama_quantize,
                                             args.threads)
        if model is None:
            notes.append(f"shared prefix {dt}: made by llama-quantize, which was not given: skipped")
            continue
        N, P, S, G = args.prefix_requests, args.prefix_len, args.suffix_len, args.prefix_gen
        jf = os.path.join(tmp.name, f"prefix-{dt}.jsonl")
        sh([os.path.join(bd, "bench_prefix"), model, "--threads", str(args.threads), "--workloads", "shared",
            "--requests", str(N), "--prefix", str(P), "--suffix", str(S), "--gen", str(G),
            "--reps", str(args.reps), "--reps-long", str(args.reps_long), "--json", jf], stdout=sys.stderr)
        with open(jf) as f:
            pr = {r["key"]: (r["min"], r["median"], r["max"]) for r in map(json.loads, f) if r}
        out_tok = N * G
        peer_noshare = peer_pps = peer_lit = None
        if args.llama_batched_bench:
            def series(npp, ntg, pps, reps, what):
                v = [out_tok / r["t"] for _ in range(reps)
                     for r in batched_bench(args, model, npp, ntg, N, pps, notes, what) if r.get("t")]
                return mmm(v) if v else None
            peer_noshare = series(P + S, G, False, args.reps_long, "no sharing")
            peer_pps = series(P, S + G, True, args.reps, "-pps (suffix as decode)")
            peer_lit = series(P, G, True, args.reps, "-pps (suffixes dropped)")
        w = f"{dt} shared prefix {N} x ({P} + {S}) -> {G}, output tok/s"
        on, off = pr.get("shared_tps_on"), pr.get("shared_tps_off")
        kvu = " -kvu" if args.llama_kvu else ""
        if not args.llama_batched_bench:
            rows += [Row(f"{w}, prefix cache on", on), Row(f"{w}, prefix cache off", off)]
            continue
        rows += [
            Row(f"{w}: spillway cache on / llama.cpp no sharing (-npp {P + S} -ntg {G} -npl {N})", on,
                peer_noshare, goal_for(args.preset, "prefix_noshare", dt)),
            Row(f"{w}: spillway cache on / llama.cpp -pps{kvu} (-npp {P} -ntg {S + G}: suffix as decode)", on,
                peer_pps, goal_for(args.preset, "prefix_pps", dt)),
            Row(f"{w}: spillway cache on / llama.cpp -pps{kvu} (-npp {P} -ntg {G}: suffixes dropped, less work)",
                on, peer_lit),
            Row(f"{w}: spillway cache OFF / llama.cpp no sharing", off, peer_noshare),
        ]

    if k_first:  # (e) again at the end: a ceiling is the best of both runs (the machine may be shared)
        k = k_first
        k2 = kernels(2)
        for key in ("read_bw_gbs", "copy_bw_gbs", "sgemm_best_gflops"):
            k[key] = max(k[key], k2[key])
        if k2["matmul_best_gflops"] > k["matmul_best_gflops"]:
            for key in ("matmul_best_gflops", "matmul_best_type", "matmul_best_shape"):
                k[key] = k2[key]
        ceil["read bw"] = k["read_bw_gbs"]
        ceil["best GEMM"] = max(k["sgemm_best_gflops"], k["matmul_best_gflops"])
        one = lambda v: (None, v, None)  # noqa: E731 (the best of the rounds: one value, as the median)
        rows[:0] = [
            Row(f"memory read bandwidth, {args.threads} threads (GB/s)", one(k["read_bw_gbs"])),
            Row(f"memory copy bandwidth, {args.threads} threads, read + written (GB/s)", one(k["copy_bw_gbs"])),
            Row("OpenBLAS sgemm, best of 3 shapes at M=512 (GFLOP/s)", one(k["sgemm_best_gflops"])),
            Row(f"spillway matmul, best ({k['matmul_best_type']} {k['matmul_best_shape']}, T=512) (GFLOP/s)",
                one(k["matmul_best_gflops"]))]

    have_peer = bool(args.llama_bench or args.llama_batched_bench)
    if peer_info:
        notes.append("llama.cpp: " + ", ".join(f"{k} {peer_info[k]}" for k in
                                                ("build_commit", "build_number", "backends", "flash_attn",
                                                 "type_k", "n_threads") if k in peer_info))
    if args.preset not in GOALS:
        notes.append(f"no goals are set for {args.preset}: the goal column is empty")
    elif args.threads != 2 or args.quick:
        notes.append(f"the goals of {args.preset} are set for 2 threads and the full workloads: "
                     "this run differs, so read the goal column as indicative")
    if args.interleave:
        notes.append(f"--interleave: {args.reps} rounds of one repetition each, spillway then llama.cpp, "
                     f"per dtype; min / median / max over the rounds")
    if os.environ.get("OMP_WAIT_POLICY"):
        notes.append(f"OMP_WAIT_POLICY={os.environ['OMP_WAIT_POLICY']} in the environment (llama.cpp's OpenMP "
                     f"threads; spillway does not use OpenMP)")
    load1 = os.getloadavg()[0]
    others = others_cpus(snap0, cpu_snapshot())
    busy = others > 0.25 if others is not None else (load0 > 0.5 or load1 > args.threads + 1)
    notes.append(f"load average (1 min) {load0:.1f} at the start, {load1:.1f} at the end (the run's own "
                 f"{args.threads} threads included), {os.cpu_count()} CPUs"
                 + (f"; other processes and the hypervisor's steal took {others:.2f} CPUs on average during "
                    f"the run (/proc/stat less this run's own CPU time)" if others is not None else "")
                 + (": the machine was busy, the figures are not reliable (llama.cpp's spinning OpenMP "
                    "threads slow down by up to 40x when the cores are oversubscribed, ours less)"
                    if busy else ""))
    out = table(rows, have_peer)
    print(out)
    if notes:
        print("\nNotes:\n" + "\n".join(f"- {n}" for n in notes))
    log("done")

    if not args.no_record:
        try:
            rev = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], text=True,
                                 capture_output=True).stdout.strip()
            dirty = subprocess.run(["git", "-C", ROOT, "status", "--porcelain", "--untracked-files=no"],
                                   text=True, capture_output=True).stdout.strip()
        except OSError:
            rev, dirty = "unknown", ""
        with open(os.path.join(ROOT, "bench", "RESULTS.md"), "a") as f:
            f.write(f"\n## {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC, engine, "
                    f"{args.preset}, {args.threads} threads\n\n")
            f.write(f"- revision: {rev}{' (with uncommitted changes)' if dirty else ''}\n")
            f.write(f"- machine: {cpu_model()}, {os.cpu_count()} CPUs\n")
            f.write(f"- command: `bench/run.py {' '.join(sys.argv[1:])}` ({time.monotonic() - T0:.0f} s)\n\n")
            f.write(out + "\n")
            if notes:
                f.write("\n" + "\n".join(f"- {n}" for n in notes) + "\n")


if __name__ == "__main__":
    main()
