#!/usr/bin/env bash
# `spillway batch` against a real Kafka broker (at-least-once worker, stories260K, chat.template
# chatml): a Batch file of 500 lines (chat and completions, logprobs in both shapes, content
# parts, unknown fields; 30 bad lines of 15 kinds: refused by the mapping, dead-lettered by the
# worker, expired by a past deadline), made by tests/batch_make_input.py.
#   1. one uninterrupted run: output and error files checked by tests/batch_check.py (schema
#      schemas/batch_output.schema.json, custom_ids exactly the input's, each once, bad lines as
#      error lines of the right kind);
#   2. the same file again under new names, `spillway batch` SIGKILLed twice (once its requests
#      are sent, then at about half of the lines) and run a third time: the files pass the same
#      checks and hold the same (custom_id, file, status, error code) set as run 1; a partial
#      last line left by hand is cut and its request's line written again.
# Arguments (from ctest): the spillway binary and the models folder.
set -euo pipefail
# shellcheck source=tests/broker_lib.sh
. "$(dirname "$0")/broker_lib.sh"
bt_init batch "$1" "$2"

bt_broker
say "broker at $BOOTSTRAP"
for t in prompts:4 results:2 prompts.dlq:1; do
  bt_topic "$NS${t%%:*}" "${t##*:}"
done
python3 "$ROOT/tests/batch_make_input.py" 500 30 "$WORK/a.jsonl" 12 2>/dev/null
cp "$WORK/a.jsonl" "$WORK/b.jsonl"
cp "$WORK/a.jsonl.expect" "$WORK/b.jsonl.expect"

# batch.max_seqs 8: slow enough that the kills below land mid-run
"$SPILLWAY" worker -b "$BOOTSTRAP" -t "${NS}prompts" -o "${NS}results" -d "${NS}prompts.dlq" -g "${NS}spw-batch" -m "$MODEL" \
  -s worker.id=batch-w1 -s chat.template=chatml -s threads=1 -s kv.mem_mb=16 \
  -s batch.max_seqs=8 -s commit.interval.ms=100 -X consumer.session.timeout.ms=6000 \
  >"$WORK/worker.log" 2>&1 &
WPID=$!

say "run 1: uninterrupted"
timeout 120 "$SPILLWAY" batch -b "$BOOTSTRAP" -t "${NS}prompts" -r "${NS}results" -d "${NS}prompts.dlq" --progress 2 "$WORK/a.jsonl" >"$WORK/a.log" 2>&1 ||
  fail "run 1: exit $? ($(tail -3 "$WORK/a.log"))"
python3 "$ROOT/tests/batch_check.py" "$WORK/a.jsonl" "$WORK/a.output.jsonl" "$WORK/a.errors.jsonl" ||
  fail "run 1 files"

nlines() { cat "$WORK/b.output.jsonl" "$WORK/b.errors.jsonl" 2>/dev/null | wc -l; }
# The worker is stopped (SIGSTOP) while a run sends, so that the kills land while results are
# still being computed, not after a backlog is done.
say "run 2: SIGKILL once its requests are sent (worker stopped)"
kill -STOP "$WPID"
"$SPILLWAY" batch -b "$BOOTSTRAP" -t "${NS}prompts" -r "${NS}results" -d "${NS}prompts.dlq" --progress 2 "$WORK/b.jsonl" >"$WORK/b1.log" 2>&1 &
BP=$!
for _ in $(seq 1 400); do grep -q "request(s) sent" "$WORK/b1.log" && break; sleep 0.05; done
kill -9 "$BP"; wait "$BP" 2>/dev/null || true
say "  $(nlines) line(s) written; state: $(grep -o '"produced": [0-9]*' "$WORK/b.output.jsonl.state")"
say "run 3: SIGKILL at about half"
"$SPILLWAY" batch -b "$BOOTSTRAP" -t "${NS}prompts" -r "${NS}results" -d "${NS}prompts.dlq" --progress 2 "$WORK/b.jsonl" >"$WORK/b2.log" 2>&1 &
BP=$!
for _ in $(seq 1 400); do grep -q "request(s) sent" "$WORK/b2.log" && break; sleep 0.05; done
kill -CONT "$WPID"
for _ in $(seq 1 2400); do [ "$(nlines)" -ge 250 ] && break; sleep 0.025; done
kill -9 "$BP"; wait "$BP" 2>/dev/null || true
n2=$(nlines)
say "  $n2 line(s) written"
[ "$n2" -lt 500 ] || fail "run 3 finished before it was killed (the kill tests nothing)"
say "run 4: to the end"
timeout 120 "$SPILLWAY" batch -b "$BOOTSTRAP" -t "${NS}prompts" -r "${NS}results" -d "${NS}prompts.dlq" --progress 2 "$WORK/b.jsonl" >"$WORK/b3.log" 2>&1 ||
  fail "run 4: exit $? ($(tail -3 "$WORK/b3.log"))"
grep -q "resuming" "$WORK/b3.log" || fail "run 4 did not resume"
python3 "$ROOT/tests/batch_check.py" "$WORK/b.jsonl" "$WORK/b.output.jsonl" "$WORK/b.errors.jsonl" \
  "$WORK/a.output.jsonl" "$WORK/a.errors.jsonl" || fail "resumed files"

say "a partial last line (a crash inside a write) is cut and written again"
head -n -2 "$WORK/b.output.jsonl" > "$WORK/cut.jsonl"
tail -n 1 "$WORK/b.output.jsonl" | head -c 40 >> "$WORK/cut.jsonl"
mv "$WORK/cut.jsonl" "$WORK/b.output.jsonl"
timeout 60 "$SPILLWAY" batch -b "$BOOTSTRAP" -t "${NS}prompts" -r "${NS}results" -d "${NS}prompts.dlq" "$WORK/b.jsonl" >"$WORK/b4.log" 2>&1 ||
  fail "run 5: exit $? ($(tail -3 "$WORK/b4.log"))"
grep -q "cutting a partial last line" "$WORK/b4.log" || fail "run 5 did not cut the partial line"
python3 "$ROOT/tests/batch_check.py" "$WORK/b.jsonl" "$WORK/b.output.jsonl" "$WORK/b.errors.jsonl" \
  "$WORK/a.output.jsonl" "$WORK/a.errors.jsonl" || fail "files after run 5"

say "a changed input is not resumed"
echo '{"custom_id": "extra", "method": "POST", "url": "/v1/completions", "body": {"prompt": "x"}}' >> "$WORK/b.jsonl"
if "$SPILLWAY" batch -b "$BOOTSTRAP" -t "${NS}prompts" -r "${NS}results" -d "${NS}prompts.dlq" "$WORK/b.jsonl" >"$WORK/b5.log" 2>&1; then
  fail "a changed input was resumed"
fi
grep -q "changed since" "$WORK/b5.log" || fail "no reason given for refusing a changed input"
say "PASS"
