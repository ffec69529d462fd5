# shellcheck shell=bash
# Helpers shared by scripts/kafka-broker.sh, scripts/redis-server.sh and scripts/fleet-bed.sh
# (sourced, not run).
# Throwaway test services: each lives in its own folder, listens on free loopback ports, and is
# identified by PID plus the kernel's start time of that PID, so a recycled PID is never signalled.

svc_die() { echo "${SVC_NAME:-svc}: $*" >&2; exit 1; }
svc_log() { echo "${SVC_NAME:-svc}: $*" >&2; }

# svc_usage: the running script's header comment (its lines 2 up to `set -euo`) on stderr; exit 2.
svc_usage() {
  sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2
  exit 2
}

# Milliseconds since the epoch.
svc_now_ms() { date +%s%3N; }

# svc_since T0_MS: seconds since T0_MS, one decimal.
svc_since() {
  local ms=$(( $(svc_now_ms) - $1 ))
  printf '%d.%d\n' $(( ms / 1000 )) $(( ms % 1000 / 100 ))
}

# svc_abs DIR: DIR as an absolute path (DIR need not exist yet).
svc_abs() { realpath -m -- "$1"; }

# svc_starttime PID: the start time (clock ticks since boot, field 22 of /proc/PID/stat), or
# nothing when PID does not exist or is a zombie.
svc_starttime() {
  local stat rest
  stat=$(cat "/proc/$1/stat" 2>/dev/null) || return 1
  rest=${stat##*) }            # fields 3.. (the command name may hold spaces and parentheses)
  # shellcheck disable=SC2086
  set -- $rest
  [ "$1" != Z ] || return 1
  echo "${20}"
}

# svc_alive PID START: true while that very process (same start time) runs.
svc_alive() {
  local st
  [ -n "$1" ] && [ -n "$2" ] || return 1
  st=$(svc_starttime "$1") || return 1
  [ "$st" = "$2" ]
}

# svc_wait_gone PID START SECONDS: true once the process is gone, false at the deadline.
svc_wait_gone() {
  local deadline=$(( $(svc_now_ms) + $3 * 1000 ))
  while svc_alive "$1" "$2"; do
    [ "$(svc_now_ms)" -lt "$deadline" ] || return 1
    sleep 0.1
  done
}

# svc_terminate PID START SECONDS: SIGTERM, then SIGKILL when still running after SECONDS.
svc_terminate() {
  svc_alive "$1" "$2" || return 0
  kill -TERM "$1" 2>/dev/null || true
  svc_wait_gone "$1" "$2" "$3" && return 0
  svc_log "pid $1 ignored SIGTERM for $3 s: SIGKILL"
  kill -KILL "$1" 2>/dev/null || true
  svc_wait_gone "$1" "$2" 10
}

# svc_port_used PORT: true when any TCP socket (IPv4 or IPv6, any state) has PORT as local port.
svc_port_used() {
  local hex
  hex=$(printf '%04X' "$1")
  awk -v p=":$hex" 'FNR > 1 && substr($2, length($2) - 4) == p { found = 1 } END { exit !found }' \
    /proc/net/tcp /proc/net/tcp6 2>/dev/null
}

# svc_pick_port [EXCLUDED...]: a TCP port no socket uses now, below the kernel's ephemeral range
# (20000-32767), and not one of EXCLUDED. Another process may still take it before we bind: the
# callers detect a failed bind and retry.
# shellcheck disable=SC2120
svc_pick_port() {
  local p x ok
  for _ in $(seq 1 200); do
    p=$(( 20000 + ((RANDOM << 15) | RANDOM) % 12768 ))
    ok=1
    for x in "$@"; do [ "$x" = "$p" ] && ok=0; done
    [ "$ok" = 1 ] && ! svc_port_used "$p" && { echo "$p"; return 0; }
  done
  svc_die "no free loopback port found"
}

# svc_env_get FILE KEY: the value of KEY=VALUE in FILE (empty when absent).
svc_env_get() {
  [ -f "$1" ] || return 0
  sed -n "s/^$2=//p" "$1" | tail -n 1
}

# svc_dir DIR MARKER MAKER: DIR as an absolute path, checked to hold the file MARKER that MAKER
# (e.g. "redis-server.sh start") leaves in the folders it makes.
svc_dir() {
  local dir
  dir=$(svc_abs "$1")
  [ -f "$dir/$2" ] || svc_die "$dir is not a folder made by $3"
  echo "$dir"
}

# svc_stop DIR PID_KEY START_KEY SECONDS: the process DIR/env names (PID_KEY, START_KEY) stopped
# with svc_terminate (SIGKILL after SECONDS), then DIR removed.
svc_stop() {
  local pid start
  pid=$(svc_env_get "$1/env" "$2")
  start=$(svc_env_get "$1/env" "$3")
  svc_terminate "$pid" "$start" "$4" || svc_die "pid $pid would not stop"
  rm -rf -- "$1"
}

# svc_kill DIR PID_KEY START_KEY WHAT: SIGKILL (a crash) of the process DIR/env names, waited for;
# DIR stays. A note, and nothing else, when no WHAT runs there.
svc_kill() {
  local pid start
  pid=$(svc_env_get "$1/env" "$2")
  start=$(svc_env_get "$1/env" "$3")
  if ! svc_alive "$pid" "$start"; then
    svc_log "no $4 running in $1"
    return 0
  fi
  kill -KILL "$pid"
  svc_wait_gone "$pid" "$start" 10 || svc_die "pid $pid still there after SIGKILL"
}

# svc_watchdog OWNER PID START DIR: in the background, stops PID (TERM, then KILL) and removes
# DIR once process OWNER has exited, so a test killed before its cleanup ran leaves nothing
# behind. Exits by itself once PID is gone. Holds none of the caller's file descriptors.
svc_watchdog() {
  local owner=$1 pid=$2 start=$3 dir=$4 owner_start
  [ -n "$owner" ] && [ "$owner" != 0 ] || return 0
  owner_start=$(svc_starttime "$owner") || svc_die "owner process $owner does not exist"
  (
    while svc_alive "$pid" "$start"; do
      if ! svc_alive "$owner" "$owner_start"; then
        svc_terminate "$pid" "$start" 15 || true
        rm -rf -- "$dir"
        exit 0
      fi
      sleep 1
    done
  ) </dev/null >/dev/null 2>&1 &
  disown 2>/dev/null || true
}
