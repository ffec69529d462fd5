#!/usr/bin/env bash
# Issue 18.1: KV computed from other tokens, stored in tier 2 under a victim's block name, is
# never used, across processes through Redis and the host arena.
#   process A (tests/kv_forge.c, $SPILLWAY_KV_FORGE) stores the first KV block of the
#     attacker's prompt, with its real tokens, in the arena and the Redis index under the name
#     of the victim prompt's first block: what a producer who found a name collision achieves;
#   process B (`spillway generate`, same arena, index and secret) runs the victim's prompt: its
#     text equals a cold (no cache) run's, cached_tokens is 0, and its stats count the block it
#     found and refused;
#   process W (`spillway worker`, cache.isolation none, same arena, index and secret) serves the
#     victim's prompt from a real Kafka broker: the same (its stats line: prefix_mismatches=1);
#   control: a process C that stores the victim's honest blocks (other arena and index), then
#     process D hits them (cached_tokens 16), so the path the forgery took does serve real hits.
# Arguments (from ctest): the spillway binary and the models folder.
set -euo pipefail
# shellcheck source=tests/broker_lib.sh
. "$(dirname "$0")/broker_lib.sh"
bt_init kv-forgery "$1" "$2" redis
FORGE=${SPILLWAY_KV_FORGE:-$(dirname "$SPILLWAY")/spillway-kv-forge}
[ -x "$FORGE" ] || { echo "FAIL: no forge tool at $FORGE"; exit 1; }

SHM=$("$ROOT/scripts/shm-dir.sh" spillway-test)
BT_RM+=("$SHM")

eval "$("$RS" start "$WORK/redis" | grep -E '^(REDIS_PORT|REDIS_PID)=')"
echo "redis on port $REDIS_PORT"
VICTIM="Once upon a time, there was a little girl named Lily. She loved to play outside in the park"
ATTACKER="The big brown dog ran to the tall green tree and barked at a small cat. It was very loud"
python3 - "$WORK" "$VICTIM" <<'PY'
import json, sys
with open(f"{sys.argv[1]}/victim.jsonl", "w") as f:
    f.write(json.dumps({"id": "v", "prompt": sys.argv[2], "max_tokens": 24}) + "\n")
with open(f"{sys.argv[1]}/kafka.jsonl", "w") as f:
    f.write(json.dumps({"id": "w", "prompt": sys.argv[2], "max_tokens": 24, "temperature": 0,
                        "tenant": "victim"}) + "\n")
PY
GEN=("$SPILLWAY" generate -m "$MODEL" -t 0 --threads 1 --kv-type f32 --kv-mem-mb 32 --stats)
cache() { # arena and index of one experiment: $1 = name
  echo --cache-redis "127.0.0.1:$REDIS_PORT" --cache-arena "$SHM/$1.arena" --cache-arena-mb 64 \
    --cache-timeout-ms 1000 --cache-secret "$SHM/secret"
}
field() { python3 -c 'import json,sys; print(json.loads(open(sys.argv[1]).readline())[sys.argv[2]])' "$1" "$2"; }
cached() { python3 -c 'import json,sys; print(json.loads(open(sys.argv[1]).readline())["usage"]["cached_tokens"])' "$1"; }
refused() { sed -n 's/.* \([0-9]*\) refused (other tokens under the name).*/\1/p' "$1"; }

"${GEN[@]}" --no-prefix-cache -f "$WORK/victim.jsonl" >"$WORK/cold.out" 2>/dev/null
cold=$(field "$WORK/cold.out" text)

# ---- the forgery: A stores the attacker's block under the victim's name ----
# shellcheck disable=SC2046
"$FORGE" "$MODEL" "$SHM/secret" "$SHM/forged.arena" "$REDIS_PORT" "$VICTIM" "$ATTACKER" \
  >"$WORK/forge.out" 2>"$WORK/forge.err" || { cat "$WORK/forge.err"; fail "the forge process failed"; }
name=$(sed -n 's/^forged \([0-9a-f]*\)$/\1/p' "$WORK/forge.out")
[ -n "$name" ] || fail "the forge process printed no name"
blk=$(redis-cli -p "$REDIS_PORT" --scan --pattern '*:blk' | head -n1)
[ -n "$blk" ] && [ "$(redis-cli -p "$REDIS_PORT" hexists "$blk" "$name")" = 1 ] \
  || fail "the forged block $name is not in the index"
