#!/usr/bin/env bash
# On the GPU host, after scripts/gpu-suite.sh built build-gpu/: times the
# anchors of ../shared/bench (copied into .bench/) and gmlp-bench in one run
# and prints the comparison table. Logs go to $OUT (or /tmp).
set -uo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-/tmp}"
export LD_LIBRARY_PATH="/usr/lib/x86_64-linux-gnu/openblas-pthread${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export GMLP_BACKEND_DIR="$PWD/build-gpu/libgmlp/backend/cuda"
export PATH="/usr/local/cuda/bin:$PATH"

nvcc -O2 -gencode=arch=compute_90a,code=sm_90a -o /tmp/cublas_anchor .bench/cublas_anchor.cu -lcublas
# The anchor's cuBLAS loop timed as gmlp-bench times (400 ms back to back,
# median of 100): the like-for-like reference for the host-sizes fprop.
nvcc -O2 -std=c++17 -Ikernels -gencode=arch=compute_90a,code=sm_90a -o /tmp/cublas_loop_steady bench/cublas_loop_steady.cu -lcublas
build-gpu/bench/gmlp-bench "$@" | tee "$out/gmlp-bench.jsonl"
build-gpu/bench/gmlp-bench --device-sizes "$@" | tee -a "$out/gmlp-bench.jsonl"
# Host sizes on cuBLAS alone, for the routing rule of gmlp-cuda-gemm-device.c.
build-gpu/bench/gmlp-bench --tuning=host-gemm=cublas "$@" | tee "$out/gmlp-bench-cublas.jsonl"
# FP8: the products alone (operands quantized beforehand), on the default
# route and on cuBLASLt alone; and with quantization in every call.
for recipe in current delayed; do
  build-gpu/bench/gmlp-bench --fp8=$recipe --quantized "$@" | tee -a "$out/gmlp-bench.jsonl"
  build-gpu/bench/gmlp-bench --tuning=host-gemm=cublas --fp8=$recipe --quantized "$@" |
    tee -a "$out/gmlp-bench-cublas.jsonl"
done
build-gpu/bench/gmlp-bench --fp8=current --quantized --device-sizes "$@" | tee -a "$out/gmlp-bench.jsonl"
build-gpu/bench/gmlp-bench --fp8=current "$@" | tee -a "$out/gmlp-bench.jsonl"
# libgmlp timed the way anchors.py times torch (triton's do_bench), for the
# like-for-like table; bench/torch_steady.py times torch both ways on
# gmlp-bench's problems.
build-gpu/bench/gmlp-bench --device-sizes --method=do-bench "$@" | tee -a "$out/gmlp-bench.jsonl"
for sizes in "" --device-sizes; do
  build-gpu/bench/gmlp-bench --fp8=current --quantized $sizes --method=do-bench "$@" | tee -a "$out/gmlp-bench.jsonl"
done
# The grouped quantize kernel alone, every recipe.
for recipe in delayed current blockwise mxfp8; do
  build-gpu/bench/gmlp-bench --quantize --fp8=$recipe "$@" | tee -a "$out/gmlp-bench.jsonl"
done
build-gpu/bench/gmlp-bench --quantize --fp8=current --device-sizes "$@" | tee -a "$out/gmlp-bench.jsonl"
/tmp/cublas_anchor | tee "$out/cublas-anchor.jsonl"
/tmp/cublas_loop_steady | tee "$out/cublas-loop-steady.jsonl"
PYTHONUNBUFFERED=1 python3 .bench/anchors.py "$out/anchors.json" | tee "$out/anchors.jsonl"
PYTHONUNBUFFERED=1 python3 bench/torch_steady.py | tee "$out/torch-steady.jsonl"
python3 bench/compare.py "$out/gmlp-bench.jsonl" "$out/anchors.jsonl" "$out/cublas-anchor.jsonl" \
  "$out/cublas-loop-steady.jsonl" "$out/torch-steady.jsonl" | tee "$out/compare.md"
python3 bench/compare.py "$out/gmlp-bench-cublas.jsonl" "$out/anchors.jsonl" "$out/cublas-anchor.jsonl" \
  "$out/cublas-loop-steady.jsonl" > "$out/compare-cublas.md"
# The charts of docs/performance.md (matplotlib; skipped where it is missing).
python3 bench/plot.py -o "$out/charts" "$out/gmlp-bench.jsonl" "$out/anchors.jsonl" "$out/cublas-anchor.jsonl" \
  "$out/cublas-loop-steady.jsonl" "$out/torch-steady.jsonl" || echo "run-gpu.sh: no charts (bench/plot.py failed)"
