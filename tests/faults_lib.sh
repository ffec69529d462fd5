# shellcheck shell=bash
# Helpers of the fault-injection tests tests/test_faults_*.sh (sourced, not a test itself; first
# written for test_faults_alo.sh and test_faults_eos.sh): a real broker (scripts/kafka-broker.sh), input generation,
# workers, the group's committed offsets and the verifier.
#
# The verifier reads the results and DLQ topics with kcat -J -X isolation.level=read_committed
# (as a downstream reader would) and checks, for the ids of one scenario (the record key: every
# input message is keyed by its id, and results and dead letters keep their input's key), that
# the ids in results plus DLQ equal the ids produced, and counts duplicates.
#
# Committed offsets and transaction states come from the test's one Kafka admin client
# (tests/broker_lib.sh's bt_query, tests/kafka/KafkaQuery.java): the group coordinator's and the
# transaction coordinator's answers, as kafka-consumer-groups.sh and kafka-transactions.sh print
# them, in milliseconds (a JVM start per question took seconds, and a worker stopped while one
# started could outlast its session).
#
# kcat reads with fetch.wait.max.ms=5: at the log end it would otherwise wait 500 ms for -e.
#
# Environment:
#   SPILLWAY_FAULTS_SCALE  multiplies the message counts (default 1; 0.3 is enough to see every
#                          fault once on a slow machine)
#   SPILLWAY_FAULTS_SEED   the seed of the random fault points (default: random, printed)
#   SPILLWAY_FAULTS_KEEP   1: keep the work folder (printed) instead of removing it (a failed
#                          run always keeps it)
#   SPILLWAY_FAULTS_ONLY   scenario numbers to run, e.g. "2 3" (default: all)

# shellcheck source=tests/broker_lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/broker_lib.sh"

# faults_init NAME: bt_init (checks, work folder, exit trap, T0) with the test script's SPILLWAY
# and MODELS, then the fault tests' own settings. The work folder is kept when
# SPILLWAY_FAULTS_KEEP=1 or a test failed (fail marks it).
faults_init() {
  bt_init "$1" "$SPILLWAY" "$MODELS"
  BT_KEEP=${SPILLWAY_FAULTS_KEEP:-0}
  SCALE=${SPILLWAY_FAULTS_SCALE:-1}
  SEED=${SPILLWAY_FAULTS_SEED:-$(( (RANDOM << 15) | RANDOM ))}
  RANDOM=$SEED
}

# At exit (bt_cleanup, after the kill -9 of PIDS): a stopped (SIGSTOP) worker is continued too.
bt_at_exit() {
  local p
  for p in "${PIDS[@]}"; do kill -CONT "$p" 2>/dev/null || true; done
}

now_ms() { date +%s%3N; }
# secs_since MS: seconds since MS (now_ms), one decimal
secs_since() { local d=$(( $(now_ms) - $1 )); printf '%d.%d' $((d / 1000)) $((d % 1000 / 100)); }
# scenario N: true when scenario N is to run (SPILLWAY_FAULTS_ONLY)
scenario() { [ -z "${SPILLWAY_FAULTS_ONLY:-}" ] || [[ " $SPILLWAY_FAULTS_ONLY " == *" $1 "* ]]; }
# scaled N: N times SPILLWAY_FAULTS_SCALE, at least 40
scaled() { python3 -c "import sys; print(max(40, int(float(sys.argv[1]) * float(sys.argv[2]))))" "$1" "$SCALE"; }
# rand_ms LO HI: a random integer in [LO, HI]
rand_ms() { echo $(( $1 + (RANDOM * 32768 + RANDOM) % ($2 - $1 + 1) )); }

