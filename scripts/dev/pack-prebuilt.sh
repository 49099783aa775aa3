#!/usr/bin/env bash
# Here, on the machine without a GPU: packs what the local build (build/,
# CUDA enabled) needs at run time into .prebuilt/, with the run-time
# Debian packages from .debs/ (scripts/fetch-gpu-debs.sh), for a GPU-host
# call that carries .prebuilt instead of building there. A build on the
# GPU host takes about five minutes of device time; this takes seconds.
# The kernels are the same sm_90a code; the host code is the local
# build's (debugoptimized), so host µs/call can differ a little from a
# release build's.
#
#   scripts/dev/pack-prebuilt.sh [TEST...]   # TEST: names in build/tests/ (kernels/NAME too)
#
# On the GPU host: . scripts/dev/prebuilt-env.sh, then .prebuilt/bench/gmlp-bench
# (or .prebuilt/tests/TEST with the GMLP_TEST_* variables of tests/meson.build).
# Other builds of the backend to time beside this one: scripts/dev/pack-alt.sh.
set -euo pipefail
cd "$(dirname "$0")/../.."
backend=build/libgmlp/backend/cuda/libgmlp-backend-cuda.so
ninja -C build > /dev/null
if [ ! -f "$backend" ]; then
  echo "pack-prebuilt: $backend is missing: build/ was set up without CUDA" >&2
  exit 1
fi
git check-ignore -q .prebuilt || echo /.prebuilt/ >> .git/info/exclude
rm -rf .prebuilt
mkdir -p .prebuilt/libgmlp/backend/cuda .prebuilt/bench .prebuilt/debs
cp -L build/libgmlp/libgmlp-1.0.so.0 .prebuilt/libgmlp/
cp "$backend" .prebuilt/libgmlp/backend/cuda/
cp build/bench/gmlp-bench .prebuilt/bench/
[ ! -f build/bench/gmlp-versus-loop ] || cp build/bench/gmlp-versus-loop .prebuilt/bench/
[ ! -f build/bench/gmlp-host-step ] || cp build/bench/gmlp-host-step .prebuilt/bench/
# The demo (its plot needs matplotlib, which the GPU host may lack).
[ ! -f build/examples/gmlp-demo ] || { mkdir -p .prebuilt/examples && cp build/examples/gmlp-demo .prebuilt/examples/; }
for t in "$@"; do
  mkdir -p .prebuilt/tests
  cp "build/tests/$t" .prebuilt/tests/
done
# The fuzz suite calls the library through its typelib.
if [ -f build/tests/fuzz/gmlp-fuzz ]; then
  mkdir -p .prebuilt/tests .prebuilt/girepository
  cp build/tests/fuzz/gmlp-fuzz .prebuilt/tests/
  cp build/libgmlp/Gmlp-1.0.typelib .prebuilt/girepository/
fi
# Debug information stays here: it would take most of the 64 MiB a call carries.
find .prebuilt -type f ! -name '*.deb' ! -name '*.typelib' -exec strip -g {} +
for p in libglib2.0-0 libffi8 libpcre2-8-0 libopenblas0 libopenblas0-pthread libgfortran5 zstd \
         libgirepository-1.0-1 gir1.2-glib-2.0 libjson-glib-1.0-0; do
  cp .debs/${p}_*.deb .prebuilt/debs/
done
# The backend is most of a call's 64 MiB: compressed here, unpacked there
# by prebuilt-env.sh.
xz -T0 .prebuilt/libgmlp/backend/cuda/libgmlp-backend-cuda.so
du -sh .prebuilt
