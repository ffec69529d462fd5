#!/usr/bin/env bash
# Runs every test: installs dependencies, builds Release with -Werror and runs the real-broker
# tests there (ctest labels broker and release: CMakeLists.txt), builds the ASan+UBSan
# configuration and runs every other test under it, builds the ThreadSanitizer configuration and
# runs the threaded parts' tests, then runs each libFuzzer target for a bounded time. Each
# sanitizer and fuzz build runs at nice 19 behind the tests of the stage before it. Exit status
# 0 only when everything passed.
#   SPILLWAY_FUZZ_SECONDS  seconds per fuzz target (default 60; 0 skips fuzzing)
#   SPILLWAY_TEST_JOBS     ctest's -j in the sanitizer stages (default: the number of CPUs)
#   SPILLWAY_BROKER_JOBS   ctest's -j in the Release stage (default: twice the number of CPUs;
#                          a fault scenario counts as two)
#   SPILLWAY_SHARED_DIR    folder holding models/ (default: ../shared next to the checkout)
#   SPILLWAY_REQUIRE_CUDA  1: fail when no nvcc is found (CI sets it: its machines have the CUDA
#                          toolkit in /usr/local/cuda); otherwise the CUDA backend is built when
#                          nvcc is found and left out with a note when not
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
JOBS=$(nproc)
# Tests at once in the sanitizer stages: one per CPU (their tests compute; more make every test
# slower and leave the timing-dependent ones less slack; bench/RESULTS.md). The Release stage's
# real-broker tests mostly wait (group joins, sessions, outages, the broker): two per CPU, the
# fault scenarios counting as two (ctest PROCESSORS).
TEST_JOBS=${SPILLWAY_TEST_JOBS:-$JOBS}
BROKER_JOBS=${SPILLWAY_BROKER_JOBS:-$((2 * JOBS))}
SHARED=${SPILLWAY_SHARED_DIR:-$ROOT/../shared}
FUZZ_SECONDS=${SPILLWAY_FUZZ_SECONDS:-60}

scripts/install-deps.sh
# Kafka broker jars for the integration tests, fetched once from Maven Central (cached).
scripts/kafka-broker.sh fetch

# The CUDA backend (kernels for sm_80 and sm_90 plus PTX, and its host code) is compiled in the
# Release stage only: no GPU runs anything here (test_cuda checks the refusal without a device,
# then skips), and the sanitizer and fuzz stages would only compile the same kernels again.
# nvcc comes with NVIDIA's CUDA toolkit (/usr/local/cuda), not from a Debian package.
CUDA=OFF
if command -v nvcc >/dev/null || [ -x /usr/local/cuda/bin/nvcc ]; then
  CUDA=ON
elif [ "${SPILLWAY_REQUIRE_CUDA:-0}" = 1 ]; then
  echo "test.sh: SPILLWAY_REQUIRE_CUDA=1 but no nvcc (PATH or /usr/local/cuda/bin)" >&2
  exit 1
else
  echo "test.sh: no nvcc: the CUDA backend is not built (install NVIDIA's CUDA toolkit)"
fi
# join_build TESTS_RC PID LOG TESTS BUILD: waits for the background build PID (its output in
# LOG); when the stage's tests (exit status TESTS_RC) or the build failed, says which (the
# build's last lines from LOG) and exits 1.
join_build() {
  local build_rc=0
  wait "$2" || build_rc=$?
  [ "$build_rc" = 0 ] || { tail -n 60 "$3"; echo "test.sh: the $5 build failed" >&2; }
  [ "$1" = 0 ] || { echo "test.sh: $4 tests failed (above)" >&2; exit 1; }
  [ "$build_rc" = 0 ] || exit 1
}

echo "=== build: Release, -Werror, CUDA backend $CUDA === [${SECONDS}s]"
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DSPILLWAY_WERROR=ON -DSPILLWAY_CUDA=$CUDA \
  -DSPILLWAY_SHARED_DIR="$SHARED" >/dev/null
cmake --build build -j"$JOBS"
# The next stage's build runs behind this stage's tests at the lowest CPU priority (nice 19): the
# real-broker tests mostly wait (group joins, timeouts, the broker), and at nice 19 the build takes
# only the CPU they leave (CFS gives it ~1.5% of a CPU that a test wants). Its output goes to
# build-asan/build.log, printed when it fails.
cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=RelWithDebInfo -DSPILLWAY_WERROR=ON -DSPILLWAY_SANITIZE=ON \
  -DSPILLWAY_CUDA=OFF -DSPILLWAY_SHARED_DIR="$SHARED" >/dev/null
