#!/usr/bin/env bash
# The main job on an embedded default: installs what it needs, builds, and runs `spillway demo`:
# a worker consuming prompts from librdkafka's in-process mock Kafka cluster (no servers needed),
# generating with the bundled test model (models/stories260K.gguf, committed for this; or the one
# in $SPILLWAY_MODELS when set), and printing the results and a summary. Extra arguments go to `spillway demo` (e.g. -n 200 --max-tokens 32).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j"$(nproc)" --target spillway
export SPILLWAY_MODELS=${SPILLWAY_MODELS:-$PWD/models}
exec build/spillway demo "$@"
