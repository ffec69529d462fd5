#!/usr/bin/env bash
# The ctest fixture kafka_broker (CMakeLists.txt): one Kafka broker for every test of a ctest run
# that lists it in FIXTURES_REQUIRED (tests/broker_lib.sh's bt_broker then uses it; see there).
#   shared_broker.sh start ROOT   starts a broker in ROOT/ctest-<pid of the calling ctest> (its
#                                 parent), which dies with that ctest process even when the
#                                 cleanup below never runs (scripts/svc-lib.sh's watchdog). A
#                                 broker already running there is kept (ctest --repeat).
#   shared_broker.sh stop ROOT    stops it and removes its folder (nothing to do when it is gone).
# Exit 77 (skipped) without java, mvn or kcat: the tests then skip by themselves (bt_init).
# Its settings are those of the fault tests' brokers (tests/faults_lib.sh): consumer sessions may
# be 1 s, timed-out transactions are aborted within a second of their timeout. It waits up to
# SPILLWAY_KAFKA_READY_TIMEOUT s (default here 240: every shared test depends on this one start,
# which took 82 s at a load average of 160 on 2 CPUs) for the broker to answer.
set -euo pipefail
[ $# = 2 ] || { echo "usage: $0 start|stop ROOT" >&2; exit 2; }
ROOT=$(cd "$(dirname "$0")/.." && pwd)
KB=$ROOT/scripts/kafka-broker.sh
DIR=$(realpath -m "$2")/ctest-$PPID
case $1 in
  start)
    command -v java >/dev/null 2>&1 && java -version >/dev/null 2>&1 || { echo "SKIP: no java"; exit 77; }
    command -v mvn >/dev/null 2>&1 || { echo "SKIP: no mvn"; exit 77; }
    command -v kcat >/dev/null 2>&1 || { echo "SKIP: no kcat"; exit 77; }
    if [ -f "$DIR/env" ] && kill -0 "$(sed -n 's/^PID=//p' "$DIR/env")" 2>/dev/null; then
      echo "shared broker already running in $DIR"
      exit 0
    fi
    "$KB" stop "$DIR" 2>/dev/null || rm -rf "$DIR"
    # stale folders of ctest runs that are gone
    for d in "$(dirname "$DIR")"/ctest-*; do
      [ -d "$d" ] && ! kill -0 "${d##*/ctest-}" 2>/dev/null && { "$KB" stop "$d" || true; }
    done
    mkdir -p "$(dirname "$DIR")"
    SPILLWAY_KAFKA_READY_TIMEOUT=${SPILLWAY_KAFKA_READY_TIMEOUT:-240} \
    SPILLWAY_SVC_OWNER=$PPID SPILLWAY_KAFKA_PROPS="group.min.session.timeout.ms=1000
transaction.abort.timed.out.transaction.cleanup.interval.ms=1000" "$KB" start "$DIR"
    echo "shared broker in $DIR: $(grep -E '^(BOOTSTRAP|STARTUP_MS)=' "$DIR/env" | paste -sd' ')"
    ;;
  stop)
    # a stop after the first (ctest --repeat) finds nothing to stop
    [ -e "$DIR" ] || { echo "no shared broker in $DIR (stopped already)"; exit 0; }
    "$KB" stop "$DIR"
    ;;
  *) echo "usage: $0 start|stop ROOT" >&2; exit 2 ;;
esac
