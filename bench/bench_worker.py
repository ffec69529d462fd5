#!/usr/bin/env python3
"""bench/bench_worker.py: `spillway worker` end to end through a real Kafka broker.

Starts a throwaway Apache Kafka broker (scripts/kafka-broker.sh), and for each scenario creates
its topics (input 4 partitions, results 4, DLQ 1), writes N requests, sends them with
`spillway produce` (a backlog: everything is in Kafka before the worker starts), starts one
`spillway worker`, waits with `spillway collect --count N` until every result is in, stops the
worker with SIGTERM and reads the worker's own "stats:" log line (worker_log_stats: where its
time went, per phase).

Scenarios (stories260K, greedy):
  short     one generated token per request: intake, parsing, tokenising and produce dominate
  long      up to --long-tokens tokens per request: the engine dominates
  plumbing  requests whose deadline has passed: they come back "expired" without reaching the
            engine, so this is intake + parse + result + produce + commit alone

Figures: busy = from the worker's first accepted message to its last durable output (the
worker's monotonic clock; excludes process start and the consumer-group join), e2e = from
starting the worker process until `collect` has every result (includes start-up and the join).
Non-engine CPU per request = (process CPU - engine-thread CPU) / outputs: the poll thread plus
librdkafka's threads (their idle wakeups included, which dominates when the engine is slow).
Phase times are summed wall time per thread (see worker_stats_t in worker/worker.h). The table
is appended to bench/RESULTS.md with the date, git revision, CPU and command line.

Usage: bench/bench_worker.py [--spillway BIN] [--model GGUF] [--short N] [--long N]
                             [--long-tokens T] [--scenarios short,long,plumbing] [-s KEY=VALUE]...
"""
import argparse
import datetime
import json
import os
import random
import re
import shlex
import signal
import subprocess
import sys
import tempfile
import time

from machine import cpu_model, git_rev

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
KB = os.path.join(ROOT, "scripts", "kafka-broker.sh")

PREFIXES = [
    "Once upon a time, there was a little girl named Lily. She",
    "Tom and his dog went to the park. They",
    "The sun was shining and the birds",
    "Sue had a red ball. She",
    "One day, a big bear came to the",
    "Ben wanted to play with his",
    "There was a small cat who liked to",
    "Mom said, \"Let's go to the",
]


def write_requests(path, n, max_tokens, expired, seed):
    rnd = random.Random(seed)
    with open(path, "w") as f:
        for i in range(n):
            req = {"id": "r%06d" % i, "prompt": "%s %d" % (rnd.choice(PREFIXES), i),
                   "max_tokens": max_tokens, "temperature": 0}
            if expired:
                req["deadline"] = 1000  # 1970: expired on arrival
            f.write(json.dumps(req) + "\n")


def parse_stats(log):
    """The last "stats:" line of the worker's log as a dict of floats."""
    line = None
    for ln in log.splitlines():
        if " stats: " in ln:
            line = ln
    if not line:
        return None
    return {k: float(v) for k, v in re.findall(r"(\w+)=([-0-9.]+)", line.split(" stats: ", 1)[1])}


