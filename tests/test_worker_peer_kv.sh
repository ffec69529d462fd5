#!/usr/bin/env bash
# KV across hosts, end to end: two `spillway worker` processes as two hosts (cache.host_id hostA
# and hostB, each its own arena file, the same deployment secret file), one real redis-server
# (scripts/redis-server.sh) and a real Kafka broker (tests/broker_lib.sh), on stories260K. A
# serves its arena's blocks (cache.peer.listen on a free loopback port); B fetches.
#   1. A computes a long prompt (topic ta); its blocks are indexed under hostA;
#   2. B gets the same prompt (topic tb), never computed on B: it locates hostA in the fleet
#      registry, fetches the prefix (the cost model told to prefer fetching through
#      cache.peer.prefill_tps=1), and reports cached_tokens > 0 with text identical to A's;
#      B's log names the fetch, A's metrics count the blocks served;
#   3. A stopped: B gets another long prompt that only A had computed before it stopped: the
#      fetch fails (connect), B recomputes, the result is identical to A's, the fallback is
#      counted in B's metrics.
# Arguments (from ctest): the spillway binary and the models folder.
set -euo pipefail
SPILLWAY=$(realpath "$1")
MODELS=$2
# shellcheck source=tests/broker_lib.sh
. "$(dirname "$0")/broker_lib.sh"
bt_init worker-peer-kv "$SPILLWAY" "$MODELS" redis
command -v curl >/dev/null 2>&1 || { echo "SKIP: curl not installed"; exit 77; }
SHM=$("$ROOT/scripts/shm-dir.sh" spillway-peer-kv)
BT_RM+=("$SHM")

bt_broker
for t in ta tb results dlq; do bt_topic "$t" 1; done
eval "$("$RS" start "$WORK/redis" | grep -E '^(REDIS_PORT|REDIS_PID)=')"
PP=$(bt_free_port)
MA=$(bt_free_port "$PP")
MB=$(bt_free_port "$PP" "$MA")
say "broker $BOOTSTRAP, redis $REDIS_PORT, peer port $PP, metrics $MA $MB"

COMMON=(-s threads=1 -s kv.mem_mb=32 -s log.level=debug -s commit.interval.ms=200
        -s cache.redis.host=127.0.0.1 -s cache.redis.port="$REDIS_PORT"
        -s cache.redis.timeout_ms=1000 -s cache.secret_file="$SHM/secret" -s cache.arena.mb=64
        -s cache.fleet.refresh_ms=200 -s metrics.bind=127.0.0.1)
worker() { # NAME TOPIC METRICS_PORT [options]
  local name=$1 topic=$2 mp=$3
  shift 3
  "$SPILLWAY" worker -b "$BOOTSTRAP" -t "$topic" -o results -d dlq -g "g$name" -m "$MODEL" \
    -s worker.id="$name" -s metrics.port="$mp" "${COMMON[@]}" "$@" >>"$WORK/$name.log" 2>&1 &
  WPID=$!
  PIDS+=("$WPID")
}
metric() { curl -s --max-time 5 "http://127.0.0.1:$1/metrics" | awk -v k="$2" '$1 == k { print $2 + 0; f = 1 } END { if (!f) print "NA" }'; }
# result ID SECONDS: the result record of ID (waits for it)
result() {
  local end=$(( $(date +%s) + $2 )) r
  while [ "$(date +%s)" -lt "$end" ]; do
    r=$(kcat -b "$BOOTSTRAP" -C -t results -e -q -o beginning -f '%s\n' -X fetch.wait.max.ms=5 2>/dev/null |
          grep -F "\"id\":\"$1\"" | head -n 1 || true)
    [ -n "$r" ] && { echo "$r"; return 0; }
    sleep 0.3
  done
  fail "no result for $1 after $2 s"
}
send() { # TOPIC ID PROMPT_FILE
  python3 -c 'import json,sys; print(sys.argv[1] + "\t" + json.dumps({"id": sys.argv[1], "prompt": open(sys.argv[2]).read(), "max_tokens": 24, "temperature": 0}))' "$2" "$3" |
    kcat -b "$BOOTSTRAP" -P -t "$1" -K '\t' 2>/dev/null
}
field() { python3 -c 'import json,sys; r=json.loads(sys.argv[1]); print(r["usage"]["cached_tokens"] if sys.argv[2]=="cached" else r["text"])' "$1" "$2"; }
# indexed HOST: blocks in HOST's Redis index
indexed() {
  local k
  k=$(redis-cli -p "$REDIS_PORT" --scan --pattern "spillway:$1:*:blk" | head -n 1)
  [ -n "$k" ] && redis-cli -p "$REDIS_PORT" hlen "$k" || echo 0
}

