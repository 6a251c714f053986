#!/usr/bin/env bash
# Catch2's runner is compiled once, in tests/testing/catch_main.cc, and every
# test binary gets it with Catch2::Catch2 (cmake/TrainwatchCatchMain.cmake):
# compiling it costs about 45 CPU-seconds at -O2 -g, so a test file that
# defines CATCH_CONFIG_MAIN (or CATCH_CONFIG_RUNNER) itself adds that much to
# every fresh build. Fail if one does.
set -u
cd "$(dirname "$0")/.."
bad=$(grep -rlE '^[[:space:]]*#[[:space:]]*define[[:space:]]+CATCH_CONFIG_(MAIN|RUNNER)' \
        --include='*.cc' --include='*.cpp' --include='*.h' tests bench fuzz |
      grep -vx 'tests/testing/catch_main.cc' || true)
if [ -n "$bad" ]; then
  echo "these files compile their own Catch2 main; Catch2::Catch2 brings main() already:"
  echo "$bad"
  exit 1
fi
echo "Catch2's main is compiled once (tests/testing/catch_main.cc)"
