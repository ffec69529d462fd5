#!/usr/bin/env python3
"""bench/crosscheck.py: spillway's next-token distributions and perplexity against llama.cpp's.

llama.cpp is not built here: give its binaries (--llama-dir DIR holding llama-quantize and
llama-perplexity, or each with its own flag). Two sections, one markdown table each, printed and
appended to bench/RESULTS.md (--no-record: not):

(1) kld: for each architecture and tensor type, a synthetic model written by `spillway mkmodel`
    in F32 (--dim 256 --layers 2 --heads 4 --kv-heads 2 --ffn 512 --vocab 512 --untied by
    default: every row a multiple of 256, so llama-quantize never falls back from a K-quant) and
    converted by `llama-quantize --pure` to the type (every 2-D tensor, token_embd and output
    included, in that one type; norms stay F32). llama.cpp's log-probs come from
    `llama-perplexity -f TEXT -c CTX --kl-divergence-base F.kld` (its chunks of CTX tokens, the
    first replaced by BOS, the second half of each scored); spillway runs `spillway logits` on the
    very token sequences in F.kld (tests/kld.py, F16 KV cache as llama.cpp's default). Figures:
    mean KLD(llama.cpp || spillway) over the scored positions and top-1 agreement. Bounds (issue
    19): top-1 >= 99% and mean KLD <= 1e-4 for F32/F16/BF16/Q8_0, <= 2e-3 for the 4- to 6-bit
    types, <= 1e-2 for the 2- and 3-bit ones. A model spillway does not load is a "refused" row
    (not a failure of the run).
    The floor: llama.cpp against itself. Each row's file is run twice by llama-perplexity on the
    same tokens, `-fa on` (the run spillway is compared with; llama-perplexity's default "auto"
    turns flash attention on for these files) and `-fa off`; KLD(llama.cpp -fa on || llama.cpp
    -fa off) and their top-1 agreement are the floor, i.e. how far llama.cpp moves from itself
    under a change of fp16-level rounding (its FA accumulates V in fp16). On int8-activation
    types any such change decorrelates the int8 roundings of the two runs (bench/RESULTS.md, "Why
    spillway and llama.cpp disagree on int8-activation models"), so the floor there is of the
    order of the absolute bound itself. Every row gets two verdicts, both printed:
      absolute (the issue's bound): mean KLD <= the type's bound and top-1 >= 99%;
      floor: mean KLD <= 1.5 x max(floor KLD, 1e-6) and top-1 >= floor top-1 - 1 point
        (1e-6 nats: the resolution of the .kld's 16-bit log-probs, where rows computing the
        same thing read -5e-7 .. 1e-6; it keeps a floor at or below that noise from judging).
    The absolute bounds are not loosened: a row that passes the floor and fails the absolute
    bound is still reported as failing it. Also printed: KLD(llama.cpp F32 || llama.cpp on the quantised
    file), the quantisation's own effect on the same positions, for scale; and for each row
    spillway runs, "exact": llama.cpp on the file's weights dequantised to F32 (llama-quantize
    --allow-requantize F32), i.e. the same weights with F32 activations, against which
    KLD(exact || llama.cpp) and KLD(exact || spillway) give each engine's own error from rounding
    its activations (int8 for the block types, F16/BF16 for those weights). The two engines round
    differently, so the KLD between them is about the sum of the two (--no-exact: skipped).
    Architectures mkmodel cannot write (it says so) are taken from --arch-fixtures DIR (F32
    models made with llama.cpp's gguf-py, e.g. /work/shared/models/arch-fixtures: NAME-tiny.gguf)
    when given. "stories260K" rows (with --stories) are the trained model padded to 256, whose
    next-token distributions are peaked (top-1 agreement means more there than on the random
    models, whose distributions are near-uniform: PPL ~700 of 512). Where a row length does not
    fit the type (rows of 128 in the fixtures, 64 in stories260K's attn_output) llama-quantize
    --pure asserts; the file is then made without --pure (llama-quantize picks fallback types
    per tensor) and its "file" column, which lists the tensor types actually written, starts
    with "mix:".

(2) ppl: stories260K (--stories FILE.gguf, a trained model) zero-padded to multiples of 256 by
    `spillway mkmodel --from F --dtype f32 --pad 256` (an equivalent model), then quantised by
    llama-quantize (its per-tensor mixes, no --pure) to --ppl-types (Q4_K_M, Q5_K_M, Q6_K,
    Q3_K_M, IQ4_XS). Per file: the perplexity ratio quantised / F32 of llama.cpp and of spillway
    over the same positions (llama-perplexity -c PPLCTX's windows: chunks of PPLCTX tokens side
    by side, BOS first, the last PPLCTX/2 - 1 predictions of each chunk; llama.cpp's from the
    log-probs it stored in the .kld, spillway's from `spillway logits` on the .kld's token
    sequences), and the check |spillway ratio / llama.cpp ratio - 1| <= 1%. llama-perplexity's
    printed "Final estimate" is shown beside it when its log kept it (its logger thread sometimes
    loses the last lines at exit). For information, `spillway eval --ctx
    PPLCTX --stride PPLCTX/2` (its own tokenisation and overlapping windows: not the same
    positions, so only its ratio is comparable) and the KLD/top-1 of the file.

Usage:
  bench/crosscheck.py --llama-dir /work/peer/llama.cpp/build/bin [--spillway build/spillway]
      [--stories /work/shared/models/stories260K.gguf] [--arch-fixtures DIR] [--sections kld,ppl]
Without --spillway it builds the `spillway` target (Release) in --build-dir. --llama-args must
not set -fa (the script sets it per run). Exit 0 when every row that ran passed both verdicts
(refused rows do not count), 1 when a row failed either, 2 on a usage error.
"""
import argparse
import datetime
import os
import re
import shlex
import subprocess
import sys
import tempfile
import time

