"""Guard.accumulate(): a step of several micro-batches is judged on the mean
loss, log Z over every counted row of every micro-batch, and every
micro-batch's shards; and the Verdict's numbers are the reduced record the
engine judged, the same on every rank (two agents in one process, their
collective a real exchange between two threads)."""

import math
import threading
import unittest

import torch

import trainwatch
import trainwatch.torch as twt


class RecordingAgent:
    """Forwards to a real agent, keeping what the guard handed it."""

    def __init__(self, agent):
        self.agent = agent
        self.calls = []

    def step(self, step, **kw):
        self.calls.append(kw)
        return self.agent.step(step, **kw)

    def resume_from(self, step):
        self.agent.resume_from(step)

    @property
    def world_size(self):  # what watch() reads to tell the gradient layout
        return self.agent.world_size


def model_and_optimizer():
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 11)
    return model, torch.optim.SGD(model.parameters(), lr=0.1)


class AccumulationTest(unittest.TestCase):
    def run_micro_batches(self, on_device):
        model, opt = model_and_optimizer()
        rec = RecordingAgent(trainwatch.Agent(run_id="py-accum"))
        guard = twt.watch(opt, rec, on_device=on_device)
        gen = torch.Generator().manual_seed(3)
        losses, rows, shards = [], [], []
        # Micro-batches of different sizes, some labels ignored (nanoGPT's -1).
        for i, n in enumerate((5, 9, 3)):
            x = torch.randn(n, 8, generator=gen) * (1 + i)
            y = torch.randint(0, 11, (n,), generator=gen)
            y[0] = -1
            logits = model(x)
            loss = torch.nn.functional.cross_entropy(logits, y, ignore_index=-1)
            (loss / 3).backward()
            guard.accumulate(loss, logits=logits, labels=y, shards=[100 + i, f"file-{i}"],
                             ignore_index=-1)
            losses.append(float(loss))
            rows.append(torch.logsumexp(logits.detach().double(), dim=-1)[y != -1])
            shards += [100 + i, f"file-{i}"]
        v = guard.observe(7)
        opt.step()
        want_log_z = float(torch.cat(rows).mean())
        self.assertAlmostEqual(v.log_z, want_log_z, places=5)
        # Not the last micro-batch's alone.
        self.assertGreater(abs(float(rows[-1].mean()) - want_log_z), 1e-3)
        self.assertAlmostEqual(v.loss, sum(losses) / 3, places=6)
        self.assertEqual(rec.calls[-1]["shards"], shards)
        self.assertEqual(rec.calls[-1]["log_z_sum"][1], sum(len(r) for r in rows))
        # The next step starts empty.
        v = guard.observe(8)
        self.assertTrue(math.isnan(v.loss))
        self.assertTrue(math.isnan(v.log_z))
        self.assertIsNone(rec.calls[-1]["shards"])
        rec.agent.close()

    def test_mean_loss_all_rows_all_shards_host_kernels(self):
        self.run_micro_batches(on_device=False)

    def test_mean_loss_all_rows_all_shards_torch_operations(self):
        self.run_micro_batches(on_device=True)

    def test_one_micro_batch_through_observe_with_ignore_index(self):
        model, opt = model_and_optimizer()
        agent = trainwatch.Agent(run_id="py-accum-one")
        guard = twt.watch(opt, agent)
        x = torch.randn(6, 8)
        y = torch.tensor([1, -1, 2, -1, 3, 4])
        logits = model(x)
        loss = torch.nn.functional.cross_entropy(logits, y, ignore_index=-1)
        loss.backward()
        v = guard.observe(0, loss, logits=logits, labels=y, ignore_index=-1)
        want = float(torch.logsumexp(logits.detach().double(), dim=-1)[y != -1].mean())
        self.assertAlmostEqual(v.log_z, want, places=5)
        self.assertAlmostEqual(v.loss, float(loss), places=6)
        with self.assertRaises(ValueError):
            guard.accumulate(loss, labels=y)  # labels without logits
        agent.close()

    def test_a_nonfinite_row_in_any_micro_batch_is_a_nan_log_z(self):
        model, opt = model_and_optimizer()
        agent = trainwatch.Agent(run_id="py-accum-nan")
        guard = twt.watch(opt, agent)
        good = torch.zeros(4, 11)
        bad = torch.zeros(4, 11)
        bad[2, 3] = float("inf")
        model(torch.randn(2, 8)).sum().backward()
        guard.accumulate(1.0, logits=bad)
        guard.accumulate(1.0, logits=good)
        v = guard.observe(0)
        self.assertTrue(math.isnan(v.log_z))
        self.assertEqual(v.decision, trainwatch.Decision.HALT)
        agent.close()


