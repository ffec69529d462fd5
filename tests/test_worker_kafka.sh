#!/usr/bin/env bash
# The worker against a real Apache Kafka 4.x broker (scripts/kafka-broker.sh) with stories260K:
#   1,000 prompts over 4 partitions, produced with `spillway produce`, plus bad input and one
#   request past its deadline -> `spillway worker` is killed with SIGKILL mid-batch and restarted
#   -> `spillway collect` gets every id (set equality; duplicates only from the killed run's
#   in-flight or not-yet-committed work) -> every bad message is in the DLQ with its reason header -> the late request
#   came back "expired" -> SIGTERM drains and exits 0 -> a second run of the group finds nothing
#   left to consume (the committed offsets reached the log end).
# Arguments (from ctest): the spillway binary and the models folder.
set -euo pipefail
# shellcheck source=tests/broker_lib.sh
. "$(dirname "$0")/broker_lib.sh"
bt_init worker-kafka "$1" "$2"


bt_broker
echo "broker at $BOOTSTRAP"
bt_topic "${NS}prompts" 4
bt_topic "${NS}results" 4
bt_topic "${NS}prompts.dlq" 1

N=1000
python3 - "$WORK" "$N" <<'PY'
import json, sys
work, n = sys.argv[1], int(sys.argv[2])
prefixes = ["Once upon a time, there was a little girl named Lily. She",
            "Tom and his dog went to the park.", "The sun was shining and", "Sue had a red ball."]
with open(f"{work}/in.jsonl", "w") as f, open(f"{work}/ids.txt", "w") as ids:
    for i in range(n):
        rid = f"r{i:05d}"
        f.write(json.dumps({"id": rid, "prompt": f"{prefixes[i % 4]} {i}", "max_tokens": 1 + i % 8,
                            "temperature": 0}) + "\n")
        ids.write(rid + "\n")
    f.write(json.dumps({"id": "late", "prompt": "Once upon", "deadline": 1000}) + "\n")
    ids.write("late\n")
with open(f"{work}/bad.jsonl", "w") as f:
    f.write("not json at all\n")
    f.write(json.dumps({"id": "noprompt"}) + "\n")
    f.write(json.dumps({"id": "badtemp", "prompt": "x", "temperature": "hot"}) + "\n")
PY

"$SPILLWAY" produce -b "$BOOTSTRAP" -t "${NS}prompts" "$WORK/in.jsonl"
"$SPILLWAY" produce -b "$BOOTSTRAP" -t "${NS}prompts" --key-prefix 0 "$WORK/bad.jsonl"

run_worker() {
  "$SPILLWAY" worker -b "$BOOTSTRAP" -t "${NS}prompts" -o "${NS}results" -d "${NS}prompts.dlq" -g "${NS}spw" -m "$MODEL" \
    -s threads=1 -s commit.interval.ms=200 -s max.inflight=64 -s kv.mem_mb=64 -s log.level=info \
    -X log_level=3 -X consumer.session.timeout.ms=6000 "$@" >>"$WORK/worker.log" 2>&1 &
  WPID=$!
}

# first run: SIGKILL once some results are out (mid-batch)
run_worker
for _ in $(seq 1 600); do
  c=$(kcat -b "$BOOTSTRAP" -C -t "${NS}results" -e -q -o beginning -f '.\n' 2>/dev/null | wc -l || true)
  [ "$c" -ge 200 ] && break
  sleep 0.1
done
kill -9 "$WPID"; wait "$WPID" 2>/dev/null || true
echo "killed the worker after $c results"

# restart and collect everything
run_worker
"$SPILLWAY" collect -b "$BOOTSTRAP" -t "${NS}results" --ids "$WORK/ids.txt" -o "$WORK/out.jsonl" --timeout 240 \
  || fail "not every id came back"
