#!/usr/bin/env bash
# `spillway top`: a tiny Python HTTP server serves a static /metrics text that changes between
# requests (each path has its own sequence: request 1 gets scrape A, later ones scrape B), and
# `spillway top URL --once --interval 0.5` must print the rates, quantiles, hit rates and lag
# computed from A -> B. Then the error paths: connection refused, 404, a page that is not
# Prometheus text, a non-http URL (exit 1 with a clear message), and a usage error (exit 2).
# Arguments (from ctest): the spillway binary and the models folder (unused).
set -euo pipefail
SPILLWAY=$(realpath "$1")
command -v python3 >/dev/null 2>&1 || { echo "SKIP: python3 not installed"; exit 77; }

WORK=$(mktemp -d "${TMPDIR:-/tmp}/spillway-top.XXXXXX")
SRV_PID=""
cleanup() {
  if [ -n "$SRV_PID" ]; then kill "$SRV_PID" 2>/dev/null || true; wait "$SRV_PID" 2>/dev/null || true; fi
  rm -rf "$WORK"
}
trap cleanup EXIT
fail() { echo "FAIL: $*"; [ -f "$WORK/out" ] && cat "$WORK/out"; [ -f "$WORK/err" ] && cat "$WORK/err"; exit 1; }

cat > "$WORK/server.py" <<'PY'
import http.server, sys, threading

# Scrape A, then B: over the interval 10 results (8 stop, 2 length), 200 generated and 600 prompt
# tokens, 1 DLQ record; tier 1 prefix cache 80 hits of 100 queries (130/200 in total); TTFT
# buckets +40 in (0.02,0.04], +50 in (0.04,0.06], +10 in (0.25,0.5] on top of 100 in (0.1,0.25].
BOUNDS = ["0.001", "0.005", "0.01", "0.02", "0.04", "0.06", "0.08", "0.1", "0.25", "0.5", "0.75",
          "1", "2.5", "5", "7.5", "10", "20", "40", "80", "160", "640", "2560", "+Inf"]

def hist(name, per_bucket):  # per_bucket: {le: count in that bucket alone}
    out, cum, total_sum = [f"# HELP {name} latency", f"# TYPE {name} histogram"], 0, 0.0
    for le in BOUNDS:
        cum += per_bucket.get(le, 0)
        out.append(f'{name}_bucket{{le="{le}"}} {cum}')
    out += [f"{name}_sum 12.5", f"{name}_count {cum}"]
    return out

def text(stop, length, gen, prompt, dlq, q1, h1, ttft, lag0, lag1):
    lines = [
        "# HELP spillway:request_success_total results produced",
        "# TYPE spillway:request_success_total counter",
        f'spillway:request_success_total{{finished_reason="stop"}} {stop}',
        f'spillway:request_success_total{{finished_reason="length"}} {length}',
        f"spillway:generation_tokens_total {gen}",
        f"spillway:prompt_tokens_total {prompt}",
        f'spillway:dlq_records_total{{reason="invalid_json"}} {dlq}',
        "spillway:num_requests_running 12",
        "spillway:num_requests_waiting 3",
        "spillway:kv_cache_usage_perc 0.45",
        f'spillway:prefix_cache_queries_total{{tier="1"}} {q1}',
        f'spillway:prefix_cache_hits_total{{tier="1"}} {h1}',
        'spillway:prefix_cache_queries_total{tier="2"} 0',
        'spillway:prefix_cache_hits_total{tier="2"} 0',
        f'spillway:consumer_lag{{topic="prompts",partition="1"}} {lag1}',
        f'spillway:consumer_lag{{topic="prompts",partition="0"}} {lag0}',
        'spillway:model_loaded{model="we \\"quoted\\" \\\\ name"} 1',
        "spillway:redis_up 1",
        "",
    ] + hist("spillway:time_to_first_token_seconds", ttft)
    return ("\n".join(lines) + "\n").encode()

A = text(100, 20, 5000, 20000, 4, 100, 50, {"0.25": 100}, 900, 900)
B = text(108, 22, 5200, 20600, 5, 200, 130, {"0.04": 40, "0.06": 50, "0.25": 100, "0.5": 10},
         700, 800)
