#!/usr/bin/env bash
# scripts/gpu-check.sh: the checks that need an NVIDIA GPU, made to run on the lent device machine
# (nvcc, the CUDA runtime, cuBLAS only as the nvidia-cublas Python wheel, CMake and ninja, no
# network, none of our Debian libraries) in one call, within about 6 minutes. Stages, each with
# its own time limit, all within SPILLWAY_GPU_BUDGET seconds:
#   host        the machine: GPU (nvidia-smi), nvcc, cmake, compiler, cores
#   deps        unpacks .gpu/debs (scripts/gpu-pack.sh) into .gpu/root and reads the libraries
#               through their .pc files with the carried pkgconf (the system's when absent)
#   cublas      finds libcublas.so.N in the Python environments' nvidia-cublas wheel (or
#               SPILLWAY_CUBLAS as given) for the backend's run-time loader
#   configure   engine-only Release build (SPILLWAY_ENGINE_ONLY=ON, SPILLWAY_CUDA=ON); warnings
#               are not errors here (another compiler than CI's), CI enforces them
#   build       spillway (engine commands), test_engine, test_kernels, test_cuda, bench_cuda
#   cpu-tests   test_engine and test_kernels: the CPU reference the GPU is checked against
#   cpu-generate  spillway generate, greedy, stories260K on the CPU backend
#   test_cuda   every kernel against a CPU reference, and greedy stories260K on the CUDA backend
#               equal to the CPU backend's (F32); sampling on the device equal to the CPU sampler
#               on the same logits (ids, logprobs, penalty counts) and batch-invariant, its lines
#               as rows of the table; exit 77 (no device) is a failure when a GPU is
#               present. Without a GPU it still runs: it checks the backend's refusal, then skips
#   gpu-mem     `spillway plan --backend cuda` (engine/devmem.h) against what the CUDA engine
#               took from the device (scripts/gpu-mem-check.sh: within 2 MiB per allocation +
#               64 MiB), stories260K in F32 and BF16 with fixed pools
#   fp8-eval    spillway eval of a random model (dims multiples of 16) with cuda.dtype fp8
#               against bf16 (--kld-dtype): perplexities, mean KL divergence, top-1 agreement
#   engine-serve  bench_engine --serve 1000,128,128 through the engine's scheduler on a random
#               Llama-3.2-1B-shaped BF16 file, cuda.dtype bf16 then fp8 (engine_serve.md)
#   bench_cuda  copy bandwidth, GEMM rate, decode/prefill/128-in-128-out on synthetic
#               Llama-3.2-1B and Llama-3.1-8B shapes, BF16 then FP8, beside the H200 goals
# Without a GPU (no nvidia-smi, or it lists none) the GPU stages say so and are skipped, and the
# rest runs: a rehearsal. Writes gpu-check.md (the table), gpu-check.log (all output),
# test_cuda.log and bench_cuda.md to $OUT when set (the device tool), else to BUILD/out.
# Exit 0 when no stage failed (skipped is not failed; benchmark goals are reported, not enforced).
#   SPILLWAY_GPU_DIR     the carried folder: debs/, models/ (default .gpu)
#   SPILLWAY_GPU_BUILD   build folder (default build-gpu)
#   SPILLWAY_GPU_BUDGET  seconds for all stages (default 330)
#   SPILLWAY_GPU_SCALE   multiplies each stage's limit (default 1; a rehearsal on a small or
#                        loaded machine, e.g. 2 cores: 4, with a budget to match)
#   SPILLWAY_CUBLAS      libcublas.so.N or its folder (default: found in the Python wheel)
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
GPU_DIR=${SPILLWAY_GPU_DIR:-$ROOT/.gpu}
case $GPU_DIR in /*) ;; *) GPU_DIR=$ROOT/$GPU_DIR ;; esac
BUILD=${SPILLWAY_GPU_BUILD:-build-gpu}
BUDGET=${SPILLWAY_GPU_BUDGET:-330}
SCALE=${SPILLWAY_GPU_SCALE:-1}
OUTDIR=${OUT:-$ROOT/$BUILD/out}
mkdir -p "$OUTDIR" "$BUILD"
LOG=$OUTDIR/gpu-check.log
TABLE=$OUTDIR/gpu-check.md
: >"$LOG"
T0=$(date +%s)
DEADLINE=$((T0 + BUDGET))
ROWS=()
FAILED=0
JOBS=$(nproc)

say() { echo "$*" | tee -a "$LOG"; }
row() { ROWS+=("| $1 | $2 | $3 | $4 |"); }

# stage NAME LIMIT CMD...: runs CMD with a time limit of min(LIMIT, what the budget leaves),
# its output to the log; records a row. Returns CMD's status (124: timed out).
stage() {
  local name=$1 limit=$2
  shift 2
  local now left rc t1
  limit=$((limit * SCALE))
  now=$(date +%s)
  left=$((DEADLINE - now))
  if [ "$left" -lt 10 ]; then
    say "=== $name: not run (the ${BUDGET} s budget is spent) ==="
    row "$name" "NOT RUN" 0 "no time left in the ${BUDGET} s budget"
    FAILED=1
    return 125
  fi
  [ "$limit" -gt "$left" ] && limit=$left
  say "=== $name (limit ${limit} s, at $((now - T0)) s) ==="
  timeout -k 5 "$limit" "$@" >>"$LOG" 2>&1
  rc=$?
  t1=$(date +%s)
  LAST_SECS=$((t1 - now))
  return $rc
}
# record NAME RC NOTE: the row of a stage that must pass (125: not run, row already there)
record() {
  if [ "$2" -eq 125 ]; then
    return
  elif [ "$2" -eq 0 ]; then
    row "$1" passed "$LAST_SECS" "$3"
  elif [ "$2" -eq 124 ] || [ "$2" -eq 137 ]; then
    row "$1" "TIMED OUT" "$LAST_SECS" "$3"
    FAILED=1
  else
    row "$1" "FAILED (exit $2)" "$LAST_SECS" "$3"
    FAILED=1
  fi
  say "--- $1: exit $2, $LAST_SECS s"
}

finish() {
  {
    echo "# gpu-check $(date -u '+%Y-%m-%d %H:%M UTC'), commit $(git rev-parse --short HEAD 2>/dev/null || echo '?')"
    echo
    echo "GPU: ${GPU_DESC:-none}  "
    echo "nvcc: ${NVCC_DESC:-none}; cuBLAS: ${SPILLWAY_CUBLAS:-not found}  "
    echo "host: $JOBS cores, $(uname -m); total $(( $(date +%s) - T0 )) s of a ${BUDGET} s budget"
    echo
    echo "| stage | result | s | note |"
    echo "| --- | --- | --- | --- |"
    printf '%s\n' "${ROWS[@]}"
    echo
    if [ "$HAVE_GPU" -eq 0 ]; then
      echo "NO GPU on this machine: the GPU stages (test_cuda on a device, bench_cuda) did not run."
    fi
    if [ -s "$OUTDIR/engine_serve.md" ]; then
      echo
      echo "## engine-serve (bench_engine --serve 1000,128,128, Llama-3.2-1B shape)"
      echo
      cat "$OUTDIR/engine_serve.md"
    fi
    if [ -s "$OUTDIR/bench_cuda.md" ]; then
      echo
      echo "## bench_cuda"
      echo
      cat "$OUTDIR/bench_cuda.md"
    fi
  } >"$TABLE"
  say ""
  cat "$TABLE" | tee -a "$LOG"
  exit "$FAILED"
}

# ---- host ----
HAVE_GPU=0
GPU_DESC=""
say "=== host (at 0 s) ==="
if command -v nvidia-smi >/dev/null 2>&1; then
  GPU_DESC=$(timeout 30 nvidia-smi --query-gpu=name,memory.total,driver_version \
             --format=csv,noheader 2>>"$LOG" | head -n 1)
  [ -n "$GPU_DESC" ] && HAVE_GPU=1
fi
NVCC=""
for c in "$(command -v nvcc 2>/dev/null)" /usr/local/cuda/bin/nvcc; do
  if [ -n "$c" ] && [ -x "$c" ]; then NVCC=$c; break; fi
done
NVCC_DESC=""
[ -n "$NVCC" ] && NVCC_DESC="$NVCC, $("$NVCC" --version | sed -n 's/.*\(release [0-9.]*\).*/\1/p')"
GEN=()
command -v ninja >/dev/null 2>&1 && GEN=(-G Ninja)
{
  echo "GPU: ${GPU_DESC:-none found}"
  echo "nvcc: ${NVCC_DESC:-none}"
  cmake --version | head -n 1
  echo "generator: ${GEN[*]:-default}; C compiler: $(cc --version 2>/dev/null | head -n 1)"
  echo "cores: $JOBS; $(grep -m1 PRETTY_NAME /etc/os-release 2>/dev/null)"
} | tee -a "$LOG"
if [ ! -f "$GPU_DIR/models/stories260K.gguf" ]; then
  say "gpu-check: $GPU_DIR/models/stories260K.gguf is missing (run scripts/gpu-pack.sh here and carry .gpu): the model checks will fail"
  row models FAILED 0 "no $GPU_DIR/models/stories260K.gguf"
  FAILED=1
