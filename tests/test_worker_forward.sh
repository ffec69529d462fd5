#!/usr/bin/env bash
# Forwarding between the workers of a group (worker/forward.c, README "Forwarding") against a
# real Apache Kafka 4.x broker (scripts/kafka-broker.sh, helpers: tests/faults_lib.sh) and a real
# Redis (the ownership registry), stories260K. Input topic 2 partitions, forward.topic "fwd" 2
# partitions; the consumers use the roundrobin assignor, so each of two workers owns one
# partition of each topic. Worker "a" has a tiny in-flight budget (max.inflight 4, forwarding
# budget 50% = 2 others in flight, at once: forward.overload.ms 0); "b" has the default one.
#   1. Overload, at-least-once: 400 prompts (max_tokens up to 32). a forwards through fwd to the
#      partition b owns; every id is answered exactly once (no worker stops or rebalances),
#      a's forwards > 0 (logged and in /metrics), none to the stale or malformed registry
#      entries the test adds (those are reported, the minute-old one deleted), and the forwarded-in counts of both equal
#      the forwards out.
#   2. Hop limit: 400 more, every second one with the header __spillway.hop=1 (as a forwarded
#      record carries): none of those is forwarded (no forward log line names one; every
#      forward is logged here), others still are (a is over budget all along), every id answered
#      once, and received = forwarded + hop records.
#   2b. Redis (the registry) stopped: no forward any more (a serves its share itself, counted in
#      spillway:forward_no_target_total), every id answered once.
#   3. Exactly-once with forwards and SIGKILL: a new group, both workers exactly-once; 1,200
#      prompts; a (the forwarder) is killed with kill -9 after some committed results and
#      restarted with the same worker.id (fencing its open transaction: its forwards and their
#      input offsets are aborted together), later b (the receiver) too. A read_committed reader
#      of results + DLQ sees every id exactly once.
#   4. Affinity (hosts hx and hy: own cache.host_id and arena, one Redis and secret): a long
#      prompt served on hx puts its KV blocks in hx's index; then requests sharing its first
#      blocks arrive on both partitions: hy's worker forwards its share to hx's, which answers
#      every one.
# Arguments (from ctest): the spillway binary and the models folder.
set -euo pipefail
SPILLWAY=$(realpath "$1")
MODELS=$2
# shellcheck source=tests/faults_lib.sh
. "$(dirname "$0")/faults_lib.sh"
command -v redis-server >/dev/null 2>&1 || { echo "SKIP: redis-server not installed"; exit 77; }
command -v curl >/dev/null 2>&1 || { echo "SKIP: curl not installed"; exit 77; }
faults_init worker-forward
SHM=$("$ROOT/scripts/shm-dir.sh" spillway-forward)
BT_RM+=("$SHM")

broker_start
eval "$("$RS" start "$WORK/redis" | grep -E '^(REDIS_PORT|REDIS_PID)=')"
say "redis on port $REDIS_PORT"
for t in fin fin3 fwd fwd3 results; do bt_topic "$t" 2; done
bt_topic dlq 1

# gen_hop NAME PREFIX N: N prompts, every second one carrying __spillway.hop=1; NAME.in is
# "id<TAB>hop<TAB>value", NAME.ids the ids, NAME.hop the ids with the header.
gen_hop() {
  python3 - "$WORK" "$@" <<'PY'
import json, sys
work, name, pfx, n = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
with open(f"{work}/{name}.in", "w") as f, open(f"{work}/{name}.ids", "w") as g, \
     open(f"{work}/{name}.hop", "w") as h:
    for i in range(n):
        rid = f"{pfx}{i:05d}"
        f.write(f"{rid}\t{i % 2}\t" + json.dumps({"id": rid, "prompt": f"Tom had a dog {i}",
                                                 "max_tokens": 1 + (i * 7) % 32,
                                                 "temperature": 0}) + "\n")
        g.write(rid + "\n")
        if i % 2:
            h.write(rid + "\n")
PY
}
# produce_hop NAME TOPIC: one kcat per record (each with or without the header)
produce_hop() {
  python3 - "$WORK/$1.in" "$BOOTSTRAP" "$2" <<'PY' || fail "producing $1"
import subprocess, sys
path, bootstrap, topic = sys.argv[1:]
plain, hop = [], []
for line in open(path):
    rid, flag, value = line.rstrip("\n").split("\t", 2)
    (hop if flag == "1" else plain).append(f"{rid}\t{value}\n")
# interleaved in time: alternate chunks of 20 from each set
for i in range(0, max(len(plain), len(hop)), 20):
    for recs, extra in ((plain[i:i + 20], []), (hop[i:i + 20], ["-H", "__spillway.hop=1"])):
        if recs:
            subprocess.run(["kcat", "-b", bootstrap, "-P", "-t", topic, "-K", "\t"] + extra,
                           input="".join(recs), text=True, check=True)
PY
}

