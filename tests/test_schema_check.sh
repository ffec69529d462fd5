#!/usr/bin/env bash
# The schema check every real-broker test runs at exit (tests/broker_lib.sh: bt_check_topics,
# tests/validate_records.py), checked against a real broker: three probes, each a subshell
# with its own bt_init (its own NS, WORK and exit trap), whose exit status and output are
# judged here.
#   bad    writes two records to its results topic after its first read of it: one that is not
#          a spillway record and one result whose timings.total_ms is a string, and reads the
#          topic again (the read this check notes). Its exit must fail and name both records.
#   named  its namespace starts with "usage" (so its topics are "usage-...-prompts"): plain
#          requests on its input topic, read with -f '%s'. Must pass: a test's namespace is not
#          part of the name a topic is judged by.
#   dlq    a record without the dead-letter headers on its "dlq" topic: must fail, "not a dead
#          letter".
# Arguments (from ctest): the spillway binary and the models folder.
set -euo pipefail
# shellcheck source=tests/broker_lib.sh
. "$(dirname "$0")/broker_lib.sh"
SP=$1 MD=$2

# probe NAME: runs probe_NAME in a subshell (bt_init there), its output in $OUTDIR/NAME.txt;
# prints its exit status.
OUTDIR=$(mktemp -d "${TMPDIR:-/tmp}/spillway-schema-check.XXXXXX")
trap 'rm -rf "$OUTDIR"' EXIT
probe() {
  local rc=0
  ( "probe_$1" ) >"$OUTDIR/$1.txt" 2>&1 || rc=$?
  echo "$rc"
}

probe_bad() {
  bt_init schema-bad "$SP" "$MD"
  bt_broker
  bt_topic "${NS}results" 1
  kcat -b "$BOOTSTRAP" -C -t "${NS}results" -e -q -o beginning -f '%s\n' >/dev/null
  printf '%s\n' 'not json' \
    '{"id":"b","finish_reason":"stop","timings":{"total_ms":"slow"}}' |
    kcat -b "$BOOTSTRAP" -P -t "${NS}results" -l /dev/stdin
  kcat -b "$BOOTSTRAP" -C -t "${NS}results" -e -q -o beginning -f '%s\n' >/dev/null
  exit 0
}

probe_named() {
  bt_init usage-probe "$SP" "$MD"
  bt_broker
  bt_topic "${NS}prompts" 1
  printf '%s\n' '{"id":"r1","prompt":"Once upon a time","max_tokens":4}' |
    kcat -b "$BOOTSTRAP" -P -t "${NS}prompts" -l /dev/stdin
  n=$(kcat -b "$BOOTSTRAP" -C -t "${NS}prompts" -e -q -o beginning -f '%s\n' | grep -c '"r1"')
  [ "$n" = 1 ] || { echo "read $n requests back"; exit 1; }
  exit 0
}

probe_dlq() {
  bt_init schema-dlq "$SP" "$MD"
  bt_broker
  bt_topic "${NS}dlq" 1
  printf '%s\n' '{"id":"d1","prompt":"x"}' | kcat -b "$BOOTSTRAP" -P -t "${NS}dlq" -l /dev/stdin
  exit 0
}

fails=0
rc=$(probe bad)
[ "$rc" = 77 ] && { cat "$OUTDIR/bad.txt"; exit 77; }
if [ "$rc" = 1 ] && grep -q 'results 0 0: not a spillway record: not json' "$OUTDIR/bad.txt" &&
   grep -q 'results 0 1: result fails result.schema.json at timings/total_ms' "$OUTDIR/bad.txt"; then
  echo "bad: the test failed at exit, both records named"
else
  echo "FAIL: bad: exit $rc (want 1 and both records named):"; cat "$OUTDIR/bad.txt"; fails=1
fi
rc=$(probe named)
if [ "$rc" = 0 ]; then
  echo "named: passed (requests on usage-...-prompts are not usage records)"
else
  echo "FAIL: named: exit $rc (want 0):"; cat "$OUTDIR/named.txt"; fails=1
fi
rc=$(probe dlq)
if [ "$rc" = 1 ] && grep -q 'dlq 0 0: not a dead letter' "$OUTDIR/dlq.txt"; then
  echo "dlq: the test failed at exit: not a dead letter"
else
  echo "FAIL: dlq: exit $rc (want 1, not a dead letter):"; cat "$OUTDIR/dlq.txt"; fails=1
fi
[ "$fails" = 0 ] && echo PASS
exit "$fails"
