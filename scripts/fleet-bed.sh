#!/usr/bin/env bash
# A multi-host test bed on one machine (issue 23): each "host" is a network namespace with its
# own address, its own host arena (a file in its own /dev/shm folder, its own cache.host_id) and
# N `spillway worker` processes of one consumer group; one Kafka broker and one Redis listen on
# the address of a bridge that links the hosts, so every namespace reaches them. Needs root
# (ip netns, veth, bridge), java/mvn/kcat (scripts/kafka-broker.sh), redis-server and curl.
#
#   fleet-bed.sh up DIR -m MODEL [options]
#       Builds a bed whose files live in DIR (created; must be empty): a bridge, one namespace
#       per host joined to it by a veth pair, the broker and Redis, the topics, then the workers.
#       Returns once every worker answers /healthz and the group has assigned every input
#       partition (unless --no-wait). Prints the bed's settings (as `env` does). On any failure
#       it takes down what it built and exits 1.
#         --hosts N          hosts (default 3, at most 200)
#         --workers N        workers per host (default 1)
#         --partitions N     partitions of the input and result topics (default 2 x workers)
#         --topic NAME:N     one more topic of N partitions (repeatable), e.g. a forwarding topic;
#                            when -s forward.topic=NAME names one, the workers consume it too and
#                            `wait` counts its partitions with the input topic's
#         --arena-mb N       each host's arena, cache.arena.mb (default 64)
#         --threads N        each worker's compute threads (default 1)
#         --host-cpus F      each host's CPU limit in cores (e.g. 0.6), a CFS quota on a cgroup
#                            of the host's workers (cgroup v1 cpu controller, or v2 with cpu
#                            enabled at the root), so a busy host cannot take the others' CPU
#                            as a separate machine could not (default: none)
#         --exactly-once     the workers' delivery = exactly-once
#         --spillway BIN     the binary (default build/spillway of this checkout)
#         -s KEY=V, -X PROP=V, -c FILE
#                            passed to every worker after the bed's own settings (so they win);
#                            kept in DIR and used again whenever a worker (re)starts. In -s and
#                            -X values, {host_ip}, {host_id} (h<H>) and {worker_id} (h<H>w<W>)
#                            become the worker's own, for per-host settings, e.g.
#                            -s cache.peer.listen={host_ip}:7070
#         --no-wait          return once the processes are started
#   fleet-bed.sh down DIR [--keep]
#       Always cleans up, also after a failed or interrupted `up` and when some parts are already
#       gone: SIGTERM then SIGKILL to every process in the bed's namespaces, the namespaces, the
#       veth pairs and the bridge, the broker and Redis, the /dev/shm folder, and DIR (--keep:
#       DIR's logs stay). A no-op when DIR does not exist.
#   fleet-bed.sh status DIR        hosts (address, link), workers (pid, alive, assigned partitions)
#   fleet-bed.sh env DIR           BED_ID, BOOTSTRAP, REDIS_HOST, REDIS_PORT, HOSTS, ... (for eval)
#   fleet-bed.sh wait DIR [S]      waits (default 120 s) until every running worker answers and
#                                  the input partitions (and the forward topic's) are all assigned
#   fleet-bed.sh exec DIR HOST CMD...   runs CMD in host HOST's namespace (HOST: 1..N)
# Faults:
#   fleet-bed.sh cut DIR HOST [drop|down]
#       Cuts HOST off the network: drop (default) disables its bridge port, so its packets vanish
#       silently (connections time out, as across a partitioned network); down takes its veth
#       link down (connections fail at once).
#   fleet-bed.sh restore DIR HOST  undoes cut
#   fleet-bed.sh kill DIR HOST W [SIG]   signal (default KILL) to worker W (0..workers-1) of HOST
#   fleet-bed.sh stop DIR HOST W         SIGTERM to that worker and waits for it (drain)
#   fleet-bed.sh start DIR HOST W        starts that worker again (no-op when it runs)
#   fleet-bed.sh move DIR HOST W [S]     stop, S seconds (default 0), start: its partitions move
#                                        to the others and the group rebalances again on return
#
# Names: a bed draws a 4-hex-digit id no other bed holds (under a lock): bridge swb<ID>, veth
# swb<ID>h<H> (the host's end is eth0 in its namespace), namespaces swb<ID>-h<H>, a free
# 10.x.y.0/24 (bridge .1, host H .(10+H)), /dev/shm/spillway-fleet-<ID>. Workers are named
# h<H>w<W> (worker.id, hence the exactly-once transactional id), cache.host_id h<H>, metrics on
# port 9100+W of the host's address, cgroup spillway-fleet-<ID>/h<H> (--host-cpus). Topics:
# prompts, results, prompts.dlq; group fleet.
#
# Environment:
#   SPILLWAY_SVC_OWNER   a PID (usually a test script's $$): when it exits, a watchdog runs
#                        `down` for the bed (and the broker's and Redis' own watchdogs stop them),
#                        so a test killed before its cleanup leaves nothing behind. Unset/0: none.
set -euo pipefail
SVC_NAME=fleet-bed
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=scripts/svc-lib.sh
. "$HERE/svc-lib.sh"
KB=$HERE/kafka-broker.sh
RS=$HERE/redis-server.sh
MARKER=.spillway-fleet-bed
LOCK=${TMPDIR:-/tmp}/spillway-fleet-bed.lock

