#!/usr/bin/env bash
# Compare two builds of shoal-bench, interleaved, each against a peer in the same run: for a change
# whose effect is smaller than this machine's drift between runs minutes apart.
#
#   scripts/bench_ab.sh OLD_BENCH NEW_BENCH "OPS" "SIZES" [ROUNDS] [-- shoal-bench options]
#   e.g. (the build before a change in a worktree, built with `cmake --build B --target shoal-bench`):
#   scripts/bench_ab.sh /tmp/old/build/shoal-bench build/shoal-bench "scatter gather" "4M 16M 64M" 3 -- --transport tcp
#
# One line per (round, op, size, build): shoal's time (µs), the peer's time (µs), peer/shoal, and,
# where `perf` is installed (Debian's linux-perf), the context switches of the whole run. The times
# come from the bench's JSON row, to 6 digits (its table shows 0.01 µs, coarse for 8 B ops); a
# size the op skips shows the bench's reason, and a run that fails or has no time, `failed`.
# BENCH_RANKS (default 4) sets the ranks, BENCH_PEER (default gloo; or ompi) the peer.
# BENCH_OLD_ENV and BENCH_NEW_ENV (VAR=VALUE ...) set the environment of each side: to compare two
# settings of one build, pass the same bench twice, e.g.
#   BENCH_OLD_ENV=SHOAL_CMA=0 BENCH_NEW_ENV=SHOAL_CMA=1 scripts/bench_ab.sh build/shoal-bench build/shoal-bench gather 16M
# Odd rounds run old first, even rounds new first: the first of a pair can run on a colder machine.
set -euo pipefail
[ $# -ge 4 ] || { sed -n '2,12p' "$0"; exit 2; }
old=$1 new=$2 ops=$3 sizes=$4
shift 4
rounds=3
if [ $# -gt 0 ] && [ "$1" != "--" ]; then rounds=$1; shift; fi
[ $# -gt 0 ] && [ "$1" = "--" ] && shift
ranks=${BENCH_RANKS:-4}
peer=${BENCH_PEER:-gloo}
json=$(mktemp)
trap 'rm -f "$json"' EXIT
perf_ok=0
command -v perf >/dev/null && perf stat -e context-switches true >/dev/null 2>&1 && perf_ok=1

echo "# round op size build shoal_us ${peer}_us ${peer}/shoal context_switches (ranks $ranks)"
for ((round = 1; round <= rounds; round++)); do
  for op in $ops; do
    for size in $sizes; do
      order="old new"
      [ $((round % 2)) = 0 ] && order="new old"
      for which in $order; do
        bench=$old side_env=${BENCH_OLD_ENV:-}
        [ "$which" = new ] && bench=$new side_env=${BENCH_NEW_ENV:-}
        # shellcheck disable=SC2206  # VAR=VALUE words, split on purpose
        cmd=(env $side_env "$bench" "$op" -n "$ranks" -b "$size" -e "$size" --vs "$peer" --json "$json" "$@")
        rm -f "$json"
        if [ $perf_ok = 1 ]; then
          out=$(perf stat -x, -e context-switches -- "${cmd[@]}" 2>&1) || true
        else
          out=$("${cmd[@]}" 2>&1) || true
        fi
        row=$(python3 -c 'import json, sys
r, p = json.load(open(sys.argv[1]))["rows"][-1], sys.argv[2]
v = [r.get(k) for k in ("shoal_us", p + "_us", p + "_ratio")]
print(r.get("skipped") or ("failed" if None in v else " ".join(map(str, v))))' "$json" "$peer" 2>/dev/null || true)
        cs=$(grep -s context-switches <<<"$out" | cut -d, -f1 || true)
        echo "$round $op $size $which ${row:-failed} ${cs:--}"
      done
    done
  done
done
