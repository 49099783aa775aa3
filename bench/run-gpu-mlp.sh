#!/usr/bin/env bash
# On the GPU host, after scripts/gpu-suite.sh built build-gpu/: the GroupedMLP
# step against the same step in PyTorch, in one run. Logs go to $OUT (or /tmp).
set -uo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-/tmp}"
export LD_LIBRARY_PATH="/usr/lib/x86_64-linux-gnu/openblas-pthread${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export GMLP_BACKEND_DIR="$PWD/build-gpu/libgmlp/backend/cuda"

build-gpu/bench/gmlp-bench --mlp "$@" | tee "$out/gmlp-mlp.jsonl"
PYTHONUNBUFFERED=1 python3 bench/mlp_anchor.py | tee "$out/torch-mlp.jsonl"
python3 bench/compare_mlp.py "$out/gmlp-mlp.jsonl" "$out/torch-mlp.jsonl" | tee "$out/compare-mlp.md"
python3 bench/plot.py -o "$out/charts" "$out/gmlp-mlp.jsonl" "$out/torch-mlp.jsonl" ||
  echo "run-gpu-mlp.sh: no charts (bench/plot.py failed)"