# ---------------------------------------------------------------- state

# bed_dir DIR: DIR as an absolute path, checked to be a bed's.
bed_dir() { svc_dir "$1" "$MARKER" "fleet-bed.sh up"; }

# load DIR: reads DIR/env (written by up with declare -p, so sourcing it is safe).
load() {
  DIR=$(bed_dir "$1")
  [ -f "$DIR/env" ] || svc_die "$DIR has no env file"
  HOST_CPUS= CGROUP= CONSUMED=
  # shellcheck disable=SC1091
  . "$DIR/env"
  CONSUMED=${CONSUMED:-$PARTITIONS}
  EXTRA=()
  # shellcheck disable=SC1091
  [ -f "$DIR/worker.args" ] && . "$DIR/worker.args"
  return 0
}

ns_name() { echo "swb$BED_ID-h$1"; }
veth_name() { echo "swb${BED_ID}h$1"; }
host_ip() { echo "$NET.$(( 10 + $1 ))"; }

check_host() {
  case $1 in ''|*[!0-9]*) svc_die "HOST must be a number 1..$HOSTS" ;; esac
  [ "$1" -ge 1 ] && [ "$1" -le "$HOSTS" ] || svc_die "HOST must be 1..$HOSTS"
}
check_worker() {
  case $1 in ''|*[!0-9]*) svc_die "W must be a number 0..$(( WORKERS - 1 ))" ;; esac
  [ "$1" -lt "$WORKERS" ] || svc_die "W must be 0..$(( WORKERS - 1 ))"
}

# ip2int A.B.C.D
ip2int() {
  local IFS=.
  # shellcheck disable=SC2086
  set -- $1
  echo $(( ($1 << 24) | ($2 << 16) | ($3 << 8) | $4 ))
}

# net_free NET: true when NET.0/24 overlaps no address or route of this machine's namespace.
net_free() {
  local lo hi d base len b e
  lo=$(ip2int "$1.0")
  hi=$(( lo + 255 ))
  while read -r d; do
    [ -n "$d" ] || continue
    [ "$d" = default ] && continue
    base=${d%/*}
    len=32
    [ "$d" != "$base" ] && len=${d#*/}
    [[ $base =~ ^[0-9]+\.[0-9]+\.[0-9]+\.[0-9]+$ ]] || continue
    b=$(ip2int "$base")
    b=$(( b & ~((1 << (32 - len)) - 1) & 0xffffffff ))
    e=$(( b + (1 << (32 - len)) - 1 ))
    [ "$e" -lt "$lo" ] || [ "$b" -gt "$hi" ] || return 1
  done < <({ ip -4 route show table all | awk '{print ($1 == "local" || $1 == "broadcast" || $1 == "unicast") ? $2 : $1}'
             ip -4 -o addr show | awk '{print $4}'; })
  return 0
}

