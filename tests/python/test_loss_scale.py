"""fp16 dynamic loss scaling through trainwatch.torch.watch(..., scaler=):
statistics of the unscaled gradients, unscale_ called once per step whoever
calls it first, overflow steps recorded without a halt, a collapsing scale
halted. On CPU with a fake scaler that keeps GradScaler's per-optimizer state
(torch 1.13's GradScaler runs only on CUDA); with the real one on a GPU."""

import collections
from contextlib import nullcontext
import enum
import math
import unittest

import torch

import trainwatch
import trainwatch.torch as twt

RULES = {"warmup_steps": 50, "warmup_min_records": 20, "warmup_min_grad_samples": 20}


class _Stage(enum.Enum):
    READY = 0
    UNSCALED = 1
    STEPPED = 2


def _fresh_state():
    # GradScaler's _refresh_per_optimizer_state.
    return {"stage": _Stage.READY, "found_inf_per_device": {}}


class FakeScaler:
    """GradScaler's contract on CPU: scale(), unscale_() at most once per
    step (it raises as GradScaler does), step() unscaling only if nobody did
    and skipping optimizer.step() on inf, update() halving on overflow."""

    def __init__(self, scale=65536.0):
        self.scale_value = scale
        self.unscale_calls = 0
        self._per_optimizer_states = collections.defaultdict(_fresh_state)

    def is_enabled(self):
        return True

    def get_scale(self):
        return self.scale_value

    def scale(self, loss):
        return loss * self.scale_value

    def _state(self, optimizer):
        return self._per_optimizer_states[id(optimizer)]

    def unscale_(self, optimizer):
        state = self._state(optimizer)
        if state["stage"] is _Stage.UNSCALED:
            raise RuntimeError("unscale_() has already been called on this optimizer "
                               "since the last update().")
        self.unscale_calls += 1
        found = torch.zeros(1)
        for group in optimizer.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    p.grad.mul_(1.0 / self.scale_value)
                    if not torch.isfinite(p.grad).all():
                        found.fill_(1.0)
        state["found_inf_per_device"] = {torch.device("cpu"): found}
        state["stage"] = _Stage.UNSCALED

    def step(self, optimizer):
        state = self._state(optimizer)
        if state["stage"] is _Stage.READY:
            self.unscale_(optimizer)
        if not sum(float(v) for v in state["found_inf_per_device"].values()):
            optimizer.step()
        state["stage"] = _Stage.STEPPED

    def update(self):
        overflow = any(float(v) for s in self._per_optimizer_states.values()
                       for v in s["found_inf_per_device"].values())
        if overflow:
            self.scale_value /= 2.0
        self._per_optimizer_states = collections.defaultdict(_fresh_state)


def make():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 8))
    return model, torch.optim.SGD(model.parameters(), lr=1e-2)


def train(steps, overflow_at, rules=RULES, clip=False, scaler=None, device="cpu"):
    """Runs `steps` steps; on the steps in overflow_at one gradient holds inf
    after backward, as an fp16 overflow leaves it. Returns the verdicts, the
    unscaled grad norms, the scales, and the step a halt came at (or None)."""
    model, opt = make()
    model.to(device)
    scaler = scaler or FakeScaler()
    agent = trainwatch.Agent(run_id="fp16-test", rules=rules)
    guard = twt.watch(opt, agent, scaler=scaler)
    gen = torch.Generator().manual_seed(1)
    verdicts, norms, scales = {}, {}, {}
    for step in range(steps):
        x = torch.randn(32, 16, generator=gen).to(device)
        y = torch.randint(0, 8, (32,), generator=gen).to(device)
        # fp16 autocast exists only on CUDA; the fake scaler's run is fp32.
        fp16 = torch.autocast("cuda", dtype=torch.float16) if device == "cuda" else nullcontext()
        with fp16:
            loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        scaler.scale(loss).backward()
        if step in overflow_at:
            model[0].weight.grad[0, 0] = float("inf")
        if clip:
            scaler.unscale_(opt)  # the trainer unscales first, to clip
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1e9)
        scales[step] = scaler.get_scale()
        try:
            v = guard.observe(step, loss)
        except trainwatch.TrainingHalted as e:  # an overflow step: no optimizer.step() follows
            verdicts[step] = e.verdict
            return verdicts, norms, scales, step
        verdicts[step] = v
        norms[step] = math.sqrt(sum(float(p.grad.double().pow(2).sum())
                                    for p in model.parameters() if p.grad is not None))
        try:
            scaler.step(opt)
        except trainwatch.TrainingHalted:
            return verdicts, norms, scales, step
        scaler.update()
    return verdicts, norms, scales, None


