"""bench/detection/backtest.py on two short real logs, with the peers' own
installed code: its table and its JSON say what each detector did, and what
was read from the peers' code holds on the installed packages (OLMo-core's
SkipStepOptimizer: 0 x NaN, about 128 steps skipped after one NaN; Lightning's
SpikeDetection: its state cannot be loaded back). The scoring is checked
apart, on made-up alarms, so that a skip on a NaN cannot pass for a catch."""

import json
import os
import subprocess
import sys
import tempfile
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "bench", "detection", "backtest.py")
sys.path.insert(0, os.path.dirname(SCRIPT))

import backtest  # noqa: E402  (the bench's own module)


# The shapes real logs take (bench/detection/shapes.py), each hiding an
# incident: train and val lines at one step, sparse progress bars, a
# fine-tune exploding in its warm-up (with and without its vocabulary), a
# sweep point diverging at step 300.
SHAPES = ("jsonl-train-val", "hf-sparse-bars", "finetune-warmup", "finetune-warmup-vocab",
          "lr-sweep")


class BacktestRunTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.work = tempfile.TemporaryDirectory()
        out = os.path.join(cls.work.name, "out.json")
        p = subprocess.run([sys.executable, SCRIPT, "--bin", os.path.dirname(os.environ["TWCTL"]),
                            "--trace", "nanogpt-fp16-nan", "--trace", "megatron-silent-nan",
                            *[a for t in SHAPES for a in ("--trace", t)], "--json", out], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           text=True, timeout=300)
        if p.returncode != 0:
            raise AssertionError(f"backtest.py exited {p.returncode}:\n{p.stderr[-3000:]}")
        cls.md = p.stdout
        with open(out) as f:
            cls.result = json.load(f)

    @classmethod
    def tearDownClass(cls):
        cls.work.cleanup()

    def trace(self, trace_id):
        return next(t for t in self.result["traces"] if t["trace"] == trace_id)

    def test_nanogpt_nan_halts_trainwatch_and_lightning_at_its_step_and_not_olmo(self):
        t = self.trace("nanogpt-fp16-nan")
        self.assertEqual(t["records"], 15)  # iters 2920..3060, every 10, as twctl parses them
        self.assertEqual(t["expected"], [{"what": "NaN loss", "onset": 3010, "by": 3060,
                                          "want": "halt"}])
        tw, olmo, light = (t["detectors"][d] for d in backtest.DETECTORS)
        self.assertEqual([(c["step"], c["late"], c["action"]) for c in tw["caught"]],
                         [(3010, 0, "halt")])
        self.assertEqual(tw["false"], [])
        # 15 records are fewer than the 64 SkipStepOptimizer waits for.
        self.assertEqual(olmo["fed"], 15)
        self.assertEqual((olmo["caught"], olmo["missed"], olmo["short"]), ([], ["NaN loss"], []))
        # Lightning raises on each NaN loss it is given: one episode, to the end.
        self.assertEqual([(c["step"], c["action"], c["last"]) for c in light["caught"]],
                         [(3010, "halt", 3060)])

    def test_megatron_nan_grad_norm_lightning_sees_after_its_warmup_batch(self):
        t = self.trace("megatron-silent-nan")
        tw, olmo, light = (t["detectors"][d] for d in backtest.DETECTORS)
        self.assertEqual([(c["step"], c["late"]) for c in tw["caught"]], [(5426, 0)])
        # No lm loss: Megatron's reader makes it NaN; batch 0 is Lightning's warm-up.
        self.assertEqual([(c["step"], c["late"]) for c in light["caught"]], [(5427, 1)])
        self.assertEqual(olmo["missed"], ["NaN grad norm"])

    def test_trainwatch_catches_each_shape_in_time_with_no_false_alarm(self):
        want = {"jsonl-train-val": (1800, "skip"), "hf-sparse-bars": (3113, "page"),
                "finetune-warmup": (130, "page"), "finetune-warmup-vocab": (110, "halt"),
                "lr-sweep": (392, "page")}
        for trace_id, (step, action) in want.items():
            with self.subTest(trace_id):
                tw = self.trace(trace_id)["detectors"][backtest.DETECTORS[0]]
                self.assertEqual([(c["step"], c["action"]) for c in tw["caught"]],
                                 [(step, action)])
                self.assertEqual((tw["missed"], tw["false"]), ([], []))
                # The peers are measured on each too.
                for peer in backtest.DETECTORS[1:]:
                    self.assertIsNotNone(self.trace(trace_id)["detectors"][peer])

    def test_the_markdown_table_has_a_row_per_trace_and_the_totals(self):
        lines = self.md.splitlines()
        header = next(line for line in lines if line.startswith("| trace |"))
        self.assertIn("| OLMo-core SkipStepAdamW | Lightning SpikeDetection |", header)
        row = next(line for line in lines if line.startswith("| nanoGPT fp16"))
        cells = [c.strip() for c in row.strip("|").split("|")]
        self.assertEqual(cells[1:], ["15", "halt 3,010-3,060 (NaN loss)", "halt 3,010 (+0)",
                                     "missed: NaN loss", "halt 3,010-3,060 (+0)"])
        # Two real logs and the five shapes.
        self.assertIn("| trainwatch | 7 of 7 | 0, 513 | 0 | 0 | 0 |", lines)
        self.assertIn("| Lightning SpikeDetection | 4 of 7 | 0, 1 | 3 | 0 | 0 |", lines)
        self.assertIn("| OLMo-core SkipStepAdamW | 1 of 7 | 0, 0 | 6 | 0 | 0 |", lines)

    def test_skipstep_facts_from_its_code_hold(self):
        f = self.result["facts"]
        self.assertTrue(f["finite_before"])
        # 0 x NaN is NaN: the step is "skipped", and the NaN is in the weights anyway.
        self.assertEqual(f["factor_at_nan"], 0.0)
        self.assertEqual(f["poisoned"], {"param": True, "exp_avg": True, "exp_avg_sq": True})
        # One NaN in the 128-value window: that step and the 128 after it skipped.
        self.assertEqual(f["window"], 128)
        self.assertEqual(f["skipped_after_nan_loss"], [129, True])
        self.assertEqual(f["skipped_after_nan_grad_norm"], [129, True])

    def test_spike_detection_cannot_load_its_own_state(self):
        self.assertEqual(self.result["facts"]["load_state_dict_error"],
                         "AttributeError: 'SpikeDetection' object has no attribute 'running'")
        self.assertIn("SpikeDetection's load_state_dict, given its own state_dict(): "
                      "`AttributeError", self.md)


