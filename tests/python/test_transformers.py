"""trainwatch.integrations.transformers against the real Hugging Face Trainer
(the `trainers` environment: see tests/python/env/trainers.txt), streaming
to a real trainwatchd: a tiny GPT-2 from its config on the CPU, gradient
accumulation 2, a batch of random tokens (tier 1: skipped, weights and
AdamW's state bit-identical across the step), a NaN gradient and a NaN loss
(tier 3: exit status 3, the tensor named), and the same numbers as the
Trainer's own with clipping on and off, in one process and under DDP."""

import json
import math
import os
import sqlite3
import subprocess
import sys
import unittest

import hf_trainer
from trainwatchd_process import DaemonTestCase, free_port, trainwatch_run

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "hf_trainer.py")
NAN_PARAM = "transformer.h.1.mlp.c_fc.weight"


class TrainerTest(DaemonTestCase):
    def run_job(self, name, ranks=1, expect_rc=0, zero_code=False, **cfg):
        cfg = dict(cfg, out=os.path.join(self.work.name, name + ".json"), run_id=name)
        if zero_code:  # no trainwatch in the job: `trainwatch run` attaches the integration
            cfg["watch"] = False
        if cfg.get("watch"):
            cfg["server"] = self.daemon.address
        cmd = [sys.executable, SCRIPT, json.dumps(cfg)]
        if ranks > 1:
            cmd[1:1] = ["-m", "torch.distributed.run", f"--nproc_per_node={ranks}",
                        "--master_addr=127.0.0.1", f"--master_port={free_port()}"]
        if zero_code:
            cmd = trainwatch_run(self.daemon.address, name, hf_trainer.RULES) + cmd
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        if expect_rc is not None:
            self.assertEqual(p.returncode, expect_rc, p.stderr[-3000:])
        with open(cfg["out"]) as f:
            result = json.load(f)
        if name.endswith("-0"):
            print(f"\n  transformers {result['transformers']}, torch {result['torch']}")
        return result, p

    def stored(self, run_id):
        db = sqlite3.connect(self.daemon.db)
        steps = {s: (loss, g, z, shards) for s, loss, g, z, shards in db.execute(
            "SELECT step, loss, grad_norm, log_z, shards FROM steps WHERE run_id=?", (run_id,))}
        events = db.execute("SELECT step, tier, action, shards FROM events WHERE run_id=? "
                            "ORDER BY step", (run_id,)).fetchall()
        self.world_size = db.execute("SELECT world_size FROM runs WHERE run_id=?",
                                     (run_id,)).fetchone()[0]
        db.close()
        return steps, events

    @staticmethod
    def logged(result):
        return {h["step"]: h for h in result["log_history"] if "grad_norm" in h}

    def check_job(self, ranks, zero_code=False):
        # The same job with and without trainwatch: until the bad batch both
        # train identically (trainwatch's clip is torch's), so the Trainer's
        # own loss and pre-clip grad_norm are the oracle for what trainwatchd
        # stored.
        tag = f"hf-{ranks}" + ("-run" if zero_code else "")
        plain, _ = self.run_job(tag + "-0", ranks=ranks, steps=60, bad_step=50, clip=1.0)
        watched, p = self.run_job(tag + "-w", ranks=ranks, expect_rc=None, watch=True, steps=60,
                                  bad_step=50, nan_step=55, clip=1.0, zero_code=zero_code)
        self.assertNotEqual(p.returncode, 0)
        if ranks == 1 or zero_code:  # trainwatch run exits 3 whatever torchrun made of it
            self.assertEqual(p.returncode, 3, p.stderr[-3000:])
        halts = [line for line in p.stderr.splitlines() if "trainwatch: halted at step 55" in line]
        self.assertGreaterEqual(len(halts), 1, p.stderr[-3000:])
        self.assertIn("nonfinite", halts[0])
        self.assertIn(f"{NAN_PARAM} (1 of 4096 nonfinite)", halts[0])

        steps, events = self.stored(tag + "-w")
        self.assertEqual(self.world_size, ranks)
        # One record per optimizer step (gradient accumulation 2), up to the halt.
        self.assertEqual(sorted(steps), list(range(1, 56)))
        ref, got = self.logged(plain), self.logged(watched)
        worst = max(abs(steps[s][1] / ref[s]["grad_norm"] - 1) for s in range(1, 51))
        print(f"  {ranks} rank(s): stored grad_norm against the Trainer's, largest relative "
              f"difference over steps 1-50: {worst:.1e}")
        for s in range(1, 51):
            loss, grad_norm, log_z, _ = steps[s]
            self.assertAlmostEqual(grad_norm, ref[s]["grad_norm"], delta=2e-5 * ref[s]["grad_norm"],
                                   msg=f"step {s}")
            self.assertAlmostEqual(loss, ref[s]["loss"], delta=2e-5 * ref[s]["loss"], msg=f"step {s}")
            self.assertAlmostEqual(got[s]["grad_norm"], ref[s]["grad_norm"],
                                   delta=2e-5 * ref[s]["grad_norm"], msg=f"step {s}")
            self.assertTrue(math.isfinite(log_z) and log_z > 0, f"step {s}: log_z {log_z}")
        # log Z of an untrained model's near-zero logits is about ln(vocab).
        self.assertAlmostEqual(steps[1][2], math.log(64), delta=0.2)
        # Each step's shards: the examples of its micro-batches (every rank's
        # on the skipped step, rank 0's otherwise).
        per_step = 8
        if ranks == 1:
            self.assertEqual([int(x) for x in steps[2][3].split(";")],
                             list(range(1000 + per_step, 1000 + 2 * per_step)))

        skips = [e for e in events if e[2] == 2]
        halts = [e for e in events if e[2] == 4]
        self.assertEqual([(e[0], e[1]) for e in skips], [(50, 1)])
        self.assertEqual([(e[0], e[1]) for e in halts], [(55, 3)])
        bad = [int(x) for x in skips[0][3].split(";")]
        self.assertEqual(len(bad), per_step * ranks, bad)
        if ranks == 1:
            self.assertEqual(bad, list(range(1000 + 49 * per_step, 1000 + 50 * per_step)))
        # The skip: weights and AdamW's state untouched across step 50.
        self.assertEqual(watched["skip_snapshot"],
                         {"weights": True, "optimizer_state": True, "optimizer_state_entries": 28})
        self.assertEqual(plain["skip_snapshot"]["weights"], False)  # the snapshot can fail
        # The Trainer counts the skipped step and logs its pre-clip norm.
        self.assertAlmostEqual(got[50]["grad_norm"], steps[50][1], delta=1e-5 * steps[50][1])
        self.assertEqual(watched["global_step"], 54)
        # After the skip the watched run trained without the bad batch.
        self.assertLess(got[51]["loss"], ref[51]["loss"])
        return p

    def test_gradient_accumulation_skip_and_halt(self):
        self.check_job(ranks=1)

    def test_ddp_two_ranks(self):
        self.check_job(ranks=2)

    def test_ddp_two_ranks_under_trainwatch_run(self):
        self.check_job(ranks=2, zero_code=True)

    def test_under_trainwatch_run_with_no_code_change(self):
        # The job holds no trainwatch import: `trainwatch run` attaches the
        # integration when the Trainer is constructed; same verdicts, same
        # numbers, exit status 3.
        p = self.check_job(ranks=1, zero_code=True)
        self.assertIn("trainwatch: attached through the Hugging Face Trainer integration",
                      p.stderr)
        db = sqlite3.connect(self.daemon.db)
        self.assertEqual(db.execute("SELECT attachment FROM run_attachments WHERE run_id=?",
                                    ("hf-1-run-w",)).fetchall(),
                         [("through the Hugging Face Trainer integration; mode: enforcing "
                           "(skip and halt)",)])
        db.close()

    def test_clipping_off_reports_the_same_norm(self):
        plain, _ = self.run_job("noclip-0", steps=8, clip=0.0)
        watched, _ = self.run_job("noclip-w", watch=True, steps=8, clip=0.0)
        steps, events = self.stored("noclip-w")
        ref, got = self.logged(plain), self.logged(watched)
        self.assertEqual(sorted(steps), list(range(1, 9)))
        for s in range(1, 9):
            self.assertAlmostEqual(steps[s][1], ref[s]["grad_norm"], delta=2e-5 * ref[s]["grad_norm"])
            self.assertAlmostEqual(got[s]["grad_norm"], ref[s]["grad_norm"],
                                   delta=2e-5 * ref[s]["grad_norm"])
        self.assertGreater(max(h["grad_norm"] for h in ref.values()), 1.0)  # unclipped for real
        self.assertAlmostEqual(watched["final_weights_sum"], plain["final_weights_sum"], places=3)
        self.assertEqual(events, [])

    def test_nan_loss_halts_though_the_trainer_hides_it(self):
        watched, p = self.run_job("nanloss", expect_rc=3, watch=True, steps=40, nan_loss_step=33)
        self.assertIn("trainwatch: halted at step 33 (tier 3", p.stderr)
        self.assertEqual(watched["verdict"]["step"], 33)
        self.assertTrue(math.isnan(watched["verdict"]["loss"]))
        _, events = self.stored("nanloss")
        self.assertEqual([(e[0], e[2]) for e in events if e[2] == 4], [(33, 4)])


if __name__ == "__main__":
    unittest.main()