python3 - "$WORK" <<'PY'
import sys
work = sys.argv[1]
story = ("Once upon a time, there was a little girl named Lily. She loved to play outside in the "
         "park. One day, she saw a big, red ball. She wanted to play with it, but it was too high. "
         "Her mom said, \"Let us ask the man for help.\" The man was very kind and gave them the "
         "ball. They played all day and were very happy. ")
open(f"{work}/p1.txt", "w").write(story * 3 + "The end.")
open(f"{work}/p2.txt", "w").write("Tom had a dog named Max. " + story * 2 + "And then")
PY

worker A ta "$MA" -s cache.host_id=hostA -s cache.arena.path="$SHM/arenaA" \
  -s cache.peer.listen=127.0.0.1:"$PP"
A=$WPID
worker B tb "$MB" -s cache.host_id=hostB -s cache.arena.path="$SHM/arenaB" \
  -s cache.peer.prefill_tps=1
B=$WPID

# ---- 1. A computes both prompts ----
send ta a1 "$WORK/p1.txt"
send ta a2 "$WORK/p2.txt"
RA1=$(result a1 120)
RA2=$(result a2 120)
# A's writer thread indexes the blocks after the results: wait until the count holds still
PREV=-1 SAME=0
for _ in $(seq 1 150); do
  NA=$(indexed hostA)
  if [ "$NA" = "$PREV" ] && [ "$NA" -ge 10 ]; then SAME=$((SAME + 1)); else SAME=0; fi
  [ "$SAME" -ge 3 ] && break
  PREV=$NA
  sleep 0.3
done
[ "$NA" -ge 10 ] || fail "hostA indexed $NA blocks"
say "A computed both prompts; $NA blocks indexed under hostA"
grep -q 'peer server: serving this host' "$WORK/A.log" || fail "A does not serve"

# ---- 2. B fetches the prefix of p1 from A ----
send tb b1 "$WORK/p1.txt"
RB1=$(result b1 120)
CB1=$(field "$RB1" cached)
[ "$CB1" -gt 0 ] || fail "B's b1 reports cached_tokens $CB1"
[ "$(field "$RB1" text)" = "$(field "$RA1" text)" ] || fail "b1's text differs from a1's"
grep -q 'peer fetch from host hostA' "$WORK/B.log" || fail "B's log names no fetch"
SERVED=$(metric "$MA" 'spillway:peer_kv_blocks_total{dir="served"}')
RECV=$(metric "$MB" 'spillway:peer_kv_blocks_total{dir="received"}')
[ "$SERVED" != NA ] && [ "${SERVED%.*}" -gt 0 ] && [ "$RECV" = "$SERVED" ] ||
  fail "blocks served by A $SERVED, received by B $RECV"
# B never computed p1: every cached token came from the fetched blocks (kv.block_tokens 16)
[ "$CB1" = $(( ${RECV%.*} * 16 )) ] || fail "B's cached_tokens $CB1 for $RECV fetched blocks"
say "B: cached_tokens $CB1, $RECV blocks fetched from A, text identical"

# ---- 3. A gone: B recomputes ----
kill -TERM "$A"
wait "$A" || fail "A's exit status after SIGTERM"
send tb b2 "$WORK/p2.txt"
RB2=$(result b2 120)
[ "$(field "$RB2" text)" = "$(field "$RA2" text)" ] || fail "b2's text differs from a2's"
# A's record may still be live (fleet TTL): then the fetch fails to connect; past it, A is not
# located at all; either way b2 was recomputed
FB=$(metric "$MB" 'spillway:peer_kv_fallbacks_total{reason="connect"}')
CB2=$(field "$RB2" cached)
[ "$FB" = 1 ] || [ "$CB2" = 0 ] || fail "b2: cached_tokens $CB2, connect fallbacks $FB"
say "A stopped: b2 recomputed (connect fallbacks $FB), text identical"
kill -TERM "$B"
wait "$B" || fail "B's exit status after SIGTERM"
grep -q ' INFO stopped: ' "$WORK/B.log" || fail "B: no clean stop"
say "PASS"
