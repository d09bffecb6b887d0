#!/usr/bin/env bash
# Instructions per op of shoal-bench at one rank: the fixed cost of a call (checks, queue, Work,
# dispatch), which a group of one runs without any data path. Counted by valgrind's callgrind (a
# count, unlike a time, does not move with the machine's load): the difference between two runs of
# N and 2N iterations, over N.
#
#   scripts/op_instructions.sh [BENCH] [OP] [SIZE] [-- shoal-bench options]
#   e.g. scripts/op_instructions.sh build/shoal-bench broadcast 8 -- --queued
#
# Needs valgrind (Debian: apt-get install valgrind).
set -euo pipefail
bench=${1:-build/shoal-bench} op=${2:-broadcast} size=${3:-8}
shift $(($# < 3 ? $# : 3))
if [ $# -gt 0 ] && [ "$1" = "--" ]; then shift; fi
command -v valgrind >/dev/null || { echo "needs valgrind (apt-get install valgrind)" >&2; exit 2; }
n=20000
count() {
  local iters=$1
  shift
  valgrind --tool=callgrind --callgrind-out-file=/dev/null --trace-children=yes \
    "$bench" "$op" -n 1 -b "$size" -e "$size" --iters "$iters" "$@" 2>&1 |
    awk '/Collected/ {s += $4} END {print s}'
}
a=$(count $n "$@")
b=$(count $((2 * n)) "$@")
echo "$op $size B, 1 rank: $(((b - a) / n)) instructions per op"
