#!/usr/bin/env python3
"""Q6_K and Q5_K dequantisation: spillway vs the independent numpy dequantiser
(tests/reference/gguf_ref.py) vs llama.cpp's gguf-py, on llama-quantize's files.

Usage (ctest): test_q56k_fixtures.py <path-to-spillway> <models-dir>
Exit: 0 pass, 1 fail, 77 skip (numpy or <models-dir>/quant-fixtures missing).

For every <models-dir>/quant-fixtures/*.gguf holding Q6_K or Q5_K tensors: `spillway mkmodel --from
FILE --dtype f32` writes every matrix dequantised by spillway (engine/dtype.h's
dtype_dequant_row); every Q6_K / Q5_K tensor of FILE must then be, bit for bit (the sign of zero
included), gguf_ref's float32 values, and the SHA-256 of those values must be the fixture's
.deq.json sha256_f32le (gguf-py's dequantiser at the llama.cpp commit the README names).
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

TYPES = (gguf_ref.DT_Q5_K, gguf_ref.DT_Q6_K)


def main(argv):
    if not pycommon.args_ok(argv):
        return 2
    spillway, fdir = argv[1], os.path.join(argv[2], "quant-fixtures")
    if not os.path.isdir(fdir):
        print("SKIP: %s not found" % fdir)
        return 77
    failures = []
    counts = {t: 0 for t in TYPES}
    files = 0
    with tempfile.TemporaryDirectory(prefix="spillway-q56k-") as tmp:
        for f in sorted(os.listdir(fdir)):
            if not f.endswith(".gguf"):
                continue
            path = os.path.join(fdir, f)
            g = gguf_ref.GGUF(path)
            mine = [n for n, t in g.tensors.items() if t.dtype in TYPES]
            if not mine:
                continue
            files += 1
            with open(os.path.join(fdir, f[:-len(".gguf")] + ".deq.json")) as jf:
                deq = {t["name"]: t for t in json.load(jf)["tensors"]}
            out = os.path.join(tmp, f[:-len(".gguf")] + ".f32.gguf")
            r = subprocess.run([spillway, "mkmodel", "--from", path, "--dtype", "f32", "-o", out],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               universal_newlines=True, timeout=300)
            if r.returncode != 0:
                failures.append("%s: mkmodel --from failed (%d): %s" % (f, r.returncode, r.stderr[-300:]))
                continue
            s = gguf_ref.GGUF(out)
            for name in mine:
                t = g.tensors[name]
                ref = g.tensor(name).astype("<f4")
                got = s.tensor(name).astype("<f4")
                if s.tensors[name].dtype != gguf_ref.DT_F32:
                    failures.append("%s %s: converted to dtype %d" % (f, name, s.tensors[name].dtype))
                    continue
                counts[t.dtype] += 1
                if ref.tobytes() != got.tobytes():
                    nd = int(np.sum(ref.view("<u4") != got.view("<u4")))
                    failures.append("%s %s (%s): spillway differs from the numpy reference at %d of "
                                    "%d values" % (f, name, gguf_ref.DTYPE_NAMES[t.dtype], nd, ref.size))
                h = hashlib.sha256(ref.tobytes()).hexdigest()
                if name not in deq or deq[name]["sha256_f32le"] != h:
                    failures.append("%s %s: numpy reference's SHA-256 is not the .deq.json one" % (f, name))
    print("%d files; Q5_K tensors %d, Q6_K tensors %d compared" %
          (files, counts[gguf_ref.DT_Q5_K], counts[gguf_ref.DT_Q6_K]))
    if not files or not all(counts.values()):
        failures.append("expected fixtures with both Q5_K and Q6_K tensors in %s" % fdir)
    return pycommon.verdict(failures)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
