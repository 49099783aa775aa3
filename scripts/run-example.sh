#!/usr/bin/env bash
# The main job on a fresh Debian 12 machine: install, build, run the example.
# Arguments go to gmlp-example (see --help).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
scripts/build.sh
exec build/examples/gmlp-example "$@"
