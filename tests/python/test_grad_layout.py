"""The gradient layouts (watch(layout=...)) with real gloo ranks (CPU
processes) against a real trainwatchd: the grad_norm and nan_frac it stores
for every step must be those of the model's gradient with every distinct
element counted once, as each layout's own reference computes it.

- DDP, 2 ranks: the reference is clip_grad_norm_ on any rank (its gradients
  are replicated); counted as sharded it would be sqrt(2) times too large.
- Sharded, 2 ranks: torch 1.13's FullyShardedDataParallel does not import on
  this Python (3.11: its dataclasses have a mutable default, a ValueError at
  import), so the model is hand-sharded as ZeRO does it: each rank averages
  the full gradient, keeps its own slice of every parameter and trains that
  slice. The reference gathers the slices into whole gradients.
- Hybrid, 4 ranks as 2 tensor-parallel x 2 data-parallel: Megatron-style
  column- and row-parallel Linear layers (marked tensor_model_parallel) and a
  LayerNorm and a bias held whole by every rank. The reference gathers every
  parameter once (each shard from its tensor-parallel group, each duplicate
  from one rank).

Each run ends with a NaN put into a known number of gradient elements, so
that nan_frac shows each element counted once too; the run halts there.
"""

import json
import math
import os
import sqlite3
import unittest

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import trainwatch
import trainwatch.torch as twt
from trainwatchd_process import DaemonTestCase, free_port

STEPS = 8  # the last one carries the NaN
NAN_AT = STEPS - 1


def reference_norm(grads):
    """clip_grad_norm_'s total norm of these gradients (on copies, with a
    max_norm far above it: the return value, nothing clipped)."""
    params = []
    for g in grads:
        p = torch.nn.Parameter(torch.zeros_like(g))
        p.grad = g.clone()
        params.append(p)
    return float(torch.nn.utils.clip_grad_norm_(params, 1e30))


def nan_count(grads):
    return sum(int((~torch.isfinite(g)).sum()) for g in grads), sum(g.numel() for g in grads)


def start(rank, world, port):
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world)
    torch.manual_seed(0)
    return trainwatch.Agent(server=os.environ["TW_ADDRESS"], run_id=os.environ["TW_RUN"],
                            rank=rank, world_size=world, reduce=twt.distributed_reduce())


def mlp():
    return torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.Tanh(), torch.nn.Linear(64, 16))


def data(step, gen):
    x = torch.randn(64, 32, generator=gen)
    return x, (x[:, :16] * 0.5).argmax(dim=1)


def run_steps(agent, guard, rank, out_dir, compute):
    """compute(step) -> (loss, reference grads): runs backward, and for the
    last step puts the NaN in. Writes {step: [norm, nonfinite, elements,
    loss]} as this rank saw the reference."""
    refs = {}
    for step in range(STEPS):
        loss, grads = compute(step)
        guard.observe(step, loss)
        bad, n = nan_count(grads)
        norm = reference_norm(grads) if bad == 0 else None
        refs[step] = [norm, bad, n, float(loss)]
        try:
            guard.optimizer.step()
        except trainwatch.TrainingHalted:
            break
    agent.close()
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump(refs, f)
    dist.destroy_process_group()


def ddp_rank(rank, world, port, out_dir):
    agent = start(rank, world, port)
    model = torch.nn.parallel.DistributedDataParallel(mlp())
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    guard = twt.watch(opt, agent, model=model)  # replicated, from the DDP model
    assert guard.layout == "replicated"
    gen = torch.Generator().manual_seed(100 + rank)
    first = model.module[0].weight

    def compute(step):
        x, y = data(step, gen)
        if step == NAN_AT and rank == 0:
            # Before DDP's all-reduce, on one rank: the average makes the
            # same 3 elements NaN on every rank.
            first.register_hook(lambda g: g.index_put((torch.tensor([0, 1, 2]),
                                                       torch.tensor([0, 0, 0])),
                                                      torch.tensor(math.nan)))
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        return loss.detach(), [p.grad for p in model.parameters()]

    run_steps(agent, guard, rank, out_dir, compute)


def shard_mean_grads(model, shards, world, rank):
    """ZeRO's gradient step by hand: every rank's mean gradient, of which
    each shard keeps its rank's slice as its grad. Returns the whole (flat)
    mean gradients, the reference."""
    full = []
    for p, s in zip(model.parameters(), shards):
        g = p.grad.flatten()
        dist.all_reduce(g)
        g /= world
        s.grad = g.chunk(world)[rank].clone()
        full.append(g)
    return full


