"""Two real ranks (processes) under torch.distributed (gloo, CPU) with
DistributedDataParallel, each with its own agent streaming to a real
trainwatchd. A corrupted batch on rank 0 only and a NaN on rank 1 only: both
ranks must reach the same verdict at the same step (skip, then halt), because
the agents reduce their statistics across ranks before deciding; and the
server must hold one merged record per step."""

import json
import os
import sqlite3
import tempfile
import unittest

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import trainwatch
import trainwatch.torch as twt
from trainwatchd_process import Trainwatchd, free_port

RULES = {"warmup_steps": 100, "warmup_min_records": 20, "warmup_min_grad_samples": 20}
CORRUPT_AT, NAN_AT, STEPS = 250, 320, 400


def rank_main(rank, world, port, server, out_dir):
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world)
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(
        torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.Tanh(), torch.nn.Linear(64, 16)))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    agent = trainwatch.Agent(server=server, run_id="ddp", rank=rank, world_size=world,
                             rules=RULES, reduce=twt.distributed_reduce())
    guard = twt.watch(opt, agent, model=model)  # DDP: the replicated layout
    gen = torch.Generator().manual_seed(100 + rank)
    decisions = {}
    for step in range(STEPS):
        x = torch.randn(64, 32, generator=gen)
        y = (x[:, :16] * 0.5).argmax(dim=1)
        if step == CORRUPT_AT and rank == 0:
            x, y = x * 40.0 + 7.0, (y + 7) % 16
        if step == NAN_AT and rank == 1:
            x[3, 5] = float("nan")
        logits = model(x)
        loss = torch.nn.functional.cross_entropy(logits, y)
        opt.zero_grad()
        loss.backward()
        v = guard.observe(step, loss, logits=logits, shards=[1000 * rank + step])
        decisions[step] = v.decision
        try:
            opt.step()
        except trainwatch.TrainingHalted:
            break
    agent.close()
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump(decisions, f)
    dist.destroy_process_group()


class DistributedTest(unittest.TestCase):
    def setUp(self):
        self.work = tempfile.TemporaryDirectory()
        self.daemon = Trainwatchd(rules=RULES)
        self.address, self.db = self.daemon.address, self.daemon.db

    def tearDown(self):
        self.daemon.stop()
        self.work.cleanup()

    def test_two_ranks_skip_and_halt_at_the_same_steps(self):
        mp.spawn(rank_main, args=(2, free_port(), self.address, self.work.name), nprocs=2,
                 join=True)
        ranks = []
        for r in (0, 1):
            with open(os.path.join(self.work.name, f"rank{r}.json")) as f:
                ranks.append(json.load(f))
        # The same verdict at every step on both ranks, though only one rank
        # saw each failure.
        self.assertEqual(ranks[0], ranks[1])
        unusual = {int(s): d for s, d in ranks[0].items() if d != "continue"}
        self.assertEqual(unusual, {CORRUPT_AT: "skip_update", NAN_AT: "halt"})

        db = sqlite3.connect(self.db)
        q = lambda sql: db.execute(sql).fetchall()
        # One merged record per step, with both ranks present.
        self.assertEqual(q("SELECT count(*), max(length(missing_ranks)) FROM steps "
                           "WHERE run_id='ddp'"), [(NAN_AT + 1, 0)])
        self.assertEqual(q("SELECT world_size FROM runs WHERE run_id='ddp'"), [(2,)])
        self.assertEqual(q("SELECT step FROM events WHERE run_id='ddp' AND action=2"),
                         [(CORRUPT_AT,)])
        self.assertEqual(q("SELECT step FROM events WHERE run_id='ddp' AND action=4"), [(NAN_AT,)])
        # The skipped step's record holds both ranks' shards (the corrupted
        # batch was rank 0's, but it could have been any rank's), and so do
        # the flagged shards of its incident.
        self.assertEqual(q(f"SELECT shards FROM steps WHERE run_id='ddp' AND step={CORRUPT_AT}"),
                         [(f"{CORRUPT_AT};{1000 + CORRUPT_AT}",)])
        shards = {s for (s,) in q("SELECT shard FROM flagged_shards WHERE run_id='ddp'")}
        self.assertIn(CORRUPT_AT, shards)
        self.assertIn(1000 + CORRUPT_AT, shards)
        self.assertIn(1000 + NAN_AT, shards)


if __name__ == "__main__":
    unittest.main()
