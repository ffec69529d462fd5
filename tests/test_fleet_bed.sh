#!/usr/bin/env bash
# tests/test_fleet_bed.sh SPILLWAY MODELS: the multi-host test bed (scripts/fleet-bed.sh, issue 23
# item 4) with its faults, exactly-once.
#
# Three hosts (network namespaces) x one worker, exactly-once, 6 partitions. Phase 1: 60 requests,
# every id answered exactly once (the results topic read read_committed). Phase 2: 300 more sent
# in five parts; after the first, host 2 is cut off (its bridge port drops every packet) until
# the group has moved all 6 partitions to hosts 1 and 3, then restored; after the third, the
# worker of host 3 gets SIGKILL and is started again; after the fifth, host 1's worker is
# stopped and started (its partitions move away and back). Then every one of the 360 ids must be
# in the results exactly once, none in the DLQ, and every worker must be running. The bed is taken
# down at exit whatever happened (and by its watchdog if this script is killed).
# Skips (77) when not root, when ip netns does not work, or without the broker's tools.
set -euo pipefail
# shellcheck source=tests/fleet_lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/fleet_lib.sh"
fleet_init fleet_bed "$1" "$2"

# send FIRST COUNT: requests r<FIRST>..r<FIRST+COUNT-1>, keyed by id (spread over partitions).
send() {
  local i
  for i in $(seq "$1" $(( $1 + $2 - 1 ))); do
    printf '{"id":"r%04d","prompt":"Once upon a time, in a house number %d, there","max_tokens":16,"temperature":0}\n' "$i" "$i"
  done >"$WORK/req-$1.jsonl"
  "$SPILLWAY" produce -b "$BOOTSTRAP" -t prompts --key-prefix 0 "$WORK/req-$1.jsonl" \
    2>>"$WORK/produce.log" || fail "produce failed"
}

# committed_ids TOPIC: the id of every committed record of TOPIC, one a line (repeats kept).
committed_ids() {
  kcat -C -b "$BOOTSTRAP" -t "$1" -o beginning -e -q -X isolation.level=read_committed \
    -X fetch.wait.max.ms=5 -f '%s\n' 2>/dev/null | jq -r '.id // empty'
}

# wait_answered N SECONDS: until N distinct ids are in the results.
wait_answered() {
  local deadline=$(( $(date +%s) + $2 )) n
  while :; do
    n=$(committed_ids results | sort -u | wc -l)
    [ "$n" -ge "$1" ] && return 0
    [ "$(date +%s)" -lt "$deadline" ] || fail "$n of $1 requests answered after $2 s"
    sleep 1
  done
}

# check_exactly_once N: r0000..r<N-1> each exactly once in the results, nothing in the DLQ.
check_exactly_once() {
  local got dups missing extra dlq
  got=$(committed_ids results | sort)
  dups=$(uniq -d <<<"$got" | wc -l)
  seq -f 'r%04g' 0 $(( $1 - 1 )) >"$WORK/want.txt"
  missing=$(comm -23 "$WORK/want.txt" <(uniq <<<"$got") | wc -l)
  extra=$(comm -13 "$WORK/want.txt" <(uniq <<<"$got") | wc -l)
  dlq=$(committed_ids prompts.dlq | wc -l)
  say "results: $(wc -l <<<"$got") records, $dups duplicated id(s), $missing missing, $extra unknown; DLQ $dlq"
  [ "$dups" = 0 ] || fail "duplicated ids: $(uniq -d <<<"$got" | head -5 | tr '\n' ' ')"
  [ "$missing" = 0 ] && [ "$extra" = 0 ] || fail "the results' ids differ from the requests'"
  [ "$dlq" = 0 ] || fail "$dlq dead letter(s)"
}

# partitions_of H: partitions assigned to host H's worker (empty when it does not answer).
partitions_of() {
  { curl -s -m 2 "http://$NET.$(( 10 + $1 )):9100/metrics" || true; } |
    awk '$1 == "spillway:partitions_assigned" { print int($2) }'
}

say "bed up: 3 hosts x 1 worker, exactly-once"
"$FB" up "$BED" -m "$MODEL" --spillway "$SPILLWAY" --hosts 3 --workers 1 --partitions 6 \
  --exactly-once -s commit.interval.ms=200 -s kv.mem_mb=16 \
  -X consumer.session.timeout.ms=6000 -X consumer.heartbeat.interval.ms=500 \
  >"$WORK/up.log" 2>&1 || { cat "$WORK/up.log"; fail "fleet-bed.sh up failed"; }
eval "$("$FB" env "$BED" | grep -E '^(BOOTSTRAP|NET|BED_ID)=')"
say "bed $BED_ID: broker $BOOTSTRAP, hosts on $NET.0/24"
ip netns list | grep -q "^swb$BED_ID-h3" || fail "no namespace for host 3"

say "phase 1: 60 requests"
send 0 60
wait_answered 60 120
check_exactly_once 60

say "phase 2: 300 requests, host 2 cut off, worker of host 3 killed, host 1's moved"
send 60 60
"$FB" cut "$BED" 2 drop
send 120 60
deadline=$(( $(date +%s) + 60 ))
while :; do
  a=$(partitions_of 1) b=$(partitions_of 3)
  [ $(( ${a:-0} + ${b:-0} )) = 6 ] && break
  [ "$(date +%s)" -lt "$deadline" ] || fail "hosts 1 and 3 hold ${a:-?} + ${b:-?} partitions 60 s after host 2 was cut off"
  sleep 0.5
done
say "hosts 1 and 3 took over host 2's partitions ($a + $b)"
[ -z "$(partitions_of 2)" ] || fail "host 2's worker still answers from across the cut"
"$FB" restore "$BED" 2
send 180 60
"$FB" kill "$BED" 3 0
send 240 60
"$FB" start "$BED" 3 0
send 300 60
"$FB" move "$BED" 1 0
wait_answered 360 300
check_exactly_once 360
st=$("$FB" status "$BED")
for h in 1 2 3; do
  grep -q "worker h${h}w0: pid [0-9]* running" <<<"$st" || fail "worker of host $h is not running"
done
# after the cut, host 2 rejoined the group: every worker holds partitions again
"$FB" wait "$BED" 120 || fail "the group did not settle again"
say "PASS"
