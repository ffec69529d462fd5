#!/usr/bin/env bash
# Exactly-once delivery against a real Apache Kafka 4.x broker (scripts/kafka-broker.sh) with
# stories260K:
#   600 prompts over 4 partitions (every 4th asks 400 tokens, the others 1..8, so requests
#   finish out of offset order; at 160 a fast machine once finished all 600 before the SIGKILL
#   below) plus 2 bad messages -> `spillway worker -s delivery=exactly-once`
#   (a fixed worker.id, hence a fixed transactional.id) is killed with SIGKILL mid-batch and
#   restarted -> while the restarted worker runs, a third one starts with the same worker.id and
#   200 more prompts arrive: the third fences the second (a zombie), which must stop with a
#   "fatal" log line and exit status 1 (each recovers from one fence, and the first fenced again
#   within transaction.fence.window.ms stops: usually the second; which one is a race,
#   tests/broker_lib.sh one_fenced) -> the survivor drains everything and stops on SIGTERM with
#   status 0. Then, read with read_committed: every
#   id exactly once (zero duplicates, set equality), exactly 2 DLQ records, and the group's
#   committed offsets equal the log end offsets of every input partition.
# Arguments (from ctest): the spillway binary and the models folder.
set -euo pipefail
# shellcheck source=tests/broker_lib.sh
. "$(dirname "$0")/broker_lib.sh"
bt_init worker-eos "$1" "$2"

fail() {
  echo "FAIL: $*"
  local f
  for f in "$WORK"/w*.log; do [ -f "$f" ] && { echo "--- $f (end)"; tail -n 15 "$f"; }; done
  exit 1
}

bt_broker
say "broker at $BOOTSTRAP"
bt_topic "${NS}prompts" 4
bt_topic "${NS}results" 4
bt_topic "${NS}prompts.dlq" 1
say "topics created"

N=600   # first batch; a second one of N2 follows while the zombie runs
N2=200
python3 - "$WORK" "$N" "$N2" <<'PY'
import json, sys
work, n, n2 = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
prefixes = ["Once upon a time, there was a little girl named Lily. She",
            "Tom and his dog went to the park.", "The sun was shining and", "Sue had a red ball."]
# every 4th request is long (400 tokens), the rest 1..8: requests finish out of offset order
def batch(path, lo, hi):
    with open(path, "w") as f:
        for i in range(lo, hi):
            f.write(json.dumps({"id": f"e{i:05d}", "prompt": f"{prefixes[i % 4]} {i}",
                                "max_tokens": 400 if i % 4 == 0 else 1 + (i * 5) % 8,
                                "temperature": 0}) + "\n")
batch(f"{work}/in1.jsonl", 0, n)
batch(f"{work}/in2.jsonl", n, n + n2)
with open(f"{work}/in1.jsonl", "a") as f:
    f.write("not json at all\n")
    f.write(json.dumps({"id": "noprompt"}) + "\n")
with open(f"{work}/ids.txt", "w") as ids:
    ids.write("".join(f"e{i:05d}\n" for i in range(n + n2)))
PY
"$SPILLWAY" produce -b "$BOOTSTRAP" -t "${NS}prompts" --key-prefix 0 "$WORK/in1.jsonl" 2>/dev/null
say "produced $N prompts and 2 bad messages"

# run_worker NAME: an exactly-once worker (fixed worker.id) logging to $WORK/NAME.log; sets WPID.
run_worker() {
  "$SPILLWAY" worker -b "$BOOTSTRAP" -t "${NS}prompts" -o "${NS}results" -d "${NS}prompts.dlq" -g "${NS}spw-eos" -m "$MODEL" \
    -s delivery=exactly-once -s worker.id=eosw -s threads=1 -s commit.interval.ms=200 \
    -s max.inflight=64 -s kv.mem_mb=64 -s log.level=info \
    -X log_level=3 -X consumer.session.timeout.ms=6000 -X consumer.heartbeat.interval.ms=500 \
    >"$WORK/$1.log" 2>&1 &
  WPID=$!
  PIDS+=("$WPID")
}
# count ISOLATION: records in the results topic now, read with that isolation level.
count() {
  kcat -b "$BOOTSTRAP" -C -t "${NS}results" -e -q -o beginning -f '.\n' -X isolation.level="$1" \
    2>/dev/null | wc -l || true
}
# wait_count ISOLATION MIN SECONDS: waits until count ISOLATION >= MIN; prints the count.
wait_count() {
  local c=0 end=$(( $(date +%s) + $3 ))
  while [ "$(date +%s)" -lt "$end" ]; do
    c=$(count "$1")
    [ "$c" -ge "$2" ] && break
    sleep 0.2
  done
  echo "$c"
}

