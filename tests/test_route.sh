#!/usr/bin/env bash
# The --route modes of `spillway produce` and `spillway batch` against a real Kafka broker
# (12-partition topics, a workload of 600 requests: 40 documents by prefix_key with one taking
# 30%, chats sharing system prompts, plain prompts), reading back where every message landed:
#   - affinity: every message is on the partition the Python implementation of the README's
#     steps (tests/test_route_reference.py) predicts, so equal prefix_key -> same partition while
#     under the cap; at least 3/4 of the cold documents' messages on their home partition; the
#     hot one spread over 3 or more; no partition above the cap; the Kafka key is the routing
#     hash;
#   - bytes: the key is the hash of the prompt's first 64 canonical bytes (prefix_key ignored),
#     and equal keys share a partition (Kafka's partitioner);
#   - random: no key, every partition used;
#   - a line with a bad prefix_key is refused (not sent, exit 1);
#   - spillway batch --route affinity places its requests as predicted too.
# Arguments (from ctest): the spillway binary and the models folder.
set -euo pipefail
# shellcheck source=tests/broker_lib.sh
. "$(dirname "$0")/broker_lib.sh"
bt_init route "$1" "$2"

bt_broker
say "broker at $BOOTSTRAP"
for t in rt-aff rt-bytes rt-rand rt-bad rt-batch; do bt_topic "$t" 12; done
for t in results prompts.dlq; do bt_topic "$t" 1; done

python3 - "$WORK" <<'PY'
import json, random, sys
work = sys.argv[1]
rng = random.Random(7)
reqs = []
for i in range(600):
    u = rng.random()
    if u < 0.30:
        reqs.append({"id": "r%d" % i, "prefix_key": "doc-0", "prompt": "Question %d about doc 0" % i})
    elif u < 0.60:
        d = 1 + int(rng.random() * 39)
        reqs.append({"id": "r%d" % i, "prefix_key": "doc-%d" % d, "prompt": "Q%d on doc %d" % (i, d)})
    elif u < 0.80:
        s = int(rng.random() * 5)
        reqs.append({"id": "r%d" % i, "messages": [
            {"role": "system", "content": "System prompt number %d, which is long enough to fill "
                                          "the routing key's 64 bytes." % s},
            {"role": "user", "content": "question %d" % i}]})
    else:
        reqs.append({"id": "r%d" % i, "prompt": "Plain prompt %d with its own text" % (i % 50)})
with open(work + "/in.jsonl", "w") as f:
    for r in reqs:
        f.write(json.dumps(r) + "\n")
with open(work + "/bad.jsonl", "w") as f:
    f.write(json.dumps({"id": "ok-1", "prompt": "a"}) + "\n")
    f.write(json.dumps({"id": "bad-1", "prompt": "a", "prefix_key": ""}) + "\n")
    f.write(json.dumps({"id": "bad-2", "prompt": "a", "prefix_key": "x" * 257}) + "\n")
with open(work + "/batch.jsonl", "w") as f:
    for i in range(60):
        f.write(json.dumps({"custom_id": "c%d" % i, "method": "POST", "url": "/v1/completions",
                            "body": {"prompt": "batch q %d" % i, "max_tokens": 4,
                                     "prefix_key": "doc-%d" % (0 if i % 2 else i % 7)}}) + "\n")
PY

ROUTE=(--route-eps 0.25 --route-window 200 --route-vnodes 128)
"$SPILLWAY" produce -b "$BOOTSTRAP" -t rt-aff --route affinity "${ROUTE[@]}" "$WORK/in.jsonl" \
  2>"$WORK/aff.log" || fail "produce affinity: $(cat "$WORK/aff.log")"
npk=$(grep -c '"prefix_key"' "$WORK/in.jsonl")
grep -q "keys from prefix_key $npk, prompt $((600 - npk)), id 0, none 0" "$WORK/aff.log" \
  || fail "key sources: $(cat "$WORK/aff.log")"
"$SPILLWAY" produce -b "$BOOTSTRAP" -t rt-bytes --route bytes "$WORK/in.jsonl" 2>"$WORK/bytes.log" \
  || fail "produce bytes: $(cat "$WORK/bytes.log")"
"$SPILLWAY" produce -b "$BOOTSTRAP" -t rt-rand --route random "$WORK/in.jsonl" 2>"$WORK/rand.log" \
  || fail "produce random: $(cat "$WORK/rand.log")"
rc=0
"$SPILLWAY" produce -b "$BOOTSTRAP" -t rt-bad "$WORK/bad.jsonl" 2>"$WORK/bad.log" || rc=$?
[ "$rc" = 1 ] || fail "a bad prefix_key: exit $rc, want 1"
grep -q "line 2 not sent: prefix_key" "$WORK/bad.log" || fail "bad prefix_key not reported: $(cat "$WORK/bad.log")"
rc=0
"$SPILLWAY" produce -b "$BOOTSTRAP" -t rt-none "$WORK/in.jsonl" 2>"$WORK/none.log" || rc=$?
[ "$rc" = 1 ] && grep -q "needs its partition count" "$WORK/none.log" \
  || fail "a missing topic: exit $rc: $(cat "$WORK/none.log")"
