#!/usr/bin/env bash
# Integration test of scripts/redis-server.sh: start on a free port, PING/SET/GET, nothing is
# persisted, kill keeps the folder and the server is gone, stop removes the folder, a second
# server gets its own port. Arguments (from ctest: the spillway binary and the models folder) are
# not used. redis-server missing is a failure: scripts/install-deps.sh installs it.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
RS=$ROOT/scripts/redis-server.sh
WORK=$(mktemp -d "${TMPDIR:-/tmp}/spillway-redis-test.XXXXXX")
export SPILLWAY_SVC_OWNER=$$
cleanup() {
  local rc=$?
  "$RS" stop "$WORK/a" || true
  "$RS" stop "$WORK/b" || true
  rm -rf "$WORK"
  exit "$rc"
}
trap cleanup EXIT
fail() { echo "FAIL: $*"; exit 1; }
cli() { timeout 10 redis-cli -h 127.0.0.1 -p "$REDIS_PORT" "$@"; }

t0=$(date +%s%3N)
out=$("$RS" start "$WORK/a")
eval "$out"
echo "redis-server ready on port $REDIS_PORT in $(( $(date +%s%3N) - t0 )) ms"
[ "$(cli ping)" = PONG ] || fail "no PONG"
[ "$(cli set spillway:k v1)" = OK ] || fail "SET failed"
[ "$(cli get spillway:k)" = v1 ] || fail "GET returned something else"
[ "$(cli config get save | sed -n 2p)" = "" ] || fail "RDB snapshots are on"
[ "$(cli config get appendonly | sed -n 2p)" = no ] || fail "AOF is on"
A_PORT=$REDIS_PORT
A_PID=$REDIS_PID

out=$("$RS" start "$WORK/b")
eval "$out"
[ "$REDIS_PORT" != "$A_PORT" ] || fail "two servers on one port"
[ "$(cli get spillway:k)" = "" ] || fail "the second server shares data with the first"

"$RS" kill "$WORK/a"
[ -d "$WORK/a" ] || fail "kill removed the folder"
if timeout 5 redis-cli -h 127.0.0.1 -p "$A_PORT" ping >/dev/null 2>&1; then fail "server a answers after kill"; fi
! kill -0 "$A_PID" 2>/dev/null || [[ $(ps -o stat= -p "$A_PID") == Z* ]] || fail "server a survived kill"
"$RS" stop "$WORK/a"
[ ! -e "$WORK/a" ] || fail "stop left the folder behind"
"$RS" stop "$WORK/b"
[ ! -e "$WORK/b" ] || fail "stop left the folder behind"
if timeout 5 redis-cli -h 127.0.0.1 -p "$REDIS_PORT" ping >/dev/null 2>&1; then fail "server b answers after stop"; fi
ls "$WORK"/*.rdb "$WORK"/*/*.rdb >/dev/null 2>&1 && fail "a dump.rdb was written"
echo "redis harness: all checks passed"