try:
    import numpy as np
except ImportError:
    # the first python3 on PATH may lack numpy while Debian's has it: retry once with that one
    if (os.path.exists("/usr/bin/python3") and not os.environ.get("SPILLWAY_PY_REEXEC")
            and os.path.realpath(sys.executable) != os.path.realpath("/usr/bin/python3")):
        os.environ["SPILLWAY_PY_REEXEC"] = "1"
        os.execv("/usr/bin/python3", ["/usr/bin/python3"] + sys.argv)
    sys.exit("crosscheck.py: numpy is needed (Debian: python3-numpy)")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests"))
import kld  # noqa: E402  (tests/kld.py: the .kld reader and the spillway side)

T0 = time.monotonic()

# llama-quantize type names of the single-type rows, with the KLD bound of each
KLD_TYPES = [("F32", 1e-4), ("F16", 1e-4), ("BF16", 1e-4), ("Q8_0", 1e-4),
             ("Q4_0", 2e-3), ("Q4_1", 2e-3), ("Q5_0", 2e-3), ("Q5_1", 2e-3),
             ("Q4_K", 2e-3), ("Q5_K", 2e-3), ("Q6_K", 2e-3), ("IQ4_NL", 2e-3), ("IQ4_XS", 2e-3),
             ("Q3_K", 1e-2), ("Q2_K", 1e-2)]
TOP1_BOUND = 0.99
# the floor verdict: KLD within FLOOR_KLD_FACTOR x llama.cpp's own -fa on vs -fa off KLD (that
# floor taken no lower than KLD_RESOLUTION), top-1 no more than FLOOR_TOP1_SLACK under its top-1
FLOOR_KLD_FACTOR = 1.5
FLOOR_TOP1_SLACK = 0.01
KLD_RESOLUTION = 1e-6
# architectures mkmodel writes only tied (llama.cpp's loader refuses their output.weight)
TIED_ARCHS = {"gemma2"}
PPL_BOUND = 0.01
# architectures: mkmodel --arch name, and the arch-fixtures file used when mkmodel cannot write it
ARCHS = [("llama", None), ("qwen2", None), ("stories260K", None), ("qwen3", "qwen3-tiny.gguf"), ("gemma2", "gemma2-tiny.gguf"),
         ("gemma3", "gemma3-tiny.gguf"), ("phi3", "phi3-tiny.gguf"), ("qwen3moe", "qwen3moe-tiny.gguf"),
         ("qwen2moe", "qwen2moe-tiny.gguf"), ("llama-moe", "llama-moe-tiny.gguf")]
