#!/usr/bin/env bash
# On the GPU host, from a call that carried .prebuilt with other builds of
# the backend (scripts/dev/pack-alt.sh): times the packed backend ("main")
# and each other build on the same cases, taking the builds in turn within
# each round, and each round from the next build, so that the GPU's clock
# and temperature are shared out fairly, and prints the table
# (scripts/dev/bench-table.py).
#
#   scripts/dev/prebuilt-compare.sh [ROUNDS] < CASES
#
# CASES: one set of gmlp-bench arguments a line, for example
#   --device-sizes -s mixtral-fc1 -r balanced --fp8=current --quantized -n 30 --rest-ms 200
# The tagged lines go to $OUT/bench.txt (or /tmp/bench.txt).
set -uo pipefail
cd "$(dirname "$0")/../.."
. scripts/dev/prebuilt-env.sh
rounds=${1:-2}
out=${OUT:-/tmp}/bench.txt
builds=(main)
for z in .prebuilt/alts/*.zst; do
  [ -f "$z" ] && builds+=("$(basename "$z" .zst)")
done
mapfile -t cases
: > "$out"
for ((round = 0; round < rounds; round++)); do
  for args in "${cases[@]}"; do
    [ -n "$args" ] || continue
    # Each round starts with the next build: none is always the first
    # after another case's warm-up.
    for ((i = 0; i < ${#builds[@]}; i++)); do
      b=${builds[(i + round) % ${#builds[@]}]}
      dir=$GMLP_BACKEND_DIR
      [ "$b" = main ] || dir=$(gmlp_alt_dir "$b")
      # A whole other build runs its own gmlp-bench on its own library.
      if [ -f "$dir/libgmlp-1.0.so.0" ]; then
        # shellcheck disable=SC2086  # a case is a list of arguments
        GMLP_BACKEND_DIR=$dir LD_LIBRARY_PATH=$dir:$LD_LIBRARY_PATH "$dir/gmlp-bench" $args 2>&1 | sed "s/^/$b /" >> "$out"
        continue
      fi
      # shellcheck disable=SC2086  # a case is a list of arguments
      GMLP_BACKEND_DIR=$dir .prebuilt/bench/gmlp-bench $args 2>&1 | sed "s/^/$b /" >> "$out"
    done
  done
done
python3 scripts/dev/bench-table.py "$out" "$(IFS=,; echo "${builds[*]}")"
