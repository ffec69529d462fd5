#!/usr/bin/env python3
"""bench/fleet_bench.py: prefix routing across the hosts of a fleet (issue 23), on the multi-host
test bed (scripts/fleet-bed.sh: hosts are network namespaces of one machine).

Workload (the issue's): --requests requests (5,000) whose document follows a Zipf law (s = --zipf,
1.1) over --docs documents (200) of about --doc-tokens tokens (1,024), each followed by a short
question that is unique to the request; greedy, --max-tokens generated tokens (4). Each request
also carries "prefix_key": "doc-<n>", the routing key of issue 23 item 1. Documents are word
salads of bench/texts/heldout-story.txt that start with their own number, so their first 64 bytes
differ; their token counts are measured with `spillway generate` (the same model and tokenizer),
trimmed towards --doc-tokens and padded with newlines to whole KV blocks.

For each routing mode a fresh bed (--hosts 3 x --workers 1, at-least-once, cold caches) is
started, every request is sent with `spillway produce` and `spillway collect` waits for every
result; then the bed is taken down. Modes:
  affinity  `spillway produce --route affinity` (needs a spillway whose produce has --route)
  bytes     keyed by a hash of the prompt's first 64 bytes (`--key-prefix 64`, or `--route bytes`)
  random    keyed by the request id (`--key-prefix 0`, or `--route random`): no affinity
A mode the binary cannot do is reported as skipped.

Figures per mode: wall time from the first message sent to the last result read, requests/s and
prompt tokens/s; prefix hit rate = sum(usage.cached_tokens) / sum(usage.prompt_tokens) of the
results, and its ratio to two ideals computed over the same request order: an infinite single
cache, and one LRU cache of the fleet's arena capacity (hosts x cache.arena.mb, in blocks of
kv.block_tokens; every full block of a request's prompt is inserted, a request hits the longest
run of leading blocks present); per-host busy share = the busiest host's sum of usage.compute_ms
over the mean of the hosts', with each host's share of the requests.

With --forward, forwarding between workers is on in every mode's bed (issue 23 item 2): a topic
"forward" of as many partitions as the input topic, forward.topic=forward (the triggers'
own defaults, or -s forward.*=...) and the roundrobin assignor (the default one balances over
both topics together and may leave a worker none of the input's); the forwards counted in the workers' /metrics
(spillway:forwarded_total, by reason) are read just before each bed is taken down and printed
in the table's last column.

Each host's workers get --host-cpus cores (0.6 by default: 1.8 of a 2-core machine for three
hosts) through the bed's CPU quota, so a busy host cannot borrow an idle host's CPU, as on
separate machines (--host-cpus 0: no limit, the hosts share the cores).

The table is printed and (unless --no-record) appended to bench/RESULTS.md with the date, git
revision, CPU, load average and command line. Needs root (the bed) and the bed's tools.

Usage: bench/fleet_bench.py [--small] [--modes affinity,bytes,random] [--requests N] [--docs N]
       [--doc-tokens N] [--zipf S] [--hosts N] [--workers N] [--partitions N] [--arena-mb N]
       [--kv-mem-mb N] [--host-cpus F] [--spillway BIN] [--model GGUF] [--forward] [-s KEY=V]...
       [-X PROP=V]... [--no-record]
"""
import argparse
import bisect
import collections
import datetime
import json
import os
import random
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time

from machine import cpu_model, git_rev

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FB = os.path.join(ROOT, "scripts", "fleet-bed.sh")
TEXT = os.path.join(ROOT, "bench", "texts", "heldout-story.txt")
QUESTIONS = ["Who is in the story", "What did they find", "Where did they go",
             "Why was the girl sad", "What happened at the end", "What did mom say"]


def log(msg):
    print("[fleet_bench %s] %s" % (time.strftime("%H:%M:%S"), msg), file=sys.stderr, flush=True)


def ensure_model(args):
    """The model: --model, else a synthetic llama (2,048-token context, stories260K's tokenizer)
    written once by `spillway mkmodel` under build/models."""
    if args.model:
        return args.model
    path = os.path.join(os.path.dirname(args.spillway), "models", "fleet-bench.gguf")
    if not os.path.exists(path):
        os.makedirs(os.path.dirname(path), exist_ok=True)
        subprocess.run([args.spillway, "mkmodel", "-o", path, "--preset", "tiny",
                        "--vocab-from", os.path.join(ROOT, "models", "stories260K.gguf"),
                        "--ctx", "2048", "--dim", "128", "--layers", "4", "--heads", "4",
                        "--kv-heads", "2", "--ffn", "256"], check=True,
                       stdout=subprocess.DEVNULL)
    return path


