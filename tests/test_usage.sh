#!/usr/bin/env bash
# Per-tenant accounting against a real Kafka broker (at-least-once worker, stories260K):
#   - requests of 4 tenants (one via Kafka headers) and none, in classes interactive / batch /
#     extra / default / none, in two bursts 1.5 s apart; usage.max_tenants 2, usage.max_classes 2;
#   - results carry their tenant and class and usage.compute_ms;
#   - /metrics: spillway:tenant_*_total{tenant,class} equal the per-request usage of the results
#     summed by label (2 named tenants, the others under _other, none under _none; classes
#     likewise, none = default), compute seconds within rounding;
#   - usage records on usage.topic (usage.interval.ms 700): at least two periods, and after
#     SIGTERM (which flushes the last period) their sums per (tenant, class) equal the counters.
# Arguments (from ctest): the spillway binary and the models folder.
set -euo pipefail
# shellcheck source=tests/broker_lib.sh
. "$(dirname "$0")/broker_lib.sh"
bt_init usage "$1" "$2"

fail() { echo "FAIL: $*"; [ -f "$WORK/worker.log" ] && tail -20 "$WORK/worker.log"; exit 1; }

bt_broker
echo "broker at $BOOTSTRAP"
for t in prompts:2 results:2 prompts.dlq:1 usage:2; do
  bt_topic "$NS${t%%:*}" "${t##*:}"
done
PORT=$(bt_free_port)

