#!/usr/bin/env bash
# Exactly-once, a commit whose EndTxn the broker applied but whose answer the client handles only
# after transaction.commit.timeout.ms (librdkafka #5423: without KIP-890 the worker must not
# start another transaction on that producer instance), against a real Apache Kafka 4.x broker
# (scripts/kafka-broker.sh) with stories260K:
#   200 short prompts over 2 partitions -> `spillway worker -s delivery=exactly-once
#   -s transaction.commit.timeout.ms=4000 -s max.inflight=16` with the test plugin
#   tests/kafka/delay_endtxn.c loaded into its producer (-X producer.plugin.library.paths),
#   which holds the first EndTxn response back for 10 s: the commit times out with the outcome
#   unknown to the worker (the broker committed it). The other commits must not time out (each
#   one that does is rightly aborted, and its records would fail the check below): 4 s leaves
#   room for a loaded machine (with 1 s, at a load average of 15 on 2 CPUs, a flush took most
#   of a commit's second and two more commits timed out). The worker must replace the producer
#   instance (log line "replacing producer"), rewind to the committed offsets (which then include
#   that transaction's), serve the rest and stop on SIGTERM with status 0. Then, read with
#   read_committed: every id exactly once; read_uncommitted: no other record (the timed-out
#   transaction committed, nothing was aborted or served twice).
# Arguments (from ctest): the spillway binary and the models folder; the plugin's path in
# SPILLWAY_DELAY_ENDTXN_PLUGIN.
set -euo pipefail
# shellcheck source=tests/broker_lib.sh
. "$(dirname "$0")/broker_lib.sh"
bt_init eos-endtxn "$1" "$2"
PLUGIN=${SPILLWAY_DELAY_ENDTXN_PLUGIN:-}
[ -f "$PLUGIN" ] || { echo "FAIL: SPILLWAY_DELAY_ENDTXN_PLUGIN ('$PLUGIN') is not a file"; exit 1; }

fail() {
  echo "FAIL: $*"
  [ -f "$WORK/w.log" ] && { echo "--- $WORK/w.log (end)"; tail -n 25 "$WORK/w.log"; }
  exit 1
}

bt_broker
say "broker at $BOOTSTRAP"
bt_topic "${NS}prompts" 2
bt_topic "${NS}results" 2
bt_topic "${NS}prompts.dlq" 1

N=200
python3 - "$WORK" "$N" <<'PY'
import json, sys
work, n = sys.argv[1], int(sys.argv[2])
with open(f"{work}/in.jsonl", "w") as f, open(f"{work}/ids.txt", "w") as ids:
    for i in range(n):
        f.write(json.dumps({"id": f"d{i:05d}", "prompt": f"Tom and his dog {i}",
                            "max_tokens": 1 + i % 4, "temperature": 0}) + "\n")
        ids.write(f"d{i:05d}\n")
PY
"$SPILLWAY" produce -b "$BOOTSTRAP" -t "${NS}prompts" --key-prefix 0 "$WORK/in.jsonl" 2>/dev/null
say "produced $N prompts"

echo 10000 >"$WORK/delay"
SPILLWAY_TEST_ENDTXN_DELAY_FILE=$WORK/delay \
  "$SPILLWAY" worker -b "$BOOTSTRAP" -t "${NS}prompts" -o "${NS}results" -d "${NS}prompts.dlq" -g "${NS}spw-endtxn" \
    -m "$MODEL" \
    -s delivery=exactly-once -s worker.id=eosd -s threads=1 -s commit.interval.ms=200 \
    -s transaction.commit.timeout.ms=4000 -s max.inflight=16 -s kv.mem_mb=64 -s log.level=info \
    -X log_level=3 -X consumer.session.timeout.ms=6000 -X "producer.plugin.library.paths=$PLUGIN" \
    >"$WORK/w.log" 2>&1 &
WPID=$!
PIDS+=("$WPID")

"$SPILLWAY" collect -b "$BOOTSTRAP" -t "${NS}results" --ids "$WORK/ids.txt" -o "$WORK/out.jsonl" \
  --timeout 120 2>"$WORK/collect.log" || { cat "$WORK/collect.log"; fail "not every id came back"; }
say "every id came back (read_committed)"
[ ! -e "$WORK/delay" ] || fail "no EndTxn response was held back (the plugin did not run)"
grep -q 'delay_endtxn: holding an EndTxn response' "$WORK/w.log" || fail "no delay line in the log"
grep -q "the transaction's outcome is unknown: replacing producer" "$WORK/w.log" ||
  fail "the worker did not replace its producer after the commit timed out"
grep -q 'initialised (new epoch); rewinding to the committed offsets' "$WORK/w.log" ||
  fail "the new producer instance was not initialised"
kill -0 "$WPID" 2>/dev/null || fail "the worker stopped"
say "$(grep -o 'exactly-once: producer .*' "$WORK/w.log" | head -1)"
kill -TERM "$WPID"
rc=0
wait "$WPID" || rc=$?
[ "$rc" = 0 ] || fail "worker exit status $rc after SIGTERM"

for iso in committed uncommitted; do
  kcat -b "$BOOTSTRAP" -C -t "${NS}results" -e -q -o beginning -f '%s\n' -X "isolation.level=read_$iso" \
    >"$WORK/$iso.jsonl"
done
python3 - "$WORK" <<'PY' || fail "exactly-once check"
import collections, json, sys
work = sys.argv[1]
want = set(open(f"{work}/ids.txt").read().split())
recs = [json.loads(l) for l in open(f"{work}/committed.jsonl")]
unc = sum(1 for _ in open(f"{work}/uncommitted.jsonl"))
ids = collections.Counter(r["id"] for r in recs)
dups = {k: v for k, v in ids.items() if v > 1}
missing, extra = want - set(ids), set(ids) - want
print(f"read_committed: {len(recs)} records for {len(want)} ids, {len(dups)} duplicated, "
      f"{len(missing)} missing, {len(extra)} unexpected; read_uncommitted: {unc} records")
assert not dups, f"duplicates under read_committed: {sorted(dups.items())[:10]}"
assert not missing and not extra, (sorted(missing)[:10], sorted(extra)[:10])
assert unc == len(recs), f"{unc - len(recs)} records of aborted transactions"
PY
say "PASS"
