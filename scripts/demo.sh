#!/usr/bin/env bash
# The main job on an embedded default: installs what it needs, builds, and generates text with
# the bundled test model (stories260K from ../shared/models, or SPILLWAY_MODELS), run as one
# continuous batch of prompts that share a prefix. Without that model it makes a small
# synthetic one (random weights: the text is noise, the machinery is real).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j"$(nproc)" --target spillway
MODELS=${SPILLWAY_MODELS:-$PWD/../shared/models}
MODEL=$MODELS/stories260K.gguf
if [ ! -f "$MODEL" ]; then
  MODEL=build/demo-tiny.gguf
  [ -f "$MODEL" ] || build/spillway mkmodel -o "$MODEL" --preset tiny
fi
echo "== one prompt, greedy =="
build/spillway generate -m "$MODEL" -t 0 -n 60 -p "Once upon a time"
echo "== a batch of prompts sharing a prefix (JSONL in, JSONL out) =="
cat > build/demo-prompts.jsonl <<'JSONL'
{"id": "a", "prompt": "Once upon a time, there was a little girl named Lily. She", "max_tokens": 40, "temperature": 0}
{"id": "b", "prompt": "Once upon a time, there was a little girl named Lily. Her", "max_tokens": 40, "temperature": 0.8, "seed": 7}
{"id": "c", "prompt": "Once upon a time, there was a little girl named Lily. One day", "max_tokens": 40, "temperature": 0.8, "seed": 8, "stop": ["."]}
{"id": "d", "prompt": "Tom and his dog", "max_tokens": 40, "temperature": 0}
JSONL
build/spillway generate -m "$MODEL" -f build/demo-prompts.jsonl --stats