python3 - "$WORK" <<'PY'
import json, sys
work = sys.argv[1]
tenants = ["acme", "globex", "initech", "umbrella", None]
classes = ["interactive", "batch", "extra", "default", None]
prompts = ["Once upon a time", "Tom and his dog went to the park.", "The sun was shining and"]
ids = []
for burst in (1, 2):
    with open(f"{work}/in{burst}.jsonl", "w") as f:
        for i in range(20):
            n = len(ids)
            r = {"id": f"u{n:03d}", "prompt": prompts[n % 3], "max_tokens": 4 + n % 13,
                 "temperature": 0}
            if tenants[n % 5]: r["tenant"] = tenants[n % 5]
            if classes[(n // 5) % 5]: r["class"] = classes[(n // 5) % 5]
            f.write(json.dumps(r) + "\n")
            ids.append(r["id"])
ids.append("hdr-1")
open(f"{work}/ids.txt", "w").write("\n".join(ids) + "\n")
PY

"$SPILLWAY" worker -b "$BOOTSTRAP" -t "${NS}prompts" -o "${NS}results" -d "${NS}prompts.dlq" -g "${NS}spw-usage" -m "$MODEL" \
  -s worker.id=usage-w1 -s usage.topic="${NS}usage" -s usage.interval.ms=700 -s usage.max_tenants=2 \
  -s usage.max_classes=2 -s threads=1 -s kv.mem_mb=16 -s commit.interval.ms=100 \
  -s classes=interactive:priority=100,batch,extra,default -s class.default=default \
  -s metrics.port="$PORT" -s metrics.bind=127.0.0.1 -X consumer.session.timeout.ms=6000 \
  >"$WORK/worker.log" 2>&1 &
WPID=$!
"$SPILLWAY" produce -b "$BOOTSTRAP" -t "${NS}prompts" --key-prefix 0 "$WORK/in1.jsonl"
echo '{"id": "hdr-1", "prompt": "Sue had a red ball.", "max_tokens": 9, "temperature": 0}' |
  kcat -b "$BOOTSTRAP" -P -t "${NS}prompts" -H tenant=globex -H class=batch
sleep 1.5
"$SPILLWAY" produce -b "$BOOTSTRAP" -t "${NS}prompts" --key-prefix 0 "$WORK/in2.jsonl"
"$SPILLWAY" collect -b "$BOOTSTRAP" -t "${NS}results" --ids "$WORK/ids.txt" -o "$WORK/out.jsonl" \
  --timeout 60 || fail "not every result came back"
# results are counted when acknowledged: wait until the counters cover all of them
for _ in $(seq 1 50); do
  python3 - "$PORT" > "$WORK/metrics.txt" <<'PY' || true
import sys, urllib.request
print(urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}/metrics", timeout=5).read().decode())
PY
  n=$(awk '/^spillway:tenant_requests_total/ {s += $2} END {print s + 0}' "$WORK/metrics.txt")
  [ "$n" -ge 41 ] && break
  sleep 0.2
done
kill -TERM "$WPID"; wait "$WPID" || fail "worker exit status after SIGTERM"
WPID=
kcat -b "$BOOTSTRAP" -C -t "${NS}usage" -e -q -o beginning -f '%k|%s\n' > "$WORK/usage.txt"

python3 - "$WORK" <<'PY' || fail "usage checks"
import json, re, sys
from collections import defaultdict
work = sys.argv[1]
res = [json.loads(l) for l in open(f"{work}/out.jsonl")]
assert len(res) == 41, len(res)
m = open(f"{work}/metrics.txt").read()
fams = {"requests": "tenant_requests_total", "prompt": "tenant_prompt_tokens_total",
        "cached": "tenant_cached_tokens_total", "completion": "tenant_completion_tokens_total",
        "compute": "tenant_compute_seconds_total"}
counters = defaultdict(lambda: defaultdict(float))
for k, fam in fams.items():
    for t, c, v in re.findall(r'^spillway:%s\{tenant="([^"]*)",class="([^"]*)"\} (\S+)$' % fam, m, re.M):
        counters[(t, c)][k] = float(v)
tenants = {t for t, _ in counters} - {"_other", "_none"}
classes = {c for _, c in counters} - {"_other", "default"}
assert len(tenants) == 2 and tenants <= {"acme", "globex", "initech", "umbrella"}, tenants
assert len(classes) == 2 and classes <= {"interactive", "batch", "extra"}, classes
assert any(t == "_other" for t, _ in counters) and any(t == "_none" for t, _ in counters)
want = defaultdict(lambda: defaultdict(float))
for r in res:
    rid = r["id"]
    u = r["usage"]
    assert u["compute_ms"] > 0, r
    t = r.get("tenant")
    c = r.get("class")
    if rid == "hdr-1":
        assert t == "globex" and c == "batch", r
    lt = "_none" if t is None else t if t in tenants else "_other"
    lc = "default" if c in (None, "default") else c if c in classes else "_other"
    w = want[(lt, lc)]
    w["requests"] += 1
    w["prompt"] += u["prompt_tokens"]
    w["cached"] += u["cached_tokens"]
    w["completion"] += u["completion_tokens"]
    w["compute"] += u["compute_ms"] / 1000
assert set(want) == set(counters), (sorted(want), sorted(counters))
for key in want:
    for k in fams:
        a, b = want[key][k], counters[key][k]
        ok = abs(a - b) <= 1e-4 + 1e-5 * b if k == "compute" else a == b
        assert ok, f"{key} {k}: results sum {a} != /metrics {b}"
print(f"{len(want)} (tenant, class) series equal the results' usage, e.g. "
      f"{sorted(want)[0]}: {dict(want[sorted(want)[0]])}")
recs = defaultdict(lambda: defaultdict(float))
periods = set()
for line in open(f"{work}/usage.txt"):
    key, val = line.rstrip("\n").split("|", 1)
    u = json.loads(val)
    assert key == u["tenant"] and u["worker"] == "usage-w1", line
    assert u["start_ms"] < u["end_ms"], u
    periods.add((u["start_ms"], u["end_ms"]))
    for k, f in (("requests", "requests"), ("prompt", "prompt_tokens"), ("cached", "cached_tokens"),
                 ("completion", "completion_tokens")):
        recs[(u["tenant"], u["class"])][k] += u[f]
    recs[(u["tenant"], u["class"])]["compute"] += u["compute_ms"] / 1000
assert len(periods) >= 2, f"usage records of {len(periods)} period(s)"
assert set(recs) == set(counters), (sorted(recs), sorted(counters))
for key in recs:
    for k in fams:
        a, b = recs[key][k], counters[key][k]
        ok = abs(a - b) <= 1e-6 + 1e-9 * b if k == "compute" else a == b
        assert ok, f"usage records {key} {k}: {a} != /metrics {b}"
print(f"usage records: {len(periods)} periods, sums equal the counters")
PY
echo "PASS"