class ScoringTest(unittest.TestCase):
    def series(self, n):
        return [backtest.Rec(s, 2.0, 1.0, None) for s in range(n)]

    def test_a_response_counts_only_where_it_deals_with_the_incident(self):
        series = self.series(100)
        incidents = [backtest.Incident("bad batch", 10, 10, "skip"),
                     backtest.Incident("drift", 40, 60, "page"),
                     backtest.Incident("NaN", 80, 99, "halt")]
        windows = [backtest.Window(30, 32, "a bump")]
        alarms = [(10, "skip"), (11, "skip"),  # one episode, caught
                  (20, "skip"),                # false
                  (31, "skip"),                # ambiguous
                  (45, "skip"),                # short of a page
                  (50, "page"),                # caught, 10 late
                  (80, "skip"), (81, "skip")]  # short of a halt: the NaN is missed
        o = backtest.Outcome(100, backtest.episodes(alarms, series))
        backtest.score(o, incidents, windows)
        self.assertEqual([(i.what, e.first, e.last) for i, e in o.caught],
                         [("bad batch", 10, 11), ("drift", 50, 50)])
        self.assertEqual([i.what for i in o.missed], ["NaN"])
        self.assertEqual([e.first for e in o.false], [20])
        self.assertEqual([e.first for e in o.ambiguous], [31])
        self.assertEqual([(e.first, e.last) for e in o.short], [(45, 45), (80, 81)])
        self.assertIn("**1 false**: skip 20", backtest.cell(o))

    def test_a_halt_deals_with_a_bad_batch_and_a_drift(self):
        series = self.series(50)
        incidents = [backtest.Incident("bad batch", 5, 5, "skip"),
                     backtest.Incident("drift", 20, 40, "page")]
        o = backtest.Outcome(50, backtest.episodes([(5, "halt"), (30, "halt")], series))
        backtest.score(o, incidents, [])
        self.assertEqual([(i.what, e.first - i.onset) for i, e in o.caught],
                         [("bad batch", 0), ("drift", 10)])
        self.assertEqual((o.missed, o.false), ([], []))


if __name__ == "__main__":
    unittest.main()
