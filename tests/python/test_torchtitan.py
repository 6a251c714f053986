"""trainwatch.integrations.torchtitan against torchtitan 0.3's real Trainer
(the `trainers` environment: tests/python/env/trainers.txt), its llama3
"debugmodel" on the CPU (torchtitan_trainer.py says what makes it run
there), streaming to a real trainwatchd:

- one process, gradient accumulation 2: a batch of random tokens skipped
  (tier 1) and a NaN gradient halting (tier 3) before the update, exit
  status 3 naming the tensor; every stored loss and grad_norm equal to the
  ones torchtitan itself logs for the step;
- FSDP2 x TP on a 2 x 2 mesh, four processes: the same equality on DTensor
  gradients, and a NaN in one rank's shard named with that rank;
- torchtitan's own training entry point (torchtitan.train, its command
  line) under `trainwatch run`, with no trainwatch in the job: the same
  verdicts and numbers as the one-process test.
"""

import json
import math
import os
import sqlite3
import subprocess
import sys
import unittest

import torchtitan_trainer
from trainwatchd_process import DaemonTestCase, free_port, trainwatch_run

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "torchtitan_trainer.py")
NAN_PARAM = "layers.1.feed_forward.w1.weight"


class TorchtitanTest(DaemonTestCase):
    def run_job(self, name, ranks, zero_code=False, **cfg):
        cfg = dict(cfg, work=os.path.join(self.work.name, "job"), watch=not zero_code,
                   server=self.daemon.address, run_id=name,
                   out=os.path.join(self.work.name, name + ".json"))
        cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={ranks}",
               "--master_addr=127.0.0.1", f"--master_port={free_port()}", SCRIPT, json.dumps(cfg)]
        if zero_code:
            # No trainwatch in the job, which is torchtitan's own entry point
            # (torchtitan.train) on torchtitan's command line: `trainwatch
            # run` attaches the integration when the entry point builds the
            # Trainer.
            cmd = trainwatch_run(self.daemon.address, name, torchtitan_trainer.RULES) + cmd + \
                torchtitan_trainer.flags(cfg)
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=900,
                           env=dict(os.environ, OMP_NUM_THREADS="1"))
        with open(cfg["out"]) as f:
            result = json.load(f)
        print(f"\n  torchtitan {result['torchtitan']}, torch {result['torch']}")
        db = sqlite3.connect(self.daemon.db)
        self.steps = {s: (loss, g, z) for s, loss, g, z in db.execute(
            "SELECT step, loss, grad_norm, log_z FROM steps WHERE run_id=?", (name,))}
        self.events = db.execute("SELECT step, tier, action FROM events WHERE run_id=? "
                                 "AND action IN (2, 4) ORDER BY step", (name,)).fetchall()
        self.world_size = db.execute("SELECT world_size FROM runs WHERE run_id=?",
                                     (name,)).fetchone()[0]
        db.close()
        return result, p

    def assert_halted(self, p, step, rank, ranks):
        # Every rank halts at the step; the rank holding the NaN names it.
        halts = [line for line in p.stderr.splitlines()
                 if line.startswith(f"trainwatch: halted at step {step} (tier 3")]
        self.assertEqual(len(halts), ranks, p.stderr[-3000:])
        named = [line for line in halts if f"on rank {rank}: {NAN_PARAM} (1 of" in line]
        self.assertEqual(len(named), 1, halts)
        self.assertIn("exitcode  : 3", p.stderr)  # torchrun's summary of the failed rank

    def assert_torchtitans_numbers(self, result, upto):
        logged = {int(s): v for s, v in result["logged"].items()}
        worst = max(abs(self.steps[s][1] / logged[s]["grad_norm"] - 1) for s in range(1, upto + 1))
        print(f"  stored grad_norm against torchtitan's, largest relative difference: {worst:.1e}")
        for s in range(1, upto + 1):
            loss, grad_norm, _ = self.steps[s]
            self.assertAlmostEqual(loss, logged[s]["loss"], delta=1e-5 * logged[s]["loss"],
                                   msg=f"step {s}")
            # torchtitan's norm sums 6M squares in float32 (foreach_norm), ours
            # in float64: they differ by up to about 1e-4 on one process.
            self.assertAlmostEqual(grad_norm, logged[s]["grad_norm"],
                                   delta=2e-4 * logged[s]["grad_norm"], msg=f"step {s}")

    def test_one_process_accumulation_skip_and_halt(self):
        result, p = self.run_job("titan-1", 1, steps=30, accum=2, bad_step=24, nan_step=28)
        self.assert_halted(p, 28, 0, 1)
        # One record per optimizer step, to the halt (no update at 28: no log).
        self.assertEqual(sorted(self.steps), list(range(1, 29)))
        self.assertEqual(sorted(int(s) for s in result["logged"]), list(range(1, 28)))
        self.assert_torchtitans_numbers(result, 27)
        self.assertEqual(self.events, [(24, 1, 2), (28, 3, 4)])
        # The skipped step is logged with its pre-clip norm, far above the rest.
        self.assertGreater(self.steps[24][1], 10 * self.steps[23][1])
        # log Z of the chunked loss's logits: about ln(vocab 2048) at the start.
        self.assertTrue(all(math.isfinite(z) for _, _, z in self.steps.values()))
        self.assertAlmostEqual(self.steps[1][2], math.log(2048), delta=1.0)

    def test_under_trainwatch_run_with_no_code_change(self):
        # torchtitan.train, as `torchrun -m torchtitan.train` runs it, with
        # no trainwatch import: `trainwatch run` attaches the integration
        # when the entry point constructs the Trainer; the same verdicts and
        # numbers as test_one_process_accumulation_skip_and_halt, and the
        # launcher's exit status 3.
        result, p = self.run_job("titan-run", 1, zero_code=True, steps=30, accum=2, bad_step=24,
                                 nan_step=28)
        self.assertIn("torchtitan version: ", p.stdout + p.stderr)  # torchtitan.train main()
        self.assertIn("trainwatch: attached through the torchtitan integration", p.stderr)
        self.assertEqual(p.returncode, 3, p.stderr[-3000:])
        self.assert_halted(p, 28, 0, 1)
        self.assertEqual(sorted(self.steps), list(range(1, 29)))
        self.assert_torchtitans_numbers(result, 27)
        self.assertEqual(self.events, [(24, 1, 2), (28, 3, 4)])

    def test_fsdp2_by_tp_four_processes(self):
        result, p = self.run_job("titan-4", 4, steps=12, dp_shard=2, tp=2, nan_step=10,
                                 nan_rank=2)
        self.assert_halted(p, 10, 2, 4)
        self.assertEqual(self.world_size, 4)
        self.assertEqual(sorted(self.steps), list(range(1, 11)))
        self.assert_torchtitans_numbers(result, 9)
        self.assertEqual(self.events, [(10, 3, 4)])
        # With tensor parallelism each rank holds a slice of the vocabulary:
        # no log Z rather than a wrong one.
        self.assertTrue(all(z is None for _, _, z in self.steps.values()))


if __name__ == "__main__":
    unittest.main()
