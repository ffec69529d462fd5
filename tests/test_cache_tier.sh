#!/usr/bin/env bash
# Prefix cache tier 2 end to end: `spillway generate` processes sharing a host arena indexed in a
# real redis-server (scripts/redis-server.sh, its own port), on stories260K. Every output is
# compared with the same requests run without any prefix cache (--no-prefix-cache): byte-equal.
#   1. a second process gets the shared prefix from the arena (tier 2 hits, cached_tokens in
#      every result, fewer tokens computed) and produces identical output;
#   2. a process killed with kill -9 after it stored blocks: a restarted one still hits them;
#   3. Redis killed mid-run, and Redis stopped (kill -STOP) mid-run: no crash, identical output,
#      and no stall beyond the configured timeouts;
#   4. a process with another block size on the same arena: the header mismatch is logged and
#      the arena re-initialised, output identical;
#   5. afterwards the index is consistent: every slot free or in the LRU (not both, none lost),
#      every indexed block in a slot of the LRU (tests/test_cache.c checks arena headers too);
#   6. a foreign arena file (a symlink to the arena, a hard link to it, a file of another owner
#      when run as root) is refused: generate still serves, from tier 1 only (0 tier-2 hits),
#      output identical, with an error line naming the refusal; the file is left as it was.
# Arguments (from ctest): the spillway binary and the models folder.
set -euo pipefail
SPILLWAY=$(realpath "$1")
MODEL=$2/stories260K.gguf
ROOT=$(cd "$(dirname "$0")/.." && pwd)
RS=$ROOT/scripts/redis-server.sh
[ -f "$MODEL" ] || { echo "SKIP: $MODEL not found"; exit 77; }
command -v redis-server >/dev/null 2>&1 || { echo "SKIP: redis-server not installed"; exit 77; }

WORK=$(mktemp -d "${TMPDIR:-/tmp}/spillway-cache-tier.XXXXXX")
SHM=$("$ROOT/scripts/shm-dir.sh" spillway-test)
export SPILLWAY_SVC_OWNER=$$
PIDS=()
cleanup() {
  local p
  for p in "${PIDS[@]}"; do kill -CONT "$p" 2>/dev/null || true; kill -9 "$p" 2>/dev/null || true; done
  "$RS" stop "$WORK/redis" >/dev/null 2>&1 || true
  rm -rf "$WORK" "$SHM"
}
trap cleanup EXIT
fail() { echo "FAIL: $*"; exit 1; }

eval "$("$RS" start "$WORK/redis" | grep -E '^(REDIS_PORT|REDIS_PID)=')"
echo "redis on port $REDIS_PORT"
ARENA=$SHM/arena
# a 1 s command timeout: on a loaded machine the 50 ms default turns Redis latency into misses
CACHE=(--cache-redis "127.0.0.1:$REDIS_PORT" --cache-arena "$ARENA" --cache-arena-mb 64 --cache-timeout-ms 1000
       --cache-secret "$SHM/secret")
GEN=("$SPILLWAY" generate -m "$MODEL" -t 0 --ignore-eos --threads 1 --kv-type f32 --kv-mem-mb 32 --stats)

python3 - "$WORK" <<'PY'
import json, sys
work = sys.argv[1]
doc = ("Once upon a time, there was a little girl named Lily. She loved to play outside in the "
       "park. One day, she saw a big, red ball. She wanted to play with it, but it was too high. "
       "Her mom said, \"Let us ask the man for help.\" The man was very kind and gave them the ball. ")
tails = ["Lily", "Her mom", "A bird", "The ball", "She", "Tom", "The man", "They"]
def write(name, n, max_tokens, prefix=doc):
    with open(f"{work}/{name}.jsonl", "w") as f:
        for i in range(n):
            f.write(json.dumps({"id": f"{name}{i}", "prompt": prefix + tails[i % 8] + f" {i}",
                                "max_tokens": max_tokens}) + "\n")
write("small", 8, 24)
write("long", 48, 200)   # long enough to be interrupted
write("other", 8, 24, prefix=doc.replace("Lily", "Sue"))
PY
# text of each id, sorted: the comparable part of generate's output
texts() { python3 -c 'import json,sys; [print(json.dumps([r["id"], r["text"], r["finish_reason"]])) for r in sorted(map(json.loads, open(sys.argv[1])), key=lambda r: r["id"])]' "$1"; }
stat_field() { sed -n "s/.*tier 2 \([0-9]*\) of \([0-9]*\).*/\\$2/p" "$1"; }
n_blk() { redis-cli -p "$REDIS_PORT" --scan --pattern '*:blk' | head -n1 | xargs -r redis-cli -p "$REDIS_PORT" hlen; }

for f in small long other; do
  "${GEN[@]}" --no-prefix-cache -f "$WORK/$f.jsonl" >"$WORK/$f.ref" 2>/dev/null
  texts "$WORK/$f.ref" >"$WORK/$f.ref.txt"
done