# fail MESSAGE: the message, the workers' and the broker's recent warnings; keeps the work folder.
# On stderr, as it may run inside $(...).
fail() {
  exec >&2
  echo "FAIL: $*"
  : >"$WORK/.failed"
  local f
  for f in "$WORK"/*.log; do
    [ -f "$f" ] || continue
    echo "--- $f (warnings, rebalances, end)"
    grep -E ' (WARN|ERROR) | INFO (assigned|revoked|lost|started|stopped)' "$f" | tail -n 12 | cut -c1-300
    tail -n 4 "$f" | cut -c1-300
  done
  [ -f "$WORK/broker/server.log" ] &&
    { echo "--- broker errors"; grep -E 'ERROR|FATAL' "$WORK/broker/server.log" | tail -n 5 | cut -c1-300; }
  exit 1
}

# broker_start: a broker whose consumer sessions may be 1 s and whose timed-out transactions are
# aborted within a second of their timeout (the default checks every 10 s).
broker_start() {
  export SPILLWAY_KAFKA_PROPS="group.min.session.timeout.ms=1000
transaction.abort.timed.out.transaction.cleanup.interval.ms=1000"
  bt_broker
  say "broker at $BOOTSTRAP (ready in $(sed -n 's/^STARTUP_MS=//p' "$WORK/broker/env") ms)"
}

# gen NAME PREFIX N NBAD [MAXTOK]: N prompts (ids PREFIX00000.., max_tokens 1..MAXTOK (default
# 4), greedy) with NBAD invalid messages spread among them (ids PREFIX-bad-K: each fails
# validation for a different reason). Writes NAME.in (kcat "key<TAB>value" lines, keyed by id)
# and NAME.ids.
gen() {
  python3 - "$WORK" "$@" <<'PY'
import json, sys
work, name, pfx, n, nbad = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
maxtok = int(sys.argv[6]) if len(sys.argv) > 6 else 4
prefixes = ["Once upon a time, there was a little girl named Lily. She",
            "Tom and his dog went to the park.", "The sun was shining and", "Sue had a red ball."]
bad = [lambda i: "not json at all",
       lambda i: json.dumps({"id": i}),                                          # missing_prompt
       lambda i: json.dumps({"id": i, "prompt": "x", "temperature": "hot"}),     # wrong_type
       lambda i: json.dumps({"id": i, "prompt": ""}),                            # empty_prompt
       lambda i: json.dumps({"id": i, "prompt": "x", "max_tokens": -3})]         # bad_parameter
lines, ids = [], []
every = n // (nbad + 1) if nbad else n + 1
k = 0
for i in range(n):
    rid = f"{pfx}{i:05d}"
    lines.append(rid + "\t" + json.dumps({"id": rid, "prompt": f"{prefixes[i % 4]} {i}",
                                          "max_tokens": 1 + (i * 7) % maxtok, "temperature": 0}))
    ids.append(rid)
    if (i + 1) % every == 0 and k < nbad:
        bid = f"{pfx}-bad-{k}"
        lines.append(bid + "\t" + bad[k % len(bad)](bid))
        ids.append(bid)
        k += 1
open(f"{work}/{name}.in", "w").write("".join(l + "\n" for l in lines))
open(f"{work}/{name}.ids", "w").write("".join(i + "\n" for i in ids))
PY
}

# produce NAME TOPIC: sends NAME.in (keys = ids) with kcat (idempotent: no duplicate input on a
# retry); fails unless all were delivered.
produce() {
  local n
  n=$(wc -l <"$WORK/$1.in")
  kcat -b "$BOOTSTRAP" -P -t "$2" -K '\t' -l -X enable.idempotence=true "$WORK/$1.in" \
    2>"$WORK/produce-$1.txt" || { cat "$WORK/produce-$1.txt"; fail "producing $1"; }
  ! grep -q 'Delivery failed' "$WORK/produce-$1.txt" ||
    { head -n 5 "$WORK/produce-$1.txt"; fail "producing $1: not every message was delivered"; }
  say "produced $n messages to $2 ($(grep -c -- '-bad-' "$WORK/$1.ids") invalid)"
}

# run_worker NAME GROUP TOPIC [spillway worker options]: logs to $WORK/NAME.log; sets WPID.
# 3 s consumer sessions, so that a killed worker's partitions move within seconds.
run_worker() {
  local name=$1 group=$2 topic=$3
  shift 3
  "$SPILLWAY" worker -b "$BOOTSTRAP" -t "$topic" -o results -d dlq -g "$group" -m "$MODEL" \
    -s threads=1 -s kv.mem_mb=64 -s log.level=info -X log_level=4 \
    -X consumer.session.timeout.ms=3000 -X consumer.max.poll.interval.ms=3000 \
    -X consumer.heartbeat.interval.ms=500 "$@" >>"$WORK/$name.log" 2>&1 &
  WPID=$!
  PIDS+=("$WPID")
}

# drain_backlog N TOPIC [spillway worker options]: the max throughput run of the benchmarks: N
# requests (ids M00000..) produced to TOPIC, drained by one worker (w0, group g0) with the options
# given, then stopped; the results' timestamps (ms, ascending) into $WORK/max.ts. Fails when fewer
# than N results come within 600 s.
drain_backlog() {
  local n=$1 topic=$2 w c
  shift 2
  gen mx M "$n" 0
  produce mx "$topic"
  run_worker w0 g0 "$topic" -s worker.id=w0 "$@"
  w=$WPID
  c=$(wait_out M "$n" 600)
  [ "$c" -ge "$n" ] || fail "max: $c of $n results"
  stop_worker "$w" w0
  kcat -b "$BOOTSTRAP" -C -t results -e -q -o beginning -f '%k %T\n' -X fetch.wait.max.ms=5 2>/dev/null |
    awk '$1 ~ /^M/ { print $2 }' | sort -n >"$WORK/max.ts"
}

# redis_start PORT: a redis-server on 127.0.0.1:PORT (no persistence, its files in $WORK/redis),
# once it answers PING; RPID is its pid (in PIDS: killed at exit). Unlike scripts/redis-server.sh
# it takes the port it is given, so a killed server comes back where its clients look for it.
redis_start() {
  mkdir -p "$WORK/redis"
  (exec redis-server --bind 127.0.0.1 --port "$1" --save '' --appendonly no --dir "$WORK/redis" \
     --logfile "$WORK/redis/redis.log" --daemonize no) </dev/null >/dev/null 2>&1 &
  RPID=$!
  disown "$RPID" 2>/dev/null || true
  PIDS+=("$RPID")
  for _ in $(seq 1 100); do
    [ "$(timeout 2 redis-cli -p "$1" ping 2>/dev/null || true)" = PONG ] && return 0
    sleep 0.1
  done
  fail "redis-server did not start on port $1"
}

# keys_out [ISOLATION]: the keys of every record in results + DLQ, one a line.
keys_out() {
  local t
  for t in results dlq; do
    kcat -b "$BOOTSTRAP" -C -t "$t" -e -q -o beginning -f '%k\n' -X fetch.wait.max.ms=5 \
      -X isolation.level="${1:-read_uncommitted}" 2>/dev/null
  done
}

# count_out PREFIX [ISOLATION]: records in results + DLQ whose key starts with PREFIX.
count_out() {
  keys_out "${2:-}" | grep -c "^$1" || true
}

# distinct_out PREFIX: distinct keys starting with PREFIX in results + DLQ (read_uncommitted).
distinct_out() {
  keys_out | { grep "^$1" || true; } | sort -u | wc -l
}

# wait_out PREFIX MIN SECONDS [ISOLATION]: waits until count_out >= MIN; prints the count. Each
# count reads both topics from the start (thousands of records): every 0.2 s, not faster.
wait_out() {
  local c=0 end=$(( $(date +%s) + $3 ))
  while [ "$(date +%s)" -lt "$end" ]; do
    c=$(count_out "$1" "${4:-read_uncommitted}")
    [ "$c" -ge "$2" ] && break
    sleep 0.2
  done
  echo "$c"
}

# dump ISOLATION: both output topics as kcat JSON envelopes into $WORK/results.json, dlq.json.
dump() {
  local t
  for t in results dlq; do
    kcat -b "$BOOTSTRAP" -C -t "$t" -e -q -o beginning -J -X fetch.wait.max.ms=5 -X isolation.level="$1" \
      >"$WORK/$t.json" 2>/dev/null || fail "reading $t"
  done
}

# wait_all NAME SECONDS [ISOLATION]: waits until every id of NAME.ids has a result or a dead
# letter (the keys of both topics against the ids: kcat and grep, no JSON), then until results +
# DLQ stop growing for 2 s (the tail a restarted worker redoes).
wait_all() {
  local end=$(( $(date +%s) + $2 )) iso=${3:-read_uncommitted} prev=-1 stable=0 n want got
  want=$(sort -u "$WORK/$1.ids" | wc -l)
  while :; do
    got=$(keys_out "$iso" | sort -u | grep -cxFf "$WORK/$1.ids" || true)
    [ "$got" -ge "$want" ] && break
    [ "$(date +%s)" -lt "$end" ] || fail "$1: not every id came back within $2 s ($got of $want)"
    sleep 0.5
  done
  for _ in $(seq 1 60); do
    n=$(count_out "" "$iso")
    if [ "$n" -eq "$prev" ]; then stable=$((stable + 1)); else stable=0; fi
    [ "$stable" -ge 4 ] && break
    prev=$n
    sleep 0.5
  done
}

# committed GROUP TOPIC OUT: the group's committed offsets of TOPIC's partitions, one line
# "PARTITION COMMITTED LOG_END" each (COMMITTED -1: none yet), into OUT.
committed() {
  bt_query offsets "$1" "$2" >"$3"
}

# txn_state TXID: the transaction coordinator's view of TXID, "STATE EPOCH DURATION_MS" (e.g.
# "Ongoing 3 180"; "None" for the duration when none is open), as kafka-transactions.sh
# describe prints it.
txn_state() {
  bt_query txn "$1"
}

# at_log_end GROUP TOPIC PARTITIONS: every partition's committed offset is its log end offset.
at_log_end() {
  committed "$1" "$2" "$WORK/end-$1"
  awk -v n="$3" '{ k++; sum += $2; if ($2 != $3) bad = bad " p" $1 ":" $2 "/" $3 }
       END { exit !(k == n && bad == "") }' "$WORK/end-$1" ||
    { cat "$WORK/end-$1"; fail "group $1: committed offsets not at the log end"; }
  echo "committed offsets at the log end of all $3 partitions ($(awk '{ printf "%s%d", (NR > 1 ? " " : ""), $2 }' "$WORK/end-$1"))"
}

# covered GROUP TOPIC SNAP [ISOLATION]: snapshots the group's committed offsets into SNAP, then
# reads results + DLQ (read_uncommitted unless ISOLATION): every input offset below a committed
# offset must have its output in the topics already (an offset is committed only once its result
# or dead letter is durable; exactly-once: in the same transaction, so read_committed). Run while
# workers run or not. Prints the snapshot.
covered() {
  local snap=$3
  committed "$1" "$2" "$snap"
  dump "${4:-read_uncommitted}"
  python3 - "$WORK" "$2" "$snap" <<'PY' || fail "group $1: an offset was committed before its output was durable"
import json, sys
work, topic, snap = sys.argv[1], sys.argv[2], sys.argv[3]
have = set()
for line in open(f"{work}/results.json"):
    m = json.loads(line)
    try:
        inp = json.loads(m["payload"])["input"]
    except Exception:
        continue
    if inp["topic"] == topic: have.add((inp["partition"], inp["offset"]))
for line in open(f"{work}/dlq.json"):
    m = json.loads(line)
    h = m.get("headers") or []
    h = dict(zip(h[0::2], h[1::2]))
    if h.get("__spillway.errors.topic") == topic:
        have.add((int(h["__spillway.errors.partition"]), int(h["__spillway.errors.offset"])))
missing = []
for line in open(snap):
    p, c, _ = map(int, line.split())
    missing += [(p, o) for o in range(max(c, 0)) if (p, o) not in have]
assert not missing, f"committed but no output: {missing[:10]} ({len(missing)})"
PY
  echo "$(tr '\n' ' ' <"$snap")"
}

# verify NAME MODE [KILLS]: the verifier over the ids of NAME (read_committed). MODE:
#   exact       every id exactly once (no duplicate at all)
#   alo:BOUND   every id at least once; every duplicate identical to its first copy (same text,
#               finish reason and token counts, or the same dead letter); at most BOUND of them
#   alo-kills   as alo, and each duplicate must be of a message "in flight" at a kill: KILLS has
#               one line per killed worker "WORKER KILL_MS P:C ..." with the group's committed
#               offsets right after the kill; every earlier copy of a duplicate must come from a
#               killed worker and be at or above that kill's committed offset, and the
#               duplicates of a kill are at most max.inflight (MAXINF, outputs not yet durable)
#               + its outputs made durable in the last 2 commit periods (+ 0.5 s) before the
#               kill (durable, but not yet covered by a completed offset commit). Earlier
#               copies by workers not killed are allowed up to REVOKED (default 0): entries
#               that completed out of order above a revoked partition's commit point are
#               durable but uncommitted, and the partition's next owner redoes them (the
#               workers' "N in-flight dropped" at revocations bound them).
# Prints one line of figures and writes them to $WORK/NAME.fig.
verify() {
  dump read_committed
  python3 - "$WORK" "$1" "$2" "${3:-}" "${MAXINF:-0}" "${COMMIT_MS:-0}" "${REVOKED:-0}" <<'PY' || fail "$1: verifier"
import collections, json, sys
work, name, mode, kills_path, maxinf, commit_ms, revoked = sys.argv[1:8]
maxinf, commit_ms, revoked = int(maxinf), int(commit_ms), int(revoked)
want = open(f"{work}/{name}.ids").read().split()
wantset = set(want)
nbad = sum(1 for i in want if "-bad-" in i)
copies = collections.defaultdict(list)   # id -> [(order, record)]
order = 0
for t in ("results", "dlq"):
    for line in open(f"{work}/{t}.json"):
        m = json.loads(line)
        k = m.get("key")
        if k not in wantset:
            continue
        if t == "results":
            r = json.loads(m["payload"])
            assert r["id"] == k, (k, r["id"])
            assert r["finish_reason"] in ("stop", "length"), r
            rec = dict(kind="result", worker=r["worker"], p=r["input"]["partition"],
                       o=r["input"]["offset"], ts=m["ts"],
                       same=(r["text"], r["finish_reason"], r["usage"]["prompt_tokens"],
                             r["usage"]["completion_tokens"]))
        else:
            h = m.get("headers") or []
            h = dict(zip(h[0::2], h[1::2]))
            rec = dict(kind="dlq", worker=h["__spillway.errors.worker"],
                       p=int(h["__spillway.errors.partition"]),
                       o=int(h["__spillway.errors.offset"]), ts=m["ts"],
                       same=(h["__spillway.errors.code"], m["payload"]))
        copies[k].append((m["ts"], m["partition"], m["offset"], t, rec))
missing = wantset - set(copies)
nres = sum(1 for k in copies if copies[k][0][4]["kind"] == "result")
ndlq = len(copies) - nres
records = sum(len(v) for v in copies.values())
dups = records - len(copies)
bad_kind = [k for k in copies if (copies[k][0][4]["kind"] == "dlq") != ("-bad-" in k)]
fig = dict(ids=len(want), results=nres, dlq=ndlq, records=records, dups=dups, missing=len(missing))
assert not missing, f"lost: {len(missing)} ids, e.g. {sorted(missing)[:8]}"
assert not bad_kind, f"valid prompt dead-lettered or invalid one answered: {bad_kind[:8]}"
assert ndlq == nbad, (ndlq, nbad)
notsame = [k for k, v in copies.items() if len({c[4]["same"] for c in v}) > 1]
assert not notsame, f"duplicates that differ from their first copy: {notsame[:5]} " \
    f"{[[c[4]['same'] for c in copies[k]] for k in notsame[:2]]}"
if mode == "exact":
    assert dups == 0, f"{dups} duplicates: " + str([k for k, v in copies.items() if len(v) > 1][:8])
elif mode.startswith("alo:"):
    bound = int(mode[4:])
    fig["bound"] = bound
    assert dups <= bound, f"{dups} duplicates, more than the bound {bound}"
elif mode == "alo-kills":
    kills = {}
    for line in open(kills_path):
        wk, kms, *cs = line.split()
        kills[wk] = (int(kms), {int(c.split(":")[0]): int(c.split(":")[1]) for c in cs})
    # outputs of each killed worker at or above the committed offsets: what the next one redoes
    window = collections.Counter()
    recent = collections.Counter()
    for k, v in copies.items():
        for c in v:
            rec = c[4]
            if rec["worker"] in kills:
                kms, com = kills[rec["worker"]]
                if rec["o"] >= com.get(rec["p"], 0):
                    window[rec["worker"]] += 1
                if rec["ts"] >= kms - 2 * commit_ms - 500:
                    recent[rec["worker"]] += 1
    per_kill = collections.Counter()
    revoked_dups = 0
    for k, v in copies.items():
        if len(v) < 2:
            continue
        v = sorted(v, key=lambda c: c[0])   # produce time: the first copy first
        for c in v[:-1]:
            rec = c[4]
            if rec["worker"] not in kills:   # completed out of order above a revoked commit point
                revoked_dups += 1
                continue
            kms, com = kills[rec["worker"]]
            assert rec["o"] >= com.get(rec["p"], 0), \
                f"{k}: p{rec['p']}@{rec['o']} was committed ({com}) when {rec['worker']} was killed, yet redone"
            per_kill[rec["worker"]] += 1
    fig["per_kill"] = [per_kill[w] for w in kills]
    fig["window"] = [window[w] for w in kills]
    fig["bound"] = [maxinf + recent[w] for w in kills]
    fig["revoked_dups"] = revoked_dups
    assert revoked_dups <= revoked, \
        f"{revoked_dups} copies by workers not killed were redone, > {revoked} in-flight dropped at revocations"
    for w in kills:
        assert per_kill[w] <= maxinf + recent[w], \
            f"{w}: {per_kill[w]} duplicates > max.inflight {maxinf} + {recent[w]} recently durable"
else:
    raise SystemExit(f"unknown mode {mode}")
line = " ".join(f"{k}={v}".replace(" ", "") for k, v in fig.items())
print(line)
open(f"{work}/{name}.fig", "w").write(line + "\n")
PY
}
