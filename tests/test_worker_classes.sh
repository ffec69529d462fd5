#!/usr/bin/env bash
# Service classes and overload steps against a real Apache Kafka 4.x broker
# (scripts/kafka-broker.sh) with stories260K, one worker, at-least-once:
#   classes interactive (priority 100, ttft_ms $TTFT_MS) and batch (priority 0, class.default),
#   overload.deferral.topic prompts.deferred.
#   1. an interactive stream starts ($RATE requests/s for $SECS s, max_tokens 8, on the same input
#      topic as the bulk work); once its first results are back, a bulk backlog of $NB batch
#      requests (max_tokens 24..64) lands at once;
#   2. the worker sheds batch messages to the deferral topic while the backlog would delay the
#      interactive ones (step 1; spillway:overload_actions_total{action="shed"} > 0 and at least
#      one step up), consumes the deferral topic again once the pressure is gone, and every
#      request gets exactly one result (set equality, no duplicate) - nothing lost;
#   3. the interactive requests' time to first token as their producer sees it (timings.wait_ms +
#      timings.ttft_ms) stays within the class target at p99; the figure (and batch's) is printed;
#   4. results carry their class; a request naming an unknown class is a dead letter with reason
#      unknown_class; at the end the step is back to 0.
# SPILLWAY_CLASSES_BULK / _RATE / _SECS change the load (bench/RESULTS.md records a larger run).
# Arguments (from ctest): the spillway binary and the models folder.
set -euo pipefail
# shellcheck source=tests/broker_lib.sh
. "$(dirname "$0")/broker_lib.sh"
bt_init classes "$1" "$2"
command -v python3 >/dev/null 2>&1 || { echo "SKIP: python3 not installed"; exit 77; }

