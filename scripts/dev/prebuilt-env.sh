# Sourced on the GPU host from the repository root of a call that carried
# .prebuilt (scripts/dev/pack-prebuilt.sh): unpacks its run-time packages,
# its backend and any other builds of the backend (scripts/dev/pack-alt.sh;
# `gmlp_alt_dir NAME` says where one lies, to give as GMLP_BACKEND_DIR),
# and sets the paths its programs need.
for f in .prebuilt/debs/*.deb; do dpkg -x "$f" /; done
ldconfig
gmlp_main=.prebuilt/libgmlp/backend/cuda/libgmlp-backend-cuda.so
[ -f "$gmlp_main" ] || xz -d "$gmlp_main.xz"
gmlp_alt_dir () { echo "/tmp/gmlp-alts/$1"; }
for z in .prebuilt/alts/*.zst; do
  [ -f "$z" ] || continue
  n=$(basename "$z" .zst)
  mkdir -p "$(gmlp_alt_dir "$n")"
  zstd -q -d -f --long=27 --patch-from="$gmlp_main" "$z" -o "$(gmlp_alt_dir "$n")/libgmlp-backend-cuda.so"
  # A whole other build: its library and programs beside its backend.
  if [ -f ".prebuilt/alts/$n.lib.tar.xz" ]; then
    tar -C "$(gmlp_alt_dir "$n")" -xJf ".prebuilt/alts/$n.lib.tar.xz"
  fi
done
export LD_LIBRARY_PATH="/usr/lib/x86_64-linux-gnu/openblas-pthread${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
# (kept where the caller chose one: GMLP_BACKEND_DIR=$(gmlp_alt_dir NAME) prebuilt-suite.sh)
export GMLP_BACKEND_DIR="${GMLP_BACKEND_DIR:-$PWD/.prebuilt/libgmlp/backend/cuda}"
export PATH="/usr/local/cuda/bin:$PATH"
# The fuzz suite's typelib (GLib's come from gir1.2-glib-2.0) and the
# library it names.
export GI_TYPELIB_PATH="$PWD/.prebuilt/girepository${GI_TYPELIB_PATH:+:$GI_TYPELIB_PATH}"
export LD_LIBRARY_PATH="$PWD/.prebuilt/libgmlp:$LD_LIBRARY_PATH"
