#!/usr/bin/env bash
# Faults, at-least-once, against a real Apache Kafka 4.x broker (scripts/kafka-broker.sh) with
# stories260K (max_tokens 1..4, greedy, threads 1). Helpers and the verifier: tests/faults_lib.sh
# (a read_committed reader of results + DLQ: the ids there must equal the ids produced; it counts
# duplicates and checks each is identical to its first copy). Every batch mixes 5 invalid
# messages (not JSON, missing prompt, wrong type, empty prompt, bad parameter) among the prompts,
# so dead letters count in the ids too.
#   1. Clean run: 10,000 prompts over 4 partitions, one worker (max.inflight 256, 45 s consumer
#      sessions) -> set equality, zero duplicates, and the group's committed offsets at the log
#      end of every partition.
#   2. kill -9 of the worker three times at random points of a 6,000-prompt run (random output
#      counts, at least one more than before, plus a random 0..300 ms), restarted each time
#      (max.inflight 64, commits every 200 ms, 3 s consumer sessions). After each kill, the
#      group's committed offsets C are read: every input offset below C has its output already
#      ("covered": no offset committed before its output was durable). In the end: set
#      equality; every duplicate is identical to its first copy (same text, finish reason and
#      token counts: greedy decoding recomputes the same), whose input offset was at or above C
#      at its worker's kill (what at-least-once may redo); a kill's duplicates are at most
#      max.inflight (outputs not yet durable) plus the outputs its worker made durable in the
#      last two commit periods (+0.5 s) before it died (durable, not yet covered by a completed
#      commit); the last worker's committed offsets reach the log end.
#   3. Prompts of 1..48 tokens and max.inflight 256 (so that the engine, not the fetch round
#      trips, takes most of the time: outputs are in flight when the broker dies), 120 s consumer
#      sessions, so that the assignment outlives the outage (the broker's restart alone took 28 s
#      on a loaded machine, and a 45 s session then expired before the coordinator answered:
#      the partitions were lost and all the worker had acknowledged since its last commit was
#      redone); a worker that loses its partitions all the same fails the scenario as such.
#      a. The broker killed with kill -9 mid-run and restarted after 10 s (same ports and data).
#      b. With -X producer.message.timeout.ms=5000, the broker killed mid-run and down for 12 s:
#         the records waiting in the producer time out and are produced again ("not delivered
#         ... producing it again" lines in the worker's log: required, else the fault missed).
#      After each restart the committed offsets are checked covered while the worker runs; in
#      the end every id came back, duplicates (identical) at most max.inflight, committed offsets
#      at the log end.
# Prints the figures (messages, faults, duplicates, DLQ, durations); tests/RELIABILITY.md has
# those of one run. SPILLWAY_FAULTS_SCALE multiplies the message counts, SPILLWAY_FAULTS_SEED
# replays the fault points (tests/faults_lib.sh).
# Arguments (from ctest): the spillway binary and the models folder.
set -euo pipefail
SPILLWAY=$(realpath "$1")
MODELS=$2
# shellcheck source=tests/faults_lib.sh
. "$(dirname "$0")/faults_lib.sh"
faults_init faults-alo
say "seed $SEED, scale $SCALE"

broker_start
for t in p1 p2 p3 results; do bt_topic "$t" 4; done
bt_topic dlq 1
say "topics created"

SESSION=(-X consumer.session.timeout.ms=45000 -X consumer.max.poll.interval.ms=300000
         -X consumer.heartbeat.interval.ms=3000)
# scenario 3: sessions that outlive a broker outage and the restart of a loaded machine
SESSION3=(-X consumer.session.timeout.ms=120000 -X consumer.max.poll.interval.ms=300000
          -X consumer.heartbeat.interval.ms=3000)
# kept WORKER: fails when WORKER lost its partitions (its session expired during an outage)
kept() {
  ! grep -E ' INFO lost [0-9]+ partition|SESSTMOUT' "$WORK/$1.log" ||
    fail "$1: the assignment did not outlive the broker's outage (the scenario needs it to)"
}

# ---- 1. clean run ----
if scenario 1; then
N1=$(scaled 10000)
gen s1 A "$N1" 5
produce s1 p1
t=$(now_ms)
# 45 s sessions (librdkafka's default): a slow moment of a loaded machine is no fault here
run_worker a1 g1 p1 -s worker.id=a1 -s max.inflight=256 -s commit.interval.ms=200 "${SESSION[@]}"
W=$WPID
wait_all s1 300
stop_worker "$W" a1
d1=$(( $(now_ms) - t ))
end1=$(at_log_end g1 p1 4)
fig1=$(verify s1 exact)
say "1 clean: $fig1 run_ms=$d1; $end1"
fi