# batch: no worker runs, so it times out (exit 1) after producing its requests
rc=0
"$SPILLWAY" batch -b "$BOOTSTRAP" -t rt-batch -r results -d prompts.dlq --route affinity "${ROUTE[@]}" \
  --timeout 3 -o "$WORK/batch.out.jsonl" "$WORK/batch.jsonl" 2>"$WORK/batch.log" || rc=$?
[ "$rc" = 1 ] || fail "batch: exit $rc, want 1 (timed out): $(cat "$WORK/batch.log")"

for t in rt-aff rt-bytes rt-rand rt-bad rt-batch; do
  kcat -b "$BOOTSTRAP" -C -t "$t" -e -q -o beginning -f '%p\t%k\t%s\n' > "$WORK/$t.tsv"
done

python3 - "$WORK" "$(dirname "$0")" <<'PY' || fail "placement"
import collections, json, math, sys
work, here = sys.argv[1], sys.argv[2]
sys.path.insert(0, here)
sys.dont_write_bytecode = True  # no __pycache__ in the source tree
import test_route_reference as ref

def load(topic):
    out = {}
    for line in open("%s/%s.tsv" % (work, topic)):
        p, k, v = line.rstrip("\n").split("\t", 2)
        r = json.loads(v)
        out[r["id"]] = (int(p), k, r)
    return out

fails = []
def check(c, msg):
    if not c:
        fails.append(msg)
        print("FAIL: " + msg)

reqs = [json.loads(l) for l in open(work + "/in.jsonl")]

# affinity: exactly the predicted partitions
got = load("rt-aff")
check(len(got) == 600, "affinity: %d messages" % len(got))
router = ref.Router(12, 0.25, 200, 128)
by_key, over = collections.defaultdict(set), 0
load_hist = []
for r in reqs:
    src, h = ref.request_key(r, 64)
    want = router.pick(h)
    cap = math.ceil(((1.0 + 0.25) * len(router.win)) / 12)
    over += max(router.load) > cap
    p, k, _ = got.get(r["id"], (-1, "", None))
    check(p == want, "affinity %s: partition %d, predicted %d" % (r["id"], p, want))
    check(k == "%016x" % h, "affinity %s: key %s" % (r["id"], k))
    by_key[r.get("prefix_key")].add(p)
check(over == 0, "affinity: %d picks above the cap" % over)
hot = len(by_key["doc-0"])
check(hot >= 3, "affinity: the hot document on %d partition(s)" % hot)
cold = [(r, got[r["id"]][0]) for r in reqs if r.get("prefix_key", "doc-0") != "doc-0"]
home = sum(p == router.home(ref.xxh64(r["prefix_key"].encode())) for r, p in cold)
check(home * 4 >= len(cold) * 3, "affinity: %d of %d cold documents' messages at home" % (home, len(cold)))
print("affinity: hot document on %d partitions, %d of %d cold documents' messages at home"
      % (hot, home, len(cold)))

# bytes: key = hash of the prompt's first 64 canonical bytes; equal keys, one partition
got = load("rt-bytes")
check(len(got) == 600, "bytes: %d messages" % len(got))
parts_of = collections.defaultdict(set)
for r in reqs:
    src, h = ref.request_key({k: v for k, v in r.items() if k != "prefix_key"}, 64)
    p, k, _ = got.get(r["id"], (-1, "", None))
    check(k == "%016x" % h, "bytes %s: key %s, want %016x" % (r["id"], k, h))
    parts_of[k].add(p)
check(all(len(s) == 1 for s in parts_of.values()), "bytes: a key on several partitions")

# random: no key, every partition
got = load("rt-rand")
check(len(got) == 600 and all(k == "" for _, k, _ in got.values()), "random: keys or count")
check(len({p for p, _, _ in got.values()}) == 12, "random: not every partition used")

got = load("rt-bad")
check(sorted(got) == ["ok-1"], "bad prefix_key: sent %s" % sorted(got))

# batch: ids BATCHID:LINE, predicted from the converted requests' prefix_key
got = load("rt-batch")
check(len(got) == 60, "batch: %d messages" % len(got))
router = ref.Router(12, 0.25, 200, 128)
for rid, (p, k, r) in sorted(got.items(), key=lambda x: int(x[0].rsplit(":", 1)[1])):
    check(p == router.pick(ref.xxh64(r["prefix_key"].encode())), "batch %s: partition %d" % (rid, p))
sys.exit(1 if fails else 0)
PY
say "PASS"
