#!/usr/bin/env bash
# CTest runs each Catch2 case by name; a ',' or ';' in a name turns the name
# into several filters (or several CTest tests) and the case silently never
# runs. Fail if any test name has one.
set -u
cd "$(dirname "$0")"
bad=$(grep -rnE 'TEST_CASE\("[^"]*[,;]' --include='*.cc' . || true)
if [ -n "$bad" ]; then
  echo "test names with ',' or ';' (rename them):"
  echo "$bad"
  exit 1
fi
count=$(grep -rE 'TEST_CASE\(' --include='*.cc' . | wc -l)
echo "$count test case names checked"
