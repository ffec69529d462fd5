#!/usr/bin/env bash
# Issue 18.2: an output record refused for its size never stalls its partition. Against a real
# Kafka broker (scripts/kafka-broker.sh; output and DLQ topics keep the broker's default
# max.message.bytes, ~1 MB; the input topic takes 2 MB): four messages on one partition: good,
# 1,000,500 bytes, 1,100,000 bytes (not JSON: dead letters carrying the value), good; with
# limits.max_message_bytes=1200000 both big ones are accepted as input, so their dead letters
# are what the producer or the broker refuses. In both delivery modes: both good ones have a
# result, both big ones a dead letter (truncated, naming the original size), and the group's
# committed offset reaches the log end (4) within 120 s.
# Arguments (from ctest): the spillway binary and the models folder.
set -euo pipefail
# shellcheck source=tests/broker_lib.sh
. "$(dirname "$0")/broker_lib.sh"
bt_init oversize "$1" "$2"

fail() { echo "FAIL: $*"; [ -f "$WORK/w.log" ] && tail -n 20 "$WORK/w.log"; exit 1; }

bt_broker

# random (incompressible) text, so that lz4 does not bring the records under the broker's limit
python3 - "$WORK" <<'PY'
import base64, json, os, sys
w = sys.argv[1]
def big(n): return base64.b64encode(os.urandom(n))[:n]
open(f"{w}/good1", "w").write(json.dumps({"id": "g1", "prompt": "Once upon a time", "max_tokens": 4}))
open(f"{w}/good2", "w").write(json.dumps({"id": "g2", "prompt": "Tom and his dog", "max_tokens": 4}))
open(f"{w}/big1", "wb").write(big(1000500))
open(f"{w}/big2", "wb").write(big(1100000))
PY

run_mode() { # MODE
  local mode=$1 in=${NS}p-$1 out=${NS}r-$1 dlq=${NS}d-$1 g=${NS}g-$1
  bt_topic "$in" 1 --config max.message.bytes=2000000
  bt_topic "$out" 1
  bt_topic "$dlq" 1
  for f in good1 big1 big2 good2; do
    kcat -b "$BOOTSTRAP" -P -t "$in" -X message.max.bytes=2000000 -z none "$WORK/$f" ||
      fail "producing $f"
  done
  "$SPILLWAY" worker -b "$BOOTSTRAP" -t "$in" -o "$out" -d "$dlq" -g "$g" -m "$MODEL" \
    -s delivery="$mode" -s threads=1 -s commit.interval.ms=200 -s kv.mem_mb=64 \
    -s limits.max_message_bytes=1200000 -X log_level=3 \
    -X consumer.fetch.max.bytes=4000000 -X consumer.max.partition.fetch.bytes=4000000 \
    -X consumer.receive.message.max.bytes=5000000 >"$WORK/w.log" 2>&1 &
  WPID=$!
  local end=$(( $(date +%s) + 120 )) off=
  while [ "$(date +%s)" -lt "$end" ]; do
    off=$(bt_query offsets "$g" "$in" | awk '$1 == 0 { print $2 }')
    [ "$off" = 4 ] && break
    kill -0 "$WPID" 2>/dev/null || fail "$mode: the worker exited"
    sleep 1
  done
  [ "$off" = 4 ] || fail "$mode: committed offset '${off}' after 120 s, want 4 (the partition stalled)"
  kill -TERM "$WPID"; wait "$WPID" || fail "$mode: worker exit status $?"
  WPID=
  local nres
  nres=$(kcat -b "$BOOTSTRAP" -C -t "$out" -e -q -o beginning -f '%s\n' -X isolation.level=read_committed | grep -c '"id"' || true)
  [ "$nres" = 2 ] || fail "$mode: $nres results, want 2"
  kcat -b "$BOOTSTRAP" -C -t "$dlq" -e -q -o beginning -f '%S %h\n' -X isolation.level=read_committed >"$WORK/dlq.txt"
  [ "$(wc -l <"$WORK/dlq.txt")" = 2 ] || { cat "$WORK/dlq.txt"; fail "$mode: want 2 dead letters"; }
  grep -q '__spillway.errors.original_bytes=1100000' "$WORK/dlq.txt" || fail "$mode: no truncated dead letter of 1100000 bytes"
  grep -q '__spillway.errors.truncated=true' "$WORK/dlq.txt" || fail "$mode: no truncated header"
  echo "$mode: committed offset 4, 2 results, dead letters: $(cut -c1-300 "$WORK/dlq.txt" | tr '\n' '|')"
}
run_mode at-least-once
run_mode exactly-once
echo PASS
