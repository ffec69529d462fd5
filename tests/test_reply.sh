#!/usr/bin/env bash
# Request-reply against a real Kafka broker, driven by the example client
# (examples/reply_client.c, spillway-reply-client) and an exactly-once worker:
#   - a request with reply_to + correlation_id in the JSON, and one with both as Kafka headers,
#     each get their reply (read_committed) on the reply topic with a matching correlation_id,
#     and the reply's text equals the result of the same request served the ordinary way;
#   - the replies are not on the results topic, the reply topic holds exactly the two replies,
#     keyed by the correlation id;
#   - reply_to outside reply.topics (JSON field and header) -> DLQ reply_not_allowed, nothing lost;
#   - a request nobody serves: the client gives up after --timeout-ms with exit status 2.
# Arguments (from ctest): the spillway binary and the models folder. SPILLWAY_REPLY_CLIENT: the
# client (default: next to spillway).
set -euo pipefail
# shellcheck source=tests/broker_lib.sh
. "$(dirname "$0")/broker_lib.sh"
bt_init reply "$1" "$2"
CLIENT=${SPILLWAY_REPLY_CLIENT:-$(dirname "$SPILLWAY")/spillway-reply-client}
[ -x "$CLIENT" ] || { echo "FAIL: $CLIENT not built"; exit 1; }

fail() { echo "FAIL: $*"; [ -f "$WORK/worker.log" ] && tail -20 "$WORK/worker.log"; exit 1; }

bt_broker
echo "broker at $BOOTSTRAP"
for t in prompts:2 results:2 prompts.dlq:1 replies:3 other.replies:1 unserved:1; do
  bt_topic "$NS${t%%:*}" "${t##*:}"
done

"$SPILLWAY" worker -b "$BOOTSTRAP" -t "${NS}prompts" -o "${NS}results" -d "${NS}prompts.dlq" -g "${NS}spw-reply" -m "$MODEL" \
  --exactly-once -s worker.id=reply-w1 -s reply.topics="${NS}replies,${NS}other.replies" -s threads=1 \
  -s kv.mem_mb=16 -s commit.interval.ms=100 -X consumer.session.timeout.ms=6000 \
  >"$WORK/worker.log" 2>&1 &
WPID=$!

PROMPT="Once upon a time, there was a little girl named Lily. She"
# 1. JSON fields
"$CLIENT" -b "$BOOTSTRAP" -t "${NS}prompts" -r "${NS}replies" -p "$PROMPT" -n 24 -c corr-json-1 -i req-json \
  --timeout-ms 30000 >"$WORK/reply1.json" 2>"$WORK/client1.err" \
  || { cat "$WORK/client1.err"; fail "no reply (JSON fields)"; }
# 2. headers
"$CLIENT" -b "$BOOTSTRAP" -t "${NS}prompts" -r "${NS}replies" -p "$PROMPT" -n 24 -c corr-hdr-2 -i req-hdr \
  --headers --timeout-ms 30000 >"$WORK/reply2.json" 2>"$WORK/client2.err" \
  || { cat "$WORK/client2.err"; fail "no reply (headers)"; }
cat "$WORK/client1.err" "$WORK/client2.err"

# the same request served the ordinary way, and two that name a topic outside reply.topics
printf '%s\n' "{\"id\": \"plain\", \"prompt\": \"$PROMPT\", \"max_tokens\": 24, \"temperature\": 0}" \
  "{\"id\": \"bad-json\", \"prompt\": \"x\", \"reply_to\": \"elsewhere\"}" > "$WORK/in.jsonl"
"$SPILLWAY" produce -b "$BOOTSTRAP" -t "${NS}prompts" --key-prefix 0 "$WORK/in.jsonl"
echo '{"id": "bad-hdr", "prompt": "x"}' | kcat -b "$BOOTSTRAP" -P -t "${NS}prompts" -H reply_to=elsewhere
echo plain > "$WORK/ids.txt"
"$SPILLWAY" collect -b "$BOOTSTRAP" -t "${NS}results" --ids "$WORK/ids.txt" -o "$WORK/plain.jsonl" \
  --timeout 60 || fail "the ordinary result did not come"
for _ in $(seq 1 100); do
  n=$(kcat -b "$BOOTSTRAP" -C -t "${NS}prompts.dlq" -e -q -o beginning -X isolation.level=read_committed \
      -f '.\n' 2>/dev/null | wc -l)
  [ "$n" -ge 2 ] && break
  sleep 0.2
done
kcat -b "$BOOTSTRAP" -C -t "${NS}prompts.dlq" -e -q -o beginning -X isolation.level=read_committed \
  -f '%h|%s\n' > "$WORK/dlq.txt"
kcat -b "$BOOTSTRAP" -C -t "${NS}replies" -e -q -o beginning -X isolation.level=read_committed \
  -f '%k|%h|%s\n' > "$WORK/replies.txt"
kcat -b "$BOOTSTRAP" -C -t "${NS}results" -e -q -o beginning -X isolation.level=read_committed \
  -f '%s\n' > "$WORK/results.txt"

python3 - "$WORK" <<'PY' || fail "reply checks"
import json, sys
work = sys.argv[1]
r1 = json.loads(open(f"{work}/reply1.json").read())
r2 = json.loads(open(f"{work}/reply2.json").read())
plain = json.loads(open(f"{work}/plain.jsonl").readline())
assert r1["id"] == "req-json" and r1["correlation_id"] == "corr-json-1", r1
assert r2["id"] == "req-hdr" and r2["correlation_id"] == "corr-hdr-2", r2
assert plain["id"] == "plain" and "correlation_id" not in plain, plain
assert r1["text"] and r1["text"] == plain["text"] and r2["text"] == plain["text"], (r1, r2, plain)
for r in (r1, r2):
    assert r["usage"]["completion_tokens"] == 24, r
    assert r["usage"]["prompt_tokens"] == plain["usage"]["prompt_tokens"], (r, plain)
reps = [l.split("|", 2) for l in open(f"{work}/replies.txt").read().splitlines()]
assert sorted(k for k, _, _ in reps) == ["corr-hdr-2", "corr-json-1"], reps
for k, h, v in reps:
    assert f"correlation_id={k}" in h and json.loads(v)["correlation_id"] == k, (k, h)
ids = [json.loads(l)["id"] for l in open(f"{work}/results.txt")]
assert ids == ["plain"], f"results topic holds {ids}: replies must go to the reply topic only"
dlq = open(f"{work}/dlq.txt").read().splitlines()
assert len(dlq) == 2, dlq
for l in dlq:
    assert "__spillway.errors.code=reply_not_allowed" in l and "elsewhere" in l, l
assert sorted(json.loads(l.split("|", 1)[1])["id"] for l in dlq) == ["bad-hdr", "bad-json"], dlq
print("replies, ordinary result and dead letters check out:", repr(r1["text"][:40]))
PY

# nobody serves "unserved": the client times out with status 2
set +e
"$CLIENT" -b "$BOOTSTRAP" -t "${NS}unserved" -r "${NS}replies" -p "x" --timeout-ms 1500 >/dev/null 2>"$WORK/client3.err"
rc=$?
set -e
[ "$rc" -eq 2 ] || { cat "$WORK/client3.err"; fail "client without a reply: status $rc, want 2"; }
grep -q "no reply" "$WORK/client3.err" || fail "timeout message"

kill -TERM "$WPID"; wait "$WPID" || fail "worker exit status after SIGTERM"
WPID=
echo "PASS"