fi
if [ "$HAVE_GPU" -eq 1 ]; then
  row host passed 0 "GPU: $GPU_DESC"
else
  row host passed 0 "no GPU: nvidia-smi $(command -v nvidia-smi >/dev/null 2>&1 && echo 'lists none' || echo 'is not installed')"
  say "gpu-check: NO GPU on this machine: the GPU stages will be skipped (a rehearsal)"
fi

# ---- deps: the carried .deb files, unpacked into a private folder ----
PKGCONF=()
deps() {
  local r=$GPU_DIR/root f
  rm -rf "$r"
  mkdir -p "$r"
  for f in "$GPU_DIR"/debs/*.deb; do
    if command -v dpkg-deb >/dev/null 2>&1; then
      dpkg-deb -x "$f" "$r" || return 1
    else # a .deb is an ar archive; its files are the data.tar.* member
      local m z
      m=$(ar t "$f" | grep '^data\.tar') || return 1
      case $m in *.xz) z=-J ;; *.zst) z=--zstd ;; *.gz) z=-z ;; *) z= ;; esac
      ar p "$f" "$m" | tar -x $z -f - -C "$r" || return 1
    fi
  done
  local libdir=$r/usr/lib/x86_64-linux-gnu
  # pkgconf reads only the unpacked .pc files, prefixes their paths with the folder, and
  # filters no "system" folder (they are not the system's here)
  cat >"$r/pkg-config" <<EOF
#!/bin/sh
export LD_LIBRARY_PATH="$libdir\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}"
export PKG_CONFIG_LIBDIR="$libdir/pkgconfig:$r/usr/share/pkgconfig"
export PKG_CONFIG_SYSROOT_DIR="$r"
export PKG_CONFIG_SYSTEM_INCLUDE_PATH=/nonexistent PKG_CONFIG_SYSTEM_LIBRARY_PATH=/nonexistent
unset PKG_CONFIG_PATH
exec "$r/usr/bin/pkgconf" "\$@"
EOF
  chmod +x "$r/pkg-config"
  "$r/pkg-config" --modversion libpcre2-8 libxxhash libsodium jansson hiredis &&
    "$r/pkg-config" --cflags --libs libpcre2-8 libxxhash libsodium jansson hiredis
}
if ls "$GPU_DIR"/debs/*.deb >/dev/null 2>&1; then
  export -f deps
  export GPU_DIR
  stage deps 60 bash -c deps
  rc=$?
  record deps $rc "$(ls "$GPU_DIR"/debs/*.deb | wc -l) packages from $GPU_DIR/debs"
  # (the prefix path too: some .pc files name a lib folder that is not where the library is)
  [ $rc -eq 0 ] && PKGCONF=(-DPKG_CONFIG_EXECUTABLE="$GPU_DIR/root/pkg-config"
                            -DCMAKE_PREFIX_PATH="$GPU_DIR/root/usr")
else
  row deps skipped 0 "no $GPU_DIR/debs (scripts/gpu-pack.sh): the system's libraries"
fi

# ---- cublas: the nvidia-cublas wheel of a Python environment ----
find_cublas() {
  local py d
  for py in python3 /opt/torch/.venv/bin/python3 ${VIRTUAL_ENV:+$VIRTUAL_ENV/bin/python3}; do
    command -v "$py" >/dev/null 2>&1 || continue
    # the files the wheel installed (its RECORD), whatever its distribution name
    d=$("$py" - <<'EOF' 2>/dev/null
import importlib.metadata as md
for name in ("nvidia-cublas", "nvidia-cublas-cu13", "nvidia-cublas-cu12"):
    try:
        dist = md.distribution(name)
    except md.PackageNotFoundError:
        continue
    for f in dist.files or []:
        if f.name.startswith("libcublas.so."):
            print(dist.locate_file(f).resolve().parent)
            raise SystemExit(0)
EOF
)
    if [ -n "$d" ]; then echo "$d"; return 0; fi
    # else any site folder's nvidia/*/lib/libcublas.so.N
    for d in $("$py" -c 'import site; print(" ".join(site.getsitepackages()))' 2>/dev/null); do
      d=$(find "$d/nvidia" -maxdepth 3 -name 'libcublas.so.*' -print -quit 2>/dev/null)
      if [ -n "$d" ]; then dirname "$d"; return 0; fi
    done
  done
  return 1
}
say "=== cublas ==="
if [ -n "${SPILLWAY_CUBLAS:-}" ]; then
  row cublas passed 0 "SPILLWAY_CUBLAS=$SPILLWAY_CUBLAS (given)"
