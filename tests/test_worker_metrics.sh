#!/usr/bin/env bash
# The worker's metrics endpoint against a real Apache Kafka 4.x broker (scripts/kafka-broker.sh)
# and a real redis-server (scripts/redis-server.sh), with stories260K and tier 2 of the prefix
# cache on (arena under /dev/shm), log.format = json:
#   1. /healthz answers 200 once the endpoint is up; /readyz answers 503 with a reason until a
#      partition is assigned, then 200 (never back);
#   2. the families of /metrics are exactly the README's metrics reference table (rows starting
#      with "| `spillway:"): same names, same types, same label names (histograms as
#      _bucket{le}/_sum/_count), and every row has samples; a difference is named;
#   3. a burst of 1,500 prompts on 6 shared prefixes (a quarter with ~380 tokens of their own, to
#      keep the engine busy: with ~190 the engine, faster since, waited for intake and acks in
#      every second on some days, so spillway:token_throughput, sampled only in busy seconds,
#      never appeared; a few with a stop string or a past deadline) plus 25 invalid
#      messages (not_json, missing_prompt) while a scraper reads /metrics every 0.3 s: consumer
#      lag (sum of spillway:consumer_lag) rises above 100 and drains to 0; partitions pause;
#      requests run and wait; every counter and histogram series only increases; prefix cache
#      tier 1 hits > 0, tier 1 and tier 2 queried;
#   4. Redis killed (redis-server.sh kill), 300 more prompts on new prefixes: redis_up goes 1 -> 0,
#      redis_errors_total increases, every result still arrives;
#   5. at the end the counters equal what the topics hold: results by finish reason, prompt /
#      generated / cached tokens, messages consumed, dead letters by reason, the _count of the
#      TTFT, e2e, queue-time and inter-token histograms; commit latency observed;
#   6. every line the worker wrote to stderr is one JSON object with ts, level, worker, msg;
#      SIGTERM exits 0 with the "stopped:" line; `spillway config -s metrics.port=9464` shows
#      the metrics.* and log.format keys with their sources.
# About 20 s on 2 cores (Release), 45 s under ASan. SPILLWAY_TEST_KEEP=DIR keeps the scrapes and logs.
# Arguments (from ctest): the spillway binary and the models folder.
set -euo pipefail
# shellcheck source=tests/broker_lib.sh
. "$(dirname "$0")/broker_lib.sh"
bt_init worker-metrics "$1" "$2" redis
README=$ROOT/README.md
command -v python3 >/dev/null 2>&1 || { echo "SKIP: python3 not installed"; exit 77; }

