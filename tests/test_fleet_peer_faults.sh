#!/usr/bin/env bash
# tests/test_fleet_peer_faults.sh SPILLWAY MODELS: KV across hosts under faults on the multi-host
# test bed (scripts/fleet-bed.sh, issue 23): a host cut off and a worker killed while the other
# hosts fetch from it, exactly-once.
#
# Three hosts (network namespaces) x one worker, exactly-once, 6 partitions, stories260K; every
# host serves its arena (cache.peer.listen={host_ip}:7070). The fleet registry's TTL is set past
# the test's length, so a cut or killed host stays "live" to the others and every request whose
# prefix only that host holds tries to fetch from it: the fallbacks checked below do not depend
# on when the faults land; Redis commands get 1 s (not 50 ms), so a loaded machine does not turn
# tier 2 off for a moment and skip a lookup, a locate or a forward. Documents are about 27 KV
# blocks (about 440 tokens) long, where the cost model's fetch estimate is far below its
# recompute estimate.
#   map     one probe per partition (kcat -p), whose results' "worker" field tells which host
#           owns it (done again after every rebalance the test causes);
#   warm    documents D2a, D2b, D2c computed on host 2 only, D1b, D1c on host 1 only (sent to
#           those hosts' partitions); waits until both hosts' Redis indexes hold still;
#   fetch   D2a with new questions sent to hosts 1 and 3: they fetch from host 2 (their
#           peer_kv_fetches_total and received blocks grow; the results report cached tokens);
#   cut     D2b sent to hosts 1 and 3, host 2 cut off at once (its packets dropped), then D2c:
#           each first D2c request on hosts 1 and 3 dials host 2 and falls back to recomputing
#           after cache.peer.timeout_ms (their peer_kv_fallbacks_total grows); 60 requests keyed
#           by id go to every partition meanwhile; once hosts 1 and 3 hold all 6 partitions,
#           host 2 is restored;
#   kill    D1b sent to hosts 2 and 3, host 1's worker killed (SIGKILL) at once, then D1c: the
#           dials to host 1 find no listener (hosts 2 and 3 count the fallbacks); 60 requests
#           keyed by id; once all are answered host 1's worker is started again.
# With FLEET_FORWARD=1 (tests/test_fleet_forward_faults.sh) forwarding is on as well
# (forward.topic, affinity from 4 blocks, no overload forwarding, so the probes stay where they
# land; the roundrobin assignor): in "fetch" hosts 1 and 3 forward the D2a requests to host 2 (their forwarded_total
# grows, host 2 answers them) instead of fetching; in "cut" and "kill" the requests for the
# faulty host's prefixes are forwarded to it (while its registry entry is fresh) just before
# and after the fault, so the fault lands on forwards in flight too; what nobody serves there is
# served by the host that takes the partition over, which dials the faulty host for the prefix
# and falls back (the same fallback checks hold).
# Then every id sent is in the committed results exactly once (read_committed), none in the DLQ,
# every result finished by length or stop, and every worker runs. The bed is taken down at exit
# whatever happened (and by its watchdog if this script is killed).
# Skips (77) when not root, when ip netns does not work, or without the broker's tools.
set -euo pipefail
# shellcheck source=tests/fleet_lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/fleet_lib.sh"
command -v redis-cli >/dev/null 2>&1 || { echo "SKIP: no redis-cli"; exit 77; }
FORWARD=${FLEET_FORWARD:-0}
if [ "$FORWARD" = 1 ]; then fleet_init fleet_forward_faults "$1" "$2"; else fleet_init fleet_peer_faults "$1" "$2"; fi
: >"$WORK/sent.txt"

# request ID TEXT: one request line (JSON) for prompt TEXT.
request() {
  jq -cn --arg id "$1" --arg p "$2" '{id: $id, prompt: $p, max_tokens: 4, temperature: 0}'
}

# to_partition P ID TEXT: sends request ID to partition P.
to_partition() {
  request "$2" "$3" | kcat -P -b "$BOOTSTRAP" -t prompts -p "$1" 2>>"$WORK/produce.log" ||
    fail "kcat -P to partition $1 failed"
  echo "$2" >>"$WORK/sent.txt"
}

# to_host H ID TEXT: sends request ID to a partition host H's worker owned at the last map.
to_host() {
  local p=${OWNED[$1]%% *}
  [ -n "$p" ] || fail "host $1 owns no partition"
  to_partition "$p" "$2" "$3"
}

