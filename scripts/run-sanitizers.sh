#!/usr/bin/env bash
# The CPU suites under the compiler's sanitizers (CI runs it after valgrind):
#
#   asan: build-asan, AddressSanitizer + UndefinedBehaviorSanitizer (any
#         report fails the test): the C tests of suite 'cpu', the CPU cases
#         of the 'fuzz' suite, and the binding tests (Python, gjs, Vala)
#         with the ASan runtime preloaded into the interpreters.
#   tsan: build-tsan, ThreadSanitizer: the 'threads' suite, against Debian's
#         GLib and against a GLib built here with ThreadSanitizer
#         (build-tsan-glib/, downloaded once).
#
#   scripts/run-sanitizers.sh [asan] [tsan]      (both by default)
#
# Every stage runs even when one fails; the exit status is non-zero if any
# did, after a list of the reports by test.
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/install-deps.sh

stages=("$@")
[ "${#stages[@]}" -gt 0 ] || stages=(asan tsan)

# GLib's slice allocator hides allocations from the sanitizers; meson's test
# environment sets MALLOC_CHECK_, which only glibc's malloc knows.
base_wrap="env -u MALLOC_CHECK_ G_SLICE=always-malloc"
# gcc 12's sanitizers do not know the larger address-space randomisation of
# recent kernels (ASan hangs, TSan: "unexpected memory mapping").
if [ "$(cat /proc/sys/vm/mmap_rnd_bits 2>/dev/null || echo 28)" -gt 28 ]; then
  base_wrap="setarch $(uname -m) -R $base_wrap"
fi

status=0
timings=()
logs=()

runtime ()
{
  local f
  f=$(gcc -print-file-name="$1")
  if [ ! -e "$f" ]; then
    echo "run-sanitizers: gcc has no $1 (Debian: libasan8, libubsan1, libtsan2)" >&2
    exit 1
  fi
  readlink -f "$f"
}

configure ()
{
  local dir=$1
  shift
  if [ -f "$dir/build.ninja" ]; then
    meson setup --reconfigure "$dir" "$@" > /dev/null
  else
    rm -rf "$dir"
    meson setup "$dir" "$@" > /dev/null
  fi
  ninja -C "$dir" > /dev/null
}

# suite_tests DIR SUITE [[-]PROGRAM]: the names of DIR's tests in SUITE (run
# by PROGRAM, or by anything but PROGRAM).
suite_tests ()
{
  meson introspect "$1" --tests | /usr/bin/python3 -c '
import json, os, sys
suite, program = sys.argv[1], sys.argv[2]
for t in json.load(sys.stdin):
    if suite not in [s.split(":")[-1] for s in t["suite"]]:
        continue
    name = os.path.basename(t["cmd"][0])
    if not program or (name != program[1:] if program[0] == "-" else name == program):
        print(t["name"])' "$2" "${3:-}"
}

# run_tests NAME DIR MESON-TEST-ARGS...: one `meson test`, timed, logged
# to DIR/meson-logs/NAME-WRAPPER.*.
run_tests ()
{
  local name=$1 dir=$2 start=$SECONDS rc=0
  shift 2
  echo "== $name"
  rm -f "$dir/meson-logs/$name"-*.json
  meson test -C "$dir" --logbase "$name" --print-errorlogs "$@" || rc=$?
  timings+=("$name: $((SECONDS - start)) s, exit $rc")
  logs+=("$dir/meson-logs/$name"-*.json)
  [ "$rc" -eq 0 ] || status=1
}

