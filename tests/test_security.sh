#!/usr/bin/env bash
# Authentication against servers that require it, and secrets kept out of logs, on stories260K:
#   A. Redis requiring AUTH (requirepass and an ACL user, scripts/redis-server.sh with
#      SPILLWAY_REDIS_CONF). `spillway generate --cache-redis` with the password from
#      SPILLWAY_CACHE_REDIS_PASSWORD: none -> NOAUTH, wrong -> WRONGPASS, each logged, no tier 2
#      hit, output identical to an uncached run; right -> a second process hits tier 2.
#   B. Kafka requiring SASL (scripts/kafka-broker.sh with SPILLWAY_KAFKA_SASL=plain, and
#      SPILLWAY_KAFKA_TLS=1 when openssl is there): prompts produced over SASL_PLAINTEXT with
#      `spillway produce -X ...`; `spillway worker` with -X security.protocol=SASL_PLAINTEXT
#      (then SASL_SSL, verifying the broker's certificate against the test CA) and PLAIN
#      credentials serves every prompt, identical to the uncached run; its Redis is reached as
#      the ACL user (cache.redis.user / cache.redis.password): a wrong ACL password is logged
#      (WRONGPASS), no tier 2 hit, output identical; the right one hits tier 2. A worker with a
#      wrong Kafka password logs the authentication failure and keeps retrying (librdkafka
#      treats it as a transient broker error): it serves nothing, stays up, and exits 0 on
#      SIGTERM. SCRAM-SHA-256 only with librdkafka >= 2.6.1: older clients fail SCRAM against
#      Kafka 4.x (librdkafka#4895: the nonce sent twice), so with Debian's 2.0.2 it is skipped.
#   D. Input limits as config keys (limits.max_stop, max_stop_bytes, max_metadata_bytes,
#      max_id_bytes, max_messages, max_input_ids) set low on a worker: each over-limit message
#      goes to the DLQ with its reason code; a message within them is served.
#   C. Secrets: no password appears in any log or output of the runs above, nor in
#      `spillway config` (-s cache.redis.password, -X sasl.password, ssl.key.password,
#      sasl.oauthbearer.client.secret, SPILLWAY_CACHE_REDIS_PASSWORD), which prints "(set)",
#      nor in its error for a mistyped "-X sasl.password:VALUE".
# Arguments (from ctest): the spillway binary and the models folder.
set -euo pipefail
# shellcheck source=tests/broker_lib.sh
. "$(dirname "$0")/broker_lib.sh"
bt_init security "$1" "$2" redis

