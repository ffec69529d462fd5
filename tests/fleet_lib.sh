# shellcheck shell=bash
# Helpers of the tests on the multi-host test bed (scripts/fleet-bed.sh): tests/test_fleet_bed.sh,
# tests/test_fleet_peer_faults.sh (and test_fleet_forward_faults.sh through it). Sourced, not a
# test itself; brings tests/broker_lib.sh.
#
#   fleet_init NAME SPILLWAY MODELS  skips (77) when not root, when ip netns does not work, or
#                                    without bridge or curl (fails without jq); then bt_init NAME
#                                    with a Redis; sets FB (scripts/fleet-bed.sh) and BED (the
#                                    bed's folder, $WORK/bed). The bed is taken down at exit
#                                    whatever happened, its folder kept when the test failed.
#   fail MESSAGE                     the message, the bed's status and the last warnings of every
#                                    host's logs; marks the run failed; exit 1.

# shellcheck source=tests/broker_lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/broker_lib.sh"

fleet_init() {
  [ "$(id -u)" = 0 ] || { echo "SKIP: needs root (ip netns)"; exit 77; }
  command -v ip >/dev/null 2>&1 && ip netns list >/dev/null 2>&1 || { echo "SKIP: no ip netns"; exit 77; }
  command -v bridge >/dev/null 2>&1 || { echo "SKIP: no bridge command (iproute2)"; exit 77; }
  command -v curl >/dev/null 2>&1 || { echo "SKIP: no curl"; exit 77; }
  command -v jq >/dev/null 2>&1 || { echo "FAIL: jq not found"; exit 1; }
  bt_init "$1" "$2" "$3" redis
  FB=$ROOT/scripts/fleet-bed.sh
  BED=$WORK/bed
}

# At exit (bt_cleanup): the bed down, its folder kept when the test failed.
bt_at_exit() {
  if [ -e "$WORK/.failed" ]; then "$FB" down "$BED" --keep; else "$FB" down "$BED"; fi
}

fail() {
  echo "FAIL: $*"
  touch "$WORK/.failed"
  "$FB" status "$BED" 2>&1 || true
  local f
  for f in "$BED"/hosts/*/*.log; do
    [ -f "$f" ] && { echo "--- $f (warnings, end)"; grep -E ' (WARN|ERROR) ' "$f" | tail -n 15; }
  done
  exit 1
}
