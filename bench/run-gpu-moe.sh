#!/usr/bin/env bash
# On the GPU host, from a call that carried .prebuilt (scripts/gpu-sanitize.sh
# --pack, here) and .bench (cp ../shared/bench/* bench/copy_rate.py .bench/):
# the whole MoE layer step (gmlp-bench --moe) beside ep_anchor.py, the same
# layer in PyTorch, with the same arguments, on the three shapes of issue 43,
# and the device-to-device copy rate, in one run. JSON lines in $OUT (or /tmp).
#
#   bench/run-gpu-moe.sh [A B C]
set -uo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-/tmp}"
. scripts/dev/prebuilt-env.sh
# GMLP_DEBUG=poison fills every new tensor with NaN: a test's setting, not a user's.
unset GMLP_DEBUG

declare -A shapes=(
  [A]=""
  [B]="--hidden 7168 --ffn 2048 --experts 32"
  [C]="--tokens 16384 --ffn 14336 --experts 8 --topk 2"
)
python3 .bench/copy_rate.py | tee "$out/copy.json"
for s in "${@:-A B C}"; do
  for name in ${s}; do
    # shellcheck disable=SC2086
    .prebuilt/bench/gmlp-bench --moe ${shapes[$name]} | tee "$out/gmlp-moe-$name.json"
    # shellcheck disable=SC2086
    python3 .bench/ep_anchor.py ${shapes[$name]} | tee "$out/ep-anchor-$name.json"
  done
done
# One chart per shape (matplotlib; skipped where it is missing).
for s in "${@:-A B C}"; do
  for name in ${s}; do
    python3 bench/plot.py -o "$out/charts" --prefix "$name-" "$out/gmlp-moe-$name.json" "$out/ep-anchor-$name.json" ||
      echo "run-gpu-moe.sh: no chart for $name (bench/plot.py failed)"
  done
done
