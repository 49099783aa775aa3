#!/usr/bin/env bash
# On the GPU host: unpacks .debs/ and builds build-gpu/ (release, no
# introspection) for a quick benchmark or profile without the whole test
# suite; writes the environment for running the programs to build-gpu/env.
#
#   scripts/dev/gpu-build.sh && . build-gpu/env
set -euo pipefail
cd "$(dirname "$0")/../.."
. scripts/gpu-host-env.sh
if [ ! -f build-gpu/build.ninja ]; then
  meson setup build-gpu -Dcuda=enabled -Dintrospection=disabled -Dvapi=disabled \
    -Dbuildtype=release
fi
ninja -C build-gpu
cat > build-gpu/env <<EOT
export PATH=/usr/local/cuda/bin:\$PATH
export LD_LIBRARY_PATH=/usr/lib/x86_64-linux-gnu/openblas-pthread
export GMLP_BACKEND_DIR=$PWD/build-gpu/libgmlp/backend/cuda
EOT
