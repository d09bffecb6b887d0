#!/usr/bin/env bash
# Two settings or builds of shoal-bench, interleaved for a while, each run tagged with the cache-line
# round trip between CPUs 0 and 1 just before it (scripts/round_trip.c): on our VMs the host moves
# the two vCPUs between placements that share a cache and ones that do not for seconds to minutes
# at a time (BENCHMARKS.md, "Near and far cores"), and a change may help in one state only. Then
# scripts/ab_by_core_state.py FILE gives the medians per op, ranks, state and side.
#
#   scripts/ab_by_core_state.sh SECONDS "OP:RANKS ..." "SHOAL-BENCH SIZE OPTIONS"
#   e.g. BENCH_OLD_ENV=LD_LIBRARY_PATH=/tmp/old BENCH_NEW_ENV= \
#        scripts/ab_by_core_state.sh 420 "alltoall:2 alltoall:3 sendrecv:2" "-b 16K -e 1M -f 4" > ab.txt
#
# BENCH_OLD_ENV and BENCH_NEW_ENV (VAR=VALUE ...) set each side's environment, as in
# scripts/bench_ab.sh; BENCH (default build/shoal-bench) is the bench. One line per run: the time,
# the op, the ranks, the side, the round trip (ns) and shoal's µs at each size (four decimals, from
# --json).
# BENCH_PEER=ompi measures shoal against Open MPI instead: one run per case (`--vs ompi`, with
# BENCH_NEW_ENV), whose Open MPI times are the old side and shoal's the new, under one round trip.
# BENCH_VS=ompi runs both sides with `--vs ompi` and keeps shoal's times: each size's Open MPI phase
# then leaves shoal's memory idle between its sizes, as a program that does other work between ops
# (not with BENCH_PEER, whose runs are under --vs already).
set -euo pipefail
[ $# -eq 3 ] || { sed -n '2,20p' "$0"; exit 2; }
seconds=$1 cases=$2 sizes=$3
bench=${BENCH:-build/shoal-bench}
probe=$(mktemp) json=$(mktemp)
trap 'rm -f "$probe" "$json"' EXIT
gcc -O2 -pthread -o "$probe" "$(dirname "$0")/round_trip.c"
# The µs of field $1 (shoal_us, ompi_us, ...) at each size of the run's --json, four decimals (the
# table's two do not tell 0.241 from 0.249 µs); "skipped" for a size that backend did not run.
times_of() {
  python3 -c 'import json, sys
rows = json.load(open(sys.argv[1]))["rows"]
print(" ".join("skipped" if r.get(sys.argv[2]) is None else "%.4f" % r[sys.argv[2]] for r in rows))' "$json" "$1" 2>/dev/null || true
}
end=$(($(date +%s) + seconds))
while [ "$(date +%s)" -lt "$end" ]; do
  for c in $cases; do
    op=${c%%:*} n=${c##*:}
    if [ -n "${BENCH_PEER:-}" ]; then
      rtt=$("$probe")
      rm -f "$json"
      # shellcheck disable=SC2086  # BENCH_NEW_ENV is a list of VAR=VALUE words
      env ${BENCH_NEW_ENV:-} "$bench" "$op" -n "$n" $sizes --vs "$BENCH_PEER" --json "$json" >/dev/null 2>&1 || true
      for side in old new; do
        key=shoal_us
        [ "$side" = old ] && key=${BENCH_PEER}_us
        echo "$(date +%T) $op n=$n $side rtt=$rtt | $(times_of "$key")"
      done
      continue
    fi
    for side in old new; do
      side_env=${BENCH_OLD_ENV:-}
      [ "$side" = new ] && side_env=${BENCH_NEW_ENV:-}
      rtt=$("$probe")
      rm -f "$json"
      # shellcheck disable=SC2086  # side_env is a list of VAR=VALUE words
      env $side_env "$bench" "$op" -n "$n" $sizes ${BENCH_VS:+--vs "$BENCH_VS"} --json "$json" >/dev/null 2>&1 || true
      echo "$(date +%T) $op n=$n $side rtt=$rtt | $(times_of shoal_us)"
    done
  done
done
