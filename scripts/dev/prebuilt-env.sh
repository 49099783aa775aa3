# Sourced on the GPU host from the repository root of a call that carried
# .prebuilt (scripts/dev/pack-prebuilt.sh): unpacks its run-time packages
# and sets the paths its programs need.
for f in .prebuilt/debs/*.deb; do dpkg -x "$f" /; done
ldconfig
export LD_LIBRARY_PATH="/usr/lib/x86_64-linux-gnu/openblas-pthread${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export GMLP_BACKEND_DIR="$PWD/.prebuilt/libgmlp/backend/cuda"
export PATH="/usr/local/cuda/bin:$PATH"
