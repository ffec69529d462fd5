#!/usr/bin/env bash
# Model versions (README "Models") against a real Kafka broker (scripts/kafka-broker.sh):
#   a worker serving two models (stories260K as "story", its q8_0 conversion as "alt": another
#   fingerprint) routes each request by its "model" (JSON field, else the Kafka header; JSON
#   wins) -> a name it does not serve is a dead letter unknown_model -> results carry the
#   served name and the version's fingerprint (as `spillway inspect` prints it) -> a SIGHUP whose
#   configuration names a missing file changes nothing (logged, serving goes on) -> under load
#   (1,500 prompts produced in chunks while the worker runs), a SIGHUP pointing "story" at a new
#   version (the f16 conversion) swaps it: every id exactly once (set equality, zero
#   duplicates), per partition every message taken before the swap has the old fingerprint and
#   every later one the new (offsets split cleanly), "alt" (file unchanged) is not reloaded, the
#   old version is unloaded once drained; the log names the swap.
# Arguments (from ctest): the spillway binary and the models folder.
set -euo pipefail
# shellcheck source=tests/broker_lib.sh
. "$(dirname "$0")/broker_lib.sh"
bt_init worker-models "$1" "$2"

WPID= PPID_=
bt_at_exit() {
  [ -n "$PPID_" ] && kill "$PPID_" 2>/dev/null || true
}
fail() { echo "FAIL: $*"; tail -30 "$WORK/worker.log" 2>/dev/null; exit 1; }

# the versions: same tokenizer, other weights bytes -> other fingerprints
"$SPILLWAY" mkmodel --from "$MODEL" --dtype q8_0 -o "$WORK/alt.gguf" 2>/dev/null
"$SPILLWAY" mkmodel --from "$MODEL" --dtype f16 -o "$WORK/story-v2.gguf" 2>/dev/null
fp() { "$SPILLWAY" inspect "$1" 2>/dev/null | awk '/fingerprint/ {print $2; exit}'; }
FP1=$(fp "$MODEL") FP2=$(fp "$WORK/story-v2.gguf") FPA=$(fp "$WORK/alt.gguf")
echo "fingerprints: story v1 $FP1, story v2 $FP2, alt $FPA"
[ -n "$FP1" ] && [ -n "$FP2" ] && [ -n "$FPA" ] || fail "no fingerprint from spillway inspect"
[ "$FP1" != "$FP2" ] && [ "$FP1" != "$FPA" ] && [ "$FP2" != "$FPA" ] || fail "fingerprints not distinct"

bt_broker
echo "broker at $BOOTSTRAP"
bt_topic "${NS}prompts" 4
bt_topic "${NS}results" 4
bt_topic "${NS}prompts.dlq" 1

CONF=$WORK/worker.conf
printf 'models = story=%s, alt=%s\nmodel.default = story\n' "$MODEL" "$WORK/alt.gguf" > "$CONF"
"$SPILLWAY" worker -c "$CONF" -b "$BOOTSTRAP" -t "${NS}prompts" -o "${NS}results" -d "${NS}prompts.dlq" -g "${NS}spm" \
  -s threads=1 -s commit.interval.ms=200 -s max.inflight=64 -s kv.mem_mb=32 -s log.level=info \
  -X log_level=3 >>"$WORK/worker.log" 2>&1 &
WPID=$!

# phase 1: routing by name
N1=60
python3 - "$WORK" "$N1" <<'PY'
import json, sys
work, n = sys.argv[1], int(sys.argv[2])
with open(f"{work}/route.jsonl", "w") as f, open(f"{work}/ids.txt", "w") as ids:
    for i in range(n):
        q = {"id": f"m{i:03d}", "prompt": f"Once upon a time {i}", "max_tokens": 4, "temperature": 0}
        if i % 3 == 1: q["model"] = "alt"
        if i % 3 == 2: q["model"] = "story"
        f.write(json.dumps(q) + "\n")
        ids.write(q["id"] + "\n")
    f.write(json.dumps({"id": "nope", "prompt": "x", "model": "gpt-4"}) + "\n")