T0=$(date +%s)
SHM=$("$ROOT/scripts/shm-dir.sh" spillway-test)
BT_RM+=("$SHM")
WPID= SPID=
bt_at_exit() {
  [ -n "$SPID" ] && kill "$SPID" 2>/dev/null || true
  # SPILLWAY_TEST_KEEP=DIR: keep the scrapes, logs and topic dumps there (debugging)
  [ -n "${SPILLWAY_TEST_KEEP:-}" ] && { mkdir -p "$SPILLWAY_TEST_KEEP"; cp "$WORK"/*.* "$SPILLWAY_TEST_KEEP"/ 2>/dev/null || true; }
}
fail() {
  echo "FAIL: $*"
  [ -f "$WORK/worker.log" ] && { echo "--- worker log (last 30 lines)"; tail -n 30 "$WORK/worker.log"; }
  exit 1
}
elapsed() { echo "$(( $(date +%s) - T0 ))s"; }

# ---- 0. spillway config shows the new keys and their sources ----
"$SPILLWAY" config -s metrics.port=9464 >"$WORK/config.txt" || fail "spillway config -s metrics.port=9464"
grep -Eq '^metrics\.port +=  *9464 +# cli$' "$WORK/config.txt" || { cat "$WORK/config.txt"; fail "config: metrics.port = 9464 # cli"; }
grep -Eq '^metrics\.bind +=  *127\.0\.0\.1 +# default$' "$WORK/config.txt" || fail "config: metrics.bind = 127.0.0.1 # default"
grep -Eq '^log\.format +=  *text +# default$' "$WORK/config.txt" || fail "config: log.format = text # default"
SPILLWAY_LOG_FORMAT=json "$SPILLWAY" config | grep -Eq '^log\.format +=  *json +# env' || fail "config: log.format from SPILLWAY_LOG_FORMAT"
if "$SPILLWAY" worker -m "$MODEL" -s log.format=yaml >"$WORK/bad.txt" 2>&1; then fail "the worker accepted log.format=yaml"; fi
grep -q 'log.format must be text or json' "$WORK/bad.txt" || { cat "$WORK/bad.txt"; fail "log.format=yaml: no clear error"; }
echo "0. spillway config: metrics.port, metrics.bind, log.format with their sources"

# ---- services ----
eval "$("$RS" start "$WORK/redis" | grep -E '^(REDIS_PORT|REDIS_PID)=')"
bt_broker
echo "broker at $BOOTSTRAP, redis on port $REDIS_PORT ($(elapsed))"
bt_topic "${NS}prompts" 4
bt_topic "${NS}results" 4
bt_topic "${NS}prompts.dlq" 1
MPORT=$(bt_free_port)
URL=http://127.0.0.1:$MPORT

N1=1500 N2=300 N_NOTJSON=15 N_NOPROMPT=10
python3 - "$WORK" "$N1" "$N2" "$N_NOTJSON" "$N_NOPROMPT" <<'PY'
import json, random, sys
work, n1, n2, n_notjson, n_noprompt = sys.argv[1], *map(int, sys.argv[2:])
rnd = random.Random(7)
words = "the a girl boy dog cat ball park sun tree red big little happy mom dad play run saw was".split()
# prefixes of 3+ KV blocks (16 tokens) each: the requests of one prefix share its blocks
story = ("Once upon a time, there was a little girl named Lily. She loved to play outside in the "
         "park with her friends. One day, she saw a big red ball under a tree. ")
prefixes = [story.replace("Lily", name) for name in ("Lily", "Sue", "Tom", "Ben", "Anna", "Max")]
later = [story.replace("ball", thing) for thing in ("kite", "dog", "cat", "box")]
def write(name, n, pre, tag, long_every):
    with open(f"{work}/{name}.jsonl", "w") as f, open(f"{work}/{name}.ids", "w") as ids:
        for i in range(n):
            rid = f"{tag}{i:05d}"
            req = {"id": rid, "prompt": f"{pre[i % len(pre)]}{i}", "max_tokens": 1 + i % 4,
                   "temperature": 0}
            if i % 100 == 7:    # finish_reason "stop": a stop string, found in a few tokens
                req.update(max_tokens=24, stop=[" "])
            if i % 100 == 42:   # finish_reason "expired": a deadline long past
                req.update(deadline=1000)
            if i % long_every == 1 % long_every:  # ~380 tokens of its own: prefill keeps the
                                # engine busy, partitions paused and requests waiting
                req.update(prompt=" ".join(rnd.choice(words) for _ in range(200)))
            f.write(json.dumps(req) + "\n")
            ids.write(rid + "\n")
write("burst1", n1, prefixes, "a", 4)
write("burst2", n2, later, "b", 2)
with open(f"{work}/bad.jsonl", "w") as f:
    for i in range(n_notjson):
        f.write(f"not json {i}\n")
    for i in range(n_noprompt):
        f.write(json.dumps({"id": f"noprompt{i}"}) + "\n")
PY

# GET URL -> "CODE BODY" (python3: curl is not guaranteed); "000 error" when nothing answers
http_get() {
  python3 - "$1" <<'PY'
import sys, urllib.request, urllib.error
try:
    with urllib.request.urlopen(sys.argv[1], timeout=5) as r:
        print(r.status, r.read().decode(errors="replace").strip())
except urllib.error.HTTPError as e:
    print(e.code, e.read().decode(errors="replace").strip())
except Exception as e:
    print("000", type(e).__name__)
PY
}
count() { kcat -b "$BOOTSTRAP" -C -t "$NS$1" -e -q -o beginning -f '.\n' 2>/dev/null | wc -l; }
phase() { echo "$1" >"$WORK/phase"; }

# ---- 1. the worker; /healthz and /readyz ----
# The probe loop runs in one python process started before the worker, so that it sees the
# endpoint from its first moment: /readyz must answer 503 (a reason in the body) until the
# group assigns partitions, then 200 for good.
python3 - "$URL" "$WORK/probe.txt" <<'PY' &
import sys, time, urllib.request, urllib.error
url, out = sys.argv[1], sys.argv[2]
def get(path):
    try:
        with urllib.request.urlopen(url + path, timeout=5) as r:
            return r.status, r.read().decode(errors="replace").strip()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode(errors="replace").strip()
    except Exception as e:
        return 0, type(e).__name__
deadline, health, seen = time.time() + 90, None, []
open(out + ".up", "w").close()  # the test starts the worker only now: a loaded machine can take
                                # longer to start python than the worker takes to be assigned
with open(out, "w") as f:
    while time.time() < deadline:
        if health is None:
            c, b = get("/healthz")
            if c == 0:
                time.sleep(0.01)
                continue
            health = (c, b)
            f.write(f"healthz {c} {b}\n")
        c, b = get("/readyz")
        f.write(f"readyz {c} {b}\n")
        f.flush()
        if c == 200:
            seen.append(c)
            if len(seen) >= 5:
                break
        elif seen:
            f.write("readyz went back from 200\n")
            break
        time.sleep(0.02)
PY
PROBE=$!
for _ in $(seq 1 300); do [ -f "$WORK/probe.txt.up" ] && break; sleep 0.05; done
[ -f "$WORK/probe.txt.up" ] || fail "the /readyz probe did not start"
phase start
"$SPILLWAY" worker -b "$BOOTSTRAP" -t "${NS}prompts" -o "${NS}results" -d "${NS}prompts.dlq" -g "${NS}spm" -m "$MODEL" \
  -s threads=1 -s commit.interval.ms=200 -s max.inflight=256 -s kv.mem_mb=4 -s log.level=info \
  -s log.format=json -s metrics.port="$MPORT" -s metrics.bind=127.0.0.1 \
  -s cache.redis.host=127.0.0.1 -s cache.redis.port="$REDIS_PORT" -s cache.arena.path="$SHM/arena" -s cache.redis.timeout_ms=1000 \
  -s cache.secret_file="$SHM/secret" \
  -s cache.arena.mb=64 -s cache.redis.timeout_ms=1000 -s cache.redis.backoff_max_ms=500 \
  -X log_level=3 -X consumer.session.timeout.ms=6000 2>"$WORK/worker.log" &
WPID=$!
wait "$PROBE" || true
kill -0 "$WPID" 2>/dev/null || fail "the worker exited"
grep -q '^healthz 200 ok$' "$WORK/probe.txt" || { cat "$WORK/probe.txt"; fail "/healthz did not answer 200 ok"; }
grep -q 'went back' "$WORK/probe.txt" && { cat "$WORK/probe.txt"; fail "/readyz answered 200, then not"; }
[ "$(grep -c '^readyz 200' "$WORK/probe.txt")" -ge 5 ] || { tail "$WORK/probe.txt"; fail "/readyz never answered 200"; }
n503=$(grep -c '^readyz 503 .' "$WORK/probe.txt" || true)
[ "$n503" -ge 1 ] || { head "$WORK/probe.txt"; fail "/readyz never answered 503 before the assignment"; }
other=$(grep '^readyz' "$WORK/probe.txt" | grep -v '^readyz 200 ready$' | grep -v '^readyz 503 .' || true)
[ -z "$other" ] || fail "/readyz: unexpected answer: $other"
why=$(grep -m1 '^readyz 503' "$WORK/probe.txt" | cut -d' ' -f3-)
echo "1. /healthz 200 ok; /readyz 503 \"$why\" ($n503 times), then 200 ready ($(elapsed))"
[ "$(http_get "$URL/nosuch" | cut -d' ' -f1)" = 404 ] || fail "/nosuch is not 404"

# ---- the scraper: /metrics every 0.3 s into scrapes.jsonl, with the phase it ran in ----
python3 - "$URL/metrics" "$WORK" <<'PY' &
import json, os, re, sys, time, urllib.request
url, work = sys.argv[1], sys.argv[2]
SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)(?:\s+\S+)?$')
with open(f"{work}/scrapes.jsonl", "w") as out:
    while not os.path.exists(f"{work}/scraper.stop"):
        phase = open(f"{work}/phase").read().strip()
        t = time.time()
        rec = {"t": t, "phase": phase}
        try:
            with urllib.request.urlopen(url, timeout=5) as r:
                rec["status"], rec["ctype"] = r.status, r.headers.get("Content-Type", "")
                text = r.read().decode()
        except Exception as e:
            rec["error"] = f"{type(e).__name__}: {e}"
            text = ""
        types, samples, bad = {}, {}, []
        for line in text.split("\n"):
            if not line:
                continue
            if line.startswith("# TYPE "):
                _, _, name, typ = line.split(" ", 3)
                types[name] = typ
            elif line.startswith("#"):
                continue
            else:
                m = SAMPLE.match(line)
                if not m:
                    bad.append(line)
                    continue
                key = m.group(1) + ("{" + m.group(2) + "}" if m.group(2) else "")
                samples[key] = float(m.group(3))
        rec.update(types=types, samples=samples, bad=bad[:5], dt=time.time() - t)
        out.write(json.dumps(rec) + "\n")
        out.flush()
        time.sleep(max(0.0, 0.3 - (time.time() - t)))
PY
SPID=$!
# the latest scrape's value of a sum over the series matching a regex (python's re.search)
latest() {
  python3 - "$WORK/scrapes.jsonl" "$1" <<'PY'
import json, re, sys
s = {}
for line in reversed(open(sys.argv[1]).read().split("\n")[-3:]):
    try:
        s = json.loads(line)["samples"]
        break
    except ValueError:  # empty, or being written
        continue
print(int(sum(v for k, v in s.items() if re.search(sys.argv[2], k))) if s else -1)
PY
}
wait_for() { # wait_for SECONDS DESCRIPTION COMMAND...: until COMMAND succeeds
  local t=$1 what=$2; shift 2
  local end=$(( $(date +%s) + t ))
  until "$@"; do
    [ "$(date +%s)" -lt "$end" ] || fail "timed out ($t s) waiting for $what"
    kill -0 "$WPID" 2>/dev/null || fail "the worker exited while waiting for $what"
    sleep 0.3
  done
}
sleep 1

# ---- 3. the burst ----
phase burst
"$SPILLWAY" produce -b "$BOOTSTRAP" -t "${NS}prompts" "$WORK/burst1.jsonl" 2>/dev/null &
P1=$!
"$SPILLWAY" produce -b "$BOOTSTRAP" -t "${NS}prompts" --key-prefix 0 "$WORK/bad.jsonl" 2>/dev/null
wait "$P1" || fail "spillway produce"
have() { [ "$(count "$1")" -ge "$2" ]; }
wait_for 120 "$N1 results" have results "$N1"
wait_for 30 "$((N_NOTJSON + N_NOPROMPT)) dead letters" have prompts.dlq $((N_NOTJSON + N_NOPROMPT))
lag0() { [ "$(latest '^spillway:consumer_lag\{')" = 0 ]; }
wait_for 30 "consumer lag to drain to 0" lag0
echo "3. burst: $N1 results and $((N_NOTJSON + N_NOPROMPT)) dead letters, lag drained ($(elapsed))"
sleep 0.7  # two more scrapes with Redis up

# ---- 4. Redis killed ----
phase redis-down
"$RS" kill "$WORK/redis" >/dev/null
"$SPILLWAY" produce -b "$BOOTSTRAP" -t "${NS}prompts" "$WORK/burst2.jsonl" 2>/dev/null || fail "spillway produce"
wait_for 90 "$((N1 + N2)) results with Redis down" have results $((N1 + N2))
redis_down() { [ "$(latest '^spillway:redis_up$')" = 0 ]; }
wait_for 15 "spillway:redis_up 0" redis_down
wait_for 30 "consumer lag to drain to 0" lag0
echo "4. Redis killed: $N2 more results ($(elapsed))"

# ---- the end: the counters reach what the topics hold ----
phase end
kcat -b "$BOOTSTRAP" -C -t "${NS}results" -e -q -o beginning -f '%s\n' >"$WORK/results.jsonl"
kcat -b "$BOOTSTRAP" -C -t "${NS}prompts.dlq" -e -q -o beginning -f '%h\n' >"$WORK/dlq.txt"
n_res=$(wc -l <"$WORK/results.jsonl")
settled() { [ "$(latest '^spillway:request_success_total')" = "$n_res" ]; }
wait_for 15 "request_success_total to reach $n_res" settled
sleep 0.7
: >"$WORK/scraper.stop"
wait "$SPID" || true
SPID=

# ---- 6. SIGTERM ----
kill -TERM "$WPID"
rc=0; wait "$WPID" || rc=$?
WPID=
[ "$rc" = 0 ] || fail "worker exit status $rc after SIGTERM"

# ---- 2, 3, 4, 5, 6: the checks ----
FP=$("$SPILLWAY" inspect "$MODEL" 2>/dev/null | awk '/fingerprint/ {print $2; exit}')
[ -n "$FP" ] || fail "no fingerprint from spillway inspect"
python3 - "$WORK" "$README" "$FP" "$N1" "$N2" "$N_NOTJSON" "$N_NOPROMPT" <<'PY' || fail "see above"
import json, re, sys
from collections import Counter, defaultdict
work, readme, fp = sys.argv[1], sys.argv[2], sys.argv[3]
n1, n2, n_notjson, n_noprompt = map(int, sys.argv[4:])
errors = []
def check(cond, msg):
    if not cond:
        errors.append(msg)
        print("FAIL: " + msg)
    return cond

# --- the README's table: | `spillway:name` | type | labels | meaning | ---
table = {}
for line in open(readme, encoding="utf-8"):
    if not line.startswith("| `spillway:"):
        continue
    cells = [c.strip() for c in line.strip().strip("|").split("|")]
    name = cells[0].strip("`")
    typ = cells[1].strip("`") if len(cells) > 1 else ""
    lab = re.sub(r'"[^"]*"', "", cells[2].replace("`", "")) if len(cells) > 2 else ""
    check(name not in table, f"README: {name} has two rows")
    table[name] = (typ, set(re.findall(r"[a-z_][a-z0-9_]*", lab)))
if not check(len(table) > 0, "README.md has no metrics table (rows starting with \"| `spillway:\")"):
    sys.exit(1)
for name, (typ, _) in table.items():
    check(typ in ("counter", "gauge", "histogram"), f"README: {name}: type '{typ}'")

scrapes = [json.loads(l) for l in open(f"{work}/scrapes.jsonl")]
bad = [s for s in scrapes if "error" in s or s.get("status") != 200 or s["bad"]]
check(not bad, f"{len(bad)} failed or malformed scrapes, e.g. {bad[:1]}")
scrapes = [s for s in scrapes if "error" not in s]
if not check(len(scrapes) >= 10, f"only {len(scrapes)} scrapes"):
    sys.exit(1)
by_phase = defaultdict(list)
for s in scrapes:
    by_phase[s["phase"]].append(s)
check(all(s["ctype"].startswith("text/plain; version=0.0.4") for s in scrapes),
      f"Content-Type {scrapes[0]['ctype']!r}")
slowest = max(s["dt"] for s in scrapes)
check(slowest < 2.0, f"a scrape took {slowest:.2f} s")

def series_name(key):
    return key.split("{", 1)[0]
def labels(key):
    if "{" not in key:
        return {}
    return dict(re.findall(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"', key.split("{", 1)[1]))
def family(name, types):
    for suf in ("_bucket", "_sum", "_count"):
        if name.endswith(suf) and types.get(name[: -len(suf)]) == "histogram":
            return name[: -len(suf)]
    return name

# --- 2. the scrape's families == the table (names, types, label names) ---
def compare(s, when):
    types = {n: t for n, t in s["types"].items() if n.startswith("spillway:")}
    fams = set(types)
    for k in s["samples"]:
        if k.startswith("spillway:"):
            fams.add(family(series_name(k), s["types"]))
    missing, extra = sorted(set(table) - fams), sorted(fams - set(table))
    check(not missing, f"{when}: in the README table but not in /metrics: {', '.join(missing)}")
    check(not extra, f"{when}: in /metrics but not in the README table: {', '.join(extra)}")
    for name in sorted(set(table) & fams):
        check(types.get(name) == table[name][0],
              f"{when}: {name}: /metrics says type {types.get(name)}, the README {table[name][0]}")
    return fams
compare(scrapes[0], "first scrape")
last = scrapes[-1]
compare(last, "last scrape")
S = last["samples"]
for name, (typ, want_labels) in sorted(table.items()):
    names = [name + "_bucket", name + "_sum", name + "_count"] if typ == "histogram" else [name]
    for n in names:
        keys = [k for k in S if series_name(k) == n]
        if not check(keys, f"last scrape: no {n} sample"):
            continue
        for k in keys:
            got = set(labels(k)) - ({"le"} if n.endswith("_bucket") else set())
            check(got == want_labels,
                  f"{k}: label names {sorted(got)}, the README says {sorted(want_labels)}")
    if typ == "histogram":
        les = [labels(k)["le"] for k in S if series_name(k) == name + "_bucket"]
        check("+Inf" in les, f"{name}_bucket has no le=\"+Inf\"")
        inf = S.get(name + '_bucket{le="+Inf"}')
        check(inf == S.get(name + "_count"), f"{name}: +Inf bucket {inf} != _count {S.get(name + '_count')}")
print(f"2. /metrics and the README table agree: {len(table)} families (names, types, label names)")

# --- 3. monotonic counters and histograms; lag; pauses ---
kinds = {}
for s in scrapes:
    for k in s["samples"]:
        kinds[k] = s["types"].get(family(series_name(k), s["types"]))
nonmono = []
prev = {}
for s in scrapes:
    for k, v in s["samples"].items():
        if kinds.get(k) in ("counter", "histogram") and k in prev and v < prev[k]:
            nonmono.append(f"{k}: {prev[k]} -> {v}")
        prev[k] = v
check(not nonmono, f"counters went down: {nonmono[:5]}")
def total(s, regex):
    return sum(v for k, v in s["samples"].items() if re.search(regex, k))
lag = [total(s, r"^spillway:consumer_lag\{") for s in by_phase["burst"]]
check(max(lag, default=0) > 100, f"consumer lag never rose above 100 during the burst: {lag[:20]}")
check(total(last, r"^spillway:consumer_lag\{") == 0, "consumer lag did not drain to 0")
check(len([k for k in S if k.startswith("spillway:consumer_lag{")]) == 4, "consumer_lag: not 4 partitions")
check(S.get("spillway:partitions_assigned") == 4, f"partitions_assigned {S.get('spillway:partitions_assigned')}")
busy = by_phase["burst"] + by_phase["redis-down"]
# pauses are brief (resumed at 3/4 of max.inflight): a scrape may miss every one, the counter not
n_paused = sum(1 for s in busy if s["samples"].get("spillway:partitions_paused", 0) > 0)
check(S.get("spillway:intake_pauses_total", 0) > 0, "intake never paused through both bursts (max.inflight 256)")
check(all(0 <= s["samples"].get("spillway:partitions_paused", 0) <= s["samples"].get("spillway:partitions_assigned", 0)
          for s in scrapes), "partitions_paused outside 0..partitions_assigned")
check(S.get("spillway:partitions_paused") == 0, "partitions still paused at the end")
running = max((s["samples"].get("spillway:num_requests_running", 0) for s in scrapes), default=0)
check(running > 0, "num_requests_running stayed 0")
waiting = max((s["samples"].get("spillway:num_requests_waiting", 0) for s in scrapes), default=0)
check(waiting > 0, "num_requests_waiting stayed 0")
check(S.get("spillway:num_requests_running") == 0 and S.get("spillway:num_requests_waiting") == 0,
      "requests still running / waiting at the end")
kv = [s["samples"].get("spillway:kv_cache_usage_perc", -1) for s in scrapes]
check(all(0 <= x <= 1 for x in kv), f"kv_cache_usage_perc outside 0..1: {sorted(kv)[-1]}")
check(max(kv) > 0, "kv_cache_usage_perc stayed 0")
check([v for k, v in S.items() if k.startswith('spillway:model_loaded{model="stories260K",fingerprint="%s"' % fp)] == [1],
      "model_loaded{model=\"stories260K\",fingerprint=...} 1")
check(S.get("spillway:model_swaps_total") == 0, "model_swaps_total without a reload")
tot, used = S.get('spillway:host_arena_slots{state="total"}'), S.get('spillway:host_arena_slots{state="used"}')
check(tot and tot > 0 and used is not None and 0 < used <= tot, f"host_arena_slots used {used} total {tot}")
up_before = [s["samples"].get("spillway:redis_up") for s in by_phase["start"] + by_phase["burst"]]
check(set(up_before) == {1}, f"redis_up before the kill: {sorted(set(map(str, up_before)))}")
first_burst, last_burst = by_phase["burst"][0]["samples"], by_phase["burst"][-1]["samples"]
for k in ('spillway:prefix_cache_queries_total{tier="1"}', 'spillway:prefix_cache_queries_total{tier="2"}',
          'spillway:prefix_cache_hits_total{tier="1"}', "spillway:commit_latency_seconds_count"):
    check(last_burst.get(k, 0) > first_burst.get(k, 0), f"{k} did not increase during the burst")
pc = {(m, t): S.get('spillway:prefix_cache_%s_total{tier="%s"}' % (m, t), 0)
      for m in ("hits", "queries") for t in "12"}
print(f"3. burst: lag peaked at {max(lag, default=0):.0f} and drained to 0; {len(scrapes)} scrapes "
      f"(slowest {slowest * 1000:.0f} ms), every counter monotonic; partitions paused in {n_paused} of {len(busy)}; at most {running:.0f} running, "
      f"{waiting:.0f} waiting, KV usage {max(kv):.2f}; tier 1 hits "
      f"{pc['hits', '1']:.0f} of {pc['queries', '1']:.0f}, tier 2 hits {pc['hits', '2']:.0f} of "
      f"{pc['queries', '2']:.0f}")

# --- 4. Redis down ---
down = by_phase["redis-down"] + by_phase["end"]
up_after = [s["samples"].get("spillway:redis_up") for s in down]
check(up_after and up_after[-1] == 0, f"redis_up after the kill: {up_after[-5:]}")
err_before = last_burst.get("spillway:redis_errors_total", 0)
err_after = S.get("spillway:redis_errors_total", 0)
check(err_after > err_before, f"redis_errors_total {err_before} -> {err_after} across the kill")
print(f"4. Redis down: redis_up 1 -> 0, redis_errors_total {err_before:.0f} -> {err_after:.0f}")

# --- 5. the counters against the topics ---
results = [json.loads(l) for l in open(f"{work}/results.jsonl")]
ids = [r["id"] for r in results]
want = set(open(f"{work}/burst1.ids").read().split()) | set(open(f"{work}/burst2.ids").read().split())
check(set(ids) == want, f"results: {len(want - set(ids))} ids missing, {len(set(ids) - want)} unknown")
check(len(ids) == len(set(ids)), f"{len(ids) - len(set(ids))} duplicate results (no failure happened)")
dlq = Counter(re.search(r"__spillway\.errors\.code=([a-z_]+)", l).group(1) for l in open(f"{work}/dlq.txt") if l.strip())
check(dlq == Counter(not_json=n_notjson, missing_prompt=n_noprompt), f"DLQ topic reasons {dict(dlq)}")
fin = Counter(r["finish_reason"] for r in results)
def eq(metric, value):
    got = S.get(metric, 0)
    check(got == value, f"{metric} = {got:g}, the topics say {value}")
for reason in ("stop", "length", "abort", "expired"):
    eq(f'spillway:request_success_total{{finished_reason="{reason}"}}', fin.get(reason, 0))
eq("spillway:prompt_tokens_total", sum(r["usage"]["prompt_tokens"] for r in results))
eq("spillway:generation_tokens_total", sum(r["usage"]["completion_tokens"] for r in results))
eq("spillway:prompt_tokens_cached_total", sum(r["usage"]["cached_tokens"] for r in results))
eq("spillway:messages_consumed_total", len(results) + sum(dlq.values()))
for reason, n in dlq.items():
    eq(f'spillway:dlq_records_total{{reason="{reason}"}}', n)
check(sum(v for k, v in S.items() if k.startswith("spillway:dlq_records_total{")) == sum(dlq.values()),
      "dlq_records_total has other reasons")
eq("spillway:e2e_request_latency_seconds_count", len(results))
eq("spillway:request_queue_time_seconds_count", len(results))
eq("spillway:time_to_first_token_seconds_count", sum(1 for r in results if r["timings"].get("ttft_ms") is not None and r["usage"]["completion_tokens"] > 0))
eq("spillway:inter_token_latency_seconds_count", sum(1 for r in results if r["usage"]["completion_tokens"] > 1))
check(S.get("spillway:commit_latency_seconds_count", 0) > 0, "commit_latency_seconds_count 0")
eq("spillway:transaction_aborts_total", 0)
eq("spillway:produce_retries_total", 0)
cached = sum(r["usage"]["cached_tokens"] for r in results)
check(cached > 0, "no result has cached_tokens")
print(f"5. counters equal the topics: {len(results)} results {dict(fin)}, {sum(dlq.values())} dead "
      f"letters {dict(dlq)}, {S['spillway:prompt_tokens_total']:.0f} prompt tokens "
      f"({cached} cached), {S['spillway:generation_tokens_total']:.0f} generated")

# --- 6. JSON log lines ---
lines = open(f"{work}/worker.log", encoding="utf-8", errors="replace").read().splitlines()
badlog = []
for l in lines:
    try:
        o = json.loads(l)
    except ValueError:
        badlog.append(l)
        continue
    if not (isinstance(o, dict) and set(o) >= {"ts", "level", "worker", "msg"}
            and o["level"] in ("error", "warn", "info", "debug")
            and re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", str(o["ts"]))
            and isinstance(o["msg"], str) and o["worker"]):
        badlog.append(l)
check(not badlog, f"{len(badlog)} of {len(lines)} log lines are not JSON objects with ts/level/worker/msg, e.g. {badlog[:2]}")
msgs = [json.loads(l)["msg"] for l in lines if l not in badlog]
check(any(m.startswith("stopped:") for m in msgs), "no \"stopped:\" log line")
check(any("metrics on http://127.0.0.1:" in m for m in msgs), "no \"metrics on\" log line")
print(f"6. {len(lines)} log lines, each a JSON object with ts/level/worker/msg")
sys.exit(1 if errors else 0)
PY
echo "PASS ($(elapsed))"