class LossScaleTest(unittest.TestCase):
    def test_statistics_are_of_unscaled_gradients_unscaled_once(self):
        for clip in (False, True):
            with self.subTest(clip=clip):
                scaler = FakeScaler()
                verdicts, norms, _, halted = train(60, overflow_at=(), clip=clip, scaler=scaler)
                self.assertIsNone(halted)
                self.assertEqual(scaler.unscale_calls, 60)  # once a step, never twice
                for step, v in verdicts.items():
                    # Unscaled: the norm of the gradients the optimizer steps with,
                    # not 65536 times it.
                    self.assertAlmostEqual(v.grad_norm, norms[step], delta=1e-6 * norms[step])
                    self.assertLess(v.grad_norm, 100.0)

    def test_sporadic_overflows_are_not_halts(self):
        verdicts, _, scales, halted = train(150, overflow_at=(40, 90, 91))
        self.assertIsNone(halted)
        for step in (40, 90, 91):
            self.assertEqual(verdicts[step].decision, "continue", step)
        # The scaler halved its scale on each; the guard read it every step.
        self.assertEqual(scales[149], 65536.0 / 8)

    def test_persisting_overflows_halt(self):
        rules = dict(RULES, loss_scale_max_overflow_steps=5, loss_scale_floor=0.0)
        verdicts, _, _, halted = train(100, overflow_at=range(60, 100), rules=rules)
        self.assertEqual(halted, 64)
        self.assertEqual(verdicts[64].tier, 3)
        self.assertEqual(verdicts[64].rule, "loss_scale_collapse")

    def test_without_a_scaler_inf_gradients_halt(self):
        model, opt = make()
        agent = trainwatch.Agent(run_id="bf16-test", rules=RULES)
        guard = twt.watch(opt, agent)
        loss = torch.nn.functional.cross_entropy(model(torch.randn(4, 16)), torch.zeros(4).long())
        loss.backward()
        model[0].weight.grad[0, 0] = float("inf")
        self.assertEqual(guard.observe(0, loss).decision, "halt")

    def test_an_overflow_without_a_scale_is_refused(self):
        agent = trainwatch.Agent(run_id="bad-input", rules=RULES)
        with self.assertRaisesRegex(ValueError, "loss_scale_overflow is set without a loss_scale"):
            agent.step(0, loss=2.0, loss_scale_overflow=True)
        with self.assertRaisesRegex(ValueError, "loss_scale -1 is not > 0"):
            agent.step(0, loss=2.0, loss_scale=-1.0)

    @unittest.skipUnless(torch.cuda.is_available(), "[gpu] torch's GradScaler runs only on CUDA")
    def test_gpu_real_grad_scaler(self):
        scaler = torch.cuda.amp.GradScaler(init_scale=65536.0)
        verdicts, norms, scales, halted = train(120, overflow_at=(50, 80, 81), scaler=scaler,
                                                device="cuda")
        self.assertIsNone(halted)
        for step in (50, 80, 81):
            self.assertEqual(verdicts[step].decision, "continue", step)
        self.assertEqual(scales[51], scales[50] / 2)
        for step in (10, 60, 119):
            self.assertAlmostEqual(verdicts[step].grad_norm, norms[step],
                                   delta=1e-5 * norms[step])


if __name__ == "__main__":
    unittest.main()
