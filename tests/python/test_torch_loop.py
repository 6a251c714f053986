"""The Python binding inside a real torch (CPU) training loop: a small model,
a few hundred steps, an injected bad batch (tier 1: the update is skipped)
and an injected NaN (tier 3: the run halts)."""

import math
import unittest

import numpy as np
import torch

import trainwatch
import trainwatch.torch as twt

# Warm-up shortened from the production 1,000 steps to fit a short test run.
RULES = {"warmup_steps": 100, "warmup_min_records": 20, "warmup_min_grad_samples": 20}


def make_model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.Tanh(), torch.nn.Linear(64, 16))


def batch(step, generator):
    x = torch.randn(64, 32, generator=generator)
    y = (x[:, :16] * 0.5).argmax(dim=1)
    return x, y


class TorchLoopTest(unittest.TestCase):
    def test_bad_batch_is_skipped_and_nan_halts(self):
        model = make_model()
        opt = torch.optim.Adam(model.parameters(), lr=1e-3)
        agent = trainwatch.Agent(run_id="py-test", rules=RULES)
        guard = twt.watch(opt, agent)
        gen = torch.Generator().manual_seed(1)
        verdicts = {}
        halted_at = None
        for step in range(400):
            x, y = batch(step, gen)
            if step == 250:
                # A corrupted batch: garbage inputs, labels that mean nothing.
                x = x * 40.0 + 7.0
                y = (y + 7) % 16
            if step == 350:
                x[3, 5] = float("nan")  # a numerical failure
            logits = model(x)
            loss = torch.nn.functional.cross_entropy(logits, y)
            opt.zero_grad()
            loss.backward()
            v = guard.observe(step, loss, logits=logits, shards=[10_000 + step])
            verdicts[step] = v
            before = [p.detach().clone() for p in model.parameters()]
            try:
                opt.step()
            except trainwatch.TrainingHalted as e:
                halted_at = step
                self.assertIn("numerical failure", str(e))
                break
            if step == 250:
                # The skipped update left every weight as it was.
                for b, p in zip(before, model.parameters()):
                    self.assertTrue(torch.equal(b, p))
        self.assertEqual(verdicts[250].decision, "skip_update")
        self.assertEqual(verdicts[250].tier, 1)
        anomaly = [e for e in verdicts[250].events if e.kind == "data_anomaly"]
        self.assertEqual(len(anomaly), 1)
        self.assertEqual(anomaly[0].shards, [10_250])
        self.assertEqual(guard.skipped, 1)
        self.assertEqual(halted_at, 350)
        self.assertEqual(verdicts[350].decision, "halt")
        self.assertEqual(verdicts[350].tier, 3)
        # Nothing else fired on the healthy steps.
        others = [s for s, v in verdicts.items() if v.decision != "continue" and s not in (250, 350)]
        self.assertEqual(others, [])
        # The derived metrics are there on healthy steps.
        self.assertTrue(0.5 < verdicts[300].loss_ema_ratio < 1.5)
        self.assertTrue(verdicts[300].grad_norm > 0)
        agent.close()

    def test_watch_as_a_context_manager_closes_the_agent(self):
        model = make_model()
        opt = torch.optim.Adam(model.parameters(), lr=1e-3)
        agent = trainwatch.Agent(run_id="py-with", rules=RULES)
        closed = []
        close = agent.close
        agent.close = lambda *a, **k: (closed.append(True), close(*a, **k))[1]
        gen = torch.Generator().manual_seed(2)
        with self.assertRaisesRegex(RuntimeError, "the trainer's own error"):
            with twt.watch(opt, agent) as guard:
                self.assertIsInstance(guard, twt.Guard)
                for step in range(3):
                    x, y = batch(step, gen)
                    loss = torch.nn.functional.cross_entropy(model(x), y)
                    opt.zero_grad()
                    loss.backward()
                    self.assertEqual(guard.observe(step, loss).decision, "continue")
                    opt.step()
                raise RuntimeError("the trainer's own error")
        self.assertEqual(closed, [True])

    def test_numpy_and_bf16_through_dlpack(self):
        agent = trainwatch.Agent(run_id="py-dlpack")
        g = np.array([3.0, 4.0, np.nan, 0.0], dtype=np.float32)
        v = agent.step(0, loss=2.0, grads=[g, torch.ones(9, dtype=torch.bfloat16)])
        self.assertAlmostEqual(v.grad_norm, math.sqrt(25.0 + 9.0))
        self.assertAlmostEqual(v.nan_frac, 1.0 / 13.0)
        self.assertEqual(v.decision, "halt")  # nan_frac > 0
        # Named gradients: per-tensor statistics for the rank's report.
        named = {"w1": torch.ones(4), "w2": torch.tensor([1.0, float("inf")])}
        v = agent.step(1000, loss=2.0, grads=named)
        self.assertEqual(v.decision, "halt")
        self.assertAlmostEqual(v.nan_frac, 1.0 / 6.0)
        logits = torch.zeros(4, 100)
        v = agent.step(1001, loss=2.0, logits=logits)
        self.assertEqual(v.decision, "continue")
        with self.assertRaises(ValueError):
            agent.step(1002, loss=2.0, grads=[torch.ones(4, dtype=torch.int32)])
        with self.assertRaises(ValueError):
            agent.step(1003, grads=[torch.ones(4, 4).t()])  # not contiguous
        with self.assertRaises(TypeError):
            agent.step(1004, grads=[[1.0, 2.0]])
        with self.assertRaises(ValueError):
            agent.step(1005, grads=[torch.ones(4)], grad_stats=(4.0, 0, 4))  # not both
        with self.assertRaises(ValueError):
            agent.step(1006, grad_stats=(4.0, 5, 4))  # more nonfinite than elements
        v = agent.step(1007, loss=2.0, grad_stats=(9.0, 0, 10))
        self.assertAlmostEqual(v.grad_norm, 3.0)
        agent.close()

    def test_ranks_agree_through_a_reduce_callable(self):
        # Two ranks in one process, their collective played by hand.
        sums_seen = []

        def reduce_for(other):
            def reduce(sums, maxes):
                sums_seen.append(sums)
                if len(sums) != len(other["sums"]):
                    # The shard gather after a halt: the peer had no shards.
                    return sums, maxes
                return [a + b for a, b in zip(sums, other["sums"])], [
                    max(a, b) for a, b in zip(maxes, other["maxes"])]
            return reduce

        # The peer rank saw 5 nonfinite gradient elements; this rank none.
        # Laid out as the agent reduces: sum of squares, nonfinite, elements,
        # has-grad, loss sum, loss count, loss nonfinite, log_z sum, rows,
        # log_z nonfinite.
        # The maxes: lr, z-loss, activation, attention, their four has-flags,
        # then loss scale, its has-flag, overflow, and the hash of the rules
        # the rank holds as +h and -h (so that the max gives the min too;
        # -inf: the peer adds nothing).
        peer = {"sums": [1.0, 5, 100, 1, 2.5, 1, 0, 0, 0, 0], "maxes": [-math.inf] * 13}
        agent = trainwatch.Agent(run_id="py-ranks", rank=0, world_size=2, reduce=reduce_for(peer))
        v = agent.step(0, loss=2.5, grads=[torch.full((100,), 0.1)], shards=[77])
        self.assertEqual(sums_seen[0][1], 0.0)  # this rank's own count went in
        self.assertEqual(v.decision, "halt")    # and the peer's NaN halts it too
        # A halted step gathers every rank's shard ids: a second collective,
        # one row per rank (count, then each id as two 32-bit halves).
        self.assertEqual(len(sums_seen), 2)
        self.assertEqual(len(sums_seen[1]), 2 * 33)
        self.assertEqual(sums_seen[1][:3], [1.0, 0.0, 77.0])
        self.assertEqual(sum(sums_seen[1][33:]), 0.0)
        agent.close()
        with self.assertRaises(ValueError):
            trainwatch.Agent(run_id="x", rank=0, world_size=2)  # no reduce given

    def test_tls_files_are_checked_before_connecting(self):
        # A cert without its key, and a CA file that is not there: errors
        # naming the file at construction, not a handshake failing forever.
        with self.assertRaisesRegex(ValueError, r"certificate \(/tmp/tw-c\.pem\) needs its key"):
            trainwatch.Agent(server="127.0.0.1:1", run_id="tls", cert_file="/tmp/tw-c.pem")
        with self.assertRaisesRegex(ValueError, r"CA file: cannot read /nonexistent/ca\.pem"):
            trainwatch.Agent(server="127.0.0.1:1", run_id="tls", ca_file="/nonexistent/ca.pem")