# keyed PREFIX COUNT: COUNT short requests keyed by their id (spread over every partition).
keyed() {
  local i
  for i in $(seq 1 "$2"); do request "$1$i" "Once upon a time, in a house number $i, there"; done \
    >"$WORK/keyed-$1.jsonl"
  "$SPILLWAY" produce -b "$BOOTSTRAP" -t prompts --key-prefix 0 "$WORK/keyed-$1.jsonl" \
    2>>"$WORK/produce.log" || fail "produce failed"
  jq -r .id "$WORK/keyed-$1.jsonl" >>"$WORK/sent.txt"
}

# committed TOPIC: every committed record of TOPIC, one a line.
committed() {
  kcat -C -b "$BOOTSTRAP" -t "$1" -o beginning -e -q -X isolation.level=read_committed \
    -X fetch.wait.max.ms=5 -f '%s\n' 2>/dev/null
}

# wait_sent SECONDS: until every id sent so far is in the committed results.
wait_sent() {
  local deadline=$(( $(date +%s) + $1 )) want got
  want=$(sort -u "$WORK/sent.txt" | wc -l)
  while :; do
    got=$(comm -12 <(sort -u "$WORK/sent.txt") <(committed results | jq -r '.id // empty' | sort -u) | wc -l)
    [ "$got" -ge "$want" ] && return 0
    [ "$(date +%s)" -lt "$deadline" ] || fail "$got of $want requests answered after $1 s"
    sleep 1
  done
}

# result_of ID: the committed result of ID.
result_of() { committed results | jq -c --arg id "$1" 'select(.id == $id)' | head -n 1; }

# map TAG: one probe per partition; OWNED[H] = the partitions host H's worker answered. Probes
# again (after `fleet-bed.sh wait`) while a host answered none: a group that has just settled
# may rebalance once more (a worker back from a cut rejoins), and the probes then land on the
# others.
map() {
  local p r h try
  for try in 1 2 3 4 5 6 7 8 9 10; do
    OWNED=([1]="" [2]="" [3]="")
    for p in $(seq 0 5); do to_partition "$p" "map$1.$try-$p" "The probe number $p said"; done
    wait_sent 180
    for p in $(seq 0 5); do
      r=$(result_of "map$1.$try-$p")
      h=$(jq -r .worker <<<"$r" | sed -n 's/^h\([0-9]\)w0$/\1/p')
      [ -n "$h" ] || fail "probe map$1.$try-$p: no worker in its result: $r"
      OWNED[$h]="${OWNED[$h]}$p "
    done
    say "map $1.$try: host 1 owns ${OWNED[1]:-none}, host 2 ${OWNED[2]:-none}, host 3 ${OWNED[3]:-none}"
    [ -n "${OWNED[1]}" ] && [ -n "${OWNED[2]}" ] && [ -n "${OWNED[3]}" ] && return 0
    sleep 2
    "$FB" wait "$BED" 120 || fail "the group did not settle"
  done
  fail "a host owned no partition in 10 maps"
}

# metric H NAME: the sum of host H's samples whose name (labels included) starts with NAME
# (NA when the worker does not answer).
metric() {
  { curl -s -m 5 "http://$NET.$(( 10 + $1 )):9100/metrics" || true; } |
    awk -v k="$2" 'index($1, k) == 1 { s += $2; f = 1 } END { if (f) printf "%d\n", s; else print "NA" }'
}

# fallbacks H...: the sum of the hosts' peer_kv_fallbacks_total (every reason).
fallbacks() {
  local h n s=0
  for h in "$@"; do
    n=$(metric "$h" 'spillway:peer_kv_fallbacks_total')
    [ "$n" != NA ] || fail "host $h's worker does not answer /metrics"
    s=$(( s + n ))
  done
  echo "$s"
}

# indexed H: blocks in host H's Redis index.
indexed() {
  local k
  k=$(redis-cli -h "$REDIS_HOST" -p "$REDIS_PORT" --scan --pattern "spillway:h$1:*:blk" | head -n 1)
  [ -n "$k" ] && redis-cli -h "$REDIS_HOST" -p "$REDIS_PORT" hlen "$k" || echo 0
}

# settle_index H: until host H's index count holds still (its writer thread indexes after the
# results).
settle_index() {
  local prev=-1 same=0 n
  for _ in $(seq 1 200); do
    n=$(indexed "$1")
    if [ "$n" = "$prev" ] && [ "$n" -gt 0 ]; then same=$((same + 1)); else same=0; fi
    [ "$same" -ge 4 ] && { say "host $1: $n blocks indexed"; return 0; }
    prev=$n
    sleep 0.3
  done
  fail "host $1's index did not settle ($n blocks)"
}

