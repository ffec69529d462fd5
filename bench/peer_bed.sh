#!/usr/bin/env bash
# bench/peer_bed.sh: KV fetched from a peer host against recomputed, ON the multi-host test bed
# (issue 23): bench/bench_peer with host A (--serve) in the bed's host 1 network namespace and
# host B (--peer) in host 2's, so every fetch crosses host 2's veth, the bridge and host 1's veth
# (connect, handshake, encrypted frames), with the bed's Redis on the bridge as the index. For
# prefixes of K blocks it prints fetch and recompute time, the time to the first token with
# each, and the cost model's choice with the rates it learned (see bench/bench_peer.c), then
# appends the table to bench/RESULTS.md with the machine, load and command (unless --no-record).
# The bed's workers are idle (no request is sent). Needs root and the bed's tools.
#
# usage: bench/peer_bed.sh [--build DIR] [--model GGUF] [--blocks 1,2,4,8,16,32,64] [--reps 5]
#                          [--threads 1] [--no-record]
# The default model is the fleet bench's synthetic llama (2,048-token context, so 64 blocks fit),
# written by `spillway mkmodel` under DIR/models when missing.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BUILD=$ROOT/build MODEL="" BLOCKS=1,2,4,8,16,32,64 REPS=5 THREADS=1 RECORD=1
ARGS=("$@")
while [ $# -gt 0 ]; do
  case $1 in
    --build) BUILD=$(realpath "$2"); shift 2 ;;
    --model) MODEL=$(realpath "$2"); shift 2 ;;
    --blocks) BLOCKS=$2; shift 2 ;;
    --reps) REPS=$2; shift 2 ;;
    --threads) THREADS=$2; shift 2 ;;
    --no-record) RECORD=0; shift ;;
    *) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2; exit 2 ;;
  esac
done
[ "$(id -u)" = 0 ] || { echo "peer_bed.sh: needs root (the test bed)" >&2; exit 1; }
SW=$BUILD/spillway BP=$BUILD/bench_peer
[ -x "$SW" ] && [ -x "$BP" ] || { echo "peer_bed.sh: no $SW or $BP (build first)" >&2; exit 1; }
if [ -z "$MODEL" ]; then
  MODEL=$BUILD/models/fleet-bench.gguf
  if [ ! -f "$MODEL" ]; then
    mkdir -p "$BUILD/models"
    "$SW" mkmodel -o "$MODEL" --preset tiny --vocab-from "$ROOT/models/stories260K.gguf" \
      --ctx 2048 --dim 128 --layers 4 --heads 4 --kv-heads 2 --ffn 256 >/dev/null
  fi
fi
FB=$ROOT/scripts/fleet-bed.sh
WORK=$(mktemp -d "${TMPDIR:-/tmp}/spillway-peer-bed.XXXXXX")
BED=$WORK/bed
SRV_PID=""
cleanup() {
  [ -n "$SRV_PID" ] && kill "$SRV_PID" 2>/dev/null && wait "$SRV_PID" 2>/dev/null
  "$FB" down "$BED" >/dev/null 2>&1 || true
  rm -rf "$WORK"
}
trap cleanup EXIT
export SPILLWAY_SVC_OWNER=$$

echo "[peer_bed] bed up (2 hosts)" >&2
"$FB" up "$BED" -m "$MODEL" --spillway "$SW" --hosts 2 --workers 1 >"$WORK/up.log" 2>&1 ||
  { cat "$WORK/up.log" >&2; exit 1; }
eval "$("$FB" env "$BED" | grep -E '^(NET|REDIS_HOST|REDIS_PORT)=')"
LISTEN=$NET.11:7171
# host A: its stdin a FIFO this script holds open; closing it ends A
mkfifo "$WORK/a.in"
"$FB" exec "$BED" 1 "$BP" "$MODEL" --redis "$REDIS_HOST:$REDIS_PORT" --threads "$THREADS" \
  --reps "$REPS" --blocks "$BLOCKS" --serve "$LISTEN" <"$WORK/a.in" >"$WORK/a.out" 2>"$WORK/a.err" &
SRV_PID=$!
exec 3>"$WORK/a.in"
for _ in $(seq 1 600); do
  grep -q '^ready ' "$WORK/a.out" 2>/dev/null && break
  kill -0 "$SRV_PID" 2>/dev/null || { cat "$WORK/a.err" >&2; echo "peer_bed.sh: host A failed" >&2; exit 1; }
  sleep 0.5
done
grep -q '^ready ' "$WORK/a.out" || { echo "peer_bed.sh: host A not ready after 300 s" >&2; exit 1; }
echo "[peer_bed] host A serves on $LISTEN (netns of host 1); host B measures (host 2)" >&2
"$FB" exec "$BED" 2 "$BP" "$MODEL" --redis "$REDIS_HOST:$REDIS_PORT" --threads "$THREADS" \
  --reps "$REPS" --blocks "$BLOCKS" --peer "$LISTEN" >"$WORK/b.out" 2>"$WORK/b.err" ||
  { cat "$WORK/b.err" >&2; echo "peer_bed.sh: host B failed" >&2; exit 1; }
exec 3>&-
wait "$SRV_PID" || true
SRV_PID=""
cat "$WORK/b.out"
[ "$RECORD" = 1 ] || exit 0
{
  printf '\n## KV fetched from a peer host vs recomputed, on the test bed (issue 23), %s\n\n' \
    "$(date -u '+%Y-%m-%d %H:%M UTC')"
  cmdline=bench/peer_bed.sh
  for a in "${ARGS[@]}"; do cmdline+=" $(printf '%q' "$a")"; done
  printf '`%s` at %s; %s, %s cores, load average %s at the end (the machine is shared); ' \
    "$cmdline" "$(git -C "$ROOT" rev-parse --short HEAD)" \
    "$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')" "$(nproc)" \
    "$(cut -d' ' -f1-3 /proc/loadavg)"
  printf 'host A (serving) in the network namespace of bed host 1, host B (fetching, recomputing) in host 2'"'"'s, through veth pairs and a bridge; the bed'"'"'s 2 workers idle; model %s.\n\n' \
    "$(basename "$MODEL")"
  cat "$WORK/b.out"
} >>"$ROOT/bench/RESULTS.md"
echo "[peer_bed] appended to bench/RESULTS.md" >&2
