#!/usr/bin/env bash
# `spillway eval` (perplexity) and the quantised weight types end to end.
#
# 1. stories260K.gguf (a trained model) on a ~340-word TinyStories-like text written below:
#    a finite perplexity far below the 512-token vocabulary (a uniform guess scores 512; observed
#    3.46), tokens scored = tokens - windows (side-by-side windows) or tokens - 1 (--stride), and
#    the same numbers, to the printed digit, with 2 threads and with forward chunks of 100
#    tokens (the kernels are batch invariant).
# 2. stories260K re-rounded by `spillway mkmodel --from`: to F32 with its dimensions zero-padded
#    to 256 (an equivalent model: the perplexity must be identical), and to Q8_0, Q4_0 and Q4_K
#    (padded, so that its matrices fit Q4_K's super-blocks of 256; attn_output, whose rows are
#    n_heads * head_dim = 64, falls back to Q4_0), the 4-bit ones with the default importance-
#    weighted quantiser and Q4_K also with ggml's (--quantiser ggml). Measured (2026-12-01, this
#    text; Q8_0 and Q4_0 with int8 activations): F32 3.4558, Q8_0 3.4516 (-0.12%) unpadded /
#    3.4592 padded (+0.10%), Q4_0 3.7157 (+7.5%, ffn_down kept F32 as its rows of 172 fit no
#    block) / 3.7583 padded (+8.8%), Q4_K padded 3.5903 (+3.9%; ggml's quantiser 3.8100, +10.2%).
#    Bounds: Q8_0 within 1% of F32 and Q4_K (importance) within 5% (the issue's goals; observed
#    0.12% and 3.9%), Q4_K (importance) below Q4_K (ggml); every 4-bit one within 0.15 nats of
#    mean NLL (+16% perplexity; observed at most 0.10) and strictly worse than F32 (noise on
#    trained weights costs likelihood; observed +4..11%).
# 3. A synthetic model (random weights, dim 256 so that Q4_K applies, 2 layers, ffn 512) in F16,
#    Q8_0, Q4_0 and Q4_K. Random weights give a near-uniform next-token distribution (perplexity
#    ~800 for 512 tokens), so quantisation moves the mean NLL by a random amount of either sign,
#    roughly in proportion to the weights' relative rms error (Q8_0 0.5%, Q4_0 8%, Q4_K 7%,
#    tests/test_mkmodel.c): over seeds 1..6, |delta mean NLL| vs F16 was at most 0.0020 nats
#    (Q8_0), 0.032 (Q4_0) and 0.044 (Q4_K) -- ~0.5 nats per unit of relative weight error.
#    Bounds: 0.01 nats for Q8_0 and 0.1 nats for the 4-bit types (2-5x the worst seen).
# Arguments (from ctest): the spillway binary and the models folder.
set -euo pipefail
SPILLWAY=$(realpath "$1")
MODELS=${2:-}
STORIES="$MODELS/stories260K.gguf"
[ -f "$STORIES" ] || { echo "SKIP: $STORIES not found"; exit 77; }
command -v awk >/dev/null 2>&1 || { echo "SKIP: awk not installed"; exit 77; }

