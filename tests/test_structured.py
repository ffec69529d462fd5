#!/usr/bin/env python3
"""Structured output end to end: every case of tests/structured/ through `spillway generate -f`.

Usage (ctest): test_structured.py <spillway-binary> <models-dir>
Exit: 0 pass, 1 fail, 77 skip (no stories260K, no GPT-2 vocabulary, or no jsonschema module).

Cases (one folder each):
  schema.json              a JSON Schema: sent as response_format json_schema; the output must
                           parse and validate (jsonschema, draft 2020-12, formats checked)
  response_format.json     a response_format sent as it is (json_object: the output must be an
                           object)
  grammar.gbnf + match.re  an EBNF grammar sent as "grammar"; the output must fullmatch the
                           Python regex in match.re (BALANCED: brackets/parentheses balanced)
  unbounded                optional marker: the language has free text without a length bound
                           (free keys), so a result cut by max_tokens ("length") is accepted;
                           one that finishes must still check
  bad_*: schema.json or grammar.gbnf + expect   refused before generation; stderr must contain
                           the text of expect
Models: stories260K (SPM, 512 tokens) and a synthetic model with GPT-2's BPE vocabulary (50257
tokens, `spillway mkmodel --vocab-from`), each greedy and at temperature 1.0 (two seeds). Every
result must finish with "stop" (the grammar ended) and check.
"""
import json
import os
import re
import subprocess
import sys
import tempfile

import pycommon

jsonschema = pycommon.import_or_skip("jsonschema", "skip: no jsonschema module",
                                     needs=("Draft202012Validator",))
Draft202012Validator = jsonschema.Draft202012Validator

HERE = os.path.dirname(os.path.abspath(__file__))
CASES = os.path.join(HERE, "structured")
SETTINGS = [(0.0, 0), (1.0, 1), (1.0, 2)]


def balanced(s):
    depth = 0
    for ch in s:
        if ch in "([":
            depth += 1
        elif ch in ")]":
            depth -= 1
            if depth < 0:
                return False
    return depth == 0 and len(s) > 0


def load_cases():
    good, bad = [], []
    for name in sorted(os.listdir(CASES)):
        d = os.path.join(CASES, name)
        if not os.path.isdir(d):
            continue
        (bad if name.startswith("bad_") else good).append((name, d))
    return good, bad


def request_fields(d):
    if os.path.exists(os.path.join(d, "schema.json")):
        schema = json.load(open(os.path.join(d, "schema.json"), encoding="utf-8"))
        return {"response_format": {"type": "json_schema",
                                    "json_schema": {"name": "case", "schema": schema,
                                                    "strict": True}}}, ("schema", schema)
    if os.path.exists(os.path.join(d, "response_format.json")):
        rf = json.load(open(os.path.join(d, "response_format.json"), encoding="utf-8"))
        return {"response_format": rf}, ("object", None)
    g = open(os.path.join(d, "grammar.gbnf"), encoding="utf-8").read()
    rx = open(os.path.join(d, "match.re"), encoding="utf-8").read().rstrip("\n")
    return {"grammar": g}, ("regex", rx)


def check(kind, arg, text):
    if kind == "regex":
        if arg == "BALANCED":
            return balanced(text) and re.fullmatch(r"[\[\]0-9+*()-]+", text) is not None, \
                "unbalanced or stray characters"
        return re.fullmatch(arg, text) is not None, "does not match " + arg
    try:
        value = json.loads(text)
    except ValueError as e:
        return False, "not JSON: %s" % e
    if kind == "object":
        return isinstance(value, dict), "not an object"
    v = Draft202012Validator(arg, format_checker=Draft202012Validator.FORMAT_CHECKER)
    errs = list(v.iter_errors(value))
    return not errs, "; ".join(e.message for e in errs[:3])