# ---- 2. kill -9 x3 ----
if scenario 2; then
N2=$(scaled 6000)
gen s2 K "$N2" 5
produce s2 p2
: >"$WORK/kills"
marks=$(for _ in 1 2 3; do rand_ms $(( N2 / 10 )) $(( N2 * 8 / 10 )); done | sort -n | tr '\n' ' ')
say "2 kill points (outputs): $marks"
t=$(now_ms)
k=0
for mark in $marks; do
  k=$((k + 1))
  run_worker k$k g2 p2 -s worker.id=k$k -s max.inflight=64 -s commit.interval.ms=200
  W=$WPID
  # each worker produces something before its kill
  c=$(count_out K)
  [ "$mark" -gt "$c" ] || mark=$(( c + $(rand_ms 1 $(( N2 / 20 ))) ))
  c=$(wait_out K "$mark" 120)
  [ "$c" -ge "$mark" ] || fail "k$k: only $c outputs after 120 s"
  sleep "0.$(printf '%03d' "$(rand_ms 0 300)")"
  kill -0 "$W" 2>/dev/null || fail "k$k exited before its kill"
  kill -9 "$W"
  kms=$(now_ms)
  wait "$W" 2>/dev/null || true
  c=$(count_out K)
  u=$(distinct_out K)
  [ "$u" -lt $((N2 + 5)) ] || fail "k$k had finished every message before its kill ($u ids, kill point $mark): not mid-run"
  cov=$(covered g2 p2 "$WORK/cov-k$k")
  echo "k$k $kms $(awk '{ printf "%s%d:%d", (NR > 1 ? " " : ""), $1, $2 }' "$WORK/cov-k$k")" >>"$WORK/kills"
  say "2 kill -9 #$k of k$k at $c outputs; committed (p off end): $cov- covered"
done
run_worker k4 g2 p2 -s worker.id=k4 -s max.inflight=64 -s commit.interval.ms=200
W=$WPID
wait_all s2 300
stop_worker "$W" k4
d2=$(( $(now_ms) - t ))
end2=$(at_log_end g2 p2 4)
fig2=$(MAXINF=64 COMMIT_MS=200 verify s2 alo-kills "$WORK/kills")
say "2 kill -9 x3: $fig2 run_ms=$d2; $end2"
fi

# ---- 3. broker faults ----
if scenario 3; then
# 3a: kill -9, restarted after 10 s
N3=$(scaled 2000)
gen s3 B "$N3" 5 48
produce s3 p3
t=$(now_ms)
run_worker b1 g3 p3 -s worker.id=b1 -s max.inflight=256 -s commit.interval.ms=200 "${SESSION3[@]}"
W=$WPID
c=$(wait_out B "$(rand_ms $(( N3 / 10 )) $(( N3 / 3 )))" 120)
"$KB" kill "$WORK/broker"
tk=$(now_ms)
sleep 10
"$KB" restart "$WORK/broker" >/dev/null 2>"$WORK/restart1.txt" || { cat "$WORK/restart1.txt"; fail "broker restart"; }
down=$(( $(now_ms) - tk ))
kill -0 "$W" 2>/dev/null || fail "b1 died while the broker was down"
say "3a broker killed at $c outputs, back after ${down} ms"
cov=$(covered g3 p3 "$WORK/cov-b1")
say "3a committed (p off end) after the restart: $cov- covered"
wait_all s3 300
stop_worker "$W" b1
kept b1
d3=$(( $(now_ms) - t ))
end3=$(at_log_end g3 p3 4)
fig3=$(verify s3 alo:256)
say "3a broker kill -9 10 s: $fig3 down_ms=$down run_ms=$d3; $end3"

# 3b: down 12 s, longer than the producer's message timeout (5 s)
N4=$(scaled 2000)
gen s4 C "$N4" 5 48
produce s4 p3
t=$(now_ms)
run_worker b2 g3 p3 -s worker.id=b2 -s max.inflight=256 -s commit.interval.ms=200 "${SESSION3[@]}" \
  -X producer.message.timeout.ms=5000
W=$WPID
c=$(wait_out C "$(rand_ms $(( N4 / 10 )) $(( N4 / 3 )))" 120)
"$KB" kill "$WORK/broker"
tk=$(now_ms)
sleep 12
"$KB" restart "$WORK/broker" >/dev/null 2>"$WORK/restart2.txt" || { cat "$WORK/restart2.txt"; fail "broker restart"; }
down=$(( $(now_ms) - tk ))
kill -0 "$W" 2>/dev/null || fail "b2 died while the broker was down"
say "3b broker killed at $c outputs, back after ${down} ms"
cov=$(covered g3 p3 "$WORK/cov-b2")
say "3b committed (p off end) after the restart: $cov- covered"
wait_all s4 300
stop_worker "$W" b2
kept b2
d4=$(( $(now_ms) - t ))
timeouts=$(grep -c 'not delivered: .*timed out' "$WORK/b2.log" || true)
[ "$timeouts" -gt 0 ] || fail "b2: no record timed out while the broker was down (the fault did not happen)"
end4=$(at_log_end g3 p3 4)
fig4=$(verify s4 alo:256)
say "3b broker down > message.timeout.ms: $fig4 timed_out_and_reproduced=$timeouts down_ms=$down run_ms=$d4; $end4"
fi
say "PASS"
