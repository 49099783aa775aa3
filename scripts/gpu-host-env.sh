# Sourced by the GPU-host scripts: unpacks GLib and OpenBLAS from the
# Debian files in .debs/ (scripts/fetch-gpu-debs.sh) and sets the paths the
# build and the programs need. Run from the repository root.
# pyelftools goes to a folder of its own, on PYTHONPATH for kernels/sass_reuse.py:
# the host's Python packages stay as they are.
for f in .debs/*.deb; do
  case "$f" in
    *python3-pyelftools*) dpkg -x "$f" .debs/pyelftools ;;
    *) dpkg -x "$f" / ;;
  esac
done
export PYTHONPATH="$PWD/.debs/pyelftools/usr/lib/python3/dist-packages${PYTHONPATH:+:$PYTHONPATH}"
ldconfig
export PKG_CONFIG_PATH="/usr/lib/x86_64-linux-gnu/openblas-pthread/pkgconfig:/usr/lib/x86_64-linux-gnu/pkgconfig${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}"
export LD_LIBRARY_PATH="/usr/lib/x86_64-linux-gnu/openblas-pthread${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export PATH="/usr/local/cuda/bin:$PATH"
