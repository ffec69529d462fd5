#!/usr/bin/env bash
# Runs the real-broker tests (ctest label "broker": the tests/test_*.sh that start a Kafka broker)
# N times in a row through ctest, every
# run to its end (no retry), and prints per test the passes, failures and mean time, then the
# total time. A test that fails once in N is flaky: investigate it, do not rerun it.
#   tests/repeat-broker-tests.sh [N [BUILD_DIR]]   N default 20, BUILD_DIR default build (built)
#   SPILLWAY_REPEAT_JOBS   ctest's -j (default: twice the number of CPUs, as scripts/test.sh's
#                          Release stage runs them; a fault scenario counts as two)
#   SPILLWAY_REPEAT_ONLY   an extended regex: only the broker tests whose name matches it
# Each pass's ctest output is kept in BUILD_DIR/repeat-broker/pass-K.log; exit status 0 only
# when every run of every test passed. Each pass is one ctest run: the tests that share a broker
# (CMakeLists.txt's SPILLWAY_SHARED_BROKER_TESTS) share one per pass, started and stopped by the
# ctest fixture kafka_broker (its two tests, kafka_broker_start and kafka_broker_stop, are
# counted in the table like the others).
set -euo pipefail
cd "$(dirname "$0")/.."
N=${1:-20}
BUILD=$(realpath "${2:-build}")
JOBS=${SPILLWAY_REPEAT_JOBS:-$((2 * $(nproc)))}
[ -f "$BUILD/CTestTestfile.cmake" ] || { echo "no ctest build in $BUILD" >&2; exit 2; }
# the tests labelled "broker" (CMakeLists.txt)
# (without the fixture's tests: ctest adds them to any run that needs them)
names=$(cd "$BUILD" && ctest -N -L broker | sed -nE 's/^ *Test +#[0-9]+: (.+)$/\1/p' |
  { grep -vE '^kafka_broker_(start|stop)$' || true; } |
  { grep -E "${SPILLWAY_REPEAT_ONLY:-.}" || true; } | sort)
[ -n "$names" ] || { echo "no broker test matches" >&2; exit 2; }
regex="^($(echo "$names" | sed 's/\./\\./g' | paste -sd'|'))\$"
echo "broker tests ($(echo "$names" | wc -l)): $(echo "$names" | tr '\n' ' ')"
echo "$N pass(es), $JOBS at once, load average $(cut -d' ' -f1-3 /proc/loadavg), $(nproc) CPUs"
mkdir -p "$BUILD/repeat-broker"
res="$BUILD/repeat-broker/results.txt"
: >"$res"
t0=$SECONDS
for k in $(seq 1 "$N"); do
  p0=$SECONDS
  rc=0
  (cd "$BUILD" && ctest --output-on-failure -j"$JOBS" -R "$regex") >"$BUILD/repeat-broker/pass-$k.log" 2>&1 ||
    rc=$?
  # "  3/17 Test  #12: test_x.sh ..........   Passed   31.20 sec" / "***Failed" / "***Timeout"
  sed -nE 's/^ *[0-9]+\/[0-9]+ Test +#[0-9]+: ([^ ]+) \.+ *(\*\*\*)?([A-Za-z]+).* ([0-9.]+) sec$/\1 \3 \4/p' \
    "$BUILD/repeat-broker/pass-$k.log" | sed "s/^/$k /" >>"$res"
  fails=$(awk -v k="$k" '$1 == k && $3 != "Passed"' "$res" | awk '{ print $2 }' | paste -sd' ')
  echo "pass $k/$N: $((SECONDS - p0)) s, ctest exit $rc${fails:+, failed: $fails}"
done
echo
printf '%-28s %6s %6s %9s\n' test passed failed mean_s
awk '{ n[$2]++; if ($3 == "Passed") p[$2]++; else f[$2]++; t[$2] += $4 }
     END { for (x in n) printf "%-28s %6d %6d %9.1f\n", x, p[x], f[x], t[x] / n[x] }' "$res" | sort
echo "total: $((SECONDS - t0)) s for $N pass(es); logs in $BUILD/repeat-broker/"
! awk '$3 != "Passed"' "$res" | grep -q .
