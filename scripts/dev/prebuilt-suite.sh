#!/usr/bin/env bash
# On the GPU host, from a call that carried .prebuilt packed with every GPU
# test (scripts/dev/pack-prebuilt.sh, below): the 'gpu' suite of
# tests/meson.build, each run with the environment meson gives it, several
# at a time. About a minute on an H200, against about five for a build and
# `meson test` there. Keep the runs here in step with tests/meson.build.
#
#   here:     scripts/dev/pack-prebuilt.sh test-device test-grouped-tensor \
#               test-grouped-linear test-offload-context test-grouped-mlp \
#               test-graph test-quantizer test-grouped-linear-fp8 \
#               test-grouped-mlp-fp8 test-grouped-linear-portable \
#               test-grouped-linear-host-sm90 test-grouped-linear-fp8-forced \
#               test-robustness test-threads kernels/test-sm90-gemm \
#               kernels/test-simt-gemm
#   GPU host: scripts/dev/prebuilt-suite.sh   (logs in $OUT, or /tmp)
#
# With GMLP_SUITE_FUZZ=1 it also runs the fuzz suite (tests/fuzz, packed
# with the library's typelib) against the GPU, in 12 shards.
#
# Prints one line per run and exits non-zero if any test failed.
set -uo pipefail
cd "$(dirname "$0")/../.."
. scripts/dev/prebuilt-env.sh
export G_TEST_SRCDIR="$PWD/tests" G_DEBUG=gc-friendly,fatal-criticals MALLOC_CHECK_=2 GMLP_DEBUG=poison \
       OPENBLAS_NUM_THREADS=1 GMLP_TEST_DEVICE=cuda
tests=.prebuilt/tests
logs=${OUT:-/tmp}
status=0

# run NAME [VAR=VALUE...] TEST [ARGS...]: in the background, one line when done.
run ()
{
  local name=$1
  shift
  (
    timeout "${GMLP_SUITE_TIMEOUT:-600}" env "$@" --tap -k > "$logs/$name.log" 2>&1
    rc=$?
    echo "$name: rc $rc, $(grep -cE '^ok' "$logs/$name.log") ok, $(grep -cE '^not ok' "$logs/$name.log") not ok"
  ) &
}

for t in device grouped-tensor grouped-linear offload-context grouped-mlp graph quantizer \
         grouped-linear-fp8 grouped-mlp-fp8 robustness threads routing router moe-layer moe-layer-fp8 \
         row-chunks split-parts gate-split communicator moe-expert-parallel; do
  run "$t" "$tests/test-$t"
done
wait
# The reruns with a route or schedule forced through the device's tuning
# (GMLP_TEST_TUNING, read by the tests: libgmlp/gmlp-tuning-private.h).
run grouped-linear-portable GMLP_TEST_TUNING=device-gemm=portable "$tests/test-grouped-linear-portable" \
  -p /Gmlp/GroupedLinear/device-sizes
run grouped-linear-host-sm90 GMLP_TEST_TUNING=host-gemm=sm90 "$tests/test-grouped-linear-host-sm90"
run router-host-sm90 GMLP_TEST_TUNING=host-gemm=sm90 "$tests/test-router-host-sm90"
run grouped-linear-fp8-cublas GMLP_TEST_TUNING=host-gemm=cublas "$tests/test-grouped-linear-fp8-forced"
run grouped-linear-fp8-sm90 GMLP_TEST_TUNING=host-gemm=sm90 "$tests/test-grouped-linear-fp8-forced"
# The kernels' own tests (tests/kernels/): the Hopper kernel's schedules
# and the portable kernel, called directly.
run sm90-gemm "$tests/test-sm90-gemm"
run cuda-blas-plans "$tests/test-cuda-blas-plans"
run simt-gemm "$tests/test-simt-gemm"
run grouped-linear-fp8-portable GMLP_TEST_TUNING=device-gemm=portable "$tests/test-grouped-linear-fp8-forced" \
  -p /Gmlp/GroupedLinear/fp8/device-sizes
wait

# The fuzz suite: each case forks and opens the GPU in its own process.
if [ "${GMLP_SUITE_FUZZ:-0}" = 1 ]; then
  for k in $(seq 1 12); do
    (
      GMLP_DEVICE=cuda timeout "${GMLP_SUITE_TIMEOUT:-600}" "$tests/gmlp-fuzz" --shard "$k/12" \
        > "$logs/fuzz-$k.log" 2>&1
      echo "fuzz-$k: rc $?, $(grep -cE '^ok' "$logs/fuzz-$k.log") ok, $(grep -cE '^not ok' "$logs/fuzz-$k.log") not ok"
    ) &
  done
  wait
fi

for log in "$logs"/*.log; do
  if grep -qE '^not ok|^Bail out' "$log" || ! grep -qE '^ok' "$log"; then
    echo "failed: $log"
    grep -E '^not ok|^Bail out' "$log" | head -5
    status=1
  fi
done
exit $status