# ---- 1. cross-process hit ----
"${GEN[@]}" "${CACHE[@]}" -f "$WORK/small.jsonl" >"$WORK/p1.out" 2>"$WORK/p1.err"
"${GEN[@]}" "${CACHE[@]}" -f "$WORK/small.jsonl" >"$WORK/p2.out" 2>"$WORK/p2.err"
texts "$WORK/p1.out" | cmp -s - "$WORK/small.ref.txt" || fail "process 1 output differs from the uncached run"
texts "$WORK/p2.out" | cmp -s - "$WORK/small.ref.txt" || fail "process 2 output differs from the uncached run"
h1=$(stat_field "$WORK/p1.err" 1); h2=$(stat_field "$WORK/p2.err" 1)
[ "$h1" = 0 ] || fail "process 1 hit tier 2 ($h1) on an empty arena"
[ "${h2:-0}" -gt 0 ] || { cat "$WORK/p2.err"; fail "process 2 got nothing from tier 2"; }
python3 - "$WORK/p1.out" "$WORK/p2.out" <<'PY' || fail "cached_tokens"
import json, sys
p1 = list(map(json.loads, open(sys.argv[1])))
p2 = list(map(json.loads, open(sys.argv[2])))
c1 = sum(r["usage"]["cached_tokens"] for r in p1)
c2 = [r["usage"]["cached_tokens"] for r in p2]
prompt = min(r["usage"]["prompt_tokens"] for r in p2)
print(f"process 1: {c1} cached prompt tokens in all; process 2: {c2} of >= {prompt} each")
assert all(c >= prompt - 32 for c in c2), "process 2: a request computed its shared prefix again"
PY
echo "1. cross-process: process 2 got $h2 blocks from tier 2; output identical"

# ---- 2. kill -9 after storing; the restarted process hits ----
redis-cli -p "$REDIS_PORT" flushall >/dev/null
"${GEN[@]}" "${CACHE[@]}" -f "$WORK/long.jsonl" >/dev/null 2>&1 &
P=$!
PIDS+=("$P")
for _ in $(seq 1 200); do n=$(n_blk || true); [ "${n:-0}" -ge 8 ] && break; sleep 0.05; done
kill -9 "$P" 2>/dev/null || true
wait "$P" 2>/dev/null || true
stored=$(n_blk || echo 0)
[ "${stored:-0}" -ge 1 ] || fail "nothing stored before kill -9"
"${GEN[@]}" "${CACHE[@]}" -f "$WORK/small.jsonl" >"$WORK/p3.out" 2>"$WORK/p3.err"
texts "$WORK/p3.out" | cmp -s - "$WORK/small.ref.txt" || fail "after kill -9: output differs"
h3=$(stat_field "$WORK/p3.err" 1)
[ "${h3:-0}" -gt 0 ] || { cat "$WORK/p3.err"; fail "after kill -9: no tier 2 hit ($stored blocks indexed)"; }
echo "2. kill -9: $stored blocks indexed when killed; the restarted process got $h3 from tier 2"

# ---- 3. Redis killed, Redis stopped, mid-run ----
t0=$(date +%s%3N)
"${GEN[@]}" --no-prefix-cache -f "$WORK/long.jsonl" >/dev/null 2>&1
base_ms=$(( $(date +%s%3N) - t0 ))
t0=$(date +%s%3N)
"${GEN[@]}" "${CACHE[@]}" -f "$WORK/long.jsonl" >"$WORK/p4.out" 2>"$WORK/p4.err" &
P=$!
PIDS+=("$P")
sleep 0.3
kill -STOP "$REDIS_PID"
sleep 2
kill -CONT "$REDIS_PID"
wait "$P" || fail "generate failed while Redis was stopped"
stop_ms=$(( $(date +%s%3N) - t0 ))
texts "$WORK/p4.out" | cmp -s - "$WORK/long.ref.txt" || fail "Redis stopped: output differs"
echo "3a. Redis stopped 2 s mid-run: output identical; ${stop_ms} ms (uncached run ${base_ms} ms)"
# bounded: the stop costs at most its own length plus the timeouts, not a hang
[ "$stop_ms" -lt $(( base_ms * 3 + 10000 )) ] || fail "Redis stopped: run took ${stop_ms} ms"

t0=$(date +%s%3N)
"${GEN[@]}" "${CACHE[@]}" -f "$WORK/long.jsonl" >"$WORK/p5.out" 2>"$WORK/p5.err" &
P=$!
PIDS+=("$P")
sleep 0.3
"$RS" kill "$WORK/redis" >/dev/null
wait "$P" || fail "generate failed when Redis was killed"
kill_ms=$(( $(date +%s%3N) - t0 ))
texts "$WORK/p5.out" | cmp -s - "$WORK/long.ref.txt" || fail "Redis killed: output differs"
echo "3b. Redis killed mid-run: output identical; ${kill_ms} ms"
# Redis down from the start: identical, no stall
t0=$(date +%s%3N)
"${GEN[@]}" "${CACHE[@]}" -f "$WORK/small.jsonl" >"$WORK/p6.out" 2>"$WORK/p6.err" || fail "generate failed with Redis down"
down_ms=$(( $(date +%s%3N) - t0 ))
texts "$WORK/p6.out" | cmp -s - "$WORK/small.ref.txt" || fail "Redis down: output differs"
echo "3c. Redis down from the start: output identical; ${down_ms} ms"
"$RS" stop "$WORK/redis" >/dev/null 2>&1 || true
eval "$("$RS" start "$WORK/redis" | grep -E '^(REDIS_PORT|REDIS_PID)=')"
CACHE=(--cache-redis "127.0.0.1:$REDIS_PORT" --cache-arena "$ARENA" --cache-arena-mb 64 --cache-timeout-ms 1000
       --cache-secret "$SHM/secret")

