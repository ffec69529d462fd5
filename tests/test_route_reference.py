#!/usr/bin/env python3
"""The routing of README "Routing requests to partitions", written again from that description in
Python (XXH64 too, in pure Python), against the published test vectors tests/route/vectors.json
that tests/test_route.c checks the C router (producer/route.c) against: two implementations, one
set of vectors, so a producer in another language has a worked example to compare with.

Usage (ctest): test_route_reference.py [spillway-binary models-dir]   (both arguments are ignored)
Exit: 0 pass, 1 fail.
"""
import json
import math
import os
import sys

M64 = (1 << 64) - 1
P1, P2, P3, P4, P5 = (0x9E3779B185EBCA87, 0xC2B2AE3D27D4EB4F, 0x165667B19E3779F9,
                      0x85EBCA77C2B2AE63, 0x27D4EB2F165667C5)


def rotl(x, r):
    return ((x << r) | (x >> (64 - r))) & M64


def xxh64(data, seed=0):
    """XXH64 of bytes (the xxHash specification, little-endian lanes)."""
    n = len(data)
    i = 0

    def rnd(acc, lane):
        acc = (acc + lane * P2) & M64
        return (rotl(acc, 31) * P1) & M64

    if n >= 32:
        v = [(seed + P1 + P2) & M64, (seed + P2) & M64, seed & M64, (seed - P1) & M64]
        while i + 32 <= n:
            for j in range(4):
                v[j] = rnd(v[j], int.from_bytes(data[i + 8 * j:i + 8 * j + 8], "little"))
            i += 32
        h = (rotl(v[0], 1) + rotl(v[1], 7) + rotl(v[2], 12) + rotl(v[3], 18)) & M64
        for j in range(4):
            h ^= rnd(0, v[j])
            h = (h * P1 + P4) & M64
    else:
        h = (seed + P5) & M64
    h = (h + n) & M64
    while i + 8 <= n:
        h ^= rnd(0, int.from_bytes(data[i:i + 8], "little"))
        h = (rotl(h, 27) * P1 + P4) & M64
        i += 8
    if i + 4 <= n:
        h ^= (int.from_bytes(data[i:i + 4], "little") * P1) & M64
        h = (rotl(h, 23) * P2 + P3) & M64
        i += 4
    while i < n:
        h ^= (data[i] * P5) & M64
        h = (rotl(h, 11) * P1) & M64
        i += 1
    h ^= h >> 33
    h = (h * P2) & M64
    h ^= h >> 29
    h = (h * P3) & M64
    h ^= h >> 32
    return h


class Router:
    """Consistent hashing with bounded load over a count window."""

    def __init__(self, n, eps, window, vnodes):
        self.n, self.eps, self.window = n, eps, window
        pts = [(xxh64(("%d-%d" % (p, v)).encode()), p, v) for p in range(n) for v in range(vnodes)]
        self.ring = sorted(pts)
        self.hashes = [x[0] for x in self.ring]
        self.load = [0] * n
        self.win = []  # partitions of the recorded messages, oldest first

    def first(self, h):
        import bisect
        i = bisect.bisect_left(self.hashes, h)
        return 0 if i == len(self.ring) else i

    def home(self, h):
        return self.ring[self.first(h)][1]

    def pick(self, h):
        if len(self.win) == self.window:
            self.load[self.win.pop(0)] -= 1
        cap = math.ceil(((1.0 + self.eps) * (len(self.win) + 1)) / self.n)
        i = self.first(h)
        for step in range(len(self.ring)):
            p = self.ring[(i + step) % len(self.ring)][1]
            if self.load[p] < cap:
                break
        self.win.append(p)
        self.load[p] += 1
        return p


def request_key(req, prefix_bytes):
    """(source, hash) of a request: prefix_key, the canonical prompt's first bytes, or the id."""
    pk = req.get("prefix_key")
    if pk is not None:
        return "prefix_key", xxh64(pk.encode())
    if prefix_bytes > 0 and any(isinstance(req.get(f), t) for f, t in
                                (("prompt", str), ("messages", list), ("input_ids", list))):
        if isinstance(req.get("prompt"), str):
            b = req["prompt"].encode()
        elif isinstance(req.get("messages"), list):
            b = b""
            for m in req["messages"]:
                c = m.get("content")
                if isinstance(c, list):
                    c = "".join(p.get("text", "") for p in c if isinstance(p.get("text"), str))
                b += (m.get("role") or "").encode() + b"\x1f" + (c if isinstance(c, str) else "").encode() + b"\x1e"
        else:
            b = "".join("%d," % t for t in req["input_ids"]).encode()
        return "prompt", xxh64(b[:prefix_bytes])
    if isinstance(req.get("id"), str):
        return "id", xxh64(req["id"].encode())
    return "none", None


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    with open(os.path.join(here, "route", "vectors.json")) as f:
        vec = json.load(f)
    fails = 0

    def check(cond, msg):
        nonlocal fails
        if not cond:
            fails += 1
            print("FAIL: " + msg)

    for hv in vec["hashes"]:
        got = "%016x" % xxh64(hv["key"].encode())
        check(got == hv["xxh64"], "xxh64(%r) = %s, vectors say %s" % (hv["key"], got, hv["xxh64"]))
    for case in vec["homes"]:
        r = Router(case["partitions"], 0.0, 1, case["vnodes"])
        for key, part in case["keys"].items():
            got = r.home(xxh64(key.encode()))
            check(got == part, "home(%r) over %d partitions = %d, vectors say %d"
                  % (key, case["partitions"], got, part))
    for case in vec["picks"]:
        r = Router(case["partitions"], case["eps"], case["window"], case["vnodes"])
        got = [r.pick(xxh64(k.encode())) for k in case["keys"]]
        check(got == case["partitions_picked"], "picks %s: %s, vectors say %s"
              % (case["name"], got, case["partitions_picked"]))
    for case in vec["requests"]:
        src, h = request_key(case["request"], case["prefix_bytes"])
        check(src == case["source"], "%s: source %s, vectors say %s" % (case["name"], src, case["source"]))
        if h is not None:
            check("%016x" % h == case["hash"], "%s: hash %016x, vectors say %s" % (case["name"], h, case["hash"]))
    print("%d vector groups checked, %d failure(s)" % (4, fails))
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
