#!/usr/bin/env bash
# scripts/gpu-mem-check.sh BIN MODEL [ENGINE FLAGS...]: `spillway plan --backend cuda` against
# what the CUDA engine really takes from the device, for one model and setting (gpu-check.sh's
# gpu-mem stage; needs a GPU). The prediction is plan's cuda.total_bytes (engine/devmem.h, the
# formula the backend sizes itself with); the measurement is what the device's free memory fell
# by while the backend was created (cudaMemGetInfo before and after, printed by
# `spillway generate --stats`). Tolerance: 2 MiB per device allocation (the allocator's page
# rounding) + 64 MiB (cuBLAS's own state and the kernels' module code, outside the formula).
# Prints one line "gpu-mem: ...: ok" or "...: FAIL"; exit 0 when within the tolerance.
# ENGINE FLAGS must fix the pool (--kv-blocks N): a pool sized from free memory depends on what
# is free at that moment, which plan cannot know.
set -uo pipefail
BIN=$1 MODEL=$2
shift 2
PJ=$("$BIN" plan --json --backend cuda -m "$MODEL" "$@") || { echo "gpu-mem: plan failed"; exit 1; }
read -r PLANNED ALLOCS < <(printf '%s' "$PJ" | python3 -c \
  'import json,sys; c=json.load(sys.stdin)["cuda"]; print(c["total_bytes"], c["allocations"])')
OUTP=$("$BIN" generate --backend cuda -m "$MODEL" "$@" -p "Once upon a time" -n 4 -t 0 \
  --stats 2>&1 >/dev/null) || { echo "gpu-mem: generate failed: $OUTP"; exit 1; }
LINE=$(printf '%s\n' "$OUTP" | grep 'device memory: planned')
ENGINE_PLANNED=$(printf '%s' "$LINE" | sed -n 's/.*planned \([0-9]*\) B.*/\1/p')
MEASURED=$(printf '%s' "$LINE" | sed -n 's/.*measured \([0-9]*\) B.*/\1/p')
if [ -z "$MEASURED" ] || [ -z "$PLANNED" ]; then
  echo "gpu-mem: no figures (plan: '$PLANNED', engine: '$LINE')"
  exit 1
fi
TOL=$((ALLOCS * 2 * 1048576 + 64 * 1048576))
DIFF=$((MEASURED - PLANNED))
ADIFF=${DIFF#-}
VERDICT=ok
[ "$ENGINE_PLANNED" = "$PLANNED" ] || VERDICT="FAIL (the engine planned $ENGINE_PLANNED B)"
[ "$ADIFF" -le "$TOL" ] || VERDICT=FAIL
echo "gpu-mem: $(basename "$MODEL") $*: plan $PLANNED B, measured $MEASURED B, difference $DIFF B" \
  "(tolerance $TOL B: $ALLOCS allocations): $VERDICT"
[ "$VERDICT" = ok ]