def kv_bytes_per_token(args, model):
    out = subprocess.run([args.spillway, "inspect", model], text=True, capture_output=True,
                         check=True).stdout
    m = re.search(r"KV bytes per token: (\d+) \(f16\)", out)
    if not m:
        raise SystemExit("fleet_bench: cannot read the KV bytes per token of %s" % model)
    return int(m.group(1))


def prompt_tokens(args, model, prompts, work):
    """Token counts of prompts (spillway generate, one token generated each)."""
    path = os.path.join(work, "count.jsonl")
    with open(path, "w") as f:
        for i, p in enumerate(prompts):
            f.write(json.dumps({"id": str(i), "prompt": p, "max_tokens": 1, "temperature": 0}) + "\n")
    out = subprocess.run([args.spillway, "generate", "-m", model, "-f", path, "--threads", "1"],
                         text=True, capture_output=True, check=True).stdout
    counts = {}
    for line in out.splitlines():
        r = json.loads(line)
        counts[int(r["id"])] = r["usage"]["prompt_tokens"]
    return [counts[i] for i in range(len(prompts))]


def make_docs(args, model, work):
    """--docs documents of about --doc-tokens tokens each, every one ending in newlines (single
    byte tokens: the question after them never merges with the document's last token) padded to
    a whole number of KV blocks, so a document's blocks are the same in every request and its
    questions' blocks are their own. Returns (texts, token counts)."""
    words = open(TEXT).read().split()
    rnd = random.Random(args.seed)
    chars = int(args.doc_tokens * 2.2)
    raw = []
    for d in range(args.docs):
        s = "Document %d. " % d
        while len(s) < chars:
            s += rnd.choice(words) + " "
        raw.append(s)
    counts = prompt_tokens(args, model, [t + "\n" for t in raw], work)
    docs = []
    for t, n in zip(raw, counts):
        keep = max(16, int(len(t) * (args.doc_tokens - args.block) / max(n, 1)))
        docs.append(t[:keep].rstrip() + "\n")
    counts = prompt_tokens(args, model, docs, work)
    docs = [t + "\n" * ((-n) % args.block) for t, n in zip(docs, counts)]
    return docs, prompt_tokens(args, model, docs, work)


def zipf_sampler(n, s, rnd):
    w = [1.0 / (k + 1) ** s for k in range(n)]
    cum, acc = [], 0.0
    for x in w:
        acc += x
        cum.append(acc)
    return lambda: bisect.bisect_left(cum, rnd.random() * acc)


def make_requests(args, docs, work):
    rnd = random.Random(args.seed + 1)
    draw = zipf_sampler(len(docs), args.zipf, rnd)
    # documents in a random rank order, so the hottest is not document 0
    rank = list(range(len(docs)))
    rnd.shuffle(rank)
    reqs = []
    for i in range(args.requests):
        d = rank[draw()]
        q = "Question %d: %s?" % (i, rnd.choice(QUESTIONS))
        reqs.append({"id": "q%05d" % i, "prompt": docs[d] + q, "prefix_key": "doc-%d" % d,
                     "max_tokens": args.max_tokens, "temperature": 0})
    path = os.path.join(work, "requests.jsonl")
    with open(path, "w") as f:
        for r in reqs:
            f.write(json.dumps(r) + "\n")
    return reqs, path


def ideal_hits(reqs, doc_of, doc_tokens, q_tokens, block, capacity):
    """Cached tokens of one cache over the request order: capacity None = infinite, else an
    LRU of that many blocks. A request's full blocks are its document's floor(D / block) blocks
    (a block that straddles the document's end holds question tokens: unique) then its own."""
    lru = collections.OrderedDict()
    hit = 0
    for i, r in enumerate(reqs):
        d = doc_of[i]
        nfull = (doc_tokens[d] + q_tokens[i]) // block
        ndoc = doc_tokens[d] // block
        names = [("d", d, b) for b in range(ndoc)] + [("q", i, b) for b in range(nfull - ndoc)]
        n = 0
        for nm in names:
            if nm in lru:
                n += 1
            else:
                break
        # a whole cached prompt still computes its last token
        total = doc_tokens[d] + q_tokens[i]
        hit += min(n * block, total - 1)
        for nm in names:
            lru[nm] = True
            lru.move_to_end(nm)
        if capacity is not None:
            while len(lru) > capacity:
                lru.popitem(last=False)
    return hit


