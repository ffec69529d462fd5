#!/usr/bin/env bash
# Faults, exactly-once, against a real Apache Kafka 4.x broker (scripts/kafka-broker.sh) with
# stories260K (max_tokens 1..4, greedy, threads 1). Helpers and the verifier: tests/faults_lib.sh
# (a read_committed reader of results + DLQ: the ids there must equal the ids produced; it counts
# duplicates). 6,000 prompts over 4 partitions with 5 invalid messages mixed in; every worker is
# `-s delivery=exactly-once -s worker.id=eosw` (one transactional.id), max.inflight 64,
# transactions every 200 ms, -X producer.transaction.timeout.ms=5000 (the broker aborts a
# transaction open longer; it checks every second here, not every 10 s).
#   1. kill -9 of the worker three times at random points (random committed-output counts, at
#      least one more than before, plus a random 0..300 ms), restarted each time; after each
#      kill every input offset below the group's committed offsets has its output under
#      read_committed ("covered").
#   2. 300 longer prompts (1..96 tokens) arrive, so that transactions stay open; kill -STOP for
#      ~9 s, longer than the transaction timeout (and the 3 s consumer session), caught while a
#      transaction is open (the transaction coordinator says Ongoing during the STOP, else
#      the worker is continued and stopped again a moment later); kill -CONT once the broker has
#      aborted the transaction (PrepareAbort/CompleteAbort: checked) and bumped the producer's
#      epoch: the worker must recover (a fence replaces its producer instance, an abortable
#      error aborts; both rewind) and commit more results, not exit, hang, crash or commit a
#      duplicate. (It used to stop on the fence: a network partition longer than the
#      transaction timeout stopped an exactly-once worker.)
#   3. 300 more longer prompts; kill -STOP of the same worker again, in an open transaction (as
#      in 2); a replacement worker with the same worker.id starts during the STOP (its
#      init_transactions fences the stopped one and aborts its open transaction) and takes over
#      the partitions; 5% more prompts arrive; kill -CONT: within 40 s one of the two must exit
#      with status 1 and an "ERROR fatal:" line that says it was fenced (or used an old epoch),
#      the other going on (tests/broker_lib.sh one_fenced): each recovers from one fence, and
#      the first fenced again within transaction.fence.window.ms stops; which one is a race
#      (usually the paused one, when 2 was a fence; when 2 recovered by an abort, their
#      InitProducerId requests can interleave and the replacement may lose).
#   Then the survivor drains everything and stops on SIGTERM with status 0, and: set equality
#   and zero duplicates under read_committed (records of aborted transactions are only counted,
#   from read_uncommitted), DLQ ids included, and the group's committed offsets at the log end of
#   every partition.
# Prints the figures (messages, faults, duplicates, aborted records, DLQ, durations);
# tests/RELIABILITY.md has those of one run. SPILLWAY_FAULTS_SCALE multiplies the message counts,
# SPILLWAY_FAULTS_SEED replays the fault points (tests/faults_lib.sh).
# Arguments (from ctest): the spillway binary and the models folder.
set -euo pipefail
SPILLWAY=$(realpath "$1")
MODELS=$2
# shellcheck source=tests/faults_lib.sh
. "$(dirname "$0")/faults_lib.sh"
faults_init faults-eos
say "seed $SEED, scale $SCALE"

broker_start
for t in pe results; do bt_topic "$t" 4; done
bt_topic dlq 1
say "topics created"

N=$(scaled 6000)
N2=$(( N / 20 ))
gen s5 E "$N" 5
# longer requests (1..96 tokens) produced just before each STOP, so that the worker is busy with
# transactions open when it is stopped, whatever the scale
gen s6 F 300 0 96
gen s7 G 300 0 96
gen s8 H "$N2" 0
cat "$WORK/s5.ids" "$WORK/s6.ids" "$WORK/s7.ids" "$WORK/s8.ids" >"$WORK/all.ids"
produce s5 pe
EOS=(-s delivery=exactly-once -s worker.id=eosw -s max.inflight=64 -s commit.interval.ms=200
     -X producer.transaction.timeout.ms=5000)
# committed_out PREFIX: outputs whose key starts with PREFIX, under read_committed
committed_out() { count_out "$1" read_committed; }
t=$(now_ms)

# ---- 1. kill -9 x3 ----
marks=$(for _ in 1 2 3; do rand_ms $(( N / 10 )) $(( N / 2 )); done | sort -n | tr '\n' ' ')
say "1 kill points (committed outputs): $marks"
k=0
for mark in $marks; do
  k=$((k + 1))
  run_worker e$k ge pe "${EOS[@]}"
  W=$WPID
  # each worker commits something before its kill
  c=$(committed_out E)
  [ "$mark" -gt "$c" ] || mark=$(( c + $(rand_ms 1 $(( N / 20 ))) ))
  c=$(wait_out E "$mark" 120 read_committed)
  [ "$c" -ge "$mark" ] || fail "e$k: only $c committed outputs after 120 s"
  sleep "0.$(printf '%03d' "$(rand_ms 0 300)")"
  kill -0 "$W" 2>/dev/null || fail "e$k exited before its kill"
  kill -9 "$W"
  wait "$W" 2>/dev/null || true
  c=$(committed_out E)
  [ "$c" -lt $((N + 5)) ] || fail "e$k had committed every output before its kill: not mid-run"
  cov=$(covered ge pe "$WORK/cov-e$k" read_committed)
  say "1 kill -9 #$k at $c committed outputs; committed (p off end): $cov- covered"
done

