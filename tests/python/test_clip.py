"""Guard.clip_grad_norm_: the clip of the gradients observe() judged, from
the verdict's norm. On the same gradients it must leave what
torch.nn.utils.clip_grad_norm_ leaves and return what it returns (relative
1e-6), in one process (both statistics paths), with a GradScaler's unscale_
before observe(), and on 2 gloo ranks (DDP; hand-sharded as ZeRO shards);
misuse is refused with the gradients untouched, and a nonfinite step is
never scaled by NaN on a halt."""

import datetime
import json
import math
import os
import tempfile
import unittest

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import trainwatch
import trainwatch.torch as twt
from test_grad_layout import free_port, shard_mean_grads
from test_loss_scale import FakeScaler

RULES = {"warmup_steps": 50, "warmup_min_records": 20, "warmup_min_grad_samples": 20}


def mlp():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.Tanh(), torch.nn.Linear(64, 16))


def backward(model, seed, scale=1.0):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(64, 32, generator=gen)
    y = (x[:, :16]).argmax(dim=1)
    loss = torch.nn.functional.cross_entropy(model(x), y)
    (loss * scale).backward()
    return loss.detach()


def torch_clip(grads, max_norm):
    """torch's clip on copies of `grads`: (clipped copies, returned norm)."""
    params = []
    for g in grads:
        p = torch.nn.Parameter(torch.zeros_like(g))
        p.grad = g.detach().clone()
        params.append(p)
    norm = torch.nn.utils.clip_grad_norm_(params, max_norm)
    return [p.grad for p in params], norm


def max_rel(a, b):
    return max(float((x - y).abs().max() / y.abs().max()) for x, y in zip(a, b))


