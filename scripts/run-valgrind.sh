#!/usr/bin/env bash
# The CPU suites under valgrind memcheck: fails on any memory error or
# definite leak. Run after scripts/build.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
# The fuzz suite runs its cases in children of its own, under the
# sanitizers (scripts/run-sanitizers.sh) rather than here.
exec meson test -C build --suite cpu --no-suite bindings --no-suite bench --no-suite fuzz --print-errorlogs \
  --timeout-multiplier 10 \
  --wrap="valgrind --error-exitcode=1 --leak-check=full --errors-for-leak-kinds=definite --suppressions=/usr/share/glib-2.0/valgrind/glib.supp --suppressions=$PWD/tests/valgrind.supp" "$@"