# ---- 4. another block geometry on the same arena ----
"${GEN[@]}" "${CACHE[@]}" -f "$WORK/other.jsonl" >/dev/null 2>&1
"${GEN[@]}" "${CACHE[@]}" --block-tokens 32 -f "$WORK/other.jsonl" >"$WORK/p7.out" 2>"$WORK/p7.err"
grep -qi "arena.*re-initialis" "$WORK/p7.err" || { cat "$WORK/p7.err"; fail "no re-initialisation line for a mismatched arena"; }
texts "$WORK/p7.out" | cmp -s - "$WORK/other.ref.txt" || fail "mismatched arena: output differs"
h7=$(stat_field "$WORK/p7.err" 1)
[ "${h7:-0}" = 0 ] || fail "mismatched arena: $h7 tier 2 hits (blocks of another geometry)"
echo "4. mismatched arena header: refused and re-initialised ($(grep -i 're-initialis' "$WORK/p7.err" | head -n1 | cut -c1-160))"
# ---- 5. index consistency ----
key=$(redis-cli -p "$REDIS_PORT" --scan --pattern '*:blk' | head -n1)
[ -n "$key" ] || fail "no index in Redis"
base=${key%:blk}
rc() { redis-cli -p "$REDIS_PORT" "$@"; }
python3 - "$(rc hget "$base:meta" n_slots)" "$(rc hvals "$base:blk" | tr '\n' ' ')" \
  "$(rc zrange "$base:lru" 0 -1 | tr '\n' ' ')" "$(rc lrange "$base:free" 0 -1 | tr '\n' ' ')" <<'PY' || fail "index inconsistent"
import sys
n, blk, lru, free = int(sys.argv[1]), sys.argv[2].split(), sys.argv[3].split(), sys.argv[4].split()
lru_s, free_s = set(map(int, lru)), set(map(int, free))
assert len(lru_s) == len(lru) and len(free_s) == len(free), "a slot listed twice"
assert not (lru_s & free_s), "a slot both free and in the LRU"
assert lru_s | free_s == set(range(n)), f"slots lost: {sorted(set(range(n)) - lru_s - free_s)[:10]}"
slots = [int(v.split(":")[0]) for v in blk]
assert len(set(slots)) == len(slots), "two blocks indexed in one slot"
assert set(slots) <= lru_s, "an indexed block in a slot outside the LRU"
print(f"5. index consistent: {n} slots, {len(free)} free, {len(lru)} in the LRU, {len(blk)} blocks indexed")
PY
# ---- 6. foreign arena files: refused, tier 1 only, output identical ----
foreign() { # $1 path, $2 what the log line must say
  local err="$WORK/p8.err"
  "${GEN[@]}" --cache-redis "127.0.0.1:$REDIS_PORT" --cache-arena "$1" --cache-arena-mb 64 \
    --cache-timeout-ms 1000 -f "$WORK/small.jsonl" >"$WORK/p8.out" 2>"$err" \
    || { cat "$err"; fail "generate stopped on a refused arena ($2)"; }
  grep -q "$2.*tier 2 off, serving from tier 1 only" "$err" || { cat "$err"; fail "no refusal line ($2)"; }
  texts "$WORK/p8.out" | cmp -s - "$WORK/small.ref.txt" || fail "refused arena ($2): output differs"
  local h; h=$(stat_field "$err" 1)
  [ "${h:-0}" = 0 ] || fail "refused arena ($2): $h tier 2 hits"
  echo "6. $2: $(grep -o 'arena .*tier 2 off' "$err" | head -n1 | cut -c1-150)"
}
ln -s "$ARENA" "$SHM/symlink"
foreign "$SHM/symlink" "symbolic link"
ln "$ARENA" "$SHM/hardlink"
foreign "$SHM/hardlink" "2 links"
foreign "$ARENA" "2 links"
rm -f "$SHM/hardlink"
if [ "$(id -u)" = 0 ]; then
  : >"$SHM/other"; chmod 600 "$SHM/other"; chown 65534:65534 "$SHM/other"
  foreign "$SHM/other" "owned by uid 65534"
  [ ! -s "$SHM/other" ] || fail "the other user's file was written to"
else
  echo "6. (not root: the other-owner case is skipped)"
fi
echo "PASS"
