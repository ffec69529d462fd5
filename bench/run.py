#!/usr/bin/env python3
"""bench/run.py: engine benchmark, side by side with llama.cpp when its binaries are given.

Builds Release, makes the synthetic models it needs with `spillway mkmodel`, runs
bench_engine (prefill of a 512-token prompt, decode of 128 tokens at batch 1, batched decode at
4/16/64 sequences) and, when --llama-bench / --llama-batched-bench are given, the same workloads
with llama.cpp in the same invocation (llama-bench pp512 / tg128; llama-batched-bench -npp 16
-ntg 128 -npl 4,16,64, its S_TG figure). Each figure is repeated --reps times and printed as
min / median / max; the ratio is spillway median / llama.cpp median. The table is appended to
bench/RESULTS.md with the date, git revision, CPU model and the command line.
"""
import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def sh(cmd, **kw):
    return subprocess.run(cmd, check=True, text=True, **kw)


def cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def mmm(vals):
    vals = sorted(vals)
    return vals[0], statistics.median(vals), vals[-1]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", default="smollm2-135m")
    ap.add_argument("--dtypes", default="f32,f16")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--batches", default="4,16,64")
    ap.add_argument("--llama-bench", help="path of llama.cpp's llama-bench")
    ap.add_argument("--llama-batched-bench", help="path of llama.cpp's llama-batched-bench")
    ap.add_argument("--build-dir", default=os.path.join(ROOT, "build-bench"))
    ap.add_argument("--no-build", action="store_true")
    ap.add_argument("--no-record", action="store_true", help="do not append to bench/RESULTS.md")
    args = ap.parse_args()

    bd = args.build_dir
    if not args.no_build:
        sh(["cmake", "-S", ROOT, "-B", bd, "-DCMAKE_BUILD_TYPE=Release"], stdout=subprocess.DEVNULL)
        sh(["cmake", "--build", bd, "-j", str(os.cpu_count() or 2), "--target", "spillway", "bench_engine"],
           stdout=subprocess.DEVNULL)
    spillway = os.path.join(bd, "spillway")
    bench = os.path.join(bd, "bench_engine")
    os.makedirs(os.path.join(bd, "models"), exist_ok=True)

    rows = []  # (label, ours(min,med,max), peer(min,med,max) or None)
    for dt in args.dtypes.split(","):
        model = os.path.join(bd, "models", f"{args.preset}-{dt}.gguf")
        if not os.path.exists(model):
            sh([spillway, "mkmodel", "-o", model, "--preset", args.preset, "--dtype", dt])
        with tempfile.NamedTemporaryFile("r", suffix=".jsonl") as jf:
            sh([bench, model, "--threads", str(args.threads), "--reps", str(args.reps),
                "--batches", args.batches, "--json", jf.name], stdout=sys.stderr)
            ours = [json.loads(l) for l in open(jf.name) if l.strip()]
        peer = {}
        if args.llama_bench:
            out = subprocess.run([args.llama_bench, "-m", model, "-p", "512", "-n", "128", "-t", str(args.threads),
                                  "-r", str(args.reps), "-o", "json"], check=True, text=True,
                                 capture_output=True).stdout
            for r in json.loads(out):
                key = ("prefill", 512) if r.get("n_prompt") == 512 and r.get("n_gen") == 0 else ("decode", 1)
                peer[key] = mmm(r["samples_ts"])
        if args.llama_batched_bench:
            speeds = {}
            for _ in range(args.reps):
                out = subprocess.run([args.llama_batched_bench, "-m", model, "-c", "16384", "-b", "2048", "-ub", "512",
                                      "-npp", "16", "-ntg", "128", "-npl", args.batches, "-t", str(args.threads),
                                      "--output-format", "jsonl"], check=True, text=True, capture_output=True)
                for l in (out.stdout + out.stderr).splitlines():
                    l = l.strip()
                    if l.startswith("{") and "speed_tg" in l:
                        r = json.loads(l)
                        speeds.setdefault(r["pl"], []).append(r["speed_tg"])
            for pl, v in speeds.items():
                peer[("decode", pl)] = mmm(v)
        for r in ours:
            if r["workload"] == "prefill":
                label, key = f"{dt} prefill {r['n']} tokens", ("prefill", r["n"])
            else:
                label, key = f"{dt} decode {r['n']} seq x {r['gen']} tokens", ("decode", r["n"])
            rows.append((label, (r["min"], r["median"], r["max"]), peer.get(key)))

    have_peer = any(p for _, _, p in rows)
    lines = []
    hdr = "| workload (tokens/s) | spillway min | median | max |"
    sep = "|---|---:|---:|---:|"
    if have_peer:
        hdr += " llama.cpp min | median | max | ratio |"
        sep += "---:|---:|---:|---:|"
    lines += [hdr, sep]
    for label, o, p in rows:
        line = f"| {label} | {o[0]:.1f} | {o[1]:.1f} | {o[2]:.1f} |"
        if have_peer:
            line += f" {p[0]:.1f} | {p[1]:.1f} | {p[2]:.1f} | {o[1] / p[1]:.2f}x |" if p else " | | | |"
        lines.append(line)
    table = "\n".join(lines)
    print(table)

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
            f.write(f"- command: `bench/run.py {' '.join(sys.argv[1:])}`\n\n")
            f.write(table + "\n")


if __name__ == "__main__":
    main()
