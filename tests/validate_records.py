#!/usr/bin/env python3
"""Checks the records a worker wrote against schemas/ (called by tests/broker_lib.sh's kcat
wrapper after every read of a topic; not a test itself).

Usage: validate_records.py TOPIC SEEN_FILE [PREFIX] < kcat -J envelopes (one JSON object a line)
Exit: 0 every record valid, 1 a record failed its schema (one line each on stdout), 77 no
jsonschema module.

A record is told by what it holds, whatever its topic is called: a __spillway.errors.code
header makes a dead letter (its headers are checked against dlq.schema.json); a JSON object
value with "best_effort" a stream chunk, with "start_ms", "end_ms" and "requests" a usage
record, with "finish_reason" and "timings" a result. Anything else (a request on an input or
deferral topic) is not spillway's output and is left alone, except on a topic named like an
output topic (results*, replies*, r-*, *.stream, usage*; *dlq*, d-*), where it must be one of
those. SEEN_FILE lists "topic partition offset" of the records already checked (appended to),
so a test that polls a topic checks each record once. PREFIX (a test's namespace, tests/broker_lib.sh's
NS) is taken off a topic's name before it is matched: "usage-123-prompts" is the input topic
"prompts" of the test "usage", not a usage topic.
"""
import json
import os
import re
import sys

import pycommon

jsonschema = pycommon.import_or_skip(
    "jsonschema", "validate_records: python jsonschema not available, records not checked",
    needs=("Draft202012Validator",))

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUTPUT_TOPIC = re.compile(r"^(results.*|replies.*|r-.*|.*\.stream|usage.*)$")
DLQ_TOPIC = re.compile(r"^(.*dlq.*|d-.*)$")


def validator(name, cache={}):
    if name not in cache:
        with open(os.path.join(ROOT, "schemas", name), encoding="utf-8") as f:
            cache[name] = jsonschema.Draft202012Validator(json.load(f))
    return cache[name]


def kind_of(headers, value):
    if "__spillway.errors.code" in headers:
        return "dlq"
    if isinstance(value, dict):
        if "best_effort" in value:
            return "chunk"
        if {"start_ms", "end_ms", "requests"} <= value.keys():
            return "usage"
        if {"finish_reason", "timings"} <= value.keys():
            return "result"
    return None


def main():
    topic, seen_file = sys.argv[1], sys.argv[2]
    prefix = sys.argv[3] if len(sys.argv) > 3 else ""
    seen = set()
    if os.path.exists(seen_file):
        with open(seen_file, encoding="utf-8") as f:
            seen = set(f.read().split("\n"))
    new_seen, failures, checked = [], 0, 0
    for line in sys.stdin:
        line = line.strip()
        if not line:
            continue
        try:
            m = json.loads(line)
        except ValueError:
            continue  # not an envelope (kcat's own messages)
        where = "%s %s %s" % (m.get("topic", topic), m.get("partition"), m.get("offset"))
        if where in seen:
            continue
        h = m.get("headers") or []
        headers = dict(zip(h[0::2], h[1::2]))
        try:
            value = json.loads(m.get("payload") or "null")
        except ValueError:
            value = None
        kind = kind_of(headers, value)
        name = m.get("topic", topic)
        if prefix and name.startswith(prefix):
            name = name[len(prefix):]
        if kind is None:
            if DLQ_TOPIC.match(name):
                print("%s: not a dead letter (no __spillway.errors.code header)" % where)
                failures += 1
            elif OUTPUT_TOPIC.match(name):
                print("%s: not a spillway record: %s" % (where, (m.get("payload") or "")[:200]))
                failures += 1
            new_seen.append(where)
            continue
        doc = headers if kind == "dlq" else value
        schema = {"dlq": "dlq.schema.json", "chunk": "chunk.schema.json",
                  "usage": "usage.schema.json", "result": "result.schema.json"}[kind]
        errs = list(validator(schema).iter_errors(doc))
        checked += 1
        if errs:
            failures += 1
            e = errs[0]
            print("%s: %s fails %s at %s: %s; record: %s" % (
                where, kind, schema, "/".join(str(p) for p in e.absolute_path) or "(top)",
                e.message[:200], json.dumps(doc)[:300]))
        new_seen.append(where)
    if new_seen:
        with open(seen_file, "a", encoding="utf-8") as f:
            f.write("\n".join(new_seen) + "\n")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