class VerdictTest(unittest.TestCase):
    def test_numbers_are_the_reduced_record_on_every_rank(self):
        # Each rank's buffers go into `box`; after the barrier each returns
        # the element-wise sum and max of both, as an all-reduce does.
        box, barrier = {}, threading.Barrier(2)

        def reduce_for(rank):
            def reduce(sums, maxes):
                box[rank] = (sums, maxes)
                barrier.wait()
                a, b = box[0], box[1]
                out = ([x + y for x, y in zip(a[0], b[0])], [max(x, y) for x, y in zip(a[1], b[1])])
                barrier.wait()
                return out
            return reduce

        verdicts = {}
        local = {0: (2.0, 0.1, 1.0), 1: (4.0, 0.3, 3.0)}  # loss, gradient value, logit scale

        def rank_main(rank):
            loss, g, scale = local[rank]
            agent = trainwatch.Agent(run_id="py-verdict", rank=rank, world_size=2,
                                     reduce=reduce_for(rank))
            grads = {"w": torch.full((100,), g), "b": torch.full((4,), g)}
            logits = torch.arange(2 * 3 * (rank + 1), dtype=torch.float32).reshape(-1, 3) * scale
            verdicts[rank, 0] = agent.step(0, loss=loss, grads=grads, logits=logits)
            if rank == 1:
                grads["b"][2] = float("nan")  # only rank 1's gradient
            verdicts[rank, 1] = agent.step(1, loss=loss, grads=grads, logits=logits)
            agent.close()

        threads = [threading.Thread(target=rank_main, args=(r,)) for r in (0, 1)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        v0, v1 = verdicts[0, 0], verdicts[1, 0]
        for name in ("loss", "grad_norm", "nan_frac", "log_z", "loss_ema_ratio"):
            a, b = getattr(v0, name), getattr(v1, name)
            self.assertTrue(a == b or (math.isnan(a) and math.isnan(b)), name)
        self.assertEqual(v0.loss, 3.0)  # the mean over ranks, not 2.0
        rows = [torch.logsumexp(torch.arange(6 * (r + 1), dtype=torch.float64).reshape(-1, 3)
                                * local[r][2], dim=-1) for r in (0, 1)]
        self.assertAlmostEqual(v0.log_z, float(torch.cat(rows).mean()), places=5)
        local_norm = math.sqrt(104 * 0.1 ** 2)
        self.assertGreater(abs(v0.grad_norm - local_norm), 1e-3)
        # Rank 1's NaN: every rank's verdict counts it and halts.
        h0, h1 = verdicts[0, 1], verdicts[1, 1]
        self.assertEqual(h0.nan_frac, h1.nan_frac)
        self.assertGreater(h0.nan_frac, 0.0)
        self.assertEqual(h0.decision, trainwatch.Decision.HALT)
        self.assertEqual(h0.decision, "halt")  # the old strings still compare equal
        self.assertEqual(str(h0.decision), "halt")
        # The tensor is named by the rank that saw it, and only there.
        self.assertEqual(h1.tensors, [("b", 1, 4)])
        self.assertEqual(h1.rank, 1)
        self.assertEqual(h0.tensors, [])
        e = trainwatch.TrainingHalted(h1)
        self.assertEqual((e.step, e.tier, e.tensors, e.ranks), (1, 3, [("b", 1, 4)], [1]))
        self.assertIn("b (1 of 4 nonfinite)", str(e))
        self.assertEqual(trainwatch.TrainingHalted(h0).ranks, [])


if __name__ == "__main__":
    unittest.main()
