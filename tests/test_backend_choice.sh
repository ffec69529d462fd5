#!/usr/bin/env bash
# Choosing the compute backend: `--backend` on `spillway generate`, `eval` and `logits`, and the
# worker keys `backend` / `cuda.device`.
# 1. --backend auto runs everywhere: on this host it must give the same greedy text as
#    --backend cpu when the host has no CUDA device (auto = cpu then).
# 2. --backend cuda on a host without a usable device (a CPU-only build, or a CUDA build without
#    a device) fails at start, exit 1, with a message saying which is missing: "not built in"
#    or "no CUDA device". On a host with a device it must run instead (and --cuda-device 999
#    must name the missing device index).
# 3. The worker with backend=cuda fails at start the same way, before it contacts any broker
#    (models load first; the broker address here is a closed port).
# 4. Bad values are usage errors (exit 2) naming the key's choices / range.
# Arguments (from ctest): the spillway binary and the models folder.
set -euo pipefail
SPILLWAY=$(realpath "$1")
MODELS=${2:-}
STORIES="$MODELS/stories260K.gguf"
[ -f "$STORIES" ] || { echo "SKIP: $STORIES not found"; exit 77; }

WORK=$(mktemp -d "${TMPDIR:-/tmp}/spillway-backend.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
fail() { echo "FAIL: $*"; for f in "$WORK"/*.out "$WORK"/*.err; do [ -f "$f" ] && { echo "--- $f"; cat "$f"; }; done; exit 1; }
printf 'Once upon a time, there was a little girl named Lily. She liked to play.\n' > "$WORK/story.txt"

# rc of a command, its output in $WORK/$name.out and .err
run() {
    local name=$1
    shift
    set +e
    "$@" > "$WORK/$name.out" 2> "$WORK/$name.err"
    local rc=$?
    set -e
    echo $rc
}

GEN=(generate -m "$STORIES" -p "Once upon a time" -n 16 -t 0 --threads 1)
[ "$(run gen_cpu "$SPILLWAY" "${GEN[@]}" --backend cpu)" = 0 ] || fail "generate --backend cpu"
[ "$(run gen_auto "$SPILLWAY" "${GEN[@]}" --backend auto)" = 0 ] || fail "generate --backend auto"
rc_cuda=$(run gen_cuda "$SPILLWAY" "${GEN[@]}" --backend cuda)
if grep -q "not built in\|no CUDA device" "$WORK/gen_cuda.err"; then
    has_device=0
    [ "$rc_cuda" = 1 ] || fail "generate --backend cuda without a device: exit $rc_cuda, want 1"
    cmp -s "$WORK/gen_cpu.out" "$WORK/gen_auto.out" || fail "auto without a device differs from cpu"
    echo "without a device: $(head -c 300 "$WORK/gen_cuda.err")"
else
    has_device=1
    [ "$rc_cuda" = 0 ] || fail "generate --backend cuda: exit $rc_cuda without a reason named"
    [ "$(run gen_dev "$SPILLWAY" "${GEN[@]}" --backend cuda --cuda-device 999)" = 1 ] &&
        grep -q "no CUDA device 999" "$WORK/gen_dev.err" || fail "--cuda-device 999 on a device host"
fi

for cmd in eval logits; do
    if [ $cmd = eval ]; then args=(eval -m "$STORIES" -f "$WORK/story.txt" --threads 1)
    else args=(logits -m "$STORIES" -i "$WORK/story.txt" -o "$WORK/logits.bin" --threads 1); fi
    [ "$(run ${cmd}_auto "$SPILLWAY" "${args[@]}" --backend auto)" = 0 ] || fail "$cmd --backend auto"
    rc=$(run ${cmd}_cuda "$SPILLWAY" "${args[@]}" --backend cuda)
    if [ $has_device = 0 ]; then
        [ "$rc" = 1 ] && grep -q "not built in\|no CUDA device" "$WORK/${cmd}_cuda.err" ||
            fail "$cmd --backend cuda without a device: exit $rc"
    else
        [ "$rc" = 0 ] || fail "$cmd --backend cuda on a device host: exit $rc"
    fi
done

if [ $has_device = 0 ]; then
    rc=$(run worker timeout 60 "$SPILLWAY" worker -m "$STORIES" -b 127.0.0.1:1 -t in -o out \
         -s backend=cuda -s threads=1)
    [ "$rc" != 0 ] && [ "$rc" != 124 ] || fail "worker backend=cuda without a device: exit $rc"
    grep -q "not built in\|no CUDA device" "$WORK/worker.err" ||
        fail "worker backend=cuda without a device: no reason named"
fi

[ "$(run bad_backend "$SPILLWAY" "${GEN[@]}" --backend tpu)" = 2 ] &&
    grep -q "cpu, cuda or auto" "$WORK/bad_backend.err" || fail "--backend tpu: not a usage error naming the choices"
[ "$(run bad_device "$SPILLWAY" "${GEN[@]}" --cuda-device -1)" = 2 ] || fail "--cuda-device -1"
[ "$(run cfg "$SPILLWAY" config -s backend=auto -s cuda.device=1)" = 0 ] &&
    grep -q "^backend *= auto " "$WORK/cfg.out" && grep -q "^cuda.device *= 1 " "$WORK/cfg.out" ||
    fail "spillway config with backend=auto cuda.device=1"
[ "$(run cfg_bad "$SPILLWAY" config -s backend=gpu)" != 0 ] || fail "config backend=gpu accepted"
echo "backend choice: ok (device: $has_device)"