# 1. SIGKILL mid-batch: some results are in (committed or not), most are not
run_worker w1
c=$(wait_count read_uncommitted 50 60)
[ "$c" -ge 50 ] || fail "only $c results after 60 s"
kill -9 "$WPID"
wait "$WPID" 2>/dev/null || true
k=$(count read_committed)
[ "$k" -lt "$N" ] || fail "w1 had committed all $N results before the kill: not mid-batch"
say "killed w1 (SIGKILL): $c results seen before the kill, $k committed of $N"

# 2. restart; then a third instance with the same transactional.id fences it. The second batch,
# produced once the third is initialised, makes sure the zombie has work to attempt.
run_worker w2
W2=$WPID
c=$(wait_count read_committed 300 60)
[ "$c" -ge 300 ] || fail "only $c committed results 60 s after the restart"
kill -0 "$W2" 2>/dev/null || fail "w2 is not running"
run_worker w3
for _ in $(seq 1 150); do grep -q ' INFO started: ' "$WORK/w3.log" && break; sleep 0.2; done
grep -q ' INFO started: ' "$WORK/w3.log" || fail "w3 did not start"
"$SPILLWAY" produce -b "$BOOTSTRAP" -t "${NS}prompts" --key-prefix 0 "$WORK/in2.jsonl" 2>/dev/null
say "w2 had $c committed results; w3 started with the same worker.id; produced $N2 more prompts"
one_fenced "$W2" w2 "$WPID" w3 40
say "$FENCED_NAME stopped with status 1: $(grep ' ERROR fatal: ' "$WORK/$FENCED_NAME.log" | head -1 | cut -c1-200)"

# 3. the survivor finishes the work and drains on SIGTERM
"$SPILLWAY" collect -b "$BOOTSTRAP" -t "${NS}results" --ids "$WORK/ids.txt" -o "$WORK/out.jsonl" --timeout 120 \
  2>"$WORK/collect.log" || { cat "$WORK/collect.log"; fail "not every id came back"; }
kill -TERM "$SURV_PID"
rc=0
wait "$SURV_PID" || rc=$?
[ "$rc" = 0 ] || fail "$SURV_NAME exit status $rc after SIGTERM"
grep -q "stopped:" "$WORK/$SURV_NAME.log" || fail "no clean stop in $SURV_NAME's log"
say "$SURV_NAME drained and stopped: $(grep -o 'stopped:.*' "$WORK/$SURV_NAME.log" | tail -1)"

# zero duplicates under read_committed, set equality; the aborted records are only visible
# to read_uncommitted readers
kcat -b "$BOOTSTRAP" -C -t "${NS}results" -e -q -o beginning -f '%s\n' -X isolation.level=read_committed \
  >"$WORK/committed.jsonl"
uncommitted=$(count read_uncommitted)
python3 - "$WORK" "$uncommitted" "${NS}prompts" <<'PY' || fail "exactly-once check"
import collections, json, sys
work, unc, topic = sys.argv[1], int(sys.argv[2]), sys.argv[3]
want = set(open(f"{work}/ids.txt").read().split())
recs = [json.loads(l) for l in open(f"{work}/committed.jsonl")]
ids = collections.Counter(r["id"] for r in recs)
dups = {k: v for k, v in ids.items() if v > 1}
missing = want - set(ids)
extra = set(ids) - want
print(f"read_committed: {len(recs)} records for {len(want)} ids, {len(dups)} duplicated, "
      f"{len(missing)} missing, {len(extra)} unexpected; read_uncommitted: {unc} records "
      f"({unc - len(recs)} from aborted transactions)")
assert not dups, f"duplicates under read_committed: {sorted(dups.items())[:10]}"
assert not missing and not extra, (sorted(missing)[:10], sorted(extra)[:10])
for r in recs:
    assert r["finish_reason"] in ("stop", "length"), r
    assert r["worker"] == "eosw" and r["input"]["topic"] == topic, r
PY
ndlq=$(kcat -b "$BOOTSTRAP" -C -t "${NS}prompts.dlq" -e -q -o beginning -f '%h\n' \
  -X isolation.level=read_committed | grep -c '__spillway.errors.code=' || true)
[ "$ndlq" = 2 ] || fail "$ndlq DLQ records under read_committed, want 2"

# the group's committed offsets are at the log end of every input partition
bt_query offsets "${NS}spw-eos" "${NS}prompts" >"$WORK/offsets.txt"
awk '{ n++; if ($2 != $3) bad = bad " " $1 ":" $2 "/" $3; sum += $2 }
     END { printf "%d partitions, committed offsets sum %d%s\n", n, sum, bad ? ", behind:" bad : "";
           exit !(n == 4 && bad == "") }' "$WORK/offsets.txt" ||
  { cat "$WORK/offsets.txt"; fail "committed offsets are not at the log end"; }
say "PASS"
