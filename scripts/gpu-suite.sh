#!/usr/bin/env bash
# Builds libgmlp and runs the whole C test suite, GPU tests included, on a GPU
# host that has nvcc and meson but no GLib development packages: GLib and
# OpenBLAS come from the Debian .deb files in .debs/ (scripts/fetch-gpu-debs.sh
# downloads them). Introspection is off there (no g-ir-scanner).
#
#   scripts/gpu-suite.sh [extra meson test arguments]
#
# Writes the test log to $OUT/ when OUT is set.
set -euo pipefail
cd "$(dirname "$0")/.."

. scripts/gpu-host-env.sh

nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true

rm -rf build-gpu
meson setup build-gpu -Dcuda=enabled -Dintrospection=disabled -Dvapi=disabled \
  -Dbuildtype=release
ninja -C build-gpu
set +e
# Suite build compiles a kernel file twice: a toolchain test, no GPU one.
meson test -C build-gpu --print-errorlogs --num-processes 4 --no-suite build "$@"
status=$?
set -e
if [ -n "${OUT:-}" ]; then
  cp build-gpu/meson-logs/testlog.txt "$OUT/testlog.txt" || true
fi
exit $status
