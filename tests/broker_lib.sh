# shellcheck shell=bash
# tests/broker_lib.sh: the preamble every real-broker test shares (sourced by the tests/test_*.sh
# that start a Kafka broker, and by tests/faults_lib.sh; not a test itself).
#
# bt_init NAME SPILLWAY_BIN MODELS_DIR [redis]: call right after `set -euo pipefail` with the
# script's two arguments (from ctest: the spillway binary and the models folder). It
#   - skips the test (exit 77) when scripts/kafka-broker.sh, stories260K.gguf, a usable java or
#     mvn is missing, and redis-server when "redis" is given; fails it (exit 1) without kcat;
#   - sets SPILLWAY (absolute), MODELS, MODEL (stories260K.gguf), ROOT (the checkout), KB
#     (scripts/kafka-broker.sh), RS (scripts/redis-server.sh), WORK (a new folder named after
#     NAME), T0 (its start, epoch ms) and PIDS=() (processes to kill at exit); exports
#     SPILLWAY_SVC_OWNER, so that the servers it starts die with the script even when its exit
#     trap cannot run (SIGKILL by a timeout);
#   - installs the exit trap bt_cleanup: kill -9 of every pid in PIDS and of $WPID (when set),
#     then bt_at_exit when the test defines one, then the brokers ($WORK/broker*) and Redis
#     servers ($WORK/redis*) are killed (SIGKILL) and removed, and WORK and every path in BT_RM are removed -- WORK is
#     kept (and its path printed) when BT_KEEP=1 or a $WORK/.failed file exists.
# Also: say MESSAGE (timestamped since T0), fail MESSAGE (the default: the message and the end of
# every $WORK/*.log, exit 1; a test may define its own after sourcing), stop_worker PID NAME (a
# worker the test started, logging to $WORK/NAME.log: SIGTERM, then exit status 0 and a clean
# stop in the log, or fail), bt_broker [DIR] (a broker:
# sets BOOTSTRAP, PID and BROKER (its folder), and starts the test's Kafka admin client),
# bt_topic NAME PARTITIONS [--config K=V]... (creates topic NAME on that broker), bt_query (asks
# that client: topics, a group's committed offsets, a transaction's state), bt_free_port (a free
# port for a server the test starts).
#
# Shared broker: run by ctest, a test listed in CMakeLists.txt's SPILLWAY_SHARED_BROKER_TESTS
# gets SPILLWAY_TEST_BROKER (a folder) and the fixture kafka_broker, whose setup
# (tests/shared_broker.sh start) started one broker for the whole ctest run in
# $SPILLWAY_TEST_BROKER/ctest-<ctest's pid> (the test's parent); bt_broker without DIR then
# uses that broker instead of starting one. Such a test must not stop, kill or restart the
# broker or change its settings, and names everything it creates there from NS: its topics
# (${NS}prompts), consumer groups and worker ids (so transactional ids too). NS is unique per
# test process (NAME and $$), also when the test starts its own broker (run by hand, or
# SPILLWAY_TEST_BROKER unset).
#
# Every record a test reads is checked against its schema: kcat is a function here that runs
# the real kcat and notes every read of what a topic holds (-C with -e, formatted with %s or %h,
# or -J); at exit (bt_cleanup, before the brokers stop) those topics and every topic of the
# test (its brokers', or its own on the shared broker) are read again from the beginning as
# JSON envelopes and passed to tests/validate_records.py (results, dead letters, stream chunks
# and usage records, told apart by their content; schemas/). A record that fails is printed and
# listed in $WORK/.schema_failures, and the test then fails whatever it found otherwise.

bt_init() {
  local name=$1 redis=${4:-}
  SPILLWAY=$(realpath "$2")
  MODELS=$3
  MODEL=$MODELS/stories260K.gguf
  ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
  KB=$ROOT/scripts/kafka-broker.sh
  RS=$ROOT/scripts/redis-server.sh
  [ -x "$KB" ] || { echo "SKIP: scripts/kafka-broker.sh not present"; exit 77; }
  [ -f "$MODEL" ] || { echo "SKIP: $MODEL not found"; exit 77; }
  command -v java >/dev/null 2>&1 && java -version >/dev/null 2>&1 || { echo "SKIP: no java"; exit 77; }
  command -v mvn >/dev/null 2>&1 || { echo "SKIP: no mvn"; exit 77; }
  if [ "$redis" = redis ]; then
    command -v redis-server >/dev/null 2>&1 || { echo "SKIP: redis-server not installed"; exit 77; }
  fi
  command -v kcat >/dev/null 2>&1 || { echo "FAIL: kcat not found"; exit 1; }
  WORK=$(mktemp -d "${TMPDIR:-/tmp}/spillway-$name.XXXXXX")
  export SPILLWAY_SVC_OWNER=$$
  PIDS=()
  BT_RM=()
  NS=$name-$$-
  T0=$(date +%s%3N)
  trap bt_cleanup EXIT
}