# ggml type id -> name (the "file" column)
GGML_NAMES = {0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 6: "Q5_0", 7: "Q5_1", 8: "Q8_0", 9: "Q8_1",
              10: "Q2_K", 11: "Q3_K", 12: "Q4_K", 13: "Q5_K", 14: "Q6_K", 15: "Q8_K", 16: "IQ2_XXS",
              17: "IQ2_XS", 18: "IQ3_XXS", 19: "IQ1_S", 20: "IQ4_NL", 21: "IQ3_S", 22: "IQ2_S",
              23: "IQ4_XS", 29: "IQ1_M", 30: "BF16", 34: "TQ1_0", 35: "TQ2_0", 39: "MXFP4"}


def log(msg):
    print(f"[crosscheck {time.monotonic() - T0:7.1f}s] {msg}", file=sys.stderr, flush=True)


def run(cmd, what, timeout=None):
    """Runs cmd; (ok, stdout + stderr). A failure's message is the last lines that look like one."""
    log("$ " + " ".join(shlex.quote(c) for c in cmd))
    try:
        r = subprocess.run(cmd, text=True, capture_output=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired) as e:
        return False, f"{what}: {e}"
    out = r.stdout + "\n" + r.stderr
    if r.returncode != 0:
        lines = [l.strip() for l in out.splitlines() if l.strip()]
        errs = [l for l in lines if any(w in l.lower() for w in ("error", "failed", "invalid", "unsupported",
                                                                  "spillway:", "assert"))]
        how = f"signal {-r.returncode}" if r.returncode < 0 else f"exit {r.returncode}"
        return False, f"{what} {how}: " + " / ".join((errs or lines)[-2:])[-300:]
    return True, out


def census(path, pure=True):
    """'Q4_K x13, Q6_K x3' over the 2-D tensors of a GGUF file (norms left out); prefixed
    'mix:' when llama-quantize ran without --pure."""
    from gguf_ref import GGUF  # tests/reference, put on sys.path by kld
    g = GGUF(path)
    c = {}
    for t in g.tensors.values():
        if len(t.ne) >= 2:
            n = GGML_NAMES.get(t.dtype, str(t.dtype))
            c[n] = c.get(n, 0) + 1
    return ("" if pure else "mix: ") + ", ".join(f"{n} x{k}" for n, k in sorted(c.items(), key=lambda x: -x[1]))


def quant_effect(base_kld, q_kld):
    """KLD(llama.cpp on F32 || llama.cpp on the quantised file) on the same positions, or None."""
    if not np.array_equal(base_kld.tokens, q_kld.tokens) or base_kld.logp.shape != q_kld.logp.shape:
        return None
    return float(kld.kl_div(base_kld.logp, q_kld.logp).mean())


FINAL_RE = re.compile(r"Final estimate: PPL = ([0-9.]+)")


class Peer:
    def __init__(self, args):
        self.a = args

    def quantize(self, src, dst, qtype, pure):
        """(True, dst, pure_done) or (False, message, False). With pure, llama-quantize --pure
        first; when that fails (it asserts on a row its type's block does not divide) again
        without --pure, which lets llama-quantize pick its own fallback types per tensor."""
        if qtype == "F32":
            return True, src, True
        for p in ([True, False] if pure else [False]):
            cmd = [self.a.llama_quantize] + (["--pure"] if p else []) + [src, dst, qtype, str(self.a.threads)]
            ok, out = run(cmd, "llama-quantize", self.a.timeout)
            if ok:
                return True, dst, p
        return False, out, False

    def perplexity(self, model, text, ctx, kld_path, fa="on"):
        """Writes llama.cpp's log-probs to kld_path, flash attention fa ("on" or "off");
        (True, its printed Final estimate PPL or None)
        or (False, message). llama.cpp's logger runs on its own thread and its last lines are
        sometimes lost at exit (seen with this build, exit status 0, the .kld complete), so the
        PPL the sections use is the one computed from the .kld (kld.compare's ppl_ref)."""
        cmd = [self.a.llama_perplexity, "-m", model, "-f", text, "-c", str(ctx),
               "-t", str(self.a.threads), "-fa", fa, "--kl-divergence-base", kld_path] + shlex.split(self.a.llama_args)
        ok, out = run(cmd, "llama-perplexity", self.a.timeout)
        if not ok:
            return False, out
        try:
            kld.KldFile(kld_path)
        except (OSError, ValueError) as e:
            return False, f"llama-perplexity: {e}"
        m = FINAL_RE.search(out)
        return True, float(m.group(1)) if m else None