# reg_ready GROUP FTOPIC N SECONDS: waits until the registry of GROUP/FTOPIC has N entries
# that each own a partition (the assignment has settled)
reg_ready() {
  local end=$(( $(date +%s) + $4 ))
  while :; do
    redis-cli -p "$REDIS_PORT" --raw hgetall "spillway:fwd:$1:$2" >"$WORK/reg.txt" 2>/dev/null || true
    python3 - "$WORK/reg.txt" "$3" <<'PY' && return 0
import sys
lines = open(sys.argv[1]).read().split("\n")
ents = dict(zip(lines[0::2], lines[1::2]))
ok = [k for k, v in ents.items() if v.split(" ")[-1] != "-"]
sys.exit(0 if len(ok) == int(sys.argv[2]) and len(ents) == int(sys.argv[2]) else 1)
PY
    [ "$(date +%s)" -lt "$end" ] || { cat "$WORK/reg.txt"; fail "registry $1/$2 not ready"; }
    sleep 0.3
  done
}

REG=(-s cache.redis.host=127.0.0.1 -s cache.redis.port="$REDIS_PORT" -s cache.arena.mb=32
     -s cache.arena.path="$SHM/arena" -s cache.secret_file="$SHM/secret"
     -s forward.registry.ttl_ms=1500 -s forward.log_per_s=1000000 -s commit.interval.ms=200
     -X consumer.partition.assignment.strategy=roundrobin)
TINY=(-s max.inflight=4 -s forward.overload.pct=50 -s forward.overload.ms=0)

# forwards NAME: forwards logged by worker NAME; sum_log NAME FIELD: from its final
# "forwarding: ..." line
forwards() { grep -c ' INFO forwarded ' "$WORK/$1.log" || true; }
final() {
  sed -n "s/.* INFO forwarding: \([0-9]*\) forwarded (overload [0-9]*, affinity [0-9]*), \([0-9]*\) received.*/\1 \2/p" \
    "$WORK/$1.log" | tail -n 1
}
# once NAME ISOLATION: every id of NAME.ids in results + DLQ exactly once
once() {
  dump "$2"
  python3 - "$WORK" "$1" <<'PY' || fail "$1: not every id exactly once"
import collections, json, sys
work, name = sys.argv[1], sys.argv[2]
want = set(open(f"{work}/{name}.ids").read().split())
n = collections.Counter()
for t in ("results", "dlq"):
    for line in open(f"{work}/{t}.json"):
        k = json.loads(line).get("key")
        if k in want:
            n[k] += 1
missing = want - set(n)
dup = {k: c for k, c in n.items() if c > 1}
print(f"{name}: {len(want)} ids, {len(missing)} missing, {len(dup)} duplicated")
sys.exit(1 if missing or dup else 0)
PY
}

# ---- 1. overload, at-least-once ----
MP=$(bt_free_port)
run_worker a g1 fin -s worker.id=a "${REG[@]}" -s forward.topic=fwd "${TINY[@]}" \
  -s metrics.port="$MP"; A=$WPID
run_worker b g1 fin -s worker.id=b "${REG[@]}" -s forward.topic=fwd; B=$WPID
reg_ready g1 fwd 2 90
say "1: registry: $(tr '\n' ' ' <"$WORK/reg.txt")"
# entries a forwarder must ignore: stale (a minute old, with room and partitions), malformed
now=$(date +%s%3N)
redis-cli -p "$REDIS_PORT" hset spillway:fwd:g1:fwd ghost "1 $(( now - 60000 )) 0 100000 vm 0,1" \
  junk "hello" neg "1 $now -5 3 vm 0" badpart "1 $now 0 9 vm 0,x" >/dev/null
gen s1 P 400 0 32
produce s1 fin
wait_all s1 180
once s1 read_uncommitted
n1=$(forwards a)
[ "$n1" -gt 0 ] || fail "1: a forwarded nothing"
[ "$(forwards b)" -eq 0 ] || fail "1: b (under budget) forwarded"
! grep -E ' INFO forwarded .*\(worker (ghost|junk|neg|badpart)\)' "$WORK/a.log" ||
  fail "1: forwarded to a stale or malformed registry entry"
grep -q 'WARN forward registry .*: 3 malformed entries ignored' "$WORK/a.log" ||
  fail "1: the malformed registry entries were not reported"
[ -z "$(redis-cli -p "$REDIS_PORT" hget spillway:fwd:g1:fwd ghost)" ] ||
  fail "1: the entry a minute old was not deleted"
