#!/usr/bin/env bash
# The main job on a fresh Debian 12 machine: install, build, and train a
# whole Mixture-of-Experts layer (router and experts) on a teacher with
# gmlp-demo. Arguments go to gmlp-demo (see --help; --plot FILE for a PNG).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
scripts/build.sh
exec build/examples/gmlp-demo "$@"