asan ()
{
  local start=$SECONDS asan_rt ubsan_rt
  # Leak stacks pass through GLib, built without frame pointers: the slow
  # unwinder follows them to libgmlp's frames.
  export ASAN_OPTIONS=detect_leaks=1:halt_on_error=1:fast_unwind_on_malloc=0:detect_stack_use_after_return=1:strict_string_checks=1:check_initialization_order=1:strict_init_order=1
  export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
  asan_rt=$(runtime libasan.so)
  ubsan_rt=$(runtime libubsan.so)
  configure build-asan -Db_sanitize=address,undefined -Db_lundef=false -Dcuda=disabled -Ddocs=false \
    -Doptimization=1 -Ddebug=true "-Dc_args=-fno-omit-frame-pointer -fno-sanitize-recover=undefined"
  timings+=("asan build: $((SECONDS - start)) s")

  run_tests asan-c build-asan --suite cpu --no-suite bindings --no-suite fuzz \
    --timeout-multiplier 3 --wrap "$base_wrap"
  # The fuzz cases run in children that leave by _exit(), unchecked for
  # leaks, and the parent holds only its table of cases: no leak check
  # here. Its address-space limit (--mem-limit) cannot hold ASan's shadow
  # memory; ASan's own limit makes larger allocations fail as that did.
  if [ -n "$(suite_tests build-asan fuzz)" ]; then
    ASAN_OPTIONS="$ASAN_OPTIONS:detect_leaks=0:allocator_may_return_null=1:max_allocation_size_mb=4096" \
      run_tests asan-fuzz build-asan --suite fuzz --no-suite gpu --timeout-multiplier 3 \
        --test-args=--mem-limit=0 --wrap "$base_wrap"
  else
    echo "== asan-fuzz: no tests in suite 'fuzz' yet"
  fi
  # The interpreters are not instrumented: the runtime must be loaded first.
  # They leak on purpose at exit; tests/lsan-bindings.supp and
  # tests/lsan-gjs.supp say what is suppressed and why. PYTHONMALLOC=malloc
  # puts Python's objects where LSan looks for pointers.
  local other_tests gjs_tests
  other_tests=$(suite_tests build-asan bindings -gjs)
  gjs_tests=$(suite_tests build-asan bindings gjs)
  if [ -n "$other_tests" ]; then
    # shellcheck disable=SC2086
    LSAN_OPTIONS="suppressions=$PWD/tests/lsan-bindings.supp:print_suppressions=0" \
      run_tests asan-bindings build-asan --timeout-multiplier 3 \
        --wrap "$base_wrap PYTHONMALLOC=malloc LD_PRELOAD='$asan_rt $ubsan_rt'" $other_tests
  fi
  if [ -n "$gjs_tests" ]; then
    # shellcheck disable=SC2086
    LSAN_OPTIONS="suppressions=$PWD/tests/lsan-gjs.supp:print_suppressions=0" \
      run_tests asan-gjs build-asan --timeout-multiplier 3 \
        --wrap "$base_wrap LD_PRELOAD='$asan_rt $ubsan_rt'" $gjs_tests
  fi
  unset ASAN_OPTIONS UBSAN_OPTIONS
}

# Debian's GLib is not instrumented: ThreadSanitizer sees neither what
# happens inside it (libgmlp's GArrays and hash tables, GObject's reference
# counts) nor the order its futex mutexes, GOnce and atomics put between
# threads, which libgmlp tells it about itself (gmlp-thread-private.h where
# it exists). The threads suite runs against Debian's GLib, as users have
# it, and against the same GLib release built here with -fsanitize=thread
# (glib, gobject and gmodule; gio stays Debian's, libgmlp uses it only for
# GInitable), which sees inside GLib and needs no annotation.
glib_version=2.74.6
glib_sha256=069cf7e51cd261eb163aaf06c8d1754c6835f31252180aff5814e5afc7757fbc
glib_dir=build-tsan-glib
tsan_glib ()
{
  local src=$glib_dir/glib-$glib_version tarball=$glib_dir/glib-$glib_version.tar.xz
  [ -f "$glib_dir/stamp-$glib_sha256" ] && return 0
  mkdir -p "$glib_dir"
  if [ ! -f "$tarball" ]; then
    curl -sSfL -o "$tarball.part" \
      "http://deb.debian.org/debian/pool/main/g/glib2.0/glib2.0_$glib_version.orig.tar.xz"
    mv "$tarball.part" "$tarball"
  fi
  echo "$glib_sha256  $tarball" | sha256sum -c --quiet
  rm -rf "$src"
  tar -C "$glib_dir" -xf "$tarball"
  meson setup "$src/build" "$src" --wrap-mode=nofallback -Dbuildtype=debugoptimized \
    -Db_sanitize=thread -Db_lundef=false -Dtests=false -Dinstalled_tests=false -Dnls=disabled \
    -Dselinux=disabled -Dxattr=false -Dlibmount=disabled -Dman=false -Dgtk_doc=false \
    -Dlibelf=disabled -Dsysprof=disabled -Ddtrace=false -Dsystemtap=false > /dev/null
  meson compile -C "$src/build" glib-2.0 gobject-2.0 gmodule-2.0 > /dev/null
  touch "$glib_dir/stamp-$glib_sha256"
}

