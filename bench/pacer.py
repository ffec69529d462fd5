#!/usr/bin/env python3
"""Paced prompt source for bench/load_burst.sh, bench/soak.sh and tests/test_load_burst.sh.

Writes kcat producer lines "id<TAB>json" to stdout at a scheduled rate (pipe it into
`kcat -P -K '\\t'`): --phases "RATE:SECONDS,RATE:SECONDS,..." (messages per second; the last
phase may be long: stop the pacer with SIGTERM). Prompts are short (stories260K, max_tokens
1..4, greedy), ids PREFIX%07d. --marks FILE gets "PHASE_INDEX START_MS" lines as phases begin and
"end N" at exit; --ids FILE every id written.
"""
import argparse
import json
import os
import signal
import sys
import time

ap = argparse.ArgumentParser()
ap.add_argument("--prefix", default="B")
ap.add_argument("--phases", required=True)
ap.add_argument("--marks", required=True)
ap.add_argument("--ids", required=True)
a = ap.parse_args()
phases = [(float(r), float(s)) for r, s in (p.split(":") for p in a.phases.split(","))]
prefixes = ["Once upon a time, there was a little girl named Lily. She",
            "Tom and his dog went to the park.", "The sun was shining and", "Sue had a red ball."]
stop = False


def on_term(*_):
    global stop
    stop = True


signal.signal(signal.SIGTERM, on_term)
signal.signal(signal.SIGINT, on_term)
marks = open(a.marks, "w", buffering=1)
ids = open(a.ids, "w")
out = sys.stdout
n = 0
try:
    for k, (rate, secs) in enumerate(phases):
        start = time.time()
        marks.write(f"{k} {int(start * 1000)}\n")
        sent = 0
        while not stop:
            now = time.time()
            if now - start >= secs:
                break
            due = int((now - start) * rate)
            while sent < due:
                rid = f"{a.prefix}{n:07d}"
                out.write(rid + "\t" + json.dumps({"id": rid, "prompt": f"{prefixes[n % 4]} {n}",
                                                   "max_tokens": 1 + (n * 7) % 4,
                                                   "temperature": 0}) + "\n")
                ids.write(rid + "\n")
                n += 1
                sent += 1
            out.flush()
            time.sleep(0.01)
        if stop:
            break
except BrokenPipeError:
    pass
finally:
    ids.close()
    marks.write(f"end {n} {int(time.time() * 1000)}\n")
    marks.close()
    try:
        out.flush()
    except BrokenPipeError:
        os._exit(0)