PY
"$SPILLWAY" produce -b "$BOOTSTRAP" -t "${NS}prompts" "$WORK/route.jsonl"
# by header: "alt"; a header naming an unknown model under a JSON "story": the JSON wins
echo '{"id":"h-alt","prompt":"Tom went","max_tokens":4,"temperature":0}' |
  kcat -b "$BOOTSTRAP" -P -t "${NS}prompts" -k h-alt -H model=alt
echo '{"id":"h-json","prompt":"Tom went","max_tokens":4,"temperature":0,"model":"story"}' |
  kcat -b "$BOOTSTRAP" -P -t "${NS}prompts" -k h-json -H model=nope
echo '{"id":"h-bad","prompt":"Tom went"}' | kcat -b "$BOOTSTRAP" -P -t "${NS}prompts" -k h-bad -H model=nope
printf 'h-alt\nh-json\n' >> "$WORK/ids.txt"

# wait for phase 1 to come back, then a reload that cannot load: nothing changes
"$SPILLWAY" collect -b "$BOOTSTRAP" -t "${NS}results" --ids "$WORK/ids.txt" -o "$WORK/out1.jsonl" --timeout 120 \
  || fail "phase 1: not every id came back"
printf 'models = story=%s/missing.gguf, alt=%s\n' "$WORK" "$WORK/alt.gguf" > "$CONF"
kill -HUP "$WPID"
for _ in $(seq 1 100); do grep -q "reload failed" "$WORK/worker.log" && break; sleep 0.1; done
grep -q "reload failed, serving on unchanged: model story" "$WORK/worker.log" || fail "no failed reload logged"
printf 'models = story=%s, alt=%s\nmodel.default = story\n' "$MODEL" "$WORK/alt.gguf" > "$CONF"

# phase 2: a swap under load (default model, no "model" field)
N2=1500
python3 - "$WORK" "$N2" <<'PY'
import json, sys
work, n = sys.argv[1], int(sys.argv[2])
prefixes = ["Once upon a time, there was a little girl named Lily. She",
            "Tom and his dog went to the park.", "The sun was shining and", "Sue had a red ball."]
