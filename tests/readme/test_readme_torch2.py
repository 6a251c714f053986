"""The documentation's torch 2.x snippets (each after its
`<!-- readme-test: NAME -->` line, found by doc_snippets on whichever page holds
it), run in the torch 2.x test environments against a real trainwatchd:

- fsdp2: on 2 gloo ranks with a real fully_shard model; every stored
  grad_norm is torch's get_total_norm(grads).full_tensor() of the step's
  gradients before the snippet's clip (within 1e-6).
- grad-scaler: with torch's real GradScaler("cpu") and fp16 autocast (the
  snippet's "cuda" made "cpu"); every step is stored, the verdict's norm is
  that of the unscaled gradients, and scaler.step() never finds unscale_
  called twice (it would raise).
"""

import json
import math
import os
import sqlite3
import tempfile
import unittest
import warnings

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import doc_snippets
import trainwatch
import trainwatch.torch as twt
from trainwatchd_process import Trainwatchd, free_port

STEPS = 8


class Layers(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = torch.nn.ModuleList(
            [torch.nn.Linear(16, 40), torch.nn.Linear(40, 24), torch.nn.Linear(24, 5)])

    def forward(self, x):
        for layer in self.layers[:-1]:
            x = torch.tanh(layer(x))
        return self.layers[-1](x)


def batches(seed, steps=STEPS):
    g = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        yield torch.randn(16, 16, generator=g), torch.randint(0, 5, (16,), generator=g)


def recording_observe(refs):
    """Guard.observe, recording torch's own norm of the gradients it judged
    (unscaled by then, and before the snippet's clip) and the verdict's."""
    original = twt.Guard.observe

    def observe(self, step, *args, **kwargs):
        v = original(self, step, *args, **kwargs)
        grads = [p.grad for p in self.optimizer.param_groups[0]["params"] if p.grad is not None]
        norm = torch.nn.utils.get_total_norm(grads)
        norm = norm.full_tensor() if hasattr(norm, "full_tensor") else norm
        refs[step] = [float(norm), v.grad_norm]
        return v

    return observe


def fsdp2_rank(rank, world, port, out_dir, address):
    warnings.filterwarnings("ignore", message="FSDP2-wrapped module")
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world)
    torch.manual_seed(0)
    refs = {}
    twt.Guard.observe = recording_observe(refs)
    ns = {"torch": torch, "model": Layers(), "rank": rank, "world": world,
          "loader": batches(100 + rank), "loss_fn": torch.nn.functional.cross_entropy}
    doc_snippets.run("fsdp2", ns, {'"127.0.0.1:7070"': f'"{address}"'})
    ns["agent"].close()
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump({"refs": refs, "layout": ns["guard"].layout}, f)
    dist.destroy_process_group()


class ReadmeTorch2Test(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        print(f"torch {torch.__version__}, trainwatch {trainwatch.__version__}")

    def setUp(self):
        self.daemon = Trainwatchd()

    def tearDown(self):
        self.daemon.stop()

    def stored(self):
        db = sqlite3.connect(self.daemon.db)
        rows = dict(db.execute("SELECT step, grad_norm FROM steps WHERE run_id='my-run'"))
        db.close()
        return rows

    def test_fsdp2_snippet_stores_torchs_own_norm(self):
        with tempfile.TemporaryDirectory() as out:
            mp.spawn(fsdp2_rank, args=(2, free_port(), out, self.daemon.address), nprocs=2,
                     join=True)
            ranks = []
            for r in range(2):
                with open(os.path.join(out, f"rank{r}.json")) as f:
                    ranks.append(json.load(f))
        stored = self.stored()
        self.assertEqual(sorted(stored), list(range(STEPS)))
        for r in ranks:
            self.assertEqual(r["layout"], "dtensor")
        for step, (torch_norm, verdict_norm) in ranks[0]["refs"].items():
            self.assertEqual(ranks[1]["refs"][step][0], torch_norm)  # one global norm
            self.assertLessEqual(abs(stored[int(step)] - torch_norm) / torch_norm, 1e-6)
            self.assertEqual(verdict_norm, stored[int(step)])

    def test_grad_scaler_snippet_on_the_cpu(self):
        torch.manual_seed(0)
        model = Layers()
        agent = trainwatch.Agent(server=self.daemon.address, run_id="my-run")
        refs = {}
        original = twt.Guard.observe
        twt.Guard.observe = recording_observe(refs)
        try:
            ns = {"torch": torch, "trainwatch": trainwatch, "model": model, "agent": agent,
                  "optimizer": torch.optim.SGD(model.parameters(), lr=1e-2),
                  "loader": batches(7, 30), "loss_fn": torch.nn.functional.cross_entropy}
            doc_snippets.run("grad-scaler", ns, {'"cuda"': '"cpu"'})
        finally:
            twt.Guard.observe = original
        agent.close()
        self.assertEqual(ns["scaler"].get_scale(), 65536.0)  # no overflow at this scale
        stored = self.stored()
        self.assertEqual(sorted(stored), list(range(30)))
        for step, (torch_norm, verdict_norm) in refs.items():
            # Unscaled: a norm of order 1, not 65536 times it.
            self.assertTrue(math.isfinite(torch_norm) and torch_norm < 100.0)
            self.assertLessEqual(abs(verdict_norm - torch_norm) / torch_norm, 1e-6)
            self.assertEqual(stored[step], verdict_norm)


if __name__ == "__main__":
    unittest.main()