# cpu_cgroup_root: the folder whose sub-folders are cpu cgroups (v1 controller mount, or the v2
# root with the cpu controller enabled for its children); nothing when there is none.
cpu_cgroup_root() {
  if [ -f /sys/fs/cgroup/cpu/cpu.cfs_period_us ] || [ -f /sys/fs/cgroup/cpu/cgroup.procs ]; then
    echo /sys/fs/cgroup/cpu
  elif grep -qw cpu /sys/fs/cgroup/cgroup.subtree_control 2>/dev/null; then
    echo /sys/fs/cgroup
  fi
}

# make_host_cgroup H: the host's cgroup with its CPU quota (HOST_CPUS cores).
make_host_cgroup() {
  local cg=$CGROUP/h$1 quota
  quota=$(awk -v c="$HOST_CPUS" 'BEGIN { printf "%d", c * 100000 }')
  mkdir -p "$cg"
  if [ -f "$cg/cpu.max" ]; then
    echo "$quota 100000" >"$cg/cpu.max"
  else
    echo 100000 >"$cg/cpu.cfs_period_us"
    echo "$quota" >"$cg/cpu.cfs_quota_us"
  fi
}

# ---------------------------------------------------------------- workers

# worker_pid H W: prints "PID START" of the worker's last start (nothing when never started).
worker_pid() { cat "$DIR/hosts/h$1/w$2.pid" 2>/dev/null || true; }

worker_alive() {
  local p
  p=$(worker_pid "$1" "$2")
  # shellcheck disable=SC2086
  [ -n "$p" ] && svc_alive $p
}

