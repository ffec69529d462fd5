#!/usr/bin/env bash
# Prints a new temporary folder for host arenas: under /dev/shm when it has at least
# ${SPILLWAY_SHM_MIN_MB:-1024} MiB free (containers often mount a 64 MiB /dev/shm), else under
# ${TMPDIR:-/tmp} (a disk file works the same, only slower). Usage: shm-dir.sh NAME-PREFIX
set -euo pipefail
prefix=${1:-spillway}
min_kb=$(( ${SPILLWAY_SHM_MIN_MB:-1024} * 1024 ))
avail_kb=$(df -Pk /dev/shm 2>/dev/null | awk 'NR == 2 { print $4 }')
if [ -n "$avail_kb" ] && [ "$avail_kb" -ge "$min_kb" ] && d=$(mktemp -d "/dev/shm/$prefix.XXXXXX" 2>/dev/null); then
  echo "$d"
else
  mktemp -d "${TMPDIR:-/tmp}/$prefix.XXXXXX"
fi