def spillway_vs(args, model, kld_path):
    """kld.compare on model; (status, figures or message): status "ok", "refused" (spillway
    declined the model with its own error message) or "error" (anything else, e.g. a crash)."""
    try:
        return "ok", kld.compare(model, kld_path, args.spillway, kv_type="f16", threads=args.threads)
    except RuntimeError as e:
        msg = " ".join(str(x) for x in (e.args[0] if e.args and isinstance(e.args[0], list) else e.args))
        if msg.startswith("spillway:"):  # "spillway: model: X; supported types: ..." -> "X"
            return "refused", msg.split(";")[0].replace("spillway: ", "").replace("model: ", "")
        return "error", msg or "failed"


def pad_stories(args, work):
    """stories260K zero-padded to multiples of 256 in F32 (an equivalent model): path, or None
    with a message."""
    path = os.path.join(work, "stories-pad256-f32.gguf")
    if os.path.exists(path):
        return path, ""
    ok, out = run([args.spillway, "mkmodel", "--from", args.stories, "--dtype", "f32", "--pad", "256",
                   "-o", path], "spillway mkmodel --from")
    return (path, "") if ok else (None, out)


def make_base(args, arch, fixture, work):
    """The F32 model of an architecture: (path, how) or (None, reason)."""
    if arch == "stories260K":
        if not args.stories:
            return None, "no --stories given"
        path, err = pad_stories(args, work)
        return (path, f"{args.stories} padded to 256 (a trained llama: peaked distributions; attn_output "
                      f"rows of 64 fit no K-quant, so those files are llama-quantize's mixes)") if path else (None, err)
    path = os.path.join(work, f"{arch}-f32.gguf")
    shape = shlex.split(args.shape)
    if arch in TIED_ARCHS and "--untied" in shape:
        shape.remove("--untied")
    ok, out = run([args.spillway, "mkmodel", "-o", path, "--arch", arch, "--dtype", "f32"] + shape,
                  "spillway mkmodel")
    if ok:
        return path, f"mkmodel --arch {arch} {' '.join(shape)}"
    if fixture and args.arch_fixtures and os.path.exists(os.path.join(args.arch_fixtures, fixture)):
        return (os.path.join(args.arch_fixtures, fixture), f"{fixture} from --arch-fixtures (mkmodel: {out}); "
                f"rows of 128: the K-quant/IQ files are llama-quantize's mixes (its --pure asserts on them)")
    return None, f"no F32 model: {out}" + ("" if args.arch_fixtures else "; no --arch-fixtures given")


def fmt_kld(v):
    return "" if v is None else f"{v:.2e}"


def exact_figures(args, work, arch, qtype, model, kf):
    """KLD(exact || llama.cpp) and KLD(exact || spillway) as text, where exact is llama.cpp with
    the file's weights dequantised to F32 (llama-quantize --allow-requantize F32), i.e. the same
    weights with F32 activations: each engine's own error from rounding its activations (int8
    for the block types, F16/BF16 for those weights). ("", "") when a step fails."""
    dq = os.path.join(work, f"{arch}-{qtype}-deq-f32.gguf")
    kx = dq[:-5] + ".kld"
    ok, _ = run([args.llama_quantize, "--allow-requantize", model, dq, "F32", str(args.threads)],
                "llama-quantize F32", args.timeout)
    if not ok or not Peer(args).perplexity(dq, args.text, args.ctx, kx)[0]:
        return "", ""
    kfx = kld.KldFile(kx)
    if not np.array_equal(kfx.tokens, kf.tokens):
        return "", ""
    st, r = spillway_vs(args, model, kx)
    return f"{kld.kl_div(kfx.logp, kf.logp).mean():.2e}", (f"{r['kld_mean']:.2e}" if st == "ok" else "")


