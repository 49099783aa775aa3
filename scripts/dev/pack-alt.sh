#!/usr/bin/env bash
# Here, after scripts/dev/pack-prebuilt.sh: adds another build of the CUDA
# backend (a variant to time beside the packed one) to .prebuilt/alts/ as a
# zstd delta against the packed backend: a few hundred KB where the backend
# is 40 MB. On the GPU host, . scripts/dev/prebuilt-env.sh unpacks it, and
# GMLP_BACKEND_DIR=$(gmlp_alt_dir NAME) runs a program on it.
#
#   scripts/dev/pack-alt.sh NAME [BACKEND.so]   # default: build/'s backend
#   scripts/dev/pack-alt.sh NAME BACKEND.so LIBGMLP.so BENCH_DIR
#
# The second form carries a whole other build (an older commit whose
# libgmlp and backend ABI differ): its libgmlp-1.0.so.0 and its gmlp-bench
# and gmlp-host-step go beside the backend, and prebuilt-compare.sh runs
# that build's own programs on its own library.
#
# So: build and pack main's state, then for each variant check it out (or
# edit), ninja -C build, and pack-alt.sh it under a name.
set -euo pipefail
cd "$(dirname "$0")/../.."
name=${1:?usage: pack-alt.sh NAME [BACKEND.so [LIBGMLP.so BENCH_DIR]]}
backend=${2:-build/libgmlp/backend/cuda/libgmlp-backend-cuda.so}
lib=${3:-}
bench=${4:-}
base=.prebuilt/libgmlp/backend/cuda/libgmlp-backend-cuda.so
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
if [ ! -f "$base" ]; then
  xz -dc "$base.xz" > "$tmp/base.so"
  base=$tmp/base.so
fi
strip -g -o "$tmp/alt.so" "$backend"
mkdir -p .prebuilt/alts
# (zstd's advice on patch sizes goes to the log; only a failure shows it.)
zstd -q -f -19 --single-thread --long=27 --patch-from="$base" "$tmp/alt.so" -o ".prebuilt/alts/$name.zst" \
  2> "$tmp/zstd.log" || { cat "$tmp/zstd.log" >&2; exit 1; }
ls -l ".prebuilt/alts/$name.zst"
if [ -n "$lib" ]; then
  mkdir -p "$tmp/lib"
  strip -g -o "$tmp/lib/libgmlp-1.0.so.0" "$lib"
  cp "$bench/gmlp-bench" "$bench/gmlp-host-step" "$tmp/lib/"
  tar -C "$tmp/lib" -cJf ".prebuilt/alts/$name.lib.tar.xz" .
  ls -l ".prebuilt/alts/$name.lib.tar.xz"
fi