WORK=$(mktemp -d "${TMPDIR:-/tmp}/spillway-eval.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
fail() { echo "FAIL: $*"; for f in "$WORK"/*.out "$WORK"/err; do [ -f "$f" ] && { echo "--- $f"; cat "$f"; }; done; exit 1; }

cat > "$WORK/story.txt" <<'EOF'
Once upon a time, there was a little girl named Lily. She lived in a small house with her mom and dad. Lily loved to play outside in the sun. One day, she saw a big red ball in the park. She ran to the ball and picked it up. It was soft and round.

Lily wanted to play with her friend Tom. She went to his house and knocked on the door. Tom opened the door and smiled. "Hi Lily! Do you want to play?" he said. Lily nodded and showed him the ball. They ran to the park together.

They kicked the ball high in the sky. The ball went up and up, and then it came down in a tree. Lily was sad. "Oh no! Our ball is in the tree," she said. Tom looked at the tree. It was very big and tall. He did not know what to do.

Then a kind bird flew down from the sky. The bird saw the ball and pushed it with its wing. The ball fell down to the ground. Lily and Tom were very happy. They said, "Thank you, bird!" The bird sang a little song and flew away.

After that, Lily and Tom played with the ball all day. They laughed and ran in the warm sun. When it was time to go home, Lily gave Tom a big hug. "You are my best friend," she said. Tom smiled and said, "You are my best friend too."

That night, Lily told her mom about the ball, the tree and the kind bird. Her mom listened and smiled. "It is good to help others, just like the bird helped you," she said. Lily went to bed with a happy heart. She dreamed of the big red ball and the blue sky.

The next morning, Lily woke up early. She looked out of the window and saw the bird on a branch. She waved at the bird, and the bird sang again. Lily knew it would be a good day.
EOF

# eval NAME MODEL [options]: runs spillway eval into $WORK/NAME.out
run_eval() {
  local name=$1 model=$2; shift 2
  "$SPILLWAY" eval -m "$model" -f "$WORK/story.txt" --threads 1 "$@" > "$WORK/$name.out" 2> "$WORK/err" ||
    fail "spillway eval -m $model $* exited $?"
}
field() { awk -v k="$2" 'index($0, k ": ") == 1 { print substr($0, length(k) + 3) }' "$WORK/$1.out"; }
ppl() { field "$1" perplexity; }
nll() { field "$1" "mean NLL"; }
# check "description" awk-condition a b: the condition on (a, b) must hold
check() { awk -v a="$3" -v b="$4" "BEGIN { exit !($2) }" || fail "$1 (a=$3 b=$4)"; }

# ---- 1. stories260K ----
run_eval base "$STORIES"
P=$(ppl base); N=$(field base "tokens scored")
echo "stories260K: perplexity $P over $N tokens"
check "perplexity finite, >= 1 and far below the vocabulary (512)" "a >= 1 && a < 51.2" "$P" 0
NTOK=$(sed -n 's/.*: \([0-9]*\) tokens (BOS first).*/\1/p' "$WORK/base.out")
WIN=$(sed -n 's/.*, \([0-9]*\) windows$/\1/p' "$WORK/base.out")
[ -n "$NTOK" ] && [ -n "$WIN" ] || fail "no token/window counts in the output"
check "tokens scored = tokens - windows" "a == b" "$N" "$((NTOK - WIN))"
# --kld-dtype: a second engine over the same windows; on the CPU backend the dtype changes no
# arithmetic, so the comparison must find nothing (the CUDA fp8-vs-bf16 use is gpu-check's)
run_eval kld "$STORIES" --kld-dtype bf16
check "--kld-dtype: the same perplexity" "a == b" "$(ppl kld)" "$P"
check "--kld-dtype on the cpu: base perplexity equal" "a == b" "$(field kld "base (cuda.dtype bf16) perplexity")" "$P"
check "--kld-dtype on the cpu: KL divergence 0" "a == 0" "$(field kld "mean KL divergence from the base")" 0
grep -q "^top-1 agreement with the base: 100.0000% ($N of $N)" "$WORK/kld.out" || fail "--kld-dtype: top-1 agreement not 100%"

check "the text is more than one window" "a >= 2" "$WIN" 0
run_eval t2 "$STORIES" --threads 2
[ "$(ppl t2)" = "$P" ] && [ "$(nll t2)" = "$(nll base)" ] || fail "2 threads changed the result"
run_eval chunk "$STORIES" --batch-tokens 100
[ "$(ppl chunk)" = "$P" ] || fail "forward chunks of 100 tokens changed the perplexity"
run_eval stride "$STORIES" --ctx 128 --stride 64
PS=$(ppl stride)
check "strided: every token after the first scored" "a == b" "$(field stride "tokens scored")" "$((NTOK - 1))"
check "strided perplexity finite and sane" "a >= 1 && a < 51.2" "$PS" 0
echo "stories260K --ctx 128 --stride 64: perplexity $PS"

# errors: missing text, bad stride, too-long context
if "$SPILLWAY" eval -m "$STORIES" -f "$WORK/none.txt" > /dev/null 2>&1; then fail "missing text accepted"; fi
if "$SPILLWAY" eval -m "$STORIES" -f "$WORK/story.txt" --ctx 64 --stride 65 > /dev/null 2>&1; then fail "stride > ctx accepted"; fi
if "$SPILLWAY" eval -m "$STORIES" -f "$WORK/story.txt" --ctx 4096 > /dev/null 2>&1; then fail "ctx beyond the model's accepted"; fi
: > "$WORK/empty.txt" # BOS alone: nothing to score
if "$SPILLWAY" eval -m "$STORIES" -f "$WORK/empty.txt" > /dev/null 2>&1; then fail "empty text accepted"; fi
printf 'x' > "$WORK/short.txt" # a few tokens, one window: all but BOS scored
"$SPILLWAY" eval -m "$STORIES" -f "$WORK/short.txt" > "$WORK/short.out" 2>&1 || fail "a short text failed"
SN=$(sed -n 's/.*: \([0-9]*\) tokens (BOS first).*/\1/p' "$WORK/short.out")
check "a short text: all tokens after BOS scored" "a == b - 1 && b >= 2" "$(field short "tokens scored")" "$SN"

# ---- 2. stories260K re-rounded ----
convert() { # name dtype [--pad N]
  local name=$1 dt=$2; shift 2
  "$SPILLWAY" mkmodel --from "$STORIES" --dtype "$dt" "$@" -o "$WORK/$name.gguf" 2> "$WORK/err" ||
    fail "mkmodel --from --dtype $dt $* failed"
}
convert pf32 f32 --pad 256
run_eval pf32 "$WORK/pf32.gguf"
[ "$(ppl pf32)" = "$P" ] || fail "padded F32 model: perplexity $(ppl pf32), original $P (must be identical)"
convert q8 q8_0
grep -q "blk.0.ffn_down.weight: rows of 172 elements do not fit q8_0" "$WORK/err" || fail "no fallback report"
convert pq8 q8_0 --pad 256
convert q40 q4_0
convert pq40 q4_0 --pad 256
convert pq4k q4_k --pad 256
grep -q "blk.0.attn_output.weight: rows of 64 elements do not fit q4_K blocks of 256: written as q4_0" "$WORK/err" ||
  fail "attn_output not reported as falling back to q4_0"
grep -q "quantiser importance (36 matrices with estimated input lanes)" "$WORK/err" ||
  fail "the default quantiser is not the importance-weighted one for every matrix but token_embd"
convert pq4kg q4_k --pad 256 --quantiser ggml
"$SPILLWAY" inspect "$WORK/pq4k.gguf" > "$WORK/inspect.out" 2>&1 || fail "inspect of the q4_K model"
grep -q "blk.0.ffn_down.weight *q4_K *{256, 256}" "$WORK/inspect.out" || fail "padded ffn_down not q4_K {256, 256}"
for m in q8 pq8 q40 pq40 pq4k pq4kg; do
  run_eval "$m" "$WORK/$m.gguf"
  echo "stories260K $m: perplexity $(ppl $m) (f32 $P)"
done
for m in q8 pq8; do
  check "$m within 1% of the F32 perplexity" "a / b < 1.01 && b / a < 1.01" "$(ppl $m)" "$P"
done
for m in q40 pq40 pq4k pq4kg; do
  check "$m within 0.15 nats of F32" "a - b < 0.15 && b - a < 0.15" "$(nll $m)" "$(nll base)"
  check "$m worse than F32" "a > b" "$(nll $m)" "$(nll base)"
done
check "Q4_K (importance quantiser) within 5% of the F32 perplexity" "a / b < 1.05" "$(ppl pq4k)" "$P"
check "Q4_K: the importance quantiser beats ggml's" "a < b" "$(ppl pq4k)" "$(ppl pq4kg)"

# ---- 3. synthetic model, random weights ----
for dt in f16 q8_0 q4_0 q4_k; do
  "$SPILLWAY" mkmodel -o "$WORK/syn-$dt.gguf" --dim 256 --layers 2 --heads 4 --kv-heads 2 --ffn 512 \
    --vocab 512 --ctx 512 --dtype "$dt" --seed 3 2> "$WORK/err" || fail "mkmodel --dtype $dt"
  run_eval "syn-$dt" "$WORK/syn-$dt.gguf"
  echo "synthetic $dt: perplexity $(ppl syn-$dt), mean NLL $(nll syn-$dt)"
done
check "synthetic F16 perplexity finite" "a > 1 && a < 1e6" "$(ppl syn-f16)" 0
check "synthetic Q8_0 within 0.01 nats of F16" "a - b < 0.01 && b - a < 0.01" "$(nll syn-q8_0)" "$(nll syn-f16)"
for dt in q4_0 q4_k; do
  check "synthetic $dt within 0.1 nats of F16" "a - b < 0.1 && b - a < 0.1" "$(nll syn-$dt)" "$(nll syn-f16)"
done
echo "PASS"
