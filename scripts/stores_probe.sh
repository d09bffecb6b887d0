#!/usr/bin/env bash
# Cached against non-temporal copy-in to the shared scratch (SHOAL_DIRECT_STORES), op by op, each
# through the scratch (the single-copy ways forced off), with the cache-line round trip between
# two cores measured before each pair of runs (on some VMs it switches between about 120 and
# 500 ns for minutes at a time: BENCHMARKS.md, "Near and far cores").
#
#   scripts/stores_probe.sh [BENCH] [SECONDS]     e.g. scripts/stores_probe.sh build/shoal-bench 420
#
# One line per run: "OP n=RANKS rtt=NS STORES: BYTES US;BYTES US;..." (µs: shoal-bench's time).
# STORES_OPS (default below) lists "OP:RANKS:MIN:MAX" entries; STORES_KINDS the settings run back to
# back (default "cached streaming"; e.g. "cached auto streaming"). Runs until SECONDS have passed
# (default: one pass).
set -euo pipefail
bench=${1:-build/shoal-bench}
secs=${2:-0}
ops=${STORES_OPS:-"broadcast:2:64K:4M broadcast:4:64K:4M allgather:2:64K:4M allgather:4:64K:4M alltoall:4:256K:4M alltoall:8:256K:4M scatter:2:64K:4M gather:2:64K:4M"}
export SHOAL_DIRECT_BROADCAST=scratch SHOAL_DIRECT_ALLGATHER=scratch SHOAL_DIRECT_SCATTER=scratch \
  SHOAL_DIRECT_GATHER=scratch SHOAL_DIRECT_ALLTOALL=scratch
end=$((SECONDS + secs))
while :; do
  for entry in $ops; do
    IFS=: read -r op n lo hi <<<"$entry"
    rtt=$("$bench" barrier -n 2 -b 0 -e 0 --floors 2>&1 | sed -n 's/.*round trip between two cores = \([0-9]*\).*/\1/p')
    [ -n "$rtt" ] || { echo "no round trip measured: the lines get rtt=0 (near)" >&2; rtt=0; }
    for stores in ${STORES_KINDS:-cached streaming}; do
      printf '%s n=%s rtt=%s %s: ' "$op" "$n" "$rtt" "$stores"
      SHOAL_DIRECT_STORES=$stores "$bench" "$op" -n "$n" -b "$lo" -e "$hi" -f 4 | awk '!/^#/ {printf "%s %s;", $1, $5}'
      echo
    done
  done
  [ $SECONDS -lt $end ] || break
done