elif d=$(find_cublas); then
  export SPILLWAY_CUBLAS=$d
  say "cuBLAS: $d: $(ls "$d" | grep -i cublas | tr '\n' ' ')"
  row cublas passed 0 "the wheel's $d"
elif [ "$HAVE_GPU" -eq 1 ]; then
  say "gpu-check: no nvidia-cublas wheel in python3's environments: test_cuda will fail"
  row cublas FAILED 0 "no nvidia-cublas wheel found"
  FAILED=1
else
  say "gpu-check: no cuBLAS here (not needed: no GPU)"
  row cublas skipped 0 "no nvidia-cublas wheel (not needed without a GPU)"
fi

# ---- configure, build ----
CUDA_OPT=(-DSPILLWAY_CUDA=ON)
[ -n "$NVCC" ] && CUDA_OPT+=(-DCMAKE_CUDA_COMPILER="$NVCC")
stage configure 90 cmake -S . -B "$BUILD" "${GEN[@]}" -DCMAKE_BUILD_TYPE=Release \
  -DSPILLWAY_ENGINE_ONLY=ON -DSPILLWAY_WERROR=OFF "${CUDA_OPT[@]}" "${PKGCONF[@]}" \
  -DSPILLWAY_SHARED_DIR="$GPU_DIR"