bt_cleanup() {
  local p d rc=0
  for p in "${PIDS[@]}" ${WPID:-}; do kill -9 "$p" 2>/dev/null || true; done
  if declare -F bt_at_exit >/dev/null; then bt_at_exit || true; fi
  bt_check_topics
  if [ -s "$WORK/.schema_failures" ]; then
    echo "FAIL: records that do not match their schema (schemas/):"
    cat "$WORK/.schema_failures"
    touch "$WORK/.failed"
    rc=1
  fi
  # the test's own servers: thrown away with their data, so SIGKILL (no orderly shutdown to wait
  # for), then stop (removes the folder)
  for d in "$WORK"/broker*; do
    [ -d "$d" ] && { "$KB" kill "$d" >/dev/null 2>&1 || true; "$KB" stop "$d" >/dev/null 2>&1 || true; }
  done
  for d in "$WORK"/redis*; do
    [ -d "$d" ] && { "$RS" kill "$d" >/dev/null 2>&1 || true; "$RS" stop "$d" >/dev/null 2>&1 || true; }
  done
  if [ "${BT_KEEP:-0}" = 1 ] || [ -e "$WORK/.failed" ]; then
    echo "work folder kept: $WORK"
  else
    rm -rf "$WORK"
  fi
  [ "${#BT_RM[@]}" -eq 0 ] || rm -rf "${BT_RM[@]}"
  [ "$rc" -eq 0 ] || exit "$rc"
}

# kcat: the program, then the schema check of what it read (`timeout kcat` runs the program
# alone)
kcat() {
  local rc=0
  command kcat "$@" || rc=$?
  bt_check_read "$@"
  return "$rc"
}

