#!/usr/bin/env bash
# make demo's script, run as CI runs everything: it must tell the whole story
# (its exit status is 0 only when every tier happened as intended), and stop
# everything it started and remove its folder.
#   demo_test.sh SOURCE_DIR BUILD_DIR
set -uo pipefail
src=$1 build=$2
log=$(mktemp)
trap 'rm -f "$log"' EXIT
/usr/bin/python3 "$src/scripts/demo.py" --build "$build" >"$log" 2>&1
rc=$?
cat "$log"
work=$(grep -o '/[^ ]*trainwatch-demo\.[A-Za-z0-9_]*' "$log" | head -n 1)
fail=0
[ "$rc" -eq 0 ] || { echo "FAIL: demo exited $rc"; fail=1; }
[ -n "$work" ] || { echo "FAIL: the demo did not say where it worked"; fail=1; }
if [ -n "$work" ]; then
  if pgrep -f "$work" >/dev/null; then
    echo "FAIL: still running after the demo:"; pgrep -af "$work"; fail=1
  fi
  [ ! -e "$work" ] || { echo "FAIL: $work was left behind"; fail=1; }
fi
for what in "tier 1, the injected corrupted batch" "tier 2, logit drift" \
            "rollback: the trainer resumed from checkpoint" "without recurrence" \
            "tier 3, numerical failure" "halt, roll back, reconfigure: approved with --precision" \
            "no stall (bound at least" "everything it started has stopped"; do
  grep -q "$what" "$log" || { echo "FAIL: the account lacks '$what'"; fail=1; }
done
[ -s "$build/trainwatch-demo-report.html" ] || { echo "FAIL: no report page"; fail=1; }
exit $fail
