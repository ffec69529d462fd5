#!/usr/bin/env bash
# A throwaway redis-server for integration tests: a free loopback port, no persistence (no RDB
# snapshots, no AOF), its log and pid in one folder.
#
#   redis-server.sh start DIR   starts it (DIR is created and must not hold a server already) and
#                               returns once it answers PING. Prints REDIS_PORT=<port> and
#                               REDIS_PID=<pid> (also written to DIR/env).
#   redis-server.sh stop DIR    SIGTERM (SIGKILL after 10 s), then removes DIR. No-op when DIR
#                               does not exist.
#   redis-server.sh kill DIR    SIGKILL (a crash); DIR stays.
#
# Environment:
#   SPILLWAY_REDIS_ARGS   extra redis-server options, e.g. "--maxmemory 64mb"
#   SPILLWAY_REDIS_CONF   extra redis.conf lines, written to DIR/redis.conf (mode 0600), so that
#                         secrets stay off the command line, e.g. for a server requiring AUTH:
#                           requirepass s3cret
#                           user alice on >alicepw ~* &* +@all
#                         A server requiring AUTH counts as up when PING answers NOAUTH (or
#                         PONG when REDISCLI_AUTH holds the default user's password).
#   SPILLWAY_SVC_OWNER    a PID (usually the test script's $$): when it exits, a watchdog stops
#                         the server and removes DIR. Unset/0: none.
# Needs redis-server and redis-cli (Debian's redis-server package brings both).
set -euo pipefail
SVC_NAME=redis-server
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=scripts/svc-lib.sh
. "$HERE/svc-lib.sh"
MARKER=.spillway-redis-server

server_dir() { svc_dir "$1" "$MARKER" "redis-server.sh start"; }

cmd_start() {
  local dir port attempt pid start t0 deadline reply
  dir=$(svc_abs "$1")
  [ -e "$dir/$MARKER" ] && svc_die "$dir already holds a server: stop it first"
  if [ -d "$dir" ] && [ -n "$(ls -A "$dir")" ]; then svc_die "$dir is not empty"; fi
  command -v redis-server >/dev/null || svc_die "redis-server not found (scripts/install-deps.sh installs it)"
  command -v redis-cli >/dev/null || svc_die "redis-cli not found"
  mkdir -p "$dir"
  : >"$dir/$MARKER"
  local -a conf=()
  if [ -n "${SPILLWAY_REDIS_CONF:-}" ]; then
    (umask 077 && printf '%s\n' "$SPILLWAY_REDIS_CONF" >"$dir/redis.conf")
    conf=("$dir/redis.conf")
  fi
  for attempt in 1 2 3; do
    port=$(svc_pick_port)
    t0=$(svc_now_ms)
    deadline=$(( t0 + 10000 ))
    # shellcheck disable=SC2086
    (exec redis-server "${conf[@]}" --bind 127.0.0.1 --port "$port" --save '' --appendonly no \
        --dir "$dir" --logfile "$dir/redis.log" --daemonize no ${SPILLWAY_REDIS_ARGS:-}) \
      </dev/null >>"$dir/stdout.log" 2>&1 &
    pid=$!
    disown "$pid" 2>/dev/null || true
    start=$(svc_starttime "$pid") || start=
    while svc_alive "$pid" "$start"; do
      # Up: PONG, or an authentication error from a server that requires AUTH.
      reply=$(timeout 5 redis-cli -h 127.0.0.1 -p "$port" ping 2>/dev/null || true)
      if [ "$reply" = PONG ] || [ "${reply#NOAUTH}" != "$reply" ] ||
         [ "${reply#WRONGPASS}" != "$reply" ]; then
        cat >"$dir/env.tmp" <<EOF
REDIS_PORT=$port
REDIS_PID=$pid
REDIS_PID_START=$start
STARTUP_MS=$(( $(svc_now_ms) - t0 ))
EOF
        mv "$dir/env.tmp" "$dir/env"
        svc_watchdog "${SPILLWAY_SVC_OWNER:-0}" "$pid" "$start" "$dir"
        echo "REDIS_PORT=$port"
        echo "REDIS_PID=$pid"
        return 0
      fi
      if [ "$(svc_now_ms)" -ge "$deadline" ]; then
        kill -KILL "$pid" 2>/dev/null || true
        tail -n 20 "$dir/redis.log" >&2 || true
        svc_die "no PONG within 10 s (killed; files in $dir)"
      fi
      sleep 0.05
    done
    if grep -qs 'Address already in use' "$dir/redis.log" "$dir/stdout.log" && [ "$attempt" -lt 3 ]; then
      svc_log "port $port was taken meanwhile: trying another"
      continue
    fi
    tail -n 20 "$dir/redis.log" "$dir/stdout.log" >&2 || true
    svc_die "redis-server exited during start-up (files in $dir)"
  done
}

cmd_stop() {
  local dir
  [ -e "$1" ] || return 0
  dir=$(server_dir "$1")
  svc_stop "$dir" REDIS_PID REDIS_PID_START 10
}

cmd_kill() {
  local dir
  dir=$(server_dir "$1")
  svc_kill "$dir" REDIS_PID REDIS_PID_START server
}

[ $# = 2 ] || svc_usage
case $1 in
  start) cmd_start "$2" ;;
  stop)  cmd_stop "$2" ;;
  kill)  cmd_kill "$2" ;;
  *) svc_usage ;;
esac