def run_model(spillway, model, prompt, max_tokens, good, tmp):
    path = os.path.join(tmp, "requests.jsonl")
    expect = {}
    with open(path, "w", encoding="utf-8") as f:
        for name, d in good:
            fields, chk = request_fields(d)
            for temp, seed in SETTINGS:
                rid = "%s/t%g/s%d" % (name, temp, seed)
                line = {"id": rid, "prompt": prompt, "max_tokens": max_tokens,
                        "temperature": temp, "seed": seed}
                line.update(fields)
                f.write(json.dumps(line) + "\n")
                expect[rid] = chk
    p = subprocess.run([spillway, "generate", "-m", model, "-f", path, "--threads", "1"],
                       capture_output=True, timeout=1800)
    if p.returncode != 0:
        print("FAIL: generate exited %d: %s" % (p.returncode, p.stderr.decode()[-2000:]))
        return 1
    fails = n_length = 0
    seen = set()
    unbounded = {name for name, d in good if os.path.exists(os.path.join(d, "unbounded"))}
    for line in p.stdout.decode().splitlines():
        r = json.loads(line)
        rid = r["id"]
        seen.add(rid)
        kind, arg = expect[rid]
        ok, why = check(kind, arg, r["text"])
        if r["finish_reason"] != "stop":
            if rid.split("/")[0] in unbounded and r["finish_reason"] == "length":
                n_length += 1
                continue
            ok, why = False, "finish_reason %s" % r["finish_reason"]
        if not ok:
            fails += 1
            print("FAIL %s %s: %s\n  text: %r" % (os.path.basename(model), rid, why,
                                                 r["text"][:400]))
    missing = set(expect) - seen
    for rid in sorted(missing):
        print("FAIL %s %s: no result" % (os.path.basename(model), rid))
    print("%s: %d results, %d failed, %d cut by max_tokens in cases marked unbounded" %
          (os.path.basename(model), len(seen), fails + len(missing), n_length))
    return fails + len(missing)


def main():
    if len(sys.argv) < 3:
        print("usage: test_structured.py SPILLWAY MODELS_DIR")
        return 2
    spillway, models = sys.argv[1], sys.argv[2]
    stories = os.path.join(models, "stories260K.gguf")
    gpt2 = os.path.join(models, "tokenizer-vectors", "ggml-vocab-gpt-2.gguf")
    if not os.path.exists(stories) or not os.path.exists(gpt2):
        print("skip: needs %s and %s" % (stories, gpt2))
        return 77
    good, bad = load_cases()
    fails = 0
    bounded = [g for g in good if not os.path.exists(os.path.join(g[1], "unbounded"))]
    if len(bounded) < 40:
        print("FAIL: only %d cases" % len(good))
        fails += 1
    # malformed schemas and grammars: refused with the reason
    for name, d in bad:
        want = open(os.path.join(d, "expect"), encoding="utf-8").read().strip()
        sch = os.path.join(d, "schema.json")
        flag = ["--json-schema", sch] if os.path.exists(sch) else \
            ["--grammar", os.path.join(d, "grammar.gbnf")]
        p = subprocess.run([spillway, "generate", "-m", stories, "-p", "x", "-n", "4"] + flag,
                           capture_output=True, timeout=60)
        err = p.stderr.decode()
        if p.returncode == 0 or want not in err:
            fails += 1
            print("FAIL %s: exit %d, stderr %r does not contain %r" % (name, p.returncode,
                                                                       err.strip(), want))
    with tempfile.TemporaryDirectory() as tmp:
        bpe = os.path.join(tmp, "bpe.gguf")
        p = subprocess.run([spillway, "mkmodel", "-o", bpe, "--preset", "tiny", "--vocab-from",
                            gpt2, "--dim", "64", "--layers", "2", "--heads", "4", "--kv-heads",
                            "4", "--ffn", "128", "--ctx", "1024"], capture_output=True)
        if p.returncode != 0:
            print("FAIL: mkmodel: %s" % p.stderr.decode())
            return 1
        fails += run_model(spillway, stories, "", 480, good, tmp)
        fails += run_model(spillway, bpe, "Data:", 900, good, tmp)
    print("%d failures" % fails)
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
