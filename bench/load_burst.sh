#!/usr/bin/env bash
# Load burst benchmark of one `spillway worker` (stories260K, short greedy prompts, threads 1)
# against a real Apache Kafka 4.x broker (scripts/kafka-broker.sh; helpers of
# tests/faults_lib.sh). Prints a table and appends it to bench/RESULTS.md with the command, the
# machine and the date.
#   1. max throughput: a backlog of MAX_N prompts drained by a fresh worker (results per second
#      from its first result to its last);
#   2. a fresh worker with /metrics; bench/pacer.py produces STEADY_FRAC x max per second for
#      STEADY_S s, then BURST_X times that for BURST_S s, then the steady rate again until the
#      consumer lag is back to its steady level (64 + 1 s of the steady rate: in flight and not yet
#      committed; at most DRAIN_MAX_S s), then no more input: the lag must reach 0;
#   sampled every 0.5 s: spillway:consumer_lag (sum over partitions), results
#   (spillway:request_success_total), the worker's VmRSS and open files (/proc/PID/fd); "start"
#   RSS/fds are those of the last sample before the burst (after the steady phase's warm-up).
# Figures: lag peak, time to drain, drain rate during the burst (results per second between the
# burst's start and end) against the measured max (goal >= 80%), assignments in the worker's log
# (must be 1: no rebalance), RSS start/max/end, fds start/end, DLQ records, set equality.
#
# Usage: bench/load_burst.sh [--ci] [SPILLWAY [MODELS]]
#   (defaults: build/spillway, /work/shared/models or $SPILLWAY_MODELS)
# Environment: BURST_S (30), BURST_X (10), STEADY_FRAC (0.5), STEADY_S (20), MAX_N (4000),
#   PARTS (4), DRAIN_MAX_S (300), RSS_FACTOR (the --ci bound on max RSS / start RSS, 3).
# --ci (tests/test_load_burst.sh): BURST_S 2, STEADY_S 4, MAX_N 600 unless set, nothing appended
#   to RESULTS.md; exits 1 unless the qualitative invariants hold: the lag rose during the burst
#   and drained to 0, one assignment, no DLQ, every id served once, max RSS <= RSS_FACTOR x start + 64 MiB (the KV pool,
#   kv.mem_mb 64, is touched lazily: the burst's bigger batches touch more of it; + 256 MiB more
#   for an AddressSanitizer build: its quarantine of freed memory).
#   Max throughput: results per second from the 10% result to the last (no start-up ramp).
#   It never asserts on speed.
set -euo pipefail
trap 'echo "error at $0:$LINENO: $BASH_COMMAND" >&2' ERR
CI=0
if [ "${1:-}" = --ci ]; then CI=1; shift; fi
HERE=$(cd "$(dirname "$0")" && pwd)
SPILLWAY=$(realpath "${1:-$HERE/../build/spillway}")
MODELS=${2:-${SPILLWAY_MODELS:-/work/shared/models}}
if [ "$CI" = 1 ]; then
  BURST_S=${BURST_S:-2}; STEADY_S=${STEADY_S:-4}; MAX_N=${MAX_N:-600}; DRAIN_MAX_S=${DRAIN_MAX_S:-120}
fi
BURST_S=${BURST_S:-30}; BURST_X=${BURST_X:-10}; STEADY_FRAC=${STEADY_FRAC:-0.5}
STEADY_S=${STEADY_S:-20}; MAX_N=${MAX_N:-4000}; PARTS=${PARTS:-4}; DRAIN_MAX_S=${DRAIN_MAX_S:-300}
RSS_FACTOR=${RSS_FACTOR:-3}
# shellcheck source=tests/faults_lib.sh
. "$HERE/../tests/faults_lib.sh"
command -v curl >/dev/null 2>&1 || { echo "SKIP: curl not installed"; exit 77; }
faults_init load-burst
MP=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
OPTS=(-s max.inflight=64 -s commit.interval.ms=200)

broker_start
for t in pmax pb results; do "$KB" topic "$WORK/broker" "$t" "$PARTS" >/dev/null; done
"$KB" topic "$WORK/broker" dlq 1 >/dev/null

# ---- 1. max throughput: drain a backlog ----
drain_backlog "$MAX_N" pmax "${OPTS[@]}"
# from the result at 10% to the last: without the start-up ramp
MAX=$(awk '{ t[NR] = $1 } END { i = int(NR / 10) + 1; printf "%.1f", (NR - i) * 1000 / (t[NR] - t[i]) }' "$WORK/max.ts")
R=$(python3 -c "print(round($MAX * $STEADY_FRAC, 1))")
RB=$(python3 -c "print(round($MAX * $STEADY_FRAC * $BURST_X, 1))")
say "max throughput $MAX results/s (backlog of $MAX_N); steady $R/s, burst $RB/s for $BURST_S s"