def produce_supports_route(spillway):
    out = subprocess.run([spillway, "produce", "--help"], text=True, capture_output=True)
    return "--route" in out.stdout + out.stderr


def run_mode(args, model, mode, req_path, n, work):
    bed = os.path.join(work, "bed-" + mode)
    cmd = [FB, "up", bed, "-m", model, "--spillway", args.spillway, "--hosts", str(args.hosts),
           "--workers", str(args.workers), "--arena-mb", str(args.arena_mb),
           "-s", "kv.mem_mb=%d" % args.kv_mem_mb, "-s", "log.level=info"]
    if args.partitions:
        cmd += ["--partitions", str(args.partitions)]
    if float(args.host_cpus) > 0:
        cmd += ["--host-cpus", args.host_cpus]
    if args.forward:
        parts = args.partitions or 2 * args.workers * args.hosts
        cmd += ["--topic", "forward:%d" % parts, "-s", "forward.topic=forward",
                "-X", "consumer.partition.assignment.strategy=roundrobin"]
    for kv in args.set:
        cmd += ["-s", kv]
    for kv in args.kafka:
        cmd += ["-X", kv]
    log("%s: bed up" % mode)
    out = subprocess.run(cmd, text=True, capture_output=True)
    if out.returncode != 0:
        sys.stderr.write(out.stderr[-3000:])
        raise SystemExit("fleet_bench: fleet-bed.sh up failed")
    env = dict(re.findall(r"^(\w+)=(.*)$", out.stdout, re.M))
    boot = env["BOOTSTRAP"]
    try:
        if produce_supports_route(args.spillway):
            route = ["--route", mode]
        else:
            route = ["--key-prefix", {"bytes": "64", "random": "0"}[mode]]
        res_path = os.path.join(work, "results-%s.jsonl" % mode)
        t0 = time.monotonic()
        col = subprocess.Popen([args.spillway, "collect", "-b", boot, "-t", "results",
                                "--count", str(n), "-o", res_path, "--timeout", str(args.timeout)],
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        log("%s: sending %d requests (%s)" % (mode, n, " ".join(route)))
        subprocess.run([args.spillway, "produce", "-b", boot, "-t", "prompts"] + route + [req_path],
                       check=True, stderr=subprocess.DEVNULL)
        t_sent = time.monotonic() - t0
        _, cerr = col.communicate()
        wall = time.monotonic() - t0
        if col.returncode != 0:
            sys.stderr.write(cerr[-2000:])
            raise SystemExit("fleet_bench: collect failed in mode %s" % mode)
        results = [json.loads(line) for line in open(res_path) if line.strip()]
        log("%s: %d results in %.1f s (sent in %.1f s)" % (mode, len(results), wall, t_sent))
        return results, wall, forwards(args, env) if args.forward else None
    finally:
        keep = ["--keep"] if args.keep else []
        subprocess.run([FB, "down", bed] + keep, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL)


def forwards(args, env):
    """Forwards counted by every worker of the bed ({reason: count}), from their /metrics."""
    out = collections.Counter()
    for h in range(1, args.hosts + 1):
        for w in range(args.workers):
            url = "http://%s.%d:%d/metrics" % (env["NET"], 10 + h, 9100 + w)
            text = subprocess.run(["curl", "-s", "-m", "5", url], text=True,
                                  capture_output=True).stdout
            for m in re.finditer(r'^spillway:forwarded_total\{reason="(\w+)"\} (\S+)$', text, re.M):
                out[m.group(1)] += int(float(m.group(2)))
    return out


def summarise(mode, results, wall, n_hosts, ideal_inf, ideal_lru):
    prompt = sum(r["usage"]["prompt_tokens"] for r in results)
    cached = sum(r["usage"]["cached_tokens"] for r in results)
    busy = collections.Counter()
    count = collections.Counter()
    for r in results:
        m = re.match(r"h(\d+)w\d+$", r.get("worker", ""))
        host = int(m.group(1)) if m else 0
        busy[host] += r["usage"].get("compute_ms", 0.0)
        count[host] += 1
    hosts = range(1, n_hosts + 1)
    mean_busy = sum(busy[h] for h in hosts) / n_hosts
    hit = cached / prompt if prompt else 0.0
    return {
        "mode": mode, "n": len(results), "wall": wall, "rps": len(results) / wall,
        "tps": prompt / wall, "hit": hit, "vs_inf": cached / ideal_inf if ideal_inf else 0.0,
        "vs_lru": cached / ideal_lru if ideal_lru else 0.0,
        "busy": max(busy[h] for h in hosts) / mean_busy if mean_busy else 0.0,
        "share": "/".join("%.0f" % (100.0 * count[h] / len(results)) for h in hosts),
        "errors": sum(1 for r in results if r.get("finish_reason") not in ("length", "stop")),
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--spillway", default=os.path.join(ROOT, "build", "spillway"))
    ap.add_argument("--model")
    ap.add_argument("--modes", default="affinity,bytes,random")
    ap.add_argument("--small", action="store_true",
                    help="500 requests over 50 documents of 512 tokens: a quick run")
    ap.add_argument("--requests", type=int, default=5000)
    ap.add_argument("--docs", type=int, default=200)
    ap.add_argument("--doc-tokens", type=int, default=1024)
    ap.add_argument("--zipf", type=float, default=1.1)
    ap.add_argument("--max-tokens", type=int, default=4)
    ap.add_argument("--hosts", type=int, default=3)
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--partitions", type=int, default=0, help="0: the bed's default")
    ap.add_argument("--arena-mb", type=int, default=48)
    ap.add_argument("--kv-mem-mb", type=int, default=32)
    ap.add_argument("--host-cpus", default="0.6",
                    help="each host's CPU limit in cores (fleet-bed.sh --host-cpus; 0 = none)")
    ap.add_argument("--seed", type=int, default=23)
    ap.add_argument("--timeout", type=int, default=1800, help="seconds a mode may take")
    ap.add_argument("-s", "--set", action="append", default=[], metavar="KEY=V")
    ap.add_argument("-X", "--kafka", action="append", default=[], metavar="PROP=V")
    ap.add_argument("--keep", action="store_true", help="keep the work folder and each bed's logs")
    ap.add_argument("--forward", action="store_true",
                    help="forwarding between workers on (a forward topic, forward.topic)")
    ap.add_argument("--no-record", action="store_true")
    args = ap.parse_args()
    if args.small:
        args.requests, args.docs, args.doc_tokens = 500, 50, 512
        args.arena_mb, args.kv_mem_mb = 12, 8
    args.spillway = os.path.abspath(args.spillway)
    if os.geteuid() != 0:
        raise SystemExit("fleet_bench: needs root (the test bed uses network namespaces)")
    modes = [m for m in args.modes.split(",") if m]
    for m in modes:
        if m not in ("affinity", "bytes", "random"):
            raise SystemExit("fleet_bench: unknown mode %s" % m)
    route = produce_supports_route(args.spillway)
    model = ensure_model(args)
    args.block = block = 16
    for kv in args.set:
        if kv.startswith("kv.block_tokens="):
            args.block = block = int(kv.split("=", 1)[1])
    work = tempfile.mkdtemp(prefix="spillway-fleet-bench.")
    log("model %s, workload in %s" % (model, work))
    try:
        measure(args, model, modes, route, block, work)
    finally:
        if args.keep:
            log("work folder kept: %s" % work)
        else:
            shutil.rmtree(work, ignore_errors=True)


def measure(args, model, modes, route, block, work):
    docs, doc_tokens = make_docs(args, model, work)
    log("documents: %d, tokens min %d, mean %.0f, max %d, %d of them whole blocks" % (
        len(docs), min(doc_tokens), sum(doc_tokens) / len(doc_tokens), max(doc_tokens),
        sum(1 for n in doc_tokens if n % block == 0)))
    reqs, req_path = make_requests(args, docs, work)
    doc_of = [int(r["prefix_key"].split("-")[1]) for r in reqs]
    q_tokens = [0] * len(reqs)  # filled from the results (prompt_tokens - the document's)

    rows, skipped = [], []
    ideal = None
    for mode in modes:
        if mode == "affinity" and not route:
            skipped.append(mode)
            log("affinity: skipped (this spillway's produce has no --route)")
            continue
        results, wall, fwd = run_mode(args, model, mode, req_path, len(reqs), work)
        if ideal is None:
            by_id = {r["id"]: r for r in results}
            for i, r in enumerate(reqs):
                q_tokens[i] = max(0, by_id[r["id"]]["usage"]["prompt_tokens"] - doc_tokens[doc_of[i]])
            cap = args.hosts * args.arena_mb * 1024 * 1024 // (kv_bytes_per_token(args, model) * block)
            ideal = (ideal_hits(reqs, doc_of, doc_tokens, q_tokens, block, None),
                     ideal_hits(reqs, doc_of, doc_tokens, q_tokens, block, cap), cap)
        rows.append(summarise(mode, results, wall, args.hosts, ideal[0], ideal[1]))
        rows[-1]["fwd"] = ("; ".join("%s %d" % kv for kv in sorted(fwd.items())) or "0"
                           if fwd is not None else None)

    total_prompt = sum(doc_tokens[doc_of[i]] + q_tokens[i] for i in range(len(reqs)))
    hot = collections.Counter(doc_of).most_common(1)[0][1] if reqs else 0
    lines = []
    lines.append("| routing | requests | wall s | req/s | prompt tok/s | hit rate | vs ideal inf. | "
                 "vs ideal LRU | busiest host / mean | requests per host % |" +
                 (" forwards |" if args.forward else ""))
    lines.append("|---|---|---|---|---|---|---|---|---|---|" + ("---|" if args.forward else ""))
    for r in rows:
        lines.append("| %s | %d | %.1f | %.1f | %.0f | %.1f%% | %.1f%% | %.1f%% | %.2f | %s |" % (
            r["mode"], r["n"], r["wall"], r["rps"], r["tps"], 100 * r["hit"], 100 * r["vs_inf"],
            100 * r["vs_lru"], r["busy"], r["share"]) +
            (" %s |" % r["fwd"] if args.forward else ""))
    for m in skipped:
        lines.append("| %s | skipped: this spillway's `produce` has no `--route` | | | | | | | | |" % m)
    notes = []
    if rows and ideal:
        notes.append("ideal hit rates over the same order: infinite cache %.1f%%, one LRU of the "
                     "fleet's arena capacity (%d blocks of %d tokens) %.1f%%" % (
                         100.0 * ideal[0] / total_prompt, ideal[2], block,
                         100.0 * ideal[1] / total_prompt))
    by = {r["mode"]: r for r in rows}
    if "random" in by:
        for m in ("affinity", "bytes"):
            if m in by:
                notes.append("%s throughput / random: %.2fx" % (m, by[m]["rps"] / by["random"]["rps"]))
    if "affinity" in by:
        a = by["affinity"]
        notes.append("issue 23 goals (affinity): hit rate >= 90%% of ideal (infinite): %s; "
                     ">= 1.5x random: %s; busiest host <= 1.3x mean: %s" % (
                         "met" if a["vs_inf"] >= 0.9 else "NOT MET",
                         ("met" if a["rps"] >= 1.5 * by["random"]["rps"] else "NOT MET")
                         if "random" in by else "n/a",
                         "met" if a["busy"] <= 1.3 else "NOT MET"))
    errs = sum(r["errors"] for r in rows)
    table = "\n".join(lines)
    print(table)
    for n in notes:
        print("- " + n)
    if args.no_record:
        return
    load = open("/proc/loadavg").read().split()[:3]
    with open(os.path.join(ROOT, "bench", "RESULTS.md"), "a") as f:
        f.write("\n## Fleet routing on the multi-host test bed (issue 23), %s\n\n" %
                datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"))
        f.write("`%s` at %s; %s, %d cores, load average %s at the end (the machine is shared); "
                "%d host(s) x %d worker(s) (network namespaces of this one machine; %s), "
                "threads=1, kv.mem_mb=%d, cache.arena.mb=%d, at-least-once; model %s "
                "(%s); %d requests, Zipf s=%.2f over %d documents of %.0f tokens (mean; min %d, "
                "max %d) + a unique question, max_tokens %d; the hottest document has %d requests."
                "%s\n\n" % (
                    " ".join(shlex.quote(a) for a in ["bench/fleet_bench.py"] + sys.argv[1:]),
                    git_rev(), cpu_model(), os.cpu_count() or 0, " ".join(load), args.hosts,
                    args.workers, "each limited to %s cores" % args.host_cpus
                    if float(args.host_cpus) > 0 else "sharing its cores", args.kv_mem_mb, args.arena_mb, os.path.basename(model),
                    "synthetic llama dim 128, 4 layers, stories260K tokenizer, ctx 2048"
                    if not args.model else "given", len(reqs), args.zipf, args.docs,
                    sum(doc_tokens) / len(doc_tokens), min(doc_tokens), max(doc_tokens),
                    args.max_tokens, hot,
                    " %d result(s) with an unexpected finish reason." % errs if errs else ""))
        f.write(table + "\n\n")
        for n in notes:
            f.write("- " + n + "\n")
        f.write("- hit rate = sum cached_tokens / sum prompt_tokens of the results; busy = sum of "
                "the results' usage.compute_ms per host; wall = first message sent to last result "
                "read.\n")
    log("appended to bench/RESULTS.md")


if __name__ == "__main__":
    main()