def self_floor(args, work, arch, qtype, model, kf):
    """llama.cpp against itself on model: (KLD(-fa on || -fa off), top-1 agreement) over kf's
    positions (kf: the -fa on run), or (None, message) when the -fa off run fails or did not
    evaluate the same tokens."""
    kp = os.path.join(work, f"{arch}-{qtype}-fa-off.kld")
    ok, msg = Peer(args).perplexity(model, args.text, args.ctx, kp, fa="off")
    if not ok:
        return None, msg
    ko = kld.KldFile(kp)
    if not np.array_equal(ko.tokens, kf.tokens) or ko.logp.shape != kf.logp.shape:
        return None, "llama-perplexity -fa off evaluated other tokens"
    return float(kld.kl_div(kf.logp, ko.logp).mean()), float((kf.logp.argmax(-1) == ko.logp.argmax(-1)).mean())


def floor_verdict(r, floor):
    """(passed, bound text) of the floor rule for spillway figures r against floor (kld, top1)."""
    kb = FLOOR_KLD_FACTOR * max(floor[0], KLD_RESOLUTION)
    tb = max(0.0, floor[1] - FLOOR_TOP1_SLACK)
    return r["kld_mean"] <= kb and r["top1"] >= tb, f"<= {kb:.2e}, >= {100 * tb:.2f}%"


def section_kld(args, work, notes):
    types = [(t, b) for t, b in KLD_TYPES if t.lower() in args.types]
    archs = [(a, f) for a, f in ARCHS if a in args.archs]
    lines = ["| arch | type | file (2-D tensor types) | positions | spillway vs llama.cpp: mean KLD | top-1 "
             "| llama.cpp vs itself (-fa on vs off): mean KLD | top-1 | absolute bound (KLD, top-1) | verdict: absolute "
             "| floor bound (KLD, top-1) | verdict: floor "
             "| llama.cpp F32 vs this file (quantisation's own KLD) | exact vs llama.cpp | exact vs spillway |",
             "|---|---|---|---:|---:|---:|---:|---:|---|---|---|---|---:|---:|---:|"]
    counts = {"abs": 0, "floor": 0, "both": 0, "rows": 0}
    failed = 0
    for arch, fixture in archs:
        base, how = make_base(args, arch, fixture, work)
        if not base:
            lines.append(f"| {arch} | all | | | | | | | | refused: {how} | | | | | |")
            continue
        notes.append(f"{arch}: {how}")
        base_kld = None
        for qtype, bound in types:
            bnd = f"<= {bound:g}, >= {100 * TOP1_BOUND:g}%"
            dst = os.path.join(work, f"{arch}-{qtype}.gguf")
            ok, model, pure = Peer(args).quantize(base, dst, qtype, pure=True)
            if not ok:
                lines.append(f"| {arch} | {qtype} | | | | | | | {bnd} | llama.cpp failed: {model} | | | | | |")
                continue
            kp = os.path.join(work, f"{arch}-{qtype}.kld")
            ok, ppl = Peer(args).perplexity(model, args.text, args.ctx, kp)
            if not ok:
                lines.append(f"| {arch} | {qtype} | {census(model, pure)} | | | | | | {bnd} | llama.cpp failed: {ppl} "
                             f"| | | | | |")
                continue
            kf = kld.KldFile(kp)
            if qtype == "F32":
                base_kld = kf
            eff = quant_effect(base_kld, kf) if base_kld is not None and qtype != "F32" else None
            fk, ft = self_floor(args, work, arch, qtype, model, kf)
            floor = (fk, ft) if fk is not None else None
            fl = f"{fk:.2e} | {100 * ft:.2f}%" if floor else f"-fa off failed: {ft} | "
            st, r = spillway_vs(args, model, kp)
            if st != "ok":
                lines.append(f"| {arch} | {qtype} | {census(model, pure)} | {kf.n_chunk * kf.n_scored} | | | {fl} "
                             f"| {bnd} | {st}: {r} | | | {fmt_kld(eff)} | | |")
                failed += st == "error"
                continue
            good = r["kld_mean"] <= bound and r["top1"] >= TOP1_BOUND
            if floor:
                fgood, fbnd = floor_verdict(r, floor)
            else:
                fgood, fbnd = False, "no floor"
            counts["rows"] += 1
            counts["abs"] += good
            counts["floor"] += fgood
            counts["both"] += good and fgood
            failed += not (good and fgood)
            ex_l, ex_s = exact_figures(args, work, arch, qtype, model, kf) if qtype != "F32" and args.exact else ("", "")
            lines.append(f"| {arch} | {qtype} | {census(model, pure)} | {r['positions']} | {r['kld_mean']:.2e} "
                         f"| {100 * r['top1']:.2f}% | {fl} | {bnd} | {'pass' if good else 'FAIL'} | {fbnd} "
                         f"| {'pass' if fgood else 'FAIL'} | {fmt_kld(eff)} | {ex_l} | {ex_s} |")
            log(lines[-1])
    notes.append(f"kld verdicts: {counts['rows']} rows spillway ran; {counts['abs']} pass the absolute bound, "
                 f"{counts['floor']} pass the floor rule (KLD <= {FLOOR_KLD_FACTOR:g} x max(llama.cpp's -fa on vs "
                 f"-fa off KLD, {KLD_RESOLUTION:g}), top-1 >= its top-1 - {100 * FLOOR_TOP1_SLACK:g} point), "
                 f"{counts['both']} pass both")
    return "\n".join(lines), failed