def sharded_rank(rank, world, port, out_dir):
    agent = start(rank, world, port)
    model = mlp()  # the same initial weights on every rank (seeded)
    # This rank's slice of every parameter: what it owns and trains.
    shards = [torch.nn.Parameter(p.detach().flatten().chunk(world)[rank].clone())
              for p in model.parameters()]
    opt = torch.optim.SGD(shards, lr=0.05)
    # on_device: the torch-operations path of the statistics (the kernels
    # serve the other tests).
    guard = twt.watch(opt, agent, layout="sharded", on_device=True)
    gen = torch.Generator().manual_seed(100 + rank)

    def compute(step):
        # The full weights from every rank's slice (as after ZeRO-3's gather).
        with torch.no_grad():
            for p, s in zip(model.parameters(), shards):
                parts = [torch.empty_like(s) for _ in range(world)]
                dist.all_gather(parts, s.detach())
                p.copy_(torch.cat(parts).view_as(p))
        x, y = data(step, gen)
        model.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        full = shard_mean_grads(model, shards, world, rank)
        if step == NAN_AT:
            # 2 NaN elements in rank 1's slice of the second weight, on that
            # rank only; every rank's reference (the whole gradient) has them.
            off = shards[2].numel()  # where rank 1's slice starts
            full[2][off:off + 2] = math.nan
            if rank == 1:
                shards[2].grad[:2] = math.nan
        return loss.detach(), full

    run_steps(agent, guard, rank, out_dir, compute)


