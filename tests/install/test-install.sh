#!/usr/bin/env bash
# Installs this build into a temporary prefix (meson install --destdir) and
# builds and runs a C, Python, gjs and Vala program against that copy alone,
# as README.md's "Using an installed copy" says: pkg-config, LD_LIBRARY_PATH,
# GI_TYPELIB_PATH, PYTHONPATH, gjs -m, valac --vapidir. Nothing from the
# build or source tree is on any path, and every installed file must land
# under the prefix (so a user without root can install anywhere), or in
# the overrides directory where -Dpygobject-overrides-dir puts it elsewhere.
#
#   test-install.sh MESON BUILD-ROOT PREFIX LIBDIR INCLUDEDIR DATADIR OVERRIDES-DIR HAVE-VAPI
#   (the directories absolute, as configured)
set -euo pipefail
meson=$1 build=$2 prefix=$3 libdir=$4 includedir=$5 datadir=$6 overrides=$7 have_vapi=$8
here=$(cd "$(dirname "$0")" && pwd)

work=$(mktemp -d "${TMPDIR:-/tmp}/gmlp-install.XXXXXX")
trap 'rm -rf "$work"' EXIT
dest=$work/dest
"$meson" install -C "$build" --no-rebuild --quiet --destdir "$dest" >"$work/install.log" 2>&1 ||
  { cat "$work/install.log"; exit 1; }

P=$dest$prefix
outside=$(cd "$dest" && find . ! -type d | sed 's|^\.||' | grep -v -e "^$prefix/" -e "^$overrides/" || true)
if [ -n "$outside" ]; then
  echo "installed outside the prefix $prefix:"; echo "$outside"; exit 1
fi
L=$dest$libdir
for f in "$L/libgmlp-1.0.so.0" "$L/libgmlp-1.0.so" "$L/girepository-1.0/Gmlp-1.0.typelib" \
         "$L/pkgconfig/gmlp-1.0.pc" "$dest$datadir/gir-1.0/Gmlp-1.0.gir" \
         "$dest$includedir/gmlp-1.0/gmlp.h" "$dest$overrides/Gmlp.py"; do
  [ -e "$f" ] || { echo "not installed: $f"; exit 1; }
done
# A build set up before the project asked for a relocatable .pc still names
# /usr/local: point that staged copy at where it lies now.
sed -i "s|^prefix=/.*|prefix=$P|" "$L/pkgconfig/gmlp-1.0.pc"

# The installed copy alone: no build-tree paths from meson test's environment.
unset GI_TYPELIB_PATH LD_LIBRARY_PATH PYTHONPATH GMLP_OVERRIDES_DIR GMLP_BACKEND_DIR PKG_CONFIG_PATH
export GMLP_DEVICE=cpu
export PKG_CONFIG_PATH=$L/pkgconfig
export LD_LIBRARY_PATH=$L
export GI_TYPELIB_PATH=$L/girepository-1.0
export PYTHONPATH=$(dirname "$(dirname "$dest$overrides")")
cd "$work"

cc -o example-c "$here/example.c" $(pkg-config --cflags --libs gmlp-1.0)
# Not grep -q: it would stop reading early, ldd would die of SIGPIPE and
# pipefail would call the line failed.
ldd ./example-c | grep "libgmlp-1.0.so.0 => $P/" > /dev/null || { ldd ./example-c; exit 1; }
./example-c

/usr/bin/python3 "$here/example.py" "$P" "$dest$overrides"

if command -v gjs >/dev/null; then
  gjs -m "$here/example.js"
else
  echo "gjs: not installed, skipped"
fi

if [ "$have_vapi" = true ] && command -v valac >/dev/null; then
  valac --vapidir "$dest$datadir/vala/vapi" --pkg gmlp-1.0 -X -w -o example-vala "$here/example.vala"
  ./example-vala
else
  echo "vala: no vapi or valac, skipped"
fi