# Every id is in, but the restarted worker may still be redoing the uncommitted tail of a
# partition (duplicates) or the dead letters: wait until results + DLQ stop growing for 3 s, so
# that the check below (a fresh run consumes nothing) tests the commits, not this race.
prev=-1 stable=0
for _ in $(seq 1 120); do
  n=$(( $(kcat -b "$BOOTSTRAP" -C -t "${NS}results" -e -q -o beginning -f '.\n' 2>/dev/null | wc -l) +
        $(kcat -b "$BOOTSTRAP" -C -t "${NS}prompts.dlq" -e -q -o beginning -f '.\n' 2>/dev/null | wc -l) ))
  if [ "$n" -eq "$prev" ]; then stable=$((stable + 1)); else stable=0; fi
  [ "$stable" -ge 3 ] && break
  prev=$n
  sleep 1
done
# SIGTERM drains and exits 0
kill -TERM "$WPID"
wait "$WPID" || fail "worker exit status $? after SIGTERM"
WPID=
grep -q "stopped:" "$WORK/worker.log" || fail "no clean stop in the log"

python3 - "$WORK" "${NS}prompts" <<'PY' || exit 1
import json, sys
work, topic = sys.argv[1], sys.argv[2]
want = set(open(f"{work}/ids.txt").read().split())
got = [json.loads(l) for l in open(f"{work}/out.jsonl")]
ids = [r["id"] for r in got]
assert set(ids) == want, f"set mismatch: missing {len(want - set(ids))}"
assert len(ids) == len(set(ids)), "collect returned a duplicate"
late = [r for r in got if r["id"] == "late"][0]
assert late["finish_reason"] == "expired" and late["usage"]["completion_tokens"] == 0, late
for r in got:
    assert r["finish_reason"] in ("stop", "length", "expired"), r
    assert r["input"]["topic"] == topic and r["model"] == "stories260K", r
print(f"{len(ids)} results, set equality holds")
PY

# every raw result, with duplicates: only what was in flight when killed may repeat
total=$(kcat -b "$BOOTSTRAP" -C -t "${NS}results" -e -q -o beginning -f '%s\n' -X isolation.level=read_committed | wc -l)
echo "results topic holds $total records for $((N + 1)) requests ($((total - N - 1)) duplicates)"
[ "$total" -ge $((N + 1)) ] || fail "fewer records than requests"
# in flight (max.inflight 64) or durable but not yet committed (commit.interval.ms 200) when killed
[ $((total - N - 1)) -le 256 ] || fail "too many duplicates"

# DLQ: every bad message with its reason
kcat -b "$BOOTSTRAP" -C -t "${NS}prompts.dlq" -e -q -o beginning -f '%h|%s\n' > "$WORK/dlq.txt"
# at-least-once: a dead letter in flight at the kill may be written again; count source offsets
n_dlq=$(grep -o '__spillway.errors.partition=[0-9]*,__spillway.errors.offset=[0-9]*' "$WORK/dlq.txt" | sort -u | wc -l)
[ "$n_dlq" -eq 3 ] || { cat "$WORK/dlq.txt"; fail "want dead letters for 3 source messages, got $n_dlq"; }
grep -q '__spillway.errors.code=not_json.*|not json at all' "$WORK/dlq.txt" || fail "not_json"
grep -q '__spillway.errors.code=missing_prompt' "$WORK/dlq.txt" || fail "missing_prompt"
grep -q '__spillway.errors.code=wrong_type' "$WORK/dlq.txt" || fail "wrong_type"

# a fresh run of the group: the committed offsets are at the log end, nothing is consumed again.
# It runs until it holds the 4 partitions and its /metrics show a lag (log end - committed) of 0
# on each: had a commit been missing, it would first consume (and the check below fail).
: > "$WORK/worker.log"
MP=$(bt_free_port)
run_worker -s metrics.port="$MP" -s metrics.bind=127.0.0.1 -s metrics.lag_refresh_ms=200
n0=0
for _ in $(seq 1 300); do
  n0=$(curl -sf "http://127.0.0.1:$MP/metrics" 2>/dev/null | grep -c '^spillway:consumer_lag{.*} 0$' || true)
  [ "$n0" = 4 ] && break
  sleep 0.1
done
[ "$n0" = 4 ] || fail "second run: $n0 of 4 partitions with lag 0 after 30 s"
kill -TERM "$WPID"; wait "$WPID" || fail "second run exit status"
WPID=
grep -q "stopped: 0 consumed" "$WORK/worker.log" || { cat "$WORK/worker.log"; fail "the group consumed again: offsets were not committed to the end"; }
echo "PASS"
