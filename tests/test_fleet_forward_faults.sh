#!/usr/bin/env bash
# tests/test_fleet_forward_faults.sh SPILLWAY MODELS: tests/test_fleet_peer_faults.sh (on the
# test bed, through tests/broker_lib.sh) with forwarding between workers on as well: hosts cut
# off and workers killed during fetches and forwards, every request answered exactly once (its
# header says what changes with FLEET_FORWARD=1). Skips (77) as it does.
FLEET_FORWARD=1 exec "$(dirname "${BASH_SOURCE[0]}")/test_fleet_peer_faults.sh" "$@"