EVAL_RE = re.compile(r"perplexity: ([0-9.]+)")


def kld_ppl(kf):
    """Perplexity of llama.cpp's stored log-probs over the .kld's scored positions (the next
    tokens of its chunks): the same positions as kld.compare's spillway figure."""
    first = kf.n_ctx // 2
    nxt = kf.tokens[:, first + 1:first + 1 + kf.n_scored]
    ci, si = np.meshgrid(np.arange(kf.n_chunk), np.arange(kf.n_scored), indexing="ij")
    return float(np.exp(-kf.logp[ci, si, nxt].mean()))


def f4(v):
    return "" if v is None else f"{v:.4f}"


def section_ppl(args, work, notes):
    lines = ["| file | 2-D tensor types | llama.cpp PPL | ratio to F32 | spillway PPL | ratio to F32 "
             "| spillway ratio / llama.cpp ratio | result | mean KLD | top-1 | llama-perplexity's printed PPL "
             "| spillway eval PPL (ctx, stride ctx/2) | its ratio to F32 |",
             "|---|---|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|"]
    failed = 0
    base, err = pad_stories(args, work)
    if not base:
        return f"stories260K: {err}", 1
    ref = None  # F32: (llama.cpp ppl, spillway ppl, eval ppl)
    for qtype in ["F32"] + args.ppl_types:
        name = "F32 (padded)" if qtype == "F32" else qtype
        dst = os.path.join(work, f"stories-pad256-{qtype}.gguf")
        ok, model, _ = Peer(args).quantize(base, dst, qtype, pure=False)
        if not ok:
            lines.append(f"| {name} | | | | | | | llama.cpp failed: {model} | | | | | |")
            continue
        kp = os.path.join(work, f"stories-{qtype}.kld")
        ok, printed = Peer(args).perplexity(model, args.text, args.ppl_ctx, kp)
        if not ok:
            lines.append(f"| {name} | {census(model)} | | | | | | llama.cpp failed: {printed} | | | | | |")
            continue
        lppl = kld_ppl(kld.KldFile(kp))
        ok, eout = run([args.spillway, "eval", "-m", model, "-f", args.text, "--ctx", str(args.ppl_ctx),
                        "--stride", str(args.ppl_ctx // 2), "--threads", str(args.threads)], "spillway eval")
        m = EVAL_RE.search(eout) if ok else None
        eppl = float(m.group(1)) if m else None
        st, r = spillway_vs(args, model, kp)
        lr = lppl / ref[0] if ref else None
        if st != "ok":
            lines.append(f"| {name} | {census(model)} | {lppl:.4f} | {f4(lr)} | | | | {st}: {r} | | "
                         f"| {f4(printed)} | | |")
            failed += st == "error"
            continue
        sppl = r["ppl_spillway"]
        if qtype == "F32":
            ref = (lppl, sppl, eppl)
            res, dev_s = "", ""
        elif ref is None:
            res, dev_s = "no F32 reference", ""
        else:
            dev = (sppl / ref[1]) / lr - 1
            good = abs(dev) <= PPL_BOUND
            failed += not good
            res, dev_s = f"{'pass' if good else 'FAIL'} (within {100 * PPL_BOUND:g}%)", f"{1 + dev:.4f}"
        sr = sppl / ref[1] if ref and qtype != "F32" else None
        er = eppl / ref[2] if eppl and ref and ref[2] and qtype != "F32" else None
        lines.append(f"| {name} | {census(model)} | {lppl:.4f} | {f4(lr if qtype != 'F32' else None)} | {sppl:.4f} "
                     f"| {f4(sr)} | {dev_s} | {res} | {r['kld_mean']:.2e} | {100 * r['top1']:.2f}% | {f4(printed)} "
                     f"| {f4(eppl)} | {f4(er)} |")
        log(lines[-1])
    notes.append(f"ppl: {args.stories} padded to 256 (mkmodel --from --pad 256), quantised by llama-quantize "
                 f"(its mixes: no --pure, no imatrix); llama-perplexity -c {args.ppl_ctx} on "
                 f"{os.path.relpath(args.text, ROOT)}. llama.cpp PPL and spillway PPL: over the same scored "
                 f"positions of llama.cpp's chunks (llama.cpp's from the log-probs it stored in the .kld, "
                 f"uint16-rounded: within ~1e-4 nats of its printed figure)")
    return "\n".join(lines), failed


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--llama-dir", help="directory holding llama-quantize and llama-perplexity")
    ap.add_argument("--llama-quantize")
    ap.add_argument("--llama-perplexity")
    ap.add_argument("--llama-args", default="", help="extra arguments for llama-perplexity")
    ap.add_argument("--spillway", help="spillway binary (default: build it in --build-dir)")
    ap.add_argument("--build-dir", default=os.path.join(ROOT, "build-bench"))
    ap.add_argument("--sections", default="kld,ppl")
    ap.add_argument("--types", default=",".join(t for t, _ in KLD_TYPES), help="kld section types")
    ap.add_argument("--archs", default=",".join(a for a, _ in ARCHS), help="kld section architectures")
    ap.add_argument("--shape", default="--dim 256 --layers 2 --heads 4 --kv-heads 2 --ffn 512 --vocab 512 --untied",
                    help="mkmodel shape options of the synthetic models")
    ap.add_argument("--arch-fixtures", help="folder of F32 models of the architectures mkmodel cannot write")
    ap.add_argument("--stories", help="stories260K.gguf (ppl section)")
    ap.add_argument("--no-exact", dest="exact", action="store_false",
                    help="kld section: skip the two columns against the dequantised-F32 run")
    ap.add_argument("--ppl-types", default="Q4_K_M,Q5_K_M,Q6_K,Q3_K_M,IQ4_XS")
    ap.add_argument("--text", default=os.path.join(ROOT, "bench", "texts", "heldout-story.txt"))
    ap.add_argument("--ctx", type=int, default=64, help="llama-perplexity -c of the kld section (64)")
    ap.add_argument("--ppl-ctx", type=int, default=64, help="llama-perplexity -c of the ppl section (64)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--timeout", type=float, default=600, help="seconds allowed to each llama.cpp run")
    ap.add_argument("--keep", help="write the models and .kld files here and keep them (default: a temp dir)")
    ap.add_argument("--no-record", action="store_true", help="do not append to bench/RESULTS.md")
    args = ap.parse_args()
    if args.llama_dir:
        args.llama_quantize = args.llama_quantize or os.path.join(args.llama_dir, "llama-quantize")
        args.llama_perplexity = args.llama_perplexity or os.path.join(args.llama_dir, "llama-perplexity")
    for attr in ("llama_quantize", "llama_perplexity"):
        p = getattr(args, attr)
        if not p or not os.access(p, os.X_OK):
            ap.error(f"--{attr.replace('_', '-')}: {p!r} is not an executable (or give --llama-dir)")
    sections = [s.strip() for s in args.sections.split(",") if s.strip()]
    if not set(sections) <= {"kld", "ppl"} or not sections:
        ap.error("--sections: kld and/or ppl")
    if "ppl" in sections and not (args.stories and os.path.exists(args.stories)):
        ap.error("the ppl section needs --stories FILE (stories260K.gguf)")
    args.types = [t.strip().lower() for t in args.types.split(",") if t.strip()]
    args.archs = [a.strip() for a in args.archs.split(",") if a.strip()]
    args.ppl_types = [t.strip() for t in args.ppl_types.split(",") if t.strip()]
    args.text = os.path.abspath(args.text)
    if args.ctx < 8 or args.ppl_ctx < 8 or args.ctx % 2 or args.ppl_ctx % 2:
        ap.error("--ctx and --ppl-ctx: even, at least 8")
    if not args.spillway:
        run(["cmake", "-S", ROOT, "-B", args.build_dir, "-DCMAKE_BUILD_TYPE=Release"], "cmake")
        ok, out = run(["cmake", "--build", args.build_dir, "-j", "2", "--target", "spillway"], "build")
        if not ok:
            sys.exit(out)
        args.spillway = os.path.join(args.build_dir, "spillway")
    args.spillway = os.path.abspath(args.spillway)

    tmp = None
    if args.keep:
        os.makedirs(args.keep, exist_ok=True)
        work = args.keep
    else:
        tmp = tempfile.TemporaryDirectory(prefix="crosscheck.")
        work = tmp.name
    load0 = os.getloadavg()[0]
    notes, out, failed = [], [], 0
    if "kld" in sections:
        t, f = section_kld(args, work, notes)
        failed += f
        out.append(f"### spillway vs llama.cpp: next-token distributions (llama-perplexity -c {args.ctx}, "
                   f"{os.path.relpath(args.text, ROOT)})\n\n{t}")
    if "ppl" in sections:
        t, f = section_ppl(args, work, notes)
        failed += f
        out.append(f"### perplexity ratio quantised / F32, stories260K padded to 256\n\n{t}")
    load1 = os.getloadavg()[0]
    notes.append(f"load average (1 min) {load0:.1f} at the start, {load1:.1f} at the end, {os.cpu_count()} CPUs "
                 f"(timings not reported: the figures here do not depend on speed)")
    text = "\n\n".join(out) + "\n\n" + "\n".join(f"- {n}" for n in notes) + "\n"
    print(text)
    if not args.no_record:
        rev = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], text=True,
                             capture_output=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", ROOT, "status", "--porcelain", "--untracked-files=no"],
                               text=True, capture_output=True).stdout.strip()
        with open(os.path.join(ROOT, "bench", "RESULTS.md"), "a") as f:
            f.write(f"\n## {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC, cross-check "
                    f"against llama.cpp (bench/crosscheck.py)\n\n")
            f.write(f"- revision: {rev}{' (with uncommitted changes)' if dirty else ''}\n")
            f.write(f"- command: `bench/crosscheck.py {' '.join(sys.argv[1:])}` ({time.monotonic() - T0:.0f} s)\n\n")
            f.write(text)
    log(f"done: {failed} row(s) failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
