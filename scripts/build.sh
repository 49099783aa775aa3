#!/usr/bin/env bash
# Configures and builds libgmlp in ./build (CUDA backend on when nvcc exists).
# Extra arguments go to `meson setup`.
set -euo pipefail
cd "$(dirname "$0")/.."

# The Debian CUDA toolkit lives outside PATH.
if [ -x /usr/local/cuda/bin/nvcc ]; then
  export PATH="/usr/local/cuda/bin:$PATH"
fi

if [ -f build/build.ninja ]; then
  meson setup --reconfigure build "$@"
else
  rm -rf build
  meson setup build "$@"
fi
ninja -C build