seen = {}
lock = threading.Lock()

class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        if self.path.startswith("/html"):
            body, ctype, code = b"<html><body>hello</body></html>\n", "text/html", 200
        elif self.path.startswith("/m"):
            with lock:
                n = seen.get(self.path, 0)
                seen[self.path] = n + 1
            body, ctype, code = (A if n == 0 else B), "text/plain; version=0.0.4", 200
        else:
            body, ctype, code = b"nothing here\n", "text/plain", 404
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *a):
        pass

srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
with open(sys.argv[1] + ".tmp", "w") as f:
    f.write(str(srv.server_address[1]))
import os
os.rename(sys.argv[1] + ".tmp", sys.argv[1])
srv.serve_forever()
PY
python3 "$WORK/server.py" "$WORK/port" &
SRV_PID=$!
for _ in $(seq 100); do [ -f "$WORK/port" ] && break; sleep 0.1; done
[ -f "$WORK/port" ] || fail "test server did not start"
PORT=$(cat "$WORK/port")
echo "test server on port $PORT"

# ---- the table ----
"$SPILLWAY" top "http://127.0.0.1:$PORT/m1" --once --interval 0.5 --max-seqs 16 >"$WORK/out" 2>"$WORK/err" \
  || fail "spillway top exited $?"
cat "$WORK/out"
line() { grep -E "^$1 " "$WORK/out" || fail "no line '$1'"; }
field() { line "$1" | awk -v n="$2" '{print $n}'; }
# a rate: increase / the interval top measured between its two scrapes, which it prints in its
# header with two decimals (at least the 0.5 s asked for; more when the machine is busy)
DT=$(sed -n 's/^spillway top .*(rates over \([0-9.]*\) s)$/\1/p' "$WORK/out")
[ -n "$DT" ] || fail "no '(rates over N s)' header"
in_range() { python3 -c "import sys; v=float(sys.argv[1]); sys.exit(0 if float(sys.argv[2]) <= v <= float(sys.argv[3]) else 1)" "$@"; }
in_range "$DT" 0.5 1e9 || fail "interval $DT s is shorter than the 0.5 s asked for"
check_rate() { # title field increase
  local v; v=$(field "$1" "$2")
  # increase / DT, DT being rounded to 0.005 s and the rate to two decimals
  local lo hi
  lo=$(python3 -c "print($3/($DT+0.005)-0.006)")
  hi=$(python3 -c "print($3/($DT-0.005)+0.006)")
  in_range "$v" "$lo" "$hi" || fail "$1: $v, want $3 / $DT s, in [$lo, $hi]"
}
check_rate "results/s" 2 10
line "results/s" | grep -q "(stop [0-9.]*, length [0-9.]*)" || fail "results/s breakdown"
check_rate "generated tok/s" 3 200
check_rate "prompt tok/s" 3 600
check_rate "dlq/s" 2 1
line "dlq/s" | grep -q "(invalid_json " || fail "dlq/s breakdown"
[ "$(field "requests running" 3)" = 12 ] || fail "running"
[ "$(field "requests waiting" 3)" = 3 ] || fail "waiting"
[ "$(field "batch occupancy" 3)" = "75.0%" ] || fail "occupancy"
line "batch occupancy" | grep -q "(12 of 16 seqs)" || fail "occupancy detail"
[ "$(field "kv cache usage" 4)" = "45.0%" ] || fail "kv usage"
line "prefix hit tier 1" | grep -q "interval 80.0% (80/100)  total 65.0% (130/200)" || fail "tier 1 hit rate"
line "prefix hit tier 2" | grep -q "interval - (0/0)  total - (0/0)" || fail "tier 2 hit rate"
# TTFT over the interval: cumulative deltas 0.04:40 0.06:90 0.5:100
#   p50: 0.04 + 0.02*10/50 = 44ms; p90: 0.04 + 0.02*50/50 = 60ms; p99: 0.25 + 0.25*9/10 = 475ms
line "ttft" | grep -qE "^ttft +p50 44\.0ms +p90 60\.0ms +p99 475\.0ms +n=100$" || fail "ttft interval quantiles"
# since start: 0.04:40 0.06:90 0.25:190 0.5:200
#   p50: 0.1 + 0.15*10/100 = 115ms; p90: 0.1 + 0.15*90/100 = 235ms; p99: 0.25 + 0.25*8/10 = 450ms
grep -qE "^ttft \(all\) +p50 115\.0ms +p90 235\.0ms +p99 450\.0ms +n=200$" "$WORK/out" || fail "ttft total quantiles"
grep -qE "^e2e latency +p50 - +p90 - +p99 - +n=-$" "$WORK/out" || fail "absent histogram"
[ "$(field "consumer lag" 3)" = 1500 ] || fail "total lag"
grep -qE "^  prompts/0 +700$" "$WORK/out" || fail "partition 0 lag"
grep -qE "^  prompts/1 +800$" "$WORK/out" || fail "partition 1 lag"
[ "$(grep -n 'prompts/0' "$WORK/out" | cut -d: -f1)" -lt "$(grep -n 'prompts/1' "$WORK/out" | cut -d: -f1)" ] \
  || fail "partitions not in order"