start_worker() {
  local h=$1 w=$2 ns hd pid start
  worker_alive "$h" "$w" && return 0
  ns=$(ns_name "$h")
  hd=$DIR/hosts/h$h
  local -a cmd=("$SPILLWAY" worker -b "$BOOTSTRAP" -t prompts -o results -d prompts.dlq -g fleet
                -m "$MODEL" -i "h${h}w$w"
                -s "threads=$THREADS"
                -s "cache.redis.host=$REDIS_HOST" -s "cache.redis.port=$REDIS_PORT"
                -s "cache.host_id=h$h" -s "cache.arena.path=$SHM/h$h/spillway.arena"
                -s "cache.arena.mb=$ARENA_MB" -s "cache.secret_file=$SHM/h$h/spillway.secret"
                -s "metrics.port=$(( 9100 + w ))" -s "metrics.bind=$(host_ip "$h")")
  [ "$EOS" = 1 ] && cmd+=(--exactly-once)
  local a hip
  hip=$(host_ip "$h")
  for a in "${EXTRA[@]}"; do
    a=${a//\{host_ip\}/$hip}
    a=${a//\{host_id\}/h$h}
    cmd+=("${a//\{worker_id\}/h${h}w$w}")
  done
  echo "=== start $(date -u +%FT%T.%3NZ): ${cmd[*]}" >>"$hd/w$w.log"
  # in the host's cgroup (when there is one) before exec, so no thread starts outside it
  (if [ -n "$CGROUP" ]; then echo "$BASHPID" >"$CGROUP/h$h/cgroup.procs"; fi
   exec ip netns exec "$ns" "${cmd[@]}") </dev/null >>"$hd/w$w.log" 2>&1 &
  pid=$!
  disown "$pid" 2>/dev/null || true
  start=$(svc_starttime "$pid") || svc_die "worker h${h}w$w exited at once (log: $hd/w$w.log)"
  echo "$pid $start" >"$hd/w$w.pid"
}

stop_worker() {
  local p
  p=$(worker_pid "$1" "$2")
  [ -n "$p" ] || return 0
  # shellcheck disable=SC2086
  svc_terminate $p 60 || svc_die "worker h$1w$2 would not stop"
}

# metric H W NAME: the value of an unlabelled metric of that worker (nothing when unreachable).
metric() {
  { curl -s -m 2 "http://$(host_ip "$1"):$(( 9100 + $2 ))/metrics" 2>/dev/null || true; } |
    awk -v n="$3" '$1 == n { print $2; exit }'
}

# ---------------------------------------------------------------- commands

cmd_env() {
  load "$1"
  printf 'BED_ID=%s\nBED_DIR=%s\nBOOTSTRAP=%s\nREDIS_HOST=%s\nREDIS_PORT=%s\nHOSTS=%s\n' \
    "$BED_ID" "$DIR" "$BOOTSTRAP" "$REDIS_HOST" "$REDIS_PORT" "$HOSTS"
  printf 'WORKERS=%s\nPARTITIONS=%s\nCONSUMED=%s\nNET=%s\nBRIDGE=%s\nSHM=%s\nHOST_CPUS=%s\n' \
    "$WORKERS" "$PARTITIONS" "$CONSUMED" "$NET" "swb$BED_ID" "$SHM" "$HOST_CPUS"
}

cmd_status() {
  local h w p alive parts link state
  load "$1"
  echo "bed $BED_ID in $DIR: $HOSTS host(s) x $WORKERS worker(s), $PARTITIONS partition(s)"
  echo "broker $BOOTSTRAP, redis $REDIS_HOST:$REDIS_PORT${HOST_CPUS:+, $HOST_CPUS CPU per host}"
  for h in $(seq 1 "$HOSTS"); do
    link=ok
    if [ -f "$DIR/hosts/h$h/cut" ]; then link="cut ($(cat "$DIR/hosts/h$h/cut"))"; fi
    state=$(ip -o link show dev "$(veth_name "$h")" 2>/dev/null | grep -o 'state [A-Z]*' || echo 'state GONE')
    echo "host $h: netns $(ns_name "$h"), $(host_ip "$h"), link $link, $state"
    for w in $(seq 0 $(( WORKERS - 1 ))); do
      p=$(worker_pid "$h" "$w")
      alive=dead
      worker_alive "$h" "$w" && alive=running
      parts=$(metric "$h" "$w" spillway:partitions_assigned)
      echo "  worker h${h}w$w: pid ${p%% *} $alive, partitions ${parts:-?}"
    done
  done
}

# assigned_total: the sum of partitions_assigned over the workers that run; prints it, and
# fails when a running worker does not answer or, with at least as many partitions as running
# workers, has none (its join is not over).
assigned_total() {
  local h w n total=0 running=0 idle=0
  for h in $(seq 1 "$HOSTS"); do
    for w in $(seq 0 $(( WORKERS - 1 ))); do
      worker_alive "$h" "$w" || continue
      n=$(metric "$h" "$w" spillway:partitions_assigned)
      [ -n "$n" ] || return 1
      running=$(( running + 1 ))
      [ "${n%.*}" = 0 ] && idle=$(( idle + 1 ))
      total=$(( total + ${n%.*} ))
    done
  done
  [ "$idle" = 0 ] || [ "$PARTITIONS" -lt "$running" ] || return 1
  echo "$total"
}

cmd_wait() {
  local secs=${2:-120} deadline n h w
  load "$1"
  deadline=$(( $(svc_now_ms) + secs * 1000 ))
  while :; do
    if [ "${WAIT_ALL:-0}" = 1 ]; then
      for h in $(seq 1 "$HOSTS"); do
        for w in $(seq 0 $(( WORKERS - 1 ))); do
          worker_alive "$h" "$w" ||
            { tail -n 5 "$DIR/hosts/h$h/w$w.log" >&2; svc_die "worker h${h}w$w exited"; }
        done
      done
    fi
    # the consumed topics' partitions (the results topic is not consumed)
    n=$(assigned_total || true)
    [ "$n" = "$CONSUMED" ] && return 0
    if [ "$(svc_now_ms)" -ge "$deadline" ]; then
      cmd_status "$1" >&2 || true
      svc_die "the group has not assigned all $CONSUMED partitions within $secs s (now: ${n:-no answer})"
    fi
    sleep 0.5
  done
}

cmd_up() {
  local dir=$1 i h w id net
  shift
  dir=$(svc_abs "$dir")
  [ -e "$dir/$MARKER" ] && svc_die "$dir already holds a bed: take it down first"
  if [ -d "$dir" ] && [ -n "$(ls -A "$dir")" ]; then svc_die "$dir is not empty"; fi
  HOSTS=3 WORKERS=1 PARTITIONS= ARENA_MB=64 THREADS=1 EOS=0 MODEL= SPILLWAY= HOST_CPUS= CGROUP=
  local wait=1
  local -a topics=()
  EXTRA=()
  while [ $# -gt 0 ]; do
    case $1 in
      --hosts) HOSTS=$2; shift 2 ;;
      --workers) WORKERS=$2; shift 2 ;;
      --partitions) PARTITIONS=$2; shift 2 ;;
      --topic) topics+=("$2"); shift 2 ;;
      --arena-mb) ARENA_MB=$2; shift 2 ;;
      --threads) THREADS=$2; shift 2 ;;
      --host-cpus) HOST_CPUS=$2; shift 2 ;;
      --exactly-once) EOS=1; shift ;;
      --spillway) SPILLWAY=$2; shift 2 ;;
      -m|--model) MODEL=$2; shift 2 ;;
      -s|-X) EXTRA+=("$1" "$2"); shift 2 ;;
      -c) [ -f "$2" ] || svc_die "config file $2 not found"
          EXTRA+=(-c "$(svc_abs "$2")"); shift 2 ;;
      --no-wait) wait=0; shift ;;
      *) svc_die "unknown option $1 (see fleet-bed.sh --help)" ;;
    esac
  done
  for i in "$HOSTS" "$WORKERS" "$ARENA_MB" "$THREADS" ${PARTITIONS:+"$PARTITIONS"}; do
    case $i in ''|*[!0-9]*|0) svc_die "--hosts, --workers, --partitions, --arena-mb, --threads: positive numbers" ;; esac
  done
  [ "$HOSTS" -le 200 ] || svc_die "--hosts: at most 200"
  if [ -n "$HOST_CPUS" ]; then
    [[ $HOST_CPUS =~ ^[0-9]*\.?[0-9]+$ ]] && awk -v c="$HOST_CPUS" 'BEGIN { exit !(c >= 0.01) }' ||
      svc_die "--host-cpus: a number of cores >= 0.01"
    [ -n "$(cpu_cgroup_root)" ] || svc_die "--host-cpus: no cpu cgroup controller found"
  fi
  PARTITIONS=${PARTITIONS:-$(( 2 * WORKERS * HOSTS ))}
  for i in "${topics[@]}"; do
    [[ $i =~ ^[A-Za-z0-9._-]+:[0-9]+$ ]] || svc_die "--topic NAME:PARTITIONS, not '$i'"
  done
  # the partitions the group consumes: the input topic's, and the forward topic's when a -s
  # names one of the --topic topics (every worker subscribes to forward.topic)
  CONSUMED=$PARTITIONS
  local fwd="" j
  for (( j = 0; j + 1 < ${#EXTRA[@]}; j++ )); do
    [ "${EXTRA[j]}" = -s ] && [[ ${EXTRA[j + 1]} == forward.topic=* ]] && fwd=${EXTRA[j + 1]#forward.topic=}
  done
  for i in "${topics[@]}"; do
    [ -n "$fwd" ] && [ "${i%:*}" = "$fwd" ] && CONSUMED=$(( CONSUMED + ${i##*:} ))
  done
  [ -n "$MODEL" ] || svc_die "-m MODEL is required"
  [ -f "$MODEL" ] || svc_die "model $MODEL not found"
  MODEL=$(svc_abs "$MODEL")
  SPILLWAY=$(svc_abs "${SPILLWAY:-$HERE/../build/spillway}")
  [ -x "$SPILLWAY" ] || svc_die "$SPILLWAY is not an executable (--spillway BIN)"
  [ "$(id -u)" = 0 ] || svc_die "needs root (ip netns, veth, bridge)"
  ip netns list >/dev/null 2>&1 || svc_die "ip netns does not work here"
  command -v curl >/dev/null || svc_die "curl not found"

  mkdir -p "$dir"
  : >"$dir/$MARKER"
  DIR=$dir
  # From here on, any failure takes down what was built.
  trap 'rc=$?; if [ "$rc" != 0 ]; then svc_log "up failed: taking the bed down"; cmd_down "$DIR" >&2 || true; fi; exit "$rc"' EXIT
  trap 'exit 130' INT TERM HUP

  # The id and the subnet are drawn, and the bridge made, under a lock so that two beds
  # starting at once never pick the same.
  exec 8>"$LOCK"
  flock -w 60 8 || svc_die "timed out waiting for $LOCK"
  id= net=
  for i in $(seq 1 100); do
    id=$(printf '%04x' $(( RANDOM % 65536 )))
    ip link show "swb$id" >/dev/null 2>&1 && continue
    ip netns list | grep -q "^swb$id-" && continue
    [ -e "/dev/shm/spillway-fleet-$id" ] && continue
    break
  done
  for i in $(seq 1 200); do
    net=10.$(( 200 + RANDOM % 50 )).$(( RANDOM % 256 ))
    net_free "$net" && break
    net=
  done
  [ -n "$net" ] || svc_die "no free 10.x.y.0/24 found"
  BED_ID=$id NET=$net
  REDIS_HOST=$net.1 SHM=/dev/shm/spillway-fleet-$id BOOTSTRAP= REDIS_PORT=
  [ -n "$HOST_CPUS" ] && CGROUP=$(cpu_cgroup_root)/spillway-fleet-$id
  save_env
  ip link add "swb$id" type bridge
  ip addr add "$net.1/24" dev "swb$id"
  ip link set "swb$id" up
  exec 8>&-

  for h in $(seq 1 "$HOSTS"); do
    local ns veth
    ns=$(ns_name "$h")
    veth=$(veth_name "$h")
    ip netns add "$ns"
    ip link add "$veth" type veth peer name "${veth}p"
    ip link set "${veth}p" netns "$ns"
    ip -n "$ns" link set "${veth}p" name eth0
    ip -n "$ns" addr add "$(host_ip "$h")/24" dev eth0
    ip -n "$ns" link set lo up
    ip -n "$ns" link set eth0 up
    ip link set "$veth" master "swb$id"
    ip link set "$veth" up
    mkdir -p "$DIR/hosts/h$h"
    [ -n "$CGROUP" ] && make_host_cgroup "$h"
  done

  # One deployment secret, a copy on each host (what a real fleet distributes).
  mkdir -p -m 0700 "$SHM"
  (umask 077 && head -c 32 /dev/urandom >"$DIR/spillway.secret")
  for h in $(seq 1 "$HOSTS"); do
    mkdir -p -m 0700 "$SHM/h$h"
    install -m 0600 "$DIR/spillway.secret" "$SHM/h$h/spillway.secret"
  done

  svc_log "bed $id: $HOSTS host(s) on $net.0/24, starting the broker and Redis"
  local out
  out=$(SPILLWAY_KAFKA_HOST=$net.1 "$KB" start "$DIR/broker") || svc_die "the broker did not start"
  BOOTSTRAP=$(sed -n 's/^BOOTSTRAP=//p' <<<"$out")
  out=$(SPILLWAY_REDIS_ARGS="--bind 127.0.0.1 $net.1 --protected-mode no ${SPILLWAY_REDIS_ARGS:-}" \
        "$RS" start "$DIR/redis") || svc_die "Redis did not start"
  REDIS_PORT=$(sed -n 's/^REDIS_PORT=//p' <<<"$out")
  save_env
  "$KB" topic "$DIR/broker" prompts "$PARTITIONS"
  "$KB" topic "$DIR/broker" results "$PARTITIONS"
  "$KB" topic "$DIR/broker" prompts.dlq 1
  for i in "${topics[@]}"; do "$KB" topic "$DIR/broker" "${i%:*}" "${i##*:}"; done
  start_watchdog

  for h in $(seq 1 "$HOSTS"); do
    for w in $(seq 0 $(( WORKERS - 1 ))); do start_worker "$h" "$w"; done
  done
  [ "$wait" = 1 ] && WAIT_ALL=1 cmd_wait "$DIR" 120
  trap - EXIT INT TERM HUP
  svc_log "bed $id is up"
  cmd_env "$DIR"
}

# save_env: DIR/env and DIR/worker.args from the variables (declare -p quotes every value).
save_env() {
  {
    declare -p BED_ID NET HOSTS WORKERS PARTITIONS CONSUMED ARENA_MB THREADS EOS MODEL SPILLWAY
    declare -p HOST_CPUS CGROUP
    declare -p BOOTSTRAP REDIS_HOST REDIS_PORT SHM
  } | sed 's/^declare -[a-z-]* /declare -g /' >"$DIR/env.tmp"
  mv "$DIR/env.tmp" "$DIR/env"
  declare -p EXTRA | sed 's/^declare -a /declare -ga /' >"$DIR/worker.args"
}

# start_watchdog: with SPILLWAY_SVC_OWNER, a background loop that takes the bed down once that
# process has exited (and exits by itself once the bed is gone).
start_watchdog() {
  local owner=${SPILLWAY_SVC_OWNER:-0} owner_start
  [ "$owner" != 0 ] || return 0
  owner_start=$(svc_starttime "$owner") || svc_die "owner process $owner does not exist"
  (
    while [ -f "$DIR/$MARKER" ]; do
      if ! svc_alive "$owner" "$owner_start"; then
        "$0" down "$DIR" >/dev/null 2>&1 || true
        exit 0
      fi
      sleep 1
    done
  ) </dev/null >/dev/null 2>&1 &
  disown 2>/dev/null || true
}

cmd_down() {
  local dir=$1 keep=${2:-} ns p pids link d
  dir=$(svc_abs "$dir")
  [ -e "$dir" ] || return 0
  [ -f "$dir/$MARKER" ] || svc_die "$dir is not a folder made by fleet-bed.sh up"
  BED_ID= SHM= CGROUP=
  # shellcheck disable=SC1091
  [ -f "$dir/env" ] && . "$dir/env"
  set +e
  if [ -n "$BED_ID" ]; then
    # Every process of the bed's namespaces: SIGTERM, 10 s, then SIGKILL.
    for ns in $(ip netns list | awk '{print $1}' | grep "^swb$BED_ID-h"); do
      pids+=" $(ip netns pids "$ns" 2>/dev/null | tr '\n' ' ')"
    done
    # shellcheck disable=SC2086
    [ -n "${pids// /}" ] && kill -TERM $pids 2>/dev/null
    for _ in $(seq 1 100); do
      local any=0
      for p in $pids; do [ -d "/proc/$p" ] && [ "$(svc_starttime "$p")" ] && any=1; done
      [ "$any" = 0 ] && break
      sleep 0.1
    done
    # shellcheck disable=SC2086
    [ -n "${pids// /}" ] && kill -KILL $pids 2>/dev/null
    for ns in $(ip netns list | awk '{print $1}' | grep "^swb$BED_ID-h"); do
      ip netns pids "$ns" 2>/dev/null | xargs -r kill -KILL 2>/dev/null
      ip netns del "$ns"
    done
    for link in $(ip -o link show 2>/dev/null | awk -F': ' '{print $2}' | sed 's/@.*//' | grep "^swb${BED_ID}h"); do
      ip link del "$link" 2>/dev/null
    done
    ip link show "swb$BED_ID" >/dev/null 2>&1 && ip link del "swb$BED_ID"
  fi
  [ -d "$dir/broker" ] && "$KB" stop "$dir/broker" >/dev/null 2>&1
  [ -d "$dir/redis" ] && "$RS" stop "$dir/redis" >/dev/null 2>&1
  [[ $SHM == /dev/shm/spillway-fleet-* ]] && rm -rf -- "$SHM"
  if [[ $CGROUP == */spillway-fleet-* ]] && [ -d "$CGROUP" ]; then
    for d in "$CGROUP"/h*; do [ -d "$d" ] && rmdir "$d"; done
    rmdir "$CGROUP"
  fi
  if [ "$keep" = --keep ]; then
    rm -f "$dir/$MARKER" "$dir/spillway.secret"
    svc_log "bed ${BED_ID:-?} down; logs kept in $dir"
  else
    rm -rf -- "$dir"
    svc_log "bed ${BED_ID:-?} down"
  fi
  set -e
  return 0
}

cmd_cut() {
  load "$1"
  check_host "$2"
  local mode=${3:-drop} veth
  veth=$(veth_name "$2")
  case $mode in
    drop) bridge link set dev "$veth" state 0 ;;
    down) ip link set dev "$veth" down ;;
    *) svc_die "cut mode: drop or down" ;;
  esac
  echo "$mode" >"$DIR/hosts/h$2/cut"
  svc_log "host $2 cut off ($mode)"
}

cmd_restore() {
  load "$1"
  check_host "$2"
  local veth
  veth=$(veth_name "$2")
  ip link set dev "$veth" up
  bridge link set dev "$veth" state 3
  rm -f "$DIR/hosts/h$2/cut"
  svc_log "host $2 restored"
}

cmd_kill() {
  load "$1"
  check_host "$2"
  check_worker "$3"
  local p sig=${4:-KILL}
  p=$(worker_pid "$2" "$3")
  if ! worker_alive "$2" "$3"; then svc_log "worker h$2w$3 is not running"; return 0; fi
  kill -s "$sig" "${p%% *}"
  if [ "$sig" = KILL ] || [ "$sig" = 9 ]; then
    # shellcheck disable=SC2086
    svc_wait_gone $p 10 || svc_die "worker h$2w$3 still there after SIGKILL"
  fi
  svc_log "worker h$2w$3 (pid ${p%% *}): SIG$sig"
}

cmd_stop() { load "$1"; check_host "$2"; check_worker "$3"; stop_worker "$2" "$3"; svc_log "worker h$2w$3 stopped"; }
cmd_start() { load "$1"; check_host "$2"; check_worker "$3"; start_worker "$2" "$3"; svc_log "worker h$2w$3 started"; }

cmd_move() {
  load "$1"
  check_host "$2"
  check_worker "$3"
  stop_worker "$2" "$3"
  svc_log "worker h$2w$3 stopped: its partitions move to the others"
  sleep "${4:-0}"
  start_worker "$2" "$3"
  svc_log "worker h$2w$3 started again"
}

cmd_exec() {
  load "$1"
  check_host "$2"
  local ns
  ns=$(ns_name "$2")
  shift 2
  exec ip netns exec "$ns" "$@"
}

[ $# -ge 1 ] || svc_usage
cmd=$1
shift
case $cmd in
  up)      [ $# -ge 1 ] || svc_usage; cmd_up "$@" ;;
  down)    [ $# -ge 1 ] && [ $# -le 2 ] || svc_usage; cmd_down "$@" ;;
  status)  [ $# = 1 ] || svc_usage; cmd_status "$1" ;;
  env)     [ $# = 1 ] || svc_usage; cmd_env "$1" ;;
  wait)    [ $# -ge 1 ] && [ $# -le 2 ] || svc_usage; cmd_wait "$@" ;;
  exec)    [ $# -ge 3 ] || svc_usage; cmd_exec "$@" ;;
  cut)     [ $# -ge 2 ] && [ $# -le 3 ] || svc_usage; cmd_cut "$@" ;;
  restore) [ $# = 2 ] || svc_usage; cmd_restore "$@" ;;
  kill)    [ $# -ge 3 ] && [ $# -le 4 ] || svc_usage; cmd_kill "$@" ;;
  stop)    [ $# = 3 ] || svc_usage; cmd_stop "$@" ;;
  start)   [ $# = 3 ] || svc_usage; cmd_start "$@" ;;
  move)    [ $# -ge 3 ] && [ $# -le 4 ] || svc_usage; cmd_move "$@" ;;
  -h|--help|help) svc_usage ;;
  *) svc_usage ;;
esac