curl -fsS "http://127.0.0.1:$MP/metrics" >"$WORK/metrics-a.txt" || fail "1: no /metrics"
m=$(sed -n 's/^spillway:forwarded_total{reason="overload"} \([0-9]*\).*/\1/p' "$WORK/metrics-a.txt")
[ "$m" = "$n1" ] || fail "1: spillway:forwarded_total{reason=\"overload\"} is '$m', $n1 forwards logged"
say "1: a forwarded $n1 of 400 (stale and malformed registry entries ignored)"

# ---- 2. hop limit ----
gen_hop s2 H 400
produce_hop s2 fin
wait_all s2 180
once s2 read_uncommitted
! grep -E ' INFO forwarded .*\(id H[0-9]*\)' "$WORK/a.log" "$WORK/b.log" | grep -Ff "$WORK/s2.hop" ||
  fail "2: a record with the hop header was forwarded"
n2=$(( $(forwards a) - n1 ))
[ "$n2" -gt 0 ] || fail "2: a forwarded none of the records without the hop header"
# ---- 2b. Redis down: no registry, no forward (a over budget serves everything itself) ----
"$RS" stop "$WORK/redis" >/dev/null
sleep 2.5 # past forward.registry.ttl_ms: what a read last is stale even before its next sync
gen s2b R 200 0 32
produce s2b fin
wait_all s2b 180
once s2b read_uncommitted
[ "$(forwards a)" -eq $(( n1 + n2 )) ] || fail "2b: a forwarded with the registry down"
curl -fsS "http://127.0.0.1:$MP/metrics" >"$WORK/metrics-a.txt" || fail "2b: no /metrics"
for k in forward_no_target_total forward_registry_errors_total; do
  v=$(sed -n "s/^spillway:$k \([0-9]*\).*/\1/p" "$WORK/metrics-a.txt")
  [ "${v:-0}" -gt 0 ] || fail "2b: spillway:$k is '$v'"
done
say "2b: Redis down: no forward, 200 served where they landed"
stop_worker "$A" a
stop_worker "$B" b
eval "$("$RS" start "$WORK/redis" | grep -E '^(REDIS_PORT|REDIS_PID)=')"
REG=(-s cache.redis.host=127.0.0.1 -s cache.redis.port="$REDIS_PORT" "${REG[@]:4}")
read -r fa ra <<<"$(final a)"
read -r fb rb <<<"$(final b)"
nhop=$(wc -l <"$WORK/s2.hop")
[ "$fa" -eq $(( n1 + n2 )) ] && [ "$fb" -eq 0 ] || fail "2: forwards counted $fa/$fb, logged $((n1 + n2))/0"
[ $(( ra + rb )) -eq $(( fa + fb + nhop )) ] ||
  fail "2: received $ra + $rb, expected forwarded $fa + hop records $nhop"
say "2: a forwarded $n2 more, none of the $nhop hop records; received a=$ra b=$rb"

# ---- 3. exactly-once with forwards, kill -9 of the forwarder and of the receiver ----
EOS=(-s delivery=exactly-once -X producer.transaction.timeout.ms=5000)
run_worker ea g3 fin3 -s worker.id=ea "${REG[@]}" "${EOS[@]}" -s forward.topic=fwd3 "${TINY[@]}"; EA=$WPID
run_worker eb g3 fin3 -s worker.id=eb "${REG[@]}" "${EOS[@]}" -s forward.topic=fwd3; EB=$WPID
reg_ready g3 fwd3 2 90
gen s3 E 1200 0 32
produce s3 fin3
c=$(wait_out E 150 120 read_committed); [ "$c" -ge 150 ] || fail "3: only $c committed outputs"
kill -9 "$EA"; wait "$EA" 2>/dev/null || true
say "3: ea killed at $c committed outputs ($(forwards ea) forwards logged)"
run_worker ea g3 fin3 -s worker.id=ea "${REG[@]}" "${EOS[@]}" -s forward.topic=fwd3 "${TINY[@]}"; EA=$WPID
c=$(wait_out E $(( c + 300 )) 180 read_committed); [ "$c" -ge 450 ] || fail "3: only $c committed outputs after the restart"
kill -9 "$EB"; wait "$EB" 2>/dev/null || true
say "3: eb killed at $c committed outputs"
run_worker eb g3 fin3 -s worker.id=eb "${REG[@]}" "${EOS[@]}" -s forward.topic=fwd3; EB=$WPID
wait_all s3 300 read_committed
once s3 read_committed
stop_worker "$EA" ea
stop_worker "$EB" eb
nf=$(forwards ea)
[ "$nf" -gt 0 ] || fail "3: ea forwarded nothing"
fwd_recs() {
  kcat -b "$BOOTSTRAP" -C -t fwd3 -e -q -o beginning -f '%k\n' -X fetch.wait.max.ms=5 \
    -X isolation.level="$1" 2>/dev/null | wc -l
}
say "3: exactly-once: 1200 ids once under read_committed; ea logged $nf forwards over both runs;" \
  "fwd3 holds $(fwd_recs read_committed) committed forwards, $(fwd_recs read_uncommitted) records in all"