def run_scenario(args, env, bootstrap, bdir, work, name, n, max_tokens, expired, rep=0):
    tag = "%s-%d" % (name, rep)
    tin, tout, tdlq = "in-" + tag, "out-" + tag, "dlq-" + tag
    for t, parts in ((tin, 4), (tout, 4), (tdlq, 1)):
        subprocess.run([KB, "topic", bdir, t, str(parts)], check=True, env=env,
                       stdout=subprocess.DEVNULL)
    req = os.path.join(work, tag + ".jsonl")
    write_requests(req, n, max_tokens, expired, seed=n)
    t0 = time.monotonic()
    subprocess.run([args.spillway, "produce", "-b", bootstrap, "-t", tin, "--key-prefix", "0", req],
                   check=True, stderr=subprocess.DEVNULL)
    produce_s = time.monotonic() - t0

    log_path = os.path.join(work, tag + ".worker.log")
    cmd = [args.spillway, "worker", "-b", bootstrap, "-t", tin, "-o", tout, "-d", tdlq,
           "-g", "bench-" + tag, "-m", args.model, "-s", "log.level=info",
           "-s", "threads=%d" % args.threads, "-X", "log_level=3"]
    for kv in args.set:
        cmd += ["-s", kv]
    for kv in args.kafka:
        cmd += ["-X", kv]
    with open(log_path, "w") as log:
        t0 = time.monotonic()
        wp = subprocess.Popen(cmd, stdout=log, stderr=log)
        perf = None
        if args.perf and name in args.perf.split(","):
            perf = subprocess.Popen(["perf", "record", "-g", "-F", "499", "-p", str(wp.pid), "-o",
                                     os.path.join(args.perf_dir, name + ".perf.data")],
                                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        col = subprocess.run([args.spillway, "collect", "-b", bootstrap, "-t", tout, "--count",
                              str(n), "-o", os.devnull, "--timeout", str(args.timeout)],
                             stderr=subprocess.PIPE, text=True)
        e2e_s = time.monotonic() - t0
        if perf:
            perf.send_signal(signal.SIGINT)
            perf.wait()
        wp.send_signal(signal.SIGTERM)
        try:
            wrc = wp.wait(timeout=120)
        except subprocess.TimeoutExpired:
            wp.kill()
            wrc = wp.wait()
    with open(log_path) as f:
        text = f.read()
    st = parse_stats(text)
    if col.returncode != 0 or wrc != 0 or not st:
        sys.stderr.write(text[-4000:] + "\n" + col.stderr)
        raise SystemExit("scenario %s failed: collect rc %d, worker rc %d" % (name, col.returncode, wrc))
    st.update(name=name, n=n, max_tokens=max_tokens, produce_s=produce_s, e2e_s=e2e_s,
              cmd=" ".join(shlex.quote(c) for c in cmd))
    return st


def strip_note(argv):
    out, skip = [], False
    for a in argv:
        if skip:
            skip = False
        elif a == "--note":
            skip = True
        elif not a.startswith("--note="):
            out.append(a)
    return out


def fmt_table(rows):
    out = ["| scenario | requests | max_tokens | busy s | req/s (min-max) | gen tok/s | e2e s | poll-thread CPU s |"
           " engine-thread CPU s | process CPU s | non-engine CPU us/req | pauses |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        plumb = (r["process_cpu_s"] - r["engine_cpu_s"]) / max(r["outputs"], 1) * 1e6
        spread = " (%.0f-%.0f)" % (r["rate_min"], r["rate_max"]) if r["reps"] > 1 else ""
        out.append("| %s | %d | %d | %.2f | %.0f%s | %.0f | %.2f | %.2f | %.2f | %.2f | %.1f | %d |" % (
            r["name"], r["n"], r["max_tokens"], r["busy_s"], r["req_per_s"], spread, r["tok_per_s"],
            r["e2e_s"], r["poll_cpu_s"], r["engine_cpu_s"], r["process_cpu_s"], plumb, r["pauses"]))
    out.append("")
    out.append("Worker time split (seconds of wall time summed per thread; poll thread: poll = waiting in "
               "consumer_poll, intake = track + parse + tokenise, produce = send + delivery reports; "
               "engine thread: submit, step (result JSON included), idle; queue = mean ms from intake to "
               "the first scheduled step):")
    out.append("")
    out.append("| scenario | poll | intake | parse | tokenize | produce | commit | submit | step | result JSON |"
               " engine idle | intake us/req | produce us/req | queue ms |")
    out.append("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        out.append("| %s | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f | %.1f | %.1f | %.1f |" % (
            r["name"], r["poll_s"], r["intake_s"], r["parse_s"], r["tokenize_s"], r["produce_s"],
            r["commit_s"], r["submit_s"], r["step_s"], r["result_s"], r["idle_s"], r["intake_us"],
            r["produce_us"], r["queue_ms_mean"]))
    return "\n".join(out)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--spillway", default=os.path.join(ROOT, "build-bench", "spillway"))
    ap.add_argument("--model", default=os.path.join(os.environ.get(
        "SPILLWAY_MODELS", os.path.join(ROOT, "..", "shared", "models")), "stories260K.gguf"))
    ap.add_argument("--scenarios", default="short,long,plumbing")
    ap.add_argument("--short", type=int, default=20000, help="requests of the short and plumbing runs")
    ap.add_argument("--long", type=int, default=1000, help="requests of the long run")
    ap.add_argument("--long-tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=1, help="worker compute threads")
    ap.add_argument("--reps", type=int, default=1,
                    help="runs per scenario; the table shows the median run and the req/s range")
    ap.add_argument("-s", "--set", action="append", default=[], help="extra worker KEY=VALUE")
    ap.add_argument("-X", "--kafka", action="append", default=[], help="extra librdkafka PROP=VALUE")
    ap.add_argument("--timeout", type=int, default=600)
    ap.add_argument("--perf", default="", help="scenarios to record with perf record -g")
    ap.add_argument("--perf-dir", default=".")
    ap.add_argument("--note", default="", help="a line recorded with the table")
    ap.add_argument("--no-record", action="store_true", help="do not append to bench/RESULTS.md")
    args = ap.parse_args()
    args.spillway = os.path.abspath(args.spillway)
    if not os.access(args.spillway, os.X_OK):
        raise SystemExit("no spillway binary at %s (--spillway)" % args.spillway)
    if not os.path.exists(args.model):
        raise SystemExit("model %s not found (--model)" % args.model)

    env = dict(os.environ, SPILLWAY_SVC_OWNER=str(os.getpid()))
    work = tempfile.mkdtemp(prefix="spillway-bench-worker.")
    bdir = os.path.join(work, "broker")
    rows = []
    try:
        out = subprocess.run([KB, "start", bdir], check=True, env=env, text=True,
                             stdout=subprocess.PIPE).stdout
        bootstrap = re.search(r"^BOOTSTRAP=(\S+)", out, re.M).group(1)
        print("broker at %s" % bootstrap, file=sys.stderr)
        plan = {"short": (args.short, 1, False), "long": (args.long, args.long_tokens, False),
                "plumbing": (args.short, 1, True)}
        for name in args.scenarios.split(","):
            n, mt, expired = plan[name]
            runs = sorted((run_scenario(args, env, bootstrap, bdir, work, name, n, mt, expired, k)
                           for k in range(args.reps)), key=lambda x: x["req_per_s"])
            r = dict(runs[len(runs) // 2], reps=len(runs), rate_min=runs[0]["req_per_s"],
                     rate_max=runs[-1]["req_per_s"])
            rows.append(r)
            print("%s: %d requests, busy %.2f s, %.0f req/s, %.0f tok/s, e2e %.2f s" % (
                name, n, r["busy_s"], r["req_per_s"], r["tok_per_s"], r["e2e_s"]), file=sys.stderr)
    finally:
        subprocess.run([KB, "stop", bdir], env=env, stdout=subprocess.DEVNULL)
        subprocess.run(["rm", "-rf", work])

    table = fmt_table(rows)
    print(table)
    if not args.no_record:
        load = os.getloadavg()
        head = ["", "## bench_worker.py, %s, rev %s" % (datetime.date.today().isoformat(), git_rev()), "",
                "Machine: %s, %d CPUs (load average before the run %.1f; broker, worker and collect share "
                "them)." % (cpu_model(), os.cpu_count(), load[0]),
                "Command: `%s`" % " ".join(shlex.quote(a) for a in strip_note(sys.argv)),
                "Worker: `%s`" % rows[0]["cmd"].replace(ROOT + "/", "") if rows else ""]
        if args.note:
            head.append("Note: " + args.note)
        with open(os.path.join(ROOT, "bench", "RESULTS.md"), "a") as f:
            f.write("\n".join(head) + "\n\n" + table + "\n")


if __name__ == "__main__":
    main()
