#!/usr/bin/env bash
# Every CTest test carries one of the labels make check and make test choose
# by: unit (no server, no subprocess, seconds: make check), integration (real
# processes on loopback) or slow (Python environments, installs, fuzzing).
# Fails naming the tests that carry none.
#   check_test_labels.sh BUILD_DIR
set -u
unlabelled=$(ctest --test-dir "$1" -N -LE '^(unit|integration|slow)$' | grep -E '^ *Test +#')
if [ -n "$unlabelled" ]; then
  echo "tests without a unit, integration or slow label:"
  echo "$unlabelled"
  exit 1
fi
echo "every test is labelled unit, integration or slow"