# stop_in_txn NAME PID: kill -STOP PID while its transaction is open: the coordinator's state of
# the transactional id is read while the worker is stopped (the test's admin client, bt_query:
# milliseconds, far below the worker's 3 s session); not "Ongoing": CONT, 0.2 to 1 s of work,
# STOP again, for up to 90 s. Sets ST (the state), TS (when stopped, ms) and TRY.
TXID=spillway-ge-eosw
stop_in_txn() {
  ST= TRY=0
  local until=$(( $(date +%s) + 90 ))
  while [ "$(date +%s)" -lt "$until" ]; do
    TRY=$((TRY + 1))
    kill -STOP "$2"
    TS=$(now_ms)
    ST=$(txn_state "$TXID")
    [ "${ST%% *}" = Ongoing ] && return 0
    kill -CONT "$2"
    local pause
    pause=$(rand_ms 200 1000)
    sleep "$((pause / 1000)).$(printf '%03d' $((pause % 1000)))"
  done
  fail "$1: no open transaction caught by $TRY STOPs in 90 s (last state: $ST)"
}

# ---- 2. kill -STOP longer than the transaction timeout ----
run_worker e4 ge pe "${EOS[@]}"
W=$WPID
produce s6 pe
c=$(committed_out "[EF]")
c=$(wait_out "[EF]" $(( c + $(rand_ms 20 200) )) 120 read_committed)
stop_in_txn e4 "$W"
left=$(( 9000 - ($(now_ms) - TS) ))
[ "$left" -le 0 ] || sleep "$((left / 1000)).$(printf '%03d' $((left % 1000)))"
st2=$(txn_state "$TXID")
kill -CONT "$W"
stop_s=$(secs_since "$TS")
case ${st2%% *} in PrepareAbort|CompleteAbort) ;; *) fail "e4: the broker did not abort the timed-out transaction: $ST -> $st2" ;; esac
say "2 e4 stopped for ${stop_s} s (try $TRY) at ~$c committed outputs: transaction (state epoch ms) $ST -> $st2 by the broker; continued"
# e4 must recover: a fence (the broker's abort bumped the epoch) replaces its producer
# (transaction.fence.window.ms), an abortable error aborts; either rewinds. It used to exit.
outcome=
end=$(( $(date +%s) + 30 ))
while [ "$(date +%s)" -lt "$end" ]; do
  if ! kill -0 "$W" 2>/dev/null; then
    rc=0
    wait "$W" || rc=$?
    fail "e4 exited (status $rc) after the STOP instead of recovering: $(grep ' ERROR fatal: ' "$WORK/e4.log" | head -1 | sed 's/.* ERROR fatal: //' | cut -c1-200)"
  fi
  c2=$(committed_out "[EF]")
  if [ "$c2" -ge $(( c + 100 )) ] || [ "$c2" -ge $((N + 305)) ]; then
    outcome="recovered: $((c2 - c)) more committed outputs ($(grep -c 'fenced (the broker aborted' "$WORK/e4.log" || true) fence(s) recovered, $(grep -c 'transaction aborted\|rewinding' "$WORK/e4.log" || true) abort/rewind log lines)"
    break
  fi
  sleep 0.1
done
[ -n "$outcome" ] || fail "e4 neither exited nor committed more outputs within 30 s of the CONT"
say "2 after kill -CONT: e4 $outcome"

# ---- 3. kill -STOP; a replacement with the same worker.id fences the stopped worker ----
kill -0 "$W" 2>/dev/null || fail "e4 exited after recovering: $(grep ' ERROR fatal: ' "$WORK/e4.log" | head -1 | sed 's/.* ERROR fatal: //' | cut -c1-200)"
OLD=$W
OLDN=e4
produce s7 pe
c=$(committed_out "[EFG]")
c=$(wait_out "[EFG]" $(( c + $(rand_ms 20 200) )) 120 read_committed)
stop_in_txn "$OLDN" "$OLD"
run_worker e6 ge pe "${EOS[@]}"
NEW=$WPID
for _ in $(seq 1 150); do grep -q ' INFO started: ' "$WORK/e6.log" && break; sleep 0.2; done
grep -q ' INFO started: ' "$WORK/e6.log" || fail "e6 did not start"
produce s8 pe
c=$(committed_out "[EFGH]")
c2=$(wait_out "[EFGH]" $(( c + 50 )) 120 read_committed)
[ "$c2" -ge $(( c + 50 )) ] || fail "the replacement e6 committed only $((c2 - c)) outputs in 120 s"
kill -CONT "$OLD"
say "3 $OLDN stopped $(secs_since "$TS") s in an open transaction ($ST; try $TRY); e6 (same worker.id) started and committed $((c2 - c)) more; $OLDN continued"
one_fenced "$OLD" "$OLDN" "$NEW" e6 40
say "3 $FENCED_NAME exited with status 1 ($SURV_NAME goes on): $(grep ' ERROR fatal: ' "$WORK/$FENCED_NAME.log" | head -1 | sed 's/.* ERROR fatal: //' | cut -c1-160)"

wait_all all 300 read_committed
stop_worker "$SURV_PID" "$SURV_NAME"
d=$(( $(now_ms) - t ))
end=$(at_log_end ge pe 4)
fig=$(verify all exact)
unc=$(count_out "[EFGH]" read_uncommitted)
aborts=$(cat "$WORK"/e*.log | grep -c 'transaction aborted' || true)
say "exactly-once, 3 kill -9, 2 kill -STOP: $fig read_uncommitted=$unc ($(( unc - $(sed 's/.*records=\([0-9]*\).*/\1/' "$WORK/all.fig") )) from aborted transactions) worker_aborts_logged=$aborts run_ms=$d; $end"
say "PASS"