# bt_check_topics: the schema check of every topic of every broker the test started that still
# answers, of the test's own topics (named from NS) on the shared broker when it used that one
# (records read by other clients than kcat, e.g. spillway collect, included), and of every other
# topic the test read with kcat (bt_check_read): each read from its beginning, all through one
# tests/validate_records.py. Run at exit, before the brokers stop.
bt_check_topics() {
  local d bs t line seen=" "
  local -a a reads=()
  for d in "$WORK"/broker* ${SPILLWAY_TEST_BROKER:+"$SPILLWAY_TEST_BROKER/ctest-$PPID"}; do
    [ -f "$d/env" ] || continue
    bs=$(sed -n 's/^BOOTSTRAP=//p' "$d/env" | tail -n 1)
    [ -n "$bs" ] || continue
    for t in $(timeout 20 kcat -b "$bs" -L -m 5 2>/dev/null |
               sed -n 's/^  topic "\([^"]*\)".*/\1/p'); do
      case $t in __*) continue ;; esac
      # the shared broker holds the other tests' topics too: only this test's are checked
      case $d in "$WORK"/*) ;; *) case $t in "${NS:-}"?*) ;; *) continue ;; esac ;; esac
      reads+=("$(printf '%q ' -b "$bs" -t "$t")")
      seen+=" $bs/$t "
    done
  done
  if [ -s "$WORK/.schema_reads" ]; then
    while IFS= read -r line; do
      eval "a=($line)"
      bs="" t=""
      set -- "${a[@]}"
      while [ $# -gt 0 ]; do
        case $1 in -b) bs=$2; shift ;; -t) t=$2; shift ;; esac
        shift
      done
      case $seen in *" $bs/$t "*) continue ;; esac
      seen+=" $bs/$t "
      if timeout 20 kcat -L -m 5 "${a[@]}" >/dev/null 2>&1; then
        reads+=("$line")
      else
        echo "note: records read from $t at $bs were not schema-checked (the broker no longer answers)" >&2
      fi
    done < <(sort -u "$WORK/.schema_reads")
  fi
  [ "${#reads[@]}" -gt 0 ] || return 0
  local out rc=0
  out=$(for line in "${reads[@]}"; do
          eval "a=($line)"
          timeout 60 kcat -C -J -q -e -o beginning -X fetch.wait.max.ms=5 -m 5 "${a[@]}" 2>/dev/null
        done | python3 "$ROOT/tests/validate_records.py" "" "$WORK/.schema_seen" "${NS:-}") || rc=$?
  if [ "$rc" = 1 ]; then
    printf '%s\n' "$out" >>"$WORK/.schema_failures"
    printf 'schema check failed:\n%s\n' "$out" >&2
  elif [ "$rc" != 0 ]; then
    printf '%s\n' "${out:-validate_records.py exited $rc}" >&2
  fi
  return 0
}

# bt_check_read KCAT_ARGS...: notes a kcat read of records' content (-C, -e, -J or a -f with %s
# or %h) in $WORK/.schema_reads (its broker, topic and client settings), for bt_check_topics to
# check at exit. Never fails the caller.
bt_check_read() {
  local topic="" consume=0 end=0 content=0 client=()
  while [ $# -gt 0 ]; do
    case $1 in
      -C) consume=1 ;;
      -e) end=1 ;;
      -J) content=1 ;;
      -f) case $2 in *%s*|*%h*) content=1 ;; esac; shift ;;
      -t) topic=$2; client+=(-t "$2"); shift ;;
      -b|-X|-F) case $1$2 in -Xisolation.level=*|-Xfetch.*) ;; *) client+=("$1" "$2") ;; esac; shift ;;
      -p|-o|-c|-K|-k|-D|-s|-m) shift ;;
    esac
    shift
  done
  [ "$consume" = 1 ] && [ "$end" = 1 ] && [ "$content" = 1 ] && [ -n "$topic" ] &&
    [ -d "${WORK:-}" ] || return 0
  printf '%q ' "${client[@]}" >>"$WORK/.schema_reads"
  echo >>"$WORK/.schema_reads"
  return 0
}

say() { printf '[%5.1fs] %s\n' "$(( $(date +%s%3N) - T0 ))e-3" "$*"; }

fail() {
  echo "FAIL: $*"
  local f
  for f in "$WORK"/*.log; do [ -f "$f" ] && { echo "--- $f (end)"; tail -n 20 "$f"; }; done
  exit 1
}

# wait_assigned NAME SECONDS: true once $WORK/NAME.log has an assignment of >= 1 partition,
# false after SECONDS.
wait_assigned() {
  local end=$(( $(date +%s) + $2 ))
  while [ "$(date +%s)" -lt "$end" ]; do
    grep -qE ' INFO assigned [1-9][0-9]* partition' "$WORK/$1.log" && return 0
    sleep 0.1
  done
  return 1
}

# stop_worker PID NAME: SIGTERM, then exit status 0 and a clean stop in $WORK/NAME.log, or fail.
stop_worker() {
  local rc=0
  kill -TERM "$1"
  wait "$1" || rc=$?
  [ "$rc" = 0 ] || fail "$2 exit status $rc after SIGTERM"
  grep -q ' INFO stopped: ' "$WORK/$2.log" || fail "$2: no clean stop in the log"
}

# one_fenced PID_A NAME_A PID_B NAME_B SECONDS: two exactly-once workers share a transactional.id;
# they fence each other in turn (each recovers from one fence by replacing its producer) until one
# is fenced again within transaction.fence.window.ms and stops. Which one is a race: their
# InitProducerId requests may interleave. Waits up to SECONDS for one to exit; it must exit 1 with
# an 'ERROR fatal:' line saying fenced (or old epoch), and the other must still run a second
# later. Sets FENCED_NAME (the one that stopped), SURV_PID and SURV_NAME (the other).
one_fenced() {
  local end=$(( $(date +%s) + $5 )) pid name rc=0
  while :; do
    if ! kill -0 "$1" 2>/dev/null; then pid=$1 name=$2 SURV_PID=$3 SURV_NAME=$4; break; fi
    if ! kill -0 "$3" 2>/dev/null; then pid=$3 name=$4 SURV_PID=$1 SURV_NAME=$2; break; fi
    [ "$(date +%s)" -lt "$end" ] || fail "neither $2 nor $4 stopped within $5 s of sharing a transactional.id"
    sleep 0.2
  done
  wait "$pid" || rc=$?
  [ "$rc" = 1 ] || fail "fenced worker $name exit status $rc, want 1"
  # librdkafka says "fenced by a newer instance" or, when a produce request meets the new epoch
  # first, "Producer attempted an operation with an old epoch"
  grep ' ERROR fatal: ' "$WORK/$name.log" | grep -Eqi 'fenced|old epoch' ||
    fail "no 'ERROR fatal:' line saying fenced (or old epoch) in $name's log"
  sleep 1
  kill -0 "$SURV_PID" 2>/dev/null || fail "$SURV_NAME stopped as well as $name"
  FENCED_NAME=$name
}

# bt_free_port [PORT...]: a loopback port free now (and none of the PORTs given), below the
# kernel's ephemeral range (scripts/svc-lib.sh's svc_pick_port, as the test servers pick theirs),
# so no client connection of another process can be given it before the test's server binds it
# (a port from bind(0) can be: it is ephemeral).
bt_free_port() {
  (
    # shellcheck source=scripts/svc-lib.sh
    . "$ROOT/scripts/svc-lib.sh"
    svc_pick_port "$@"
  )
}

bt_broker() {
  if [ $# = 0 ] && [ -n "${SPILLWAY_TEST_BROKER:-}" ]; then
    BROKER=$SPILLWAY_TEST_BROKER/ctest-$PPID
    [ -f "$BROKER/env" ] ||
      fail "SPILLWAY_TEST_BROKER is set but $BROKER holds no broker (the ctest fixture kafka_broker starts it)"
    BOOTSTRAP=$(sed -n 's/^BOOTSTRAP=//p' "$BROKER/env")
    PID=$(sed -n 's/^PID=//p' "$BROKER/env")
    kill -0 "$PID" 2>/dev/null || fail "the shared broker (pid $PID, $BROKER) is not running"
  else
    BROKER=$WORK/${1:-broker}
    eval "$("$KB" start "$BROKER" | grep -E '^(BOOTSTRAP|PID)=')"
  fi
  [ -n "${BT_QUERY_PID:-}" ] || bt_query_start
}

# bt_query_start: starts the test's Kafka admin client (tests/kafka/KafkaQuery.java: the broker's
# own tools' answers, one JVM for the whole test instead of one per question) for the broker of
# bt_broker, which calls it; its class is compiled once per source version (javac, from a JDK)
# into a folder beside the Kafka jars. Requests go in through a FIFO (fd BT_QUERY_IN), answers
# come back through another (fd BT_QUERY_OUT); its log: $WORK/query.log.
bt_query_start() {
  local lib src dir tmp
  lib=$(sed -n 's/^KAFKA_LIB=//p' "$BROKER/env" | tail -n 1)
  [ -d "$lib" ] || fail "no KAFKA_LIB in $BROKER/env"
  src=$ROOT/tests/kafka/KafkaQuery.java
  dir=$(dirname "$lib")/query-$(sha256sum "$src" | cut -c1-16)
  if [ ! -f "$dir/KafkaQuery.class" ]; then
    command -v javac >/dev/null 2>&1 ||
      fail "javac not found: the tests' Kafka client needs a JDK (scripts/install-deps.sh installs default-jdk-headless)"
    tmp=$(mktemp -d "$dir.XXXXXX")
    javac -nowarn -cp "$lib/*" -d "$tmp" "$src" >"$WORK/javac.log" 2>&1 ||
      { cat "$WORK/javac.log"; rm -rf "$tmp"; fail "compiling $src"; }
    # another test may have compiled it meanwhile: the first rename wins
    mv -T "$tmp" "$dir" 2>/dev/null || rm -rf "$tmp"
  fi
  mkfifo "$WORK/.query.in" "$WORK/.query.out"
  java -Xms32m -Xmx256m -XX:+UseSerialGC -XX:TieredStopAtLevel=1 \
    "-Dlog4j2.configurationFile=$BROKER/tools-log4j2.properties" -cp "$lib/*:$dir" \
    KafkaQuery "$BOOTSTRAP" "$WORK/.query.out" <"$WORK/.query.in" >"$WORK/query.log" 2>&1 &
  BT_QUERY_PID=$!
  disown "$BT_QUERY_PID" 2>/dev/null || true
  PIDS+=("$BT_QUERY_PID")
  exec {BT_QUERY_IN}>"$WORK/.query.in"
  exec {BT_QUERY_OUT}<"$WORK/.query.out"
}

# bt_query REQUEST...: the admin client's answer to REQUEST (tests/kafka/KafkaQuery.java lists
# them: topic, offsets, txn), one line per line of the answer; fails the test when the answer
# is an error or none comes within 60 s. Works inside $(...) (the FIFOs' fds are inherited), one
# request at a time.
bt_query() {
  local line ans=()
  printf '%s\n' "$*" >&"$BT_QUERY_IN"
  while IFS= read -r -t 60 line <&"$BT_QUERY_OUT"; do
    if [ "$line" = . ]; then
      case ${ans[0]:-} in "error "*) fail "Kafka admin request '$*': ${ans[0]#error }" ;; esac
      [ "${#ans[@]}" -eq 0 ] || printf '%s\n' "${ans[@]}"
      return 0
    fi
    ans+=("$line")
  done
  tail -n 20 "$WORK/query.log" >&2
  fail "Kafka admin request '$*': no answer within 60 s"
}

# bt_topic NAME PARTITIONS [--config KEY=VALUE]...: topic NAME on the broker of bt_broker,
# returned once every partition has a leader.
bt_topic() {
  local name=$1 parts=$2 cfg=()
  shift 2
  while [ $# -gt 0 ]; do
    [ "$1" = --config ] && [ $# -ge 2 ] || fail "bt_topic: only --config KEY=VALUE options, not '$1'"
    cfg+=("$2")
    shift 2
  done
  bt_query topic "$name" "$parts" "${cfg[@]}" >/dev/null
}
