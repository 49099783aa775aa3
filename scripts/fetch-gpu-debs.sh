#!/usr/bin/env bash
# Downloads into .debs/ the Debian 12 packages that scripts/gpu-suite.sh
# unpacks on a GPU host that has no GLib development packages (and zstd,
# which unpacks scripts/dev/pack-alt.sh's backends there; libgirepository
# and GLib's typelibs, for the fuzz suite, tests/fuzz; pyelftools, for
# kernels/sass_reuse.py; json-glib, which gmlp-bench and gmlp-demo write
# their JSON lines with).
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .debs
cd .debs
apt-get download \
  libglib2.0-0 libglib2.0-dev libglib2.0-dev-bin libglib2.0-bin libffi-dev libffi8 \
  libpcre2-dev libpcre2-8-0 libpcre2-16-0 libpcre2-32-0 libpcre2-posix3 zlib1g-dev \
  libmount-dev libblkid-dev libselinux1-dev libsepol-dev \
  libopenblas-dev libopenblas-pthread-dev libopenblas0 libopenblas0-pthread libgfortran5 zstd \
  libgirepository-1.0-1 gir1.2-glib-2.0 python3-pyelftools \
  libjson-glib-dev libjson-glib-1.0-0
