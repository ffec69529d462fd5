#!/usr/bin/env bash
# Lean CI version of bench/load_burst.sh (one worker, real Kafka broker, stories260K): measures
# the worker's throughput on a backlog of 600 prompts, then produces half of it for 4 s, 10x that
# for 2 s, and half again until the lag is back to its steady level, then nothing. Checks only
# qualitative invariants, never speed: the consumer lag (spillway:consumer_lag) rose during the
# burst and drained back to 0, the worker had one assignment (no rebalance), no DLQ record,
# every id served exactly once, and the worker's max VmRSS stays within 3x its RSS at the
# burst's start + 64 MiB (the lazily touched KV pool; + 256 MiB under AddressSanitizer, its
# quarantine). The benchmark itself (30 s burst, drain rate vs max, RSS and fd figures) appends
# to bench/RESULTS.md; see its header. ~35 s in Release, ~45 s with ASan+UBSan.
# Arguments (from ctest): the spillway binary and the models folder.
set -euo pipefail
exec "$(dirname "$0")/../bench/load_burst.sh" --ci "$@"