nice -n 19 cmake --build build-asan -j"$JOBS" >build-asan/build.log 2>&1 &
asan_build=$!
echo "=== tests: Release: real-broker, CUDA and ISA kernel tests (ASan+UBSan build behind them, nice 19) === [${SECONDS}s]"
# The real-broker tests (fault scenarios included) run here only: they run the optimised worker
# users run, and under the sanitizers they took most of CI's time computing stories260K. The
# worker's Kafka paths run under ASan+UBSan and ThreadSanitizer in the mock-cluster tests
# (test_worker_mock, test_worker_txn_mock, test_worker_features, ...). The tests that leave the
# broker alone share one broker per ctest run (the fixture kafka_broker, CMakeLists.txt).
rel_rc=0
(cd build && ctest --output-on-failure -j"$BROKER_JOBS" -L 'broker|release') || rel_rc=$?
echo "=== build: ASan+UBSan (waiting for it) === [${SECONDS}s]"
join_build "$rel_rc" "$asan_build" build-asan/build.log Release ASan+UBSan

# The ThreadSanitizer and fuzz builds run behind the ASan+UBSan tests the same way.
cmake -S . -B build-tsan -DCMAKE_BUILD_TYPE=RelWithDebInfo -DSPILLWAY_WERROR=ON -DSPILLWAY_TSAN=ON \
  -DSPILLWAY_CUDA=OFF -DSPILLWAY_SHARED_DIR="$SHARED" >/dev/null
# only what the stage runs: the tests labelled "threaded" (CMakeLists.txt SPILLWAY_THREADED_TESTS,
# kept equal to this list) and what they run
# (test_cache_tier.sh: spillway)
TSAN_TARGETS="spillway test_engine test_threadpool test_kvpool test_metrics test_cache test_peer
  test_consumer_offsets test_consumer_leave test_worker_mock test_worker_txn_mock test_worker_features"
fuzz_targets=$(for src in tests/fuzz/fuzz_*.c; do basename "$src" .c; done)
if [ "$FUZZ_SECONDS" -gt 0 ]; then
  CC=clang cmake -S . -B build-fuzz -DCMAKE_BUILD_TYPE=RelWithDebInfo -DSPILLWAY_FUZZ=ON \
    -DSPILLWAY_CUDA=OFF -DSPILLWAY_SHARED_DIR="$SHARED" >/dev/null
fi
# shellcheck disable=SC2086 # one word per target
( nice -n 19 cmake --build build-tsan -j"$JOBS" --target $TSAN_TARGETS &&
  if [ "$FUZZ_SECONDS" -gt 0 ]; then nice -n 19 cmake --build build-fuzz -j"$JOBS" --target $fuzz_targets; fi
) >build-tsan/build.log 2>&1 &
late_builds=$!
echo "=== tests: ASan+UBSan: every test but the real-broker ones === [${SECONDS}s]"
asan_rc=0
(cd build-asan && ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1 \
  ctest --output-on-failure -j"$TEST_JOBS" -LE broker) || asan_rc=$?
echo "=== build: ThreadSanitizer and fuzz targets (waiting for them) === [${SECONDS}s]"
join_build "$asan_rc" "$late_builds" build-tsan/build.log ASan+UBSan "ThreadSanitizer or fuzz"

echo "=== tests: ThreadSanitizer (the threaded parts: scheduler and thread pool, cache, metrics, worker) === [${SECONDS}s]"
# tests/tsan/suppressions.txt: uninstrumented libraries, and the arena's seqlock copy (by design)
(cd build-tsan && TSAN_OPTIONS="suppressions=$ROOT/tests/tsan/suppressions.txt halt_on_error=1 die_after_fork=0" \
  SPILLWAY_TEST_NO_FORK=1 ctest --output-on-failure -j"$JOBS" -L threaded)

if [ "$FUZZ_SECONDS" -gt 0 ]; then
  echo "=== fuzz: ${FUZZ_SECONDS}s per target === [${SECONDS}s]"
  targets=$fuzz_targets
  # libFuzzer runs on one thread: JOBS targets at once, each for FUZZ_SECONDS on its own copy of
  # its corpus; each target's last lines are printed when it ends, and any failure fails the stage.
  fuzz_dir=$(mktemp -d)
  fuzz_one() {
    local name=$1 work=$fuzz_dir/$1 rc=0
    mkdir -p "$work/corpus"
    cp -r "tests/fuzz/corpus/${name#fuzz_}"/. "$work/corpus"/
    ./build-fuzz/"$name" -max_total_time="$FUZZ_SECONDS" -print_final_stats=1 "$work/corpus" \
      >"$work/log" 2>&1 || rc=$?
    { echo "--- $name (exit $rc)"; tail -n 5 "$work/log"; } >"$work/summary"
    return "$rc"
  }
  pids=() fuzz_failed=0
  for name in $targets; do
    while [ "$(jobs -rp | wc -l)" -ge "$JOBS" ]; do wait -n || fuzz_failed=1; done
    fuzz_one "$name" &
    pids+=($!)
  done
  for p in "${pids[@]}"; do wait "$p" || fuzz_failed=1; done
  for name in $targets; do cat "$fuzz_dir/$name/summary"; done
  rm -rf "$fuzz_dir"
  [ "$fuzz_failed" = 0 ] || { echo "test.sh: a fuzz target failed (above)" >&2; exit 1; }
fi
echo "all test stages passed [${SECONDS}s]"
