#!/usr/bin/env bash
# Integration test of the Kafka test harness (scripts/kafka-broker.sh) against a real Apache Kafka
# 4.x broker, driven with kcat (librdkafka, the client spillway links):
#   start -> 4-partition topic -> produce 1,000 keyed messages -> read them all back (every key
#   once, every partition used) -> consumer group reads them and commits -> a transaction of 100
#   messages, visible to read_committed -> SIGKILL -> restart on the same ports and data -> all
#   1,100 messages still there, the group resumes from its committed offsets, new produce works
#   -> stop removes everything.
# Arguments (from ctest: the spillway binary and the models folder) are not used.
# Exit 77 (skip) only when java or mvn is missing; everything else missing is a failure.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
KB=$ROOT/scripts/kafka-broker.sh

if ! command -v java >/dev/null 2>&1 || ! java -version >/dev/null 2>&1; then
  echo "SKIP: no usable java (scripts/install-deps.sh installs it)"
  exit 77
fi
if ! command -v mvn >/dev/null 2>&1; then
  echo "SKIP: no mvn (scripts/install-deps.sh installs maven)"
  exit 77
fi
command -v kcat >/dev/null 2>&1 || { echo "FAIL: kcat not found (scripts/install-deps.sh installs it)"; exit 1; }

WORK=$(mktemp -d "${TMPDIR:-/tmp}/spillway-kafka-test.XXXXXX")
BROKER=$WORK/broker
TOPIC=harness
# The broker dies with this script even when the trap below cannot run (SIGKILL by a timeout).
export SPILLWAY_SVC_OWNER=$$

cleanup() {
  local rc=$?
  if [ "$rc" != 0 ] && [ -f "$BROKER/server.log" ]; then
    echo "--- broker log (last 30 lines)"
    tail -n 30 "$BROKER/server.log" || true
  fi
  "$KB" stop "$BROKER" || true
  rm -rf "$WORK"
  exit "$rc"
}
trap cleanup EXIT

now_ms() { date +%s%3N; }
T0=$(now_ms)
STEP_T=$T0
echo "timings:"
# step NAME: prints the time the previous step took, then starts timing NAME.
step() {
  local t
  t=$(now_ms)
  [ -n "${STEP_NAME:-}" ] && printf '  %-34s %6d ms\n' "$STEP_NAME" $(( t - STEP_T ))
  STEP_NAME=$1
  STEP_T=$t
}
fail() { echo "FAIL: $*"; exit 1; }
checks=0
ok() { checks=$(( checks + 1 )); }
# gone PID: true when PID has exited (a zombie not yet reaped counts as exited).
gone() { ! kill -0 "$1" 2>/dev/null || [[ $(ps -o stat= -p "$1") == Z* ]]; }

# consume_all [kcat options...]: every message of the topic from the start, "partition key" lines.
consume_all() {
  timeout 60 kcat -b "$BOOTSTRAP" -C -t "$TOPIC" -o beginning -e -q -f '%p %k\n' "$@"
}
# group_read GROUP: what GROUP has not consumed yet (keys), committing on exit.
group_read() {
  timeout 60 kcat -b "$BOOTSTRAP" -G "$1" -X auto.offset.reset=earliest -e -q -f '%k\n' "$TOPIC"
}