# doc NAME: one line of about 440 stories260K tokens that starts with NAME (its own blocks).
WORDS=$(tr -s ' \n' ' ' <"$ROOT/bench/texts/heldout-story.txt")
doc() {
  local s="$1. " off
  off=$(( $(cksum <<<"$1" | cut -d' ' -f1) % 200 ))
  s+=${WORDS:$off:900}
  echo "${s% *}"
}
question() { echo " Question $1: who is in the story?"; }

EXTRA=()
if [ "$FORWARD" = 1 ]; then
  # roundrobin: each worker owns 2 of the input topic's partitions (the default assignor
  # balances over both topics together and may leave a worker none of the input's)
  EXTRA=(--topic forward:6 -s forward.topic=forward -s forward.affinity.min_blocks=4
         -s forward.overload.pct=0 -X consumer.partition.assignment.strategy=roundrobin)
fi
say "bed up: 3 hosts x 1 worker, exactly-once, peer KV on$([ "$FORWARD" = 1 ] && echo ', forwarding on')"
"$FB" up "$BED" -m "$MODEL" --spillway "$SPILLWAY" --hosts 3 --workers 1 --partitions 6 \
  --exactly-once -s commit.interval.ms=200 -s kv.mem_mb=16 "${EXTRA[@]}" \
  -s 'cache.peer.listen={host_ip}:7070' -s cache.peer.timeout_ms=1000 \
  -s cache.fleet.refresh_ms=500 -s cache.fleet.ttl_ms=3600000 -s cache.redis.timeout_ms=1000 \
  -X consumer.session.timeout.ms=6000 -X consumer.heartbeat.interval.ms=500 \
  >"$WORK/up.log" 2>&1 || { cat "$WORK/up.log"; fail "fleet-bed.sh up failed"; }
eval "$("$FB" env "$BED" | grep -E '^(BOOTSTRAP|NET|BED_ID|REDIS_HOST|REDIS_PORT|CONSUMED)=')"
say "bed $BED_ID: broker $BOOTSTRAP, redis $REDIS_HOST:$REDIS_PORT, hosts on $NET.0/24"

