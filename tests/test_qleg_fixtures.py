#!/usr/bin/env python3
"""Q4_1, Q5_0, Q5_1, IQ4_NL and IQ4_XS dequantisation against an independent reference, on the
llama.cpp-quantised fixture files (<models-dir>/quant-fixtures, README.md there).

Usage (ctest): test_qleg_fixtures.py <path-to-spillway> <models-dir>
Exit: 0 pass, 1 fail, 77 skip (numpy or the fixtures missing).

For every tensor of those types in pure-Q4_1, pure-Q5_0, pure-Q5_1, pure-IQ4_NL, pure-IQ4_XS and
mix-IQ4_XS:
  * the reference dequantiser (tests/reference/qleg_ref.py, numpy, written from the block layouts)
    gives float32 values whose SHA-256 equals llama.cpp's (the fixture's .deq.json);
  * spillway's own dequantisation -- `spillway mkmodel --from FILE --dtype f32`, which writes every
    matrix it can compute as dtype_dequant_row's F32 values -- is bit-identical to the reference.
"""
import hashlib
import json
import os
import subprocess
import sys
import tempfile

import pycommon

np = pycommon.numpy_or_skip()
pycommon.reference_path()
import gguf_ref  # noqa: E402
import qleg_ref  # noqa: E402

FILES = ["pure-Q4_1", "pure-Q5_0", "pure-Q5_1", "pure-IQ4_NL", "pure-IQ4_XS", "mix-IQ4_XS"]


def main(argv):
    if not pycommon.args_ok(argv):
        return 2
    spillway, models_dir = argv[1], argv[2]
    fx = os.path.join(models_dir, "quant-fixtures")
    paths = [os.path.join(fx, f + ".gguf") for f in FILES]
    missing = [p for p in paths if not os.path.exists(p) or not os.path.exists(p[:-5] + ".deq.json")]
    if missing:
        print("SKIP: fixtures missing: %s" % ", ".join(missing))
        return 77
    failures = []
    seen = {}
    with tempfile.TemporaryDirectory(prefix="spillway-qleg-") as tmp:
        for path in paths:
            base = os.path.basename(path)[:-5]
            g = gguf_ref.GGUF(path)
            deq = {t["name"]: t for t in json.load(open(path[:-5] + ".deq.json"))["tensors"]}
            out = os.path.join(tmp, base + "-f32.gguf")
            r = subprocess.run([spillway, "mkmodel", "--from", path, "--dtype", "f32", "-o", out],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               universal_newlines=True, timeout=300)
            if r.returncode != 0:
                failures.append("%s: spillway mkmodel --from failed (%d): %s" %
                                (base, r.returncode, r.stderr.strip()[-300:]))
                continue
            conv = gguf_ref.GGUF(out)
            n_mine = 0
            for name, t in g.tensors.items():
                if t.dtype not in qleg_ref.BLOCKS:
                    continue
                n_mine += 1
                n = int(np.prod(t.ne))
                ref = qleg_ref.dequant(t.dtype, t.raw, n)
                h = hashlib.sha256(ref.astype("<f4").tobytes()).hexdigest()
                if name not in deq or h != deq[name]["sha256_f32le"]:
                    failures.append("%s %s (%s): reference SHA-256 %s != llama.cpp's %s" %
                                    (base, name, qleg_ref.NAMES[t.dtype], h[:16],
                                     deq.get(name, {}).get("sha256_f32le", "?")[:16]))
                ct = conv.tensors.get(name)
                if ct is None or ct.dtype != gguf_ref.DT_F32 or ct.ne != t.ne:
                    failures.append("%s %s: not written as F32 of the same shape" % (base, name))
                    continue
                eng = np.frombuffer(ct.raw, dtype="<f4", count=n)
                diff = int(np.sum(eng.view("<u4") != ref.astype("<f4").view("<u4")))
                if diff:
                    failures.append("%s %s (%s): %d of %d values differ from the reference" %
                                    (base, name, qleg_ref.NAMES[t.dtype], diff, n))
                seen[qleg_ref.NAMES[t.dtype]] = seen.get(qleg_ref.NAMES[t.dtype], 0) + 1
            if n_mine == 0:
                failures.append("%s: no tensor of the types under test" % base)
    print("tensors checked per type: %s" % ", ".join("%s %d" % kv for kv in sorted(seen.items())))
    if len(seen) != len(qleg_ref.NAMES):
        failures.append("types not covered: %s" % sorted(set(qleg_ref.NAMES.values()) - set(seen)))
    return pycommon.verdict(failures)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