echo "A: attacker's block indexed under the victim's block name $name"

# ---- B: the victim, on the forged arena and index ----
# shellcheck disable=SC2046
"${GEN[@]}" $(cache forged) -f "$WORK/victim.jsonl" >"$WORK/b.out" 2>"$WORK/b.err" \
  || { cat "$WORK/b.err"; fail "process B failed"; }
b_text=$(field "$WORK/b.out" text)
b_cached=$(cached "$WORK/b.out")
[ "$b_cached" = 0 ] || fail "B: cached_tokens $b_cached: the forged block was used"
[ "$b_text" = "$cold" ] || fail "B: text differs from a cold run: '$b_text' vs '$cold'"
[ "$(refused "$WORK/b.err")" = 1 ] || { cat "$WORK/b.err"; fail "B: the forged block was not found and refused"; }
echo "B: victim's text equals the cold run, cached_tokens 0, 1 block refused"

# ---- W: the victim through a worker, on the forged arena and index ----
bt_broker
for t in prompts results prompts.dlq; do bt_topic "$NS$t" 1; done
"$SPILLWAY" produce -b "$BOOTSTRAP" -t "${NS}prompts" "$WORK/kafka.jsonl" >/dev/null
"$SPILLWAY" worker -b "$BOOTSTRAP" -t "${NS}prompts" -o "${NS}results" -d "${NS}prompts.dlq" -g "${NS}forgery" -m "$MODEL" \
  -s threads=1 -s kv.type=f32 -s kv.mem_mb=32 -s commit.interval.ms=200 -s cache.isolation=none \
  -s cache.redis.host=127.0.0.1 -s cache.redis.port="$REDIS_PORT" -s cache.redis.timeout_ms=1000 \
  -s cache.arena.path="$SHM/forged.arena" -s cache.arena.mb=64 -s cache.secret_file="$SHM/secret" \
  >"$WORK/w.log" 2>&1 &
WPID=$!
echo w >"$WORK/ids.txt"
"$SPILLWAY" collect -b "$BOOTSTRAP" -t "${NS}results" --ids "$WORK/ids.txt" -o "$WORK/w.out" --timeout 120 \
  >/dev/null 2>&1 || { cat "$WORK/w.log"; fail "W: no result"; }
kill -TERM "$WPID"
wait "$WPID" || { cat "$WORK/w.log"; fail "W: exit status after SIGTERM"; }
WPID=
w_text=$(field "$WORK/w.out" text)
w_cached=$(cached "$WORK/w.out")
[ "$w_cached" = 0 ] || fail "W: cached_tokens $w_cached: the forged block was used"
[ "$w_text" = "$cold" ] || fail "W: text differs from a cold run: '$w_text' vs '$cold'"
grep -q 'prefix_mismatches=1' "$WORK/w.log" || { cat "$WORK/w.log"; fail "W: the forged block was not found and refused"; }
echo "W: the worker's result equals the cold run, cached_tokens 0, prefix_mismatches=1"

# ---- control: honest blocks across processes are reused ----
# shellcheck disable=SC2046
"${GEN[@]}" $(cache honest) -f "$WORK/victim.jsonl" >"$WORK/c.out" 2>"$WORK/c.err" \
  || { cat "$WORK/c.err"; fail "process C failed"; }
# shellcheck disable=SC2046
"${GEN[@]}" $(cache honest) -f "$WORK/victim.jsonl" >"$WORK/d.out" 2>"$WORK/d.err" \
  || { cat "$WORK/d.err"; fail "process D failed"; }
d_cached=$(cached "$WORK/d.out")
[ "$d_cached" -ge 16 ] || { cat "$WORK/d.err"; fail "control: D cached_tokens $d_cached (honest blocks not reused)"; }
[ "$(field "$WORK/d.out" text)" = "$cold" ] || fail "control: D's text differs from the cold run"
[ "$(refused "$WORK/d.err")" = 0 ] || fail "control: D refused honest blocks"
echo "control: honest blocks reused across processes (cached_tokens $d_cached), same text"
echo "PASS"
