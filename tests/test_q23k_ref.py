#!/usr/bin/env python3
"""Q2_K and Q3_K dequantisation: spillway vs an independent numpy reference, on llama.cpp's files.

Usage (ctest): test_q23k_ref.py <path-to-spillway> <models-dir>
Exit: 0 pass, 1 fail, 77 skip (numpy or the quant-fixtures missing).

For every Q2_K and Q3_K tensor of <models-dir>/quant-fixtures/*.gguf (files written by
llama-quantize; see that folder's README.md):
  * tests/reference/q23k_ref.py (our numpy dequantiser, written from the format description)
    must give float32 values whose SHA-256 equals the file's .deq.json hash (gguf-py's
    dequantisation, itself checked against ggml's C code there);
  * spillway's dequantisation (engine/dtype.h: `spillway mkmodel --from FILE --dtype f32` widens
    every computable matrix with dtype_dequant_row and stores the float32 values) must be
    bit-identical to the numpy reference, tensor by tensor (-0.0 included).
"""
import glob
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
import q23k_ref  # noqa: E402

TYPES = {q23k_ref.DT_Q2_K: "Q2_K", q23k_ref.DT_Q3_K: "Q3_K"}


def ref_values(g, t):
    n = int(np.prod(t.ne))
    start = g.data_start + t.offset
    raw = g.buf[start:start + n // q23k_ref.QK_K * q23k_ref.BLOCK_BYTES[t.dtype]]
    return q23k_ref.dequant(t.dtype, raw, n).astype("<f4")


def main(argv):
    if not pycommon.args_ok(argv):
        return 2
    spillway, models_dir = argv[1], argv[2]
    files = sorted(glob.glob(os.path.join(models_dir, "quant-fixtures", "*.gguf")))
    files = [f for f in files
             if any(t.dtype in TYPES for t in gguf_ref.GGUF(f).tensors.values())]
    if not files:
        print("SKIP: no quant-fixtures with Q2_K or Q3_K tensors under %s" % models_dir)
        return 77
    failures = []
    counts = {"Q2_K": 0, "Q3_K": 0}
    with tempfile.TemporaryDirectory(prefix="spillway-q23k-") as tmp:
        for path in files:
            base = os.path.basename(path)
            g = gguf_ref.GGUF(path)
            deq_path = path[:-len(".gguf")] + ".deq.json"
            hashes = {}
            if os.path.exists(deq_path):
                with open(deq_path) as f:
                    hashes = {t["name"]: t["sha256_f32le"] for t in json.load(f)["tensors"]}
            else:
                failures.append("%s: no %s" % (base, os.path.basename(deq_path)))
            out = os.path.join(tmp, base)
            r = subprocess.run([spillway, "mkmodel", "--from", path, "--dtype", "f32", "-o", out],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               timeout=300)
            conv = None
            if r.returncode != 0:
                failures.append("%s: spillway mkmodel --from ... --dtype f32 failed (%d): %s" %
                                (base, r.returncode, r.stderr.strip()[-300:]))
            else:
                conv = gguf_ref.GGUF(out)
            for name, t in g.tensors.items():
                if t.dtype not in TYPES:
                    continue
                tn = TYPES[t.dtype]
                counts[tn] += 1
                ref = ref_values(g, t)
                h = hashlib.sha256(ref.tobytes()).hexdigest()
                if name in hashes and h != hashes[name]:
                    failures.append("%s %s (%s): numpy reference SHA-256 %s != .deq.json %s" %
                                    (base, name, tn, h[:16], hashes[name][:16]))
                if conv is None:
                    continue
                ct = conv.tensors.get(name)
                if ct is None or ct.dtype != gguf_ref.DT_F32:
                    failures.append("%s %s: not F32 in spillway's conversion" % (base, name))
                    continue
                got = np.frombuffer(ct.raw, dtype="<f4")
                diff = got.view("<u4") != ref.reshape(-1).view("<u4")
                if got.size != ref.size or diff.any():
                    idx = int(np.argmax(diff)) if got.size == ref.size else -1
                    failures.append("%s %s (%s): spillway differs from the reference at %d of %d "
                                    "values (first at %d)" %
                                    (base, name, tn, int(diff.sum()) if got.size == ref.size else -1,
                                     ref.size, idx))
    print("checked %d Q2_K and %d Q3_K tensors in %d files" %
          (counts["Q2_K"], counts["Q3_K"], len(files)))
    return pycommon.verdict(failures)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