declare -A OWNED
map 1
say "warm: D2a D2b D2c on host 2, D1b D1c on host 1"
for d in D2a D2b D2c; do to_host 2 "warm-$d" "$(doc "$d")$(question 0)"; done
for d in D1b D1c; do to_host 1 "warm-$d" "$(doc "$d")$(question 0)"; done
wait_sent 180
settle_index 1
settle_index 2
for h in 1 2 3; do
  grep -q 'peer server: serving this host' "$BED"/hosts/h$h/*.log || fail "host $h does not serve"
done
for id in warm-D2a warm-D1b; do
  r=$(result_of "$id")
  [ "$(jq '.usage.prompt_tokens' <<<"$r")" -gt 320 ] || fail "$id is too short: $r"
done

say "fetch: D2a on hosts 1 and 3 from host 2"
to_host 1 fetch-1 "$(doc D2a)$(question 1)"
to_host 3 fetch-3 "$(doc D2a)$(question 3)"
wait_sent 180
for h in 1 3; do
  [ "$FORWARD" = 1 ] || continue
  f=$(metric "$h" 'spillway:forwarded_total')
  r=$(result_of "fetch-$h")
  say "host $h: $f forward(s); fetch-$h answered by $(jq -r .worker <<<"$r"), cached_tokens $(jq .usage.cached_tokens <<<"$r")"
  [ "$f" != NA ] && [ "$f" -ge 1 ] && [ "$(jq -r .worker <<<"$r")" = h2w0 ] &&
    [ "$(jq .usage.cached_tokens <<<"$r")" -gt 0 ] || fail "host $h did not forward fetch-$h to host 2"
done
for h in 1 3; do
  [ "$FORWARD" = 1 ] && continue
  f=$(metric "$h" 'spillway:peer_kv_fetches_total')
  b=$(metric "$h" 'spillway:peer_kv_blocks_total{dir="received"}')
  c=$(result_of "fetch-$h" | jq '.usage.cached_tokens')
  say "host $h: $f fetch(es), $b block(s) received, fetch-$h cached_tokens $c"
  [ "$f" != NA ] && [ "$f" -ge 1 ] && [ "$b" -ge 1 ] && [ "$c" -gt 0 ] ||
    fail "host $h fetched nothing from host 2"
done
FALL1=$(fallbacks 1 3)

say "cut: host 2 cut off while hosts 1 and 3 fetch from it"
to_host 1 cut-b1 "$(doc D2b)$(question 1)"
to_host 3 cut-b3 "$(doc D2b)$(question 3)"
"$FB" cut "$BED" 2 drop
to_host 1 cut-c1 "$(doc D2c)$(question 1)"
to_host 3 cut-c3 "$(doc D2c)$(question 3)"
keyed cutk 60
deadline=$(( $(date +%s) + 90 ))
while :; do
  a=$(metric 1 spillway:partitions_assigned) b=$(metric 3 spillway:partitions_assigned)
  # every partition the group consumes (with forwarding, the forward topic's too)
  [ "$a" != NA ] && [ "$b" != NA ] && [ $(( a + b )) = "$CONSUMED" ] && break
  [ "$(date +%s)" -lt "$deadline" ] || fail "hosts 1 and 3 hold $a + $b of $CONSUMED partitions 90 s after host 2 was cut off"
  sleep 0.5
done
say "hosts 1 and 3 took over host 2's partitions ($a + $b)"
wait_sent 300
FALL2=$(fallbacks 1 3)
say "hosts 1 and 3: fetch fallbacks $FALL1 before the cut, $FALL2 after$([ "$FORWARD" = 1 ] &&
  echo "; forwards $(metric 1 spillway:forwarded_total) + $(metric 3 spillway:forwarded_total)")"
[ "$FALL2" -gt "$FALL1" ] || fail "no fetch fallback counted while host 2 was cut off"
"$FB" restore "$BED" 2
"$FB" wait "$BED" 120 || fail "the group did not settle after host 2 came back"
map 2

say "kill: host 1's worker killed while hosts 2 and 3 fetch from it"
FALL3=$(fallbacks 2 3)
to_host 2 kill-b2 "$(doc D1b)$(question 2)"
to_host 3 kill-b3 "$(doc D1b)$(question 3)"
"$FB" kill "$BED" 1 0
to_host 2 kill-c2 "$(doc D1c)$(question 2)"
to_host 3 kill-c3 "$(doc D1c)$(question 3)"
keyed killk 60
wait_sent 300
FALL4=$(fallbacks 2 3)
say "hosts 2 and 3: fetch fallbacks $FALL3 before the kill, $FALL4 after$([ "$FORWARD" = 1 ] &&
  echo "; forwards $(metric 2 spillway:forwarded_total) + $(metric 3 spillway:forwarded_total)")"
[ "$FALL4" -gt "$FALL3" ] || fail "no fetch fallback counted after host 1's worker was killed"
"$FB" start "$BED" 1 0
"$FB" wait "$BED" 120 || fail "the group did not settle after host 1's worker came back"
map 3
wait_sent 120

# exactly once: every id sent, once, in the committed results; nothing in the DLQ
committed results >"$WORK/results.jsonl"
got=$(jq -r '.id // empty' "$WORK/results.jsonl" | sort)
sort -u "$WORK/sent.txt" >"$WORK/want.txt"
dups=$(uniq -d <<<"$got" | wc -l)
missing=$(comm -23 "$WORK/want.txt" <(uniq <<<"$got") | wc -l)
extra=$(comm -13 "$WORK/want.txt" <(uniq <<<"$got") | wc -l)
dlq=$(committed prompts.dlq | wc -l)
odd=$(jq -r 'select(.finish_reason != "length" and .finish_reason != "stop") | .id' "$WORK/results.jsonl" | wc -l)
say "results: $(wc -l <<<"$got") records for $(wc -l <"$WORK/want.txt") ids, $dups duplicated, $missing missing, $extra unknown, $odd not finished by length or stop; DLQ $dlq"
[ "$dups" = 0 ] || fail "duplicated ids: $(uniq -d <<<"$got" | head -5 | tr '\n' ' ')"
[ "$missing" = 0 ] && [ "$extra" = 0 ] || fail "the results' ids differ from the requests'"
[ "$dlq" = 0 ] || fail "$dlq dead letter(s)"
[ "$odd" = 0 ] || fail "$odd result(s) not finished by length or stop"
st=$("$FB" status "$BED")
for h in 1 2 3; do
  grep -q "worker h${h}w0: pid [0-9]* running" <<<"$st" || fail "worker of host $h is not running"
done
say "PASS"