class _CopyToTP(torch.autograd.Function):
    """Megatron's copy to the tensor-parallel region: identity forward,
    all-reduce of the gradient backward."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):
        g = g.clone()
        dist.all_reduce(g, group=ctx.group)
        return g, None


class _ReduceFromTP(torch.autograd.Function):
    """Megatron's reduce from the tensor-parallel region: all-reduce forward,
    identity backward."""

    @staticmethod
    def forward(ctx, x, group):
        x = x.clone()
        dist.all_reduce(x, group=group)
        return x

    @staticmethod
    def backward(ctx, g):
        return g, None


def hybrid_rank(rank, world, port, out_dir):
    agent = start(rank, world, port)
    tp_size, dp_size = 2, 2
    dp, tp = divmod(rank, tp_size)
    # Every rank creates every group, in the same order.
    tp_groups = [dist.new_group([d * tp_size + t for t in range(tp_size)]) for d in range(dp_size)]
    dp_groups = [dist.new_group([d * tp_size + t for d in range(dp_size)]) for t in range(tp_size)]
    tp_group, dp_group = tp_groups[dp], dp_groups[tp]
    full1, full2 = torch.nn.Linear(16, 32), torch.nn.Linear(32, 8)  # seeded: same everywhere
    norm = torch.nn.LayerNorm(16)
    w1 = torch.nn.Parameter(full1.weight.detach().chunk(tp_size, 0)[tp].clone())  # column
    b1 = torch.nn.Parameter(full1.bias.detach().chunk(tp_size, 0)[tp].clone())
    w2 = torch.nn.Parameter(full2.weight.detach().chunk(tp_size, 1)[tp].clone())  # row
    b2 = torch.nn.Parameter(full2.bias.detach().clone())  # whole on every rank
    twt.mark_tensor_parallel(w1, b1, w2)
    named = [("norm.weight", norm.weight), ("norm.bias", norm.bias), ("w1", w1), ("b1", b1),
             ("w2", w2), ("b2", b2)]
    opt = torch.optim.SGD([p for _, p in named], lr=0.05)
    # Odd ranks take the torch-operations path of the statistics, even ranks
    # the kernels: both group the gradients by their copies.
    guard = twt.watch(opt, agent, params=named, on_device=tp == 1, layout="hybrid",
                      data_parallel_size=dp_size, tensor_parallel_size=tp_size)
    gen = torch.Generator().manual_seed(100 + dp)  # one batch per data-parallel replica

    def compute(step):
        x = torch.randn(32 + 16 * dp, 16, generator=gen)
        y = (x[:, :8]).argmax(dim=1)
        opt.zero_grad()
        h = _CopyToTP.apply(norm(x), tp_group)
        h = torch.tanh(torch.nn.functional.linear(h, w1, b1))
        out = _ReduceFromTP.apply(torch.nn.functional.linear(h, w2), tp_group) + b2
        loss = torch.nn.functional.cross_entropy(out, y)
        loss.backward()
        for _, p in named:  # data parallel: the mean gradient of the replicas
            dist.all_reduce(p.grad, group=dp_group)
            p.grad /= dp_size
        if step == NAN_AT:
            # Replicated on all 4 ranks (as after a NaN batch on any one):
            # 2 distinct elements, counted once.
            norm.weight.grad[3:5] = math.nan
        # The reference: every parameter once. Shards from their TP group.
        ref = [norm.weight.grad, norm.bias.grad, b2.grad]
        for p in (w1, b1, w2):
            parts = [torch.empty_like(p.grad) for _ in range(tp_size)]
            dist.all_gather(parts, p.grad.contiguous(), group=tp_group)
            ref.append(torch.cat([t.flatten() for t in parts]))
        return loss.detach(), ref

    run_steps(agent, guard, rank, out_dir, compute)


class GradLayoutTest(DaemonTestCase):
    def run_ranks(self, fn, world, run_id):
        os.environ["TW_ADDRESS"], os.environ["TW_RUN"] = self.daemon.address, run_id
        mp.spawn(fn, args=(world, free_port(), self.work.name), nprocs=world, join=True)
        refs = []
        for r in range(world):
            with open(os.path.join(self.work.name, f"rank{r}.json")) as f:
                refs.append({int(s): v for s, v in json.load(f).items()})
        db = sqlite3.connect(self.daemon.db)
        stored = {s: (g, nf, loss) for s, g, nf, loss in db.execute(
            "SELECT step, grad_norm, nan_frac, loss FROM steps WHERE run_id=? ORDER BY step",
            (run_id,))}
        db.close()
        self.assertEqual(sorted(stored), list(range(STEPS)))
        return refs, stored

    def check(self, refs, stored, loss_ranks):
        for step, (grad_norm, nan_frac, loss) in stored.items():
            norm, bad, n, _ = refs[0][step]
            for r in refs:  # every rank's reference agrees
                self.assertEqual(r[step][1:3], [bad, n])
            if step == NAN_AT:
                self.assertGreater(bad, 0)
                self.assertEqual(nan_frac, bad / n)
                continue
            self.assertEqual(bad, 0)
            self.assertEqual(nan_frac, 0.0)
            self.assertLessEqual(abs(grad_norm - norm) / norm, 1e-6, f"step {step}")
            # The loss: the mean over data-parallel replicas, each counted once.
            want = sum(refs[r][step][3] for r in loss_ranks) / len(loss_ranks)
            self.assertAlmostEqual(loss, want, places=12)

    def test_ddp_two_ranks_store_clip_grad_norms(self):
        refs, stored = self.run_ranks(ddp_rank, 2, "ddp-layout")
        self.check(refs, stored, loss_ranks=[0, 1])

    def test_sharded_two_ranks_store_the_gathered_norm(self):
        refs, stored = self.run_ranks(sharded_rank, 2, "sharded-layout")
        self.check(refs, stored, loss_ranks=[0, 1])

    def test_hybrid_tp2_dp2_counts_every_parameter_once(self):
        refs, stored = self.run_ranks(hybrid_rank, 4, "hybrid-layout")
        # Ranks 0 and 2 are tensor-parallel rank 0 of the two replicas.
        self.check(refs, stored, loss_ranks=[0, 2])
        for step in stored:  # each TP group's ranks reported the same loss
            self.assertEqual(refs[0][step][3], refs[1][step][3])
            self.assertEqual(refs[2][step][3], refs[3][step][3])


class LayoutArgumentsTest(unittest.TestCase):
    """Bad layout arguments are the caller's errors, raised naming them,
    before any step is reduced."""

    def setUp(self):
        # Two ranks in name only: the reduce is never called, every case
        # fails first.
        self.agent = trainwatch.Agent(run_id="x", rank=0, world_size=2,
                                      reduce=lambda s, m: (s, m))
        self.opt = torch.optim.SGD(mlp().parameters(), lr=0.1)

    def tearDown(self):
        self.agent.close()

    def test_several_ranks_need_a_layout(self):
        with self.assertRaisesRegex(ValueError, "world_size 2 the gradient layout is needed"):
            twt.watch(self.opt, self.agent)
        with self.assertRaisesRegex(ValueError, "layout 'ddp' is not one of"):
            twt.watch(self.opt, self.agent, layout="ddp")

    def test_hybrid_needs_both_sizes_dividing_the_world(self):
        with self.assertRaisesRegex(ValueError, "needs tensor_parallel_size"):
            twt.watch(self.opt, self.agent, layout="hybrid", data_parallel_size=2)
        with self.assertRaisesRegex(ValueError, "does not divide world_size 2"):
            twt.watch(self.opt, self.agent, layout="hybrid", data_parallel_size=2,
                      tensor_parallel_size=2)
        with self.assertRaisesRegex(ValueError, "for layout='hybrid'"):
            twt.watch(self.opt, self.agent, layout="replicated", tensor_parallel_size=2)

    def test_binding_refuses_bad_copies_naming_them(self):
        g = [torch.ones(4)]
        with self.assertRaisesRegex(ValueError, r"grad_groups\[0\].copies is 3"):
            self.agent.step(0, loss=1.0, grads=g, grad_copies=3)
        with self.assertRaisesRegex(ValueError, "grad_copies has 2 entries for 1 gradients"):
            self.agent.step(0, loss=1.0, grads=g, grad_copies=[1, 2])
        with self.assertRaisesRegex(ValueError, r"grad_groups\[0\] has 5 nonfinite of 4"):
            self.agent.step(0, loss=1.0, grad_stats=[(1.0, 5, 4, 1)])
        self.assertEqual(self.agent.stats().steps, 0)  # nothing reduced


if __name__ == "__main__":
    unittest.main()
