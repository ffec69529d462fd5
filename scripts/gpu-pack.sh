#!/usr/bin/env bash
# scripts/gpu-pack.sh: fills .gpu/, the folder that travels with a device run of
# scripts/gpu-check.sh (the run tool's carry: [".gpu"]; .gitignore ignores it). Run it here, on a
# Debian machine with the build's packages installed and a network to the Debian mirror:
#   .gpu/debs/    the .deb files of the libraries the engine-only build needs and the device
#                 machine lacks (PCRE2, xxHash, libsodium, Jansson, hiredis: runtime and -dev
#                 packages) and pkgconf to read their .pc files, at the versions installed here.
#                 gpu-check.sh unpacks them into .gpu/root (dpkg -x, never into /).
#   .gpu/models/  the test models the checks read (stories260K.gguf and its licence), copied
#                 from SPILLWAY_SHARED_DIR/models (default ../shared/models).
# Then prints the size of .gpu and the device run to make. Idempotent.
set -euo pipefail
cd "$(dirname "$0")/.."
SHARED=${SPILLWAY_SHARED_DIR:-$PWD/../shared}
DIR=.gpu
PKGS=(libpcre2-8-0 libpcre2-dev libxxhash0 libxxhash-dev libsodium23 libsodium-dev
      libjansson4 libjansson-dev libhiredis0.14 libhiredis-dev pkgconf-bin libpkgconf3)
MODELS=(stories260K.gguf LICENSE-llama2.c.txt)

mkdir -p "$DIR/debs" "$DIR/models"
want=()
for p in "${PKGS[@]}"; do
  v=$(dpkg-query -W -f='${Version}' "$p" 2>/dev/null) || {
    echo "gpu-pack: $p is not installed here (scripts/install-deps.sh installs the build's packages)" >&2
    exit 1
  }
  # the file apt-get download writes: epochs are %3a-escaped
  f="$DIR/debs/${p}_${v//:/%3a}_amd64.deb"
  [ -s "$f" ] || want+=("$p=$v")
done
if [ "${#want[@]}" -gt 0 ]; then
  echo "gpu-pack: downloading ${want[*]}"
  (cd "$DIR/debs" && apt-get download -q "${want[@]}")
fi
for m in "${MODELS[@]}"; do
  if [ ! -f "$SHARED/models/$m" ]; then
    echo "gpu-pack: $SHARED/models/$m is missing (set SPILLWAY_SHARED_DIR)" >&2
    exit 1
  fi
  cp -u "$SHARED/models/$m" "$DIR/models/"
done
echo "gpu-pack: $DIR holds $(du -sh "$DIR" | cut -f1) ($(ls "$DIR/debs" | wc -l) packages, $(ls "$DIR/models" | wc -l) model files)"
cat <<'EOF'
Device run (the run tool; about 6 minutes at most):
  run(command: "bash scripts/gpu-check.sh", carry: [".gpu"], timeout_s: 420)
Its table and logs come back from $OUT (gpu-check.md first).
EOF