[ "$(field "redis_up" 2)" = 1 ] || fail "redis_up"

# stdout not a terminal: one table without --once too
"$SPILLWAY" top "http://127.0.0.1:$PORT/m2" --interval 0.2 >"$WORK/out" 2>"$WORK/err" || fail "non-tty run exited $?"
[ "$(grep -c '^spillway top ' "$WORK/out")" = 1 ] || fail "non-tty: expected one table"

# on a terminal (a pty from script(1)): redraws every interval until SIGINT, then exit 0
if command -v script >/dev/null 2>&1; then
  export SPILLWAY PORT
  # script -f writes the typescript as it comes, so the inner shell interrupts top once the
  # file holds two frames (or after 60 s, which then fails below)
  export LIVE="$WORK/live" FRAME="spillway top  http://127.0.0.1:$PORT/m4  (rates over"
  script -q -f -e -c 'sh -c "\"$SPILLWAY\" top http://127.0.0.1:$PORT/m4 --interval 0.2 & p=\$!; i=0; while [ \$i -lt 600 ] && [ \$(grep -c \"\$FRAME\" \"\$LIVE\") -lt 2 ]; do sleep 0.1; i=\$((i+1)); done; kill -INT \$p; wait \$p; echo top-exit=\$?"' \
    "$WORK/live" >/dev/null 2>&1 || true
  grep -q "top-exit=0" "$WORK/live" || { cat -v "$WORK/live"; fail "live mode did not exit 0 on SIGINT"; }
  frames=$(grep -c "spillway top  http://127.0.0.1:$PORT/m4  (rates over" "$WORK/live" || true)
  [ "$frames" -ge 2 ] || { cat -v "$WORK/live"; fail "live mode: $frames frames, want >= 2"; }
  grep -q $'\e\[H\e\[2J' "$WORK/live" || fail "live mode: no screen clear"
  echo "ok: live mode, $frames frames"
fi

# ---- errors ----
expect_fail() { # exit-code message-regex args...
  local want=$1 re=$2; shift 2
  set +e
  "$SPILLWAY" top "$@" --once --interval 0.1 >"$WORK/out" 2>"$WORK/err"
  local rc=$?
  set -e
  [ "$rc" = "$want" ] || fail "top $*: exit $rc, want $want"
  grep -qE "$re" "$WORK/err" || fail "top $*: message does not match '$re'"
  echo "ok: top $* -> $(head -1 "$WORK/err")"
}
# a port nothing listens on: bind one and close it
DEAD=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1]); s.close()')
expect_fail 1 "cannot connect to 127\.0\.0\.1:$DEAD" "http://127.0.0.1:$DEAD/metrics"
expect_fail 1 "HTTP/1\.[01] 404" "http://127.0.0.1:$PORT/nothing"
expect_fail 1 "not Prometheus text: line 1" "http://127.0.0.1:$PORT/html"
expect_fail 1 "only http:// URLs" "https://127.0.0.1:$PORT/metrics"
expect_fail 1 "not a valid" "http://127.0.0.1:99999/metrics"
expect_fail 2 "interval" "http://127.0.0.1:$PORT/m3" --interval 0
echo "PASS"
