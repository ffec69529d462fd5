#!/usr/bin/env bash
# Oversized records never stall a partition with the default limits, in both delivery modes,
# against a real Apache Kafka 4.x broker (scripts/kafka-broker.sh) with stories260K
# (tests/test_oversize.sh covers raised input limits and a DLQ topic at the broker's default).
# For each mode (at-least-once, then exactly-once) one partition gets four messages:
#   1. a good prompt;
#   2. 1,000,500 bytes (under limits.max_message_bytes, over limits.max_prompt_bytes): a
#      prompt_too_large dead letter carrying the whole value, which the dead-letter topic
#      (max.message.bytes=600000) refuses; it must go out again with its value cut;
#   3. 1,100,000 bytes (over limits.max_message_bytes): a message_too_large dead letter, refused
#      and cut the same way;
#   4. a good prompt.
# The values are random letters, which lz4 cannot shrink below the topic limit. Checks: two
# results; two dead letters, each with __spillway.errors.truncated=true, its original size and a
# value of dlq.truncate_bytes (65536); the group's committed offset at the log end (4); and a
# worker given -X message.max.bytes below what an accepted message needs refuses to start,
# naming the keys. Every wait is bounded (a stalled partition fails the test instead of hanging).
# Arguments (from ctest): the spillway binary and the models folder.
set -euo pipefail
# shellcheck source=tests/broker_lib.sh
. "$(dirname "$0")/broker_lib.sh"
bt_init oversize "$1" "$2"

fail() {
  echo "FAIL: $*"
  local f
  for f in "$WORK"/*.log; do [ -f "$f" ] && { echo "--- $f (end)"; tail -n 20 "$f"; }; done
  exit 1
}

bt_broker
say "broker at $BOOTSTRAP"

python3 - "$WORK" <<'PY'
import json, random, string, sys
work = sys.argv[1]
rng = random.Random(18)
def sized(i, n):
    head = json.dumps({"id": f"big{i}", "max_tokens": 4, "prompt": ""})[:-2]
    body = "".join(rng.choice(string.ascii_letters) for _ in range(n - len(head) - 2))
    s = head + body + '"}'
    assert len(s) == n
    return s
with open(f"{work}/in.txt", "w") as f:
    f.write(json.dumps({"id": "good1", "prompt": "Once upon a time", "max_tokens": 4}) + "\n")
    f.write(sized(1, 1000500) + "\n")
    f.write(sized(2, 1100000) + "\n")
    f.write(json.dumps({"id": "good2", "prompt": "Tom and his dog", "max_tokens": 4}) + "\n")
PY

for MODE in at-least-once exactly-once; do
  P=${NS}p-$MODE R=${NS}r-$MODE D=${NS}d-$MODE G=${NS}g-$MODE
  bt_topic "$P" 1 --config max.message.bytes=2000000
  bt_topic "$R" 1
  bt_topic "$D" 1 --config max.message.bytes=600000
  kcat -b "$BOOTSTRAP" -P -t "$P" -p 0 -X message.max.bytes=2000000 -l "$WORK/in.txt" ||
    fail "kcat could not produce the inputs"
  "$SPILLWAY" worker -b "$BOOTSTRAP" -t "$P" -o "$R" -d "$D" -g "$G" -m "$MODEL" \
    -s delivery="$MODE" -s worker.id="w-$MODE" -s threads=1 -s commit.interval.ms=200 \
    -s kv.mem_mb=64 -s log.level=info -X log_level=3 >"$WORK/$MODE.log" 2>&1 &
  WPID=$!
  PIDS+=("$WPID")
  ISO=(-X isolation.level=read_committed)
  end=$(( $(date +%s) + 90 ))
  nr=0 nd=0
  while [ "$(date +%s)" -lt "$end" ]; do
    nr=$(kcat -b "$BOOTSTRAP" -C -t "$R" -e -q -o beginning -f '.\n' "${ISO[@]}" 2>/dev/null | wc -l)
    nd=$(kcat -b "$BOOTSTRAP" -C -t "$D" -e -q -o beginning -f '.\n' "${ISO[@]}" 2>/dev/null | wc -l)
    [ "$nr" -ge 2 ] && [ "$nd" -ge 2 ] && break
    kill -0 "$WPID" 2>/dev/null || fail "$MODE: the worker exited"
    sleep 0.3
  done
  [ "$nr" = 2 ] && [ "$nd" = 2 ] || fail "$MODE: $nr results and $nd dead letters after 90 s, want 2 and 2"
  kcat -b "$BOOTSTRAP" -C -t "$D" -e -q -o beginning "${ISO[@]}" \
    -f '%h|%S\n' >"$WORK/dlq-$MODE.txt" 2>/dev/null
  kcat -b "$BOOTSTRAP" -C -t "$R" -e -q -o beginning "${ISO[@]}" -f '%s\n' >"$WORK/res-$MODE.txt"
  python3 - "$WORK/dlq-$MODE.txt" "$WORK/res-$MODE.txt" <<'PY' || fail "$MODE: records"
import json, re, sys
ids = sorted(json.loads(l)["id"] for l in open(sys.argv[2]))
assert ids == ["good1", "good2"], ids
want = {"prompt_too_large": "1000500", "message_too_large": "1100000"}
got = {}
for line in open(sys.argv[1]):
    hdrs, size = line.rstrip("\n").rsplit("|", 1)
    # kcat joins headers with ',' (a reason text may hold one): split before each header name
    h = dict(kv.split("=", 1) for kv in re.split(r",(?=__spillway\.)", hdrs))
    code = h["__spillway.errors.code"]
    assert h.get("__spillway.errors.truncated") == "true", (code, h)
    assert int(size) == 65536, (code, size)
    got[code] = h["__spillway.errors.original_bytes"]
assert got == want, got
print(f"results {ids}; dead letters cut to 65536 bytes: {got}")
PY
  # the committed offset passes all four messages
  end=$(( $(date +%s) + 30 ))
  while :; do
    bt_query offsets "$G" "$P" >"$WORK/offsets.txt"
    off=$(awk '$1 == 0 { print $2 }' "$WORK/offsets.txt")
    [ "$off" = 4 ] && break
    [ "$(date +%s)" -lt "$end" ] || { cat "$WORK/offsets.txt"; fail "$MODE: committed offset '$off', want 4"; }
    sleep 0.5
  done
  grep -q "dead letter with the value cut" "$WORK/$MODE.log" || fail "$MODE: no log line for the refused dead letter"
  kill -TERM "$WPID"
  wait "$WPID" || fail "$MODE: the worker exited with status $? on SIGTERM"
  say "$MODE: 2 results, 2 cut dead letters, committed offset 4"
done

# a producer limit below what an accepted message needs is refused at start
if "$SPILLWAY" worker -b "$BOOTSTRAP" -t "${NS}p-at-least-once" -o "${NS}r" -d "${NS}d" -g "${NS}gx" -m "$MODEL" \
    -X message.max.bytes=1000000 >"$WORK/refuse.log" 2>&1; then
  fail "a worker with message.max.bytes=1000000 started"
fi
grep -q "message.max.bytes.*limits.max_message_bytes" "$WORK/refuse.log" ||
  fail "no message naming message.max.bytes and limits.max_message_bytes"
say "message.max.bytes below the input limit: refused at start"
say "PASS"