rc=$?
record configure $rc "engine only, CUDA on"
[ $rc -eq 0 ] || finish
stage build 200 cmake --build "$BUILD" -j"$JOBS" --target spillway test_engine test_kernels \
  test_cuda bench_cuda bench_engine
rc=$?
record build $rc "-j$JOBS"
[ $rc -eq 0 ] || finish
say "libraries of spillway (the carried ones resolve under $GPU_DIR/root):"
ldd "$BUILD/spillway" | grep -E "pcre2|xxhash|sodium|jansson|hiredis|cuda|cublas" | tee -a "$LOG"

# ---- CPU reference ----
stage cpu-tests 90 ctest --test-dir "$BUILD" --output-on-failure -R '^(test_engine|test_kernels)$'
record cpu-tests $? "test_engine, test_kernels"
stage cpu-generate 30 "$BUILD/spillway" generate -m "$GPU_DIR/models/stories260K.gguf" \
  -p "Once upon a time" -n 48 -t 0 --threads "$JOBS" --stats
record cpu-generate $? "stories260K, greedy, CPU backend"

# ---- GPU ----
# cuBLAS's folder on the loader's path too: the backend loads libcublas (and its libcublasLt) by
# path from SPILLWAY_CUBLAS, and anything else of the wheels' shared folder (nvidia/cu13/lib) it
# might want is then found as well
[ -n "${SPILLWAY_CUBLAS:-}" ] && [ -d "$SPILLWAY_CUBLAS" ] &&
  export LD_LIBRARY_PATH="$SPILLWAY_CUBLAS${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
stage test_cuda 120 "$BUILD/test_cuda"
rc=$?
sed -n '/=== test_cuda/,$p' "$LOG" >"$OUTDIR/test_cuda.log"
if [ "$HAVE_GPU" -eq 1 ]; then
  [ $rc -eq 77 ] && say "gpu-check: test_cuda skipped although nvidia-smi lists a GPU: a failure"
  record test_cuda $rc "kernels vs CPU, greedy stories260K cuda f32 == cpu, device sampling == cpu sampler, GEMM batch invariance, tier-2 round trip, fp8"
  # device sampling's own lines (tests/test_cuda.c prints them only when its checks ran)
  while IFS= read -r line; do
    row "  sampling" "$([ $rc -eq 0 ] && echo passed || echo 'see test_cuda')" 0 "${line#sampling: }"
  done < <(grep -E '^(sampling|engine): ' "$OUTDIR/test_cuda.log")
