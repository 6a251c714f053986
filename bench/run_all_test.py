#!/usr/bin/python3
"""The ctest of `make bench`: bench/run_all.py --smoke must write a table
with a row for every figure issue 16 asks for, and the benches built in this
tree (rule engine, replay, CPU statistics) must have run and given figures.
The documentation's page of the figures (--docs, here into OUT_DIR) must
have every row and name the run's commit. The benches run with $TMPDIR a
folder of their own, which they must leave empty: a generated history is
hundreds of MB, and every run would add one.

  run_all_test.py BUILD_DIR OUT_DIR
"""

import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))

# The Done-when of issue 16, as the rows' leading words.
EXPECTED = ["ingest vs a fair", "p99 durable-ack", "restart to serving", "rule engine",
            "twctl replay --summary", "agent Step() p99.9"] + [
    f"{kind} stats {d} vs {base}" for kind, bases in (("grad", ("plain 1-thread", "torch")),
                                                      ("logit", ("torch",)))
    for d in ("fp32", "bf16", "fp16") for base in bases]
# Always built with the benchmarks: these must run, not be skipped.
MUST_RUN = ["rule_engine", "replay", "cpu_stats"]


def main():
    build, out = sys.argv[1], sys.argv[2]
    with tempfile.TemporaryDirectory(prefix="run_all_test.") as tmp:
        p = subprocess.run(["/usr/bin/python3", os.path.join(HERE, "run_all.py"), "--smoke",
                            "--build", build, "--out", out, "--timeout", "120",
                            "--docs", os.path.join(out, "benchmarks.md")],
                           env=dict(os.environ, TMPDIR=tmp))
        left = sorted(os.listdir(tmp))
    if p.returncode != 0:
        sys.exit(f"run_all.py --smoke exited {p.returncode}")
    summary = json.load(open(os.path.join(out, "summary.json")))
    md = open(os.path.join(out, "summary.md")).read()
    page = open(os.path.join(out, "benchmarks.md")).read()
    problems = [f"left in $TMPDIR by the benches: {', '.join(left)}"] if left else []
    for name in MUST_RUN:
        if summary["benches"].get(name) != "ok":
            problems.append(f"bench {name}: {summary['benches'].get(name)}")
    for want in EXPECTED:
        rows = [r for r in summary["rows"] if r["figure"].startswith(want)]
        if not rows:
            problems.append(f"no row for '{want}'")
        elif rows[0]["bench"] in MUST_RUN and rows[0].get("value") is None:
            problems.append(f"row '{want}' has no value: {rows[0]['result']}")
        for name, text in (("summary.md", md), ("benchmarks.md", page)):
            if not any(line.startswith("| " + want) for line in text.splitlines()):
                problems.append(f"{name} has no line for '{want}'")
    m = summary["machine"]
    if not (m.get("cores") and m.get("load_start") and m.get("load_end") and m.get("date")):
        problems.append(f"machine description incomplete: {m}")
    # The commit is None only outside a git checkout.
    if f"commit {m.get('commit') or 'not recorded'}" not in page or "Smoke sizes" not in page:
        problems.append("benchmarks.md does not name the run's commit or say it was a smoke run")
    if problems:
        sys.exit("\n".join(problems))
    print(f"{len(summary['rows'])} rows, every expected figure present")


if __name__ == "__main__":
    main()