class ClipTest(unittest.TestCase):
    def setUp(self):
        self.agent = None
        self.fresh()

    def fresh(self):
        """A new model, optimizer and agent (for each subtest)."""
        self.tearDown()
        self.model = mlp()
        self.opt = torch.optim.SGD(self.model.parameters(), lr=0.1)
        self.agent = trainwatch.Agent(run_id="clip-test", rules=RULES)

    def tearDown(self):
        if self.agent is not None:
            self.agent.close()
            self.agent = None

    def grads(self):
        return [p.grad for p in self.model.parameters()]

    def check_like_torch(self, guard, max_norm, step=0):
        loss = backward(self.model, seed=step)
        want, want_norm = torch_clip(self.grads(), max_norm)
        v = guard.observe(step, loss)
        self.assertEqual(v.decision, "continue")
        got_norm = guard.clip_grad_norm_(max_norm)
        self.assertIsInstance(got_norm, torch.Tensor)
        self.assertEqual(got_norm.dtype, want_norm.dtype)
        self.assertLessEqual(abs(float(got_norm) - float(want_norm)) / float(want_norm), 1e-6)
        self.assertLessEqual(max_rel(self.grads(), want), 1e-6)
        return float(want_norm)

    def test_clips_as_torch_on_both_statistics_paths(self):
        for on_device, named in ((False, False), (False, True), (True, False)):
            with self.subTest(on_device=on_device, named=named):
                self.fresh()
                params = self.model.named_parameters() if named else None
                guard = twt.watch(self.opt, self.agent, params=params, on_device=on_device)
                for step, max_norm in enumerate((0.05, 1e3, 0.2)):  # clipping, not, clipping
                    self.opt.zero_grad()
                    norm = self.check_like_torch(guard, max_norm, step)
                    self.opt.step()
                self.assertLess(0.05, norm)  # the clipping cases really clipped

    def test_grad_scaler_unscale_then_observe_then_clip(self):
        for trainer_unscales in (True, False):
            with self.subTest(trainer_unscales=trainer_unscales):
                self.fresh()
                scaler = FakeScaler()
                guard = twt.watch(self.opt, self.agent, scaler=scaler)
                self.opt.zero_grad()
                loss = backward(self.model, seed=3, scale=scaler.get_scale())
                if trainer_unscales:
                    scaler.unscale_(self.opt)
                    want, want_norm = torch_clip(self.grads(), 0.1)
                guard.observe(0, loss)  # unscales unless the trainer did
                if not trainer_unscales:
                    want, want_norm = torch_clip(self.grads(), 0.1)
                got = guard.clip_grad_norm_(0.1)
                self.assertEqual(scaler.unscale_calls, 1)
                self.assertLessEqual(abs(float(got) / float(want_norm) - 1), 1e-6)
                self.assertLess(float(got), 100)  # of the unscaled gradients
                self.assertLessEqual(max_rel(self.grads(), want), 1e-6)
                scaler.step(self.opt)

    def test_misuse_is_refused_with_the_gradients_untouched(self):
        guard = twt.watch(self.opt, self.agent)
        loss = backward(self.model, seed=0)
        with self.assertRaisesRegex(RuntimeError, r"needs this step's observe\(\) first"):
            guard.clip_grad_norm_(1.0)
        guard.observe(0, loss)
        for bad, err in (({"norm_type": 1.0}, "only the 2-norm"),
                         ({"max_norm": -1.0}, "max_norm must be >= 0"),
                         ({"max_norm": math.nan}, "max_norm must be >= 0")):
            with self.assertRaisesRegex(ValueError, err):
                guard.clip_grad_norm_(**dict({"max_norm": 1.0}, **bad))
        before = [g.clone() for g in self.grads()]
        backward(self.model, seed=1)  # accumulates into the observed gradients
        after = [g.clone() for g in self.grads()]
        with self.assertRaisesRegex(RuntimeError, "the gradients changed after observe"):
            guard.clip_grad_norm_(1e-3)
        self.assertTrue(all(torch.equal(a, b) for a, b in zip(self.grads(), after)))
        self.assertFalse(all(torch.equal(a, b) for a, b in zip(before, after)))
        # Fresh gradients (set_to_none) are other tensors: refused too.
        guard.observe(1, loss)
        self.opt.zero_grad(set_to_none=True)
        backward(self.model, seed=2)
        with self.assertRaisesRegex(RuntimeError, "the gradients changed after observe"):
            guard.clip_grad_norm_(1e-3)
        # An unscale_ after observe() (a scaler watch() was not given).
        guard.observe(2, loss)
        FakeScaler().unscale_(self.opt)
        with self.assertRaisesRegex(RuntimeError, "the gradients changed after observe"):
            guard.clip_grad_norm_(1e-3)
        # Twice per observe(), or after the step.
        guard.observe(3, loss)
        guard.clip_grad_norm_(1e-3)
        with self.assertRaisesRegex(RuntimeError, "at most one clip per observe"):
            guard.clip_grad_norm_(1e-3)
        guard.observe(4, loss)
        self.opt.step()
        with self.assertRaisesRegex(RuntimeError, "observe"):
            guard.clip_grad_norm_(1e-3)

    def test_nonfinite_norm_is_torchs_and_a_halt_is_not_scaled(self):
        for bad, want in ((math.nan, math.nan), (math.inf, math.inf)):
            with self.subTest(bad=bad):
                self.fresh()
                guard = twt.watch(self.opt, self.agent)
                loss = backward(self.model, seed=0)
                self.model[0].weight.grad[1, 2] = bad
                _, torch_norm = torch_clip(self.grads(), 0.1)
                v = guard.observe(0, loss)
                self.assertTrue(v.halt)
                before = [g.clone() for g in self.grads()]
                with self.assertRaisesRegex(RuntimeError, "cannot be clipped"):
                    guard.clip_grad_norm_(0.1, error_if_nonfinite=True)
                norm = guard.clip_grad_norm_(0.1)
                self.assertTrue(math.isnan(float(norm)) if math.isnan(want)
                                else float(norm) == want)
                self.assertEqual(float(norm) == want, float(torch_norm) == want)  # as torch's
                # Not multiplied by NaN (torch would): the step halts anyway.
                for g, b in zip(self.grads(), before):
                    self.assertTrue(torch.equal(g.nan_to_num(), b.nan_to_num()))
                with self.assertRaises(trainwatch.TrainingHalted):
                    self.opt.step()

    def test_overflow_step_of_a_scaler_scales_as_torch(self):
        # A continue verdict with an inf gradient (fp16 overflow, tier 0):
        # torch's clip multiplies by max_norm/inf = 0; the scaler then skips.
        scaler = FakeScaler()
        guard = twt.watch(self.opt, self.agent, scaler=scaler)
        loss = backward(self.model, seed=0, scale=scaler.get_scale())
        self.model[2].weight.grad[0, 0] = math.inf
        v = guard.observe(0, loss)
        self.assertEqual(v.decision, "continue")
        want, want_norm = torch_clip(self.grads(), 1.0)
        norm = guard.clip_grad_norm_(1.0)
        self.assertEqual(float(norm), float(want_norm))
        self.assertEqual(float(norm), math.inf)
        for g, w in zip(self.grads(), want):
            self.assertTrue(torch.equal(g.isnan(), w.isnan()))
            self.assertTrue(torch.equal(g.nan_to_num(), w.nan_to_num()))


