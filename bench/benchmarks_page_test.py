#!/usr/bin/python3
"""bench/benchmarks_page.py: the page holds one run's every row, its date,
commit and machine, the detection tables, and says when the run was a smoke
run or the detection bench did not run."""

import json
import os
import subprocess
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import benchmarks_page  # noqa: E402

MACHINE = {"cores": 2, "cpu": "AMD EPYC 9B14", "kernel": "6.1.0-28-cloud-amd64",
           "load_start": [1.1, 1.6, 1.5], "load_end": [1.9, 1.8, 1.6],
           "date": "2026-12-06T09:00:00+00:00", "commit": "0123456789ab", "dirty": False,
           "smoke": False}
ROWS = [
    {"figure": "rule engine, 500k-step benign run (one core, per CPU-second)", "bench":
     "rule_engine", "value": 3.67, "baseline": None, "ratio": None, "median": 3.67, "min": 3.56,
     "max": 3.72, "unit": "M records/s", "goal": "value >= 3.0", "result": "pass"},
    {"figure": "ingest vs a fair (batch-acking) sink", "bench": "ingest",
     "goal": "ratio >= 0.8", "result": "not run (not built or not present)"},
    {"figure": "twctl follow, lines per CPU-second of twctl (user + sys)", "bench": "follow",
     "value": 292263, "baseline": None, "ratio": None, "median": 292263, "min": 289725,
     "max": 307055, "unit": "lines/s", "goal": "", "result": ""},
]
DETECTION = "Detection backtest, 2026-12-06.\n\n| trace | expected |\n|---|---|\n| benign | nothing |\n"


def summary(**machine):
    return {"machine": dict(MACHINE, **machine), "benches": {"rule_engine": "ok",
                                                             "ingest": "not run"}, "rows": ROWS}


class BenchmarksPageTest(unittest.TestCase):
    def test_the_header_names_the_run_date_commit_and_machine(self):
        page = benchmarks_page.render(summary(), DETECTION)
        head = page.split("## Goals")[0]
        for want in ("2026-12-06T09:00:00+00:00", "commit 0123456789ab", "2 cores of AMD EPYC 9B14",
                     "Linux 6.1.0-28-cloud-amd64", "[1.1, 1.6, 1.5]", "Do not edit"):
            self.assertIn(want, head)
        self.assertNotIn("uncommitted", head)
        self.assertNotIn("Smoke", head)
        self.assertIn("with uncommitted changes", benchmarks_page.render(summary(dirty=True)))

    def test_goal_rows_and_other_figures_each_in_their_table(self):
        page = benchmarks_page.render(summary(), DETECTION)
        goals, rest = page.split("## Goals")[1].split("## Other figures")
        self.assertIn("| rule engine, 500k-step benign run (one core, per CPU-second) | 3.67 |  |  "
                      "| 3.67 [3.56–3.72] | M records/s | value >= 3.0 | pass |", goals)
        self.assertIn("| ingest vs a fair (batch-acking) sink |", goals)
        self.assertIn("not run (not built or not present)", goals)
        self.assertIn("| twctl follow, lines per CPU-second of twctl (user + sys) | 292,263 |",
                      rest.split("## Detection")[0])
        self.assertNotIn("ingest vs a fair", rest)

    def test_the_detection_tables_are_included_or_said_absent(self):
        page = benchmarks_page.render(summary(), DETECTION)
        self.assertIn("| benign | nothing |", page.split("## Detection")[1])
        absent = benchmarks_page.render(summary())
        self.assertIn("The detection bench did not run in this run", absent)

    def test_a_smoke_run_and_an_unrecorded_commit_are_said(self):
        page = benchmarks_page.render(summary(smoke=True, commit=None), note="Made by hand.")
        head = page.split("## Goals")[0]
        self.assertIn("commit not recorded", head)
        self.assertIn("**Smoke sizes**", head)
        self.assertIn("Made by hand.", head)

    def test_the_command_line_writes_the_page(self):
        with tempfile.TemporaryDirectory() as tmp:
            src, det = os.path.join(tmp, "summary.json"), os.path.join(tmp, "detection.md")
            out = os.path.join(tmp, "docs", "benchmarks.md")
            with open(src, "w") as f:
                json.dump(summary(), f)
            with open(det, "w") as f:
                f.write(DETECTION)
            subprocess.run([sys.executable, os.path.join(os.path.dirname(__file__),
                                                         "benchmarks_page.py"),
                            "--summary", src, "--detection", det, "--out", out], check=True,
                           stdout=subprocess.DEVNULL)
            with open(out) as f:
                self.assertEqual(f.read(), benchmarks_page.render(summary(), DETECTION))


if __name__ == "__main__":
    unittest.main()