class DeviceStatsTest(unittest.TestCase):
    """The torch-operations path (what runs for GPU tensors), checked on the
    CPU against the package's own kernels and against float64 arithmetic."""

    def reference(self, grads):
        ss, bad, n = 0.0, 0, 0
        for g in grads:
            d = g.double()
            finite = torch.isfinite(d)
            ss += float(torch.where(finite, d, torch.zeros(())).pow(2).sum())
            bad += int((~finite).sum())
            n += g.numel()
        return ss, bad, n

    def test_healthy_gradients_match_the_kernels(self):
        gen = torch.Generator().manual_seed(5)
        grads = [torch.randn(1000, generator=gen), torch.randn(37, 5, generator=gen).bfloat16(),
                 torch.randn(64, generator=gen).half(), torch.zeros(0)]
        ss, bad, n, per = twt.grad_stats(grads)
        ref = self.reference(grads)
        self.assertEqual((bad, n, per), (0, ref[2], None))
        # The fused norm returns bf16/fp16 norms in their own precision.
        self.assertAlmostEqual(ss / ref[0], 1.0, delta=1e-2)
        native = trainwatch.Agent(run_id="native").step(0, loss=1.0, grads=grads)
        device = trainwatch.Agent(run_id="device").step(0, loss=1.0, grad_stats=(ss, bad, n))
        self.assertAlmostEqual(device.grad_norm / native.grad_norm, 1.0, delta=1e-2)
        self.assertEqual(device.nan_frac, native.nan_frac)

    def test_nonfinite_gradients_are_counted_exactly_per_tensor(self):
        a = torch.randn(500)
        a[[3, 7]] = float("nan")
        b = torch.randn(20).bfloat16()
        b[0] = float("inf")
        c = torch.full((4,), 1e20)   # finite, but its squares overflow float32
        ss, bad, n, per = twt.grad_stats([a, b, c], names=["w.a", "w.b", "w.c"])
        ref = self.reference([a, b, c])
        self.assertEqual((bad, n), (3, 524))
        self.assertAlmostEqual(ss / ref[0], 1.0, delta=1e-12)
        self.assertEqual([(p[0], p[2], p[3]) for p in per],
                         [("w.a", 2, 500), ("w.b", 1, 20), ("w.c", 0, 4)])
        # Healthy but beyond float range: exact, finite, nothing nonfinite.
        ss, bad, _, per = twt.grad_stats([c])
        self.assertEqual(bad, 0)
        self.assertAlmostEqual(ss / self.reference([c])[0], 1.0, delta=1e-12)
        self.assertIsNotNone(per)

    def test_log_z_matches_the_kernels(self):
        logits = torch.randn(6, 50) * 3
        labels = torch.tensor([1, -100, 3, 4, -100, 6])
        mean = twt.log_z_stats(logits, labels)
        keep = labels != -100
        self.assertAlmostEqual(mean, float(torch.logsumexp(logits[keep], -1).mean()), places=5)
        self.assertIsNone(twt.log_z_stats(logits, torch.full((6,), -100)))
        logits[2, 0] = float("inf")
        self.assertTrue(math.isnan(twt.log_z_stats(logits)))
        self.assertAlmostEqual(twt.log_z_stats(logits, torch.tensor([1, 2, -100, 4, 5, 6])),
                               float(torch.logsumexp(logits[[0, 1, 3, 4, 5]], -1).mean()),
                               places=5)

    def test_a_loop_on_the_device_path_skips_and_halts_naming_the_tensor(self):
        model = make_model()
        opt = torch.optim.Adam(model.parameters(), lr=1e-3)
        agent = trainwatch.Agent(run_id="py-device", rules=RULES)
        guard = twt.watch(opt, agent, params=model.named_parameters(), on_device=True)
        gen = torch.Generator().manual_seed(1)
        decisions = {}
        for step in range(400):
            x, y = batch(step, gen)
            if step == 250:
                x, y = x * 40.0 + 7.0, (y + 7) % 16
            logits = model(x)
            loss = torch.nn.functional.cross_entropy(logits, y)
            opt.zero_grad()
            loss.backward()
            if step == 350:
                model[2].weight.grad[1, 2] = float("nan")
            v = guard.observe(step, loss, logits=logits, shards=[step])
            decisions[step] = v.decision
            try:
                opt.step()
            except trainwatch.TrainingHalted:
                break
        unusual = {s: d for s, d in decisions.items() if d != "continue"}
        self.assertEqual(unusual, {250: "skip_update", 350: "halt"})
        self.assertAlmostEqual(v.nan_frac, 1.0 / sum(p.numel() for p in model.parameters()))
        agent.close()


if __name__ == "__main__":
    unittest.main()