tsan ()
{
  local start=$SECONDS b libpath t
  configure build-tsan -Db_sanitize=thread -Dcuda=disabled -Ddocs=false -Dintrospection=disabled \
    -Dvapi=disabled -Doptimization=1 -Ddebug=true -Dc_args=-fno-omit-frame-pointer
  if [ -z "$(suite_tests build-tsan threads)" ]; then
    echo "== tsan: no tests in suite 'threads' yet"
    return 0
  fi
  tsan_glib
  b=$PWD/$glib_dir/glib-$glib_version/build
  libpath=$b/glib:$b/gobject:$b/gmodule
  timings+=("tsan build (GLib included): $((SECONDS - start)) s")
  export TSAN_OPTIONS="halt_on_error=0:second_deadlock_stack=1:suppressions=$PWD/tests/tsan.supp"
  run_tests tsan build-tsan --suite threads --timeout-multiplier 5 --wrap "$base_wrap"
  # A silent fall back to Debian's GLib would make this run the one above.
  for t in $(meson introspect build-tsan --tests | /usr/bin/python3 -c '
import json, sys
print(" ".join(sorted({t["cmd"][0] for t in json.load(sys.stdin)
                       if any(s.endswith(":threads") for s in t["suite"])})))'); do
    if ! LD_LIBRARY_PATH=$libpath ldd "$t" | grep "libglib-2.0.so.0 => $b/glib/" > /dev/null; then
      echo "run-sanitizers: $t does not load the instrumented GLib" >&2
      status=1
      unset TSAN_OPTIONS
      return 0
    fi
  done
  run_tests tsan-glib build-tsan --suite threads --timeout-multiplier 5 \
    --wrap "$base_wrap LD_LIBRARY_PATH=$libpath"
  unset TSAN_OPTIONS
}

for s in "${stages[@]}"; do
  case $s in
    asan) asan ;;
    tsan) tsan ;;
    *) echo "run-sanitizers: unknown stage $s (asan, tsan)" >&2; exit 2 ;;
  esac
done

# One line per sanitizer report: the test, the report's first line and its
# first frame in libgmlp or the tests.
/usr/bin/python3 - "${logs[@]}" <<'PY'
import json, re, sys
head = re.compile(r'(ERROR: AddressSanitizer: .*|Direct leak of .*|WARNING: ThreadSanitizer: .*'
                  r'|runtime error: .*)')
frame = re.compile(r'#\d+ (?:0x[0-9a-f]+ in )?(\S+) (\S*(libgmlp|kernels|tests|examples|bench)/\S+)')
for path in sys.argv[1:]:
    try:
        lines = open(path).readlines()
    except OSError:
        continue
    for line in lines:
        r = json.loads(line)
        if r['result'] in ('OK', 'SKIP', 'EXPECTEDFAIL'):
            continue
        name = r['name'].split(' / ')[-1]
        reports, current = [], None
        for l in ((r.get('stdout') or '') + (r.get('stderr') or '')).splitlines():
            m = head.search(l)
            if m:
                if current:
                    reports.append(current)
                current = re.sub(r' \(pid=\d+\)', '', m.group(1))[:100]
                continue
            f = frame.search(l)
            if current and f:
                reports.append('%s | %s %s' % (current, f.group(1), f.group(2).replace('../', '')))
                current = None
        if current:
            reports.append(current)
        for rep in dict.fromkeys(reports) or ['%s, no sanitizer report' % r['result']]:
            print('report: %s: %s' % (name, rep))
PY
printf '%s\n' "${timings[@]/#/time: }"
exit $status
