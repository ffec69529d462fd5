#!/usr/bin/env bash
# Streamed partial results against a real Kafka broker, with an exactly-once worker (chunks are
# best effort, outside the transactions; the final results keep their guarantee):
#   - requests with "stream": true on stories260K (greedy, 100 tokens; two with a stop string
#     that truncates the text; one sampled hot, whose text has byte-fallback tokens and U+FFFD)
#     publish chunks on stream.topic every stream.every_tokens (3) tokens;
#   - per request: seq 0..k without a gap, every chunk best_effort, only the last final (with
#     the result's finish_reason), n_tokens never falls and ends at completion_tokens, and the
#     deltas concatenated in seq order equal the final result's text byte for byte (a stop
#     string's bytes never reach a chunk); the long ones really came in many chunks;
#   - a request without "stream" gets no chunk;
#   - /metrics: every chunk delivered, none failed (a chunk cut inside a UTF-8 character could
#     not be serialised and would count as failed).
# Arguments (from ctest): the spillway binary and the models folder.
set -euo pipefail
# shellcheck source=tests/broker_lib.sh
. "$(dirname "$0")/broker_lib.sh"
bt_init stream "$1" "$2"

fail() { echo "FAIL: $*"; [ -f "$WORK/worker.log" ] && tail -20 "$WORK/worker.log"; exit 1; }

bt_broker
echo "broker at $BOOTSTRAP"
for t in prompts:2 results:2 prompts.dlq:1 results.stream:3; do
  bt_topic "$NS${t%%:*}" "${t##*:}"
done
PORT=$(bt_free_port)

python3 - "$WORK" <<'PY'
import json, sys
work = sys.argv[1]
base = {"prompt": "Once upon a time", "max_tokens": 100, "temperature": 0}
reqs = [dict(base, id="s-plain", stream=True),
        dict(base, id="s-stop1", stream=True, stop=["didn't know"]),
        dict(base, id="s-stop2", stream=True, stop=["to the park"], correlation_id="c-9"),
        dict(base, id="s-hot", stream=True, temperature=2.5, seed=11),
        dict(base, id="no-stream", max_tokens=20)]
with open(f"{work}/in.jsonl", "w") as f, open(f"{work}/ids.txt", "w") as ids:
    for r in reqs:
        f.write(json.dumps(r) + "\n")
        ids.write(r["id"] + "\n")
PY

"$SPILLWAY" worker -b "$BOOTSTRAP" -t "${NS}prompts" -o "${NS}results" -d "${NS}prompts.dlq" -g "${NS}spw-stream" -m "$MODEL" \
  --exactly-once -s worker.id=stream-w1 -s stream.topic="${NS}results.stream" -s stream.every_tokens=3 \
  -s stream.every_ms=0 -s threads=1 -s kv.mem_mb=16 -s commit.interval.ms=100 \
  -s metrics.port="$PORT" -s metrics.bind=127.0.0.1 -X consumer.session.timeout.ms=6000 \
  >"$WORK/worker.log" 2>&1 &
WPID=$!
"$SPILLWAY" produce -b "$BOOTSTRAP" -t "${NS}prompts" --key-prefix 0 "$WORK/in.jsonl"
"$SPILLWAY" collect -b "$BOOTSTRAP" -t "${NS}results" --ids "$WORK/ids.txt" -o "$WORK/out.jsonl" \
  --timeout 60 || fail "not every result came back"
# the chunks of a request are produced before its result, by a producer that lingers 5 ms
sleep 1
kcat -b "$BOOTSTRAP" -C -t "${NS}results.stream" -e -q -o beginning -f '%k|%h|%s\n' > "$WORK/chunks.txt"
python3 - "$PORT" > "$WORK/metrics.txt" <<'PY' || fail "scrape"
import sys, urllib.request
print(urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}/metrics", timeout=5).read().decode())
PY

python3 - "$WORK" <<'PY' || fail "stream checks"
import json, re, sys
from collections import defaultdict
work = sys.argv[1]
results = {r["id"]: r for r in (json.loads(l) for l in open(f"{work}/out.jsonl"))}
chunks = defaultdict(list)
n_lines = 0
for line in open(f"{work}/chunks.txt", encoding="utf-8"):
    key, hdrs, val = line.rstrip("\n").split("|", 2)
    c = json.loads(val)
    chunks[c["id"]].append(c)
    n_lines += 1
    assert key == c.get("correlation_id", c["id"]), (key, c)
    if "correlation_id" in c:
        assert f"correlation_id={c['correlation_id']}" in hdrs, hdrs
assert "no-stream" not in chunks, "a request without stream got chunks"
for rid in ("s-plain", "s-stop1", "s-stop2", "s-hot"):
    res, cs = results[rid], chunks[rid]
    assert cs, f"{rid}: no chunk"
    cs.sort(key=lambda c: c["seq"])
    assert [c["seq"] for c in cs] == list(range(len(cs))), f"{rid}: seq {[c['seq'] for c in cs]}"
    assert all(c["best_effort"] is True for c in cs), rid
    assert [c["final"] for c in cs] == [False] * (len(cs) - 1) + [True], f"{rid}: final flags"
    assert cs[-1]["finish_reason"] == res["finish_reason"], (rid, cs[-1], res["finish_reason"])
    toks = [c["n_tokens"] for c in cs]
    assert toks == sorted(toks) and toks[-1] == res["usage"]["completion_tokens"], (rid, toks)
    text = "".join(c["text"] for c in cs)
    assert text == res["text"], f"{rid}: chunks {text!r}\n != result {res['text']!r}"
    print(f"{rid}: {len(cs)} chunks, {len(text.encode())} bytes, {toks[-1]} tokens, "
          f"finish {res['finish_reason']}: concatenation == result text")
assert results["s-stop1"]["finish_reason"] == "stop" and "didn't know" not in results["s-stop1"]["text"]
assert results["s-stop2"]["finish_reason"] == "stop" and results["s-stop2"]["text"].endswith("go ")
assert results["s-plain"]["finish_reason"] == "length" and len(chunks["s-plain"]) >= 20
assert chunks["s-stop2"][0]["correlation_id"] == "c-9"
m = open(f"{work}/metrics.txt").read()
def val(outcome):
    x = re.search(r'^spillway:stream_chunks_total\{outcome="%s"\} (\S+)$' % outcome, m, re.M)
    assert x, f"no stream_chunks_total{{outcome={outcome}}} in /metrics"
    return float(x.group(1))
assert val("failed") == 0, f"{val('failed')} chunks failed"
assert val("delivered") == n_lines, f"delivered {val('delivered')} != {n_lines} chunks on the topic"
print(f"{n_lines} chunks, all delivered")
PY

kill -TERM "$WPID"; wait "$WPID" || fail "worker exit status after SIGTERM"
WPID=
echo "PASS"
