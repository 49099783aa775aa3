#!/usr/bin/env bash
# The whole test suite on a fresh Debian 12 machine: install, build, test.
# GPU tests skip where no GPU is usable.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
scripts/build.sh -Ddocs=true
meson test -C build --print-errorlogs "$@"