# ---- 4. affinity: to the host whose tier-2 index holds the prefix ----
# x (host hx) alone in the group serves a long prompt, whose blocks land in hx's arena and index;
# then y (host hy, its own arena, the same Redis and secret) joins, and 60 requests that share
# that prompt's first blocks arrive on both partitions: y's are forwarded to x (hx holds them,
# hy none), so x answers every one.
bt_topic fin4 2
bt_topic fwd4 2
python3 - "$WORK" <<'PY'
import json, sys
work = sys.argv[1]
doc = ("Once upon a time, there was a little girl named Lily. She loved to play outside in the "
       "park with her big red ball. One day, the ball rolled under a tall tree and Lily could not "
       "reach it. She asked her friend Tom for help. Tom was kind and strong. He climbed the tree "
       "and got the ball back. Lily was very happy and said thank you. They played together all "
       "day until the sun went down and their moms called them home for dinner. ")
with open(f"{work}/w4.in", "w") as f, open(f"{work}/w4.ids", "w") as g:
    f.write("W0\t" + json.dumps({"id": "W0", "prompt": doc + "The end.", "max_tokens": 2,
                                  "temperature": 0}) + "\n")
    g.write("W0\n")
with open(f"{work}/s4.in", "w") as f, open(f"{work}/s4.ids", "w") as g:
    for i in range(60):
        rid = f"F{i:03d}"
        f.write(f"{rid}\t" + json.dumps({"id": rid, "prompt": doc + f"Question {i}?",
                                          "max_tokens": 2, "temperature": 0}) + "\n")
        g.write(rid + "\n")
PY
AFF=(-s cache.redis.host=127.0.0.1 -s cache.redis.port="$REDIS_PORT" -s cache.arena.mb=32
     -s cache.secret_file="$SHM/secret" -s cache.fleet.refresh_ms=500
     -s forward.registry.ttl_ms=1500 -s forward.log_per_s=1000000 -s forward.overload.pct=0
     -s forward.affinity.min_blocks=2 -s forward.topic=fwd4
     -X consumer.partition.assignment.strategy=roundrobin)
run_worker x g4 fin4 -s worker.id=x -s cache.host_id=hx -s cache.arena.path="$SHM/arena-x" "${AFF[@]}"; X=$WPID
produce w4 fin4
wait_all w4 120
blk_x() { redis-cli -p "$REDIS_PORT" --scan --pattern 'spillway:hx:*:blk' | head -n1 | xargs -r redis-cli -p "$REDIS_PORT" hlen; }
end=$(( $(date +%s) + 30 ))
until [ "$(blk_x)" -ge 2 ] 2>/dev/null; do
  [ "$(date +%s)" -lt "$end" ] || fail "4: hx's index holds no blocks of the warm-up prompt"
  sleep 0.2
done
run_worker y g4 fin4 -s worker.id=y -s cache.host_id=hy -s cache.arena.path="$SHM/arena-y" "${AFF[@]}"; Y=$WPID
reg_ready g4 fwd4 2 90
sleep 1.5 # y's fleet record is read by x's next locate (not needed: y holds nothing) and y's
          # registry view holds x's fresh entry (written every 500 ms)
produce s4 fin4
wait_all s4 120
once s4 read_uncommitted
python3 - "$WORK" <<'PY' || fail "4: a request sharing hx's prefix was answered by y"
import json, sys
work = sys.argv[1]
want = set(open(f"{work}/s4.ids").read().split())
by = {}
for line in open(f"{work}/results.json"):
    m = json.loads(line)
    if m.get("key") in want:
        by[m["key"]] = json.loads(m["payload"])["worker"]
bad = sorted(k for k, v in by.items() if v != "x")
print(f"4: {len(by)} results, by worker: " + ", ".join(f"{w}={sum(v == w for v in by.values())}" for w in sorted(set(by.values()))))
sys.exit(1 if bad else 0)
PY
ny=$(grep -c ' INFO forwarded .*: affinity' "$WORK/y.log" || true)
[ "$ny" -gt 0 ] || fail "4: y forwarded nothing (did its partition get none of the 60?)"
[ "$(forwards x)" -eq 0 ] || fail "4: x (holding the prefix) forwarded"
stop_worker "$Y" y
stop_worker "$X" x
say "4: y forwarded $ny requests to x for affinity; x answered all 60"
say "PASS"