# ---- 2. steady, burst, steady ----
run_worker w1 gb pb -s worker.id=w1 -s metrics.port="$MP" -s metrics.bind=127.0.0.1 "${OPTS[@]}"
W=$WPID
for _ in $(seq 1 600); do grep -qE ' INFO assigned [1-9]' "$WORK/w1.log" && break; sleep 0.1; done
grep -qE ' INFO assigned [1-9]' "$WORK/w1.log" || fail "w1: no assignment"
sampler() {
  local m lag ok rss fds
  while kill -0 "$W" 2>/dev/null; do
    m=$(curl -s --max-time 2 "http://127.0.0.1:$MP/metrics" || true)
    lag=$(awk '$1 ~ /^spillway:consumer_lag[{]/ { s += $2 } END { print s + 0 }' <<<"$m")
    ok=$(awk '$1 ~ /^spillway:request_success_total[{]/ { s += $2 } END { print s + 0 }' <<<"$m")
    rss=$(awk '/^VmRSS:/ { print $2 }' "/proc/$W/status" 2>/dev/null || echo 0)
    fds=$(ls "/proc/$W/fd" 2>/dev/null | wc -l)
    echo "$(now_ms) $lag $ok $rss $fds"
    sleep 0.5
  done
}
sampler >"$WORK/samples" &
SAMPLER=$!
PIDS+=("$SAMPLER")
mkfifo "$WORK/pace.fifo"
kcat -b "$BOOTSTRAP" -P -t pb -K '\t' -X linger.ms=5 <"$WORK/pace.fifo" 2>"$WORK/kcat-b.txt" &
KCAT=$!
PIDS+=("$KCAT")
python3 "$HERE/pacer.py" --prefix B --phases "$R:$STEADY_S,$RB:$BURST_S,$R:$DRAIN_MAX_S" \
  --marks "$WORK/marks" --ids "$WORK/b.ids" >"$WORK/pace.fifo" &
PYPID=$!
PIDS+=("$PYPID")
# wait for the burst's end, then for lag 0
end=$(( $(date +%s) + STEADY_S + BURST_S + 60 ))
until grep -q '^2 ' "$WORK/marks" 2>/dev/null; do
  [ "$(date +%s)" -lt "$end" ] || fail "the pacer did not reach the burst's end"
  kill -0 "$W" 2>/dev/null || fail "w1 died"
  kill -0 "$KCAT" 2>/dev/null || { cat "$WORK/kcat-b.txt"; fail "kcat (the producer) died"; }
  sleep 0.2
done
BEND=$(awk '$1 == 2 { print $2 }' "$WORK/marks")
BSTART=$(awk '$1 == 1 { print $2 }' "$WORK/marks")
# drained: the lag back to its steady level (what the steady rate keeps in flight and
# uncommitted: STEADY_LAG = 64 + 1 s of the steady rate); then the pacer stops and the lag must
# reach exactly 0
STEADY_LAG=$(python3 -c "print(int(64 + $R))")
end=$(( $(date +%s) + DRAIN_MAX_S ))
DRAINED=
while [ "$(date +%s)" -lt "$end" ]; do
  kill -0 "$W" 2>/dev/null || fail "w1 died"
  kill -0 "$KCAT" 2>/dev/null || { cat "$WORK/kcat-b.txt"; fail "kcat (the producer) died"; }
  l=$(tail -n 1 "$WORK/samples" | awk '{ print $2 }')
  if [ "${l:-999999}" -le "$STEADY_LAG" ] && [ "$(tail -n 1 "$WORK/samples" | awk '{ print $1 }')" -gt "$BEND" ]; then
    DRAINED=$(now_ms); break
  fi
  sleep 0.5
done
[ -n "$DRAINED" ] || fail "the lag did not drain to its steady level ($STEADY_LAG) within $DRAIN_MAX_S s after the burst"
sleep 2
kill -0 "$KCAT" 2>/dev/null || { cat "$WORK/kcat-b.txt"; fail "kcat (the producer) died"; }
kill -TERM "$PYPID" 2>/dev/null || true
wait "$PYPID" 2>/dev/null || true
rc=0; wait "$KCAT" || rc=$?
[ "$rc" = 0 ] || { cat "$WORK/kcat-b.txt"; fail "kcat (the producer) exit status $rc"; }
NPROD=$(wc -l <"$WORK/b.ids")
wait_all b 300
# the lag must reach 0 once the input stopped (committed offsets at the log end; up to 30 s)
for _ in $(seq 1 60); do
  LAGEND=$(curl -s --max-time 2 "http://127.0.0.1:$MP/metrics" | awk '$1 ~ /^spillway:consumer_lag[{]/ { s += $2 } END { print s + 0 }')
  [ "$LAGEND" = 0 ] && break
  sleep 0.5