step "fetch jars (cached after the first)"
out=$("$KB" fetch)
eval "$out"
jar=$(cd "$KAFKA_LIB" && ls kafka_2.13-*.jar)
VERSION=${jar#kafka_2.13-}
VERSION=${VERSION%.jar}

step "start broker"
out=$("$KB" start "$BROKER")
eval "$out"
if [ -z "${BOOTSTRAP:-}" ] || [ -z "${PID:-}" ]; then fail "start printed no BOOTSTRAP/PID"; fi
kill -0 "$PID" || fail "broker pid $PID is not running"
grep -q "^BOOTSTRAP=$BOOTSTRAP\$" "$BROKER/env" || fail "env file does not match"
FIRST_BOOTSTRAP=$BOOTSTRAP
STARTUP_MS=$(sed -n 's/^STARTUP_MS=//p' "$BROKER/env")
ok

step "create 4-partition topic"
"$KB" topic "$BROKER" "$TOPIC" 4
parts=$(kcat -b "$BOOTSTRAP" -L -t "$TOPIC" | grep -cE '^ *partition [0-9]+, leader 1,')
[ "$parts" = 4 ] || fail "topic has $parts partitions with a leader, expected 4"
ok

step "produce 1000 keyed messages"
seq 1 1000 | awk '{ print "k" $1 ":v" $1 }' >"$WORK/in.txt"
timeout 60 kcat -b "$BOOTSTRAP" -P -t "$TOPIC" -K: -l "$WORK/in.txt"

step "consume them back"
consume_all >"$WORK/out.txt"
n=$(wc -l <"$WORK/out.txt")
[ "$n" = 1000 ] || fail "consumed $n messages, expected 1000"
cut -d' ' -f2 "$WORK/out.txt" | sort >"$WORK/keys-out.txt"
cut -d: -f1 "$WORK/in.txt" | sort >"$WORK/keys-in.txt"
cmp -s "$WORK/keys-in.txt" "$WORK/keys-out.txt" || fail "consumed keys differ from the produced ones"
used=$(cut -d' ' -f1 "$WORK/out.txt" | sort -u | wc -l)
[ "$used" = 4 ] || fail "messages landed in $used partitions, expected 4"
ok

step "consumer group reads and commits"
n=$(group_read g1 | wc -l)
[ "$n" = 1000 ] || fail "group g1 read $n messages, expected 1000"
ok

step "transactional produce (100)"
seq 1 100 | awk '{ print "tx" $1 ":t" $1 }' >"$WORK/tx.txt"
timeout 60 kcat -b "$BOOTSTRAP" -P -t "$TOPIC" -K: -l -X transactional.id=spillway-harness \
  "$WORK/tx.txt" 2>"$WORK/tx.err" || { cat "$WORK/tx.err"; fail "transactional produce failed"; }
grep -q 'Transaction successfully committed' "$WORK/tx.err" || { cat "$WORK/tx.err"; fail "no commit"; }
# The commit markers reach the partitions shortly after the commit returns: read_committed sees
# the messages once they are there.
for _ in $(seq 1 50); do
  n=$(consume_all -X isolation.level=read_committed | grep -c ' tx' || true)
  [ "$n" = 100 ] && break
  sleep 0.2
done
[ "$n" = 100 ] || fail "read_committed sees $n of 100 transactional messages"
ok

step "SIGKILL the broker"
"$KB" kill "$BROKER"
gone "$PID" || fail "broker survived kill"
[ -d "$BROKER/data" ] || fail "kill removed the data"
if timeout 5 kcat -b "$BOOTSTRAP" -L -m 1 >/dev/null 2>&1; then fail "broker still answers after kill"; fi
ok

step "restart on the same ports and data"
out=$("$KB" restart "$BROKER")
eval "$out"
[ "$BOOTSTRAP" = "$FIRST_BOOTSTRAP" ] || fail "restart moved the broker to $BOOTSTRAP"
RESTART_MS=$(sed -n 's/^STARTUP_MS=//p' "$BROKER/env")
ok

step "data survived the crash"
n=$(consume_all | wc -l)
[ "$n" = 1100 ] || fail "after restart the topic holds $n messages, expected 1100"
n=$(group_read g1 | grep -c '^tx' || true)
[ "$n" = 100 ] || fail "group g1 resumed with $n messages, expected the 100 transactional ones"
seq 1 10 | awk '{ print "r" $1 ":after-restart" }' | timeout 60 kcat -b "$BOOTSTRAP" -P -t "$TOPIC" -K:
n=$(group_read g1 | wc -l)
[ "$n" = 10 ] || fail "group g1 read $n new messages after restart, expected 10"
ok

step "stop"
"$KB" stop "$BROKER"
[ ! -e "$BROKER" ] || fail "stop left $BROKER behind"
gone "$PID" || fail "broker survived stop"
ok
step ""

echo "Kafka $VERSION: broker start-up ${STARTUP_MS} ms, restart after SIGKILL ${RESTART_MS} ms, total $(( $(now_ms) - T0 )) ms"
echo "kafka harness: all $checks checks passed"
