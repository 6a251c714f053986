"""trainwatch.integrations.lightning against real Lightning (the `trainers`
environment: tests/python/env/trainers.txt), streaming to a real trainwatchd:
accumulate_grad_batches=2 with a bad batch (tier 1: skipped, weights and
AdamW's state bit-identical) and a NaN gradient (tier 3: exit status 3, the
tensor named); MixedPrecision("16-mixed", "cpu") with a real GradScaler,
plain and with a fused AdamW; the DDP strategy on two processes. The oracle
for every stored norm is torch's norm of the unscaled gradients, taken by a
probe callback in the same hook."""

import json
import math
import os
import sqlite3
import subprocess
import sys
import unittest

import lightning_trainer
from trainwatchd_process import DaemonTestCase, free_port, trainwatch_run

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "lightning_trainer.py")
NAN_PARAM = "body.2.weight"
STEPS, BAD, NAN = 80, 60, 70


class LightningTest(DaemonTestCase):
    def run_job(self, name, expect_rc, zero_code=False, **cfg):
        cfg = dict(cfg, watch=not zero_code, server=self.daemon.address, run_id=name,
                   steps=STEPS, bad_step=BAD, nan_step=NAN,
                   out=os.path.join(self.work.name, name + ".json"))
        env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
        cmd = [sys.executable, SCRIPT, json.dumps(cfg)]
        if zero_code:  # no trainwatch in the job: `trainwatch run` adds the callback
            cmd = trainwatch_run(self.daemon.address, name, lightning_trainer.RULES) + cmd
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env)
        self.assertEqual(p.returncode, expect_rc, p.stderr[-3000:])
        with open(cfg["out"]) as f:
            result = json.load(f)
        print(f"\n  lightning {result['lightning']}, torch {result['torch']}")
        db = sqlite3.connect(self.daemon.db)
        self.steps = {s: dict(zip(("loss", "grad_norm", "log_z", "shards", "scale", "overflow"), r))
                      for s, *r in db.execute(
                          "SELECT step, loss, grad_norm, log_z, shards, loss_scale, "
                          "loss_scale_overflow FROM steps WHERE run_id=?", (name,))}
        self.events = db.execute("SELECT step, tier, action, shards FROM events WHERE run_id=? "
                                 "ORDER BY step", (name,)).fetchall()
        self.world_size = db.execute("SELECT world_size FROM runs WHERE run_id=?",
                                     (name,)).fetchone()[0]
        db.close()
        return result, p

    def assert_norms_match_the_probe(self, result, rel):
        worst = max((abs(self.steps[int(s)]["grad_norm"] / n - 1)
                     for s, n in result["norms"].items()
                     if math.isfinite(n) and int(s) in self.steps), default=0.0)
        print(f"  stored grad_norm against torch's in the same hook, largest relative "
              f"difference: {worst:.1e}")
        checked = 0
        for s, norm in result["norms"].items():
            s = int(s)
            if not math.isfinite(norm) or s not in self.steps:
                continue  # an overflow step: its norm is inf or NaN
            self.assertAlmostEqual(self.steps[s]["grad_norm"], norm, delta=rel * norm, msg=f"step {s}")
            checked += 1
        return checked

    def assert_skip_and_halt(self, result, p, ranks):
        halts = [line for line in p.stderr.splitlines()
                 if line.startswith("trainwatch: halted at step 70 (tier 3")]
        self.assertEqual(len(halts), ranks, p.stderr[-3000:])
        self.assertIn(f"{NAN_PARAM} (1 of 4096 nonfinite)", halts[0])
        self.assertEqual(self.world_size, ranks)
        # One record per optimizer step (two micro-batches each), to the halt.
        self.assertEqual(sorted(self.steps), list(range(NAN + 1)))
        self.assertEqual(self.assert_norms_match_the_probe(result, 1e-5), NAN)  # all but the NaN
        self.assertEqual([(s, t, a) for s, t, a, _ in self.events if a in (2, 4)],
                         [(BAD, 1, 2), (NAN, 3, 4)])
        skipped = [sh for s, _, a, sh in self.events if a == 2][0].split(";")
        self.assertEqual(len(skipped), 2 * 4 * ranks)  # every rank's micro-batches
        self.assertEqual(result["skip_snapshot"], {"weights": True, "optimizer_state": True})
        self.assertAlmostEqual(self.steps[0]["log_z"], math.log(64), delta=0.3)
        return skipped

    def test_under_trainwatch_run_with_no_code_change(self):
        # The job holds no trainwatch import: `trainwatch run` adds the
        # callback when the Trainer is constructed; same verdicts and numbers.
        result, p = self.run_job("acc-run", 3, zero_code=True)
        self.assertIn("trainwatch: attached through the Lightning integration", p.stderr)
        skipped = self.assert_skip_and_halt(result, p, ranks=1)
        self.assertEqual([int(x) for x in skipped], list(range(1000 + 8 * BAD, 1000 + 8 * BAD + 8)))

    def test_accumulation_skip_and_halt(self):
        result, p = self.run_job("acc", 3)
        skipped = self.assert_skip_and_halt(result, p, ranks=1)
        # Without shuffling, step s holds examples 8s .. 8s+7.
        self.assertEqual([int(x) for x in skipped], list(range(1000 + 8 * BAD, 1000 + 8 * BAD + 8)))
        for s, losses in result["losses"].items():  # the micro-batches' mean
            self.assertAlmostEqual(self.steps[int(s)]["loss"], sum(losses) / len(losses),
                                   delta=1e-5 * abs(self.steps[int(s)]["loss"]))
            self.assertEqual(len(losses), 2)

    def test_ddp_two_processes(self):
        result, p = self.run_job("ddp", 3, devices=2)
        self.assert_skip_and_halt(result, p, ranks=2)

    def test_ddp_two_processes_under_trainwatch_run(self):
        # Lightning starts the second process itself, with the environment
        # that carries trainwatch run's bootstrap.
        result, p = self.run_job("ddp-run", 3, zero_code=True, devices=2)
        self.assert_skip_and_halt(result, p, ranks=2)

    def check_fp16(self, result, p):
        # The scaler starts at 2^30: fp16 overflows until it has halved into
        # range, each one a tier 0 record with its scale, never a halt; a
        # NaN gradient is an overflow too, which the scaler skips.
        overflows = sorted(s for s, r in self.steps.items() if r["overflow"])
        self.assertGreaterEqual(len(overflows), 3)
        self.assertEqual(overflows[:3], [0, 1, 2])
        self.assertIn(NAN, overflows)
        for s, r in self.steps.items():
            self.assertEqual(r["scale"], result["scales"][str(s)], f"step {s}")
        self.assertNotIn(4, [a for _, _, a, _ in self.events])
        self.assertEqual(sorted(self.steps), list(range(STEPS)))
        self.assertGreater(self.assert_norms_match_the_probe(result, 1e-4), STEPS - 20)
        self.assertEqual(result["skip_snapshot"], {"weights": True, "optimizer_state": True})
        losses = result["losses"]
        self.assertLess(sum(losses[str(STEPS - 1)]), 0.3 * sum(losses["20"]))  # it trained

    def test_fp16_grad_scaler(self):
        self.check_fp16(*self.run_job("fp16", 0, fp16=True))

    def test_fp16_fused_optimizer(self):
        # Lightning leaves a fused optimizer's gradients scaled at the hook:
        # the stored norms match the probe's only if trainwatch unscaled them,
        # and the run trains only if the fused step did not unscale again.
        self.check_fp16(*self.run_job("fused", 0, fp16=True, fused=True, clip=0))


if __name__ == "__main__":
    unittest.main()
