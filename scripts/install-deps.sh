#!/usr/bin/env bash
# Installs the Debian/Ubuntu packages spillway builds and tests with. Idempotent.
# Uses sudo when not run as root.
set -euo pipefail
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
PKGS=(
  build-essential cmake pkg-config
  libopenblas-dev
  libpcre2-dev
  libjansson-dev
  libxxhash-dev
  libhiredis-dev
  libmicrohttpd-dev
  librdkafka-dev
  python3 python3-numpy
  clang
  default-jre-headless maven kcat redis-server
  python3-jsonschema python3-yaml
)
missing=()
for p in "${PKGS[@]}"; do
  case "$p" in \#*) continue ;; esac
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ "${#missing[@]}" -gt 0 ]; then
  echo "installing: ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