SHM=$("$ROOT/scripts/shm-dir.sh" spillway-security)
BT_RM+=("$SHM")
LOGS=$WORK/logs  # everything spillway printed: searched for secrets at the end
mkdir -p "$LOGS"
fail() {
  echo "FAIL: $*"
  local f
  for f in "$LOGS"/*; do
    [ -f "$f" ] || continue
    echo "--- $f (end)"
    tail -n 6 "$f" | cut -c1-300
  done
  exit 1
}
rnd() { head -c 12 /dev/urandom | base64 | tr -dc 'A-Za-z0-9'; }
# Secrets: every one is searched for in the logs at the end, the wrong ones too.
REDIS_PASS=rpw$(rnd)
ALICE_PASS=apw$(rnd)
WRONG_REDIS=wrr$(rnd)
WRONG_KAFKA=wrk$(rnd)
KAFKA_PASS=kpw$(rnd)
OTHER_SECRET=oth$(rnd)

# ---- the servers ----
export SPILLWAY_REDIS_CONF="requirepass $REDIS_PASS
user alice on >$ALICE_PASS ~* &* +@all"
eval "$("$RS" start "$WORK/redis" | grep -E '^REDIS_PORT=')"
unset SPILLWAY_REDIS_CONF
[ "$(redis-cli -p "$REDIS_PORT" ping 2>&1)" != PONG ] || fail "redis answers PING without AUTH"
say "redis on port $REDIS_PORT, requiring AUTH"

TLS=0
command -v openssl >/dev/null 2>&1 && TLS=1
SPILLWAY_KAFKA_SASL=plain SPILLWAY_KAFKA_TLS=$([ "$TLS" = 1 ] && echo 1) \
  SPILLWAY_KAFKA_SASL_PASSWORD=$KAFKA_PASS "$KB" start "$WORK/broker" >"$WORK/broker.out"
eval "$(grep -E '^(BOOTSTRAP|SASL_BOOTSTRAP|SSL_BOOTSTRAP|KAFKA_CLIENT_PROPS|KAFKA_SSL_CLIENT_PROPS)=' "$WORK/broker.out")"
say "broker: PLAINTEXT $BOOTSTRAP (harness only), SASL_PLAINTEXT $SASL_BOOTSTRAP${SSL_BOOTSTRAP:+, SASL_SSL $SSL_BOOTSTRAP}"
for t in prompts results prompts.dlq limits; do "$KB" topic "$WORK/broker" "$t" 1 >/dev/null; done
# -X arguments from a space-separated property list
xargs_of() { local p; XA=(); for p in $1; do XA+=(-X "$p"); done; }

# ---- the prompts and the uncached reference ----
N=8
python3 - "$WORK" "$N" <<'PY'
import json, sys
work, n = sys.argv[1], int(sys.argv[2])
doc = ("Once upon a time, there was a little girl named Lily. She loved to play outside in the "
       "park. One day, she saw a big, red ball. She wanted to play with it, but it was too high. ")
tails = ["Lily", "Her mom", "A bird", "The ball", "She", "Tom", "The man", "They"]
with open(f"{work}/in.jsonl", "w") as f:
    for i in range(n):
        f.write(json.dumps({"id": f"s{i}", "prompt": doc + tails[i % 8], "max_tokens": 12,
                            "temperature": 0}) + "\n")
PY
texts() {
  python3 -c 'import json,sys; [print(json.dumps([r["id"], r["text"], r["finish_reason"]])) for r in sorted(map(json.loads, open(sys.argv[1])), key=lambda r: r["id"])]' "$1"
}
ARENA=$SHM/arena
GEN=("$SPILLWAY" generate -m "$MODEL" -t 0 --threads 1 --kv-type f32 --kv-mem-mb 32 --stats)
CACHE=(--cache-redis "127.0.0.1:$REDIS_PORT" --cache-arena "$ARENA" --cache-arena-mb 64 --cache-timeout-ms 1000
       --cache-secret "$SHM/secret")
"${GEN[@]}" --no-prefix-cache -f "$WORK/in.jsonl" >"$WORK/ref.jsonl" 2>"$LOGS/gen-ref.err"
texts "$WORK/ref.jsonl" >"$WORK/ref.txt"
t2_hits() { sed -n 's/.*tier 2 \([0-9]*\) of [0-9]*.*/\1/p' "$1"; }

# ---- A. generate against Redis with AUTH ----
gen_cached() { # NAME PASSWORD-or-"-" (unset)
  local name=$1
  if [ "$2" = - ]; then
    env -u SPILLWAY_CACHE_REDIS_PASSWORD "${GEN[@]}" "${CACHE[@]}" -f "$WORK/in.jsonl" \
      >"$LOGS/$name.out" 2>"$LOGS/$name.err" || fail "$name: generate failed"
  else
    SPILLWAY_CACHE_REDIS_PASSWORD=$2 "${GEN[@]}" "${CACHE[@]}" -f "$WORK/in.jsonl" \
      >"$LOGS/$name.out" 2>"$LOGS/$name.err" || fail "$name: generate failed"
  fi
  texts "$LOGS/$name.out" | cmp -s - "$WORK/ref.txt" || fail "$name: output differs from the uncached run"
}
gen_cached gen-nopass -
grep -q 'AUTH.*NOAUTH\|NOAUTH' "$LOGS/gen-nopass.err" || fail "no NOAUTH line without a password"
[ "$(t2_hits "$LOGS/gen-nopass.err")" = 0 ] || fail "tier 2 hits without a password"
gen_cached gen-wrong "$WRONG_REDIS"
grep -q 'AUTH.*WRONGPASS' "$LOGS/gen-wrong.err" || fail "no 'AUTH ... WRONGPASS' line with a wrong password"
[ "$(t2_hits "$LOGS/gen-wrong.err")" = 0 ] || fail "tier 2 hits with a wrong password"
say "A. no password: $(grep -m1 -o 'redis.*NOAUTH[^.]*' "$LOGS/gen-nopass.err" | cut -c1-120)"
say "A. wrong password: $(grep -m1 -o 'redis.*WRONGPASS[^.]*' "$LOGS/gen-wrong.err" | cut -c1-120); output identical, 0 tier 2 hits"
gen_cached gen-right1 "$REDIS_PASS"
gen_cached gen-right2 "$REDIS_PASS"
h=$(t2_hits "$LOGS/gen-right2.err")
[ "${h:-0}" -gt 0 ] || fail "right password: the second process got nothing from tier 2"
grep -q 'WRONGPASS\|NOAUTH' "$LOGS/gen-right1.err" "$LOGS/gen-right2.err" && fail "right password: AUTH error logged"
say "A. right password: the second process got $h blocks from tier 2; output identical"

# ---- B. the worker over SASL, its Redis as an ACL user ----
xargs_of "$KAFKA_CLIENT_PROPS"
"$SPILLWAY" produce -b "$SASL_BOOTSTRAP" -t prompts "${XA[@]}" "$WORK/in.jsonl" \
  >"$LOGS/produce.out" 2>&1 || fail "produce over SASL_PLAINTEXT failed"
start_worker() { # NAME BOOTSTRAP "PROPS" [worker options...]
  local name=$1 bs=$2
  xargs_of "$3"
  shift 3
  "$SPILLWAY" worker -b "$bs" -t prompts -o results -d prompts.dlq -g "g-$name" -m "$MODEL" \
    -s worker.id="$name" -s threads=1 -s kv.type=f32 -s kv.mem_mb=32 -s commit.interval.ms=200 \
    -s cache.redis.host=127.0.0.1 -s cache.redis.port="$REDIS_PORT" \
    -s cache.arena.path="$ARENA" -s cache.secret_file="$SHM/secret" -s cache.arena.mb=64 \
    "${XA[@]}" "$@" \
    >"$LOGS/$name.log" 2>&1 &
  WPID=$!
  PIDS+=("$WPID")
}
# results of worker NAME (read through the harness's PLAINTEXT listener) into FILE
results_of() {
  kcat -b "$BOOTSTRAP" -C -t results -e -q -o beginning -f '%s\n' 2>/dev/null |
    python3 -c 'import json,sys
n=sys.argv[1]
for l in sys.stdin:
    l=l.strip()
    if l and json.loads(l).get("worker")==n: print(l)' "$1" >"$2"
}
wait_results() { # NAME FILE PID
  local i
  for i in $(seq 1 240); do
    results_of "$1" "$2"
    [ "$(sort -u "$2" | wc -l)" -ge "$N" ] && return 0
    kill -0 "$3" 2>/dev/null || fail "$1 exited before serving every prompt"
    sleep 0.5
  done
  fail "$1: only $(wc -l <"$2") of $N results"
}
stop_worker() { # NAME PID
  kill -TERM "$2"
  local rc=0
  wait "$2" || rc=$?
  [ "$rc" = 0 ] || fail "$1 exit status $rc after SIGTERM"
}
t2_worker() { sed -n 's/.* t2_hits=\([0-9]*\)\/.*/\1/p' "$LOGS/$1.log" | tail -n 1; }

# a wrong Kafka password, running beside the first worker
start_worker w-badkafka "$SASL_BOOTSTRAP" "$KAFKA_CLIENT_PROPS sasl.password=$WRONG_KAFKA debug=security,broker,conf" \
  -s log.level=debug
BADPID=$WPID
BAD_T0=$(date +%s)

# SASL_PLAINTEXT; the ACL user with a wrong password
start_worker w-plain "$SASL_BOOTSTRAP" "$KAFKA_CLIENT_PROPS" \
  -s cache.redis.user=alice -s cache.redis.password="$WRONG_REDIS"
P=$WPID
wait_results w-plain "$WORK/w-plain.jsonl" "$P"
stop_worker w-plain "$P"
texts "$WORK/w-plain.jsonl" | sort -u | cmp -s - "$WORK/ref.txt" || fail "w-plain: results differ from the uncached run"
grep -q 'AUTH.*WRONGPASS' "$LOGS/w-plain.log" || fail "w-plain: no 'AUTH ... WRONGPASS' line for the ACL user"
[ "$(t2_worker w-plain)" = 0 ] || fail "w-plain: tier 2 hits with a wrong ACL password"
say "B. SASL_PLAINTEXT/PLAIN worker: $N results identical to the uncached run; ACL user with a wrong password: 0 tier 2 hits, logged"

# SASL_SSL (or SASL_PLAINTEXT again without openssl); the ACL user with the right password,
# given through the environment (SPILLWAY_CACHE_REDIS_PASSWORD)
if [ "$TLS" = 1 ]; then
  BS2=$SSL_BOOTSTRAP PROPS2=$KAFKA_SSL_CLIENT_PROPS W2=w-ssl
else
  BS2=$SASL_BOOTSTRAP PROPS2=$KAFKA_CLIENT_PROPS W2=w-acl
fi
SPILLWAY_CACHE_REDIS_PASSWORD=$ALICE_PASS start_worker "$W2" "$BS2" "$PROPS2" -s cache.redis.user=alice
P=$WPID
wait_results "$W2" "$WORK/$W2.jsonl" "$P"
stop_worker "$W2" "$P"
texts "$WORK/$W2.jsonl" | sort -u | cmp -s - "$WORK/ref.txt" || fail "$W2: results differ from the uncached run"
grep -q 'WRONGPASS\|NOAUTH' "$LOGS/$W2.log" && fail "$W2: AUTH error with the right ACL password"
h=$(t2_worker "$W2")
[ "${h:-0}" -gt 0 ] || fail "$W2: no tier 2 hit as the ACL user"
say "B. $([ "$TLS" = 1 ] && echo SASL_SSL || echo SASL_PLAINTEXT) worker, ACL user: $N results identical, $h tier 2 hits"

# SCRAM-SHA-256 needs librdkafka >= 2.6.1 against Kafka 4.x
RDK=$(pkg-config --modversion rdkafka 2>/dev/null || kcat -V 2>&1 | sed -n 's/.*librdkafka \([0-9.]*\).*/\1/p' | head -n1)
if [ -n "$RDK" ] && [ "$(printf '%s\n2.6.1\n' "$RDK" | sort -V | head -n1)" = 2.6.1 ]; then
  start_worker w-scram "$SASL_BOOTSTRAP" "${KAFKA_CLIENT_PROPS/sasl.mechanism=PLAIN/sasl.mechanism=SCRAM-SHA-256}"
  P=$WPID
  wait_results w-scram "$WORK/w-scram.jsonl" "$P"
  stop_worker w-scram "$P"
  texts "$WORK/w-scram.jsonl" | sort -u | cmp -s - "$WORK/ref.txt" || fail "w-scram: results differ"
  say "B. SASL_PLAINTEXT/SCRAM-SHA-256 worker: $N results identical"
else
  say "B. SCRAM-SHA-256 not run: librdkafka ${RDK:-?} < 2.6.1 fails SCRAM against Kafka 4.x (librdkafka#4895)"
fi

# the wrong Kafka password: still up after >= 12 s, nothing served, the failure logged
while [ $(( $(date +%s) - BAD_T0 )) -lt 12 ]; do sleep 1; done
kill -0 "$BADPID" 2>/dev/null || fail "w-badkafka exited on an authentication failure (expected: retrying)"
results_of w-badkafka "$WORK/w-badkafka.jsonl"
[ ! -s "$WORK/w-badkafka.jsonl" ] || fail "w-badkafka served prompts with a wrong password"
grep -qi 'SASL authentication error.*invalid credentials\|Authentication failed' "$LOGS/w-badkafka.log" ||
  fail "w-badkafka: no authentication error in its log"
stop_worker w-badkafka "$BADPID"
say "B. wrong Kafka password: $(grep -m1 -io 'SASL authentication error[^(]*' "$LOGS/w-badkafka.log" | cut -c1-110); kept retrying, nothing served, exit 0 on SIGTERM"

# ---- D. input limits: config keys, each with its DLQ reason ----
python3 - "$WORK/limits.jsonl" <<'PY'
import json, sys
msgs = [
    {"id": "st", "prompt": "x", "stop": ["a", "b"]},                       # too_many_stop
    {"id": "sb", "prompt": "x", "stop": ["abcdef"]},                       # bad_parameter
    {"id": "md", "prompt": "x", "metadata": {"k": "v" * 40}},              # metadata_too_large
    {"id": "waytoolongid", "prompt": "x"},                                 # bad_id
    {"id": "ms", "messages": [{"role": "user", "content": "a"},
                              {"role": "user", "content": "b"}]},         # prompt_too_large
    {"id": "ii", "input_ids": [1, 2, 3]},                                  # prompt_too_many_tokens
    {"id": "ok", "prompt": "Once", "max_tokens": 2, "stop": ["zz"], "metadata": {"a": 1}},
]
with open(sys.argv[1], "w") as f:
    for m in msgs: f.write(json.dumps(m) + "\n")
PY
xargs_of "$KAFKA_CLIENT_PROPS"
"$SPILLWAY" produce -b "$SASL_BOOTSTRAP" -t limits "${XA[@]}" "$WORK/limits.jsonl" \
  >"$LOGS/produce-limits.out" 2>&1 || fail "produce to limits failed"
start_worker w-limits "$SASL_BOOTSTRAP" "$KAFKA_CLIENT_PROPS" -t limits -s limits.max_stop=1 \
  -s limits.max_stop_bytes=4 -s limits.max_metadata_bytes=32 -s limits.max_id_bytes=8 \
  -s limits.max_messages=1 -s limits.max_input_ids=2
P=$WPID
for _ in $(seq 1 240); do
  kcat -b "$BOOTSTRAP" -C -t prompts.dlq -e -q -o beginning -f '%h|%s\n' 2>/dev/null >"$WORK/dlq.txt" || true
  results_of w-limits "$WORK/w-limits.jsonl"
  [ "$(grep -c 'worker=w-limits' "$WORK/dlq.txt")" -ge 6 ] && [ -s "$WORK/w-limits.jsonl" ] && break
  kill -0 "$P" 2>/dev/null || fail "w-limits exited"
  sleep 0.5
done
stop_worker w-limits "$P"
python3 - "$WORK/dlq.txt" "$WORK/w-limits.jsonl" <<'PY' || fail "limits: wrong DLQ reasons"
import json, re, sys
want = {"st": "too_many_stop", "sb": "bad_parameter", "md": "metadata_too_large",
        "waytoolongid": "bad_id", "ms": "prompt_too_large", "ii": "prompt_too_many_tokens"}
got = {}
for line in open(sys.argv[1]):
    h, _, v = line.rstrip("\n").partition("|")
    if "worker=w-limits" not in h: continue
    code = re.search(r"__spillway\.errors\.code=([a-z_]+)", h).group(1)
    got[json.loads(v)["id"]] = code
assert got == want, f"DLQ reasons {got}, want {want}"
res = [json.loads(l)["id"] for l in open(sys.argv[2])]
assert res == ["ok"], f"results {res}"
print("  " + ", ".join(f"{k}: {v}" for k, v in sorted(got.items())))
PY
say "D. 6 limit keys enforced with their DLQ reasons; the message within them served"

# ---- C. secrets ----
SPILLWAY_CACHE_REDIS_PASSWORD=$REDIS_PASS "$SPILLWAY" config -X sasl.password="$KAFKA_PASS" \
  -X consumer.ssl.key.password="$OTHER_SECRET" -X producer.sasl.oauthbearer.client.secret="$OTHER_SECRET" \
  -X ssl.keystore.password="$OTHER_SECRET" -s cache.redis.user=alice \
  >"$LOGS/config.out" 2>&1 || fail "spillway config failed"
SPILLWAY_CACHE_REDIS_PASSWORD=$REDIS_PASS "$SPILLWAY" config -s cache.redis.password="$ALICE_PASS" \
  >"$LOGS/config2.out" 2>&1 || fail "spillway config failed"
# a mistyped secret property (no '='): refused without echoing it
"$SPILLWAY" config -X "sasl.password:$OTHER_SECRET" >"$LOGS/config3.out" 2>&1 &&
  fail "config accepted -X sasl.password:..."
grep -q 'expected property=value' "$LOGS/config3.out" || fail "config: no error for -X without '='"
grep -q '^cache.redis.password *= (set) *# env:SPILLWAY_CACHE_REDIS_PASSWORD' "$LOGS/config.out" ||
  fail "config: cache.redis.password from the environment not shown as (set)"
grep -q '^cache.redis.password *= (set) *# cli' "$LOGS/config2.out" || fail "config: -s cache.redis.password not shown as (set)"
for k in sasl.password consumer.ssl.key.password producer.sasl.oauthbearer.client.secret ssl.keystore.password; do
  grep -q "^kafka\.$k *= (set) " "$LOGS/config.out" || fail "config: kafka.$k not shown as (set)"
done
grep -q '^cache.redis.user *= alice ' "$LOGS/config.out" || fail "config: the user name should be shown"
cp "$WORK/redis/redis.log" "$LOGS/redis.log" 2>/dev/null || true
n_files=$(find "$LOGS" -type f | wc -l)
# self-check: the secrets are real strings that grep finds where they do belong
grep -qF "$KAFKA_PASS" "$WORK/broker.out" && grep -qF "$ALICE_PASS" "$WORK/redis/redis.conf" ||
  fail "self-check: secrets not found in the servers' own files"
for s in "$REDIS_PASS" "$ALICE_PASS" "$WRONG_REDIS" "$WRONG_KAFKA" "$KAFKA_PASS" "$OTHER_SECRET"; do
  if grep -rlF -- "$s" "$LOGS" >"$WORK/leak" 2>/dev/null; then
    fail "a secret appears in: $(tr '\n' ' ' <"$WORK/leak")"
  fi
done
say "C. no secret in $n_files logs and outputs (generate, produce, workers (one at debug level with librdkafka debug=security,broker,conf), config, redis.log)"
echo "PASS"