done
stop_worker "$W" w1
kill "$SAMPLER" 2>/dev/null || true
wait "$SAMPLER" 2>/dev/null || true
NASSIGN=$(grep -cE ' INFO assigned [0-9]+ partition' "$WORK/w1.log" || true)
NREVOKE=$(sed '/ INFO draining /,$d' "$WORK/w1.log" | grep -cE ' INFO (revoked|lost) [0-9]+ partition' || true)
FIG=$(verify b exact)

read -r LAGMAX DRATE RSSIDLE RSS0 RSSMAX RSSEND FD0 FDEND BURSTN <<<"$(python3 - "$WORK/samples" "$BSTART" "$BEND" <<'PY'
import sys
rows = [list(map(int, l.split())) for l in open(sys.argv[1]) if len(l.split()) == 5]
bs, be = int(sys.argv[2]), int(sys.argv[3])
lagmax = max(r[1] for r in rows)
inb = [r for r in rows if bs <= r[0] <= be]
drate = (inb[-1][2] - inb[0][2]) * 1000 / (inb[-1][0] - inb[0][0]) if len(inb) >= 2 else float("nan")
rss = [r[3] for r in rows if r[3] > 0]
fds = [r[4] for r in rows if r[4] > 0]
# "start": the last sample before the burst (warmed up by the steady phase)
rss0 = [r[3] for r in rows if r[0] < bs and r[3] > 0][-1]
fd0 = [r[4] for r in rows if r[0] < bs and r[4] > 0][-1]
print(lagmax, f"{drate:.1f}", rss[0], rss0, max(rss), rss[-1], fd0, fds[-1], len(inb))
PY
)"
PCT=$(python3 -c "print(round(100 * $DRATE / $MAX))" 2>/dev/null || echo nan)
DRAIN_S=$(python3 -c "print(round(($DRAINED - $BEND) / 1000, 1))")
CMD="BURST_S=$BURST_S BURST_X=$BURST_X STEADY_FRAC=$STEADY_FRAC STEADY_S=$STEADY_S MAX_N=$MAX_N PARTS=$PARTS bench/load_burst.sh $([ "$CI" = 1 ] && echo '--ci ' || true)SPILLWAY MODELS"
TABLE="| figure | value |
|---|---|
| max throughput (backlog of $MAX_N drained) | $MAX results/s |
| steady rate / burst rate | $R/s for ${STEADY_S} s / $RB/s for ${BURST_S} s |
| messages produced (burst run) | $NPROD |
| consumer lag peak | $LAGMAX |
| lag back to its steady level (<= $STEADY_LAG) | ${DRAIN_S} s after the burst's end; 0 once the input stopped (final lag $LAGEND) |
| drain rate during the burst | $DRATE results/s = ${PCT}% of max (goal >= 80%) |
| assignments / revocations before the stop | $NASSIGN / $NREVOKE |
| verifier | $FIG |
| VmRSS idle / start (burst's start) / max / end | $((RSSIDLE / 1024)) / $((RSS0 / 1024)) / $((RSSMAX / 1024)) / $((RSSEND / 1024)) MiB |
| open files at the burst's start / end | $FD0 / $FDEND |"
echo
echo "$CMD"
echo "$TABLE"
python3 -c "import sys; sys.exit(0 if $LAGMAX > 0 else 1)" || fail "the lag never rose: the burst was not above the worker's throughput"
[ "$LAGEND" = 0 ] || fail "lag $LAGEND after the drain"
[ "$NASSIGN" = 1 ] || fail "$NASSIGN assignments: a rebalance happened"
[ "$NREVOKE" = 0 ] || fail "partitions revoked/lost before the stop"
# the KV pool (kv.mem_mb 64 of run_worker) is touched lazily: bigger batches in the burst touch more;
# an AddressSanitizer build also fills its freed-memory quarantine (256 MiB by default)
ALLOW=65536
# grep reads all of nm's output: with -q it could exit first, and under pipefail nm's SIGPIPE
# would fail the pipeline and hide the match
nm "$SPILLWAY" 2>/dev/null | grep __asan_init >/dev/null && ALLOW=$((ALLOW + 262144))
[ "$RSSMAX" -le $(( RSS0 * RSS_FACTOR + ALLOW )) ] || fail "RSS grew from $RSS0 kB to $RSSMAX kB (> ${RSS_FACTOR}x + $((ALLOW / 1024)) MiB)"
if [ "$CI" = 0 ]; then
  {
    echo
    echo "## Load burst ($(date -u +%Y-%m-%d))"
    echo
    echo "Command: \`$CMD\`; spillway $(git -C "$HERE/.." rev-parse --short HEAD 2>/dev/null || echo '?') (working tree), Release."
    echo "Machine: $(nproc) CPUs ($(grep -m1 'model name' /proc/cpuinfo | sed 's/.*: //')), shared with other jobs; one worker, threads=1, max.inflight 64, $PARTS partitions, stories260K, max_tokens 1..4."
    echo
    echo "$TABLE"
  } >>"$HERE/RESULTS.md"
  say "appended to bench/RESULTS.md"
fi
say "PASS"
