#!/usr/bin/env bash
# The foundation demo: a synthetic run with a corrupted batch, a logit drift
# and a NaN, replayed through the rule engine that the agent and the server
# run, with the events as a table and a short account of what happened.
set -euo pipefail
bin=${BUILD:-build}/bin
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

"$bin/trainwatch-synth" --demo --out "$work/run.csv"
steps=$(($(wc -l < "$work/run.csv") - 1))
echo "== a synthetic 18,000-step run: $steps step records (loss, grad_norm, log_z, nan_frac,"
echo "   shard id, a checkpoint every 1,000 steps), with three injected failures:"
echo "   a corrupted batch at step 6,000, a logit drift from step 11,000, a NaN at 16,000"
echo
echo "\$ twctl replay run.csv"
"$bin/twctl" replay "$work/run.csv"
echo
echo "\$ twctl replay run.csv --summary"
"$bin/twctl" replay "$work/run.csv" --summary
"$bin/twctl" replay "$work/run.csv" -o json > "$work/events.jsonl"
echo
echo "== what happened"
/usr/bin/env python3 - "$work/events.jsonl" <<'PY' 2>/dev/null || awk -F'"reason":' '{print "  -", $2}' "$work/events.jsonl"
import json, sys
for line in open(sys.argv[1]):
    e = json.loads(line)
    t, a, s = e["tier"], e["action"], e["step"]
    if a == "skip_update":
        print(f"  - step {s}: tier 1 data anomaly; the update was skipped on every rank and "
              f"shard {e['shards'][0]} recorded for inspection.")
    elif e["kind"] == "tier1_confirmed":
        print(f"  - step {s}: the loss was back at baseline: no rollback needed.")
    elif a == "warn" and e["kind"] == "warn_log_z":
        print(f"  - step {s}: early warning: log_z above 12 and rising for 5,000 steps "
              f"(add z-loss before the spike).")
    elif a == "page":
        acts = "; ".join(x["text"] for x in e["recommended_actions"])
        print(f"  - step {s}: tier 2 page: {e['kind'].replace('_', ' ')} with onset at step "
              f"{e['onset_step']}; recommended: roll back to checkpoint "
              f"{e['recommended_checkpoint_step']}, {acts}.")
    elif a == "halt":
        print(f"  - step {s}: tier 3: numerical failure, the run halts at once on every rank; "
              f"roll back to checkpoint {e['recommended_checkpoint_step']}.")
PY
