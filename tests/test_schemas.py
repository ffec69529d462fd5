#!/usr/bin/env python3
"""The JSON Schemas in schemas/ against themselves and against the request cases.

Usage (ctest): test_schemas.py [spillway-binary models-dir]   (both arguments are ignored)
Exit: 0 pass, 1 fail, 77 skip (no jsonschema module in any python3 found).

Checks:
  * every schema is a valid JSON Schema draft 2020-12 document;
  * every "examples" entry, at any level, validates against the (sub)schema it belongs to;
  * every `ok` case of tests/requests/ validates against request.schema.json;
  * every `error` case fails it (the bytes are not UTF-8 JSON, or the schema rejects them) unless
    its expect file says `schema=valid`: a limit the schema cannot state (worker settings such as
    max_prompt_bytes, a date that does not exist, float rounding); such a case must then really
    validate, so the annotation cannot go stale;
  * every tests/records/ case's expected record validates against its schema (result, chunk,
    usage, dlq: the dead letter's headers as one object), and there is a case of each kind;
  * the DLQ code enum equals the REQ_ERR_* codes of records/request.h (less out_of_memory,
    which is not a dead-letter reason), and the request schema's chat_template description names
    every built-in template of engine/chat.c.
"""
import json
import os
import re
import sys

import pycommon

jsonschema = pycommon.import_or_skip(
    "jsonschema", "SKIP: python jsonschema not available (Debian: python3-jsonschema)",
    needs=("Draft202012Validator",))
Draft202012Validator = jsonschema.Draft202012Validator

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
SCHEMAS = os.path.join(ROOT, "schemas")
CASES = os.path.join(HERE, "requests")
RECORD_CASES = os.path.join(HERE, "records")
RECORD_SCHEMAS = {"result": "result.schema.json", "chunk": "chunk.schema.json",
                  "usage": "usage.schema.json", "dlq": "dlq.schema.json"}

failures = 0
checks = 0


def check(cond, msg):
    global failures, checks
    checks += 1
    if not cond:
        failures += 1
        print("FAIL: " + msg)


def unescape(s):
    """The escapes of tests/test_requests.c: \\n \\r \\t \\\\ \\xHH; returns bytes."""
    out = bytearray()
    raw = s.encode("utf-8")
    i = 0
    while i < len(raw):
        c = raw[i]
        if c != 0x5C:
            out.append(c)
            i += 1
            continue
        e = chr(raw[i + 1])
        if e == "x":
            out.append(int(raw[i + 2:i + 4].decode(), 16))
            i += 4
            continue
        out.extend({"n": b"\n", "r": b"\r", "t": b"\t", "\\": b"\\"}[e])
        i += 2
    return bytes(out)


def generate(text):
    """The `generate` DSL of tests/requests/README.md."""
    out = bytearray()
    for line in text.split("\n"):
        if not line or line.startswith("#"):
            continue
        if line.startswith("text "):
            out += unescape(line[5:])
        elif line.startswith("repeat "):
            n, piece = line[7:].split(" ", 1)
            out += unescape(piece) * int(n)
        else:
            raise ValueError("bad generate line: " + line)
    return bytes(out)


def case_input(d):
    p = os.path.join(d, "input")
    if os.path.exists(p):
        with open(p, "rb") as f:
            return f.read()
    with open(os.path.join(d, "generate"), encoding="utf-8") as f:
        return generate(f.read())


def no_constants(name):
    raise ValueError("not JSON: " + name)


def load_json(data):
    """Strict JSON like the worker's: UTF-8 (a BOM is allowed), no NaN/Infinity. None if not."""
    # decode strictly here: json.loads(bytes) would let UTF-8-encoded surrogates through
    if data.startswith(b"\xef\xbb\xbf"):
        data = data[3:]
    try:
        return json.loads(data.decode("utf-8"), parse_constant=no_constants)
    except (ValueError, RecursionError):
        return None


def load_schema(name):
    with open(os.path.join(SCHEMAS, name), encoding="utf-8") as f:
        return json.load(f)


def examples_in(schema, path="#"):
    """(path, subschema, example) for every examples entry in schema, at any depth."""
    if isinstance(schema, dict):
        for ex in schema.get("examples", []):
            yield path, schema, ex
        for k, v in schema.items():
            if k in ("examples", "const", "enum", "default"):
                continue
            yield from examples_in(v, path + "/" + k)
    elif isinstance(schema, list):
        for i, v in enumerate(schema):
            yield from examples_in(v, "%s/%d" % (path, i))


