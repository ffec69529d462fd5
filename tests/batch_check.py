#!/usr/bin/env python3
"""tests/batch_check.py INPUT OUTPUT ERRORS [REFERENCE_OUTPUT REFERENCE_ERRORS]: checks the files
`spillway batch` wrote for INPUT (made by tests/batch_make_input.py, with INPUT.expect):
  * every line of both files validates against schemas/batch_output.schema.json;
  * the custom_ids over both files are exactly the input's, each once;
  * the lines INPUT.expect calls ok are in OUTPUT with status 200 and the object of their url
    (chat.completion / text_completion), n choices indexed 0..n-1, completion_tokens within
    n * max tokens, usage.total_tokens
    = prompt + completion; chat logprobs asked -> logprobs.content with top_logprobs of the
    asked size; completions logprobs K -> K alternatives per token;
  * the bad lines are in ERRORS, the expired ones with error.code batch_expired and response
    null, the others with a 4xx response whose error names a code;
  * with a reference pair: the same (custom_id, file, status, error code) set as the reference.
Exit 0 pass, 1 fail, 77 when python3-jsonschema is missing."""
import json
import os
import sys

import pycommon

Draft202012Validator = pycommon.import_or_skip(
    "jsonschema", "SKIP: python jsonschema not available (Debian: python3-jsonschema)",
    needs=("Draft202012Validator",)).Draft202012Validator

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
schema = json.load(open(os.path.join(ROOT, "schemas", "batch_output.schema.json")))
V = Draft202012Validator(schema)


def fail(msg):
    print("FAIL:", msg)
    sys.exit(1)


def lines(path):
    out = []
    with open(path, "rb") as f:
        data = f.read()
    if data and not data.endswith(b"\n"):
        fail(f"{path}: last line has no newline")
    for k, raw in enumerate(data.splitlines(), 1):
        try:
            o = json.loads(raw)
        except ValueError as e:
            fail(f"{path}:{k}: not JSON: {e}")
        errs = sorted(V.iter_errors(o), key=str)
        if errs:
            fail(f"{path}:{k}: {errs[0].message} at {list(errs[0].absolute_path)}")
        out.append(o)
    return out


def summary(out, err):
    return {(o["custom_id"], "out" if o in out else "err",
             o["response"]["status_code"] if o["response"] else None,
             (o["error"] or {}).get("code") or
             (o["response"] and o["response"]["body"].get("error", {}).get("code")))
            for o in out + err}


inp = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
expect = dict(l.split(" ", 1) for l in open(sys.argv[1] + ".expect").read().splitlines())
out, err = lines(sys.argv[2]), lines(sys.argv[3])
ids = [o["custom_id"] for o in out + err]
if len(ids) != len(set(ids)):
    dup = sorted({i for i in ids if ids.count(i) > 1})
    fail(f"custom_ids written more than once: {dup[:10]}")
if set(ids) != {l["custom_id"] for l in inp}:
    missing = {l["custom_id"] for l in inp} - set(ids)
    fail(f"custom_ids differ from the input's: missing {sorted(missing)[:10]}, "
         f"extra {sorted(set(ids) - {l['custom_id'] for l in inp})[:10]}")
by_id = {l["custom_id"]: l for l in inp}
for o in out:
    cid = o["custom_id"]
    if expect[cid] != "ok":
        fail(f"{cid} ({expect[cid]}) is in the output file")
    line = by_id[cid]
    body, req = o["response"]["body"], line["body"]
    if o["response"]["status_code"] != 200:
        fail(f"{cid}: status {o['response']['status_code']}")
    want = "chat.completion" if line["url"] == "/v1/chat/completions" else "text_completion"
    if body["object"] != want:
        fail(f"{cid}: object {body['object']}, expected {want}")
    u = body["usage"]
    mt = req.get("max_completion_tokens", req.get("max_tokens"))
    if u["total_tokens"] != u["prompt_tokens"] + u["completion_tokens"] or \
            u["completion_tokens"] > mt * req.get("n", 1):
        fail(f"{cid}: usage {u}")
    if len(body["choices"]) != req.get("n", 1) or \
            [c["index"] for c in body["choices"]] != list(range(req.get("n", 1))):
        fail(f"{cid}: {len(body['choices'])} choice(s) for n = {req.get('n', 1)}")
    lps = [c["logprobs"] for c in body["choices"]]
    if want == "chat.completion":
        if req.get("logprobs"):
            if any(lp is None for lp in lps) or \
                    sum(len(lp["content"]) for lp in lps) != u["completion_tokens"]:
                fail(f"{cid}: chat logprobs {lps}")
            if any(len(t["top_logprobs"]) != req.get("top_logprobs", 0)
                   for lp in lps for t in lp["content"]):
                fail(f"{cid}: top_logprobs sizes differ from {req.get('top_logprobs')}")
        elif any(lp is not None for lp in lps):
            fail(f"{cid}: logprobs not asked but present")
    else:
        if req.get("logprobs"):
            if any(lp is None for lp in lps) or \
                    sum(len(lp["tokens"]) for lp in lps) != u["completion_tokens"] or \
                    any(len(t) > req["logprobs"] for lp in lps for t in lp["top_logprobs"]):
                fail(f"{cid}: completion logprobs {lps}")
            for c in body["choices"]:
                if "".join(c["logprobs"]["tokens"]) != c["text"] and c["finish_reason"] == "length":
                    fail(f"{cid}: logprob tokens do not spell the text")
        elif any(lp is not None for lp in lps):
            fail(f"{cid}: logprobs not asked but present")
for o in err:
    cid = o["custom_id"]
    if not expect[cid].startswith("error"):
        fail(f"{cid} is an ok line but in the error file: {json.dumps(o)[:300]}")
    kind = expect[cid].split(" ", 1)[1]
    if kind == "expired":
        if o["response"] is not None or o["error"]["code"] != "batch_expired":
            fail(f"{cid}: expired line {o}")
    elif o["response"] is None or not 400 <= o["response"]["status_code"] < 500:
        fail(f"{cid} ({kind}): {o}")
if len(sys.argv) > 5:
    ref = summary(lines(sys.argv[4]), lines(sys.argv[5]))
    got = summary(out, err)
    if ref != got:
        fail(f"differs from the reference run: {sorted(ref ^ got)[:6]}")
print(f"ok: {len(out)} output line(s), {len(err)} error line(s)")
