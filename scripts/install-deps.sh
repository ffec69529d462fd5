#!/usr/bin/env bash
# Installs the Debian/Ubuntu packages spillway builds and tests with. Idempotent.
# Uses sudo when not run as root.
set -euo pipefail
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
PKGS=(
  build-essential cmake pkg-config  # build-essential: gcc, and g++ for test_cuemu
  libopenblas-dev
  libpcre2-dev
  libjansson-dev
  libxxhash-dev
  libhiredis-dev
  libsodium-dev
  libmicrohttpd-dev
  librdkafka-dev
  python3 python3-numpy
  clang
  default-jdk-headless maven kcat redis-server  # the JDK: javac for tests/kafka/KafkaQuery.java
  python3-jsonschema python3-yaml python3-jinja2
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
# libFuzzer's runtime: Debian 12 ships it in libclang-rt-<major>-dev, which clang only recommends
# (Ubuntu's clang carries it in libclang-common-<major>-dev, a dependency).
CLANG_MAJOR=$(clang --version 2>/dev/null | sed -n 's/.*clang version \([0-9]*\).*/\1/p' | head -n1)
if [ -n "$CLANG_MAJOR" ] && ! dpkg-query -W -f='${Status}' "libclang-rt-$CLANG_MAJOR-dev" 2>/dev/null | grep -q "install ok installed" &&
  apt-cache show "libclang-rt-$CLANG_MAJOR-dev" >/dev/null 2>&1; then
  echo "installing: libclang-rt-$CLANG_MAJOR-dev"
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "libclang-rt-$CLANG_MAJOR-dev"
fi