NB=${SPILLWAY_CLASSES_BULK:-5000}
RATE=${SPILLWAY_CLASSES_RATE:-10}
SECS=${SPILLWAY_CLASSES_SECS:-20}
TTFT_MS=2000
WPID= PPID_=
bt_at_exit() {
  [ -n "$PPID_" ] && kill "$PPID_" 2>/dev/null || true
  [ -n "${SPILLWAY_TEST_KEEP:-}" ] && { mkdir -p "$SPILLWAY_TEST_KEEP"; cp "$WORK"/*.* "$SPILLWAY_TEST_KEEP"/ 2>/dev/null || true; }
}
fail() {
  echo "FAIL: $*"
  [ -f "$WORK/worker.log" ] && { echo "--- worker log (last 30 lines)"; tail -n 30 "$WORK/worker.log"; }
  exit 1
}

bt_broker
for t in prompts:4 results:4 prompts.dlq:1 prompts.deferred:4; do
  bt_topic "$NS${t%%:*}" "${t##*:}"
done
say "broker at $BOOTSTRAP, topics created"
MPORT=$(bt_free_port)
metric() { # NAME [LABELS]: the sample's value, 0 when absent
  python3 - "http://127.0.0.1:$MPORT/metrics" "$1" "${2:-}" <<'PY'
import sys, urllib.request
url, name, labels = sys.argv[1:]
want = name + ("{" + labels + "}" if labels else "")
try:
    body = urllib.request.urlopen(url, timeout=5).read().decode()
except Exception:
    print(0); sys.exit()
for l in body.splitlines():
    if l.split(" ")[0] == want:
        print(l.split(" ")[1]); break
else:
    print(0)
PY
}

# the bulk backlog (and one request of an unknown class)
python3 - "$WORK" "$NB" <<'PY'
import json, random, sys
work, nb = sys.argv[1], int(sys.argv[2])
rnd = random.Random(11)
pre = ["Once upon a time, there was a little girl named Lily. She", "Tom and his dog went to the park.",
       "The sun was shining and", "Sue had a red ball."]
with open(f"{work}/bulk.txt", "w") as f, open(f"{work}/ids.txt", "w") as ids:
    for i in range(nb):
        rid = f"b{i:05d}"
        req = {"id": rid, "prompt": f"{pre[i % 4]} {i}", "max_tokens": rnd.randint(24, 64), "temperature": 0}
        if i % 2:
            req["class"] = "batch"   # the others get class.default (batch)
        f.write(f"{rid}\t{json.dumps(req)}\n")
        ids.write(rid + "\n")
    f.write("nocls\t" + json.dumps({"id": "nocls", "prompt": "Hi", "class": "gold"}) + "\n")
PY

"$SPILLWAY" worker -b "$BOOTSTRAP" -t "${NS}prompts" -o "${NS}results" -d "${NS}prompts.dlq" -g "${NS}spw-classes" -m "$MODEL" \
  -s threads=2 -s kv.mem_mb=64 -s max.inflight=1024 -s log.level=info -s metrics.port="$MPORT" \
  -s metrics.bind=127.0.0.1 \
  -s classes="interactive:priority=100:ttft_ms=$TTFT_MS:max_queue_ms=600000,batch:priority=0" \
  -s class.default=batch -s overload.deferral.topic="${NS}prompts.deferred" -s overload.cooldown_ms=1500 \
  -X log_level=3 >"$WORK/worker.log" 2>&1 &
WPID=$!
for _ in $(seq 1 150); do grep -q 'assigned [1-9]' "$WORK/worker.log" && break; sleep 0.2; done
grep -q 'assigned [1-9]' "$WORK/worker.log" || fail "the worker was not assigned partitions"
say "worker up"

# 1. the interactive stream (paced, one kcat producer), then the backlog
python3 - "$RATE" "$SECS" "$WORK/iids.txt" <<'PY' | kcat -P -b "$BOOTSTRAP" -t "${NS}prompts" -K '\t' &
import json, sys, time
rate, secs, out = float(sys.argv[1]), float(sys.argv[2]), sys.argv[3]
n = int(rate * secs)
t0 = time.monotonic()
with open(out, "w") as ids:
    for i in range(n):
        d = t0 + i / rate - time.monotonic()
        if d > 0:
            time.sleep(d)
        rid = f"i{i:04d}"
        print(f"{rid}\t" + json.dumps({"id": rid, "class": "interactive", "prompt": f"Tom saw a bird {i}.",
                                       "max_tokens": 8, "temperature": 0}), flush=True)
        ids.write(rid + "\n")
        ids.flush()
PY
PPID_=$!
# the bulk lands once interactive traffic flows (3 results back): the steps protect a class the
# worker has seen (overload.window_ms)
for _ in $(seq 1 300); do
  [ "$(kcat -b "$BOOTSTRAP" -C -t "${NS}results" -e -q -o beginning -f '%k\n' 2>/dev/null | grep -c '^i')" -ge 3 ] && break
  sleep 0.1
done
kcat -P -b "$BOOTSTRAP" -t "${NS}prompts" -K '\t' -l "$WORK/bulk.txt"
say "interactive stream running ($RATE/s for $SECS s); $NB batch requests produced at once"
wait "$PPID_" || fail "the interactive producer failed"
PPID_=
cat "$WORK/iids.txt" >>"$WORK/ids.txt"
NI=$(wc -l <"$WORK/iids.txt")
say "interactive stream done: $NI requests"

# 2. everything comes back, exactly once
"$SPILLWAY" collect -b "$BOOTSTRAP" -t "${NS}results" --ids "$WORK/ids.txt" -o "$WORK/out.jsonl" --timeout 240 \
  2>"$WORK/collect.log" || { tail -5 "$WORK/collect.log"; fail "not every id came back"; }
say "every result is in"
shed=$(metric spillway:overload_actions_total 'action="shed"')
ups=$(metric spillway:overload_step_changes_total 'direction="up"')
for _ in $(seq 1 50); do [ "$(metric spillway:overload_step)" = 0 ] && break; sleep 0.2; done
step=$(metric spillway:overload_step)
kcat -b "$BOOTSTRAP" -C -t "${NS}results" -e -q -o beginning -f '%s\n' >"$WORK/all.jsonl"
kcat -b "$BOOTSTRAP" -C -t "${NS}prompts.dlq" -e -q -o beginning -f '%k %h\n' >"$WORK/dlq.txt"
ndef=$(kcat -b "$BOOTSTRAP" -C -t "${NS}prompts.deferred" -e -q -o beginning -f '.\n' | wc -l)
kill -TERM "$WPID"
rc=0
wait "$WPID" || rc=$?
WPID=
[ "$rc" = 0 ] || fail "worker exit status $rc after SIGTERM"

python3 - "$WORK" "$TTFT_MS" "$shed" "$ups" "$ndef" "$step" <<'PY' || fail "classes check"
import collections, json, sys
work, target = sys.argv[1], float(sys.argv[2])
shed, ups, ndef, step = (float(x) for x in sys.argv[3:7])
want = set(open(f"{work}/ids.txt").read().split())
recs = [json.loads(l) for l in open(f"{work}/all.jsonl")]
ids = collections.Counter(r["id"] for r in recs)
dups = sorted(k for k, v in ids.items() if v > 1)
missing, extra = want - set(ids), set(ids) - want
assert not dups, f"{len(dups)} duplicated results: {dups[:5]}"
assert not missing and not extra, (sorted(missing)[:5], sorted(extra)[:5])
def pct(v, q):
    v = sorted(v)
    return v[min(len(v) - 1, int(q * len(v)))]
by = collections.defaultdict(list)
for r in recs:
    want_cls = "interactive" if r["id"].startswith("i") else "batch"
    assert r.get("class") == want_cls, r
    assert r["finish_reason"] in ("stop", "length"), r
    by[want_cls].append(r["timings"]["wait_ms"] + r["timings"]["ttft_ms"])
for c, v in sorted(by.items()):
    print(f"{c}: {len(v)} results, time to first token seen by the producer (wait_ms + ttft_ms): "
          f"p50 {pct(v, .5):.0f} ms, p99 {pct(v, .99):.0f} ms, max {max(v):.0f} ms")
dlq = open(f"{work}/dlq.txt").read()
assert dlq.count("unknown_class") == 1 and dlq.startswith("nocls "), dlq[:300]
print(f"overload: {shed:.0f} batch requests shed to prompts.deferred ({ndef:.0f} records there), "
      f"{ups:.0f} step(s) up, step {step:.0f} at the end")
assert shed > 0 and ups >= 1 and ndef >= shed, "the overload steps never engaged"
assert step == 0, "the overload step did not return to 0"
p99 = pct(by["interactive"], .99)
assert p99 <= target, f"interactive p99 time to first token {p99:.0f} ms over the class target {target:.0f} ms"
PY
grep -m4 -E 'overload: step' "$WORK/worker.log" | cut -c1-220 || true
say "PASS"
