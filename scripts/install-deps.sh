#!/usr/bin/env bash
# Installs the Debian 12 packages libgmlp needs to build, test and document.
# Skips apt entirely when everything is already installed.
set -euo pipefail

packages=(
  meson ninja-build pkg-config gcc libc6-dev
  libglib2.0-dev libglib2.0-bin
  gobject-introspection libgirepository1.0-dev gir1.2-glib-2.0
  libopenblas-dev libdlpack-dev
  python3-gi python3-numpy python3-pytest gjs valac
  # the DLPack interop tests with torch (CPU)
  python3-torch
  # kernels/sass_reuse.py (an optional CUDA build step, option sass-rewrite),
  # its test and scripts/dev read cubins with it
  python3-pyelftools
  # the JSON lines of gmlp-bench and gmlp-demo (not the library's)
  libjson-glib-dev
  # gmlp-demo --plot (examples/gmlp-demo-plot.py)
  python3-matplotlib
  valgrind gi-docgen
  # scripts/run-sanitizers.sh: gcc's runtimes, and the download of GLib's
  # source for its ThreadSanitizer build
  libasan8 libubsan1 libtsan2 curl xz-utils
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done

if [ "${#missing[@]}" -gt 0 ]; then
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  echo "Installing: ${missing[*]}"
  $sudo apt-get update -q
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q --no-install-recommends "${missing[@]}"
fi