# Two gloo ranks.


def rank_main(rank, world, port, out_dir):
    # A bounded wait: a rank that dies fails the test instead of hanging it.
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world, timeout=datetime.timedelta(seconds=60))
    results = {}
    for layout in ("replicated", "sharded"):  # one spawn for both: processes are slow here
        agent = trainwatch.Agent(run_id=f"clip-{layout}", rank=rank, world_size=world,
                                 rules=RULES, reduce=twt.distributed_reduce())
        results[layout] = (ddp_steps if layout == "replicated" else sharded_steps)(
            agent, rank, world)
        agent.close()
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump(results, f)
    dist.barrier()
    # No teardown: torch 1.13 can deadlock destroying DDP's Reducer (its
    # gloo worker waits for the GIL the destructor holds), seen here.
    os._exit(0)


def ddp_steps(agent, rank, world):
    """[guard's norm, torch's norm, max relative difference of the clipped
    gradients] per step; replicated gradients: torch's clip on any rank."""
    ddp = torch.nn.parallel.DistributedDataParallel(mlp())
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    guard = twt.watch(opt, agent, model=ddp)
    results = []
    for step, max_norm in enumerate((0.05, 1e3)):
        opt.zero_grad()
        loss = backward(ddp, seed=10 * step + rank)  # each rank its own batch
        grads = [p.grad for p in ddp.parameters()]
        want, want_norm = torch_clip(grads, max_norm)
        guard.observe(step, loss)
        norm = guard.clip_grad_norm_(max_norm)
        results.append([float(norm), float(want_norm), max_rel(grads, want)])
        opt.step()
    return results


def sharded_steps(agent, rank, world):
    """The same for a model hand-sharded as ZeRO does (torch 1.13's FSDP does
    not import on Python 3.11): each rank keeps its slice of the mean
    gradient; the reference is torch's clip of the whole model's gradients,
    of which each rank's slice must be what it clipped."""
    model = mlp()  # the same weights on every rank
    shards = [torch.nn.Parameter(p.detach().flatten().chunk(world)[rank].clone())
              for p in model.parameters()]
    opt = torch.optim.SGD(shards, lr=0.1)
    guard = twt.watch(opt, agent, layout="sharded")
    results = []
    for step, max_norm in enumerate((0.05, 1e3)):
        model.zero_grad()
        loss = backward(model, seed=10 * step + rank)
        full = shard_mean_grads(model, shards, world, rank)
        want, want_norm = torch_clip(full, max_norm)
        guard.observe(step, loss)
        norm = guard.clip_grad_norm_(max_norm)
        mine = [w.chunk(world)[rank] for w in want]
        results.append([float(norm), float(want_norm), max_rel([s.grad for s in shards], mine)])
        opt.step()
    return results


class TwoRankClipTest(unittest.TestCase):
    def test_ddp_and_sharded_clip_as_torch(self):
        with tempfile.TemporaryDirectory() as out:
            mp.spawn(rank_main, args=(2, free_port(), out), nprocs=2, join=True)
            for r in range(2):
                with open(os.path.join(out, f"rank{r}.json")) as f:
                    results = json.load(f)
                for layout in ("replicated", "sharded"):
                    for step, (norm, want, rel) in enumerate(results[layout]):
                        where = (layout, r, step)
                        self.assertLessEqual(abs(norm - want) / want, 1e-6, where)
                        self.assertLessEqual(rel, 1e-6, where)


if __name__ == "__main__":
    unittest.main()