for c in range(10):
    with open(f"{work}/load{c}.jsonl", "w") as f:
        for i in range(c * n // 10, (c + 1) * n // 10):
            f.write(json.dumps({"id": f"s{i:05d}", "prompt": f"{prefixes[i % 4]} {i}",
                                "max_tokens": 1 + i % 6, "temperature": 0}) + "\n")
with open(f"{work}/ids.txt", "a") as ids:
    for i in range(n): ids.write(f"s{i:05d}\n")
PY
# the first half of the load, then (after the swap, below) the second half: requests consumed
# before the swap get v1 and those after it v2 whatever the machine's speed
( for c in $(seq 0 4); do "$SPILLWAY" produce -b "$BOOTSTRAP" -t "${NS}prompts" "$WORK/load$c.jsonl"; sleep 0.7; done
  for _ in $(seq 1 1200); do grep -q "model swap: story" "$WORK/worker.log" && break; sleep 0.1; done
  for c in $(seq 5 9); do "$SPILLWAY" produce -b "$BOOTSTRAP" -t "${NS}prompts" "$WORK/load$c.jsonl"; sleep 0.7; done ) &
PPID_=$!
count() { kcat -b "$BOOTSTRAP" -C -t "${NS}results" -e -q -o beginning -f '.\n' 2>/dev/null | wc -l || true; }
for _ in $(seq 1 900); do
  [ "$(count)" -ge $((N1 + 2 + 300)) ] && break
  sleep 0.2
done
printf 'models = story=%s, alt=%s\nmodel.default = story\n' "$WORK/story-v2.gguf" "$WORK/alt.gguf" > "$CONF"
kill -HUP "$WPID"
echo "SIGHUP after $(count) results"
wait "$PPID_" || fail "producer"
PPID_=
"$SPILLWAY" collect -b "$BOOTSTRAP" -t "${NS}results" --ids "$WORK/ids.txt" -o "$WORK/out.jsonl" --timeout 300 \
  || fail "not every id came back"
for _ in $(seq 1 100); do grep -q "drained and unloaded" "$WORK/worker.log" && break; sleep 0.1; done
kill -TERM "$WPID"
wait "$WPID" || fail "worker exit status $? after SIGTERM"
WPID=
grep -q "model swap: story: version $FP1 .* -> $FP2" "$WORK/worker.log" || fail "no swap in the log"
grep -q "reload: 2 model(s) configured, 1 to load" "$WORK/worker.log" || fail "alt was reloaded"
grep -q "model story: version $FP1 .* drained and unloaded" "$WORK/worker.log" || fail "old version not unloaded"

kcat -b "$BOOTSTRAP" -C -t "${NS}results" -e -q -o beginning -f '%s\n' > "$WORK/raw.jsonl"
kcat -b "$BOOTSTRAP" -C -t "${NS}prompts.dlq" -e -q -o beginning -f '%h|%s\n' > "$WORK/dlq.txt"
python3 - "$WORK" "$N1" "$FP1" "$FP2" "$FPA" <<'PY' || exit 1
import json, sys
work, n1, fp1, fp2, fpa = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5]
want = set(open(f"{work}/ids.txt").read().split())
raw = [json.loads(l) for l in open(f"{work}/raw.jsonl") if l.strip()]
ids = [r["id"] for r in raw]
assert set(ids) == want, f"set mismatch: missing {sorted(want - set(ids))[:5]}, extra {sorted(set(ids) - want)[:5]}"
dups = len(ids) - len(set(ids))
assert dups == 0, f"{dups} duplicate results"
by = {r["id"]: r for r in raw}
# routing: i % 3 == 1 -> alt, else story (v1: all of phase 1 came back before any reload)
for i in range(n1):
    r = by[f"m{i:03d}"]
    name, fp = ("alt", fpa) if i % 3 == 1 else ("story", fp1)
    assert r["model"] == name and r["model_fingerprint"] == fp, r
assert by["h-alt"]["model"] == "alt" and by["h-alt"]["model_fingerprint"] == fpa, by["h-alt"]
assert by["h-json"]["model"] == "story", by["h-json"]
# the swap: per partition, the messages taken before it (lower offsets) have v1, later ones v2
load = [r for r in raw if r["id"].startswith("s")]
old = [r for r in load if r["model_fingerprint"] == fp1]
new = [r for r in load if r["model_fingerprint"] == fp2]
assert all(r["model"] == "story" for r in load)
assert len(old) + len(new) == len(load), "a load result with a third fingerprint"
assert old and new, f"no swap mid-load: {len(old)} old, {len(new)} new"
for p in range(4):
    o = [r["input"]["offset"] for r in old if r["input"]["partition"] == p]
    n = [r["input"]["offset"] for r in new if r["input"]["partition"] == p]
    if o and n:
        assert max(o) < min(n), f"partition {p}: old up to {max(o)}, new from {min(n)}"
print(f"{len(ids)} results, set equality, 0 duplicates; swap: {len(old)} on v1, {len(new)} on v2")
PY
n_unknown=$(grep -c '__spillway.errors.code=unknown_model' "$WORK/dlq.txt" || true)
[ "$n_unknown" -eq 2 ] || { cat "$WORK/dlq.txt"; fail "want 2 unknown_model dead letters, got $n_unknown"; }
grep -q 'unknown_model.*|{"id": "nope"' "$WORK/dlq.txt" || fail "nope not dead-lettered"
grep -q 'unknown_model.*|{"id":"h-bad"' "$WORK/dlq.txt" || fail "h-bad not dead-lettered"
echo "PASS"
