#!/usr/bin/env bash
# Runs the real-broker tests (ctest label "broker": the tests/test_*.sh that start a Kafka broker)
# N times each in one ctest run (`ctest --repeat until-fail:N`: a test runs again as soon as its
# last run passed, beside the others; no retry), and prints per test its runs, passes, failures
# and mean time, then the total time. A test that fails once in N is flaky: investigate it, do
# not rerun it.
#   tests/repeat-broker-tests.sh [N [BUILD_DIR]]   N default 20, BUILD_DIR default build (built)
#   SPILLWAY_REPEAT_JOBS   ctest's -j (default: twice the number of CPUs, as scripts/test.sh's
#                          Release stage runs them; a fault scenario counts as two)
#   SPILLWAY_REPEAT_ONLY   an extended regex: only the broker tests whose name matches it
# ctest's output is kept in BUILD_DIR/repeat-broker/run.log; exit status 0 only when every test
# ran N times and passed every time. The tests that share a broker (CMakeLists.txt's
# SPILLWAY_SHARED_BROKER_TESTS) share one for the whole run, started and stopped by the ctest
# fixture kafka_broker (its two tests, kafka_broker_start and kafka_broker_stop, run N times too
# and are counted in the table like the others: a start finds the broker running, a stop after
# the first finds it gone).
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
echo "$N run(s) of each, $JOBS at once, load average $(cut -d' ' -f1-3 /proc/loadavg), $(nproc) CPUs"
mkdir -p "$BUILD/repeat-broker"
log="$BUILD/repeat-broker/run.log"
t0=$SECONDS
rc=0
(cd "$BUILD" && ctest --output-on-failure -j"$JOBS" -R "$regex" --repeat until-fail:"$N") >"$log" 2>&1 ||
  rc=$?
echo "ctest exit $rc after $((SECONDS - t0)) s"
echo
# every run's line: "  3/17 Test  #12: test_x.sh ....   Passed   31.20 sec" (the "3/17 " only on a
# test's last run), "***Failed", "***Timeout", "***Exception: ..."
res="$BUILD/repeat-broker/results.txt"
sed -nE 's/^ *([0-9]+\/[0-9]+ )?Test +#[0-9]+: ([^ ]+) \.+ *(\*\*\*)?([A-Za-z]+).* ([0-9.]+) sec$/\2 \4 \5/p' \
  "$log" >"$res"
printf '%-30s %5s %6s %6s %9s\n' test runs passed failed mean_s
awk '{ n[$1]++; if ($2 == "Passed") p[$1]++; else f[$1]++; t[$1] += $3 }
     END { for (x in n) printf "%-30s %5d %6d %6d %9.1f\n", x, n[x], p[x], f[x], t[x] / n[x] }' "$res" | sort
echo "total: $((SECONDS - t0)) s, $(wc -l <"$res") runs; ctest output in $log"
# every test N times, every run passed
expect=$( (echo "$names"; echo kafka_broker_start; echo kafka_broker_stop) | sort -u)
bad=0
while read -r t; do
  runs=$(awk -v t="$t" '$1 == t' "$res" | wc -l)
  fails=$(awk -v t="$t" '$1 == t && $2 != "Passed"' "$res" | wc -l)
  if [ "$runs" != "$N" ] || [ "$fails" != 0 ]; then
    case $t in kafka_broker_*) grep -q "^$t " "$res" || continue ;; esac
    echo "$t: $runs run(s) of $N, $fails failed"
    bad=1
  fi
done <<<"$expect"
[ "$rc" = 0 ] && [ "$bad" = 0 ]