elif [ $rc -eq 77 ]; then
  row test_cuda "skipped: no GPU" "$LAST_SECS" "its checks without a device passed (refusal, cuBLAS loader)"
  say "--- test_cuda: SKIPPED (no GPU): the checks without a device passed"
else
  record test_cuda $rc "no GPU: the checks without a device"
fi
if [ "$HAVE_GPU" -eq 1 ]; then
  for set in "--cuda-dtype f32 --kv-type f32 --kv-blocks 256 --batch-tokens 64 --max-seqs 8" \
             "--cuda-dtype bf16 --kv-blocks 65536 --batch-tokens 512 --max-seqs 64"; do
    # shellcheck disable=SC2086
    stage gpu-mem 30 scripts/gpu-mem-check.sh "$BUILD/spillway" "$GPU_DIR/models/stories260K.gguf" $set
    rc=$?
    record gpu-mem $rc "$(grep '^gpu-mem: ' "$LOG" | tail -1 | cut -c10-)"
  done
else
  say "=== gpu-mem: SKIPPED (no GPU) ==="
  row gpu-mem "skipped: no GPU" 0 "plan --backend cuda vs the device's free memory"
fi
if [ "$HAVE_GPU" -eq 1 ]; then
  # cuda.dtype fp8 against bf16 on the same windows (spillway eval --kld-dtype): a random model
  # whose dims are multiples of 16 (stories260K's ffn 172 is not), the README as the text
  fp8m="$OUTDIR/fp8-eval.gguf"
  stage fp8-eval 60 bash -c '"$1" mkmodel -o "$2" --dim 1024 --layers 4 --heads 16 --kv-heads 4 \
    --ffn 2816 --vocab 32000 --ctx 1024 --dtype f16 --seed 7 &&
    "$1" eval -m "$2" -f README.md --ctx 512 --backend cuda --cuda-dtype fp8 --kld-dtype bf16' \
    fp8 "$BUILD/spillway" "$fp8m"
  rc=$?
  record fp8-eval $rc "$(grep -E '^(mean KL divergence|top-1 agreement)' "$LOG" | tail -2 | tr '\n' ';')"
  rm -f "$fp8m"
else
  say "=== fp8-eval: SKIPPED (no GPU) ==="
  row fp8-eval "skipped: no GPU" 0 "spillway eval --cuda-dtype fp8 --kld-dtype bf16"
fi
if [ "$HAVE_GPU" -eq 1 ]; then
  # the engine's own numbers (scheduler, continuous batching, device sampling): 1,000 requests of
  # 128 prompt tokens generating 128 each on the Llama-3.2-1B shape (a random BF16 file: the 8B
  # one would take minutes to write), BF16 then FP8
  m1b="$BUILD/serve-1b.gguf"
  stage engine-serve 90 bash -c 'set -o pipefail; "$1" mkmodel -o "$2" --preset llama-3.2-1b \
    --dtype bf16 && for d in bf16 fp8; do echo "### engine, cuda.dtype $d"; echo;
    "$3" "$2" --serve 1000,128,128 --backend cuda --cuda-dtype "$d" --max-seqs 256 \
      --batch-tokens 4096 || exit 1; echo; done | tee "$4"' \
    serve "$BUILD/spillway" "$m1b" "$BUILD/bench_engine" "$OUTDIR/engine_serve.md"
  rc=$?
  record engine-serve $rc "$(grep -E '^\| generated tokens/s' "$OUTDIR/engine_serve.md" 2>/dev/null |
    awk -F'|' '{printf "%s%s tok/s", (NR > 1 ? "; fp8" : "bf16"), $3}')"
  rm -f "$m1b"
else
  say "=== engine-serve: SKIPPED (no GPU) ==="
  row engine-serve "skipped: no GPU" 0 "bench_engine --serve 1000,128,128 on the 1B shape"
fi
if [ "$HAVE_GPU" -eq 1 ]; then
  stage bench_cuda 240 bash -c 'set -o pipefail; "$1" | tee "$2"' bench "$BUILD/bench_cuda" \
    "$OUTDIR/bench_cuda.md"
  record bench_cuda $? "goals reported, not enforced"
else
  say "=== bench_cuda: SKIPPED (no GPU) ==="
  row bench_cuda "skipped: no GPU" 0 ""
fi
finish
