"""fp16 with torch's real GradScaler on the CPU (torch >= 2.3:
torch.amp.GradScaler("cpu") and fp16 autocast; run in the torch 2.x test
environments). Overflows are real: an fp16 backward at a huge initial scale
overflows until the scaler has halved it into range.

- Overflow steps are tier 0 records (the scaler skips them), never a halt.
- A scale that keeps collapsing is a tier 3 halt.
- The statistics are of the unscaled gradients, and unscale_ runs once per
  step whoever calls it first (GradScaler raises on a second call).
"""

import math
import unittest

import torch

import trainwatch
import trainwatch.torch as twt

RULES = {"warmup_steps": 50, "warmup_min_records": 20, "warmup_min_grad_samples": 20}


def fp16_autocast():
    return torch.autocast("cpu", dtype=torch.float16)


def make():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.Tanh(), torch.nn.Linear(64, 8))
    return model, torch.optim.SGD(model.parameters(), lr=1e-2)


def train(steps, init_scale, rules=RULES, unscale_first=False, poison_from=None):
    """Runs fp16 steps with a real GradScaler; from poison_from on, a weight
    gradient is inf after every backward (an overflow that never goes away).
    Returns the verdicts, each step's unscaled norm, the scales and the
    step a halt came at (or None)."""
    model, opt = make()
    scaler = torch.amp.GradScaler("cpu", init_scale=init_scale)
    agent = trainwatch.Agent(run_id="grad-scaler", rules=rules)
    guard = twt.watch(opt, agent, scaler=scaler)
    gen = torch.Generator().manual_seed(1)
    verdicts, norms, scales = {}, {}, {}
    for step in range(steps):
        x = torch.randn(32, 16, generator=gen)
        y = torch.randint(0, 8, (32,), generator=gen)
        with fp16_autocast():
            loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        scaler.scale(loss).backward()
        if poison_from is not None and step >= poison_from:
            model[0].weight.grad[0, 0] = math.inf
        if unscale_first:
            scaler.unscale_(opt)  # the trainer's own, to clip
        scales[step] = scaler.get_scale()
        try:
            verdicts[step] = guard.observe(step, loss)
        except trainwatch.TrainingHalted as e:  # an overflow step: no optimizer.step() follows
            verdicts[step] = e.verdict
            return verdicts, norms, scales, step
        norms[step] = math.sqrt(sum(float(p.grad.double().pow(2).sum())
                                    for p in model.parameters()))
        scaler.step(opt)  # raises if unscale_ had run twice
        scaler.update()
    agent.close()
    return verdicts, norms, scales, None


class RealGradScalerTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        print(f"torch {torch.__version__}, trainwatch {trainwatch.__version__}")

    def test_overflows_at_a_huge_scale_are_tier_0_not_halts(self):
        verdicts, norms, scales, halted = train(80, init_scale=2.0 ** 40)
        self.assertIsNone(halted)
        # An overflow step is one after which the scaler halved its scale.
        overflows = [s for s in range(79) if scales[s + 1] < scales[s]]
        # fp16 overflowed at 2^40 and the scaler halved it step after step.
        self.assertGreaterEqual(len(overflows), 10)
        self.assertEqual(overflows[:10], list(range(10)))
        for s in range(79):
            if s in overflows:
                self.assertEqual(verdicts[s].decision, "continue", s)
                self.assertEqual(verdicts[s].tier, 0, s)
                self.assertFalse(math.isfinite(norms[s]))  # a real overflow
            else:
                # The statistics are of unscaled gradients: the norm the
                # optimizer steps with, not scale times it.
                self.assertTrue(math.isfinite(norms[s]), s)
                self.assertAlmostEqual(verdicts[s].grad_norm, norms[s], delta=1e-5 * norms[s])
                self.assertLess(verdicts[s].grad_norm, 100.0)

    def test_unscaled_once_whoever_unscales_first(self):
        for first in (False, True):
            with self.subTest(trainer_unscales_first=first):
                verdicts, norms, _, halted = train(30, init_scale=1024.0, unscale_first=first)
                self.assertIsNone(halted)
                for s in range(30):
                    self.assertAlmostEqual(verdicts[s].grad_norm, norms[s],
                                           delta=1e-5 * norms[s])

    def test_a_collapsing_scale_is_a_tier_3_halt(self):
        verdicts, _, scales, halted = train(120, init_scale=2.0 ** 12, poison_from=60)
        self.assertIsNotNone(halted)
        self.assertEqual(verdicts[halted].decision, "halt")
        self.assertEqual(verdicts[halted].tier, 3)
        self.assertEqual(verdicts[halted].rule, "loss_scale_collapse")
        self.assertLess(scales[halted], 1.0)  # below the floor, 1.0
        for s in range(60, halted):
            self.assertEqual(verdicts[s].decision, "continue", s)


if __name__ == "__main__":
    unittest.main()