def main():
    schemas = {}
    for name in sorted(os.listdir(SCHEMAS)):
        if not name.endswith(".schema.json"):
            continue
        schema = load_schema(name)
        schemas[name] = schema
        check(schema.get("$schema") == "https://json-schema.org/draft/2020-12/schema",
              name + ": $schema is not draft 2020-12")
        try:
            Draft202012Validator.check_schema(schema)
            check(True, "")
        except jsonschema.exceptions.SchemaError as e:
            check(False, "%s: not a valid 2020-12 schema: %s" % (name, e.message))
            continue
        n_ex = 0
        for path, sub, ex in examples_in(schema):
            n_ex += 1
            errs = list(Draft202012Validator(sub).iter_errors(ex))
            check(not errs, "%s %s: example %s does not validate: %s"
                  % (name, path, json.dumps(ex)[:80], errs[0].message if errs else ""))
        check(len(schema.get("examples", [])) > 0, name + ": no top-level examples")
        print("%s: valid 2020-12 schema, %d examples validated" % (name, n_ex))
    for want in ("request.schema.json", "result.schema.json", "dlq.schema.json"):
        check(want in schemas, "missing schema " + want)
    if "request.schema.json" not in schemas:
        return

    # DLQ codes == REQ_ERR_* codes
    with open(os.path.join(ROOT, "records", "request.h"), encoding="utf-8") as f:
        codes = set(re.findall(r'#define\s+REQ_ERR_\w+\s+"([a-z0-9_]+)"', f.read()))
    codes.discard("out_of_memory")
    dlq = schemas.get("dlq.schema.json", {})
    enum = {c["const"] for c in dlq["properties"]["__spillway.errors.code"]["oneOf"]}
    check(enum == codes, "dlq code enum %s != request.h codes %s"
          % (sorted(enum - codes), sorted(codes - enum)))

    # the chat_template description names every built-in template (engine/chat.c NAME_LIST)
    with open(os.path.join(ROOT, "engine", "chat.c"), encoding="utf-8") as f:
        m = re.search(r"NAME_LIST\[\] =((?:\s*\"[^\"]*\")+);", f.read())
    check(m is not None, "engine/chat.c: NAME_LIST not found")
    if m:
        names = "".join(re.findall(r'"([^"]*)"', m.group(1))).split(", ")
        desc = schemas["request.schema.json"]["properties"]["chat_template"]["description"]
        missing = [n for n in names if re.search(r"(^|[ ,:])%s[,. ]" % re.escape(n), desc) is None]
        check(not missing, "request.schema.json chat_template does not list " + ", ".join(missing))

    # the records module's cases (tests/records/README.md)
    kinds = {}
    for name in sorted(os.listdir(RECORD_CASES)):
        d = os.path.join(RECORD_CASES, name)
        if not os.path.exists(os.path.join(d, "input.json")):
            continue
        with open(os.path.join(d, "input.json"), encoding="utf-8") as f:
            kind = json.load(f).get("kind")
        check(kind in RECORD_SCHEMAS, "%s: unknown kind %r" % (name, kind))
        if kind not in RECORD_SCHEMAS:
            continue
        with open(os.path.join(d, "record"), "rb") as f:
            doc = load_json(f.read())
        check(doc is not None, name + ": record is not strict JSON")
        errs = list(Draft202012Validator(schemas[RECORD_SCHEMAS[kind]]).iter_errors(doc)) \
            if doc is not None else []
        check(not errs, "%s: record fails %s: %s" % (name, RECORD_SCHEMAS[kind],
                                                      errs[0].message[:200] if errs else ""))
        kinds[kind] = kinds.get(kind, 0) + 1
    check(set(kinds) == set(RECORD_SCHEMAS), "record cases lack kinds %s"
          % sorted(set(RECORD_SCHEMAS) - set(kinds)))
    print("record cases validated: %s" % ", ".join("%d %s" % (n, k) for k, n in sorted(kinds.items())))

    validator = Draft202012Validator(schemas["request.schema.json"])
    n_ok = n_err = n_annot = 0
    for name in sorted(os.listdir(CASES)):
        d = os.path.join(CASES, name)
        if not os.path.exists(os.path.join(d, "expect")):
            continue
        with open(os.path.join(d, "expect"), encoding="utf-8") as f:
            expect = f.read().split("\n")
        schema_valid = "schema=valid" in expect
        doc = load_json(case_input(d))
        errs = [] if doc is None else list(validator.iter_errors(doc))
        if expect[0] == "ok":
            n_ok += 1
            check(doc is not None, name + ": ok case is not strict JSON")
            check(not errs, "%s: ok case fails request.schema.json: %s"
                  % (name, errs[0].message[:200] if errs else ""))
        elif expect[0].startswith("error "):
            n_err += 1
            if schema_valid:
                n_annot += 1
                why = ("is not JSON" if doc is None else
                       "fails: " + errs[0].message[:200] if errs else "")
                check(doc is not None and not errs, "%s: marked schema=valid but %s" % (name, why))
            else:
                check(doc is None or errs, "%s: %s case passes request.schema.json (the schema "
                      "cannot express it? mark it schema=valid)" % (name, expect[0]))
        else:
            check(False, name + ": bad expect file")
    print("request cases: %d ok validated, %d errors rejected, %d errors the schema cannot "
          "express" % (n_ok, n_err - n_annot, n_annot))
    check(n_ok >= 20 and n_err >= 40, "too few request cases")


if __name__ == "__main__":
    main()
    print("%d checks, %d failed" % (checks, failures))
    sys.exit(1 if failures else 0)
